//! The internal hash options `dmkit integrity format|verify|open` share (`-I`, the HMAC key
//! file and size), read and checked; in their own file so the commands need not import one
//! another.

use super::CliError;
use crate::integrity::{IntegrityError, Superblock, TagAlgorithm, TagHasher};
use std::path::PathBuf;
use zeroize::Zeroizing;

/// A key read from a key file (wiped on drop).
pub type Key = Zeroizing<Vec<u8>>;

/// An integrity error as a one-line CLI error (exit 1).
pub fn integrity_err(e: IntegrityError) -> CliError {
    CliError::invalid(e.to_string())
}

/// The internal hash, as integritysetup spells it.
#[derive(clap::Args, Clone)]
pub struct AlgArgs {
    /// Integrity algorithm: crc32c, crc32, sha1, sha256, sha512, hmac-sha1, hmac-sha256,
    /// hmac-sha512.
    #[arg(short = 'I', long = "integrity", default_value = "crc32c")]
    integrity: String,
    /// Read the HMAC key from this file.
    #[arg(long)]
    integrity_key_file: Option<PathBuf>,
    /// Key size in bytes (default: the digest size of the HMAC).
    #[arg(long)]
    integrity_key_size: Option<usize>,
}

impl AlgArgs {
    /// The algorithm and its key, read and checked.
    pub fn algorithm_and_key(&self) -> Result<(TagAlgorithm, Option<Key>), CliError> {
        let alg = TagAlgorithm::from_name(&self.integrity)
            .ok_or_else(|| integrity_err(IntegrityError::Algorithm(self.integrity.clone())))?;
        match (&self.integrity_key_file, alg.keyed()) {
            (None, true) => Err(CliError::invalid(format!(
                "--integrity {alg}: needs --integrity-key-file"
            ))),
            (Some(f), false) => Err(CliError::invalid(format!(
                "--integrity-key-file {}: {alg} takes no key",
                f.display()
            ))),
            (None, false) => {
                if self.integrity_key_size.is_some() {
                    return Err(CliError::invalid(format!(
                        "--integrity-key-size: {alg} takes no key"
                    )));
                }
                Ok((alg, None))
            }
            (Some(f), true) => {
                let size = self.integrity_key_size.unwrap_or(alg.digest_size());
                if size == 0 || size > 4096 {
                    return Err(CliError::invalid(format!(
                        "--integrity-key-size: {size} is not in 1..=4096"
                    )));
                }
                let data = Zeroizing::new(std::fs::read(f).map_err(|e| {
                    CliError::invalid(format!("--integrity-key-file {}: {e}", f.display()))
                })?);
                if data.len() < size {
                    return Err(CliError::invalid(format!(
                        "--integrity-key-file {}: {} bytes, --integrity-key-size is {size}",
                        f.display(),
                        data.len()
                    )));
                }
                Ok((alg, Some(Zeroizing::new(data[..size].to_vec()))))
            }
        }
    }

    /// The tagger for the volume `sb` describes.
    pub fn hasher(&self, sb: &Superblock) -> Result<TagHasher, CliError> {
        let (alg, key) = self.algorithm_and_key()?;
        let salt = sb
            .has(crate::integrity::superblock::SB_FLAG_FIXED_HMAC)
            .then_some(sb.salt);
        TagHasher::new(
            alg,
            key.as_deref().map(|k| &k[..]),
            salt,
            usize::from(sb.integrity_tag_size),
            sb.sector_size() as usize,
        )
        .map_err(integrity_err)
    }
}
