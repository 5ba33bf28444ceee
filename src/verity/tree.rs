//! Building and checking the dm-verity hash tree, on all cores.
//!
//! Each level is the digests of the level below (level 0: of the data blocks), packed into
//! hash blocks: digest `i` at `i * entry_size`, the rest of the block zero. Work is split by
//! groups of output hash blocks, so every worker reads a large contiguous run of input and
//! hashes it with [`crate::hash::hash_blocks`] (multi-buffer where available).

use super::params::{TreeLayout, VerityParams};
use crate::block::{BlockDevice, BlockError};
use crate::hash::hash_blocks;
use rayon::prelude::*;

/// Bytes of input one worker reads and hashes at a time.
const CHUNK_INPUT_BYTES: u64 = 4 << 20;

/// The whole tree in memory: one buffer of hash blocks per level (index 0 = data digests).
#[derive(Debug, Clone)]
pub struct Tree {
    /// Hash blocks of each level.
    pub levels: Vec<Vec<u8>>,
    /// The root hash.
    pub root: Vec<u8>,
}

/// Where a level's input items come from.
enum Input<'a> {
    /// Data blocks read from a device.
    Device(&'a dyn BlockDevice),
    /// Hash blocks of the level below, already in memory.
    Memory(&'a [u8]),
}

/// Hash `count` items of `item_size` bytes into the hash blocks of one level.
fn hash_level(
    params: &VerityParams,
    layout: &TreeLayout,
    input: Input<'_>,
    count: u64,
    item_size: usize,
) -> Result<Vec<u8>, BlockError> {
    let hbs = layout.hash_block_size as usize;
    let per_block = layout.hashes_per_block();
    let out_blocks = count.div_ceil(per_block);
    let group = (CHUNK_INPUT_BYTES / (per_block * item_size as u64)).max(1) as usize;
    let mut out = vec![0u8; out_blocks as usize * hbs];
    let (prefix, suffix) = params.salt_parts();
    let ds = layout.digest_size;
    out.par_chunks_mut(group * hbs)
        .enumerate()
        .try_for_each_init(
            || (Vec::new(), Vec::new()),
            |(buf, digests): &mut (Vec<u8>, Vec<u8>), (g, out_chunk)| {
                let first = g as u64 * group as u64 * per_block;
                let n = ((out_chunk.len() / hbs) as u64 * per_block).min(count - first) as usize;
                let bytes = n * item_size;
                let items: &[u8] = match &input {
                    Input::Device(dev) => {
                        buf.resize(bytes, 0);
                        dev.read_at(buf, first * item_size as u64)?;
                        buf
                    }
                    Input::Memory(m) => {
                        let start = first as usize * item_size;
                        &m[start..start + bytes]
                    }
                };
                digests.resize(n * ds, 0);
                hash_blocks(params.hash, prefix, suffix, items, item_size, digests);
                // Digest i goes to slot i % per_block of hash block i / per_block; with hash
                // type 0 the slots do not fill the block, so the two are not the same offset.
                let per_block = per_block as usize;
                for (i, d) in digests.chunks_exact(ds).enumerate() {
                    let pos = (i / per_block) * hbs + (i % per_block) * layout.entry_size;
                    out_chunk[pos..pos + ds].copy_from_slice(d);
                }
                Ok(())
            },
        )?;
    Ok(out)
}

/// Compute the whole tree over the data device.
pub fn build(
    data: &dyn BlockDevice,
    params: &VerityParams,
    layout: &TreeLayout,
) -> Result<Tree, BlockError> {
    let hbs = layout.hash_block_size as usize;
    let mut levels: Vec<Vec<u8>> = Vec::with_capacity(layout.levels());
    for level in 0..layout.levels() {
        let buf = match levels.last() {
            None => hash_level(
                params,
                layout,
                Input::Device(data),
                params.data_blocks,
                params.data_block_size as usize,
            )?,
            Some(below) => hash_level(
                params,
                layout,
                Input::Memory(below),
                (below.len() / hbs) as u64,
                hbs,
            )?,
        };
        debug_assert_eq!(buf.len() as u64, layout.level_blocks[level] * hbs as u64);
        levels.push(buf);
    }
    let (prefix, suffix) = params.salt_parts();
    let root = match levels.last() {
        Some(top) => params.hash.hash(&[prefix, top, suffix]),
        None => {
            let mut block = vec![0u8; params.data_block_size as usize];
            data.read_at(&mut block, 0)?;
            params.hash.hash(&[prefix, &block, suffix])
        }
    };
    Ok(Tree { levels, root })
}

/// Write the tree (levels at their positions, top level first on disk) to the hash device.
pub fn write(hash: &dyn BlockDevice, layout: &TreeLayout, tree: &Tree) -> Result<(), BlockError> {
    for (level, buf) in tree.levels.iter().enumerate() {
        hash.write_at(buf, layout.level_start[level] * layout.hash_block_size)?;
    }
    Ok(())
}

/// What an offline check found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Data blocks whose digest does not match the (trusted) tree, in data-block units.
    pub corrupt_data_blocks: Vec<u64>,
    /// Hash blocks that do not match their parent, absolute in hash-block units.
    pub corrupt_hash_blocks: Vec<u64>,
    /// The top of the stored tree does not match the given root hash and the data does not
    /// produce it either, so no block can be blamed: a wrong root hash, salt or parameters, or
    /// a hash device made for other data.
    pub root_hash_mismatch: bool,
    /// The root hash computed from the data.
    pub computed_root: String,
    /// Hash blocks whose spare bytes (digest padding, and the entries past the last child)
    /// are not zero, absolute in hash-block units. A tree built for these parameters leaves
    /// them zero; veritysetup refuses a tree that does not ("Spare area is not zeroed"): it was
    /// made for more data blocks than the superblock says, and the extra digests would
    /// otherwise go unchecked.
    pub spare_not_zeroed: Vec<u64>,
}

