//! Checking blocks read from a sealed file against its Merkle tree, as the kernel's fs-verity
//! does on every page-cache fill: each data block's hash must be the entry for it in level 0,
//! and each tree block read from the store must hash to its entry in the level above (up to
//! the root hash from the verified descriptor) before any entry in it is believed.
//!
//! Verified tree blocks are kept in a bounded cache (CLOCK, as dm-verity's), so sequential
//! reads cost one data hash per block and a cache hit per 128 blocks; data blocks are always
//! hashed, never cached, so tampering on disk is caught however long the tree is mounted.

use super::store::StoredTree;
use crate::fsverity::FsVerityParams;
use crate::hash::{hash_blocks, HashAlgorithm};
use crate::verity::cache::BlockCache;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// The salt as prepended to every hashed block (zero-padded to the hash's input block size).
pub fn salt_prefix(params: &FsVerityParams) -> Vec<u8> {
    params.hash_prefix()
}

/// Bits of a cache key that number a block inside one tree: tree ids fill the rest.
const TREE_BLOCK_BITS: u32 = 40;
/// Most distinct trees a verifier tells apart in its cache.
pub const MAX_TREES: usize = 1 << (64 - TREE_BLOCK_BITS);

/// What failed to verify.
#[derive(Debug)]
pub enum Failure {
    /// A data block does not match its hash in the tree.
    DataBlock(u64),
    /// A tree block read from the store does not match its hash in the level above.
    TreeBlock {
        /// Its level (0 holds the data blocks' hashes).
        level: usize,
        /// Its index in the level.
        index: u64,
    },
    /// The store could not be read.
    Io(std::io::Error),
}

/// Checks data blocks of sealed files; shared by all serving threads.
pub struct Verifier {
    hash: HashAlgorithm,
    block_size: u64,
    prefix: Vec<u8>,
    cache: BlockCache,
}

impl Verifier {
    /// A verifier for trees made with `params`, caching up to `cache_bytes` of tree blocks.
    pub fn new(params: &FsVerityParams, cache_bytes: u64) -> Verifier {
        let bs = params.block_size as u64;
        Verifier {
            hash: params.hash,
            block_size: bs,
            prefix: salt_prefix(params),
            cache: BlockCache::new((cache_bytes / bs).max(1) as usize),
        }
    }

    /// Check `data`, whole blocks starting at data block `first` of a file whose tree is
    /// `tree` (number `id`, stored in `store`; `None` only for files of at most one block), the
    /// last block zero-padded. `hashes` is scratch space.
    pub fn check(
        &self,
        id: u32,
        tree: &StoredTree,
        store: Option<&File>,
        first: u64,
        data: &[u8],
        hashes: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let bs = self.block_size as usize;
        let ds = self.hash.digest_size();
        let n = data.len() / bs;
        hashes.resize(n * ds, 0);
        hash_blocks(self.hash, &self.prefix, &[], data, bs, hashes);
        if tree.geometry.levels() == 0 {
            // One block: its hash is the root hash.
            return match hashes.as_slice() == tree.root_hash.as_slice() && first == 0 {
                true => Ok(()),
                false => Err(Failure::DataBlock(first)),
            };
        }
        let store = store.ok_or_else(|| {
            Failure::Io(std::io::Error::other("the tree's store file is not open"))
        })?;
        let hpb = tree.geometry.hashes_per_block();
        let mut i = 0u64;
        while (i as usize) < n {
            let block = first + i;
            let (index, entry) = (block / hpb, block % hpb);
            let parent = self.tree_block(id, tree, store, 0, index)?;
            // Every data block of this request whose hash sits in this tree block.
            let span = (hpb - entry).min(n as u64 - i) as usize;
            let want = &parent[entry as usize * ds..(entry as usize + span) * ds];
            let got = &hashes[i as usize * ds..(i as usize + span) * ds];
            if want != got {
                let bad = got
                    .chunks_exact(ds)
                    .zip(want.chunks_exact(ds))
                    .position(|(g, w)| g != w)
                    .unwrap_or(0);
                return Err(Failure::DataBlock(block + bad as u64));
            }
            i += span as u64;
        }
        Ok(())
    }

    /// Tree block `index` of `level`, verified up to the root (or a cached verified ancestor).
    fn tree_block(
        &self,
        id: u32,
        tree: &StoredTree,
        store: &File,
        level: usize,
        index: u64,
    ) -> Result<Arc<[u8]>, Failure> {
        let g = &tree.geometry;
        let key = ((id as u64) << TREE_BLOCK_BITS)
            | (super::store::level_offset(g, level) / self.block_size + index);
        if let Some(b) = self.cache.get(key) {
            return Ok(b);
        }
        let bs = self.block_size as usize;
        let ds = self.hash.digest_size();
        let mut block = vec![0u8; bs];
        store
            .read_exact_at(&mut block, tree.block_offset(level, index, self.block_size))
            .map_err(Failure::Io)?;
        let mut h = [0u8; crate::hash::MAX_DIGEST_SIZE];
        self.hash.hash_parts(&[&self.prefix, &block], &mut h[..ds]);
        let ok = if level + 1 == g.levels() {
            h[..ds] == tree.root_hash[..]
        } else {
            let hpb = g.hashes_per_block();
            let parent = self.tree_block(id, tree, store, level + 1, index / hpb)?;
            let at = (index % hpb) as usize * ds;
            h[..ds] == parent[at..at + ds]
        };
        if !ok {
            return Err(Failure::TreeBlock { level, index });
        }
        let block: Arc<[u8]> = block.into();
        self.cache.insert(key, block.clone());
        Ok(block)
    }
}
