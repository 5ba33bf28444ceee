//! Userspace check of a built-in fs-verity signature, as the kernel's `.fs-verity` keyring
//! check does it when `FS_IOC_ENABLE_VERITY` is given a signature: the file's fs-verity digest
//! is put in `struct fsverity_formatted_digest`, and the detached DER PKCS#7 signature must be
//! over those bytes by the key of one of the given certificates (trusted as given, like keys in
//! the keyring: no chain, no dates; see [`crate::sig`]).

use std::path::{Path, PathBuf};

use super::descriptor::formatted_digest;
use super::digest::{file_digest, FileDigest, FsVerityParams};
use super::sign::check_digest;
use super::FsVerityError;
use crate::hash::HashAlgorithm;
use crate::sig::{self, Message, SignatureError, VerifiedSigner};

/// Checks the built-in signature `signature` of a `hash` fs-verity digest against `certs`;
/// `what` names the digest in messages (e.g. `the fs-verity digest sha256:… of FILE`).
pub fn verify_formatted(
    hash: HashAlgorithm,
    digest: &[u8],
    what: &str,
    signature: &Path,
    certs: &[PathBuf],
) -> Result<VerifiedSigner, FsVerityError> {
    check_digest(hash, digest)?;
    let message = formatted_digest(hash, digest);
    Ok(sig::verify_detached(
        &Message::new(&message, what),
        signature,
        certs,
    )?)
}

/// Computes the fs-verity digest of `file` with `params` and checks its built-in signature
/// `signature` against `certs`. Returns the digest and the signer.
///
/// The certificates and the signature's framing are checked before the file is read. When the
/// signature does not verify but is over the file's digest with the other hash algorithm (and
/// the same block size and salt), the error says so
/// ([`FsVerityError::SignatureOverOtherHash`]).
pub fn verify_file_signature(
    file: &Path,
    params: &FsVerityParams,
    signature: &Path,
    certs: &[PathBuf],
) -> Result<(FileDigest, VerifiedSigner), FsVerityError> {
    let trusted = sig::load_trusted(certs)?;
    let der = sig::read_signature(signature)?;
    sig::check_signature_framing(&der, signature)?;
    let check = |d: &FileDigest| -> Result<VerifiedSigner, SignatureError> {
        let what = format!("the fs-verity digest {d} of {}", file.display());
        let message = formatted_digest(d.hash(), &d.digest);
        sig::verify_loaded(&Message::new(&message, &what), &der, signature, &trusted)
    };
    let digest = file_digest(file, params)?;
    match check(&digest) {
        Ok(signer) => Ok((digest, signer)),
        Err(e) if e.is_not_verified() => {
            let other = match params.hash {
                HashAlgorithm::Sha512 => HashAlgorithm::Sha256,
                _ => HashAlgorithm::Sha512,
            };
            let other_params = FsVerityParams {
                hash: other,
                ..params.clone()
            };
            let other_digest = file_digest(file, &other_params)?;
            if check(&other_digest).is_ok() {
                return Err(FsVerityError::SignatureOverOtherHash {
                    signature: signature.to_path_buf(),
                    file: file.to_path_buf(),
                    signed: other.name(),
                    given: params.hash.name(),
                });
            }
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}
