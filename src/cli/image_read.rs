//! `dmkit image ls|cat|copy-from|mtree|validate`: an image's files read in userspace through
//! its verified root partition, as an ordinary user (the logic lives in
//! [`crate::image::read`]).

use super::{CliError, CliResult};
use crate::image::read::verified::{open_image, OpenedImage, VerifyOptions};
use crate::image::read::walk::{self, Failure};
use crate::image::read::{resolve, validate, FileKind};
use std::io::Write;
use std::path::PathBuf;

/// The options every read command shares.
#[derive(clap::Args)]
pub struct ImageSource {
    /// The image (a GPT disk image, or a file system with its sidecar files).
    image: PathBuf,
    /// Require a valid signature of the root hash by this certificate (may be repeated).
    #[arg(long)]
    cert: Vec<PathBuf>,
    /// Trust this root hash (hex) instead of the image's.
    #[arg(long)]
    root_hash: Option<String>,
    /// When IMAGE is an https://, http:// or s3:// URL: how it is fetched and cached.
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
}

/// Arguments of `image ls`.
#[derive(clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    src: ImageSource,
    /// The directory or file to list, recursively [default: /].
    path: Option<String>,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

/// Arguments of `image cat`.
#[derive(clap::Args)]
pub struct CatArgs {
    #[command(flatten)]
    src: ImageSource,
    /// The regular file to print.
    path: String,
}

/// Arguments of `image copy-from`.
#[derive(clap::Args)]
pub struct CopyFromArgs {
    #[command(flatten)]
    src: ImageSource,
    /// The file or directory in the image.
    path: String,
    /// Where to copy it to (must not exist).
    dest: PathBuf,
}

/// Arguments of `image mtree`.
#[derive(clap::Args)]
pub struct MtreeArgs {
    #[command(flatten)]
    src: ImageSource,
}

/// Arguments of `image validate`.
#[derive(clap::Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    src: ImageSource,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `--root-hash` as bytes (`image open` and the read commands).
pub(super) fn parse_root_hash(h: Option<&str>) -> Result<Option<Vec<u8>>, CliError> {
    h.map(|h| {
        hex::decode(h.trim())
            .map_err(|_| CliError::invalid(format!("--root-hash: {h:?} is not a hex string")))
    })
    .transpose()
}

fn open(s: &ImageSource) -> Result<OpenedImage, CliError> {
    let root_hash = parse_root_hash(s.root_hash.as_deref())?;
    let o = VerifyOptions {
        image: s.image.clone(),
        certs: s.cert.clone(),
        root_hash,
        remote: s.remote.image(),
        ..Default::default()
    };
    let opened = open_image(&o)?;
    for w in &opened.verified.warnings {
        eprintln!("dmkit: warning: {w}");
    }
    Ok(opened)
}

/// The node at `path`, or an error naming the image and the path.
fn node(o: &OpenedImage, s: &ImageSource, path: &str) -> Result<u64, CliError> {
    resolve(&*o.fs, path).map_err(|e| CliError {
        code: 4,
        message: format!("{}: {path}: {e}", s.image.display()),
    })
}

/// Print each failure as `IMAGE: PATH: error`; exit 2 when a block failed verification, 1
/// otherwise.
fn report(s: &ImageSource, failures: &[Failure]) -> CliResult {
    for f in failures {
        eprintln!("dmkit: {}: {}: {}", s.image.display(), f.path, f.error);
    }
    match failures.len() {
        0 => Ok(()),
        n => {
            let message = format!("{}: {n} path(s) could not be read", s.image.display());
            if failures.iter().any(Failure::verification) {
                Err(CliError::verification(message))
            } else {
                Err(CliError { code: 1, message })
            }
        }
    }
}

