//! Userspace readers of the read-only file systems `image build` makes (SquashFS, EROFS,
//! ext4), for the rootless image commands (`image ls|cat|copy-from|mtree|validate`): no mount,
//! no loop device. Every byte they read comes from a [`Source`], which for an image is the
//! verity volume's verified data path ([`verified`]): a block that does not match the tree
//! fails the one read that touches it, so only the file holding it fails.
//!
//! - [`FsReader`]: the one interface the commands use (lookup, directory listing, stat,
//!   readlink, ranged reads, xattrs) over node numbers;
//! - [`squashfs`] (the backhand crate), [`ext4`] (the ext4-view crate), [`erofs`] (our own);
//! - [`source`]: the byte source with a small block cache; [`verified`]: opening an image
//!   through dm-verity; [`walk`]: the commands' logic (tree walk, mtree, copy, validate).

pub mod erofs;
pub mod ext4;
pub mod source;
pub mod squashfs;
pub mod validate;
pub mod verified;
pub mod walk;

pub use source::Source;

/// A node of a file system: an inode number of the reader's choosing (stable while the reader
/// lives; equal for hard links where the file system records them).
pub type NodeId = u64;

/// Why a read failed, one line naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A block could not be read (a verity mismatch, I/O).
    #[error("{0}")]
    Io(String),
    /// The file system's metadata is inconsistent or out of range.
    #[error("corrupt file system: {0}")]
    Corrupt(String),
    /// A feature this reader does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// No such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// A directory was expected.
    #[error("not a directory")]
    NotDir,
    /// Writing what was read failed (the destination, not the image).
    #[error("{0}")]
    Write(String),
}

/// Result of reader calls.
pub type Result<T> = std::result::Result<T, ReadError>;

/// What kind of file a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Link,
    /// A character device.
    Char,
    /// A block device.
    Block,
    /// A named pipe.
    Fifo,
    /// A socket.
    Socket,
}

impl FileKind {
    /// The kind from the `S_IFMT` bits of `mode`.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & 0o170000 {
            0o100000 => FileKind::File,
            0o040000 => FileKind::Dir,
            0o120000 => FileKind::Link,
            0o020000 => FileKind::Char,
            0o060000 => FileKind::Block,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => 0o100000,
            FileKind::Dir => 0o040000,
            FileKind::Link => 0o120000,
            FileKind::Char => 0o020000,
            FileKind::Block => 0o060000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
        }
    }
}

/// What `stat` tells of a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stat {
    /// The node.
    pub ino: NodeId,
    /// Its kind.
    pub kind: FileKind,
    /// Permission bits (07777).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (a symlink: its target's length).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Nanoseconds of the modification time.
    pub mtime_nsec: u32,
    /// Hard links, where the file system records them (else 1, 2 for directories).
    pub nlink: u32,
    /// Device number of a device node (`major << 8 | minor` in the kernel's old encoding
    /// is not used: this is `makedev(major, minor)` as glibc encodes it).
    pub rdev: u64,
}

impl Stat {
    /// The full mode (type and permission bits).
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm
    }

    /// The device's major and minor numbers.
    pub fn rdev_parts(&self) -> (u32, u32) {
        (libc::major(self.rdev), libc::minor(self.rdev))
    }
}

/// One directory entry ("." and ".." are never listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name (any bytes but `/` and NUL).
    pub name: Vec<u8>,
    /// The node it names.
    pub node: NodeId,
}

/// A read-only file system, read in userspace.
pub trait FsReader {
    /// The file system's name (`squashfs`, `erofs`, `ext4`).
    fn fs_name(&self) -> &'static str;
    /// The root directory.
    fn root(&self) -> NodeId;
    /// The entries of directory `dir`, sorted by name, without "." and "..".
    fn read_dir(&self, dir: NodeId) -> Result<Vec<DirEntry>>;
    /// The node's attributes.
    fn stat(&self, node: NodeId) -> Result<Stat>;
    /// A symlink's target.
    fn readlink(&self, node: NodeId) -> Result<Vec<u8>>;
    /// Read up to `buf.len()` bytes of a regular file from `offset`; returns the count (0 at
    /// the end).
    fn read(&self, node: NodeId, offset: u64, buf: &mut [u8]) -> Result<usize>;
    /// The node's extended attributes (full names with their prefix, values).
    fn xattrs(&self, node: NodeId) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Stream the whole regular file `node` into `w`; returns the bytes written. Readers
    /// whose files are streams (SquashFS blocks) override it to read once from the start.
    fn copy_to(&self, node: NodeId, w: &mut dyn std::io::Write) -> Result<u64> {
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = self.read(node, off, &mut buf)?;
            if n == 0 {
                return Ok(off);
            }
            w.write_all(&buf[..n])
                .map_err(|e| ReadError::Write(e.to_string()))?;
            off += n as u64;
        }
    }

    /// The entry `name` of directory `dir`.
    fn lookup(&self, dir: NodeId, name: &[u8]) -> Result<Option<NodeId>> {
        Ok(self
            .read_dir(dir)?
            .into_iter()
            .find(|e| e.name == name)
            .map(|e| e.node))
    }
}

/// The node at `path` (absolute or relative to the root; `.` and empty components skipped,
/// `..` refused, symlinks not followed).
pub fn resolve(fs: &dyn FsReader, path: &str) -> Result<NodeId> {
    let mut node = fs.root();
    for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if comp == ".." {
            return Err(ReadError::Unsupported(
                "`..` in an image path (give the path from the image's root)".into(),
            ));
        }
        if fs.stat(node)?.kind != FileKind::Dir {
            return Err(ReadError::NotDir);
        }
        node = fs
            .lookup(node, comp.as_bytes())?
            .ok_or(ReadError::NotFound)?;
    }
    Ok(node)
}

/// Open the reader for `kind` over `src`.
pub fn open_reader(kind: crate::image::mkfs::FsKind, src: Source) -> Result<Box<dyn FsReader>> {
    use crate::image::mkfs::FsKind;
    Ok(match kind {
        FsKind::Squashfs => Box::new(squashfs::SquashfsReader::open(src)?),
        FsKind::Erofs => Box::new(erofs::Erofs::open(src)?),
        FsKind::Ext4 => Box::new(ext4::Ext4Reader::open(src)?),
    })
}
