//! Offline scrub: recompute the tag of every provided block and compare it with the tag
//! area, on all cores, reading metadata runs and data together in large sequential reads
//! (the next chunk is read while the current one is hashed).
//!
//! What the on-disk state says beside the tags is taken into account: entries waiting in
//! the journal (the kernel replays them on open, so a mismatch there is stale, not corrupt),
//! a dirty bitmap (bitmap mode after an unclean stop: the kernel recalculates the marked
//! regions) and a recalculation in progress (blocks from `recalc_sector` on are not checked
//! by the kernel either).

use super::error::{IntegrityError, Result};
use super::geometry::{Area, Geometry, BITMAP_BLOCK_SIZE};
use super::journal_layout::{
    decode_entry, section_bytes, section_commit_seq, summarize, EntryState,
};
use super::superblock::{Superblock, SB_FLAG_DIRTY_BITMAP, SB_FLAG_RECALCULATING};
use super::tags::TagHasher;
use crate::block::aligned::AlignedBuf;
use crate::block::BlockDevice;
use std::collections::BTreeSet;

/// Bytes read per chunk.
pub const CHUNK_BYTES: u64 = 32 << 20;

/// What the journal area holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum JournalState {
    /// Every entry unused: nothing to replay.
    Clean,
    /// Entries waiting to be written in place (the kernel replays committed ones on open).
    Pending {
        /// Used entries.
        entries: u64,
        /// Their logical sectors (committed sections only).
        sectors: Vec<u64>,
    },
    /// Bitmap mode with the dirty flag: the area holds the bitmap.
    DirtyBitmap {
        /// Bitmap bits set.
        dirty_bits: u64,
    },
    /// The journal does not parse (a garbage commit id, ...).
    Unreadable {
        /// Why.
        reason: String,
    },
}

/// The result of a scrub.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Blocks whose tag was checked.
    pub blocks_checked: u64,
    /// Logical sectors (block starts) whose tag does not match and nothing explains.
    pub bad_sectors: Vec<u64>,
    /// Mismatches explained by the journal or the dirty bitmap (the kernel fixes them on
    /// open).
    pub stale_sectors: Vec<u64>,
    /// Not checked: a recalculation is in progress from this sector on.
    pub unchecked_from: Option<u64>,
    /// The journal area.
    pub journal: JournalState,
}

impl VerifyReport {
    /// Whether nothing is corrupt: no bad block, and a journal the kernel can replay (with a
    /// garbage commit id the kernel fails the device on open).
    pub fn clean(&self) -> bool {
        self.bad_sectors.is_empty() && !matches!(self.journal, JournalState::Unreadable { .. })
    }
}

/// One read: a device range holding whole areas, or a piece of one large area (its tags
/// and a part of its data, read separately).
#[derive(Debug, Clone, Copy)]
enum Piece {
    /// Areas `first..first + count`, contiguous from the first's metadata run to the last's
    /// data end.
    Areas { first: u64, count: u64 },
    /// Blocks `k0..k0 + n` of area `area`.
    Part { area: u64, k0: u64, n: u64 },
}

fn pieces(g: &Geometry) -> Vec<Piece> {
    let period = (g.interleave_sectors() + g.metadata_run_sectors()) * 512;
    let areas = g.areas();
    let mut v = Vec::new();
    if period <= CHUNK_BYTES && !g.has_meta_device() {
        let per = (CHUNK_BYTES / period).max(1);
        let mut a = 0;
        while a < areas {
            let count = per.min(areas - a);
            v.push(Piece::Areas { first: a, count });
            a += count;
        }
    } else {
        let bs = u64::from(g.sector_size());
        let per = (CHUNK_BYTES / bs).max(1);
        for a in 0..areas {
            let blocks = g.area(a).data_sectors / u64::from(g.sectors_per_block());
            let mut k = 0;
            while k < blocks {
                let n = per.min(blocks - k);
                v.push(Piece::Part { area: a, k0: k, n });
                k += n;
            }
        }
    }
    v
}

/// The bytes of a piece read from the device: for each area part, its tags and its data.
struct Loaded {
    buf: AlignedBuf,
    tags_buf: AlignedBuf,
    /// (area, first block in area, blocks, tag bytes offset in buf or tags_buf, data offset)
    parts: Vec<(Area, u64, u64, usize, usize, bool)>,
}

