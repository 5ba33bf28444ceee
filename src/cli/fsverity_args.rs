//! The Merkle tree options every `dmkit fsverity` command shares (digest, sign, enable,
//! seal), in their own file so the commands that take them need not import one another.

use super::CliError;
use crate::fsverity::{self, FsVerityParams};
use crate::hash::HashAlgorithm;

/// Merkle tree parameters, as fsverity-utils spells them.
#[derive(clap::Args, Clone)]
pub struct TreeArgs {
    /// Hash algorithm: sha256 or sha512.
    #[arg(long, default_value = "sha256")]
    hash_alg: String,
    /// Merkle tree block size (a power of two from 1024 to 65536).
    #[arg(long, default_value_t = fsverity::digest::DEFAULT_BLOCK_SIZE)]
    block_size: u32,
    /// Salt as hex (at most 32 bytes).
    #[arg(long)]
    salt: Option<String>,
}

impl TreeArgs {
    /// The parameters, checked as fsverity-utils checks them.
    pub fn params(&self) -> Result<FsVerityParams, CliError> {
        let hash = match HashAlgorithm::from_name(&self.hash_alg) {
            Some(h @ (HashAlgorithm::Sha256 | HashAlgorithm::Sha512)) => h,
            _ => {
                return Err(CliError::invalid(format!(
                    "--hash-alg: unknown hash algorithm {:?} (sha256, sha512)",
                    self.hash_alg
                )))
            }
        };
        let salt = match &self.salt {
            None => Vec::new(),
            Some(s) => hex::decode(s)
                .map_err(|_| CliError::invalid(format!("--salt: {s:?} is not a hex string")))?,
        };
        let params = FsVerityParams {
            hash,
            block_size: self.block_size,
            salt,
        };
        params
            .validate()
            .map_err(|e| CliError::invalid(e.to_string()))?;
        Ok(params)
    }
}
