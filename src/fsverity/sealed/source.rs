//! A sealed tree as a FUSE [`TreeSource`]: the namespace and metadata come from the manifest
//! (what was sealed is what is served, whatever changed on disk since), the contents from the
//! files on disk, every block checked against its tree before it is returned.

use super::manifest::{Entry, EntryKind, Manifest, ROOT_PATH};
use super::store::Store;
use super::verify::{Failure, Verifier};
use crate::export::fuse::{NodeAttr, NodeKind, ReadFailure, TreeSource, MAX_WRITE, ROOT_INODE};
use crate::logcap::LogCap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One node of the served namespace.
struct Node {
    /// Index of its manifest entry.
    entry: usize,
    /// Its name in its directory (empty for the root).
    name: Box<str>,
    /// Its directory's index (the root's own).
    parent: u32,
    /// A directory's children, by name.
    children: Vec<u32>,
    attr: NodeAttr,
}

/// Counters of a sealed mount beyond the export's own.
#[derive(Debug, Default)]
pub struct SealedCounters {
    /// Data blocks that did not match their tree.
    pub corrupt_data_blocks: AtomicU64,
    /// Tree blocks in the store that did not match the level above.
    pub corrupt_tree_blocks: AtomicU64,
    /// Opens refused because the file changed in size or kind since sealing.
    pub changed_files: AtomicU64,
    /// Blocks read and verified.
    pub verified_blocks: AtomicU64,
}

/// A sealed tree ready to serve: see [`super::open()`].
pub struct SealedTree {
    root: OwnedFd,
    root_path: PathBuf,
    store_dir: PathBuf,
    manifest: Manifest,
    nodes: Vec<Node>,
    store: Store,
    verifier: Verifier,
    verify: bool,
    log: LogCap,
    /// What went wrong, counted.
    pub counters: SealedCounters,
}

/// An open sealed file.
pub struct OpenFile {
    node: u32,
    data: File,
    tree: Option<File>,
}

/// A serving thread's buffers.
pub struct Scratch {
    buf: Vec<u8>,
    hashes: Vec<u8>,
}

fn kind_of(e: &EntryKind) -> (NodeKind, u64, u32) {
    // The device number as FUSE carries it (new_encode_dev: 12-bit major, 20-bit minor).
    let rdev = |r: u64| {
        let (ma, mi) = (libc::major(r), libc::minor(r));
        (mi & 0xff) | (ma << 8) | ((mi & !0xff) << 12)
    };
    match e {
        EntryKind::Dir => (NodeKind::Dir, 0, 0),
        EntryKind::File { size, .. } => (NodeKind::File, *size, 0),
        EntryKind::Symlink { target } => (NodeKind::Symlink, target.len() as u64, 0),
        EntryKind::CharDevice { rdev: r } => (NodeKind::CharDevice, 0, rdev(*r)),
        EntryKind::BlockDevice { rdev: r } => (NodeKind::BlockDevice, 0, rdev(*r)),
        EntryKind::Fifo => (NodeKind::Fifo, 0, 0),
        EntryKind::Socket => (NodeKind::Socket, 0, 0),
    }
}

fn attr_of(e: &Entry) -> NodeAttr {
    let (kind, size, rdev) = kind_of(&e.kind);
    NodeAttr {
        kind,
        perm: e.mode,
        uid: e.uid,
        gid: e.gid,
        size,
        mtime: e.mtime,
        rdev,
    }
}

impl SealedTree {
    /// Serve `manifest`'s tree from the directory open as `root` (at `root_path`, for
    /// messages), checking reads against `store` (loaded from `store_dir`) unless `verify` is
    /// false; `cache_bytes` bounds the verified tree blocks kept in memory.
    pub(super) fn new(
        root: OwnedFd,
        root_path: PathBuf,
        store_dir: PathBuf,
        manifest: Manifest,
        store: Store,
        verify: bool,
        cache_bytes: u64,
    ) -> SealedTree {
        let mut nodes: Vec<Node> = Vec::with_capacity(manifest.entries.len());
        let mut index: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        for (i, e) in manifest.entries.iter().enumerate() {
            let (parent, name) = if e.path == ROOT_PATH {
                (0, "")
            } else {
                let parent = super::manifest::parent_of(&e.path);
                let name = e.path.rsplit('/').next().unwrap_or(&e.path);
                // The parser guarantees every parent is an earlier directory entry.
                (index[parent], name)
            };
            let id = nodes.len() as u32;
            if e.kind == EntryKind::Dir {
                index.insert(&e.path, id);
            }
            if id != 0 {
                nodes[parent as usize].children.push(id);
            }
            nodes.push(Node {
                entry: i,
                name: name.into(),
                parent,
                children: Vec::new(),
                attr: attr_of(e),
            });
        }
        // Children in name order, for lookup by binary search (paths are sorted as whole
        // strings, which is not quite the order of the last component).
        let names: Vec<Box<str>> = nodes.iter().map(|n| n.name.clone()).collect();
        for n in &mut nodes {
            n.children
                .sort_unstable_by(|&a, &b| names[a as usize].cmp(&names[b as usize]));
        }
        let verifier = Verifier::new(&manifest.params, cache_bytes);
        SealedTree {
            root,
            root_path,
            store_dir,
            manifest,
            nodes,
            store,
            verifier,
            verify,
            log: LogCap::new("verification failures", crate::logcap::DEFAULT_LIMIT),
            counters: SealedCounters::default(),
        }
    }