fn load(
    dev: &dyn BlockDevice,
    meta: &dyn BlockDevice,
    g: &Geometry,
    piece: Piece,
    mut buf: AlignedBuf,
    mut tags_buf: AlignedBuf,
) -> Result<Loaded> {
    let ts = u64::from(g.tag_size());
    let spb = u64::from(g.sectors_per_block());
    let mut parts = Vec::new();
    match piece {
        Piece::Areas { first, count } => {
            let a0 = g.area(first);
            let last = g.area(first + count - 1);
            let start = a0.metadata_start * 512;
            let end = (last.data_start + last.data_sectors) * 512;
            let len = (end - start) as usize;
            dev.read_at(buf.get(len), start)?;
            for a in first..first + count {
                let area = g.area(a);
                let n = area.data_sectors / spb;
                parts.push((
                    area,
                    0,
                    n,
                    (area.metadata_start * 512 - start) as usize,
                    (area.data_start * 512 - start) as usize,
                    false,
                ));
            }
        }
        Piece::Part { area, k0, n } => {
            let area = g.area(area);
            let bs = u64::from(g.sector_size());
            let t0 = area.metadata_start * 512 + k0 * ts;
            let t1 = t0 + n * ts;
            let r0 = t0 / 4096 * 4096;
            let r1 = t1.div_ceil(4096) * 4096;
            let r1 = r1.min(meta.size());
            let tlen = (r1 - r0) as usize;
            meta.read_at(tags_buf.get(tlen), r0)?;
            let d0 = (area.data_start + k0 * spb) * 512;
            let dlen = (n * bs) as usize;
            dev.read_at(buf.get(dlen), d0)?;
            parts.push((area, k0, n, (t0 - r0) as usize, 0, true));
        }
    }
    Ok(Loaded {
        buf,
        tags_buf,
        parts,
    })
}

