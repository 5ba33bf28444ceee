//! Our own EROFS reader: the superblock, compact and extended inodes, flat (plain and
//! inline-tail) and chunk-based data, directories and xattrs (inline and shared), each read
//! from a [`Source`] and range-checked, and compressed files: LZ4 extents with full or
//! compacted indexes, big pclusters, uncompressed (PLAIN) pclusters and ztailpacking (see
//! [`zmap`] and [`decompress`](mod@decompress)). LZMA and erofs-utils 1.6's interlaced and
//! fragment pclusters are refused per file with a clear error.
//!
//! Why our own: the crates on crates.io read through a memory map of a whole image file
//! (not through a verified block source) and stop at the flat layouts; the format's
//! uncompressed part is small (this file and [`format`](mod@format)).

pub mod decompress;
pub mod format;
#[cfg(test)]
mod tests;
pub mod zmap;

use super::{DirEntry, FileKind, FsReader, NodeId, ReadError, Result, Source, Stat};
use decompress::ExtentCache;
use format::{Inode, Layout, Superblock};
use std::sync::Arc;

/// Largest directory read (bytes): real directories of root images are far smaller, and a
/// chunk-based directory whose chunks all name one block cannot blow a walk up past this.
const MAX_DIR: u64 = 16 << 20;
/// Largest symlink target.
const MAX_LINK: u64 = 4096;

/// An EROFS file system read from a [`Source`].
pub struct Erofs {
    src: Source,
    sb: Superblock,
    extents: ExtentCache,
}

fn corrupt(nid: u64, what: impl std::fmt::Display) -> ReadError {
    ReadError::Corrupt(format!("inode {nid}: {what}"))
}

impl Erofs {
    /// Read and check the superblock.
    pub fn open(src: Source) -> Result<Erofs> {
        let mut b = [0u8; 128];
        src.read_exact_at(&mut b, format::SB_OFFSET)?;
        let sb = Superblock::parse(&b)?;
        let fs = Erofs {
            src,
            sb,
            extents: ExtentCache::default(),
        };
        let root = fs.inode(fs.sb.root_nid)?;
        if FileKind::from_mode(root.mode) != Some(FileKind::Dir) {
            return Err(ReadError::Corrupt(
                "the root inode is not a directory".into(),
            ));
        }
        Ok(fs)
    }

    /// The inode of node `nid`.
    pub fn inode(&self, nid: u64) -> Result<Inode> {
        let off = self
            .sb
            .inode_offset(nid)
            .filter(|&o| o < self.src.size())
            .ok_or_else(|| corrupt(nid, "node id points outside the file system"))?;
        let mut b = [0u8; 64];
        let n = (self.src.size() - off).min(64) as usize;
        self.src.read_exact_at(&mut b[..n], off)?;
        let i = Inode::parse(&self.sb, nid, off, &b)?;
        if (i.isize as usize) > n {
            return Err(corrupt(nid, "inode cut off by the end of the file system"));
        }
        Ok(i)
    }

    /// Where byte `pos` of inode `i`'s data lies on the device, and how many bytes from there
    /// are contiguous (None: a hole, reading as zeros, for that many bytes).
    fn map(&self, i: &Inode, pos: u64) -> Result<(Option<u64>, u64)> {
        let bs = self.sb.block_size();
        let left = i.size - pos;
        let block_at = |blk: u64, within: u64| {
            blk.checked_mul(bs)
                .and_then(|b| b.checked_add(within))
                .ok_or_else(|| corrupt(i.nid, "block address overflows"))
        };
        match i.layout {
            Layout::FlatPlain => Ok((Some(block_at(u64::from(i.raw), pos)?), left)),
            Layout::FlatInline => {
                let tail_start = (i.size.div_ceil(bs).max(1) - 1) * bs;
                if pos < tail_start {
                    Ok((Some(block_at(u64::from(i.raw), pos)?), tail_start - pos))
                } else {
                    let inline = i.tail_offset();
                    let tail_len = i.size - tail_start;
                    if inline % bs + tail_len > bs {
                        return Err(corrupt(i.nid, "inline tail crosses a block boundary"));
                    }
                    Ok((Some(inline + (pos - tail_start)), left))
                }
            }
            Layout::ChunkBased => {
                let fmt = i.raw;
                if fmt & !0x3f != 0 {
                    return Err(corrupt(i.nid, format!("unknown chunk format {fmt:#x}")));
                }
                let chunkbits = u32::from(self.sb.blkszbits) + (fmt & 0x1f);
                if chunkbits > 40 {
                    return Err(corrupt(i.nid, format!("chunk size 2^{chunkbits}")));
                }
                let chunk = 1u64 << chunkbits;
                let idx = pos >> chunkbits;
                let within = pos & (chunk - 1);
                let run = (chunk - within).min(left);
                let indexes = fmt & 0x20 != 0;
                let unit = if indexes { 8 } else { 4 };
                let table = i.tail_offset().next_multiple_of(unit);
                let mut e = [0u8; 8];
                self.src
                    .read_exact_at(&mut e[..unit as usize], table + idx * unit)?;
                let (device, blk) = if indexes {
                    (
                        u16::from_le_bytes([e[2], e[3]]),
                        u32::from_le_bytes(e[4..8].try_into().expect("4 bytes")),
                    )
                } else {
                    (0, u32::from_le_bytes(e[..4].try_into().expect("4 bytes")))
                };
                if blk == u32::MAX {
                    return Ok((None, run));
                }
                if device != 0 {
                    return Err(ReadError::Unsupported(format!(
                        "inode {}: data on extra EROFS device {device}",
                        i.nid
                    )));
                }
                Ok((Some(block_at(u64::from(blk), within)?), run))
            }
            Layout::CompressedFull | Layout::CompressedCompact => {
                unreachable!("compressed data is read by read_compressed")
            }
        }
    }

