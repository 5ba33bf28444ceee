//! ext4 through the ext4-view crate: it reads through a caller-given `Ext4Read` (here the
//! verified [`Source`]), checks metadata checksums, and replays the journal in memory.
//!
//! ext4-view addresses files by path and does not expose inode numbers, link counts, device
//! numbers or xattrs: node ids here are interned paths, hard links read as separate files with
//! the same contents (nlink 1), device nodes have no numbers (0,0), and no xattrs are listed.

use super::{DirEntry, FileKind, FsReader, NodeId, ReadError, Result, Source, Stat};
use ext4_view::{Ext4, Ext4Error, Ext4Read, FileType};
use std::cell::RefCell;
use std::collections::HashMap;

/// `Ext4Read` over a [`Source`].
struct Reader(Source);

impl Ext4Read for Reader {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        self.0
            .read_exact_at(dst, start_byte)
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
    }
}

/// Paths by node id, and node ids by path.
type Interned = (Vec<Vec<u8>>, HashMap<Vec<u8>, NodeId>);

/// An ext4 file system read with ext4-view.
pub struct Ext4Reader {
    fs: Ext4,
    /// Node id → absolute path (bytes), and back.
    paths: RefCell<Interned>,
}

fn ext4_err(e: Ext4Error) -> ReadError {
    match e {
        Ext4Error::NotFound => ReadError::NotFound,
        Ext4Error::NotADirectory => ReadError::NotDir,
        Ext4Error::Io(e) => ReadError::Io(e.to_string()),
        e => ReadError::Corrupt(e.to_string()),
    }
}

impl Ext4Reader {
    /// Read the superblock, group descriptors and journal.
    pub fn open(src: Source) -> Result<Ext4Reader> {
        let fs = Ext4::load(Box::new(Reader(src))).map_err(ext4_err)?;
        let mut index = HashMap::new();
        index.insert(b"/".to_vec(), 0);
        Ok(Ext4Reader {
            fs,
            paths: RefCell::new((vec![b"/".to_vec()], index)),
        })
    }

    fn path(&self, node: NodeId) -> Result<ext4_view::PathBuf> {
        let p = self.paths.borrow();
        let bytes =
            p.0.get(node as usize)
                .ok_or_else(|| ReadError::Corrupt(format!("no node {node}")))?;
        ext4_view::PathBuf::try_from(bytes.as_slice())
            .map_err(|e| ReadError::Corrupt(e.to_string()))
    }

    fn intern(&self, path: Vec<u8>) -> NodeId {
        let mut p = self.paths.borrow_mut();
        if let Some(&n) = p.1.get(&path) {
            return n;
        }
        let n = p.0.len() as NodeId;
        p.0.push(path.clone());
        p.1.insert(path, n);
        n
    }
}

impl FsReader for Ext4Reader {
    fn fs_name(&self) -> &'static str {
        "ext4"
    }

    fn root(&self) -> NodeId {
        0
    }

    fn read_dir(&self, dir: NodeId) -> Result<Vec<DirEntry>> {
        let path = self.path(dir)?;
        let mut out = Vec::new();
        for e in self.fs.read_dir(&path).map_err(ext4_err)? {
            let e = e.map_err(ext4_err)?;
            let name = e.file_name().as_ref().to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            let node = self.intern(e.path().as_ref().to_vec());
            out.push(DirEntry { name, node });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn stat(&self, node: NodeId) -> Result<Stat> {
        let m = self
            .fs
            .symlink_metadata(&self.path(node)?)
            .map_err(ext4_err)?;
        let kind = match m.file_type() {
            FileType::BlockDevice => FileKind::Block,
            FileType::CharacterDevice => FileKind::Char,
            FileType::Directory => FileKind::Dir,
            FileType::Fifo => FileKind::Fifo,
            FileType::Regular => FileKind::File,
            FileType::Socket => FileKind::Socket,
            FileType::Symlink => FileKind::Link,
        };
        let t = m.modified();
        Ok(Stat {
            ino: node,
            kind,
            perm: u32::from(m.mode()) & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            size: if matches!(kind, FileKind::File | FileKind::Dir | FileKind::Link) {
                m.len()
            } else {
                0
            },
            mtime: t.seconds(),
            mtime_nsec: t.nanoseconds(),
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            rdev: 0,
        })
    }

    fn readlink(&self, node: NodeId) -> Result<Vec<u8>> {
        let t = self.fs.read_link(&self.path(node)?).map_err(ext4_err)?;
        Ok(t.as_ref().to_vec())
    }

    fn read(&self, node: NodeId, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut f = self.fs.open(&self.path(node)?).map_err(ext4_err)?;
        if offset >= f.metadata().len() {
            return Ok(0);
        }
        f.seek_to(offset).map_err(ext4_err)?;
        let mut done = 0;
        while done < buf.len() {
            let n = f.read_bytes(&mut buf[done..]).map_err(ext4_err)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    fn xattrs(&self, _node: NodeId) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(Vec::new())
    }
}
