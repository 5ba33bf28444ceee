//! `dmkit fsverity seal|mount|close|status`: sealed directory trees, served read-only with
//! every block read checked against its fs-verity Merkle tree.

use super::fsverity_args::TreeArgs;
use super::{CliError, CliResult};
use crate::export::{self, TreeSpec};
use crate::fsverity::sealed::{self, seal::default_manifest, seal::default_store, SealError};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl From<SealError> for CliError {
    fn from(e: SealError) -> Self {
        CliError {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

/// Arguments of `dmkit fsverity seal`.
#[derive(clap::Args)]
pub struct SealArgs {
    /// The directory tree to seal (never written to).
    dir: PathBuf,
    /// The manifest to write [default: DIR.manifest].
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// The sidecar store of Merkle trees [default: MANIFEST.trees].
    #[arg(long)]
    store: Option<PathBuf>,
    #[command(flatten)]
    tree: TreeArgs,
    /// Sign the manifest with this private key (PEM or DER) into MANIFEST.sig.
    #[arg(long, requires = "cert", value_name = "KEY")]
    key: Option<PathBuf>,
    /// The certificate of --key.
    #[arg(long, requires = "key", value_name = "CERT")]
    cert: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `dmkit fsverity mount`.
#[derive(clap::Args)]
pub struct MountArgs {
    /// The sealed directory tree.
    dir: PathBuf,
    /// Where to serve it (an existing directory).
    mountpoint: PathBuf,
    /// The manifest [default: DIR.manifest].
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// The sidecar store [default: MANIFEST.trees].
    #[arg(long)]
    store: Option<PathBuf>,
    /// Trust the manifest only if its SHA-256 is this (as `seal` printed it).
    #[arg(long, value_name = "HEX")]
    manifest_digest: Option<String>,
    /// Require a valid signature of the manifest by this certificate (repeatable: any one).
    #[arg(long = "cert", value_name = "CERT")]
    certs: Vec<PathBuf>,
    /// The manifest's signature [default: MANIFEST.sig].
    #[arg(long, value_name = "SIG")]
    signature: Option<PathBuf>,
    /// Serve without checking reads: only to measure what checking costs.
    #[arg(long)]
    no_verify: bool,
    /// Memory for verified Merkle tree blocks (K, M, G suffixes).
    #[arg(long, default_value = "64M")]
    tree_cache: String,
    /// The mount's read-ahead window (K, M suffixes; 0 keeps the kernel's 128K): sequential
    /// reads then keep several requests in flight, verified on all serving threads. Needs
    /// root; otherwise the kernel's default stays, with a line in the log.
    #[arg(long, default_value = "16M")]
    read_ahead: String,
    /// Name of the mount for `status` and `close` [default: the mount point, escaped].
    #[arg(long)]
    name: Option<String>,
    /// Serving threads.
    #[arg(long, default_value_t = export::DEFAULT_THREADS)]
    threads: usize,
    /// Serve in this process until closed or signalled.
    #[arg(long)]
    foreground: bool,
}

/// Arguments of `dmkit fsverity close`.
#[derive(clap::Args)]
pub struct CloseArgs {
    /// The mount point (or the mount's name).
    target: String,
    /// If it is in use, close it when the last user goes.
    #[arg(long)]
    deferred: bool,
}

/// Arguments of `dmkit fsverity status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The mount point (or the mount's name); all open devices and mounts if omitted.
    target: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Run `dmkit fsverity seal`.
pub fn seal(a: SealArgs) -> CliResult {
    let params = a.tree.params()?;
    let manifest = a.manifest.unwrap_or_else(|| default_manifest(&a.dir));
    let store = a.store.unwrap_or_else(|| default_store(&manifest));
    let opts = sealed::SealOptions {
        params,
        manifest: manifest.clone(),
        store: store.clone(),
        signer: match (a.key, a.cert) {
            (Some(key), Some(cert)) => Some(sealed::seal::Signer { key, cert }),
            _ => None,
        },
    };
    let started = std::time::Instant::now();
    let s = sealed::seal(&a.dir, &opts)?;
    if a.json {
        let mut v = serde_json::to_value(&s).unwrap_or_default();
        v["manifest"] = manifest.display().to_string().into();
        v["store"] = store.display().to_string().into();
        println!("{v:#}");
        return Ok(());
    }
    println!(
        "Sealed {}: {} files ({} bytes), {} directories, {} symlinks, {} other nodes in {:.2} s",
        a.dir.display(),
        s.files,
        s.bytes,
        s.dirs,
        s.symlinks,
        s.others,
        started.elapsed().as_secs_f64()
    );
    println!("Manifest:        {}", manifest.display());
    println!(
        "Merkle trees:    {} ({} distinct)",
        store.display(),
        s.trees
    );
    if let Some(sig) = &s.signature {
        println!("Signature:       {}", sig.display());
    }
    println!("Manifest SHA-256: {}", s.manifest_sha256);
    Ok(())
}

/// Run `dmkit fsverity mount`.
pub fn mount(a: MountArgs) -> CliResult {
    let mountpoint = std::fs::canonicalize(&a.mountpoint)
        .map_err(|e| CliError::invalid(format!("{}: mount point: {e}", a.mountpoint.display())))?;
    if !mountpoint.is_dir() {
        return Err(CliError::invalid(format!(
            "{}: the mount point is not a directory",
            a.mountpoint.display()
        )));
    }
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| export::name_for_mountpoint(&mountpoint));
    super::device::prepare_open(&name, false)?;
    let cache_bytes = crate::bench::parse_size(&a.tree_cache)
        .map_err(|e| CliError::invalid(format!("--tree-cache: {e}")))?;
    let read_ahead = crate::bench::parse_size(&a.read_ahead)
        .map_err(|e| CliError::invalid(format!("--read-ahead: {e}")))?;
    if read_ahead != 0 && read_ahead < 4096 {
        // The kernel counts the window in KiB and a 0 there turns read-ahead off.
        return Err(CliError::invalid(format!(
            "--read-ahead: {} is less than a page (4K); 0 keeps the kernel's window",
            a.read_ahead
        )));
    }
    let manifest = a.manifest.unwrap_or_else(|| default_manifest(&a.dir));
    let store = a.store.unwrap_or_else(|| default_store(&manifest));
    let signature = a
        .signature
        .unwrap_or_else(|| sealed::seal::default_signature(&manifest));
    let opts = sealed::MountOptions {
        manifest: manifest.clone(),
        store: store.clone(),
        manifest_sha256: a.manifest_digest.clone(),
        certs: a.certs.clone(),
        signature: signature.clone(),
        verify: !a.no_verify,
        cache_bytes,
    };
    let tree = Arc::new(sealed::open(&a.dir, &opts)?);
    // Said once the tree is known to open, so that a refusal stays one line.
    if a.manifest_digest.is_none() && a.certs.is_empty() {
        eprintln!(
            "dmkit: {}: trusted as found (no --cert or --manifest-digest): it must come from where nobody else can write",
            manifest.display()
        );
    }
    let (size, nodes) = crate::export::fuse::TreeSource::usage(&*tree);
    let details = json!({
        "tree": tree.root_path().display().to_string(),
        "manifest": std::fs::canonicalize(&manifest).unwrap_or(manifest).display().to_string(),
        "store": std::fs::canonicalize(&store).unwrap_or(store).display().to_string(),
        "nodes": nodes,
        "hash_algorithm": tree.manifest().params.hash.name(),
        "block_size": tree.manifest().params.block_size,
        "verification": if a.no_verify { "off" } else { "every read" },
        "manifest_pinned": a.manifest_digest.is_some(),
        "signature": if a.certs.is_empty() {
            "not required".to_string()
        } else {
            format!("{} (verified)", signature.display())
        },
        "tree_cache_bytes": cache_bytes,
        "read_ahead_bytes": read_ahead,
    });
    let t = tree.clone();
    let stats = Arc::new(move || {
        let c = &t.counters;
        json!({
            "corruptions": c.corrupt_data_blocks.load(Ordering::Relaxed)
                + c.corrupt_tree_blocks.load(Ordering::Relaxed),
            "corrupt_data_blocks": c.corrupt_data_blocks.load(Ordering::Relaxed),
            "corrupt_tree_blocks": c.corrupt_tree_blocks.load(Ordering::Relaxed),
            "changed_files_refused": c.changed_files.load(Ordering::Relaxed),
            "verified_blocks": c.verified_blocks.load(Ordering::Relaxed),
        })
    });
    let spec = TreeSpec {
        name,
        kind: "fsverity".into(),
        mountpoint,
        size,
        threads: a.threads,
        details,
        stats: Some(stats),
        mount: TreeSpec::mounter(tree, (read_ahead > 0).then_some(read_ahead)),
    };
    let print = |o: &export::Opened| println!("{}", o.path.display());
    if a.foreground {
        use std::io::Write;
        export::serve_tree_foreground(spec, |o| {
            print(o);
            let _ = std::io::stdout().flush();
        })?;
    } else {
        print(&export::open_tree(spec)?);
    }
    Ok(())
}

/// Run `dmkit fsverity close`.
pub fn close(a: CloseArgs) -> CliResult {
    super::device::close(super::device::CloseArgs {
        name: a.target,
        deferred: a.deferred,
        cancel_deferred: false,
    })
}

/// Run `dmkit fsverity status`.
pub fn status(a: StatusArgs) -> CliResult {
    super::device::status(super::device::StatusArgs {
        name: a.target,
        json: a.json,
    })
}
