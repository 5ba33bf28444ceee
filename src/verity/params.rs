//! dm-verity parameters and the hash tree geometry they imply, computed exactly as
//! veritysetup (lib/verity/verity_hash.c) and the kernel (dm-verity-target.c) do.

use super::superblock::{valid_block_size, Superblock, MAX_SALT_SIZE, SUPERBLOCK_SIZE};
use crate::hash::HashAlgorithm;

/// The deepest tree veritysetup builds.
pub const MAX_LEVELS: usize = 63;

/// Everything that determines a dm-verity hash tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityParams {
    /// Hash algorithm.
    pub hash: HashAlgorithm,
    /// 0 (Chrome OS: digest of data || salt, packed digests) or 1 (digest of salt || data,
    /// digests padded to a power of two).
    pub hash_type: u32,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Number of data blocks covered.
    pub data_blocks: u64,
    /// Byte offset of the hash area (superblock first, if any) in the hash device.
    pub hash_offset: u64,
    /// Salt (0..=256 bytes).
    pub salt: Vec<u8>,
    /// UUID stored in the superblock.
    pub uuid: [u8; 16],
    /// Whether a superblock precedes the tree.
    pub superblock: bool,
}

/// A parameter combination that cannot describe a tree; names the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// Block size not a power of two in 512..=65536.
    #[error("{option}: invalid block size {value} (a power of two from 512 to 65536)")]
    BlockSize {
        /// Option name.
        option: &'static str,
        /// Value.
        value: u32,
    },
    /// Hash type other than 0 or 1.
    #[error("--format: unsupported hash type {0} (0 or 1)")]
    HashType(u32),
    /// Salt longer than 256 bytes.
    #[error("--salt: {0} bytes is longer than 256")]
    SaltSize(usize),
    /// No data blocks.
    #[error("--data-blocks: the data device holds no complete {0}-byte block")]
    NoData(u32),
    /// Hash offset not 512-byte aligned.
    #[error("--hash-offset: {0} is not a multiple of 512")]
    HashOffset(u64),
    /// The hash area would start or end beyond the largest 64-bit byte offset.
    #[error("--hash-offset: {0} is too large: the hash area would end beyond 2^64 bytes")]
    HashOffsetTooLarge(u64),
    /// The tree would not fit in 64-bit block numbers or has too many levels.
    #[error("--data-blocks: hash area overflow ({0} blocks)")]
    Overflow(u64),
}

impl VerityParams {
    /// Check the parameters on their own (not against any device).
    pub fn validate(&self) -> Result<(), ParamsError> {
        if !valid_block_size(self.data_block_size) {
            return Err(ParamsError::BlockSize {
                option: "--data-block-size",
                value: self.data_block_size,
            });
        }
        if !valid_block_size(self.hash_block_size) {
            return Err(ParamsError::BlockSize {
                option: "--hash-block-size",
                value: self.hash_block_size,
            });
        }
        if self.hash_type > 1 {
            return Err(ParamsError::HashType(self.hash_type));
        }
        if self.salt.len() > MAX_SALT_SIZE {
            return Err(ParamsError::SaltSize(self.salt.len()));
        }
        if self.data_blocks == 0 {
            return Err(ParamsError::NoData(self.data_block_size));
        }
        if !self.hash_offset.is_multiple_of(512) {
            return Err(ParamsError::HashOffset(self.hash_offset));
        }
        self.data_blocks
            .checked_mul(self.data_block_size as u64)
            .ok_or(ParamsError::Overflow(self.data_blocks))?;
        TreeLayout::new(self).map(|_| ())
    }

    /// The superblock describing these parameters.
    pub fn to_superblock(&self) -> Superblock {
        Superblock {
            hash_type: self.hash_type,
            uuid: self.uuid,
            algorithm: self.hash,
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks,
            salt: self.salt.clone(),
        }
    }

    /// Parameters from a superblock found at `hash_offset`.
    pub fn from_superblock(sb: &Superblock, hash_offset: u64) -> Self {
        VerityParams {
            hash: sb.algorithm,
            hash_type: sb.hash_type,
            data_block_size: sb.data_block_size,
            hash_block_size: sb.hash_block_size,
            data_blocks: sb.data_blocks,
            hash_offset,
            salt: sb.salt.clone(),
            uuid: sb.uuid,
            superblock: true,
        }
    }

    /// Bytes of data covered by the tree.
    pub fn data_size(&self) -> u64 {
        self.data_blocks * self.data_block_size as u64
    }

    /// The (prefix, suffix) wrapped around each block before hashing.
    pub fn salt_parts(&self) -> (&[u8], &[u8]) {
        if self.hash_type == 1 {
            (&self.salt, &[])
        } else {
            (&[], &self.salt)
        }
    }
}

