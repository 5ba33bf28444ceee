//! The journal of mode J, as the kernel keeps it: the whole journal area in memory, entries
//! filled by writes, sections committed to disk with the kernel's commit ids (`integrity_commit`,
//! `write_journal`), then copied in place (`do_journal_write`, `integrity_writer`), and cleaned
//! on a clean stop (`init_journal` from `dm_integrity_postsuspend`).
//!
//! Locking: `state` guards the positions and the newest entry of each block; each section's
//! memory has its own lock, taken after `state` (never the other way round). Writers fill the
//! section being filled; commits and write-backs work on full sections, one at a time, with
//! `state` released, so writers go on filling while the journal is written (`commit_lock` and
//! `writer_lock` serialise commits and write-backs).

use super::device::Inner;
pub use super::newest_map::NewestMap;
use super::rw_meta::{Layout, JOURNAL_BLOCK_SECTORS, JOURNAL_SECTOR_DATA};
use crate::block::{Result, TaggedPiece};
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

/// The positions of the journal (its memory is in [`Journal::sections`]).
pub struct JState {
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
    pub fn new(l: &Layout, section: u32, seq: u8) -> JState {
        JState {
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

/// The journal of an open device.
pub struct Journal {
    /// Positions.
    pub state: Mutex<JState>,
    /// Each section's memory, as on disk (offsets of [`JournalMap`] with section 0).
    pub sections: Vec<Mutex<Vec<u8>>>,
    /// Serialises commits.
    pub commit_lock: Mutex<()>,
    /// Serialises write-backs; holds the tags of a run.
    pub writer_lock: Mutex<Vec<u8>>,
    /// `free_sectors_threshold`: commit and write back when this few entries are free.
    pub threshold: u32,
    /// Signalled (with `state`) when a write-back frees sections.
    pub space: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Journal {
    /// A journal in `state` whose memory is `mem` (the whole journal area), with the kernel's
    /// threshold for `watermark` percent.
    pub fn new(l: &Layout, state: JState, mem: Vec<u8>, watermark: u32) -> Journal {
        let entries = u64::from(l.journal_entries());
        let threshold = ((entries * u64::from(100 - watermark.min(100)) + 50) / 100) as u32;
        let ss = l.journal_section_sectors as usize * 512;
        Journal {
            state: Mutex::new(state),
            sections: mem
                .chunks_exact(ss)
                .map(|c| Mutex::new(c.to_vec()))
                .collect(),
            commit_lock: Mutex::new(()),
            writer_lock: Mutex::new(Vec::new()),
            threshold,
            space: Condvar::new(),
        }
    }

    /// Lock the state.
    pub fn lock(&self) -> MutexGuard<'_, JState> {
        lock(&self.state)
    }

    /// Lock section `i`'s memory (with the state locked, or no section of it in use).
    pub fn section(&self, i: u32) -> MutexGuard<'_, Vec<u8>> {
        lock(&self.sections[i as usize])
    }
}

/// Write section `i` (its memory `sec`) to the device.
fn write_section(inner: &Inner, sec: &[u8], i: u32) -> Result<()> {
    let l = &inner.layout;
    inner
        .lower
        .write_at(sec, l.journal_offset() + (i as usize * sec.len()) as u64)
}

/// A write of `data` (whole blocks, `tags` computed) at logical `sector` into the journal.
pub fn journal_write(
    inner: &Inner,
    j: &Journal,
    sector: u64,
    data: &[u8],
    tags: &[u8],
) -> Result<()> {
    let l = &inner.layout;
    let (bs, ts) = (l.block_size(), l.tag_size as usize);
    let blocks = data.len() / bs;
    journal_write_with(inner, j, sector, blocks, &mut |pieces| {
        for p in pieces {
            let b = ((p.offset / 512 - sector) >> l.log2_spb) as usize;
            p.data.copy_from_slice(&data[b * bs..b * bs + p.data.len()]);
            p.tags.copy_from_slice(&tags[b * ts..b * ts + p.tags.len()]);
        }
    })
}

/// A write of `blocks` whole blocks at logical `sector` into the journal, their data and tags
/// produced by `fill` straight into the journal's memory (one piece per section touched).
///
/// As the kernel's `dm_integrity_map_continue`: entries are reserved with the state locked
/// (positions and the newest-entry map), then filled with only their sections locked, so
/// other writers, commits and write-backs are not held up by the copy. A commit or a reader
/// that reaches a section still being filled waits for its lock (the kernel's
/// `journal_entry_is_inprogress` wait).
pub fn journal_write_with(
    inner: &Inner,
    j: &Journal,
    mut sector: u64,
    blocks: usize,
    fill: &mut dyn FnMut(&mut [TaggedPiece<'_>]),
) -> Result<()> {
    let l = &inner.layout;
    let ts = l.tag_size as usize;
    let per_section = l.journal_section_entries;
    let mut done = 0usize;
    while done < blocks {
        let mut st = j.lock();
        if st.free_sectors == 0 {
            inner
                .stats
                .journal_full_waits
                .fetch_add(1, Ordering::Relaxed);
            // The kernel sleeps until the writer frees sections; without a background thread
            // (or if it does not answer in time, e.g. after a failure) do the work here.
            if inner.kick_background() {
                let (g, timeout) = j
                    .space
                    .wait_timeout(st, SPACE_WAIT)
                    .unwrap_or_else(|e| e.into_inner());
                if !timeout.timed_out() || g.free_sectors > 0 {
                    continue;
                }
                drop(g);
            } else {
                drop(st);
            }
            inner.check_failed(sector * 512)?;
            commit(inner, j)?;
            writeback(inner, j)?;
            continue;
        }
        let n = (blocks - done).min(st.free_sectors as usize) as u32;
        st.free_sectors -= n;
        let (first_section, first_entry) = (st.free_section, st.free_section_entry);
        let spans = spans(l, first_entry, n);
        // Lock the sections to fill before the state is released (state, then sections).
        let mut secs: Vec<MutexGuard<'_, Vec<u8>>> = (0..spans.len() as u32)
            .map(|k| j.section((first_section + k) % l.journal_sections))
            .collect();
        // The positions, split where they wrap around the end of the journal.
        let pos = first_section * per_section + first_entry;
        let before_wrap = n.min(l.journal_entries() - pos);
        let block = sector >> l.log2_spb;
        st.newest.insert(block, u64::from(before_wrap), pos);
        st.newest.insert(
            block + u64::from(before_wrap),
            u64::from(n - before_wrap),
            0,
        );
        let next = first_entry + n;
        st.free_section_entry = next % per_section;
        st.free_section = (first_section + next / per_section) % l.journal_sections;
        st.n_uncommitted += next / per_section;
        if st.dirty_since.is_none() {
            st.dirty_since = Some(Instant::now());
        }
        let full = st.free_sectors <= j.threshold;
        drop(st);
        let mut tags = vec![0u8; n as usize * ts];
        // The last section, when this write ends inside it, is where the next writer's
        // reservation begins, and that writer waits for its lock holding the state: fill it
        // first and let it go, so the next writer waits for one section's fill, not this
        // whole write's.
        if spans.len() > 1 && !(first_entry + n).is_multiple_of(per_section) {
            let mut last = secs.pop().expect("more than one section locked");
            let tail = &spans[spans.len() - 1..];
            fill_spans(
                l,
                std::slice::from_mut(&mut last),
                tail,
                sector,
                &mut tags,
                fill,
            );
            drop(last);
        }
        let locked = secs.len();
        fill_spans(l, &mut secs, &spans[..locked], sector, &mut tags, fill);
        drop(secs);
        sector += u64::from(n) * l.spb();
        done += n as usize;
        if full && !inner.kick_background() {
            commit(inner, j)?;
            writeback_if_below(inner, j)?;
        }
    }
    Ok(())
}

/// The entries of one reservation inside one section: the first entry, how many, and how
/// many of the reservation's blocks come before them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    first: u32,
    count: u32,
    placed: u32,
}

/// Cut the `n` entries reserved from `first_entry` of a section into one span per section
/// they touch (contiguous inside each).
fn spans(l: &Layout, first_entry: u32, n: u32) -> Vec<Span> {
    let mut v = Vec::new();
    let mut placed = 0u32;
    let mut first = first_entry;
    while placed < n {
        let count = (l.journal_section_entries - first).min(n - placed);
        v.push(Span {
            first,
            count,
            placed,
        });
        placed += count;
        first = 0;
    }
    v
}

/// Hand `fill` the data of `spans` (one per locked section of `secs`, in order; the
/// reservation's first block at logical `sector`) with their slices of the reservation's
/// `tags`, then finish their entries: the displaced last bytes of each sector, the tag and
/// the sector number, so a section is whole when its lock is released.
fn fill_spans(
    l: &Layout,
    secs: &mut [MutexGuard<'_, Vec<u8>>],
    spans: &[Span],
    sector: u64,
    tags: &mut [u8],
    fill: &mut dyn FnMut(&mut [TaggedPiece<'_>]),
) {
    let m = JournalMap(l);
    let (bs, ts) = (l.block_size(), l.tag_size as usize);
    {
        let mut pieces = Vec::with_capacity(spans.len());
        let mut rest: &mut [u8] = tags;
        let mut at = 0usize;
        for (sec, s) in secs.iter_mut().zip(spans) {
            let from = s.placed as usize * ts;
            let (_, after) = std::mem::take(&mut rest).split_at_mut(from - at);
            let (t, after) = after.split_at_mut(s.count as usize * ts);
            rest = after;
            at = from + t.len();
            let d = m.data(0, s.first);
            pieces.push(TaggedPiece {
                offset: (sector + u64::from(s.placed) * l.spb()) * 512,
                data: &mut sec[d..d + s.count as usize * bs],
                tags: t,
            });
        }
        fill(&mut pieces);
    }
    for (sec, s) in secs.iter_mut().zip(spans) {
        for k in 0..s.count {
            let e = s.first + k;
            let eo = m.entry(0, e);
            let d = m.data(0, e);
            // The last bytes of each sector go to the entry: the commit ids take their place.
            for x in 0..l.spb() as usize {
                let from = d + x * 512 + JOURNAL_SECTOR_DATA;
                sec.copy_within(from..from + 8, eo + 8 + 8 * x);
            }
            let b = (s.placed + k) as usize;
            let t = m.tag(0, e);
            sec[t..t + ts].copy_from_slice(&tags[b * ts..(b + 1) * ts]);
            let block_sector = sector + u64::from(s.placed + k) * l.spb();
            sec[eo..eo + 8].copy_from_slice(&block_sector.to_le_bytes());
        }
    }
}

/// How long a write waits for the background thread to free journal space before doing the
/// commit and write-back itself.
const SPACE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Copy block `pos`'s data out of the journal into `out`, and its tag into `tag` when asked
/// (with the state locked).
pub fn read_block(l: &Layout, j: &Journal, pos: u32, out: &mut [u8], tag: Option<&mut [u8]>) {
    let (i, e) = (
        pos / l.journal_section_entries,
        pos % l.journal_section_entries,
    );
    let sec = j.section(i);
    read_entry_data(l, &sec, 0, e, out);
    if let Some(t) = tag {
        let o = JournalMap(l).tag(0, e);
        t.copy_from_slice(&sec[o..o + t.len()]);
    }
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
    let guard = lock(&j.commit_lock);
    let todo: Vec<(u32, u8)> = {
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
        st.dirty_since = None;
        if n == 0 {
            return Ok(());
        }
        st.wrote_to_journal = true;
        let mut todo = Vec::with_capacity(n as usize);
        let mut i = start;
        for _ in 0..n {
            todo.push((i, st.commit_seq));
            i += 1;
            if i >= l.journal_sections {
                st.commit_seq = next_seq(st.commit_seq);
                i = 0;
            }
        }
        todo
    };
    // These sections are full: no writer touches them; readers wait for a section's lock.
    let m = JournalMap(l);
    let res = todo
        .iter()
        .try_for_each(|&(i, seq)| {
            let mut sec = j.section(i);
            for s in 0..l.journal_section_sectors {
                let o = m.sector(0, s) + JOURNAL_SECTOR_DATA;
                sec[o..o + 8].copy_from_slice(&commit_id(i, s, seq).to_le_bytes());
            }
            write_section(inner, &sec, i)
        })
        .and_then(|()| inner.lower.flush());
    if let Err(e) = res {
        inner.fail(&e);
        return Err(e);
    }
    {
        let n = todo.len() as u32;
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
    let mut tags = lock(&j.writer_lock);
    let m = JournalMap(l);
    let (start, n) = {
        let st = j.lock();
        (st.committed_section, st.n_committed)
    };
    if n == 0 {
        return Ok(());
    }
    // The used entries of the committed sections, as runs (first block, blocks, first
    // position) of consecutive blocks in consecutive entries. Committed sections are only read
    // by others, so they are scanned with the state unlocked.
    let mut used: Vec<(u64, u64, u32)> = Vec::new();
    for k in 0..n {
        let i = (start + k) % l.journal_sections;
        let sec = j.section(i);
        for e in 0..l.journal_section_entries {
            let off = m.entry(0, e);
            if entry_unused(&sec, off) {
                continue;
            }
            let block = entry_sector(&sec, off) >> l.log2_spb;
            let pos = i * l.journal_section_entries + e;
            match used.last_mut() {
                Some((b, len, p)) if *b + *len == block && *p + *len as u32 == pos => *len += 1,
                _ => used.push((block, 1, pos)),
            }
        }
    }
    // Entries a newer committed entry of the same block makes pointless ("don't write if
    // there is newer committed sector"); a run still newest as a whole has none.
    let skip: Vec<u32> = {
        let st = j.lock();
        let mut skip = Vec::new();
        for &(block, len, pos) in &used {
            if st.newest.maps_run(block, len, pos) {
                continue;
            }
            for k in 0..len {
                let p = pos + k as u32;
                if let Some(newest) = st.newest.get(block + k) {
                    if newest != p && is_committed(l, &st, newest) {
                        skip.push(p);
                    }
                }
            }
        }
        skip
    };
    let mut problem = None;
    let res = (0..n).try_for_each(|k| {
        let i = (start + k) % l.journal_sections;
        let mut sec = j.section(i);
        for &pos in skip.iter().filter(|&&p| p / l.journal_section_entries == i) {
            set_entry_unused(&mut sec, m.entry(0, pos % l.journal_section_entries));
        }
        copy_section(inner, &mut sec, false, &mut tags, &mut problem)
    });
    if let Err(e) = res.and_then(|()| inner.lower.flush()) {
        inner.fail(&e);
        return Err(e);
    }
    {
        let mut st = j.lock();
        for (block, len, pos) in used {
            st.newest.remove_run(block, len, pos);
        }
        st.committed_section = (st.committed_section + n) % l.journal_sections;
        st.n_committed -= n;
        st.free_sectors += n * l.journal_section_entries;
    }
    j.space.notify_all();
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

/// Re-initialise every section as `dm_integrity_postsuspend` does after the last write-back:
/// from `free_section` on with `commit_seq`, before it with the next sequence; then write them.
pub fn clean_stop(inner: &Inner, j: &Journal) -> Result<()> {
    let l = &inner.layout;
    let st = j.lock();
    if !st.wrote_to_journal {
        return Ok(());
    }
    let (fs, seq) = (st.free_section, st.commit_seq);
    for i in 0..l.journal_sections {
        let s = if i >= fs { seq } else { next_seq(seq) };
        let mut sec = j.section(i);
        init_sections(l, &mut sec, 0, 1, s);
        // init_sections stamps the ids of section 0: put this section's.
        let m = JournalMap(l);
        for x in 0..l.journal_section_sectors {
            let o = m.sector(0, x) + JOURNAL_SECTOR_DATA;
            sec[o..o + 8].copy_from_slice(&commit_id(i, x, s).to_le_bytes());
        }
        write_section(inner, &sec, i)?;
    }
    inner.lower.flush()
}

/// `do_journal_write` for one section (`sec`, its memory): copy its used entries to their
/// places, tags first, one data write and one tag write per run of consecutive sectors of one
/// interleave area (the run's data is contiguous in the section once the displaced last bytes
/// are put back, in place as the kernel does). Every entry copied is marked unused. With
/// `from_replay`, entries are checked as the kernel checks them on replay (sector alignment,
/// range, tag): the first problem is left in `problem` (the kernel marks the device failed).
pub fn copy_section(
    inner: &Inner,
    sec: &mut [u8],
    from_replay: bool,
    run_tags: &mut Vec<u8>,
    problem: &mut Option<String>,
) -> Result<()> {
    let l = &inner.layout;
    let m = JournalMap(l);
    let bs = l.block_size();
    let ts = l.tag_size as usize;
    let mut check = vec![0u8; ts];
    // The current run: first logical sector, first entry, entries.
    let mut run: Option<(u64, u32, u32)> = None;
    run_tags.clear();
    for e in 0..l.journal_section_entries {
        let off = m.entry(0, e);
        if entry_unused(sec, off) {
            continue;
        }
        let mut s0 = entry_sector(sec, off);
        if from_replay {
            if s0 & (l.spb() - 1) != 0 {
                problem.get_or_insert(format!("invalid sector {s0} in the journal"));
                s0 &= !(l.spb() - 1);
            }
            if s0 >= l.provided_data_sectors {
                set_entry_unused(sec, off);
                continue;
            }
        }
        // restore_last_bytes, in place
        let d = m.data(0, e);
        for s in 0..l.spb() as usize {
            let lb = off + 8 + 8 * s;
            sec.copy_within(lb..lb + 8, d + s * 512 + JOURNAL_SECTOR_DATA);
        }
        let t = m.tag(0, e);
        if from_replay {
            let tagger = inner.tagger.as_ref();
            if let Some(h) = tagger {
                h.tag(s0, &sec[d..d + bs], &mut check);
            }
            if tagger.is_some() && check[..] != sec[t..t + ts] {
                problem.get_or_insert(format!(
                    "tag mismatch when replaying the journal, at sector {s0}"
                ));
            }
            inner.stats.replayed_blocks.fetch_add(1, Ordering::Relaxed);
        }
        let follows = match run {
            Some((rs, re, rn)) => {
                e == re + rn
                    && s0 == rs + u64::from(rn) * l.spb()
                    && l.area_offset(s0).0 == l.area_offset(rs).0
            }
            None => false,
        };
        if !follows {
            if let Some((rs, re, rn)) = run {
                let d0 = m.data(0, re);
                flush_run(inner, rs, &sec[d0..d0 + rn as usize * bs], run_tags)?;
            }
            run_tags.clear();
            run = Some((s0, e, 0));
        }
        if let Some(r) = run.as_mut() {
            r.2 += 1;
        }
        run_tags.extend_from_slice(&sec[t..t + ts]);
        set_entry_unused(sec, off);
    }
    if let Some((rs, re, rn)) = run {
        let d0 = m.data(0, re);
        flush_run(inner, rs, &sec[d0..d0 + rn as usize * bs], run_tags)?;
    }
    Ok(())
}

fn flush_run(inner: &Inner, sector: u64, data: &[u8], tags: &[u8]) -> Result<()> {
    let l = &inner.layout;
    let _r = inner.ranges.lock(sector, (data.len() / 512) as u64);
    inner
        .tag_cache
        .write(&*inner.lower, l.tag_offset(sector), tags)?;
    inner.lower.write_at(data, l.data_sector(sector) * 512)
}
