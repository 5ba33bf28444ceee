//! What a verified device may read data blocks from besides its data device: a store outside
//! the trusted path (the remote layer's persistent cache, `crate::remote::cache`), whose
//! copies are checked against the tree on every read like bytes from the data device, and
//! which is handed only blocks that verified.
//!
//! The store also knows how to fetch a block again from its origin, bypassing every cache and
//! read-ahead buffer: a block that fails its digest is fetched once more before the device
//! gives up on it (a flipped bit in transit, a torn cache write), then reported corrupt.

use super::params::{TreeLayout, VerityParams};
use crate::block::Result;

/// A place data blocks are kept and fetched from, outside the verified path.
pub trait BlockStore: Send + Sync {
    /// Copy the stored (unverified) bytes of data block `block` into `out`; `false` when the
    /// store does not hold it.
    fn lookup(&self, block: u64, out: &mut [u8]) -> bool;
    /// Keep data block `block`, which just verified against the tree.
    fn insert(&self, block: u64, data: &[u8]);
    /// The stored copy of `block` failed its digest: drop it (it is replaced by
    /// [`insert`](Self::insert) if the block verifies after [`refetch`](Self::refetch)).
    fn reject(&self, block: u64);
    /// Read data block `block` into `out` from its origin again, bypassing every cache.
    fn refetch(&self, block: u64, out: &mut [u8]) -> Result<()>;
}

/// Check a whole hash area against `root`: every hash block of every level against its
/// parent's entry, the top one against the root. `area` holds the hash device from byte
/// `area_start` on (at least up to the end of the tree). Returns the absolute hash block
/// numbers that fail (the children of a bad block fail with it: their parent's entries cannot
/// be trusted).
pub fn check_tree(
    params: &VerityParams,
    layout: &TreeLayout,
    root: &[u8],
    area: &[u8],
    area_start: u64,
) -> Vec<u64> {
    let hbs = layout.hash_block_size as usize;
    let (prefix, suffix) = params.salt_parts();
    let ds = layout.digest_size;
    let block_at = |abs: u64| -> Option<&[u8]> {
        let off = (abs * hbs as u64).checked_sub(area_start)? as usize;
        area.get(off..off + hbs)
    };
    let mut bad = Vec::new();
    let levels = layout.levels();
    for level in (0..levels).rev() {
        for i in 0..layout.level_blocks[level] {
            let abs = layout.level_start[level] + i;
            let Some(block) = block_at(abs) else {
                bad.push(abs);
                continue;
            };
            let digest = params.hash.hash(&[prefix, block, suffix]);
            let want: Option<&[u8]> = if level + 1 == levels {
                Some(root)
            } else {
                let (parent, pos) = layout.locate(level + 1, i);
                block_at(parent).map(|p| &p[pos..pos + ds])
            };
            if want != Some(&digest[..]) {
                bad.push(abs);
            }
        }
    }
    bad
}