impl VerifyReport {
    /// Whether everything checked out.
    pub fn ok(&self) -> bool {
        self.corrupt_data_blocks.is_empty()
            && self.corrupt_hash_blocks.is_empty()
            && !self.root_hash_mismatch
            && self.spare_not_zeroed.is_empty()
    }
}

/// Check data and hash device against `root`, naming every corrupt block.
///
/// When the data produces `root`, every stored hash block that differs from the recomputed
/// one is corrupt. Otherwise the stored tree is walked from the root: a hash block is trusted
/// when its digest matches the entry in its trusted parent, and data blocks are checked
/// against trusted entries. Children of an untrusted block are checked against the recomputed
/// tree instead, so one flipped bit is reported once, at the right place.
pub fn verify(
    data: &dyn BlockDevice,
    hash: &dyn BlockDevice,
    params: &VerityParams,
    layout: &TreeLayout,
    root: &[u8],
) -> Result<VerifyReport, BlockError> {
    let computed = build(data, params, layout)?;
    let hbs = layout.hash_block_size as usize;
    let (prefix, suffix) = params.salt_parts();
    let ds = layout.digest_size;
    let mut report = VerifyReport {
        computed_root: hex::encode(&computed.root),
        ..VerifyReport::default()
    };
    let levels = layout.levels();
    if levels == 0 {
        if computed.root != root {
            report.corrupt_data_blocks.push(0);
        }
        return Ok(report);
    }
    let mut stored: Vec<Vec<u8>> = Vec::with_capacity(levels);
    for level in 0..levels {
        let mut buf = vec![0u8; layout.level_blocks[level] as usize * hbs];
        hash.read_at(&mut buf, layout.level_start[level] * hbs as u64)?;
        stored.push(buf);
    }
    report.spare_not_zeroed = nonzero_spare(params, layout, &stored);
    if computed.root == root {
        // The data is intact; any stored block unlike the recomputed one is corrupt.
        for level in (0..levels).rev() {
            let pairs = stored[level]
                .chunks_exact(hbs)
                .zip(computed.levels[level].chunks_exact(hbs));
            for (i, (s, c)) in pairs.enumerate() {
                if s != c {
                    report
                        .corrupt_hash_blocks
                        .push(layout.level_start[level] + i as u64);
                }
            }
        }
        return Ok(report);
    }
    let top = levels - 1;
    if params.hash.hash(&[prefix, &stored[top], suffix]) != root {
        if stored[top] == computed.levels[top]
            || !vouches_for_children(params, layout, &stored, &computed)
        {
            // Either the tree matches the data and only the root differs, or the top block
            // agrees with nothing below it (wrong salt, parameters or hash device): no block
            // can be blamed.
            report.root_hash_mismatch = true;
            return Ok(report);
        }
        // The top block is corrupt (or the root is wrong) but still agrees with most of its
        // children: blame it, and let it witness for the rest of the tree.
        report.corrupt_hash_blocks.push(layout.level_start[top]);
    }
    // expected[i]: the digest a trusted parent vouches for, for block i of the current level.
    let mut expected: Vec<&[u8]> = vec![root];
    for level in (0..levels).rev() {
        let mut next_expected = Vec::with_capacity(stored[level].len() / layout.entry_size);
        for (i, block) in stored[level].chunks_exact(hbs).enumerate() {
            // The top block was checked (or blamed) above.
            let trusted = level == top || params.hash.hash(&[prefix, block, suffix]) == expected[i];
            if !trusted {
                report
                    .corrupt_hash_blocks
                    .push(layout.level_start[level] + i as u64);
            }
            // Entries this block vouches for: its own if trusted, else the recomputed ones.
            let source = if trusted {
                block
            } else {
                &computed.levels[level][i * hbs..(i + 1) * hbs]
            };
            for slot in 0..layout.hashes_per_block() as usize {
                let pos = slot * layout.entry_size;
                next_expected.push(&source[pos..pos + ds]);
            }
        }
        expected = next_expected;
    }
    // `expected` now holds, per data block, the digest a trusted tree vouches for.
    for (i, want) in expected
        .iter()
        .take(params.data_blocks as usize)
        .enumerate()
    {
        let (blk, pos) = layout.locate(0, i as u64);
        let got_block = &computed.levels[0][((blk - layout.level_start[0]) as usize) * hbs..];
        if &got_block[pos..pos + ds] != *want {
            report.corrupt_data_blocks.push(i as u64);
        }
    }
    Ok(report)
}

