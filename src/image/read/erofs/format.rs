//! EROFS on-disk structures (the kernel's `fs/erofs/erofs_fs.h`): the superblock at byte 1024,
//! compact (32-byte) and extended (64-byte) inodes addressed by node id (`meta_blkaddr *
//! block size + nid * 32`), and the data layouts. Every field is parsed from untrusted bytes
//! and range-checked where it is used.

use super::super::{ReadError, Result};

/// The superblock's magic number.
pub const MAGIC: u32 = 0xE0F5_E1E2;
/// Where the superblock starts.
pub const SB_OFFSET: u64 = 1024;
/// Incompatible features known to exist (zero padding, compression configurations and big
/// pclusters, chunked files, device table and head2, ztailpacking, fragments and dedupe,
/// long xattr prefixes): all are used per inode, so an image with them opens and only a file
/// using a layout this reader lacks (compressed data, an extra device, a long xattr prefix)
/// fails, by name. Unknown bits refuse the image.
const KNOWN_INCOMPAT: u32 = 0x0000_007f;

/// Data layouts (`i_format >> 1 & 7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Blocks from `raw_blkaddr`, contiguous.
    FlatPlain,
    /// Compressed, full (legacy) cluster indexes.
    CompressedFull,
    /// Blocks from `raw_blkaddr`, the last partial block inline after the inode.
    FlatInline,
    /// Compressed, compact cluster indexes.
    CompressedCompact,
    /// Chunk table after the inode.
    ChunkBased,
}

/// The superblock's fields a reader needs.
#[derive(Debug, Clone)]
pub struct Superblock {
    /// log2 of the block size.
    pub blkszbits: u8,
    /// The root directory's node id.
    pub root_nid: u64,
    /// Build time: compact inodes' mtime.
    pub build_time: u64,
    /// Nanoseconds of it.
    pub build_time_nsec: u32,
    /// Start block of the inodes.
    pub meta_blkaddr: u32,
    /// Start block of shared xattrs.
    pub xattr_blkaddr: u32,
    /// Incompatible feature flags.
    pub feature_incompat: u32,
    /// Long xattr name prefixes: count and where their table is (in the packed inode or
    /// metadata), not supported; names using them fail.
    pub xattr_prefix_count: u8,
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

impl Superblock {
    /// Parse the 128 bytes at [`SB_OFFSET`].
    pub fn parse(b: &[u8; 128]) -> Result<Superblock> {
        if le32(b, 0) != MAGIC {
            return Err(ReadError::Corrupt("no EROFS magic at byte 1024".into()));
        }
        let blkszbits = b[12];
        if !(9..=16).contains(&blkszbits) {
            return Err(ReadError::Corrupt(format!(
                "block size 2^{blkszbits} out of range"
            )));
        }
        let feature_incompat = le32(b, 80);
        if feature_incompat & !KNOWN_INCOMPAT != 0 {
            return Err(ReadError::Unsupported(format!(
                "EROFS incompatible features {:#x}",
                feature_incompat & !KNOWN_INCOMPAT
            )));
        }
        Ok(Superblock {
            blkszbits,
            root_nid: u64::from(le16(b, 14)),
            build_time: le64(b, 24),
            build_time_nsec: le32(b, 32),
            meta_blkaddr: le32(b, 40),
            xattr_blkaddr: le32(b, 44),
            feature_incompat,
            xattr_prefix_count: b[91],
        })
    }

    /// The block size.
    pub fn block_size(&self) -> u64 {
        1 << self.blkszbits
    }

