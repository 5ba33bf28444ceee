//! Mode B: the dirty-region bitmap the kernel keeps at the start of the journal area
//! (`block_bitmap_op`, `bitmap_block_work`, `bitmap_flush_work`). One bit covers
//! `sectors_per_block << log2_blocks_per_bitmap_bit` sectors; bit `k` is bit `k % 8` of byte
//! `k / 8` (the kernel's `unsigned long` bitmaps on a little-endian machine), in 4096-byte
//! blocks written one at a time with FUA.

use super::device::Inner;
use super::rw_meta::{Layout, BITMAP_BLOCK_SIZE};
use crate::block::Result;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// `DEFAULT_SECTORS_PER_BITMAP_BIT`.
pub const DEFAULT_SECTORS_PER_BIT: u64 = 32768;

/// The kernel's `log2_blocks_per_bitmap_bit` for `sectors_per_bit` (the constructor's search:
/// at least one block, and the bitmap must fit the journal area).
pub fn log2_blocks_per_bit(l: &Layout, sectors_per_bit: Option<u64>) -> u32 {
    let mut lg: u32 = match sectors_per_bit {
        None => DEFAULT_SECTORS_PER_BIT.ilog2(),
        Some(0) => 0,
        Some(v) => v.ilog2(),
    };
    if lg < l.log2_spb {
        lg = l.log2_spb;
    }
    let bits_in_journal = ((u64::from(l.journal_section_sectors) * u64::from(l.journal_sections))
        << 12)
        .min(u64::from(u32::MAX));
    if bits_in_journal > 0 {
        while bits_in_journal < (l.provided_data_sectors + (1u64 << lg) - 1) >> lg {
            lg += 1;
        }
    }
    lg - l.log2_spb
}

/// Bits in three bitmaps: what is on disk (`journal`), what may be written without marking
/// (`may_write_bitmap`) and what still needs recalculation (`recalc_bitmap`).
pub struct BState {
    /// The on-disk bitmap (`n_blocks * 4096` bytes).
    pub disk: Vec<u8>,
    /// Regions marked dirty on disk since the last clean.
    pub may_write: Vec<u8>,
    /// Regions whose tags must be recalculated.
    pub recalc: Vec<u8>,
    /// When the first region was marked since the last clean.
    pub dirty_since: Option<Instant>,
}

/// The bitmap of an open device.
pub struct Bitmap {
    /// log2 of sectors per bit.
    pub shift: u32,
    /// `log2_blocks_per_bitmap_bit`.
    pub log2_bpbb: u32,
    /// Bitmap blocks.
    pub n_blocks: usize,
    /// The bits.
    pub state: Mutex<BState>,
}

/// Which operation [`op`] does (`BITMAP_OP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// All bits of the range set?
    TestAllSet,
    /// All bits of the range clear?
    TestAllClear,
    /// Set the bits.
    Set,
    /// Clear the bits.
    Clear,
}

/// `block_bitmap_op` on `bits` for sectors [`sector`, `sector + n`).
pub fn op(bits: &mut [u8], shift: u32, sector: u64, n: u64, what: Op) -> bool {
    if n == 0 {
        return true;
    }
    let first = sector >> shift;
    let last = (sector + n - 1) >> shift;
    for b in first..=last {
        let (byte, mask) = ((b / 8) as usize, 1u8 << (b % 8));
        let Some(v) = bits.get_mut(byte) else {
            return false;
        };
        match what {
            Op::TestAllSet if *v & mask == 0 => return false,
            Op::TestAllClear if *v & mask != 0 => return false,
            Op::Set => *v |= mask,
            Op::Clear => *v &= !mask,
            _ => {}
        }
    }
    true
}

impl Bitmap {
    /// A bitmap for `l` with `log2_bpbb`, all clear.
    pub fn new(l: &Layout, log2_bpbb: u32) -> Bitmap {
        let n_bits =
            ((l.provided_data_sectors >> l.log2_spb) + (1u64 << log2_bpbb) - 1) >> log2_bpbb;
        let n_blocks = n_bits.div_ceil(BITMAP_BLOCK_SIZE as u64 * 8) as usize;
        let bytes = n_blocks * BITMAP_BLOCK_SIZE;
        Bitmap {
            shift: l.log2_spb + log2_bpbb,
            log2_bpbb,
            n_blocks,
            state: Mutex::new(BState {
                disk: vec![0; bytes],
                may_write: vec![0; bytes],
                recalc: vec![0; bytes],
                dirty_since: None,
            }),
        }
    }

    /// Lock the bits.
    pub fn lock(&self) -> MutexGuard<'_, BState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before writing sectors [`sector`, `sector + n`): make sure their regions are marked dirty
    /// on disk (`bitmap_block_work`): set the bits, write the bitmap blocks they are in, flush.
    pub fn mark(&self, inner: &Inner, sector: u64, n: u64) -> Result<()> {
        let mut st = self.lock();
        if op(&mut st.may_write, self.shift, sector, n, Op::TestAllSet) {
            return Ok(());
        }
        op(&mut st.disk, self.shift, sector, n, Op::Set);
        let b0 = ((sector >> self.shift) / (BITMAP_BLOCK_SIZE as u64 * 8)) as usize;
        let b1 = (((sector + n - 1) >> self.shift) / (BITMAP_BLOCK_SIZE as u64 * 8)) as usize;
        let bytes = &st.disk[b0 * BITMAP_BLOCK_SIZE..(b1 + 1) * BITMAP_BLOCK_SIZE];
        inner.lower.write_at(
            bytes,
            inner.layout.journal_offset() + (b0 * BITMAP_BLOCK_SIZE) as u64,
        )?;
        inner.lower.flush()?;
        op(&mut st.may_write, self.shift, sector, n, Op::Set);
        if st.dirty_since.is_none() {
            st.dirty_since = Some(Instant::now());
        }
        Ok(())
    }

    /// Write the whole on-disk bitmap, then flush.
    pub fn write_all(&self, inner: &Inner, st: &BState) -> Result<()> {
        inner
            .lower
            .write_at(&st.disk, inner.layout.journal_offset())?;
        inner.lower.flush()
    }

    /// `bitmap_flush_work`: flush data and tags, wait for every request in flight, flush
    /// again, clear the bits up to `limit` sectors, write the bitmap.
    pub fn clean(&self, inner: &Inner, limit: u64) -> Result<()> {
        inner.flush_lower()?;
        let _all = inner.ranges.lock(0, inner.layout.provided_data_sectors);
        inner.flush_lower()?;
        let mut st = self.lock();
        op(&mut st.disk, self.shift, 0, limit, Op::Clear);
        op(&mut st.may_write, self.shift, 0, limit, Op::Clear);
        st.dirty_since = None;
        self.write_all(inner, &st)
    }
}