    /// The manifest served.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether reads are verified (off only for measuring what verification costs).
    pub fn verifying(&self) -> bool {
        self.verify
    }

    fn node(&self, ino: u64) -> Option<&Node> {
        self.nodes
            .get(usize::try_from(ino.checked_sub(ROOT_INODE)?).ok()?)
    }

    fn path_of(&self, node: &Node) -> &str {
        &self.manifest.entries[node.entry].path
    }

    /// Open `rel` below the root for reading, never leaving the tree or following a symlink.
    fn open_beneath(&self, rel: &str) -> std::io::Result<File> {
        let c = CString::new(rel).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: open_how is plain data (three integers); all-zero is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
        how.resolve =
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: openat2(2) with a NUL-terminated path and an open_how that outlive the call;
        // the descriptor returned is owned right below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.root.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(unsafe { File::from_raw_fd(fd as i32) })
    }

    fn changed(&self, path: &str, why: String) -> i32 {
        self.counters.changed_files.fetch_add(1, Ordering::Relaxed);
        self.log.log(|| {
            format!(
                "{}/{path}: {why}; refusing to serve it",
                self.root_path.display()
            )
        });
        libc::EIO
    }

    fn read_fully(&self, f: &File, buf: &mut [u8], offset: u64, path: &str) -> Result<(), i32> {
        f.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.changed(path, "it shrank after sealing".into())
            } else {
                self.log.log(|| {
                    format!(
                        "{}/{path}: read error at byte {offset}: {e}",
                        self.root_path.display()
                    )
                });
                e.raw_os_error().unwrap_or(libc::EIO)
            }
        })
    }
}

impl TreeSource for SealedTree {
    type Handle = OpenFile;
    type Scratch = Scratch;

