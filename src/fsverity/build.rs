//! Building one file's Merkle tree from its level-0 hashes, in bounded memory.
//!
//! The data blocks are taken in segments of `hashes_per_block^j` blocks. A segment aligned to
//! that size owns whole blocks of levels `0..j` and its level-`j-1` block hashes to a single
//! entry of level `j`, so each segment is reduced on its own as soon as its level-0 hashes
//! are known, and only one hash per segment is kept for the levels above. Memory is one
//! round of level-0 hashes (a few MiB) whatever the file size, plus the stored tree when the
//! caller keeps it. Who computes the level-0 hashes (several threads over a mapping, one
//! thread over a reader) is the caller's business: see [`build_tree`].

use super::digest::FsVerityParams;
use super::geometry::TreeGeometry;
use super::FsVerityError;
use crate::hash::{hash_blocks, HashAlgorithm};

/// Level-0 hashes held at most per segment (bytes); a segment is the largest power of the
/// hashes per block that fits, so its upper levels can be reduced on their own.
const SEGMENT_HASH_BYTES: u64 = 4 << 20;
/// Data handed to the level-0 filler at a time (a whole number of segments, at least one).
const ROUND_DATA_BYTES: u64 = 64 << 20;

/// Hashes blocks as fs-verity does: `H(salt' || block)`, salt' being the salt zero-padded to
/// the hash's input block size.
#[derive(Debug, Clone)]
pub(crate) struct BlockHasher {
    alg: HashAlgorithm,
    prefix: Vec<u8>,
    block_size: usize,
}

impl BlockHasher {
    pub(crate) fn new(params: &FsVerityParams) -> Self {
        BlockHasher {
            alg: params.hash,
            prefix: params.hash_prefix(),
            block_size: params.block_size as usize,
        }
    }

    /// Block size in bytes.
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Digest size in bytes.
    pub(crate) fn digest_size(&self) -> usize {
        self.alg.digest_size()
    }

    /// The hash of every block of `blocks` (whole blocks) into `out`.
    pub(crate) fn blocks(&self, blocks: &[u8], out: &mut [u8]) {
        hash_blocks(self.alg, &self.prefix, &[], blocks, self.block_size, out);
    }

    /// The hash of every block of `data` into `out` (one hash per started block), the last
    /// block zero-padded if `data` ends inside it.
    pub(crate) fn data(&self, data: &[u8], out: &mut [u8]) {
        let bs = self.block_size;
        let whole = data.len() / bs * bs;
        let ds = self.digest_size();
        self.blocks(&data[..whole], &mut out[..whole / bs * ds]);
        if whole < data.len() {
            let mut last = vec![0u8; bs];
            last[..data.len() - whole].copy_from_slice(&data[whole..]);
            self.blocks(&last, &mut out[whole / bs * ds..]);
        }
    }

    /// The hash of every 256-byte descriptor in `descriptors` into `out` (no salt).
    pub(crate) fn descriptors(&self, descriptors: &[u8], out: &mut [u8]) {
        hash_blocks(
            self.alg,
            &[],
            &[],
            descriptors,
            super::descriptor::DESCRIPTOR_SIZE,
            out,
        );
    }
}

/// The root hash and, if kept, the stored tree.
pub(crate) struct Built {
    pub(crate) root_hash: Vec<u8>,
    pub(crate) tree: Vec<u8>,
}

/// A zeroed buffer for a tree of `size` bytes, or an error when it cannot be held in memory.
pub(crate) fn tree_buffer(size: u64) -> Result<Vec<u8>, FsVerityError> {
    let too_large = || FsVerityError::TreeTooLarge(size);
    let n = usize::try_from(size).map_err(|_| too_large())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_large())?;
    v.resize(n, 0);
    Ok(v)
}

