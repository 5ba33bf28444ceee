//! Sealing a tree: walk it, measure every regular file (on all cores), write each distinct
//! Merkle tree to a fresh sidecar store, then the manifest.
//!
//! The store is written beside the old one and swapped in by rename, and the manifest is
//! replaced by rename last: a seal cut short leaves the old manifest with its old store, or a
//! new store the old manifest does not match (a mount then refuses). Nothing is ever written
//! inside the sealed tree, and the manifest and store may not live in it.

use super::manifest::{Entry, EntryKind, Manifest};
use super::{store, walk, SealError};
use crate::fsverity::{digest_files, FsVerityParams, MerkleTree};
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where a seal goes and how files are measured.
#[derive(Debug, Clone)]
pub struct SealOptions {
    /// Merkle tree parameters.
    pub params: FsVerityParams,
    /// The manifest file to write.
    pub manifest: PathBuf,
    /// The sidecar store directory (replaced as a whole).
    pub store: PathBuf,
    /// Sign the manifest with this key and certificate into [`default_signature`]'s file.
    pub signer: Option<Signer>,
}

/// A private key and its certificate (PEM or DER files) to sign a manifest with.
#[derive(Debug, Clone)]
pub struct Signer {
    /// The private key.
    pub key: PathBuf,
    /// Its certificate.
    pub cert: PathBuf,
}

impl Signer {
    /// A detached PKCS#7 signature (SHA-256) over `manifest`, the bytes of `path`.
    pub fn sign(&self, manifest: &[u8], path: &Path) -> Result<Vec<u8>, SealError> {
        let what = format!("the manifest {}", path.display());
        crate::sig::sign_detached(
            &crate::sig::Message::new(manifest, &what),
            &self.key,
            &self.cert,
            crate::hash::HashAlgorithm::Sha256,
        )
        .map_err(|e| SealError::Invalid(e.to_string()))
    }
}

/// What a seal recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SealSummary {
    /// Regular files.
    pub files: u64,
    /// Directories, the root included.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Device nodes, pipes and sockets.
    pub others: u64,
    /// Bytes of file data.
    pub bytes: u64,
    /// Distinct Merkle trees stored (identical files share one).
    pub trees: u64,
    /// SHA-256 of the manifest's bytes: pins the whole tree (`mount --manifest-digest`).
    pub manifest_sha256: String,
    /// The manifest's signature file, when it was signed.
    pub signature: Option<PathBuf>,
}

/// The default manifest of a tree: `DIR.manifest` beside it.
pub fn default_manifest(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(".manifest");
    PathBuf::from(s)
}

/// The default store of a manifest: `MANIFEST.trees` beside it.
pub fn default_store(manifest: &Path) -> PathBuf {
    let mut s = manifest.as_os_str().to_owned();
    s.push(".trees");
    PathBuf::from(s)
}

