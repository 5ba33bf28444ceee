//! The journal of mode J, as the kernel keeps it: the whole journal area in memory, entries
//! filled by writes, sections committed to disk with the kernel's commit ids (`integrity_commit`,
//! `write_journal`), then copied in place (`do_journal_write`, `integrity_writer`), and cleaned
//! on a clean stop (`init_journal` from `dm_integrity_postsuspend`).
//!
//! Locking: `state` guards the in-memory journal and its positions and is held only for memory
//! work; `commit_lock` serialises commits and `writer_lock` write-backs, both of which do their
//! I/O with `state` released (committed sections are never changed until they are freed).

use super::device::Inner;
use super::rw_meta::{Layout, JOURNAL_BLOCK_SECTORS, JOURNAL_SECTOR_DATA};
use crate::block::{BlockError, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// `N_COMMIT_IDS`.
pub const N_COMMIT_IDS: u8 = 4;

/// The kernel's commit ids (`create_journal` without journal encryption).
const COMMIT_IDS: [u64; 4] = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x3333_3333_3333_3333,
    0x4444_4444_4444_4444,
];

/// `dm_integrity_commit_id`: the commit id of sector `j` of section `i` in sequence `seq`.
pub fn commit_id(i: u32, j: u32, seq: u8) -> u64 {
    COMMIT_IDS[usize::from(seq % N_COMMIT_IDS)] ^ ((u64::from(i) << 32) ^ u64::from(j))
}

/// `next_commit_seq`.
pub fn next_seq(s: u8) -> u8 {
    (s + 1) % N_COMMIT_IDS
}

/// `prev_commit_seq`.
pub fn prev_seq(s: u8) -> u8 {
    (s + N_COMMIT_IDS - 1) % N_COMMIT_IDS
}

/// Byte offsets inside the in-memory journal.
#[derive(Debug, Clone, Copy)]
pub struct JournalMap<'a>(pub &'a Layout);

impl JournalMap<'_> {
    /// Offset of sector `j` of section `i`.
    pub fn sector(&self, i: u32, j: u32) -> usize {
        (i as usize * self.0.journal_section_sectors as usize + j as usize) * 512
    }
    /// Offset of entry `n` of section `i` (`access_journal_entry`).
    pub fn entry(&self, i: u32, n: u32) -> usize {
        self.sector(i, n % JOURNAL_BLOCK_SECTORS as u32)
            + (n / JOURNAL_BLOCK_SECTORS as u32) as usize * self.0.journal_entry_size as usize
    }
    /// Offset of the data of entry `n` of section `i` (`access_journal_data`).
    pub fn data(&self, i: u32, n: u32) -> usize {
        self.sector(i, (n << self.0.log2_spb) + JOURNAL_BLOCK_SECTORS as u32)
    }
    /// Offset of the tag of entry `n` of section `i`.
    pub fn tag(&self, i: u32, n: u32) -> usize {
        self.entry(i, n) + 8 + 8 * self.0.spb() as usize
    }
}

/// Whether the entry at `off` is unused (`sector_hi == -1`).
pub fn entry_unused(mem: &[u8], off: usize) -> bool {
    mem[off + 4..off + 8] == [0xff; 4]
}

/// Mark the entry at `off` unused.
pub fn set_entry_unused(mem: &mut [u8], off: usize) {
    mem[off + 4..off + 8].fill(0xff);
}

/// The sector of the entry at `off`.
pub fn entry_sector(mem: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&mem[off..off + 8]);
    u64::from_le_bytes(b)
}

/// Copy the data of entry (`i`, `n`) out of the journal into `out` (one block), putting back
/// the last 8 bytes of each sector that the commit ids displaced (`restore_last_bytes`).
pub fn read_entry_data(l: &Layout, mem: &[u8], i: u32, n: u32, out: &mut [u8]) {
    let m = JournalMap(l);
    let d = m.data(i, n);
    let e = m.entry(i, n);
    out.copy_from_slice(&mem[d..d + l.block_size()]);
    for s in 0..l.spb() as usize {
        let lb = e + 8 + 8 * s;
        out[s * 512 + JOURNAL_SECTOR_DATA..(s + 1) * 512].copy_from_slice(&mem[lb..lb + 8]);
    }
}

