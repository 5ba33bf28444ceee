//! Making a detached PKCS#7 signature with a chosen digest algorithm.
//!
//! The `openssl` crate's `Pkcs7::sign` always uses the key's default digest (SHA-256 for RSA
//! and EC keys), and fsverity-utils signs SHA-512 file digests with SHA-512. So the structure is
//! built as `openssl smime -sign -md ALG` builds it: `PKCS7_sign` with `PKCS7_PARTIAL`, then
//! `PKCS7_sign_add_signer` with the digest, then `PKCS7_final` — the two functions openssl-sys
//! does not declare are declared here.

use std::ffi::c_int;
use std::path::Path;
use std::ptr;

use foreign_types::ForeignType;
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::pkcs7::Pkcs7;
use openssl_sys as ffi;

use super::load::{load_certs, load_key};
use super::{ossl_reason, Message, SignatureError};
use crate::hash::HashAlgorithm;

/// `PKCS7_BINARY | PKCS7_DETACHED | PKCS7_NOATTR | PKCS7_NOCERTS | PKCS7_NOSMIMECAP`: what
/// `openssl smime -sign -binary -noattr -nocerts` and fsverity-utils sign with.
const FLAGS: c_int = ffi::PKCS7_BINARY
    | ffi::PKCS7_DETACHED
    | ffi::PKCS7_NOATTR
    | ffi::PKCS7_NOCERTS
    | ffi::PKCS7_NOSMIMECAP;

unsafe extern "C" {
    fn PKCS7_sign_add_signer(
        p7: *mut ffi::PKCS7,
        signcert: *mut ffi::X509,
        pkey: *mut ffi::EVP_PKEY,
        md: *const ffi::EVP_MD,
        flags: c_int,
    ) -> *mut ffi::PKCS7_SIGNER_INFO;
    fn PKCS7_final(p7: *mut ffi::PKCS7, data: *mut ffi::BIO, flags: c_int) -> c_int;
}

/// A read-only memory BIO over a borrowed buffer, freed when dropped.
struct MemBio<'a>(*mut ffi::BIO, std::marker::PhantomData<&'a [u8]>);

impl<'a> MemBio<'a> {
    /// `None` if `buf` is larger than a BIO takes (2 GiB).
    fn new(buf: &'a [u8]) -> Result<Option<Self>, ErrorStack> {
        let Ok(len) = c_int::try_from(buf.len()) else {
            return Ok(None);
        };
        // SAFETY: the BIO reads `buf`, which outlives it (lifetime 'a); checked for null.
        let bio = unsafe { ffi::BIO_new_mem_buf(buf.as_ptr().cast(), len) };
        if bio.is_null() {
            return Err(ErrorStack::get());
        }
        Ok(Some(MemBio(bio, std::marker::PhantomData)))
    }
}

impl Drop for MemBio<'_> {
    fn drop(&mut self) {
        // SAFETY: made by BIO_new_mem_buf, freed once.
        unsafe {
            ffi::BIO_free_all(self.0);
        }
    }
}

/// Signs `message` with the private key in `key` (PEM or DER, unencrypted) and its certificate
/// in `cert` (PEM or DER; in a PEM bundle the first certificate carrying the key's public key
/// is used): a DER PKCS#7 `signedData`, detached, without signed attributes or certificates,
/// with `digest` as its digest algorithm — the bytes of
/// `openssl smime -sign -noattr -nocerts -binary -outform der -md DIGEST` (equal for RSA, whose
/// PKCS#1 v1.5 signatures are deterministic; ECDSA signatures are randomized, DER-encoded
/// `ECDSA-Sig-Value`s under `ecdsa-with-DIGEST`).
pub fn sign_detached(
    message: &Message,
    key: &Path,
    cert: &Path,
    digest: HashAlgorithm,
) -> Result<Vec<u8>, SignatureError> {
    let pkey = load_key(key)?;
    let certs = load_certs(cert)?;
    let signer = certs
        .iter()
        .find(|c| c.public_key().is_ok_and(|pk| pk.public_eq(&pkey)))
        .ok_or_else(|| SignatureError::KeyCertificateMismatch {
            key: key.to_path_buf(),
            cert: cert.to_path_buf(),
        })?;
    let failed = |reason: String| SignatureError::SigningFailed {
        key: key.to_path_buf(),
        what: message.what.to_string(),
        reason,
    };
    let ossl = |e: ErrorStack| failed(ossl_reason(&e));
    let md = MessageDigest::from_name(digest.name())
        .ok_or_else(|| failed(format!("OpenSSL has no {}", digest.name())))?;
    let bio = MemBio::new(message.content).map_err(ossl)?.ok_or_else(|| {
        failed(format!(
            "{} bytes is too large to sign",
            message.content.len()
        ))
    })?;

    // SAFETY: OpenSSL calls on live objects: the certificate and key are borrowed from values
    // that outlive the calls (PKCS7_sign_add_signer takes its own references), the BIO is
    // alive until the end of this function, and the PKCS7 is owned by `p7` from its creation
    // on. Every returned pointer or status is checked.
    unsafe {
        let raw = ffi::PKCS7_sign(
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            bio.0,
            FLAGS | ffi::PKCS7_PARTIAL,
        );
        if raw.is_null() {
            return Err(ossl(ErrorStack::get()));
        }
        let p7 = Pkcs7::from_ptr(raw);
        if PKCS7_sign_add_signer(
            p7.as_ptr(),
            signer.as_ptr(),
            pkey.as_ptr(),
            md.as_ptr(),
            FLAGS,
        )
        .is_null()
        {
            return Err(ossl(ErrorStack::get()));
        }
        if PKCS7_final(p7.as_ptr(), bio.0, FLAGS) != 1 {
            return Err(ossl(ErrorStack::get()));
        }
        p7.to_der().map_err(ossl)
    }
}