/// The signature of a manifest: `MANIFEST.sig` beside it.
pub fn default_signature(manifest: &Path) -> PathBuf {
    let mut s = manifest.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// An absolute, resolved form of `p` whose last component need not exist yet.
fn resolved(p: &Path) -> Result<PathBuf, SealError> {
    let abs = std::path::absolute(p).map_err(|e| SealError::Io {
        path: p.to_path_buf(),
        reason: e.to_string(),
    })?;
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let parent = fs::canonicalize(parent).map_err(|e| SealError::Io {
        path: parent.to_path_buf(),
        reason: format!("cannot resolve: {e}"),
    })?;
    Ok(match abs.file_name() {
        Some(n) => parent.join(n),
        None => parent,
    })
}

/// Seal the tree at `dir`: record it in `opts.manifest` with its trees in `opts.store`.
pub fn seal(dir: &Path, opts: &SealOptions) -> Result<SealSummary, SealError> {
    opts.params.validate()?;
    let root = fs::canonicalize(dir).map_err(|e| SealError::Io {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let signature = default_signature(&opts.manifest);
    if let Some(signer) = &opts.signer {
        // A bad key or certificate fails here, before minutes of hashing and before any
        // output is touched.
        signer.sign(b"dmkit key check", &opts.manifest)?;
    }
    for (what, p) in [
        ("manifest", &opts.manifest),
        ("store", &opts.store),
        ("signature", &signature),
    ] {
        let r = resolved(p)?;
        if r.starts_with(&root) {
            return Err(SealError::Invalid(format!(
                "{}: the {what} would be inside the tree it seals ({}); put it beside it",
                p.display(),
                root.display()
            )));
        }
    }
    let nodes = walk::walk(&root)?;
    let files: Vec<usize> = (0..nodes.len())
        .filter(|&i| matches!(nodes[i].kind, EntryKind::File { .. }))
        .collect();
    let paths: Vec<PathBuf> = files.iter().map(|&i| nodes[i].on_disk(&root)).collect();
    let results: Mutex<Vec<Option<Result<MerkleTree, SealError>>>> =
        Mutex::new((0..files.len()).map(|_| None).collect());
    digest_files(&paths, &opts.params, true, |k, r| {
        let r = r.map_err(SealError::from).and_then(|t| {
            if t.digest.descriptor.data_size == nodes[files[k]].meta.len() {
                Ok(t)
            } else {
                Err(SealError::Io {
                    path: paths[k].clone(),
                    reason: "the file changed size while it was sealed".into(),
                })
            }
        });
        results.lock().unwrap_or_else(|p| p.into_inner())[k] = Some(r);
    });
    let trees = results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .zip(&paths)
        .map(|(r, p)| {
            r.unwrap_or_else(|| {
                Err(SealError::Io {
                    path: p.clone(),
                    reason: "no digest was computed".into(),
                })
            })
        });
    let mut digests: Vec<Option<Vec<u8>>> = vec![None; nodes.len()];
    let tmp_store = sibling(&opts.store, "new")?;
    let _ = fs::remove_dir_all(&tmp_store);
    fs::create_dir(&tmp_store).map_err(|e| SealError::Io {
        path: tmp_store.clone(),
        reason: format!("cannot create: {e}"),
    })?;
    let written = (|| -> Result<u64, SealError> {
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        for (&i, t) in files.iter().zip(trees) {
            let t = t?;
            if seen.insert(t.digest.digest.clone()) {
                store::write_tree(&tmp_store, &t)?;
            }
            digests[i] = Some(t.digest.digest);
        }
        Ok(seen.len() as u64)
    })();
    let distinct = match written {
        Ok(n) => n,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp_store);
            return Err(e);
        }
    };
    let mut summary = SealSummary {
        files: 0,
        dirs: 0,
        symlinks: 0,
        others: 0,
        bytes: 0,
        trees: distinct,
        manifest_sha256: String::new(),
        signature: None,
    };
    let entries: Vec<Entry> = nodes
        .into_iter()
        .zip(digests)
        .map(|(n, digest)| {
            let kind = match n.kind {
                EntryKind::File { size, .. } => {
                    summary.files += 1;
                    summary.bytes += size;
                    EntryKind::File {
                        size,
                        digest: digest.unwrap_or_default(),
                    }
                }
                EntryKind::Dir => {
                    summary.dirs += 1;
                    EntryKind::Dir
                }
                k @ EntryKind::Symlink { .. } => {
                    summary.symlinks += 1;
                    k
                }
                k => {
                    summary.others += 1;
                    k
                }
            };
            Entry {
                path: n.path,
                kind,
                mode: n.meta.mode() & 0o7777,
                uid: n.meta.uid(),
                gid: n.meta.gid(),
                mtime: n.meta.mtime(),
            }
        })
        .collect();
    let manifest = Manifest {
        params: opts.params.clone(),
        entries,
    };
    let bytes = manifest.to_bytes();
    summary.manifest_sha256 = hex::encode(crate::hash::HashAlgorithm::Sha256.hash(&[&bytes]));
    let sig = match &opts.signer {
        Some(signer) => Some(signer.sign(&bytes, &opts.manifest).inspect_err(|_| {
            let _ = fs::remove_dir_all(&tmp_store);
        })?),
        None => None,
    };
    swap_in_dir(&tmp_store, &opts.store)?;
    // A signature left from an earlier seal no longer speaks for this manifest: it goes
    // first, so that no moment shows it beside the new one.
    match fs::remove_file(&signature) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(SealError::Io {
                path: signature,
                reason: format!("cannot remove the old signature: {e}"),
            })
        }
    }
    write_replacing(&opts.manifest, &bytes)?;
    if let Some(sig) = sig {
        write_replacing(&signature, &sig)?;
    }
    summary.signature = opts.signer.as_ref().map(|_| signature);
    Ok(summary)
}

/// `PATH.WHAT-PID`, beside `path`.
fn sibling(path: &Path, what: &str) -> Result<PathBuf, SealError> {
    let name = path.file_name().ok_or_else(|| {
        SealError::Invalid(format!("{}: not a file or directory name", path.display()))
    })?;
    let mut n = name.to_owned();
    n.push(format!(".{what}-{}", std::process::id()));
    Ok(path.with_file_name(n))
}

/// Put the directory `new` in place of `dst` (which may exist): `dst` is renamed away, `new`
/// renamed in, the old one removed.
fn swap_in_dir(new: &Path, dst: &Path) -> Result<(), SealError> {
    let io = |p: &Path, e: std::io::Error| SealError::Io {
        path: p.to_path_buf(),
        reason: e.to_string(),
    };
    let old = sibling(dst, "old")?;
    let had_old = match fs::symlink_metadata(dst) {
        Ok(m) if m.is_dir() => {
            fs::rename(dst, &old).map_err(|e| io(dst, e))?;
            true
        }
        Ok(_) => {
            let _ = fs::remove_dir_all(new);
            return Err(SealError::Invalid(format!(
                "{}: exists and is not a directory; refusing to replace it with a store",
                dst.display()
            )));
        }
        Err(_) => false,
    };
    fs::rename(new, dst).map_err(|e| io(dst, e))?;
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

/// Write `bytes` to `path` through a temporary file renamed over it, synced first.
pub(super) fn write_replacing(path: &Path, bytes: &[u8]) -> Result<(), SealError> {
    use std::io::Write;
    let tmp = sibling(path, "tmp")?;
    let io = |p: &Path, e: std::io::Error| SealError::Io {
        path: p.to_path_buf(),
        reason: e.to_string(),
    };
    let mut f = fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io(path, e)
    })
}