/// Fill sections [`start`, `start + n`) (wrapping) as `init_journal` does: zeroed, commit ids
/// of `seq`, every entry unused.
pub fn init_sections(l: &Layout, mem: &mut [u8], start: u32, n: u32, seq: u8) {
    let m = JournalMap(l);
    for k in 0..n {
        let i = (start + k) % l.journal_sections;
        for j in 0..l.journal_section_sectors {
            let o = m.sector(i, j);
            mem[o..o + JOURNAL_SECTOR_DATA].fill(0);
            mem[o + JOURNAL_SECTOR_DATA..o + 512]
                .copy_from_slice(&commit_id(i, j, seq).to_le_bytes());
        }
        for e in 0..l.journal_section_entries {
            set_entry_unused(mem, m.entry(i, e));
        }
    }
}

/// Write sections [`start`, `start + n`) of `mem` to the device (two writes if they wrap), then
/// flush (`write_journal`, whose writes are FUA).
pub fn write_sections(inner: &Inner, mem: &[u8], start: u32, n: u32) -> Result<()> {
    let l = &inner.layout;
    let ss = l.journal_section_sectors as usize * 512;
    let to_end = (l.journal_sections - start).min(n);
    let a = start as usize * ss;
    inner.lower.write_at(
        &mem[a..a + to_end as usize * ss],
        l.journal_offset() + a as u64,
    )?;
    if n > to_end {
        inner
            .lower
            .write_at(&mem[..(n - to_end) as usize * ss], l.journal_offset())?;
    }
    inner.lower.flush()
}

/// The positions and contents of the journal.
pub struct JState {
    /// The journal area.
    pub mem: Vec<u8>,
    /// Commit sequence of the next commit.
    pub commit_seq: u8,
    /// First committed section not yet written in place.
    pub committed_section: u32,
    /// Committed sections not yet written in place.
    pub n_committed: u32,
    /// First section not yet committed.
    pub uncommitted_section: u32,
    /// Full sections not yet committed.
    pub n_uncommitted: u32,
    /// Section being filled.
    pub free_section: u32,
    /// Next entry of that section.
    pub free_section_entry: u32,
    /// Entries free.
    pub free_sectors: u32,
    /// The newest journal entry (global position) of each logical block.
    pub newest: NewestMap,
    /// Whether anything was committed since open.
    pub wrote_to_journal: bool,
    /// When the oldest uncommitted write entered the journal.
    pub dirty_since: Option<Instant>,
}

impl JState {
    /// A journal continuing at `section` with `seq`, everything free.
    pub fn new(l: &Layout, mem: Vec<u8>, section: u32, seq: u8) -> JState {
        JState {
            mem,
            commit_seq: seq,
            committed_section: section,
            n_committed: 0,
            uncommitted_section: section,
            n_uncommitted: 0,
            free_section: section,
            free_section_entry: 0,
            free_sectors: l.journal_entries(),
            newest: NewestMap::default(),
            wrote_to_journal: false,
            dirty_since: None,
        }
    }
}

/// Buffers of the write-back: the committed sections, and one run's tags.
#[derive(Default)]
pub struct WriterBufs {
    /// Committed sections, at their offsets in the journal.
    pub snap: Vec<u8>,
    /// A run's tags.
    pub tags: Vec<u8>,
}

/// A hasher for block numbers (a multiplicative mix: block numbers are not adversarial, and
/// SipHash showed up in profiles of mode J).
#[derive(Default, Clone, Copy)]
pub struct BlockHasher(u64);

impl std::hash::Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Block number -> newest journal position.
pub type NewestMap = HashMap<u64, u32, std::hash::BuildHasherDefault<BlockHasher>>;