    /// Where node `nid`'s inode starts.
    pub fn inode_offset(&self, nid: u64) -> Option<u64> {
        u64::from(self.meta_blkaddr)
            .checked_mul(self.block_size())?
            .checked_add(nid.checked_mul(32)?)
    }
}

/// An inode's fields.
#[derive(Debug, Clone)]
pub struct Inode {
    /// The node id.
    pub nid: u64,
    /// Where the inode starts.
    pub offset: u64,
    /// 32 (compact) or 64 (extended).
    pub isize: u64,
    /// The data layout.
    pub layout: Layout,
    /// Size of the inline xattr area in bytes (0 if none).
    pub xattr_isize: u64,
    /// Mode (type and permissions).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Size of the data.
    pub size: u64,
    /// The layout-dependent word: start block, device number, chunk format.
    pub raw: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time.
    pub mtime: u64,
    /// Its nanoseconds.
    pub mtime_nsec: u32,
}

impl Inode {
    /// Parse the inode at `offset` from `b` (64 bytes, or 32 with a compact inode at the end
    /// of the file system: the caller pads with zeros).
    pub fn parse(sb: &Superblock, nid: u64, offset: u64, b: &[u8; 64]) -> Result<Inode> {
        let format = le16(b, 0);
        let extended = format & 1 == 1;
        let layout = match (format >> 1) & 7 {
            0 => Layout::FlatPlain,
            1 => Layout::CompressedFull,
            2 => Layout::FlatInline,
            3 => Layout::CompressedCompact,
            4 => Layout::ChunkBased,
            l => {
                return Err(ReadError::Corrupt(format!(
                    "inode {nid}: unknown data layout {l}"
                )))
            }
        };
        let icount = u64::from(le16(b, 2));
        let xattr_isize = if icount == 0 {
            0
        } else {
            12 + (icount - 1) * 4
        };
        let mode = u32::from(le16(b, 4));
        let i = if extended {
            Inode {
                nid,
                offset,
                isize: 64,
                layout,
                xattr_isize,
                mode,
                nlink: le32(b, 44),
                size: le64(b, 8),
                raw: le32(b, 16),
                uid: le32(b, 24),
                gid: le32(b, 28),
                mtime: le64(b, 32),
                mtime_nsec: le32(b, 40),
            }
        } else {
            Inode {
                nid,
                offset,
                isize: 32,
                layout,
                xattr_isize,
                mode,
                nlink: u32::from(le16(b, 6)),
                size: u64::from(le32(b, 8)),
                raw: le32(b, 16),
                uid: u32::from(le16(b, 24)),
                gid: u32::from(le16(b, 26)),
                mtime: sb.build_time,
                mtime_nsec: sb.build_time_nsec,
            }
        };
        Ok(i)
    }

    /// Where the data after the inode and its xattrs starts (inline tail, chunk table).
    pub fn tail_offset(&self) -> u64 {
        self.offset + self.isize + self.xattr_isize
    }

    /// Whether the data is compressed.
    pub fn compressed(&self) -> bool {
        matches!(
            self.layout,
            Layout::CompressedFull | Layout::CompressedCompact
        )
    }
}

/// One directory entry of a directory block: node id, name offset, file type.
pub const DIRENT_SIZE: usize = 12;

/// The entries of one directory block `b` (the block's bytes within the directory's size):
/// (name, nid). Names run from their offset to the next entry's, or to the block's end,
/// cut at the first NUL.
pub fn parse_dir_block(b: &[u8]) -> Result<Vec<(Vec<u8>, u64)>> {
    if b.len() < DIRENT_SIZE {
        return Err(ReadError::Corrupt(format!(
            "directory block of {} bytes holds no entry",
            b.len()
        )));
    }
    let first = usize::from(le16(b, 8));
    if first < DIRENT_SIZE || first % DIRENT_SIZE != 0 || first > b.len() {
        return Err(ReadError::Corrupt(format!(
            "directory block: first name offset {first} is not after the entries"
        )));
    }
    let n = first / DIRENT_SIZE;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let e = i * DIRENT_SIZE;
        let nid = le64(b, e);
        let start = usize::from(le16(b, e + 8));
        let end = if i + 1 < n {
            usize::from(le16(b, e + DIRENT_SIZE + 8))
        } else {
            b.len()
        };
        if start < first || start > end || end > b.len() {
            return Err(ReadError::Corrupt(format!(
                "directory entry {i}: name bytes {start}..{end} out of order or out of the block"
            )));
        }
        let mut name = &b[start..end];
        if let Some(z) = name.iter().position(|&c| c == 0) {
            name = &name[..z];
        }
        if name.is_empty() || name.len() > 255 || name.contains(&b'/') {
            return Err(ReadError::Corrupt(format!(
                "directory entry {i}: invalid name of {} bytes",
                name.len()
            )));
        }
        out.push((name.to_vec(), nid));
    }
    Ok(out)
}
