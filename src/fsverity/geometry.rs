//! The shape of an fs-verity Merkle tree: how many levels, how many blocks each, and where
//! each level sits in the tree as the kernel stores it (`FS_IOC_READ_VERITY_METADATA`) and as
//! `fsverity digest --out-merkle-tree` writes it.
//!
//! Level 0 holds the hashes of the data blocks; level `k + 1` holds the hashes of level `k`'s
//! blocks; the top level is a single block whose hash is the root hash. A block holds
//! `block_size / digest_size` hashes, packed from its start, the rest zero. The stored tree puts
//! the top level first and level 0 last. A file of at most one block has no tree at all (its
//! root hash is the hash of its only block, or all zero when it is empty).

use super::digest::FsVerityParams;
use super::FsVerityError;

/// Where a Merkle tree's levels are, for one file size and one set of parameters.
///
/// All arithmetic is checked: every `u64` file size gives a geometry (fs-verity's smallest
/// block, 1024 bytes, and largest hash, 64 bytes, keep the tree of a 2^64-byte file below
/// 2^61 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeGeometry {
    data_size: u64,
    block_size: u64,
    digest_size: usize,
    /// log2 of the hashes per block (block and digest sizes are powers of two).
    hash_bits: u32,
    data_blocks: u64,
    /// Blocks of each level, index 0 = level 0.
    level_blocks: Vec<u64>,
    /// Byte offset of each level in the stored tree, index 0 = level 0.
    level_offsets: Vec<u64>,
    tree_size: u64,
}

/// Where the hash of one block (a data block, or a tree block of the level below) is stored
/// at one level of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashPosition {
    /// The level holding the hash.
    pub level: usize,
    /// Index, among the blocks of the level below (the data blocks for level 0), of the block
    /// whose hash this is.
    pub child: u64,
    /// Index of the tree block holding the hash, counted within its level.
    pub block_in_level: u64,
    /// Index of that tree block in the stored tree (byte offset / block size).
    pub tree_block: u64,
    /// Byte offset of the hash inside that tree block.
    pub offset_in_block: usize,
}

impl HashPosition {
    /// Byte offset of the hash in the stored tree.
    pub fn tree_offset(&self, geometry: &TreeGeometry) -> u64 {
        // Cannot overflow: the position lies inside the tree, whose size fits in a u64.
        self.tree_block * geometry.block_size + self.offset_in_block as u64
    }
}

impl TreeGeometry {
    /// The tree of a file of `data_size` bytes with `params` (which are validated).
    pub fn new(data_size: u64, params: &FsVerityParams) -> Result<Self, FsVerityError> {
        params.validate()?;
        let block_size = u64::from(params.block_size);
        let digest_size = params.hash.digest_size();
        // Both are powers of two and a block holds at least 16 hashes (1024 / 64).
        let hash_bits = (block_size / digest_size as u64).trailing_zeros();
        let data_blocks = data_size.div_ceil(block_size);
        let mut level_blocks = Vec::new();
        let mut n = data_blocks;
        while n > 1 {
            n = n.div_ceil(1u64 << hash_bits);
            level_blocks.push(n);
        }
        let too_large = || FsVerityError::TreeTooLarge(data_size);
        let mut level_offsets = vec![0u64; level_blocks.len()];
        let mut blocks = 0u64;
        for (offset, &n) in level_offsets.iter_mut().zip(&level_blocks).rev() {
            *offset = blocks.checked_mul(block_size).ok_or_else(too_large)?;
            blocks = blocks.checked_add(n).ok_or_else(too_large)?;
        }
        let tree_size = blocks.checked_mul(block_size).ok_or_else(too_large)?;
        Ok(TreeGeometry {
            data_size,
            block_size,
            digest_size,
            hash_bits,
            data_blocks,
            level_blocks,
            level_offsets,
            tree_size,
        })
    }

