//! Opening a sealed tree for serving: trust the manifest (signature or pinned digest), parse
//! it, compare the tree on disk with it, check every stored tree, then build the namespace.
//! Any failure refuses the whole mount with one line naming the file and what is wrong.

use super::manifest::{EntryKind, Manifest, ROOT_PATH};
use super::source::SealedTree;
use super::{store, walk, SealError};
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Largest manifest read (256 MiB: about two million entries).
pub const MAX_MANIFEST_SIZE: u64 = 256 << 20;
/// Differences named in a refusal; the rest are counted.
const SHOWN_DIFFERENCES: usize = 5;

/// What to mount and how far to trust it.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The manifest.
    pub manifest: PathBuf,
    /// The sidecar store.
    pub store: PathBuf,
    /// If set, the manifest's SHA-256 must be this (hex): trust without a signature.
    pub manifest_sha256: Option<String>,
    /// If not empty, the manifest must carry a valid signature by one of these certificates.
    pub certs: Vec<PathBuf>,
    /// The manifest's detached signature (checked when `certs` is not empty).
    pub signature: PathBuf,
    /// Check reads (off only to measure what checking costs).
    pub verify: bool,
    /// Bytes of verified tree blocks kept in memory.
    pub cache_bytes: u64,
}

/// Read a manifest file, refusing one larger than [`MAX_MANIFEST_SIZE`].
pub fn read_manifest(path: &Path) -> Result<Vec<u8>, SealError> {
    let io = |e: std::io::Error| SealError::Io {
        path: path.to_path_buf(),
        reason: format!("cannot read the manifest: {e}"),
    };
    let f = File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    f.take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_MANIFEST_SIZE {
        return Err(SealError::BadManifest {
            path: path.to_path_buf(),
            field: "size".into(),
            reason: format!("larger than {MAX_MANIFEST_SIZE} bytes"),
        });
    }
    Ok(bytes)
}

/// Check the manifest's bytes against a pinned SHA-256.
pub fn check_pin(path: &Path, bytes: &[u8], pin: &str) -> Result<(), SealError> {
    let got = hex::encode(crate::hash::HashAlgorithm::Sha256.hash(&[bytes]));
    if !got.eq_ignore_ascii_case(pin.trim()) {
        return Err(SealError::NotTrusted(format!(
            "{}: its SHA-256 is {got}, not the pinned {}",
            path.display(),
            pin.trim()
        )));
    }
    Ok(())
}

/// Check that `signature` is a valid detached signature over the manifest's `bytes` (read
/// once: the bytes checked are the bytes parsed) by one of `certs`.
pub fn check_signature(
    manifest: &Path,
    bytes: &[u8],
    signature: &Path,
    certs: &[PathBuf],
) -> Result<(), SealError> {
    use crate::sig::{verify_detached, Message, SignatureError};
    if let Err(e) = std::fs::symlink_metadata(signature) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Err(SealError::NotTrusted(format!(
                "{}: no signature, and --cert requires the manifest {} to be signed (seal --key --cert)",
                signature.display(),
                manifest.display()
            )));
        }
    }
    let what = format!("the manifest {}", manifest.display());
    match verify_detached(&Message::new(bytes, &what), signature, certs) {
        Ok(_) => Ok(()),
        Err(e @ SignatureError::NotVerified { .. }) => Err(SealError::NotTrusted(e.to_string())),
        Err(e) => Err(SealError::Invalid(e.to_string())),
    }
}

/// The differences between the tree on disk (`live`, as walked) and the manifest, as lines
/// naming each path: added, removed (a rename is both), or changed in kind, size, link target
/// or device number. Metadata (mode, owner, times) is served from the manifest and not
/// compared.
pub fn differences(manifest: &Manifest, live: &[walk::Node]) -> Vec<String> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    let sealed = &manifest.entries;
    // Both lists: the root first, then byte order of the path.
    while i < sealed.len() || j < live.len() {
        let order = match (sealed.get(i), live.get(j)) {
            (Some(s), Some(l)) => {
                if s.path == l.path {
                    std::cmp::Ordering::Equal
                } else if s.path == ROOT_PATH {
                    std::cmp::Ordering::Less
                } else if l.path == ROOT_PATH {
                    std::cmp::Ordering::Greater
                } else {
                    s.path.as_bytes().cmp(l.path.as_bytes())
                }
            }
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                out.push(format!("{}: removed", sealed[i].path));
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(format!("{}: added", live[j].path));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let (s, l) = (&sealed[i], &live[j]);
                let changed = match (&s.kind, &l.kind) {
                    (EntryKind::File { size: a, .. }, EntryKind::File { size: b, .. }) => {
                        (a != b).then(|| format!("size {a} -> {b} bytes"))
                    }
                    (EntryKind::Symlink { target: a }, EntryKind::Symlink { target: b }) => {
                        (a != b).then(|| format!("link target {a:?} -> {b:?}"))
                    }
                    (a, b) if a.name() != b.name() => {
                        Some(format!("a {} now, sealed as a {}", b.name(), a.name()))
                    }
                    (a, b) => (a != b).then(|| "device number changed".to_string()),
                };
                if let Some(c) = changed {
                    out.push(format!("{}: {c}", s.path));
                }
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Open the sealed tree `dir` for serving, as `opts` says. The manifest's trust (signature or
/// pin) must already be established by the caller when it wants one; this checks the pin when
/// given. Single-threaded: safe to call before a server forks.
pub fn open(dir: &Path, opts: &MountOptions) -> Result<SealedTree, SealError> {
    let bytes = read_manifest(&opts.manifest)?;
    if let Some(pin) = &opts.manifest_sha256 {
        check_pin(&opts.manifest, &bytes, pin)?;
    }
    if !opts.certs.is_empty() {
        check_signature(&opts.manifest, &bytes, &opts.signature, &opts.certs)?;
    }
    open_with_manifest(dir, &bytes, opts)
}

/// [`open`] with the manifest's bytes already read (and trusted).
pub fn open_with_manifest(
    dir: &Path,
    bytes: &[u8],
    opts: &MountOptions,
) -> Result<SealedTree, SealError> {
    let manifest = Manifest::parse(bytes, &opts.manifest)?;
    let root_path = std::fs::canonicalize(dir).map_err(|e| SealError::Io {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let live = match walk::walk(&root_path) {
        Ok(l) => l,
        Err(SealError::NotUtf8(p)) | Err(SealError::BadName { path: p, .. }) => {
            return Err(SealError::TreeChanged {
                dir: root_path,
                summary: format!("{}: added", p.display()),
            })
        }
        Err(e) => return Err(e),
    };
    let diff = differences(&manifest, &live);
    if !diff.is_empty() {
        let mut summary = diff
            .iter()
            .take(SHOWN_DIFFERENCES)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if diff.len() > SHOWN_DIFFERENCES {
            summary.push_str(&format!("; and {} more", diff.len() - SHOWN_DIFFERENCES));
        }
        return Err(SealError::TreeChanged {
            dir: root_path,
            summary,
        });
    }
    let store = store::load(&opts.store, &manifest)?;
    let root: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&root_path)
        .map_err(|e| SealError::Io {
            path: root_path.clone(),
            reason: e.to_string(),
        })?
        .into();
    Ok(SealedTree::new(
        root,
        root_path,
        opts.store.clone(),
        manifest,
        store,
        opts.verify,
        opts.cache_bytes,
    ))
}