/// Computes the tree of `geometry` from level-0 hashes supplied by `fill`, which is called
/// with the first data block of a round and the slice to fill with the hashes of that round's
/// blocks (one per block, in order; rounds come in order). Returns the root hash and, with
/// `keep_tree`, the tree as the kernel stores it.
pub(crate) fn build_tree<E>(
    geometry: &TreeGeometry,
    hasher: &BlockHasher,
    keep_tree: bool,
    mut fill: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<Built, E>
where
    E: From<FsVerityError>,
{
    let ds = hasher.digest_size();
    let n = geometry.data_blocks();
    let mut reducer = Reducer {
        geometry,
        hasher,
        tree: if keep_tree {
            tree_buffer(geometry.tree_size())?
        } else {
            Vec::new()
        },
        next: Vec::new(),
    };
    if n == 0 {
        return Ok(Built {
            root_hash: vec![0; ds],
            tree: reducer.tree,
        });
    }
    let hpb = geometry.hashes_per_block();
    let mut seg_levels = 1u32;
    while hpb
        .checked_pow(seg_levels + 1)
        .is_some_and(|w| w.saturating_mul(ds as u64) <= SEGMENT_HASH_BYTES)
    {
        seg_levels += 1;
    }
    let seg_blocks = hpb.pow(seg_levels);
    let bs = geometry.block_size() as u64;
    let round_segments = (ROUND_DATA_BYTES / seg_blocks.saturating_mul(bs)).max(1);
    let round_blocks = round_segments * seg_blocks;
    let mut level0 = Vec::new();

    if n <= seg_blocks {
        level0.resize(padded(n as usize * ds, hasher.block_size()), 0);
        fill(0, &mut level0[..n as usize * ds])?;
        let root_hash = reducer.reduce(level0, n, 0, 0, None);
        return Ok(Built {
            root_hash,
            tree: reducer.tree,
        });
    }
    // Several segments: each reduces to one hash of level `seg_levels`.
    let mut top = Vec::with_capacity(n.div_ceil(seg_blocks) as usize * ds);
    let mut first = 0u64;
    while first < n {
        let count = (n - first).min(round_blocks);
        level0.resize(count as usize * ds, 0);
        fill(first, &mut level0)?;
        for (s, hashes) in level0.chunks(seg_blocks as usize * ds).enumerate() {
            let seg_first = first + s as u64 * seg_blocks;
            let mut seg = std::mem::take(&mut reducer.next);
            seg.clear();
            seg.extend_from_slice(hashes);
            seg.resize(padded(hashes.len(), hasher.block_size()), 0);
            let h = reducer.reduce(
                seg,
                (hashes.len() / ds) as u64,
                0,
                seg_first / hpb,
                Some(seg_levels as usize),
            );
            top.extend_from_slice(&h);
        }
        first += count;
    }
    let count = (top.len() / ds) as u64;
    top.resize(padded(top.len(), hasher.block_size()), 0);
    let root_hash = reducer.reduce(top, count, seg_levels as usize, 0, None);
    Ok(Built {
        root_hash,
        tree: reducer.tree,
    })
}

/// `len` rounded up to whole blocks.
fn padded(len: usize, block_size: usize) -> usize {
    len.div_ceil(block_size) * block_size
}

/// Hashes levels upwards, storing each level's blocks in the tree when it is kept.
struct Reducer<'a> {
    geometry: &'a TreeGeometry,
    hasher: &'a BlockHasher,
    tree: Vec<u8>,
    /// A spare buffer, reused from one reduction to the next.
    next: Vec<u8>,
}

impl Reducer<'_> {
    /// `hashes` holds `count` hashes of `level`, zero-padded to whole blocks, the first of
    /// them in block `first_block` of the level. Hashes level after level, `steps` times or
    /// until a single hash is left, and returns that hash.
    fn reduce(
        &mut self,
        mut hashes: Vec<u8>,
        mut count: u64,
        mut level: usize,
        mut first_block: u64,
        steps: Option<usize>,
    ) -> Vec<u8> {
        let ds = self.hasher.digest_size();
        let bs = self.hasher.block_size();
        let hpb = self.geometry.hashes_per_block();
        let mut left = steps;
        while left.map_or(count > 1, |l| l > 0) {
            debug_assert_eq!(hashes.len() % bs, 0);
            if !self.tree.is_empty() {
                let at = self
                    .geometry
                    .level_offset(level)
                    .expect("level in the tree")
                    + first_block * bs as u64;
                self.tree[at as usize..][..hashes.len()].copy_from_slice(&hashes);
            }
            let blocks = hashes.len() / bs;
            let mut next = std::mem::take(&mut self.next);
            next.clear();
            next.resize(padded(blocks * ds, bs), 0);
            self.hasher.blocks(&hashes, &mut next[..blocks * ds]);
            self.next = hashes;
            hashes = next;
            count = blocks as u64;
            level += 1;
            first_block /= hpb;
            left = left.map(|l| l - 1);
        }
        debug_assert_eq!(count, 1);
        let root = hashes[..ds].to_vec();
        self.next = hashes;
        root
    }
}