/// Compare the tags of a loaded piece; mismatching logical sectors go to `bad`.
fn check(g: &Geometry, h: &TagHasher, l: &Loaded, threads: usize, bad: &mut Vec<u64>) {
    let ts = g.tag_size() as usize;
    let bs = g.sector_size() as usize;
    let spb = u64::from(g.sectors_per_block());
    let raw = l.buf.as_slice();
    let traw = l.tags_buf.as_slice();
    // Every block of the piece as (logical sector, data, stored tag), split over threads by
    // contiguous ranges of the parts' blocks.
    let total: u64 = l.parts.iter().map(|p| p.2).sum();
    let threads = threads.clamp(1, total.div_ceil(64).max(1) as usize);
    let per = total.div_ceil(threads as u64);
    let run = |from: u64, to: u64| -> Vec<u64> {
        let mut out = Vec::new();
        let mut idx = 0u64;
        let mut computed = vec![0u8; 256 * ts];
        for &(area, k0, n, toff, doff, separate) in &l.parts {
            let (p0, p1) = (idx, idx + n);
            idx = p1;
            let a = from.max(p0);
            let b = to.min(p1);
            if a >= b {
                continue;
            }
            let mut k = a - p0;
            while k < b - p0 {
                let m = (b - p0 - k).min(256);
                let data = &raw[doff + k as usize * bs..doff + (k + m) as usize * bs];
                let first_sector = area.first_logical + (k0 + k) * spb;
                h.tag_blocks(first_sector, data, &mut computed[..m as usize * ts]);
                let src = if separate { traw } else { raw };
                let stored = &src[toff + k as usize * ts..toff + (k + m) as usize * ts];
                if stored != &computed[..m as usize * ts] {
                    for i in 0..m as usize {
                        if stored[i * ts..(i + 1) * ts] != computed[i * ts..(i + 1) * ts] {
                            out.push(first_sector + i as u64 * spb);
                        }
                    }
                }
                k += m;
            }
        }
        out
    };
    if threads == 1 {
        bad.extend(run(0, total));
        return;
    }
    let results: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let run = &run;
                s.spawn(move || run(t * per, ((t + 1) * per).min(total)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for r in results {
        bad.extend(r);
    }
}

/// Whether the journal or bitmap explains a mismatch at a logical sector.
type Explains = Box<dyn Fn(u64) -> bool + Send + Sync>;

/// Read the journal area and say what it holds; the logical sectors it explains go to
/// `explained` (every sector of a dirty bitmap region, every pending journal entry).
fn journal_state(
    meta: &dyn BlockDevice,
    sb: &Superblock,
    g: &Geometry,
) -> Result<(JournalState, Explains)> {
    let start = g.journal_start_sector() * 512;
    let len = g.journal_sectors() * 512;
    let j = super::superblock::read_aligned(meta, start, len as usize)?;
    if sb.flags & SB_FLAG_DIRTY_BITMAP != 0 {
        let shift = u32::from(sb.log2_blocks_per_bitmap_bit) + g.log2_sectors_per_block();
        let blocks = g.bitmap_blocks(sb.log2_blocks_per_bitmap_bit);
        let bytes = (blocks * BITMAP_BLOCK_SIZE).min(len) as usize;
        let bitmap = j[..bytes].to_vec();
        let dirty_bits = bitmap.iter().map(|b| u64::from(b.count_ones())).sum();
        let test = move |sector: u64| {
            let bit = sector.checked_shr(shift).unwrap_or(0);
            bitmap
                .get((bit / 8) as usize)
                .is_some_and(|b| b & (1 << (bit % 8)) != 0)
        };
        return Ok((JournalState::DirtyBitmap { dirty_bits }, Box::new(test)));
    }
    let summary = match summarize(g, &j) {
        Ok(s) => s,
        Err(e) => {
            return Ok((
                JournalState::Unreadable {
                    reason: e.to_string(),
                },
                Box::new(|_| false),
            ))
        }
    };
    if summary.is_clean() {
        return Ok((JournalState::Clean, Box::new(|_| false)));
    }
    let sb_len = section_bytes(g);
    let mut sectors = BTreeSet::new();
    for i in 0..g.journal_sections() {
        let sec = &j[i as usize * sb_len..(i as usize + 1) * sb_len];
        // Only whole sections (all sectors of one commit) are replayed.
        if !matches!(section_commit_seq(g, sec, i), Ok(Some(_))) {
            continue;
        }
        for e in 0..g.journal_section_entries() {
            if let Ok(entry) = decode_entry(g, sec, e) {
                if let EntryState::Sector(s) = entry.state {
                    sectors.insert(s);
                }
            }
        }
    }
    let list: Vec<u64> = sectors.iter().copied().collect();
    let state = JournalState::Pending {
        entries: summary.used_entries,
        sectors: list,
    };
    Ok((state, Box::new(move |s| sectors.contains(&s))))
}

/// Scrub every provided block of `dev` (tags on `meta`, the same device without a separate
/// metadata device) with `hasher`, on `threads` threads; `progress(done, total)` in blocks.
pub fn verify(
    dev: &dyn BlockDevice,
    meta: &dyn BlockDevice,
    sb: &Superblock,
    g: &Geometry,
    hasher: &TagHasher,
    threads: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    if hasher.tag_size() != g.tag_size() as usize || hasher.block_size() != g.sector_size() as usize
    {
        return Err(IntegrityError::Geometry(format!(
            "tagger for {}-byte tags of {}-byte blocks, the volume has {} and {}",
            hasher.tag_size(),
            hasher.block_size(),
            g.tag_size(),
            g.sector_size()
        )));
    }
    let (journal, explained) = journal_state(meta, sb, g)?;
    let unchecked_from = (sb.flags & SB_FLAG_RECALCULATING != 0
        && sb.recalc_sector < g.provided_data_sectors())
    .then_some(sb.recalc_sector);
    let skip = |s: u64| unchecked_from.is_some_and(|r| s >= r) || explained(s);
    check_samples(dev, meta, g, hasher, &skip)?;
    let total = g.provided_blocks();
    let mut mismatches = Vec::new();
    let mut done = 0u64;
    let list = pieces(g);
    let spb = u64::from(g.sectors_per_block());
    std::thread::scope(|s| -> Result<()> {
        let mut spare = vec![(AlignedBuf::new(0), AlignedBuf::new(0))];
        let mut next = None;
        if let Some(&p) = list.first() {
            let (b, t) = spare
                .pop()
                .unwrap_or((AlignedBuf::new(0), AlignedBuf::new(0)));
            next = Some(s.spawn(move || load(dev, meta, g, p, b, t)));
        }
        for i in 0..list.len() {
            let Some(h) = next.take() else { break };
            let loaded = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            if let Some(&p) = list.get(i + 1) {
                let (b, t) = spare
                    .pop()
                    .unwrap_or_else(|| (AlignedBuf::new(0), AlignedBuf::new(0)));
                next = Some(s.spawn(move || load(dev, meta, g, p, b, t)));
            }
            check(g, hasher, &loaded, threads, &mut mismatches);
            done += loaded.parts.iter().map(|p| p.2).sum::<u64>();
            progress(done.min(total), total);
            spare.push((loaded.buf, loaded.tags_buf));
        }
        Ok(())
    })?;
    mismatches.sort_unstable();
    let mut bad = Vec::new();
    let mut stale = Vec::new();
    for s in mismatches {
        if unchecked_from.is_some_and(|r| s >= r) {
            continue;
        }
        if explained(s) {
            stale.push(s);
        } else {
            bad.push(s);
        }
    }
    let checked = match unchecked_from {
        Some(r) => r.div_ceil(spb),
        None => total,
    };
    Ok(VerifyReport {
        blocks_checked: checked,
        bad_sectors: bad,
        stale_sectors: stale,
        unchecked_from,
        journal,
    })
}

/// Refuse a wrong algorithm or key before the scrub, as `open` does
/// ([`super::samples`]): when every sampled block whose tag should be current (`skip` says
/// which the journal, a dirty bitmap or a recalculation explain) has a bad tag, a scrub would
/// only report the whole device corrupt.
fn check_samples(
    dev: &dyn BlockDevice,
    meta: &dyn BlockDevice,
    g: &Geometry,
    hasher: &TagHasher,
    skip: &dyn Fn(u64) -> bool,
) -> Result<()> {
    let spb = u64::from(g.sectors_per_block());
    let mut sampled = 0;
    for block in super::samples::sample_blocks(g.provided_blocks()) {
        let sector = block * spb;
        if skip(sector) {
            continue;
        }
        let area = if g.has_meta_device() {
            0
        } else {
            sector / g.interleave_sectors()
        };
        let k0 = (sector - g.area(area).first_logical) / spb;
        let piece = Piece::Part { area, k0, n: 1 };
        let loaded = load(dev, meta, g, piece, AlignedBuf::new(0), AlignedBuf::new(0))?;
        let mut bad = Vec::new();
        check(g, hasher, &loaded, 1, &mut bad);
        if bad.is_empty() {
            return Ok(());
        }
        sampled += 1;
    }
    if sampled == 0 {
        return Ok(());
    }
    Err(IntegrityError::WrongKey(super::samples::wrong_key_reason(
        hasher.algorithm().name(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;
    use crate::integrity::format::{plan, write, FormatParams};
    use crate::integrity::tags::TagAlgorithm;

    /// `verify` of a device formatted by `plan`, on `threads` threads, without progress.
    fn scrub(
        data: &dyn BlockDevice,
        meta: &dyn BlockDevice,
        plan: &crate::integrity::format::FormatPlan,
        threads: usize,
    ) -> VerifyReport {
        verify(
            data,
            meta,
            &plan.superblock,
            &plan.geometry,
            plan.hasher.as_ref().expect("an internal hash"),
            threads,
            &mut |_, _| {},
        )
        .unwrap()
    }

    #[test]
    fn finds_exactly_the_flipped_blocks() {
        for (alg, ss, il) in [
            (TagAlgorithm::Crc32c, 512, 0),
            (TagAlgorithm::Sha256, 4096, 8),
            (TagAlgorithm::Sha1, 1024, 64),
        ] {
            let size = 5 << 20;
            let dev = MemoryDevice::new("mem", size);
            let mut p = FormatParams::new(alg);
            p.sector_size = ss;
            p.interleave_sectors = il;
            let plan = plan(&p, size as u64).unwrap();
            write(&dev, None, &plan, &mut |_, _| {}).unwrap();
            let g = &plan.geometry;
            let spb = u64::from(g.sectors_per_block());
            let r = scrub(&dev, &dev, &plan, 3);
            assert!(r.clean(), "{alg}: {r:?}");
            assert_eq!(r.blocks_checked, g.provided_blocks());
            assert_eq!(r.journal, JournalState::Clean);
            // A flipped data bit, a flipped tag bit, in the first, a middle and the last block.
            let last = g.provided_data_sectors() - spb;
            let mid = (g.provided_blocks() / 2) * spb;
            let flip = |off: u64| {
                let mut b = [0u8; 1];
                dev.read_at(&mut b, off).unwrap();
                b[0] ^= 0x10;
                dev.write_at(&b, off).unwrap();
            };
            flip(g.data_physical_sector(0) * 512 + 7);
            flip(g.tag_byte_offset(mid));
            flip(g.data_physical_sector(last) * 512 + u64::from(g.sector_size()) - 1);
            let r = scrub(&dev, &dev, &plan, 2);
            assert_eq!(r.bad_sectors, vec![0, mid, last], "{alg}");
        }
    }

    #[test]
    fn separate_data_device() {
        let meta = MemoryDevice::new("meta", 1 << 20);
        let data = MemoryDevice::new("data", 4 << 20);
        let mut p = FormatParams::new(TagAlgorithm::Sha256);
        p.sector_size = 4096;
        p.data_device_bytes = Some(4 << 20);
        let plan = plan(&p, 1 << 20).unwrap();
        assert!(plan.geometry.has_meta_device());
        assert_eq!(plan.superblock.log2_interleave_sectors, 0);
        assert_eq!(plan.superblock.provided_data_sectors, 8192);
        write(&meta, Some(&data), &plan, &mut |_, _| {}).unwrap();
        let r = scrub(&data, &meta, &plan, 2);
        assert!(r.clean(), "{r:?}");
        assert_eq!(r.blocks_checked, 1024);
        data.write_at(&[1], 4096 * 7 + 9).unwrap();
        let r = scrub(&data, &meta, &plan, 2);
        assert_eq!(r.bad_sectors, vec![56]);
    }

    /// A block whose new data waits in a committed journal section is stale, not corrupt;
    /// the same mismatch without the entry is corrupt.
    #[test]
    fn pending_journal_entries_explain_mismatches() {
        use crate::integrity::journal_layout::{
            encode_entry, init_section, section_bytes, EntryState, JournalEntry,
        };
        let size = 4 << 20;
        let dev = MemoryDevice::new("mem", size);
        let p = FormatParams::new(TagAlgorithm::Crc32c);
        let plan = plan(&p, size as u64).unwrap();
        write(&dev, None, &plan, &mut |_, _| {}).unwrap();
        let g = &plan.geometry;
        // New data at sectors 40 and 41 (not in place yet), the journal holds sector 40.
        dev.write_at(&[0xaa; 1024], g.data_physical_sector(40) * 512)
            .unwrap();
        let mut sec = vec![0u8; section_bytes(g)];
        init_section(g, &mut sec, 0, 1);
        let e = JournalEntry {
            state: EntryState::Sector(40),
            last_bytes: vec![[0xaa; 8]],
            tag: vec![0; 4],
        };
        encode_entry(g, &mut sec, 0, &e);
        dev.write_at(&sec, g.journal_section_start(0) * 512)
            .unwrap();
        let r = scrub(&dev, &dev, &plan, 2);
        assert_eq!(r.stale_sectors, vec![40]);
        assert_eq!(r.bad_sectors, vec![41]);
        assert_eq!(
            r.journal,
            JournalState::Pending {
                entries: 1,
                sectors: vec![40]
            }
        );
        // Garbage commit ids: the journal is unreadable, the mismatches are all corrupt.
        dev.write_at(&[0x55; 8], g.journal_section_start(0) * 512 + 504)
            .unwrap();
        let r = scrub(&dev, &dev, &plan, 2);
        assert!(
            matches!(r.journal, JournalState::Unreadable { .. }),
            "{r:?}"
        );
        assert_eq!(r.bad_sectors, vec![40, 41]);
    }
}