    /// Read `buf.len()` bytes of `i`'s data from `pos` (the caller keeps it within the size).
    fn read_data(&self, i: &Inode, mut pos: u64, buf: &mut [u8]) -> Result<()> {
        if i.compressed() {
            return self.read_compressed(i, pos, buf);
        }
        let mut done = 0;
        while done < buf.len() {
            let (at, run) = self.map(i, pos)?;
            let n = (run.min((buf.len() - done) as u64) as usize).max(1);
            let n = n.min(buf.len() - done);
            match at {
                Some(a) => self.src.read_exact_at(&mut buf[done..done + n], a)?,
                None => buf[done..done + n].fill(0),
            }
            done += n;
            pos += n as u64;
        }
        Ok(())
    }

    /// The decompressed extent of compressed inode `i` holding byte `pos`: its first byte and
    /// its bytes (from the cache when read lately).
    fn extent_at(&self, i: &Inode, pos: u64) -> Result<(u64, Arc<Vec<u8>>)> {
        if let Some(hit) = self.extents.find(i.nid, pos) {
            return Ok(hit);
        }
        let x = zmap::ZMap::new(&self.src, &self.sb, i)?.extent(pos)?;
        let data = Arc::new(decompress::extent(
            &self.src,
            self.sb.feature_incompat,
            self.sb.block_size(),
            i.nid,
            &x,
        )?);
        self.extents.insert(i.nid, x.la, data.clone());
        Ok((x.la, data))
    }

    /// [`Self::read_data`] of a compressed inode: extent by extent.
    fn read_compressed(&self, i: &Inode, mut pos: u64, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let (la, data) = self.extent_at(i, pos)?;
            let skip = (pos - la) as usize;
            let n = (data.len() - skip).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&data[skip..skip + n]);
            done += n;
            pos += n as u64;
        }
        Ok(())
    }

    fn data_vec(&self, i: &Inode, max: u64) -> Result<Vec<u8>> {
        if i.size > max {
            return Err(corrupt(
                i.nid,
                format!("size {} over the limit {max}", i.size),
            ));
        }
        let mut v = vec![0u8; i.size as usize];
        self.read_data(i, 0, &mut v)?;
        Ok(v)
    }

    /// One xattr entry at `off` (name length, index, value size, name, value): the full name,
    /// the value, and the entry's length rounded to 4.
    fn xattr_entry(&self, nid: u64, off: u64, limit: u64) -> Result<(Vec<u8>, Vec<u8>, u64)> {
        let mut h = [0u8; 4];
        self.src.read_exact_at(&mut h, off)?;
        let (nlen, index, vlen) = (
            u64::from(h[0]),
            h[1],
            u64::from(u16::from_le_bytes([h[2], h[3]])),
        );
        let total = (4 + nlen + vlen).next_multiple_of(4);
        if off + total > limit {
            return Err(corrupt(nid, "xattr entry runs past its area"));
        }
        let prefix: &[u8] = match index {
            0 => b"",
            1 => b"user.",
            2 => b"system.posix_acl_access",
            3 => b"system.posix_acl_default",
            4 => b"trusted.",
            5 => b"lustre.",
            6 => b"security.",
            i if i & 0x80 != 0 => {
                return Err(ReadError::Unsupported(format!(
                    "inode {nid}: long xattr name prefixes"
                )))
            }
            i => return Err(corrupt(nid, format!("unknown xattr name index {i}"))),
        };
        let nv = self.src.read_vec(off + 4, nlen + vlen, 4 + 255 + 65536)?;
        let mut name = prefix.to_vec();
        name.extend_from_slice(&nv[..nlen as usize]);
        Ok((name, nv[nlen as usize..].to_vec(), total))
    }
}

