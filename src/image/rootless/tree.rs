//! An image's file system as a FUSE [`TreeSource`]: every name, attribute and byte comes from
//! the userspace reader (on its [`ReaderHandle`] thread), so every block is read through the
//! verified path. A block that fails verification fails the one request that needs it with
//! `EIO`: the file holding it (or the directory, for a directory block), and nothing else.
//!
//! FUSE inode numbers are the reader's node numbers plus 2, the root being 1 as FUSE wants:
//! stable while mounted, equal for hard links where the reader knows them. Directory listings
//! and attributes are kept once read (the tree never changes), so the kernel's requests after
//! the first cost no reader call.

use super::actor::ReaderHandle;
use crate::export::fuse::{NodeAttr, NodeKind, ReadFailure, TreeSource, ROOT_INODE};
use crate::image::read::{FileKind, NodeId, ReadError, Stat};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A directory's entries: names and FUSE inode numbers.
type Listing = Arc<Vec<(Vec<u8>, u64)>>;

/// An image's tree, served.
pub struct ImageTree {
    reader: Arc<ReaderHandle>,
    root: NodeId,
    /// Bytes of the file system (for `statfs`).
    fs_size: u64,
    attrs: RwLock<HashMap<u64, NodeAttr>>,
    dirs: RwLock<HashMap<u64, Listing>>,
    parents: RwLock<HashMap<u64, u64>>,
    /// Every node's owner and group as served, instead of the image's (see [`ImageTree::new`]).
    owner: Option<(u32, u32)>,
    /// Requests that failed on a block the reader could not read (verity mismatches).
    pub corruptions: AtomicU64,
    /// Requests that failed on the reader's other errors (metadata it refuses, unsupported).
    pub errors: AtomicU64,
}

/// An open regular file: the reader's node.
pub struct OpenFile {
    node: NodeId,
}

/// The kernel's `new_encode_dev` of a device's major and minor numbers (what FUSE's `rdev`
/// holds).
fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

fn node_attr(s: &Stat) -> NodeAttr {
    let (major, minor) = s.rdev_parts();
    NodeAttr {
        kind: match s.kind {
            FileKind::File => NodeKind::File,
            FileKind::Dir => NodeKind::Dir,
            FileKind::Link => NodeKind::Symlink,
            FileKind::Char => NodeKind::CharDevice,
            FileKind::Block => NodeKind::BlockDevice,
            FileKind::Fifo => NodeKind::Fifo,
            FileKind::Socket => NodeKind::Socket,
        },
        perm: s.perm & 0o7777,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        mtime: s.mtime,
        rdev: encode_dev(major, minor),
    }
}

impl ImageTree {
    /// The tree of the reader's file system (its root is read now: an image whose root cannot
    /// be read is refused here). With `owner`, every node is served as owned by that uid and
    /// gid: an unprivileged user's mount then reads the image's root-only files and its
    /// overlay can copy them up (the user can read every byte of the image file anyway; `image
    /// ls` and `mtree` show the real owners).
    pub fn new(
        reader: Arc<ReaderHandle>,
        fs_size: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<ImageTree, ReadError> {
        let root = reader.root()?;
        let st = reader.stat(root)?;
        if st.kind != FileKind::Dir {
            return Err(ReadError::Corrupt("the root is not a directory".into()));
        }
        let t = ImageTree {
            reader,
            root,
            fs_size,
            attrs: RwLock::new(HashMap::new()),
            dirs: RwLock::new(HashMap::new()),
            parents: RwLock::new(HashMap::new()),
            owner,
            corruptions: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        };
        t.attrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ROOT_INODE, t.served(&st));
        Ok(t)
    }

    fn served(&self, s: &Stat) -> NodeAttr {
        let mut a = node_attr(s);
        if let Some((uid, gid)) = self.owner {
            (a.uid, a.gid) = (uid, gid);
        }
        a
    }

    fn ino(&self, node: NodeId) -> Option<u64> {
        if node == self.root {
            Some(ROOT_INODE)
        } else {
            node.checked_add(2)
        }
    }

    fn node(&self, ino: u64) -> Option<NodeId> {
        match ino {
            ROOT_INODE => Some(self.root),
            0 => None,
            i => Some(i - 2),
        }
    }

    /// Count and log a reader error about inode `ino`; the errno the caller gets.
    fn failed(&self, ino: u64, what: &str, e: &ReadError) -> i32 {
        match e {
            ReadError::NotFound => return libc::ENOENT,
            ReadError::NotDir => return libc::ENOTDIR,
            ReadError::Io(_) => self.corruptions.fetch_add(1, Ordering::Relaxed),
            _ => self.errors.fetch_add(1, Ordering::Relaxed),
        };
        eprintln!(
            "dmkit: {} inode {}: {what}: {e}",
            self.reader.fs_name(),
            self.node(ino).unwrap_or(0)
        );
        libc::EIO
    }