    fn attr(&self, ino: u64) -> Option<NodeAttr> {
        self.node(ino).map(|n| n.attr)
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<u64, i32> {
        let dir = self.node(parent).ok_or(libc::ENOENT)?;
        if dir.attr.kind != NodeKind::Dir {
            return Err(libc::ENOTDIR);
        }
        let i = dir
            .children
            .binary_search_by(|&c| self.nodes[c as usize].name.as_bytes().cmp(name))
            .map_err(|_| libc::ENOENT)?;
        Ok(dir.children[i] as u64 + ROOT_INODE)
    }

    fn parent(&self, ino: u64) -> Option<u64> {
        self.node(ino).map(|n| n.parent as u64 + ROOT_INODE)
    }

    fn dir_entry(&self, ino: u64, index: usize) -> Option<(std::borrow::Cow<'_, [u8]>, u64)> {
        let c = *self.node(ino)?.children.get(index)?;
        Some((
            std::borrow::Cow::Borrowed(self.nodes[c as usize].name.as_bytes()),
            c as u64 + ROOT_INODE,
        ))
    }

    fn read_link(&self, ino: u64) -> Result<Vec<u8>, i32> {
        let n = self.node(ino).ok_or(libc::ENOENT)?;
        match &self.manifest.entries[n.entry].kind {
            EntryKind::Symlink { target } => Ok(target.as_bytes().to_vec()),
            _ => Err(libc::EINVAL),
        }
    }

    fn open(&self, ino: u64) -> Result<OpenFile, i32> {
        let n = self.node(ino).ok_or(libc::ENOENT)?;
        let path = self.path_of(n);
        let data = self.open_beneath(path).map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ENOENT) => "it was removed after sealing".to_string(),
                Some(libc::ELOOP) | Some(libc::EXDEV) => {
                    "a symlink now stands where it was sealed".to_string()
                }
                _ => format!("cannot open it: {e}"),
            };
            self.changed(path, why)
        })?;
        let meta = data
            .metadata()
            .map_err(|e| self.changed(path, format!("cannot stat it: {e}")))?;
        if !meta.is_file() {
            return Err(self.changed(path, "it is no longer a regular file".into()));
        }
        if meta.len() != n.attr.size {
            return Err(self.changed(
                path,
                format!(
                    "its size changed after sealing ({} bytes sealed, {} now)",
                    n.attr.size,
                    meta.len()
                ),
            ));
        }
        let tid = self.store.tree_of[&n.entry];
        let t = &self.store.trees[tid as usize];
        let tree = if self.verify && t.geometry.levels() > 0 {
            Some(File::open(&t.path).map_err(|e| {
                self.log
                    .log(|| format!("{}: cannot open: {e}", t.path.display()));
                libc::EIO
            })?)
        } else {
            None
        };
        Ok(OpenFile {
            node: ino as u32 - ROOT_INODE as u32,
            data,
            tree,
        })
    }

    fn scratch(&self) -> Scratch {
        let bs = self.manifest.params.block_size as usize;
        Scratch {
            buf: vec![0u8; MAX_WRITE + 2 * bs],
            hashes: Vec::with_capacity((MAX_WRITE / bs + 2) * 64),
        }
    }

    fn read<'s>(
        &self,
        file: &OpenFile,
        offset: u64,
        size: usize,
        scratch: &'s mut Scratch,
    ) -> Result<&'s [u8], ReadFailure> {
        let n = &self.nodes[file.node as usize];
        let path = self.path_of(n);
        let fsize = n.attr.size;
        if offset >= fsize || size == 0 {
            return Ok(&[]);
        }
        let len = (size.min(MAX_WRITE) as u64).min(fsize - offset) as usize;
        if !self.verify {
            let buf = &mut scratch.buf[..len];
            self.read_fully(&file.data, buf, offset, path)
                .map_err(ReadFailure::Errno)?;
            return Ok(&scratch.buf[..len]);
        }
        // Whole blocks around the request, the last one zero-padded.
        let bs = self.manifest.params.block_size as u64;
        let first = offset / bs;
        let start = first * bs;
        let end = (offset + len as u64).div_ceil(bs) * bs;
        let in_file = (end.min(fsize) - start) as usize;
        let whole = (end - start) as usize;
        self.read_fully(&file.data, &mut scratch.buf[..in_file], start, path)
            .map_err(ReadFailure::Errno)?;
        scratch.buf[in_file..whole].fill(0);
        let tid = self.store.tree_of[&n.entry];
        let tree = &self.store.trees[tid as usize];
        let checked = self.verifier.check(
            tid,
            tree,
            file.tree.as_ref(),
            first,
            &scratch.buf[..whole],
            &mut scratch.hashes,
        );
        match checked {
            Ok(()) => {
                self.counters
                    .verified_blocks
                    .fetch_add(whole as u64 / bs, Ordering::Relaxed);
                let at = (offset - start) as usize;
                Ok(&scratch.buf[at..at + len])
            }
            Err(Failure::DataBlock(b)) => {
                self.counters
                    .corrupt_data_blocks
                    .fetch_add(1, Ordering::Relaxed);
                self.log.log(|| {
                    format!(
                        "{}/{path}: data block {b} (bytes {} to {}) does not match its Merkle tree: EIO",
                        self.root_path.display(),
                        b * bs,
                        ((b + 1) * bs).min(fsize) - 1
                    )
                });
                Err(ReadFailure::Corrupt)
            }
            Err(Failure::TreeBlock { level, index }) => {
                self.counters
                    .corrupt_tree_blocks
                    .fetch_add(1, Ordering::Relaxed);
                self.log.log(|| {
                    format!(
                        "{}: Merkle tree block {index} of level {level} (for {}/{path}) does not match the level above: EIO",
                        tree.path.display(),
                        self.root_path.display()
                    )
                });
                Err(ReadFailure::Corrupt)
            }
            Err(Failure::Io(e)) => {
                self.log
                    .log(|| format!("{}: cannot read: {e}", tree.path.display()));
                Err(ReadFailure::Errno(libc::EIO))
            }
        }
    }

    fn usage(&self) -> (u64, u64) {
        let bytes = self.manifest.files().map(|(_, _, s, _)| s).sum();
        (bytes, self.nodes.len() as u64)
    }
}

impl SealedTree {
    /// The directory served.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// The sidecar store.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }
}
