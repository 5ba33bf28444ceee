//! Walking a directory tree as sealing records it and mounting checks it: every node, never
//! following a symlink, in the manifest's order (the root, then byte order of the path).

use super::manifest::{path_problem, EntryKind, ROOT_PATH};
use super::SealError;
use std::fs::{self, Metadata};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One node found on disk.
#[derive(Debug)]
pub struct Node {
    /// Relative path ([`ROOT_PATH`] for the root).
    pub path: String,
    /// Its kind; a file's digest is left empty (the walk does not read contents).
    pub kind: EntryKind,
    /// `lstat` of the node.
    pub meta: Metadata,
}

impl Node {
    /// Where the node is: `root` joined with its path.
    pub fn on_disk(&self, root: &Path) -> PathBuf {
        if self.path == ROOT_PATH {
            root.to_path_buf()
        } else {
            root.join(&self.path)
        }
    }
}

/// Every node under `root` (a directory), the root first, then in byte order of the path.
pub fn walk(root: &Path) -> Result<Vec<Node>, SealError> {
    let io = |p: &Path, e: std::io::Error| SealError::Io {
        path: p.to_path_buf(),
        reason: e.to_string(),
    };
    let meta = fs::symlink_metadata(root).map_err(|e| io(root, e))?;
    if !meta.is_dir() {
        return Err(SealError::NotADirectory(root.to_path_buf()));
    }
    let mut out = vec![Node {
        path: ROOT_PATH.to_string(),
        kind: EntryKind::Dir,
        meta,
    }];
    let mut dirs = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = dirs.pop() {
        for ent in fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
            let ent = ent.map_err(|e| io(&dir, e))?;
            let full = ent.path();
            let name = ent
                .file_name()
                .into_string()
                .map_err(|_| SealError::NotUtf8(full.clone()))?;
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if let Some(why) = path_problem(&path) {
                return Err(SealError::BadName {
                    path: full,
                    reason: why,
                });
            }
            let meta = fs::symlink_metadata(&full).map_err(|e| io(&full, e))?;
            let t = meta.file_type();
            let kind = if t.is_dir() {
                dirs.push((full.clone(), path.clone()));
                EntryKind::Dir
            } else if t.is_file() {
                EntryKind::File {
                    size: meta.len(),
                    digest: Vec::new(),
                }
            } else if t.is_symlink() {
                let target = fs::read_link(&full)
                    .map_err(|e| io(&full, e))?
                    .into_os_string()
                    .into_string()
                    .map_err(|_| SealError::NotUtf8(full.clone()))?;
                EntryKind::Symlink { target }
            } else if t.is_char_device() {
                EntryKind::CharDevice { rdev: meta.rdev() }
            } else if t.is_block_device() {
                EntryKind::BlockDevice { rdev: meta.rdev() }
            } else if t.is_fifo() {
                EntryKind::Fifo
            } else {
                EntryKind::Socket
            };
            out.push(Node { path, kind, meta });
        }
    }
    out[1..].sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_kinds_and_no_following() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("a/b")).unwrap();
        fs::write(r.join("a/b/f"), b"12345").unwrap();
        fs::write(r.join("a-z"), b"").unwrap();
        std::os::unix::fs::symlink("a", r.join("link")).unwrap();
        let nodes = walk(r).unwrap();
        let paths: Vec<&str> = nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, [".", "a", "a-z", "a/b", "a/b/f", "link"]);
        assert_eq!(
            nodes[4].kind,
            EntryKind::File {
                size: 5,
                digest: vec![]
            }
        );
        assert_eq!(nodes[5].kind, EntryKind::Symlink { target: "a".into() });
        assert!(matches!(
            walk(&r.join("a-z")),
            Err(SealError::NotADirectory(_))
        ));
        assert!(matches!(walk(&r.join("none")), Err(SealError::Io { .. })));
    }

    #[test]
    fn names_that_are_not_utf8_are_refused() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let bad = t.path().join(std::ffi::OsStr::from_bytes(b"x\xff"));
        fs::write(&bad, b"").unwrap();
        assert!(matches!(walk(t.path()), Err(SealError::NotUtf8(p)) if p == bad));
    }
}
