//! Checking a detached PKCS#7 (or CMS) signature against certificates trusted as given.

use std::path::{Path, PathBuf};

use foreign_types::ForeignTypeRef;
use openssl::cms::{CMSOptions, CmsContentInfo};
use openssl::error::ErrorStack;
use openssl::nid::Nid;
use openssl::pkcs7::{Pkcs7, Pkcs7Flags, Pkcs7Ref};
use openssl::stack::Stack;
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::{X509AlgorithmRef, X509Ref, X509};
use openssl_sys as ffi;

use super::load::{check_signature_framing, load_trusted, read_signature};
use super::{one_line, ossl_reason, Message, SignatureError};

/// The certificate whose key made a verified signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSigner {
    /// Its subject, as `CN=name, O=org` in certificate order (short attribute names).
    pub subject: String,
    /// Its serial number in uppercase hex, as `openssl x509 -noout -serial` prints it.
    pub serial: String,
}

/// Checks that the signature file `signature` is a detached DER PKCS#7 (or CMS) signature over
/// `message` by the key of one of the certificates in `certs`, as the kernel checks a signature
/// against a keyring holding them.
///
/// Each certificate file may be PEM (one or several certificates) or DER. The certificates are
/// trusted as given — no chain building, no date checks — and certificates embedded in the
/// signature are ignored when looking for the signer. Returns the signer's certificate.
pub fn verify_detached(
    message: &Message,
    signature: &Path,
    certs: &[PathBuf],
) -> Result<VerifiedSigner, SignatureError> {
    let trusted = load_trusted(certs)?;
    let data = read_signature(signature)?;
    verify_loaded(message, &data, signature, &trusted)
}

/// [`verify_detached`] for a signature already in memory (`der`); `name` stands for it in
/// messages (the file it came from, or e.g. `manifest.sig`).
pub fn verify_detached_der(
    message: &Message,
    der: &[u8],
    name: &Path,
    certs: &[PathBuf],
) -> Result<VerifiedSigner, SignatureError> {
    let trusted = load_trusted(certs)?;
    verify_loaded(message, der, name, &trusted)
}

/// [`verify_detached_der`] with the certificates already loaded.
pub(crate) fn verify_loaded(
    message: &Message,
    data: &[u8],
    path: &Path,
    trusted: &[X509],
) -> Result<VerifiedSigner, SignatureError> {
    check_signature_framing(data, path)?;
    let check = Check {
        message,
        path,
        trusted,
    };
    match Pkcs7::from_der(data) {
        Ok(p7) => check.pkcs7(&p7),
        Err(p7_err) => {
            // Not PKCS#7 as OpenSSL's PKCS7 parser knows it; perhaps CMS with a signer named
            // by subject key identifier, which the kernel also accepts.
            match CmsContentInfo::from_der(data) {
                Ok(_) => check.cms(data),
                Err(_) => Err(SignatureError::SignatureGarbled {
                    path: path.to_path_buf(),
                    reason: ossl_reason(&p7_err),
                }),
            }
        }
    }
}

/// The digest algorithms a signature may list: those OpenSSL's default provider always has.
const DIGESTS: [Nid; 8] = [
    Nid::SHA1,
    Nid::SHA224,
    Nid::SHA256,
    Nid::SHA384,
    Nid::SHA512,
    Nid::SHA3_256,
    Nid::SHA3_384,
    Nid::SHA3_512,
];

/// The first of the signature's `digestAlgorithms` that is not one of [`DIGESTS`], named.
///
/// Checked before `PKCS7_verify`: when OpenSSL 3.0 cannot set up one of these digests, that
/// function's error path leaks the copy of the content it made (found by the `signature` fuzz
/// target). Such a signature could not verify anyway.
fn unusable_digest(p7: &Pkcs7Ref) -> Option<String> {
    let signed = p7.signed()?;
    // SAFETY: `signed` is a live PKCS7_SIGNED owned by `p7`; its `md_algs` stack (possibly
    // null) and the X509_ALGORs in it live as long as `p7`, and are only read here.
    unsafe {
        let algs = (*signed.as_ptr()).md_algs as *const ffi::OPENSSL_STACK;
        if algs.is_null() {
            return None;
        }
        for i in 0..ffi::OPENSSL_sk_num(algs) {
            let alg = ffi::OPENSSL_sk_value(algs, i) as *mut ffi::X509_ALGOR;
            if alg.is_null() {
                return Some("(none)".into());
            }
            let object = X509AlgorithmRef::from_ptr(alg).object();
            if !DIGESTS.contains(&object.nid()) {
                return Some(one_line(&object.to_string()));
            }
        }
    }
    None
}

/// One signature being checked.
struct Check<'a> {
    message: &'a Message<'a>,
    path: &'a Path,
    trusted: &'a [X509],
}