    /// The file size the tree covers.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// Data (and tree) block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size as u32
    }

    /// Size of one hash in bytes.
    pub fn digest_size(&self) -> usize {
        self.digest_size
    }

    /// Hashes one tree block holds (`block_size / digest_size`).
    pub fn hashes_per_block(&self) -> u64 {
        1 << self.hash_bits
    }

    /// Number of data blocks (the last one may be partial).
    pub fn data_blocks(&self) -> u64 {
        self.data_blocks
    }

    /// Number of levels: 0 for a file of at most one block.
    pub fn levels(&self) -> usize {
        self.level_blocks.len()
    }

    /// Blocks of `level` (0 = the hashes of the data blocks); 0 past the top level.
    pub fn level_blocks(&self, level: usize) -> u64 {
        self.level_blocks.get(level).copied().unwrap_or(0)
    }

    /// Byte offset of `level` in the stored tree (the top level is at 0, level 0 last); `None`
    /// past the top level.
    pub fn level_offset(&self, level: usize) -> Option<u64> {
        self.level_offsets.get(level).copied()
    }

    /// Size of the stored tree in bytes (0 for a file of at most one block).
    pub fn tree_size(&self) -> u64 {
        self.tree_size
    }

    /// Where the hash of child `child` of `level` is stored: for level 0 the child is a data
    /// block, above it a block of the level below. `None` when the level or the child does not
    /// exist.
    pub fn hash_position(&self, level: usize, child: u64) -> Option<HashPosition> {
        let children = if level == 0 {
            self.data_blocks
        } else {
            self.level_blocks(level - 1)
        };
        if level >= self.levels() || child >= children {
            return None;
        }
        let block_in_level = child >> self.hash_bits;
        let entry = (child & (self.hashes_per_block() - 1)) as usize;
        Some(HashPosition {
            level,
            child,
            block_in_level,
            tree_block: self.level_offsets[level] / self.block_size + block_in_level,
            offset_in_block: entry * self.digest_size,
        })
    }

    /// The hashes that vouch for data block `data_block`, from level 0 up to the top level:
    /// its own hash, then the hash of the level-0 block holding it, and so on. The top level's
    /// block is vouched for by the root hash in the descriptor. Empty for a file of at most
    /// one block (the root hash is the data block's hash) and for a block past the end.
    ///
    /// To verify data block `b`: hash it (`H(salt' || block)`, zero-padded) and compare with
    /// the hash at `path[0]`; hash the tree block `path[0].tree_block` and compare with the
    /// hash at `path[1]`, and so on; the last tree block's hash must be the root hash.
    ///
    /// ```
    /// use dmkit::fsverity::{FsVerityParams, TreeGeometry};
    ///
    /// // 1 GiB, SHA-256, 4096-byte blocks: 128 hashes per block; levels of 2048, 16, 1 blocks.
    /// let g = TreeGeometry::new(1 << 30, &FsVerityParams::default()).unwrap();
    /// assert_eq!(g.levels(), 3);
    /// let path: Vec<_> = g.hash_path(1000).collect();
    /// // Data block 1000's hash: entry 1000 % 128 of level-0 block 1000 / 128...
    /// assert_eq!((path[0].block_in_level, path[0].offset_in_block), (7, 104 * 32));
    /// // ...which is stored after the top level (1 block) and level 1 (16 blocks).
    /// assert_eq!(g.level_offset(0), Some(17 * 4096));
    /// assert_eq!(path[0].tree_block, 17 + 7);
    /// assert_eq!(path[0].tree_offset(&g), (17 + 7) * 4096 + 104 * 32);
    /// // Level-0 block 7's hash is entry 7 of level-1 block 0 (stored block 1), and so on.
    /// assert_eq!((path[1].child, path[1].tree_block, path[1].offset_in_block), (7, 1, 7 * 32));
    /// assert_eq!((path[2].child, path[2].tree_block), (0, 0));
    /// ```
    pub fn hash_path(&self, data_block: u64) -> impl Iterator<Item = HashPosition> + '_ {
        let valid = data_block < self.data_blocks;
        let mut child = data_block;
        (0..if valid { self.levels() } else { 0 }).map(move |level| {
            let p = self
                .hash_position(level, child)
                .expect("every level holds the hash of the block below");
            child = p.block_in_level;
            p
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashAlgorithm;

    fn geo(size: u64, hash: HashAlgorithm, block_size: u32) -> TreeGeometry {
        let params = FsVerityParams {
            hash,
            block_size,
            salt: Vec::new(),
        };
        TreeGeometry::new(size, &params).unwrap()
    }

    #[test]
    fn no_tree_up_to_one_block() {
        for size in [0, 1, 4095, 4096] {
            let g = geo(size, HashAlgorithm::Sha256, 4096);
            assert_eq!((g.levels(), g.tree_size()), (0, 0), "size {size}");
            assert_eq!(g.level_offset(0), None);
            assert_eq!(g.hash_path(0).count(), 0);
        }
        assert_eq!(geo(0, HashAlgorithm::Sha256, 4096).data_blocks(), 0);
        assert_eq!(geo(1, HashAlgorithm::Sha256, 4096).data_blocks(), 1);
    }

    #[test]
    fn levels_offsets_and_sizes() {
        // 128 SHA-256 hashes per 4096-byte block: 129 blocks need two levels.
        let g = geo(4096 * 129, HashAlgorithm::Sha256, 4096);
        assert_eq!(g.hashes_per_block(), 128);
        assert_eq!(g.levels(), 2);
        assert_eq!((g.level_blocks(0), g.level_blocks(1)), (2, 1));
        // Top level first.
        assert_eq!(g.level_offset(1), Some(0));
        assert_eq!(g.level_offset(0), Some(4096));
        assert_eq!(g.tree_size(), 3 * 4096);
        assert_eq!(g.level_blocks(2), 0);

        // 16 SHA-512 hashes per 1024-byte block: 16^3 + 1 blocks need four levels.
        let g = geo(1024 * 4097, HashAlgorithm::Sha512, 1024);
        assert_eq!(g.hashes_per_block(), 16);
        let blocks: Vec<u64> = (0..g.levels()).map(|l| g.level_blocks(l)).collect();
        assert_eq!(blocks, [257, 17, 2, 1]);
        let offsets: Vec<u64> = (0..4).map(|l| g.level_offset(l).unwrap()).collect();
        assert_eq!(offsets, [20 * 1024, 3 * 1024, 1024, 0]);
        assert_eq!(g.tree_size(), 277 * 1024);
    }

    #[test]
    fn hash_positions_walk_to_the_root() {
        let g = geo(1024 * 4097, HashAlgorithm::Sha512, 1024);
        let path: Vec<HashPosition> = g.hash_path(4096).collect();
        assert_eq!(path.len(), 4);
        // Level 0: entry 0 of the level's block 256 (the last one).
        assert_eq!(path[0].block_in_level, 256);
        assert_eq!(path[0].offset_in_block, 0);
        assert_eq!(path[0].tree_block, 20 + 256);
        assert_eq!(path[0].tree_offset(&g), (20 + 256) * 1024);
        // Level 1: the hash of level-0 block 256 is entry 0 of block 16.
        assert_eq!((path[1].child, path[1].block_in_level), (256, 16));
        assert_eq!((path[2].child, path[2].block_in_level), (16, 1));
        assert_eq!(path[2].offset_in_block, 0);
        assert_eq!((path[3].child, path[3].block_in_level), (1, 0));
        assert_eq!(path[3].offset_in_block, 64);
        assert_eq!(path[3].tree_block, 0);

        let p = g.hash_position(0, 37).unwrap();
        assert_eq!((p.block_in_level, p.offset_in_block), (2, 5 * 64));
        assert_eq!(g.hash_position(0, 4097), None);
        assert_eq!(g.hash_position(1, 257), None);
        assert_eq!(g.hash_position(4, 0), None);
        assert_eq!(g.hash_path(4097).count(), 0);
    }

    #[test]
    fn any_u64_size_is_fine() {
        for hash in [HashAlgorithm::Sha256, HashAlgorithm::Sha512] {
            for bs in [1024, 4096, 65536] {
                for size in [u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) + 1] {
                    let g = geo(size, hash, bs);
                    assert!(g.tree_size() > 0 && g.tree_size() < size / 8);
                    let last = g.data_blocks() - 1;
                    let path: Vec<_> = g.hash_path(last).collect();
                    assert_eq!(path.len(), g.levels());
                    assert_eq!(path.last().unwrap().block_in_level, 0);
                    assert_eq!(g.level_blocks(g.levels() - 1), 1);
                    for p in path {
                        assert!(p.tree_offset(&g) < g.tree_size());
                    }
                }
            }
        }
    }

    #[test]
    fn bad_params_are_refused() {
        let params = FsVerityParams {
            block_size: 512,
            ..FsVerityParams::default()
        };
        assert!(matches!(
            TreeGeometry::new(1, &params),
            Err(FsVerityError::BadBlockSize(512))
        ));
    }
}