/// The hash blocks of `stored` (all levels) with a non-zero byte where the tree has no digest:
/// the padding after each digest and every byte after the last used entry.
fn nonzero_spare(params: &VerityParams, layout: &TreeLayout, stored: &[Vec<u8>]) -> Vec<u64> {
    let hbs = layout.hash_block_size as usize;
    let (es, ds) = (layout.entry_size, layout.digest_size);
    let per_block = layout.hashes_per_block() as usize;
    let mut out = Vec::new();
    for (level, blocks) in stored.iter().enumerate() {
        let children = if level == 0 {
            params.data_blocks
        } else {
            layout.level_blocks[level - 1]
        } as usize;
        for (i, block) in blocks.chunks_exact(hbs).enumerate() {
            let used = children.saturating_sub(i * per_block).min(per_block);
            let padding =
                (0..used).any(|j| block[j * es + ds..(j + 1) * es].iter().any(|&b| b != 0));
            if padding || block[used * es..].iter().any(|&b| b != 0) {
                out.push(layout.level_start[level] + i as u64);
            }
        }
    }
    out
}

/// Whether at least half of the top block's children hash to the entries it holds: then the
/// top block is a damaged copy of the right one, not a block of another tree.
fn vouches_for_children(
    params: &VerityParams,
    layout: &TreeLayout,
    stored: &[Vec<u8>],
    computed: &Tree,
) -> bool {
    let top = layout.levels() - 1;
    let hbs = layout.hash_block_size as usize;
    let ds = layout.digest_size;
    let (prefix, suffix) = params.salt_parts();
    let entry = |slot: usize| &stored[top][slot * layout.entry_size..slot * layout.entry_size + ds];
    let (children, agreeing) = if top == 0 {
        // The children are data blocks; their digests are the recomputed top block's entries.
        let n = params.data_blocks as usize;
        let agree = (0..n)
            .filter(|&i| {
                let pos = i * layout.entry_size;
                computed.levels[0][pos..pos + ds] == *entry(i)
            })
            .count();
        (n, agree)
    } else {
        let below = &stored[top - 1];
        let agree = below
            .chunks_exact(hbs)
            .enumerate()
            .filter(|(i, b)| params.hash.hash(&[prefix, b, suffix]) == entry(*i))
            .count();
        (below.len() / hbs, agree)
    };
    agreeing * 2 >= children.max(1)
}
