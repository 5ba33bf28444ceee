//! `dmkit fsverity digest|sign`, with fsverity-utils' options and output.

use super::{CliError, CliResult};
use crate::fsverity::{self, FsVerityParams};
use crate::hash::HashAlgorithm;
use std::path::PathBuf;

/// `dmkit fsverity` subcommands.
#[derive(clap::Subcommand)]
pub enum FsVerityCommand {
    /// Print the fs-verity digest of each FILE (like `fsverity digest`).
    Digest(DigestArgs),
    /// Sign the fs-verity digest of FILE into SIG, a DER PKCS#7 signature for the kernel's
    /// built-in signature check (like `fsverity sign`).
    Sign(SignArgs),
    /// Seal a directory tree: record every node and each file's fs-verity digest in a
    /// manifest, with the files' Merkle trees in a store beside it.
    Seal(super::fsverity_tree::SealArgs),
    /// Serve a sealed tree read-only at MOUNTPOINT (FUSE), every block read checked against
    /// its Merkle tree: a tampered block reads as EIO.
    Mount(super::fsverity_tree::MountArgs),
    /// Unmount a sealed tree served by `mount` (by mount point or name).
    Close(super::fsverity_tree::CloseArgs),
    /// Show sealed trees being served (or one, by mount point or name).
    Status(super::fsverity_tree::StatusArgs),
}

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

/// Arguments of `fsverity digest`.
#[derive(clap::Args)]
pub struct DigestArgs {
    /// Files to measure.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    tree: TreeArgs,
    /// Print only the hex digest.
    #[arg(long)]
    compact: bool,
    /// Print the `struct fsverity_formatted_digest` a built-in signature signs, in hex.
    #[arg(long)]
    for_builtin_sig: bool,
}

/// Arguments of `fsverity sign`.
#[derive(clap::Args)]
pub struct SignArgs {
    /// File whose digest is signed.
    file: PathBuf,
    /// Where to write the DER signature.
    sig: PathBuf,
    /// Private key (PEM or DER, unencrypted).
    #[arg(long)]
    key: PathBuf,
    /// Signer certificate (PEM or DER).
    #[arg(long)]
    cert: PathBuf,
    #[command(flatten)]
    tree: TreeArgs,
}

/// Run a `dmkit fsverity` subcommand.
pub fn run(c: FsVerityCommand) -> CliResult {
    match c {
        FsVerityCommand::Digest(a) => digest(a),
        FsVerityCommand::Sign(a) => sign(a),
        FsVerityCommand::Seal(a) => super::fsverity_tree::seal(a),
        FsVerityCommand::Mount(a) => super::fsverity_tree::mount(a),
        FsVerityCommand::Close(a) => super::fsverity_tree::close(a),
        FsVerityCommand::Status(a) => super::fsverity_tree::status(a),
    }
}

fn digest(a: DigestArgs) -> CliResult {
    let params = a.tree.params()?;
    for file in &a.files {
        let d =
            fsverity::file_digest(file, &params).map_err(|e| CliError::invalid(e.to_string()))?;
        let shown = if a.for_builtin_sig {
            hex::encode(fsverity::formatted_digest(d.hash(), &d.digest))
        } else {
            hex::encode(&d.digest)
        };
        // As fsverity-utils: the algorithm prefix only on the digest itself, the file name
        // unless --compact.
        match (a.compact, a.for_builtin_sig) {
            (true, _) => println!("{shown}"),
            (false, true) => println!("{shown} {}", file.display()),
            (false, false) => println!("{}:{shown} {}", d.hash().name(), file.display()),
        }
    }
    Ok(())
}

fn sign(a: SignArgs) -> CliResult {
    let params = a.tree.params()?;
    let d =
        fsverity::file_digest(&a.file, &params).map_err(|e| CliError::invalid(e.to_string()))?;
    let der =
        fsverity::sign_digest(&d, &a.key, &a.cert).map_err(|e| CliError::invalid(e.to_string()))?;
    std::fs::write(&a.sig, der).map_err(|e| {
        CliError::invalid(format!("{}: cannot write signature: {e}", a.sig.display()))
    })?;
    println!("Signed file '{}' ({d})", a.file.display());
    Ok(())
}
