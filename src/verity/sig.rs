//! Root hash signatures, as the kernel's dm-verity `root_hash_sig_key_desc` checks them.
//!
//! The kernel verifies a detached DER PKCS#7 (`signedData`) signature whose content is the
//! root hash written as a lowercase hex string — the exact ASCII bytes of the digest in hex,
//! with no newline — against the keys in its keyring. The signature usually embeds no
//! certificate. veritysetup only hands the signature to the kernel; dmkit can also make one
//! ([`sign_root_hash`], the same bytes as
//! `openssl smime -sign -noattr -nocerts -binary -outform der`) and check one in userspace
//! ([`verify_root_hash_signature`]). Both are the crate's generic detached signatures
//! ([`crate::sig`]) over that string; what they accept and how they differ from the kernel is
//! described there.

use std::path::{Path, PathBuf};

use crate::hash::HashAlgorithm;
use crate::sig::{sign_detached, verify_detached, Message};
pub use crate::sig::{SignatureError, VerifiedSigner};

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

/// Signs a root hash as dm-verity's `root_hash_sig_key_desc` expects: a DER PKCS#7
/// signature, detached, without signed attributes or certificates, with SHA-256, over the
/// lowercase hex string — the same bytes as
/// `openssl smime -sign -noattr -nocerts -binary -outform der -in roothash.txt -inkey KEY -signer CERT`
/// (for RSA, whose PKCS#1 v1.5 signatures are deterministic).
///
/// `key_pem` holds an unencrypted private key (PEM, or DER); `cert_pem` its certificate (PEM
/// or DER; in a PEM bundle the first certificate carrying the key's public key is used).
pub fn sign_root_hash(
    root_hash_hex: &str,
    key_pem: &Path,
    cert_pem: &Path,
) -> Result<Vec<u8>, SignatureError> {
    let root_hash = normalize_root_hash(root_hash_hex)?;
    let what = format!("root hash {root_hash}");
    // SHA-256: the default digest of RSA and EC keys, which `openssl smime -sign` uses.
    sign_detached(
        &Message::new(root_hash.as_bytes(), &what),
        key_pem,
        cert_pem,
        HashAlgorithm::Sha256,
    )
}

/// Checks a dm-verity root hash signature in userspace, as the kernel would against a
/// keyring holding `certs`: `signature` must be a detached DER PKCS#7 (or CMS) signature over
/// the lowercase hex string of `root_hash_hex` (uppercase input is lowercased first) by the
/// key of one of `certs` (see [`crate::sig::verify_detached`]). Returns the signer's
/// certificate.
pub fn verify_root_hash_signature(
    root_hash_hex: &str,
    signature: &Path,
    certs: &[PathBuf],
) -> Result<VerifiedSigner, SignatureError> {
    let root_hash = normalize_root_hash(root_hash_hex)?;
    let what = format!("root hash {root_hash}");
    verify_detached(&Message::new(root_hash.as_bytes(), &what), signature, certs)
}
