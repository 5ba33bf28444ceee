//! Built-in fs-verity signatures: a detached DER PKCS#7 signature over
//! `struct fsverity_formatted_digest` (see [`formatted_digest`]), which the kernel checks
//! against the `.fs-verity` keyring when `FS_IOC_ENABLE_VERITY` is given it.
//!
//! [`sign_digest`] makes the same bytes as `fsverity sign` (fsverity-utils): PKCS#7 without
//! signed attributes, without certificates, and with the file digest's own hash algorithm as
//! the signature's digest algorithm (SHA-512 for SHA-512 files) — the same bytes as
//! `openssl smime -sign -noattr -nocerts -binary -outform der -md <alg>` over the formatted
//! digest. Key and certificate files are read as for dm-verity root hash signatures
//! ([`crate::verity::sig`]): PEM or DER, unencrypted keys only.
//!
//! The `openssl` crate's PKCS#7 signing always uses the key's default digest (SHA-256), so the
//! signer is added through OpenSSL's own `PKCS7_sign_add_signer`, declared here.

use std::ffi::{c_int, c_long, c_void, CStr};
use std::path::Path;
use std::ptr;

use openssl::error::ErrorStack;

use super::descriptor::formatted_digest;
use super::digest::FileDigest;
use super::FsVerityError;
use crate::hash::HashAlgorithm;
use crate::verity::sig::{load_certs, load_key, ossl_reason};

/// OpenSSL's `PKCS7_BINARY | PKCS7_DETACHED | PKCS7_NOATTR | PKCS7_NOCERTS |
/// PKCS7_NOSMIMECAP`, the flags fsverity-utils signs with.
const FLAGS: c_int = 0x80 | 0x40 | 0x100 | 0x2 | 0x200;
/// `PKCS7_PARTIAL`: create the structure, add the signer later.
const PKCS7_PARTIAL: c_int = 0x4000;

// OpenSSL (libcrypto, linked through openssl-sys) functions the openssl crate does not wrap.
// Opaque pointers only; every object made here is freed here.
unsafe extern "C" {
    fn BIO_new_mem_buf(buf: *const c_void, len: c_int) -> *mut c_void;
    fn BIO_free(bio: *mut c_void) -> c_int;
    fn d2i_X509(a: *mut *mut c_void, pp: *mut *const u8, len: c_long) -> *mut c_void;
    fn X509_free(x: *mut c_void);
    fn d2i_AutoPrivateKey(a: *mut *mut c_void, pp: *mut *const u8, len: c_long) -> *mut c_void;
    fn EVP_PKEY_free(k: *mut c_void);
    fn EVP_get_digestbyname(name: *const std::ffi::c_char) -> *const c_void;
    fn PKCS7_sign(
        signcert: *mut c_void,
        pkey: *mut c_void,
        certs: *mut c_void,
        data: *mut c_void,
        flags: c_int,
    ) -> *mut c_void;
    fn PKCS7_sign_add_signer(
        p7: *mut c_void,
        signcert: *mut c_void,
        pkey: *mut c_void,
        md: *const c_void,
        flags: c_int,
    ) -> *mut c_void;
    fn PKCS7_final(p7: *mut c_void, data: *mut c_void, flags: c_int) -> c_int;
    fn i2d_PKCS7(p7: *mut c_void, out: *mut *mut u8) -> c_int;
    fn PKCS7_free(p7: *mut c_void);
}

/// Frees an OpenSSL object when dropped.
struct Owned(*mut c_void, unsafe extern "C" fn(*mut c_void));

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from the matching OpenSSL constructor and is freed once.
            unsafe { (self.1)(self.0) }
        }
    }
}

unsafe extern "C" fn bio_free(p: *mut c_void) {
    // SAFETY: called by `Owned::drop` with a BIO from BIO_new_mem_buf.
    unsafe {
        BIO_free(p);
    }
}

/// Signs a file digest as `fsverity sign` does; returns the DER signature.
///
/// `key` holds an unencrypted private key (PEM or DER), `cert` its certificate (PEM or DER; in
/// a PEM bundle the first certificate carrying the key's public key is used).
pub fn sign_digest(digest: &FileDigest, key: &Path, cert: &Path) -> Result<Vec<u8>, FsVerityError> {
    sign_formatted(digest.hash(), &digest.digest, key, cert)
}

/// Signs `struct fsverity_formatted_digest` for `digest` (a `hash` digest).
pub fn sign_formatted(
    hash: HashAlgorithm,
    digest: &[u8],
    key_path: &Path,
    cert_path: &Path,
) -> Result<Vec<u8>, FsVerityError> {
    let key = load_key(key_path)?;
    let certs = load_certs(cert_path)?;
    let cert = certs
        .iter()
        .find(|c| c.public_key().is_ok_and(|pk| pk.public_eq(&key)))
        .ok_or_else(|| FsVerityError::KeyCertificateMismatch {
            key: key_path.to_path_buf(),
            cert: cert_path.to_path_buf(),
        })?;
    let failed = |reason: String| FsVerityError::SigningFailed {
        key: key_path.to_path_buf(),
        reason,
    };
    let ossl = |e: ErrorStack| failed(ossl_reason(&e));
    let key_der = key.private_key_to_der().map_err(ossl)?;
    let cert_der = cert.to_der().map_err(ossl)?;
    let message = formatted_digest(hash, digest);
    let md_name: &CStr = match hash {
        HashAlgorithm::Sha512 => c"SHA512",
        _ => c"SHA256",
    };
    let last_error = || ossl_reason(&ErrorStack::get());

    // SAFETY: plain OpenSSL calls on objects created and freed here; buffers outlive the
    // calls that read them; every returned pointer is checked before use.
    unsafe {
        let mut p = cert_der.as_ptr();
        let x509 = Owned(
            d2i_X509(ptr::null_mut(), &mut p, cert_der.len() as c_long),
            X509_free,
        );
        let mut p = key_der.as_ptr();
        let pkey = Owned(
            d2i_AutoPrivateKey(ptr::null_mut(), &mut p, key_der.len() as c_long),
            EVP_PKEY_free,
        );
        if x509.0.is_null() || pkey.0.is_null() {
            return Err(failed(last_error()));
        }
        let md = EVP_get_digestbyname(md_name.as_ptr());
        if md.is_null() {
            return Err(failed(format!("OpenSSL has no {}", hash.name())));
        }
        let bio = Owned(
            BIO_new_mem_buf(message.as_ptr().cast(), message.len() as c_int),
            bio_free,
        );
        if bio.0.is_null() {
            return Err(failed(last_error()));
        }
        let p7 = Owned(
            PKCS7_sign(
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
                bio.0,
                FLAGS | PKCS7_PARTIAL,
            ),
            PKCS7_free,
        );
        if p7.0.is_null() {
            return Err(failed(last_error()));
        }
        if PKCS7_sign_add_signer(p7.0, x509.0, pkey.0, md, FLAGS).is_null() {
            return Err(failed(last_error()));
        }
        if PKCS7_final(p7.0, bio.0, FLAGS) != 1 {
            return Err(failed(last_error()));
        }
        let len = i2d_PKCS7(p7.0, ptr::null_mut());
        if len <= 0 {
            return Err(failed(last_error()));
        }
        let mut out = vec![0u8; len as usize];
        let mut q = out.as_mut_ptr();
        if i2d_PKCS7(p7.0, &mut q) != len {
            return Err(failed(last_error()));
        }
        Ok(out)
    }
}
