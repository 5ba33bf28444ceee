//! Verification with FEC: the blocks a verification found corrupt are rebuilt from their
//! rounds ([`Corrector`]) with the kernel's rules, and a rebuilt block counts only when the
//! whole volume, read with the rebuilt blocks in place ([`Patched`]), verifies against the
//! root hash again, so a miscorrection can never pass. As the kernel does for each block it
//! reads, errors alone are tried first, then with erasures: the round's data blocks whose
//! digest fails against the tree (hash blocks are never erasures, see
//! [`super::correct`]). `verity repair` writes the blocks that passed back.

use super::correct::Corrector;
use super::{hash_offset_block, FecError};
use crate::block::{BlockDevice, BlockError};
use crate::verity::tree::{verify, VerifyReport};
use crate::verity::{TreeLayout, VerityParams};
use std::collections::BTreeMap;

/// A read-only view of a device with some blocks replaced.
pub struct Patched<'a> {
    base: &'a dyn BlockDevice,
    block: u64,
    patches: BTreeMap<u64, Vec<u8>>,
}

impl<'a> Patched<'a> {
    /// `base` with blocks of `block` bytes replaced by `patches` (block index to bytes).
    pub fn new(base: &'a dyn BlockDevice, block: u64, patches: BTreeMap<u64, Vec<u8>>) -> Self {
        Patched {
            base,
            block,
            patches,
        }
    }
}

impl BlockDevice for Patched<'_> {
    fn name(&self) -> &str {
        self.base.name()
    }
    fn size(&self) -> u64 {
        self.base.size()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> crate::block::Result<()> {
        self.base.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        let (first, last) = (offset / self.block, end.div_ceil(self.block));
        for (&b, bytes) in self.patches.range(first..last) {
            let start = b * self.block;
            let lo = start.max(offset);
            let hi = (start + self.block).min(end);
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&bytes[(lo - start) as usize..(hi - start) as usize]);
        }
        Ok(())
    }
    fn write_at(&self, _: &[u8], _: u64) -> crate::block::Result<()> {
        Err(BlockError::ReadOnly {
            device: self.base.name().to_string(),
        })
    }
    fn flush(&self) -> crate::block::Result<()> {
        Ok(())
    }
}

/// What FEC made of a verification's corrupt blocks.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FecOutcome {
    /// Data blocks rebuilt and verified.
    pub corrected_data_blocks: Vec<u64>,
    /// Hash blocks (absolute, in hash-block units) rebuilt and verified.
    pub corrected_hash_blocks: Vec<u64>,
    /// Symbols the decoder corrected in the rounds it used.
    pub symbols_corrected: usize,
    /// The verification of the volume with the rebuilt blocks in place: what is still
    /// corrupt there could not be corrected.
    pub after: VerifyReport,
    /// Blocks of the FEC area (block-size units from its offset) whose parity is not the
    /// parity of the verified volume: damage to the FEC area itself (checked only when the
    /// volume verified).
    pub damaged_parity_blocks: Vec<u64>,
    /// The rebuilt data blocks (block index to bytes), for a repair to write back.
    #[serde(skip)]
    pub data_patches: BTreeMap<u64, Vec<u8>>,
    /// The rebuilt hash blocks.
    #[serde(skip)]
    pub hash_patches: BTreeMap<u64, Vec<u8>>,
}

/// The volume whose verification is corrected.
pub struct Volume<'a> {
    /// Data device.
    pub data: &'a dyn BlockDevice,
    /// Hash device.
    pub hash: &'a dyn BlockDevice,
    /// Parameters.
    pub params: &'a VerityParams,
    /// Tree layout.
    pub layout: &'a TreeLayout,
    /// The trusted root hash.
    pub root: &'a [u8],
}

