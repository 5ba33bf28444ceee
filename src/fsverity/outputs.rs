//! `--out-merkle-tree` and `--out-descriptor`, with fsverity-utils' semantics and without
//! half-written files.
//!
//! fsverity-utils opens each output once (truncating it) and, for every input file in turn,
//! writes the Merkle tree at offset 0 and appends the 256-byte descriptor. With several input
//! files the tree file therefore ends up as the trees laid over one another (as long as the
//! largest, each byte from the last file whose tree reaches it) and the descriptor file as all
//! descriptors in order; [`MetadataFiles`] produces the same bytes.
//!
//! Unlike fsverity-utils, nothing is written over the named files until every input was
//! digested: a regular file (or a new one) is written as a temporary file beside it and
//! renamed over it by [`MetadataFiles::commit`], so a failure leaves it as it was. A target
//! that is not a regular file (`/dev/stdout`, a FIFO) gets the tree at commit and each
//! descriptor as it comes, where fsverity-utils refuses the tree ("preallocating").

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::merkle::MerkleTree;
use super::FsVerityError;

/// The Merkle tree and descriptor output files of one `fsverity digest`.
#[derive(Debug, Default)]
pub struct MetadataFiles {
    tree: Option<Output>,
    descriptor: Option<Output>,
}

impl MetadataFiles {
    /// Prepares the outputs (either may be absent). Fails, naming the file, when one cannot
    /// be written: nothing has been changed then.
    pub fn create(tree: Option<&Path>, descriptor: Option<&Path>) -> Result<Self, FsVerityError> {
        let tree = tree.map(Output::create).transpose()?;
        let descriptor = descriptor.map(Output::create).transpose()?;
        Ok(MetadataFiles { tree, descriptor })
    }

    /// Whether the trees are wanted (so digests must keep them).
    pub fn wants_tree(&self) -> bool {
        self.tree.is_some()
    }

    /// Whether [`MetadataFiles::add`] writes the descriptor out at once (its target is not a
    /// regular file, e.g. standard output), so output meant to come before it must be
    /// flushed first.
    pub fn streams_descriptors(&self) -> bool {
        matches!(
            self.descriptor,
            Some(Output {
                kind: Kind::Direct { .. },
                ..
            })
        )
    }

    /// Adds the next input file's tree and descriptor.
    pub fn add(&mut self, t: &MerkleTree) -> Result<(), FsVerityError> {
        if let Some(o) = &mut self.tree {
            o.lay_over(&t.tree)?;
        }
        if let Some(o) = &mut self.descriptor {
            o.append(&t.descriptor_bytes())?;
        }
        Ok(())
    }

