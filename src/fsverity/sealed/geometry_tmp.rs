//! TEMPORARY: the Merkle tree layout and a tree builder, until the shared `fsverity::merkle`
//! module lands (it replaces this file).

use crate::fsverity::digest::{digest_reader, FsVerityParams};
use crate::fsverity::{FileDigest, FsVerityError};
use crate::hash::hash_blocks;
use std::io::Read;
use std::path::Path;

/// Where each level of a file's Merkle tree is stored (root level first, as the kernel keeps
/// it): level 0 holds the data blocks' hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeGeometry {
    block_size: u64,
    hashes_per_block: u64,
    level_blocks: Vec<u64>,
    level_start: Vec<u64>,
}

impl TreeGeometry {
    /// The layout of the tree of a `data_size`-byte file.
    pub fn new(data_size: u64, params: &FsVerityParams) -> Result<Self, FsVerityError> {
        params.validate()?;
        let bs = params.block_size as u64;
        let hpb = bs / params.hash.digest_size() as u64;
        let mut level_blocks = Vec::new();
        let mut n = data_size.div_ceil(bs);
        while n > 1 {
            n = n.div_ceil(hpb);
            level_blocks.push(n);
        }
        let mut level_start = vec![0; level_blocks.len()];
        let mut at = 0u64;
        for l in (0..level_blocks.len()).rev() {
            level_start[l] = at;
            at += level_blocks[l];
        }
        Ok(TreeGeometry {
            block_size: bs,
            hashes_per_block: hpb,
            level_blocks,
            level_start,
        })
    }

    /// Number of levels (0 for a file of at most one block).
    pub fn levels(&self) -> usize {
        self.level_blocks.len()
    }

    /// Blocks in level `level`.
    pub fn level_blocks(&self, level: usize) -> u64 {
        self.level_blocks[level]
    }

    /// Byte offset of level `level` in the stored tree.
    pub fn level_offset(&self, level: usize) -> u64 {
        self.level_start[level] * self.block_size
    }

    /// Size of the stored tree in bytes.
    pub fn tree_size(&self) -> u64 {
        self.level_blocks.iter().sum::<u64>() * self.block_size
    }

    /// Hashes in one tree block.
    pub fn hashes_per_block(&self) -> u64 {
        self.hashes_per_block
    }
}

/// A file's digest and its whole Merkle tree, as stored (root level first).
pub struct MerkleTree {
    /// The digest and descriptor.
    pub digest: FileDigest,
    /// The tree bytes.
    pub tree: Vec<u8>,
}

/// Digest and tree of the file at `path`.
pub fn file_tree(path: &Path, params: &FsVerityParams) -> Result<MerkleTree, FsVerityError> {
    let io = |e: std::io::Error| FsVerityError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut data = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .read_to_end(&mut data)
        .map_err(io)?;
    let digest = digest_reader(&data[..], data.len() as u64, params, path)?;
    let geo = TreeGeometry::new(data.len() as u64, params)?;
    let bs = params.block_size as usize;
    let ds = params.hash.digest_size();
    let mut prefix = params.salt.clone();
    if !prefix.is_empty() {
        let ib = if ds == 64 { 128 } else { 64 };
        prefix.resize(prefix.len().div_ceil(ib) * ib, 0);
    }
    let mut tree = vec![0u8; geo.tree_size() as usize];
    let mut below = data;
    below.resize(below.len().div_ceil(bs) * bs, 0);
    for l in 0..geo.levels() {
        let off = geo.level_offset(l) as usize;
        let n = below.len() / bs;
        let dst = &mut tree[off..off + n * ds];
        hash_blocks(params.hash, &prefix, &[], &below, bs, dst);
        let len = geo.level_blocks(l) as usize * bs;
        below = tree[off..off + len].to_vec();
    }
    Ok(MerkleTree { digest, tree })
}
