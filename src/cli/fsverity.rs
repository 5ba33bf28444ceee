//! `dmkit fsverity digest|sign|verify-sig|enable|measure|dump-metadata`, with fsverity-utils'
//! options and output.

use super::fsverity_args::TreeArgs;
use super::{CliError, CliResult};
use crate::fsverity::ioctl::{MetadataReader, MetadataType};
use crate::fsverity::{self, FsVerityError};
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
    /// Check the built-in signature SIG of FILE against certificates, as the kernel's
    /// .fs-verity keyring check does (exit 2 if it does not verify).
    VerifySig(VerifySigArgs),
    /// Enable fs-verity on FILE in the kernel (FS_IOC_ENABLE_VERITY, like `fsverity enable`).
    Enable(EnableArgs),
    /// Print the fs-verity digest the kernel reports for each verity FILE
    /// (FS_IOC_MEASURE_VERITY, like `fsverity measure`).
    Measure(MeasureArgs),
    /// Write a verity file's Merkle tree, descriptor or signature, as the kernel reads it, to
    /// stdout (FS_IOC_READ_VERITY_METADATA, like `fsverity dump_metadata`).
    #[command(alias = "dump_metadata")]
    DumpMetadata(DumpMetadataArgs),
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

/// Arguments of `verify-sig`.
#[derive(clap::Args)]
pub struct VerifySigArgs {
    /// FILE SIG, or SIG alone with --digest.
    #[arg(required = true, num_args = 1..=2, value_names = ["FILE", "SIG"])]
    paths: Vec<PathBuf>,
    /// Trusted certificate (PEM, possibly several, or DER); may be repeated.
    #[arg(long, required = true)]
    cert: Vec<PathBuf>,
    #[command(flatten)]
    tree: TreeArgs,
    /// Check the signature over this digest instead of FILE's: ALG:HEX as `fsverity digest`
    /// prints it, or HEX of the --hash-alg algorithm.
    #[arg(long, conflicts_with_all = ["block_size", "salt"])]
    digest: Option<String>,
}

/// Arguments of `fsverity enable`.
#[derive(clap::Args)]
pub struct EnableArgs {
    /// File to make a verity file (read-only for good).
    file: PathBuf,
    #[command(flatten)]
    tree: TreeArgs,
    /// Built-in signature (DER PKCS#7, as `dmkit fsverity sign` makes) for the kernel to check
    /// against its .fs-verity keyring.
    #[arg(long)]
    signature: Option<PathBuf>,
}

/// Arguments of `fsverity measure`.
#[derive(clap::Args)]
pub struct MeasureArgs {
    /// Verity files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Arguments of `fsverity dump_metadata`.
#[derive(clap::Args)]
pub struct DumpMetadataArgs {
    /// What to dump: merkle_tree, descriptor or signature.
    #[arg(value_name = "TYPE")]
    kind: String,
    /// The verity file.
    file: PathBuf,
    /// Read only from this byte offset (needs --length).
    #[arg(long, requires = "length")]
    offset: Option<u64>,
    /// Read only this many bytes, in one read (needs --offset).
    #[arg(long, requires = "offset")]
    length: Option<u64>,
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
        FsVerityCommand::VerifySig(a) => verify_sig(a),
        FsVerityCommand::Enable(a) => enable(a),
        FsVerityCommand::Measure(a) => measure(a),
        FsVerityCommand::DumpMetadata(a) => dump_metadata(a),
    }
}

