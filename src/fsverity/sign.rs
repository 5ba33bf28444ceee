//! Built-in fs-verity signatures: a detached DER PKCS#7 signature over
//! `struct fsverity_formatted_digest` (see [`formatted_digest`]), which the kernel checks
//! against the `.fs-verity` keyring when `FS_IOC_ENABLE_VERITY` is given it.
//!
//! [`sign_digest`] makes the signatures `fsverity sign` (fsverity-utils) makes: PKCS#7 without
//! signed attributes, without certificates, and with the file digest's own hash algorithm as
//! the signature's digest algorithm (SHA-512 for SHA-512 files) — the bytes of
//! `openssl smime -sign -noattr -nocerts -binary -outform der -md <alg>` over the formatted
//! digest. RSA signatures are byte-identical to fsverity-utils'; ECDSA ones (randomized) have
//! the same structure: `ecdsa-with-SHA256`/`-SHA512` over a DER `ECDSA-Sig-Value`. Key and
//! certificate files are PEM or DER (fsverity-utils takes PEM only), unencrypted keys only.

use std::path::Path;

use super::descriptor::formatted_digest;
use super::digest::FileDigest;
use super::FsVerityError;
use crate::hash::HashAlgorithm;
use crate::sig::{sign_detached, Message};

/// Signs a file digest as `fsverity sign` does; returns the DER signature.
///
/// `key` holds an unencrypted private key (PEM or DER), `cert` its certificate (PEM or DER; in
/// a PEM bundle the first certificate carrying the key's public key is used).
pub fn sign_digest(digest: &FileDigest, key: &Path, cert: &Path) -> Result<Vec<u8>, FsVerityError> {
    sign_formatted(digest.hash(), &digest.digest, key, cert)
}

/// Signs `struct fsverity_formatted_digest` for `digest` (a `hash` digest), with `hash` as the
/// PKCS#7 digest algorithm.
pub fn sign_formatted(
    hash: HashAlgorithm,
    digest: &[u8],
    key: &Path,
    cert: &Path,
) -> Result<Vec<u8>, FsVerityError> {
    check_digest(hash, digest)?;
    let what = format!(
        "the fs-verity digest {}:{}",
        hash.name(),
        hex::encode(digest)
    );
    let message = formatted_digest(hash, digest);
    Ok(sign_detached(
        &Message::new(&message, &what),
        key,
        cert,
        hash,
    )?)
}

/// Checks that `digest` is a `hash` digest fs-verity takes.
pub(super) fn check_digest(hash: HashAlgorithm, digest: &[u8]) -> Result<(), FsVerityError> {
    if super::descriptor::hash_algorithm_number(hash).is_none() {
        return Err(FsVerityError::UnsupportedHash(hash.name().to_string()));
    }
    if digest.len() != hash.digest_size() {
        return Err(FsVerityError::BadDigestLength {
            hash: hash.name(),
            expected: hash.digest_size(),
            len: digest.len(),
        });
    }
    Ok(())
}