/// Where each level of the tree lives. Level 0 holds the digests of data blocks; the top
/// level is a single block whose digest is the root hash. Levels are stored top first, as
/// veritysetup writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLayout {
    /// Digest size in bytes.
    pub digest_size: usize,
    /// Bytes each digest occupies in a hash block (padded to a power of two for hash type 1).
    pub entry_size: usize,
    /// log2 of the number of digests per hash block.
    pub hashes_per_block_bits: u32,
    /// First hash block (absolute, in hash-block units from the start of the hash device) of
    /// each level, index 0 = the level of data digests.
    pub level_start: Vec<u64>,
    /// Number of hash blocks in each level.
    pub level_blocks: Vec<u64>,
    /// First hash block of the tree (after the superblock, if any).
    pub tree_start: u64,
    /// One past the last hash block of the tree.
    pub tree_end: u64,
    /// Hash block size in bytes.
    pub hash_block_size: u64,
    /// One past the superblock's last byte (0 without a superblock).
    pub superblock_end: u64,
}

impl TreeLayout {
    /// The geometry of the tree for `p`.
    pub fn new(p: &VerityParams) -> Result<Self, ParamsError> {
        let hbs = p.hash_block_size as u64;
        let digest_size = p.hash.digest_size();
        // veritysetup: hash_per_block = 1 << get_bits_down(hash_block_size / digest_size).
        let per_block = hbs / digest_size as u64;
        if per_block < 2 {
            return Err(ParamsError::BlockSize {
                option: "--hash-block-size",
                value: p.hash_block_size,
            });
        }
        let bits = 63 - per_block.leading_zeros();
        let entry_size = if p.hash_type == 0 {
            digest_size
        } else {
            digest_size.next_power_of_two()
        };
        let tree_start = if p.superblock {
            p.hash_offset
                .checked_add(SUPERBLOCK_SIZE as u64)
                .ok_or(ParamsError::HashOffsetTooLarge(p.hash_offset))?
                .div_ceil(hbs)
        } else {
            p.hash_offset / hbs
        };
        let mut levels = 0usize;
        while (bits as usize * levels) < 64
            && ((p.data_blocks - 1) >> (bits as usize * levels)) != 0
        {
            levels += 1;
        }
        if levels > MAX_LEVELS {
            return Err(ParamsError::Overflow(p.data_blocks));
        }
        let mut level_start = vec![0u64; levels];
        let mut level_blocks = vec![0u64; levels];
        let mut pos = tree_start;
        for i in (0..levels).rev() {
            level_start[i] = pos;
            let shift = (i as u32 + 1) * bits;
            if shift > 63 {
                return Err(ParamsError::Overflow(p.data_blocks));
            }
            let n = p
                .data_blocks
                .checked_add((1u64 << shift) - 1)
                .ok_or(ParamsError::Overflow(p.data_blocks))?
                >> shift;
            level_blocks[i] = n;
            pos = pos
                .checked_add(n)
                .ok_or(ParamsError::Overflow(p.data_blocks))?;
        }
        // The tree alone must fit in 64-bit byte offsets; then so must the tree placed after
        // the hash offset.
        (pos - tree_start)
            .checked_mul(hbs)
            .ok_or(ParamsError::Overflow(p.data_blocks))?;
        pos.checked_mul(hbs)
            .ok_or(ParamsError::HashOffsetTooLarge(p.hash_offset))?;
        Ok(TreeLayout {
            digest_size,
            entry_size,
            hashes_per_block_bits: bits,
            level_start,
            level_blocks,
            tree_start,
            tree_end: pos,
            hash_block_size: hbs,
            superblock_end: if p.superblock {
                p.hash_offset + SUPERBLOCK_SIZE as u64
            } else {
                0
            },
        })
    }

    /// Number of levels (0 when there is a single data block: the root is its digest).
    pub fn levels(&self) -> usize {
        self.level_start.len()
    }

    /// Digests per hash block.
    pub fn hashes_per_block(&self) -> u64 {
        1 << self.hashes_per_block_bits
    }

    /// The end of the hash area as veritysetup reports it ("Hash device size").
    pub fn hash_device_size(&self) -> u64 {
        self.tree_end * self.hash_block_size
    }

    /// Bytes the hash device must hold: the tree, and the superblock. A single data block has
    /// no tree (its digest is the root), so then only the superblock is needed.
    pub fn required_hash_size(&self) -> u64 {
        let tree = if self.levels() > 0 {
            self.hash_device_size()
        } else {
            0
        };
        tree.max(self.superblock_end)
    }