    /// The entries of directory `ino`, read once.
    fn listing(&self, ino: u64) -> Result<Listing, i32> {
        if let Some(l) = self
            .dirs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
        {
            return Ok(l.clone());
        }
        let node = self.node(ino).ok_or(libc::ENOENT)?;
        let entries = self
            .reader
            .read_dir(node)
            .map_err(|e| self.failed(ino, "directory", &e))?;
        let mut list = Vec::with_capacity(entries.len());
        {
            let mut parents = self.parents.write().unwrap_or_else(|e| e.into_inner());
            for e in entries {
                let Some(child) = self.ino(e.node) else {
                    continue;
                };
                parents.insert(child, ino);
                list.push((e.name, child));
            }
        }
        let list = Arc::new(list);
        self.dirs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino, list.clone());
        Ok(list)
    }

    fn stat(&self, ino: u64) -> Result<NodeAttr, i32> {
        if let Some(a) = self
            .attrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
        {
            return Ok(*a);
        }
        let node = self.node(ino).ok_or(libc::ENOENT)?;
        let a = self.served(
            &self
                .reader
                .stat(node)
                .map_err(|e| self.failed(ino, "inode", &e))?,
        );
        self.attrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino, a);
        Ok(a)
    }
}

impl TreeSource for ImageTree {
    type Handle = OpenFile;
    type Scratch = Vec<u8>;

    fn attr(&self, ino: u64) -> Option<NodeAttr> {
        self.stat(ino).ok()
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<u64, i32> {
        if self.stat(parent)?.kind != NodeKind::Dir {
            return Err(libc::ENOTDIR);
        }
        let list = self.listing(parent)?;
        let child = list
            .binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .ok()
            .map(|i| list[i].1)
            .or_else(|| list.iter().find(|(n, _)| n == name).map(|(_, c)| *c))
            .ok_or(libc::ENOENT)?;
        // The entry exists; its inode must be readable for the kernel to use it.
        self.stat(child)?;
        Ok(child)
    }

    fn parent(&self, ino: u64) -> Option<u64> {
        if ino == ROOT_INODE {
            return Some(ROOT_INODE);
        }
        self.parents
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .copied()
    }

    fn open_dir(&self, ino: u64) -> Result<(), i32> {
        self.listing(ino).map(|_| ())
    }

    fn dir_entry(&self, ino: u64, index: usize) -> Option<(Cow<'_, [u8]>, u64)> {
        let list = self.listing(ino).ok()?;
        let (name, child) = list.get(index)?;
        Some((Cow::Owned(name.clone()), *child))
    }

    fn read_link(&self, ino: u64) -> Result<Vec<u8>, i32> {
        let node = self.node(ino).ok_or(libc::ENOENT)?;
        self.reader
            .readlink(node)
            .map_err(|e| self.failed(ino, "symlink", &e))
    }

    fn open(&self, ino: u64) -> Result<OpenFile, i32> {
        if self.stat(ino)?.kind != NodeKind::File {
            return Err(libc::EINVAL);
        }
        Ok(OpenFile {
            node: self.node(ino).ok_or(libc::ENOENT)?,
        })
    }

    fn scratch(&self) -> Vec<u8> {
        Vec::new()
    }

    fn read<'s>(
        &self,
        file: &OpenFile,
        offset: u64,
        size: usize,
        scratch: &'s mut Vec<u8>,
    ) -> Result<&'s [u8], ReadFailure> {
        match self.reader.read(file.node, offset, size) {
            Ok(data) => {
                *scratch = data;
                Ok(scratch.as_slice())
            }
            Err(e) => {
                let corrupt = matches!(e, ReadError::Io(_));
                let errno = self.failed(
                    self.ino(file.node).unwrap_or(0),
                    &format!("read of {size} bytes at byte {offset}"),
                    &e,
                );
                Err(if corrupt {
                    ReadFailure::Corrupt
                } else {
                    ReadFailure::Errno(errno)
                })
            }
        }
    }

    fn usage(&self) -> (u64, u64) {
        let nodes = self.attrs.read().unwrap_or_else(|e| e.into_inner()).len() as u64;
        (self.fs_size, nodes)
    }

    fn xattrs(&self, ino: u64) -> Result<crate::export::fuse::Xattrs, i32> {
        let node = self.node(ino).ok_or(libc::ENOENT)?;
        self.reader
            .xattrs(node)
            .map_err(|e| self.failed(ino, "extended attributes", &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_as_the_kernel_encodes_them() {
        assert_eq!(encode_dev(1, 3), 0x103);
        assert_eq!(encode_dev(259, 0x12345), 0x12310345);
    }
}