/// `image ls`.
pub fn ls(a: LsArgs) -> CliResult {
    let o = open(&a.src)?;
    let path = a.path.as_deref().unwrap_or("/");
    let start = node(&o, &a.src, path)?;
    let (items, failures) = walk::list(&*o.fs, start, &format!("/{}", path.trim_matches('/')));
    let mut out = std::io::stdout().lock();
    if a.json {
        let j =
            serde_json::to_string_pretty(&items).map_err(|e| CliError::invalid(e.to_string()))?;
        writeln!(out, "{j}").map_err(|e| CliError::invalid(e.to_string()))?;
    } else {
        for i in &items {
            let t = match i.kind {
                FileKind::Dir => 'd',
                FileKind::File => '-',
                FileKind::Link => 'l',
                FileKind::Char => 'c',
                FileKind::Block => 'b',
                FileKind::Fifo => 'p',
                FileKind::Socket => 's',
            };
            let size = match i.device {
                Some((ma, mi)) => format!("{ma},{mi}"),
                None => i.size.to_string(),
            };
            let link = i
                .link
                .as_ref()
                .map(|l| format!(" -> {l}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{t}{} {:>5} {:>5} {size:>10} {}{link}",
                i.mode, i.uid, i.gid, i.path
            );
        }
    }
    drop(out);
    report(&a.src, &failures)
}

/// `image cat`.
pub fn cat(a: CatArgs) -> CliResult {
    let o = open(&a.src)?;
    let n = node(&o, &a.src, &a.path)?;
    let name = |e: &dyn std::fmt::Display| format!("{}: {}: {e}", a.src.image.display(), a.path);
    let st = o.fs.stat(n).map_err(|e| CliError::invalid(name(&e)))?;
    if st.kind != FileKind::File {
        return Err(CliError::invalid(name(&"not a regular file")));
    }
    let mut out = std::io::stdout().lock();
    o.fs.copy_to(n, &mut out).map_err(|e| match e {
        crate::image::read::ReadError::Io(_) => CliError::verification(name(&e)),
        e => CliError::invalid(name(&e)),
    })?;
    out.flush().map_err(|e| CliError::invalid(e.to_string()))?;
    Ok(())
}

/// `image copy-from`.
pub fn copy_from(a: CopyFromArgs) -> CliResult {
    if std::fs::symlink_metadata(&a.dest).is_ok() {
        return Err(CliError::invalid(format!(
            "{}: already exists (copy-from creates its destination)",
            a.dest.display()
        )));
    }
    let o = open(&a.src)?;
    let n = node(&o, &a.src, &a.path)?;
    let (r, failures) = walk::copy_out(
        &*o.fs,
        n,
        &format!("/{}", a.path.trim_matches('/')),
        &a.dest,
    );
    for note in &r.notes {
        eprintln!("dmkit: note: {note}");
    }
    report(&a.src, &failures)
}

/// `image mtree`.
pub fn mtree(a: MtreeArgs) -> CliResult {
    let o = open(&a.src)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let root = o.fs.root();
    let failures =
        walk::mtree(&*o.fs, root, "/", &mut out).map_err(|e| CliError::invalid(e.to_string()))?;
    out.flush().map_err(|e| CliError::invalid(e.to_string()))?;
    drop(out);
    report(&a.src, &failures)
}

/// `image validate`.
pub fn validate(a: ValidateArgs) -> CliResult {
    let o = open(&a.src)?;
    let v = &o.verified;
    let bs = u64::from(v.params.data_block_size);
    let r = validate::read_all(&*v.device(), bs);
    let signed = v.signer.as_ref().map(|s| s.subject.clone());
    if a.json {
        let j = serde_json::json!({
            "image": a.src.image,
            "fs": v.fs.name(),
            "root_hash": v.root_hex,
            "root_hash_source": v.root_hash_source,
            "signed_by": signed,
            "signature_checked": !a.src.cert.is_empty(),
            "fec": v.fec,
            "blocks": r.blocks,
            "block_size": r.block_size,
            "bad_blocks": r.bad_blocks,
            "bad_count": r.bad_count,
            "ok": r.bad_count == 0,
        });
        println!("{j:#}");
    } else {
        println!("Image:          {}", a.src.image.display());
        println!("File system:    {}", v.fs.name());
        let from = serde_json::to_value(v.root_hash_source).unwrap_or_default();
        println!(
            "Root hash:      {} (from {})",
            v.root_hex,
            from.as_str().unwrap_or("?")
        );
        println!(
            "Signature:      {}",
            match &signed {
                Some(s) => format!("verified, signed by {s}"),
                None => "not checked (give --cert)".into(),
            }
        );
        println!(
            "Blocks:         {} of {} bytes read and verified, {} bad",
            r.blocks, r.block_size, r.bad_count
        );
    }
    if r.bad_count > 0 {
        return Err(CliError::verification(format!(
            "{}: {} block(s) of the root partition do not match the hash tree (first: {:?})",
            a.src.image.display(),
            r.bad_count,
            r.bad_blocks
        )));
    }
    Ok(())
}