/// Exit 2 for a signature that does not verify, 1 for everything else.
fn fsv_err(e: FsVerityError) -> CliError {
    if e.is_not_verified() {
        CliError::verification(e.to_string())
    } else {
        CliError::invalid(e.to_string())
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
    let d = fsverity::file_digest(&a.file, &params).map_err(fsv_err)?;
    let der = fsverity::sign_digest(&d, &a.key, &a.cert).map_err(fsv_err)?;
    std::fs::write(&a.sig, der).map_err(|e| {
        CliError::invalid(format!("{}: cannot write signature: {e}", a.sig.display()))
    })?;
    println!("Signed file '{}' ({d})", a.file.display());
    Ok(())
}

/// `ALG:HEX` or `HEX` (of `default`) as a digest fs-verity takes.
fn parse_digest(text: &str, default: HashAlgorithm) -> Result<(HashAlgorithm, Vec<u8>), CliError> {
    let bad = |why: String| CliError::invalid(format!("--digest {text:?}: {why}"));
    let (hash, hex_part) = match text.split_once(':') {
        Some((alg, h)) => match HashAlgorithm::from_name(alg) {
            Some(a @ (HashAlgorithm::Sha256 | HashAlgorithm::Sha512)) => (a, h),
            _ => {
                return Err(bad(format!(
                    "unknown hash algorithm {alg:?} (sha256, sha512)"
                )))
            }
        },
        None => (default, text),
    };
    let digest = hex::decode(hex_part).map_err(|_| bad("not a hex string".into()))?;
    if digest.len() != hash.digest_size() {
        return Err(bad(format!(
            "a {} digest is {} bytes, not {}",
            hash.name(),
            hash.digest_size(),
            digest.len()
        )));
    }
    Ok((hash, digest))
}

fn verify_sig(a: VerifySigArgs) -> CliResult {
    let params = a.tree.params()?;
    let signer = match (&a.digest, a.paths.as_slice()) {
        (Some(text), [sig]) => {
            let (hash, digest) = parse_digest(text, params.hash)?;
            let shown = format!("{}:{}", hash.name(), hex::encode(&digest));
            let what = format!("the fs-verity digest {shown}");
            let signer =
                fsverity::verify_formatted(hash, &digest, &what, sig, &a.cert).map_err(fsv_err)?;
            println!("{shown}");
            (sig, signer)
        }
        (None, [file, sig]) => {
            let (d, signer) =
                fsverity::verify_file_signature(file, &params, sig, &a.cert).map_err(fsv_err)?;
            println!("{d} {}", file.display());
            (sig, signer)
        }
        (Some(_), _) => {
            return Err(CliError::invalid(
                "with --digest, give only the signature file (SIG)",
            ))
        }
        (None, _) => return Err(CliError::invalid("give FILE and SIG (or SIG and --digest)")),
    };
    let (sig, signer) = signer;
    println!(
        "Signature '{}' verifies: signed by {} (serial {})",
        sig.display(),
        signer.subject,
        signer.serial
    );
    Ok(())
}

fn enable(a: EnableArgs) -> CliResult {
    let params = a.tree.params()?;
    let signature = match &a.signature {
        None => None,
        Some(path) => {
            let der =
                crate::sig::read_signature(path).map_err(|e| CliError::invalid(e.to_string()))?;
            if der.is_empty() {
                return Err(CliError::invalid(format!(
                    "{}: the signature file is empty",
                    path.display()
                )));
            }
            Some(der)
        }
    };
    fsverity::ioctl::enable(&a.file, &params, signature.as_deref()).map_err(fsv_err)
}

fn measure(a: MeasureArgs) -> CliResult {
    // As fsverity-utils: one line per file, stopping at the first that fails.
    for file in &a.files {
        let m = fsverity::ioctl::measure(file).map_err(fsv_err)?;
        println!("{m} {}", file.display());
    }
    Ok(())
}

/// fsverity-utils' read size when no --length is given.
const DUMP_CHUNK: usize = 32768;

fn dump_metadata(a: DumpMetadataArgs) -> CliResult {
    let kind = MetadataType::from_name(&a.kind).ok_or_else(|| {
        CliError::invalid(format!(
            "unknown metadata type {:?} (merkle_tree, descriptor, signature)",
            a.kind
        ))
    })?;
    let reader = MetadataReader::open(&a.file).map_err(fsv_err)?;
    let single = a.length.is_some();
    let len = match a.length {
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n <= 1 << 30)
            .ok_or_else(|| CliError::invalid(format!("--length {n}: larger than 1 GiB")))?,
        None => DUMP_CHUNK,
    };
    let mut buf = vec![0u8; len];
    let mut offset = a.offset.unwrap_or(0);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        let n = reader.read_at(kind, offset, &mut buf).map_err(fsv_err)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])
            .map_err(|e| CliError::invalid(format!("stdout: {e}")))?;
        offset += n as u64;
        if single {
            break;
        }
    }
    out.flush()
        .map_err(|e| CliError::invalid(format!("stdout: {e}")))?;
    Ok(())
}