impl Check<'_> {
    fn not_verified(&self, reason: String) -> SignatureError {
        SignatureError::NotVerified {
            path: self.path.to_path_buf(),
            what: self.message.what.to_string(),
            certs: self.trusted.len(),
            reason,
        }
    }

    fn not_detached(&self) -> SignatureError {
        SignatureError::SignatureNotDetached {
            path: self.path.to_path_buf(),
        }
    }

    /// Verifies a parsed PKCS#7 signature; the signer must be among the trusted certificates.
    fn pkcs7(&self, p7: &Pkcs7) -> Result<VerifiedSigner, SignatureError> {
        let ossl = |e: ErrorStack| self.not_verified(ossl_reason(&e));
        if p7.type_().map(|o| o.nid()) != Some(Nid::PKCS7_SIGNED) || p7.signed().is_none() {
            return Err(SignatureError::SignatureGarbled {
                path: self.path.to_path_buf(),
                reason: "not a PKCS#7 signedData structure".into(),
            });
        }
        if let Some(name) = unusable_digest(p7) {
            return Err(self.not_verified(format!(
                "it lists the digest algorithm {name}, which dmkit does not check \
                 (SHA-1, SHA-2 or SHA-3 only)"
            )));
        }
        let mut certs = Stack::<X509>::new().map_err(ossl)?;
        for cert in self.trusted {
            certs.push(cert.clone()).map_err(ossl)?;
        }
        let store = X509StoreBuilder::new().map(|b| b.build()).map_err(ossl)?;
        // NOINTERN: look for the signer among the given certificates only, never among those
        // embedded in the signature. NOVERIFY: the given certificates are trusted as they are.
        let flags = Pkcs7Flags::NOINTERN | Pkcs7Flags::NOVERIFY | Pkcs7Flags::BINARY;
        // The kernel refuses a signature that carries its own content.
        if p7.verify(&certs, &store, None, None, flags).is_ok() {
            return Err(self.not_detached());
        }
        p7.verify(&certs, &store, Some(self.message.content), None, flags)
            .map_err(ossl)?;
        let signers = p7.signers(&certs, Pkcs7Flags::NOINTERN).map_err(ossl)?;
        match signers.iter().next() {
            Some(cert) => Ok(signer_of(cert)),
            None => Err(self.not_verified("the signature names no signer".into())),
        }
    }

    /// Verifies a CMS signature (DER in `data`); the signer must be among the trusted
    /// certificates.
    ///
    /// OpenSSL caches the signer certificates it finds in the parsed structure, so every check
    /// works on a freshly parsed copy.
    fn cms(&self, data: &[u8]) -> Result<VerifiedSigner, SignatureError> {
        let check = |certs: &[X509], content: Option<&[u8]>| -> Result<(), ErrorStack> {
            let mut cms = CmsContentInfo::from_der(data)?;
            let mut stack = Stack::new()?;
            for cert in certs {
                stack.push(cert.clone())?;
            }
            let store = X509StoreBuilder::new()?.build();
            // NOINTERN: the signer only among the given certificates; NOVERIFY: trusted as
            // given.
            let flags = CMSOptions::NOINTERN | CMSOptions::NOVERIFY | CMSOptions::BINARY;
            cms.verify(Some(&stack), Some(&store), content, None, flags)
        };
        // The kernel refuses a signature that carries its own content.
        if check(self.trusted, None).is_ok() {
            return Err(self.not_detached());
        }
        let content = Some(self.message.content);
        check(self.trusted, content).map_err(|e| self.not_verified(ossl_reason(&e)))?;
        // Name the signer: the given certificate that verifies the signature alone.
        if let Some(cert) = self
            .trusted
            .iter()
            .find(|cert| check(std::slice::from_ref(*cert), content).is_ok())
        {
            return Ok(signer_of(cert));
        }
        // Several signers, all among the given certificates, none verifying alone: name the
        // first given certificate.
        match self.trusted.first() {
            Some(cert) => Ok(signer_of(cert)),
            None => Err(self.not_verified("no certificate given".into())),
        }
    }
}

/// `CN=name, O=org` from a certificate's subject.
fn subject_string(cert: &X509Ref) -> String {
    let parts: Vec<String> = cert
        .subject_name()
        .entries()
        .map(|entry| {
            let nid = entry.object().nid();
            let key = nid
                .short_name()
                .or_else(|_| nid.long_name())
                .map(str::to_string)
                .unwrap_or_else(|_| entry.object().to_string());
            let value = entry
                .data()
                .to_string()
                .unwrap_or_else(|_| hex::encode(entry.data().as_slice()));
            format!("{key}={value}")
        })
        .collect();
    one_line(&parts.join(", "))
}

/// The signer description of a certificate.
fn signer_of(cert: &X509Ref) -> VerifiedSigner {
    let serial = cert
        .serial_number()
        .to_bn()
        .ok()
        .and_then(|bn| bn.to_hex_str().ok().map(|s| s.to_string()))
        .unwrap_or_else(|| "?".to_string());
    VerifiedSigner {
        subject: subject_string(cert),
        serial,
    }
}