fn kind(i: &Inode) -> Result<FileKind> {
    FileKind::from_mode(i.mode)
        .ok_or_else(|| corrupt(i.nid, format!("mode {:o} has no file type", i.mode)))
}

impl FsReader for Erofs {
    fn fs_name(&self) -> &'static str {
        "erofs"
    }

    fn root(&self) -> NodeId {
        self.sb.root_nid
    }

    fn read_dir(&self, dir: NodeId) -> Result<Vec<DirEntry>> {
        let i = self.inode(dir)?;
        if kind(&i)? != FileKind::Dir {
            return Err(ReadError::NotDir);
        }
        if i.size > MAX_DIR {
            return Err(corrupt(dir, format!("directory of {} bytes", i.size)));
        }
        let bs = self.sb.block_size();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < i.size {
            let len = bs.min(i.size - pos);
            let mut b = vec![0u8; len as usize];
            self.read_data(&i, pos, &mut b)?;
            for (name, nid) in format::parse_dir_block(&b)? {
                if name != b"." && name != b".." {
                    out.push(DirEntry { name, node: nid });
                }
            }
            pos += len;
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn stat(&self, node: NodeId) -> Result<Stat> {
        let i = self.inode(node)?;
        let k = kind(&i)?;
        let rdev = if matches!(k, FileKind::Char | FileKind::Block) {
            // The kernel's new_encode_dev: minor's low byte, major, minor's high bits.
            let d = i.raw;
            let major = (d & 0xfff00) >> 8;
            let minor = (d & 0xff) | ((d >> 12) & 0xfff00);
            libc::makedev(major, minor)
        } else {
            0
        };
        Ok(Stat {
            ino: node,
            kind: k,
            perm: i.mode & 0o7777,
            uid: i.uid,
            gid: i.gid,
            size: if matches!(k, FileKind::File | FileKind::Dir | FileKind::Link) {
                i.size
            } else {
                0
            },
            mtime: i.mtime as i64,
            mtime_nsec: i.mtime_nsec,
            nlink: i.nlink,
            rdev,
        })
    }

    fn readlink(&self, node: NodeId) -> Result<Vec<u8>> {
        let i = self.inode(node)?;
        if kind(&i)? != FileKind::Link {
            return Err(ReadError::Unsupported("not a symlink".into()));
        }
        self.data_vec(&i, MAX_LINK)
    }

    fn read(&self, node: NodeId, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let i = self.inode(node)?;
        if kind(&i)? != FileKind::File {
            return Err(ReadError::Unsupported("not a regular file".into()));
        }
        if offset >= i.size {
            return Ok(0);
        }
        let n = (i.size - offset).min(buf.len() as u64) as usize;
        self.read_data(&i, offset, &mut buf[..n])?;
        Ok(n)
    }

    fn xattrs(&self, node: NodeId) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let i = self.inode(node)?;
        if i.xattr_isize == 0 {
            return Ok(Vec::new());
        }
        let start = i.offset + i.isize;
        let end = start + i.xattr_isize;
        let mut h = [0u8; 12];
        self.src.read_exact_at(&mut h, start)?;
        let shared = u64::from(h[4]);
        if 12 + shared * 4 > i.xattr_isize {
            return Err(corrupt(
                node,
                "more shared xattrs than the xattr area holds",
            ));
        }
        let mut out = Vec::new();
        let ids = self.src.read_vec(start + 12, shared * 4, 1024)?;
        let base = u64::from(self.sb.xattr_blkaddr) * self.sb.block_size();
        for id in ids.chunks_exact(4) {
            let id = u64::from(u32::from_le_bytes(id.try_into().expect("4 bytes")));
            let off = base + id * 4;
            let (n, v, _) = self.xattr_entry(node, off, self.src.size())?;
            out.push((n, v));
        }
        let mut off = start + 12 + shared * 4;
        while off + 4 <= end {
            let (n, v, len) = self.xattr_entry(node, off, end)?;
            out.push((n, v));
            off += len;
        }
        Ok(out)
    }
}
