//! `dmkit fsverity digest|sign`, with fsverity-utils' options and output.

use super::{CliError, CliResult};
use crate::fsverity::{self, FsVerityParams};
use crate::hash::HashAlgorithm;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// `dmkit fsverity` subcommands.
#[derive(clap::Subcommand)]
pub enum FsVerityCommand {
    /// Print the fs-verity digest of each FILE (like `fsverity digest`).
    Digest(DigestArgs),
    /// Sign the fs-verity digest of FILE into SIG, a DER PKCS#7 signature for the kernel's
    /// built-in signature check (like `fsverity sign`).
    Sign(SignArgs),
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
    fn params(&self) -> Result<FsVerityParams, CliError> {
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
    /// Write the Merkle tree (as FS_IOC_READ_VERITY_METADATA returns it) to FILE; with several
    /// files, the trees over one another, as fsverity-utils does.
    #[arg(long, value_name = "FILE")]
    out_merkle_tree: Option<PathBuf>,
    /// Write the 256-byte fs-verity descriptor to FILE; with several files, one after another.
    #[arg(long, value_name = "FILE")]
    out_descriptor: Option<PathBuf>,
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
    }
}

/// Digests every file on all cores and prints them in argument order, as each is ready; the
/// first file that fails ends the command there (like fsverity-utils, which stops at it), and
/// the output files are then left untouched.
fn digest(a: DigestArgs) -> CliResult {
    let params = a.tree.params()?;
    let outputs =
        fsverity::MetadataFiles::create(a.out_merkle_tree.as_deref(), a.out_descriptor.as_deref())
            .map_err(|e| CliError::invalid(e.to_string()))?;
    let keep_tree = outputs.wants_tree();
    let state = Mutex::new(InOrder {
        next: 0,
        ready: BTreeMap::new(),
        out: std::io::BufWriter::with_capacity(64 << 10, std::io::stdout()),
        outputs,
        failed: None,
    });
    let print = |d: &fsverity::MerkleTree, file: &std::path::Path, out: &mut dyn Write| {
        let d = &d.digest;
        let shown = if a.for_builtin_sig {
            hex::encode(fsverity::formatted_digest(d.hash(), &d.digest))
        } else {
            hex::encode(&d.digest)
        };
        // As fsverity-utils: the algorithm prefix only on the digest itself, the file name
        // unless --compact.
        match (a.compact, a.for_builtin_sig) {
            (true, _) => writeln!(out, "{shown}"),
            (false, true) => writeln!(out, "{shown} {}", file.display()),
            (false, false) => writeln!(out, "{}:{shown} {}", d.hash().name(), file.display()),
        }
    };
    fsverity::digest_files(&a.files, &params, keep_tree, |i, r| {
        let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        s.ready.insert(i, r);
        while let Some(r) = s.ready.remove(&s.next) {
            let file = &a.files[s.next];
            s.next += 1;
            if s.failed.is_some() {
                continue;
            }
            let done = r.map_err(|e| e.to_string()).and_then(|t| {
                // A descriptor written straight to stdout must follow the lines before it.
                if s.outputs.streams_descriptors() {
                    s.out.flush().map_err(|e| format!("stdout: {e}"))?;
                }
                s.outputs.add(&t).map_err(|e| e.to_string())?;
                print(&t, file, &mut s.out).map_err(|e| format!("stdout: {e}"))
            });
            if let Err(e) = done {
                s.failed = Some(e);
            }
        }
    });
    let s = state.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut out = s.out;
    out.flush()
        .map_err(|e| CliError::invalid(format!("stdout: {e}")))?;
    if let Some(e) = s.failed {
        return Err(CliError::invalid(e));
    }
    s.outputs
        .commit()
        .map_err(|e| CliError::invalid(e.to_string()))
}

/// Results waiting for the ones before them.
struct InOrder {
    /// Index of the next file to print.
    next: usize,
    ready: BTreeMap<usize, Result<fsverity::MerkleTree, fsverity::FsVerityError>>,
    out: std::io::BufWriter<std::io::Stdout>,
    outputs: fsverity::MetadataFiles,
    /// The first failure, in argument order.
    failed: Option<String>,
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
