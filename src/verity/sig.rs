//! Root hash signatures, as the kernel's dm-verity `root_hash_sig_key_desc` checks them.
//!
//! The kernel verifies a detached DER PKCS#7 (`signedData`) signature whose content is the
//! root hash written as a lowercase hex string — the exact ASCII bytes of the digest in hex,
//! with no newline — against the keys in its keyring. The signature usually embeds no
//! certificate. veritysetup only hands the signature to the kernel; dmkit can also make one
//! ([`sign_root_hash`], the same bytes as
//! `openssl smime -sign -noattr -nocerts -binary -outform der`) and check one in userspace
//! ([`verify_root_hash_signature`]).
//!
//! Verification trusts the given certificates as they are, like keys in a kernel keyring: no
//! chain is built to system roots, validity dates are not checked, and a certificate
//! embedded in the signature is never used to check it — the signer must be one of the given
//! certificates. Signatures with signed attributes and with embedded certificates are
//! accepted, as the kernel accepts them; so are CMS signatures naming their signer by subject
//! key identifier (`openssl cms -sign -keyid`, the kernel's `sign-file -k`). A signature that
//! embeds its content (not detached) is refused, as the kernel refuses it.
//!
//! Known difference from the kernel: the kernel also accepts a signer certificate embedded in
//! the signature if a keyring key signed it; dmkit accepts only the given certificates
//! themselves. With several signers, every signer must be among the given certificates
//! (OpenSSL's rule), where the kernel needs only one trusted signer.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use openssl::cms::{CMSOptions, CmsContentInfo};
use openssl::error::ErrorStack;
use openssl::nid::Nid;
use openssl::pkcs7::{Pkcs7, Pkcs7Flags};
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::{X509Ref, X509};

/// Largest signature, certificate or key file read (1 MiB); the kernel's user keys hold at
/// most 32767 bytes, so anything near this is not a signature.
const MAX_FILE_SIZE: u64 = 1 << 20;