/// The journal of an open device.
pub struct Journal {
    /// In-memory journal and positions.
    pub state: Mutex<JState>,
    /// Signalled when sections are freed.
    pub room: Condvar,
    /// Serialises commits; holds the buffer the sections being committed are copied to.
    pub commit_lock: Mutex<Vec<u8>>,
    /// Serialises write-backs; holds their reusable buffers (allocated once: fresh large
    /// allocations cost a page fault per page).
    pub writer_lock: Mutex<WriterBufs>,
    /// `free_sectors_threshold`: commit and write back when this few entries are free.
    pub threshold: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Journal {
    /// A journal in `state`, with the kernel's threshold for `watermark` percent.
    pub fn new(l: &Layout, state: JState, watermark: u32) -> Journal {
        let entries = u64::from(l.journal_entries());
        let threshold = ((entries * u64::from(100 - watermark.min(100)) + 50) / 100) as u32;
        Journal {
            state: Mutex::new(state),
            room: Condvar::new(),
            commit_lock: Mutex::new(Vec::new()),
            writer_lock: Mutex::new(WriterBufs::default()),
            threshold,
        }
    }

    /// Lock the state.
    pub fn lock(&self) -> MutexGuard<'_, JState> {
        lock(&self.state)
    }
}

/// A write of `data` (whole blocks, `tags` computed) at logical `sector` into the journal.
pub fn journal_write(
    inner: &Inner,
    j: &Journal,
    mut sector: u64,
    data: &[u8],
    tags: &[u8],
) -> Result<()> {
    let l = &inner.layout;
    let bs = l.block_size();
    let ts = l.tag_size as usize;
    let m = JournalMap(l);
    let blocks = data.len() / bs;
    let mut done = 0usize;
    while done < blocks {
        let mut st = j.lock();
        if st.free_sectors == 0 {
            drop(st);
            commit(inner, j)?;
            writeback(inner, j)?;
            continue;
        }
        let n = (blocks - done).min(st.free_sectors as usize);
        st.free_sectors -= n as u32;
        for k in done..done + n {
            let (i, e) = (st.free_section, st.free_section_entry);
            let eo = m.entry(i, e);
            let d = m.data(i, e);
            let mem = &mut st.mem;
            mem[d..d + bs].copy_from_slice(&data[k * bs..(k + 1) * bs]);
            for s in 0..l.spb() as usize {
                let from = d + s * 512 + JOURNAL_SECTOR_DATA;
                mem.copy_within(from..from + 8, eo + 8 + 8 * s);
            }
            let t = m.tag(i, e);
            mem[t..t + ts].copy_from_slice(&tags[k * ts..(k + 1) * ts]);
            mem[eo..eo + 8].copy_from_slice(&sector.to_le_bytes());
            let pos = i * l.journal_section_entries + e;
            st.newest.insert(sector >> l.log2_spb, pos);
            sector += l.spb();
            st.free_section_entry += 1;
            if st.free_section_entry == l.journal_section_entries {
                st.free_section_entry = 0;
                st.free_section = (st.free_section + 1) % l.journal_sections;
                st.n_uncommitted += 1;
            }
        }
        if st.dirty_since.is_none() {
            st.dirty_since = Some(Instant::now());
        }
        let full = st.free_sectors <= j.threshold;
        drop(st);
        done += n;
        if full && !inner.kick_background() {
            commit(inner, j)?;
            writeback_if_below(inner, j)?;
        }
    }
    Ok(())
}

/// Write the journal back in place if it is filled beyond the watermark (`integrity_commit`
/// queues the writer then).
pub fn writeback_if_below(inner: &Inner, j: &Journal) -> Result<()> {
    let below = j.lock().free_sectors <= j.threshold;
    if below {
        writeback(inner, j)?;
    }
    Ok(())
}