    /// The size veritysetup leaves a new hash file at: the tree, or the superblock written as
    /// one whole block of min(4096, hash block size) bytes (its read-modify-write unit for a
    /// file), whichever ends later.
    pub fn new_file_size(&self) -> u64 {
        let unit = self.hash_block_size.min(4096);
        let sb = self.superblock_end.div_ceil(unit) * unit;
        self.required_hash_size().max(sb)
    }

    /// Number of hash blocks in the tree.
    pub fn tree_blocks(&self) -> u64 {
        self.tree_end - self.tree_start
    }

    /// The hash block (absolute) holding the digest of item `index` of level `level - 1`
    /// (data blocks for `level == 0`), and the byte offset of that digest inside it.
    pub fn locate(&self, level: usize, index: u64) -> (u64, usize) {
        let block = self.level_start[level] + (index >> self.hashes_per_block_bits);
        let slot = (index & (self.hashes_per_block() - 1)) as usize;
        (block, slot * self.entry_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(blocks: u64, hbs: u32, hash: HashAlgorithm, sb: bool) -> VerityParams {
        VerityParams {
            hash,
            hash_type: 1,
            data_block_size: 4096,
            hash_block_size: hbs,
            data_blocks: blocks,
            hash_offset: 0,
            salt: vec![],
            uuid: [0; 16],
            superblock: sb,
        }
    }

    #[test]
    fn geometry_matches_veritysetup() {
        // 2048 blocks of sha256 in 4 KiB hash blocks: 16 level-0 blocks, 1 top block.
        let l = TreeLayout::new(&params(2048, 4096, HashAlgorithm::Sha256, true)).unwrap();
        assert_eq!(l.levels(), 2);
        assert_eq!(l.tree_start, 1);
        assert_eq!(l.level_start, vec![2, 1]);
        assert_eq!(l.level_blocks, vec![16, 1]);
        assert_eq!(l.tree_end, 18);
        // One data block: no levels, the root is the block's digest.
        let l = TreeLayout::new(&params(1, 4096, HashAlgorithm::Sha256, false)).unwrap();
        assert_eq!(l.levels(), 0);
        // sha1 pads entries to 32 bytes in hash type 1; sha512 gets 64 per 4 KiB block.
        let l = TreeLayout::new(&params(129, 4096, HashAlgorithm::Sha1, false)).unwrap();
        assert_eq!((l.entry_size, l.hashes_per_block()), (32, 128));
        assert_eq!(l.level_blocks, vec![2, 1]);
        let l = TreeLayout::new(&params(65, 4096, HashAlgorithm::Sha512, false)).unwrap();
        assert_eq!((l.entry_size, l.hashes_per_block()), (64, 64));
        // A single data block has no tree: veritysetup writes only the superblock, as one
        // block of min(4096, hash block size) bytes, but reports the area up to tree_start.
        let l = TreeLayout::new(&params(1, 8192, HashAlgorithm::Sha256, true)).unwrap();
        assert_eq!(l.hash_device_size(), 8192);
        assert_eq!((l.required_hash_size(), l.new_file_size()), (512, 4096));
        let l = TreeLayout::new(&params(1, 512, HashAlgorithm::Sha256, false)).unwrap();
        assert_eq!((l.required_hash_size(), l.new_file_size()), (0, 0));
        // Superblock with 512-byte hash blocks takes exactly one block.
        let l = TreeLayout::new(&params(10, 512, HashAlgorithm::Sha256, true)).unwrap();
        assert_eq!(l.tree_start, 1);
    }

    #[test]
    fn rejects_bad_params() {
        let mut p = params(10, 4096, HashAlgorithm::Sha256, true);
        p.data_block_size = 1000;
        assert!(p.validate().is_err());
        let mut p = params(10, 4096, HashAlgorithm::Sha256, true);
        p.salt = vec![0; 257];
        assert_eq!(p.validate(), Err(ParamsError::SaltSize(257)));
        let p = params(0, 4096, HashAlgorithm::Sha256, true);
        assert!(p.validate().is_err());
        let p = params(u64::MAX / 2, 4096, HashAlgorithm::Sha256, true);
        assert!(p.validate().is_err());
        // A hash offset at the very end of the 64-bit range is refused, not overflowed.
        let mut p = params(10, 4096, HashAlgorithm::Sha256, true);
        p.hash_offset = !511;
        assert_eq!(
            p.validate(),
            Err(ParamsError::HashOffsetTooLarge(p.hash_offset))
        );
        p.superblock = false;
        assert_eq!(
            p.validate(),
            Err(ParamsError::HashOffsetTooLarge(p.hash_offset))
        );
    }
}