/// Correct what `report` found corrupt in `v` with `corrector`; see the module docs.
pub fn correct(
    v: &Volume<'_>,
    report: &VerifyReport,
    corrector: &Corrector<'_>,
) -> Result<FecOutcome, FecError> {
    let p = v.params;
    let bs = u64::from(p.data_block_size);
    let first_hash = hash_offset_block(p);
    // Covered index of a data block is its number; of a hash block, after the data.
    let covered_of_hash = |h: u64| (h >= first_hash).then(|| p.data_blocks + h - first_hash);
    let mut data_patches = BTreeMap::new();
    let mut hash_patches = BTreeMap::new();
    let mut symbols = 0;
    let mut now = report.clone();
    for with_erasures in [false, true] {
        if now.ok() || now.root_hash_mismatch {
            break;
        }
        // The data blocks whose digest fails against the tree, as the kernel's erasure pass
        // marks them: it needs the block's hash blocks, and cannot correct one inside a
        // correction, so a block under a still-corrupt hash block is not marked.
        let corrupt_hash: std::collections::BTreeSet<u64> =
            now.corrupt_hash_blocks.iter().copied().collect();
        let path_ok = |d: u64| {
            let bits = v.layout.hashes_per_block_bits;
            (0..v.layout.levels()).all(|l| {
                let abs =
                    v.layout.level_start[l] + d.checked_shr(bits * (l as u32 + 1)).unwrap_or(0);
                !corrupt_hash.contains(&abs)
            })
        };
        let bad: std::collections::BTreeSet<u64> = now
            .corrupt_data_blocks
            .iter()
            .copied()
            .filter(|&d| path_ok(d))
            .collect();
        let is_bad = |d: u64, _: &[u8]| bad.contains(&d);
        let pass: Option<super::correct::IsBad<'_>> = with_erasures.then_some(&is_bad);
        // The kernel's FEC reads hash blocks through the cache its corrections went to, and
        // data blocks from the device.
        let hash_view = Patched::new(v.hash, bs, hash_patches.clone());
        let corrector = corrector.over(v.data, &hash_view);
        for &d in &now.corrupt_data_blocks {
            if let Some((bytes, n)) = corrector.decode_pass(d, pass)? {
                data_patches.insert(d, bytes);
                symbols += n;
            }
        }
        for &h in &now.corrupt_hash_blocks {
            if let Some(c) = covered_of_hash(h) {
                if let Some((bytes, n)) = corrector.decode_pass(c, pass)? {
                    hash_patches.insert(h, bytes);
                    symbols += n;
                }
            }
        }
        let data = Patched::new(v.data, bs, data_patches.clone());
        let hash = Patched::new(v.hash, bs, hash_patches.clone());
        now = verify(&data, &hash, p, v.layout, v.root)?;
        // A rebuilt block that still fails was miscorrected: drop it, the next pass (or the
        // caller) sees it as corrupt.
        data_patches.retain(|b, _| !now.corrupt_data_blocks.contains(b));
        hash_patches.retain(|b, _| !now.corrupt_hash_blocks.contains(b));
    }
    let damaged_parity_blocks = if now.ok() {
        let data = Patched::new(v.data, bs, data_patches.clone());
        let hash = Patched::new(v.hash, bs, hash_patches.clone());
        corrector.damaged_parity(&data, &hash)?
    } else {
        Vec::new()
    };
    Ok(FecOutcome {
        damaged_parity_blocks,
        corrected_data_blocks: data_patches.keys().copied().collect(),
        corrected_hash_blocks: hash_patches.keys().copied().collect(),
        symbols_corrected: symbols,
        after: now,
        data_patches,
        hash_patches,
    })
}

/// Write `outcome`'s rebuilt blocks back into `data` and `hash`, each flushed: a block is
/// written only after the volume verified with it in place, and rewriting a block with its
/// verified contents is idempotent, so a crash leaves every block old or repaired and a second
/// run repairs the rest.
///
/// A damaged FEC area of a volume that verifies is then computed again from it and written
/// over (undamaged parity is rewritten with the same bytes).
pub fn write_back(
    outcome: &FecOutcome,
    v: &Volume<'_>,
    corrector: &Corrector<'_>,
    fec: &dyn BlockDevice,
) -> Result<(), FecError> {
    let block = u64::from(v.params.data_block_size);
    for (b, bytes) in &outcome.data_patches {
        v.data.write_at(bytes, b * block)?;
    }
    v.data.flush()?;
    for (b, bytes) in &outcome.hash_patches {
        v.hash.write_at(bytes, b * block)?;
    }
    v.hash.flush()?;
    if outcome.after.ok() && !outcome.damaged_parity_blocks.is_empty() {
        corrector.rewrite_parity(v.data, v.hash, fec)?;
    }
    Ok(())
}