/// `integrity_commit`: pad the section being filled, stamp the commit ids of every uncommitted
/// section, write them and flush. (The write-back below the watermark is the caller's:
/// [`writeback_if_below`].)
pub fn commit(inner: &Inner, j: &Journal) -> Result<()> {
    let l = &inner.layout;
    let mut guard = lock(&j.commit_lock);
    let (start, n) = {
        let mut st = j.lock();
        // pad_uncommitted
        if st.free_section_entry != 0 {
            let pad = l.journal_section_entries - st.free_section_entry;
            st.free_sectors -= pad;
            st.free_section_entry = 0;
            st.free_section = (st.free_section + 1) % l.journal_sections;
            st.n_uncommitted += 1;
        }
        let (start, n) = (st.uncommitted_section, st.n_uncommitted);
        if n == 0 {
            st.dirty_since = None;
            return Ok(());
        }
        st.wrote_to_journal = true;
        let m = JournalMap(l);
        let mut i = start;
        for _ in 0..n {
            for s in 0..l.journal_section_sectors {
                let o = m.sector(i, s) + JOURNAL_SECTOR_DATA;
                let id = commit_id(i, s, st.commit_seq);
                st.mem[o..o + 8].copy_from_slice(&id.to_le_bytes());
            }
            i += 1;
            if i >= l.journal_sections {
                st.commit_seq = next_seq(st.commit_seq);
                i = 0;
            }
        }
        st.dirty_since = None;
        let ss = l.journal_section_sectors as usize * 512;
        let bytes = &mut *guard;
        bytes.clear();
        for k in 0..n {
            let i = ((start + k) % l.journal_sections) as usize;
            bytes.extend_from_slice(&st.mem[i * ss..(i + 1) * ss]);
        }
        (start, n)
    };
    let bytes = &*guard;
    // The sections copied out hold exactly what was stamped; write them where they belong.
    let ss = l.journal_section_sectors as usize * 512;
    let to_end = (l.journal_sections - start).min(n) as usize;
    let res = inner
        .lower
        .write_at(
            &bytes[..to_end * ss],
            l.journal_offset() + (start as usize * ss) as u64,
        )
        .and_then(|()| {
            if (n as usize) > to_end {
                inner
                    .lower
                    .write_at(&bytes[to_end * ss..], l.journal_offset())
            } else {
                Ok(())
            }
        })
        .and_then(|()| inner.lower.flush());
    if let Err(e) = res {
        inner.fail(&e);
        return Err(e);
    }
    {
        let mut st = j.lock();
        st.uncommitted_section = (st.uncommitted_section + n) % l.journal_sections;
        st.n_uncommitted -= n;
        st.n_committed += n;
    }
    inner.stats.journal_commits.fetch_add(1, Ordering::Relaxed);
    drop(guard);
    Ok(())
}