/// Why a root hash could not be signed or its signature was refused. Each names the file and
/// what is wrong, on one line.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The root hash is empty, of odd length or holds a non-hex character.
    #[error("root hash {0:?} is not a hex string (an even number of 0-9a-f digits)")]
    RootHashNotHex(String),
    /// The signature file could not be read.
    #[error("{path}: cannot read signature: {reason}")]
    SignatureUnreadable {
        /// The signature file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The signature file is not a DER PKCS#7 signature.
    #[error("{path}: not a DER PKCS#7 signature: {reason}")]
    SignatureGarbled {
        /// The signature file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The signature embeds its content; dm-verity needs a detached signature.
    #[error("{path}: signature embeds its content; dm-verity needs a detached signature (sign without -nodetach)")]
    SignatureNotDetached {
        /// The signature file.
        path: PathBuf,
    },
    /// No certificate was given to check the signature against.
    #[error("no certificate given to check the root hash signature against")]
    NoCertificates,
    /// A certificate file could not be read.
    #[error("{path}: cannot read certificate: {reason}")]
    CertificateUnreadable {
        /// The certificate file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A certificate file holds no PEM or DER X.509 certificate.
    #[error("{path}: not a PEM or DER X.509 certificate: {reason}")]
    CertificateGarbled {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The private key file could not be read.
    #[error("{path}: cannot read private key: {reason}")]
    KeyUnreadable {
        /// The key file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The private key file holds no usable private key.
    #[error("{path}: not a usable private key: {reason}")]
    KeyGarbled {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No certificate in the certificate file carries the private key's public key.
    #[error("{cert}: no certificate matches the private key {key}")]
    KeyCertificateMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// Making the signature failed.
    #[error("{key}: signing the root hash failed: {reason}")]
    SigningFailed {
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
    /// The signature is well formed but not a valid signature over this root hash by any of
    /// the given certificates.
    #[error("{path}: signature does not verify over root hash {root_hash} against the {certs} given certificate(s): {reason}")]
    NotVerified {
        /// The signature file.
        path: PathBuf,
        /// The (lowercased) root hash.
        root_hash: String,
        /// How many certificates were given (after splitting PEM bundles).
        certs: usize,
        /// OpenSSL's reason.
        reason: String,
    },
}

/// The certificate whose key made a verified signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSigner {
    /// Its subject, as `CN=name, O=org` in certificate order (short attribute names).
    pub subject: String,
    /// Its serial number in uppercase hex, as `openssl x509 -noout -serial` prints it.
    pub serial: String,
}

/// Lowercases `root_hash_hex` after checking it is a non-empty, even-length hex string.
fn normalize_root_hash(root_hash_hex: &str) -> Result<String, SignatureError> {
    // hex::decode refuses odd lengths and non-hex characters.
    let ok = !root_hash_hex.is_empty() && hex::decode(root_hash_hex).is_ok();
    if ok {
        Ok(root_hash_hex.to_ascii_lowercase())
    } else {
        Err(SignatureError::RootHashNotHex(root_hash_hex.to_string()))
    }
}

/// OpenSSL's error stack as one line: the distinct reasons, in order.
pub(crate) fn ossl_reason(e: &ErrorStack) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut nested_seen = false;
    for err in e.errors() {
        let reason = err.reason().unwrap_or("unknown error");
        if reason == "nested asn1 error" {
            // The ASN.1 decoder reports the whole path outwards; the innermost field says
            // enough, and is attached to the error before it.
            if !nested_seen {
                nested_seen = true;
                if let (Some(last), Some(data)) = (parts.last_mut(), err.data()) {
                    if !data.is_empty() {
                        last.push_str(" (");
                        last.push_str(data);
                        last.push(')');
                    }
                }
            }
            continue;
        }
        let mut s = reason.to_string();
        if let Some(data) = err.data() {
            if !data.is_empty() {
                s.push_str(" (");
                s.push_str(data);
                s.push(')');
            }
        }
        if !parts.contains(&s) {
            parts.push(s);
        }
    }
    let line = if parts.is_empty() {
        "unknown OpenSSL error".to_string()
    } else {
        parts.join("; ")
    };
    one_line(&line)
}

/// Replaces control characters so a message stays on one line.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Reads a whole file of at most [`MAX_FILE_SIZE`] bytes.
fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let file = fs::File::open(path).map_err(|e| one_line(&e.to_string()))?;
    let mut buf = Vec::new();
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| one_line(&e.to_string()))?;
    if buf.len() as u64 > MAX_FILE_SIZE {
        return Err(format!("larger than {MAX_FILE_SIZE} bytes"));
    }
    Ok(buf)
}

/// True if `data` looks like PEM text (a `-----BEGIN` line, possibly after other text).
fn looks_like_pem(data: &[u8]) -> bool {
    data.windows(10).any(|w| w == b"-----BEGIN")
}

/// Loads every certificate of a PEM file (one or several) or the one of a DER file.
pub(crate) fn load_certs(path: &Path) -> Result<Vec<X509>, SignatureError> {
    let data = read_limited(path).map_err(|reason| SignatureError::CertificateUnreadable {
        path: path.to_path_buf(),
        reason,
    })?;
    let garbled = |reason: String| SignatureError::CertificateGarbled {
        path: path.to_path_buf(),
        reason,
    };
    if data.is_empty() {
        return Err(garbled("empty file".into()));
    }
    if looks_like_pem(&data) {
        let certs = X509::stack_from_pem(&data).map_err(|e| garbled(ossl_reason(&e)))?;
        if certs.is_empty() {
            return Err(garbled("no CERTIFICATE block in the PEM file".into()));
        }
        Ok(certs)
    } else {
        if data[0] != 0x30 {
            return Err(garbled("neither PEM text nor a DER SEQUENCE".into()));
        }
        if der_total_len(&data).is_some_and(|n| n != data.len()) {
            return Err(garbled(
                "the file's length does not match the DER structure's".into(),
            ));
        }
        let cert = X509::from_der(&data).map_err(|e| garbled(ossl_reason(&e)))?;
        Ok(vec![cert])
    }
}

/// The length of the outer DER element (header and content), if its length is definite and
/// the header is complete; `None` for indefinite-length BER or a short header.
fn der_total_len(data: &[u8]) -> Option<usize> {
    let first = *data.get(1)?;
    if first < 0x80 {
        return Some(2 + first as usize);
    }
    let n = (first & 0x7f) as usize;
    if n == 0 || n > 4 {
        // Indefinite length (BER), or absurdly long: let the parser decide.
        return None;
    }
    let mut len = 0usize;
    for i in 0..n {
        len = (len << 8) | *data.get(2 + i)? as usize;
    }
    len.checked_add(2 + n)
}

/// Loads the private key of a PEM (or DER) file, refusing passphrase-protected keys without
/// ever prompting.
pub(crate) fn load_key(path: &Path) -> Result<PKey<Private>, SignatureError> {
    let data = read_limited(path).map_err(|reason| SignatureError::KeyUnreadable {
        path: path.to_path_buf(),
        reason,
    })?;
    let garbled = |reason: String| SignatureError::KeyGarbled {
        path: path.to_path_buf(),
        reason,
    };
    if data.is_empty() {
        return Err(garbled("empty file".into()));
    }
    if looks_like_pem(&data) {
        if data.windows(9).any(|w| w == b"ENCRYPTED") {
            return Err(garbled(
                "the key is passphrase-protected; decrypt it first (openssl pkey -in KEY -out PLAIN)"
                    .into(),
            ));
        }
        // A callback that supplies no passphrase, so OpenSSL never prompts on the terminal.
        PKey::private_key_from_pem_callback(&data, |_buf| Ok(0))
            .map_err(|e| garbled(ossl_reason(&e)))
    } else {
        PKey::private_key_from_der(&data).map_err(|e| garbled(ossl_reason(&e)))
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

/// Signs a root hash as dm-verity's `root_hash_sig_key_desc` expects: a DER PKCS#7
/// signature, detached, without signed attributes or certificates, over the lowercase hex
/// string — the same bytes as
/// `openssl smime -sign -noattr -nocerts -binary -outform der -in roothash.txt -inkey KEY -signer CERT`
/// (for RSA, whose PKCS#1 v1.5 signatures are deterministic). The digest is the key's
/// default (SHA-256 for RSA and EC keys).
///
/// `key_pem` holds an unencrypted private key (PEM, or DER); `cert_pem` its certificate (PEM
/// or DER; in a PEM bundle the first certificate carrying the key's public key is used).
pub fn sign_root_hash(
    root_hash_hex: &str,
    key_pem: &Path,
    cert_pem: &Path,
) -> Result<Vec<u8>, SignatureError> {
    let root_hash = normalize_root_hash(root_hash_hex)?;
    let key = load_key(key_pem)?;
    let certs = load_certs(cert_pem)?;
    let cert = certs
        .iter()
        .find(|c| c.public_key().is_ok_and(|pk| pk.public_eq(&key)))
        .ok_or_else(|| SignatureError::KeyCertificateMismatch {
            key: key_pem.to_path_buf(),
            cert: cert_pem.to_path_buf(),
        })?;
    let failed = |e: ErrorStack| SignatureError::SigningFailed {
        key: key_pem.to_path_buf(),
        reason: ossl_reason(&e),
    };
    let no_extra_certs = Stack::<X509>::new().map_err(failed)?;
    let flags =
        Pkcs7Flags::NOATTR | Pkcs7Flags::NOCERTS | Pkcs7Flags::BINARY | Pkcs7Flags::DETACHED;
    let p7 =
        Pkcs7::sign(cert, &key, &no_extra_certs, root_hash.as_bytes(), flags).map_err(failed)?;
    p7.to_der().map_err(failed)
}

/// Checks a dm-verity root hash signature in userspace, as the kernel would against a
/// keyring holding `certs`: `signature` must be a detached DER PKCS#7 (or CMS) signature over
/// the lowercase hex string of `root_hash_hex` (uppercase input is lowercased first) by the
/// key of one of `certs`.
///
/// Each certificate file may be PEM (possibly several certificates) or DER. The certificates
/// are trusted as given — no chain building, no date checks — and certificates embedded in
/// the signature are ignored when looking for the signer. Returns the signer's certificate.
pub fn verify_root_hash_signature(
    root_hash_hex: &str,
    signature: &Path,
    certs: &[PathBuf],
) -> Result<VerifiedSigner, SignatureError> {
    let root_hash = normalize_root_hash(root_hash_hex)?;
    if certs.is_empty() {
        return Err(SignatureError::NoCertificates);
    }
    let mut trusted: Vec<X509> = Vec::new();
    for path in certs {
        trusted.extend(load_certs(path)?);
    }

    let sig_path = signature.to_path_buf();
    let data = read_limited(signature).map_err(|reason| SignatureError::SignatureUnreadable {
        path: sig_path.clone(),
        reason,
    })?;
    let garbled = |reason: String| SignatureError::SignatureGarbled {
        path: sig_path.clone(),
        reason,
    };
    if data.is_empty() {
        return Err(garbled("empty file".into()));
    }
    if looks_like_pem(&data) {
        return Err(garbled(
            "the file is PEM; the kernel needs DER (openssl pkcs7 -in SIG -outform der)".into(),
        ));
    }
    if data[0] != 0x30 {
        return Err(garbled("does not start with a DER SEQUENCE".into()));
    }
    if let Some(n) = der_total_len(&data) {
        if n > data.len() {
            return Err(garbled(format!(
                "truncated: the DER structure needs {n} bytes, the file has {}",
                data.len()
            )));
        }
        if n < data.len() {
            return Err(garbled(format!(
                "{} bytes of trailing data after the DER structure",
                data.len() - n
            )));
        }
    }

    let internal = |e: ErrorStack| SignatureError::NotVerified {
        path: sig_path.clone(),
        root_hash: root_hash.clone(),
        certs: trusted.len(),
        reason: ossl_reason(&e),
    };
    let mut stack = Stack::<X509>::new().map_err(internal)?;
    for cert in &trusted {
        stack.push(cert.clone()).map_err(internal)?;
    }

    match Pkcs7::from_der(&data) {
        Ok(p7) => verify_pkcs7(&p7, &root_hash, &stack, &sig_path, trusted.len()),
        Err(p7_err) => {
            // Not PKCS#7 as OpenSSL's PKCS7 parser knows it; perhaps CMS with a signer named
            // by subject key identifier, which the kernel also accepts.
            match CmsContentInfo::from_der(&data) {
                Ok(_) => verify_cms(&data, &root_hash, &trusted, &sig_path),
                Err(_) => Err(garbled(ossl_reason(&p7_err))),
            }
        }
    }
}

/// Verifies a parsed PKCS#7 signature; the signer must be in `certs`.
fn verify_pkcs7(
    p7: &Pkcs7,
    root_hash: &str,
    certs: &Stack<X509>,
    path: &Path,
    count: usize,
) -> Result<VerifiedSigner, SignatureError> {
    let not_verified = |reason: String| SignatureError::NotVerified {
        path: path.to_path_buf(),
        root_hash: root_hash.to_string(),
        certs: count,
        reason,
    };
    if p7.type_().map(|o| o.nid()) != Some(Nid::PKCS7_SIGNED) || p7.signed().is_none() {
        return Err(SignatureError::SignatureGarbled {
            path: path.to_path_buf(),
            reason: "not a PKCS#7 signedData structure".into(),
        });
    }
    let store = X509StoreBuilder::new()
        .map(|b| b.build())
        .map_err(|e| not_verified(ossl_reason(&e)))?;
    // NOINTERN: look for the signer among the given certificates only, never among those
    // embedded in the signature. NOVERIFY: the given certificates are trusted as they are.
    let flags = Pkcs7Flags::NOINTERN | Pkcs7Flags::NOVERIFY | Pkcs7Flags::BINARY;
    // The kernel refuses a signature that carries its own content.
    if p7.verify(certs, &store, None, None, flags).is_ok() {
        return Err(SignatureError::SignatureNotDetached {
            path: path.to_path_buf(),
        });
    }
    p7.verify(certs, &store, Some(root_hash.as_bytes()), None, flags)
        .map_err(|e| not_verified(ossl_reason(&e)))?;
    let signers = p7
        .signers(certs, Pkcs7Flags::NOINTERN)
        .map_err(|e| not_verified(ossl_reason(&e)))?;
    match signers.iter().next() {
        Some(cert) => Ok(signer_of(cert)),
        None => Err(not_verified("the signature names no signer".into())),
    }
}

/// Verifies a CMS signature (DER in `data`); the signer must be in `trusted`.
///
/// OpenSSL caches the signer certificates it finds in the parsed structure, so every check
/// works on a freshly parsed copy.
fn verify_cms(
    data: &[u8],
    root_hash: &str,
    trusted: &[X509],
    path: &Path,
) -> Result<VerifiedSigner, SignatureError> {
    let not_verified = |reason: String| SignatureError::NotVerified {
        path: path.to_path_buf(),
        root_hash: root_hash.to_string(),
        certs: trusted.len(),
        reason,
    };
    let check = |certs: &[X509], content: Option<&[u8]>| -> Result<(), ErrorStack> {
        let mut cms = CmsContentInfo::from_der(data)?;
        let mut stack = Stack::new()?;
        for cert in certs {
            stack.push(cert.clone())?;
        }
        let store = X509StoreBuilder::new()?.build();
        // NOINTERN: the signer only among the given certificates; NOVERIFY: trusted as given.
        let flags = CMSOptions::NOINTERN | CMSOptions::NOVERIFY | CMSOptions::BINARY;
        cms.verify(Some(&stack), Some(&store), content, None, flags)
    };
    // The kernel refuses a signature that carries its own content.
    if check(trusted, None).is_ok() {
        return Err(SignatureError::SignatureNotDetached {
            path: path.to_path_buf(),
        });
    }
    check(trusted, Some(root_hash.as_bytes())).map_err(|e| not_verified(ossl_reason(&e)))?;
    // Name the signer: the given certificate that verifies the signature alone.
    if let Some(cert) = trusted
        .iter()
        .find(|cert| check(std::slice::from_ref(*cert), Some(root_hash.as_bytes())).is_ok())
    {
        return Ok(signer_of(cert));
    }
    // Several signers, all among the given certificates, none verifying alone: name the
    // first given certificate.
    match trusted.first() {
        Some(cert) => Ok(signer_of(cert)),
        None => Err(not_verified("no certificate given".into())),
    }
}