    /// Puts the outputs in place.
    pub fn commit(self) -> Result<(), FsVerityError> {
        for o in [self.tree, self.descriptor].into_iter().flatten() {
            o.commit()?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Output {
    /// The name the user gave, for messages.
    shown: PathBuf,
    file: File,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A temporary file beside `target`, renamed over it on commit (removed if dropped).
    Staged {
        temp: PathBuf,
        target: PathBuf,
        committed: bool,
    },
    /// Not a regular file: the tree is kept here until commit, descriptors go straight out.
    Direct { tree: Vec<u8> },
}

impl Output {
    fn create(path: &Path) -> Result<Output, FsVerityError> {
        let err = |e| write_error(path, e);
        // Write through symbolic links, as opening the name would.
        let target = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let existing = fs::metadata(&target).ok();
        if let Some(m) = existing.as_ref().filter(|m| !m.is_file()) {
            if m.is_dir() {
                return Err(err(std::io::Error::from_raw_os_error(libc::EISDIR)));
            }
            let file = OpenOptions::new().write(true).open(&target).map_err(err)?;
            return Ok(Output {
                shown: path.to_path_buf(),
                file,
                kind: Kind::Direct { tree: Vec::new() },
            });
        }
        let name = target
            .file_name()
            .ok_or_else(|| err(std::io::Error::from_raw_os_error(libc::EISDIR)))?;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let temp = target.with_file_name(format!(
            ".{}.dmkit-{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)
            .map_err(err)?;
        let out = Output {
            shown: path.to_path_buf(),
            file,
            kind: Kind::Staged {
                temp,
                target,
                committed: false,
            },
        };
        if let Some(m) = existing {
            // The replaced file keeps its permissions.
            out.file
                .set_permissions(fs::Permissions::from_mode(m.permissions().mode() & 0o7777))
                .map_err(err)?;
        }
        Ok(out)
    }

    /// Writes `tree` at offset 0, over what earlier files wrote.
    fn lay_over(&mut self, tree: &[u8]) -> Result<(), FsVerityError> {
        match &mut self.kind {
            Kind::Staged { .. } => self
                .file
                .write_all_at(tree, 0)
                .map_err(|e| write_error(&self.shown, e)),
            Kind::Direct { tree: kept } => {
                if kept.len() < tree.len() {
                    kept.resize(tree.len(), 0);
                }
                kept[..tree.len()].copy_from_slice(tree);
                Ok(())
            }
        }
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), FsVerityError> {
        self.file
            .write_all(bytes)
            .map_err(|e| write_error(&self.shown, e))
    }

    fn commit(mut self) -> Result<(), FsVerityError> {
        let shown = &self.shown;
        match &mut self.kind {
            Kind::Direct { tree } => self.file.write_all(tree),
            Kind::Staged {
                temp,
                target,
                committed,
            } => self.file.sync_all().and_then(|()| {
                fs::rename(&*temp, &*target)?;
                *committed = true;
                Ok(())
            }),
        }
        .map_err(|e| write_error(shown, e))
    }
}

fn write_error(path: &Path, e: std::io::Error) -> FsVerityError {
    FsVerityError::Io {
        path: path.to_path_buf(),
        reason: format!("cannot write: {e}"),
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Kind::Staged {
            temp,
            committed: false,
            ..
        } = &self.kind
        {
            let _ = fs::remove_file(temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsverity::FsVerityParams;

    fn tree(data: &[u8]) -> MerkleTree {
        let p = FsVerityParams {
            block_size: 1024,
            ..FsVerityParams::default()
        };
        MerkleTree::from_bytes(data, &p, true).unwrap()
    }

    #[test]
    fn trees_are_laid_over_and_descriptors_appended() {
        let dir = tempfile::tempdir().unwrap();
        let (tp, dp) = (dir.path().join("t"), dir.path().join("d"));
        fs::write(&tp, b"old contents").unwrap();
        let big = tree(&vec![1u8; 300 * 1024]);
        let small = tree(&vec![2u8; 5 * 1024]);
        let mut out = MetadataFiles::create(Some(&tp), Some(&dp)).unwrap();
        out.add(&big).unwrap();
        out.add(&small).unwrap();
        // Nothing replaced before the commit.
        assert_eq!(fs::read(&tp).unwrap(), b"old contents");
        assert!(!dp.exists());
        out.commit().unwrap();
        let mut expect = big.tree.clone();
        expect[..small.tree.len()].copy_from_slice(&small.tree);
        assert_eq!(fs::read(&tp).unwrap(), expect);
        let mut d = big.descriptor_bytes().to_vec();
        d.extend_from_slice(&small.descriptor_bytes());
        assert_eq!(fs::read(&dp).unwrap(), d);
        // Only the two outputs are left.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn dropped_outputs_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tp = dir.path().join("t");
        fs::write(&tp, b"keep").unwrap();
        let mut out = MetadataFiles::create(Some(&tp), None).unwrap();
        out.add(&tree(&[3u8; 4000])).unwrap();
        drop(out);
        assert_eq!(fs::read(&tp).unwrap(), b"keep");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn unwritable_outputs_are_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [dir.path().join("no/such/dir/t"), dir.path().to_path_buf()] {
            let e = MetadataFiles::create(Some(&bad), None).unwrap_err();
            assert!(e.to_string().contains(&*bad.to_string_lossy()), "{e}");
            assert!(e.to_string().contains("cannot write"), "{e}");
        }
    }
}