/// `integrity_writer`: write every committed section in place, flush, free the sections.
pub fn writeback(inner: &Inner, j: &Journal) -> Result<()> {
    let l = &inner.layout;
    let mut bufs = lock(&j.writer_lock);
    let bufs = &mut *bufs;
    if bufs.snap.len() != l.journal_bytes() {
        bufs.snap = vec![0u8; l.journal_bytes()];
    }
    let (start, n, skip) = {
        let st = j.lock();
        let (start, n) = (st.committed_section, st.n_committed);
        if n == 0 {
            return Ok(());
        }
        let ss = l.journal_section_sectors as usize * 512;
        let snap = &mut bufs.snap;
        let mut skip = Vec::new();
        let m = JournalMap(l);
        for k in 0..n {
            let i = (start + k) % l.journal_sections;
            let a = i as usize * ss;
            snap[a..a + ss].copy_from_slice(&st.mem[a..a + ss]);
            // "don't write if there is newer committed sector"
            for e in 0..l.journal_section_entries {
                let off = m.entry(i, e);
                if entry_unused(&st.mem, off) {
                    continue;
                }
                let pos = i * l.journal_section_entries + e;
                let block = entry_sector(&st.mem, off) >> l.log2_spb;
                if let Some(&newest) = st.newest.get(&block) {
                    if newest != pos && is_committed(l, &st, newest) {
                        skip.push(pos);
                    }
                }
            }
        }
        (start, n, skip)
    };
    for &pos in &skip {
        let m = JournalMap(l);
        let off = m.entry(
            pos / l.journal_section_entries,
            pos % l.journal_section_entries,
        );
        set_entry_unused(&mut bufs.snap, off);
    }
    let WriterBufs { snap, tags, .. } = bufs;
    if let Err(e) = copy_in_place(inner, snap, start, n, false, tags) {
        inner.fail(&e);
        return Err(e);
    }
    {
        let mut st = j.lock();
        let m = JournalMap(l);
        for k in 0..n {
            let i = (start + k) % l.journal_sections;
            for e in 0..l.journal_section_entries {
                let off = m.entry(i, e);
                if entry_unused(&st.mem, off) {
                    continue;
                }
                let block = entry_sector(&st.mem, off) >> l.log2_spb;
                let pos = i * l.journal_section_entries + e;
                if st.newest.get(&block) == Some(&pos) {
                    st.newest.remove(&block);
                }
                set_entry_unused(&mut st.mem, off);
            }
        }
        st.committed_section = (st.committed_section + n) % l.journal_sections;
        st.n_committed -= n;
        st.free_sectors += n * l.journal_section_entries;
    }
    j.room.notify_all();
    inner
        .stats
        .journal_writebacks
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn is_committed(l: &Layout, st: &JState, pos: u32) -> bool {
    let sec = pos / l.journal_section_entries;
    let rel = (sec + l.journal_sections - st.committed_section) % l.journal_sections;
    rel < st.n_committed
}

/// `do_journal_write`: copy the used entries of sections [`start`, `start + n`) of `mem` to
/// their places, tags first, one data write and one tag write per run of consecutive sectors
/// of one interleave area within a section (its data is contiguous in the journal once the
/// displaced last bytes are put back, in place as the kernel does), then flush. Every entry
/// copied is marked unused in `mem`. With `from_replay`, entries are checked as the kernel
/// checks them on replay (sector alignment, range, tag); a mismatch is an error after the
/// copy, as the kernel marks the device failed.
pub fn copy_in_place(
    inner: &Inner,
    mem: &mut [u8],
    start: u32,
    n: u32,
    from_replay: bool,
    run_tags: &mut Vec<u8>,
) -> Result<()> {
    let l = &inner.layout;
    let m = JournalMap(l);
    let bs = l.block_size();
    let ts = l.tag_size as usize;
    let mut problem: Option<String> = None;
    let mut check = vec![0u8; ts];
    for k in 0..n {
        let i = (start + k) % l.journal_sections;
        // The current run: first logical sector, first entry, entries.
        let mut run: Option<(u64, u32, u32)> = None;
        run_tags.clear();
        for e in 0..l.journal_section_entries {
            let off = m.entry(i, e);
            if entry_unused(mem, off) {
                continue;
            }
            let mut sec = entry_sector(mem, off);
            if from_replay {
                if sec & (l.spb() - 1) != 0 {
                    problem.get_or_insert(format!("invalid sector {sec} in the journal"));
                    sec &= !(l.spb() - 1);
                }
                if sec >= l.provided_data_sectors {
                    set_entry_unused(mem, off);
                    continue;
                }
            }
            // restore_last_bytes, in place
            let d = m.data(i, e);
            for s in 0..l.spb() as usize {
                let lb = off + 8 + 8 * s;
                let to = d + s * 512 + JOURNAL_SECTOR_DATA;
                mem.copy_within(lb..lb + 8, to);
            }
            let t = m.tag(i, e);
            if from_replay {
                inner.tagger.tag(sec, &mem[d..d + bs], &mut check);
                if check[..] != mem[t..t + ts] {
                    problem.get_or_insert(format!(
                        "tag mismatch when replaying the journal, at sector {sec}"
                    ));
                }
                inner.stats.replayed_blocks.fetch_add(1, Ordering::Relaxed);
            }
            let follows = match run {
                Some((rs, re, rn)) => {
                    e == re + rn
                        && sec == rs + u64::from(rn) * l.spb()
                        && l.area_offset(sec).0 == l.area_offset(rs).0
                }
                None => false,
            };
            if !follows {
                if let Some((rs, re, rn)) = run {
                    let d0 = m.data(i, re);
                    flush_run(inner, rs, &mem[d0..d0 + rn as usize * bs], run_tags)?;
                }
                run_tags.clear();
                run = Some((sec, e, 0));
            }
            if let Some(r) = run.as_mut() {
                r.2 += 1;
            }
            run_tags.extend_from_slice(&mem[t..t + ts]);
            set_entry_unused(mem, off);
        }
        if let Some((rs, re, rn)) = run {
            let d0 = m.data(i, re);
            flush_run(inner, rs, &mem[d0..d0 + rn as usize * bs], run_tags)?;
        }
    }
    inner.lower.flush()?;
    match problem {
        None => Ok(()),
        Some(p) => Err(BlockError::Io {
            device: inner.name.clone(),
            offset: l.journal_offset(),
            source: std::io::Error::other(p),
        }),
    }
}

fn flush_run(inner: &Inner, sector: u64, data: &[u8], tags: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let l = &inner.layout;
    let _r = inner.ranges.lock(sector, (data.len() / 512) as u64);
    inner.lower.write_at(tags, l.tag_offset(sector))?;
    inner.lower.write_at(data, l.data_sector(sector) * 512)
}
