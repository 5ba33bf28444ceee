//! The dm-integrity target: a read-write [`BlockDevice`] whose every block has a tag, checked on
//! each read and written with each write, in the kernel's modes J, B, D and R.
//!
//! Requests are served inline on the calling thread, as the rest of dmkit: no queue and no
//! worker on the data path. Concurrent requests exclude each other only where they overlap (a
//! range lock, the kernel's `in_progress` tree), so a block's data and tag always change
//! together. A read costs two reads of the device per interleave area it touches (the data,
//! then its tags); a write in modes D and B two writes (data, then the run of tags, exactly
//! the bytes that change: no read-modify-write). In mode J, writes go into the in-memory
//! journal and reach the disk at commit (flush, watermark or commit time), then in place.
//!
//! One background thread per device does what the kernel does on timers: the journal's
//! commit after `commit_time`, and mode B's bitmap cleaning after `bitmap_flush_interval`.
//!
//! A tag mismatch is [`BlockError::Corrupt`] with the device name and the block number (in the
//! integrity sector size; with 512-byte sectors this is the kernel's "sector" of its
//! `Checksum failed at sector` message). The kernel answers EILSEQ; dmkit's export answers EIO,
//! so a program reading through FUSE or a loop device sees `EIO` ("Input/output error") for
//! the failing request, and the loop device logs a buffer I/O error for the sector.

use super::bitmap::{self, Bitmap, Op};
use super::journal::{self, init_sections, write_sections, Journal};
use super::replay::{self, ReplayReport};
use super::rw_meta::{
    Layout, Mode, RawSuperblock, SB_FLAG_DIRTY_BITMAP, SB_FLAG_FIXED_HMAC, SB_FLAG_RECALCULATING,
    SB_SECTORS,
};
use super::tag_cache::TagCache;
use super::tags::{TagAlgorithm, TagHasher};
use crate::block::{
    check_range, side_by_side, BlockDevice, BlockError, Result, TaggedBlockDevice, TaggedPiece,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// `RECALC_SECTORS`.
const RECALC_SECTORS: u64 = 32768;

/// How a device is opened (the kernel's table options).
#[derive(Clone)]
pub struct IntegrityOptions {
    /// Name for messages and status.
    pub name: String,
    /// J, B, D or R.
    pub mode: Mode,
    /// The internal hash; `None` for none: the tags come from the layer above (dm-crypt's
    /// authenticated modes), through [`TaggedBlockDevice`].
    pub alg: Option<TagAlgorithm>,
    /// Its key (hmac-sha256 only).
    pub key: Option<Zeroizing<Vec<u8>>>,
    /// `journal_watermark`, percent (mode J).
    pub journal_watermark: u32,
    /// `commit_time`, milliseconds (mode J).
    pub commit_time_ms: u32,
    /// `bitmap_flush_interval`, milliseconds (mode B).
    pub bitmap_flush_ms: u32,
    /// `sectors_per_bit` (mode B); the kernel's default when `None`.
    pub sectors_per_bit: Option<u64>,
    /// Refuse open when every sampled block has a bad tag (a wrong algorithm or key).
    pub check_key: bool,
    /// Let the background thread commit and write back the journal when a write fills it
    /// beyond the watermark (as the kernel's commit and writer work queues do); when false
    /// the writing thread does it (deterministic I/O order, for crash tests).
    pub background_writeback: bool,
}

impl IntegrityOptions {
    /// The kernel's defaults for a device without internal hash, whose tags the layer above
    /// supplies (the integrity target under LUKS2 `--integrity`).
    pub fn external_tags(name: &str, mode: Mode) -> IntegrityOptions {
        IntegrityOptions {
            alg: None,
            check_key: false,
            ..IntegrityOptions::new(name, mode, TagAlgorithm::Crc32c)
        }
    }

    /// The kernel's defaults for `mode` and `alg`.
    pub fn new(name: &str, mode: Mode, alg: TagAlgorithm) -> IntegrityOptions {
        IntegrityOptions {
            name: name.to_string(),
            mode,
            alg: Some(alg),
            key: None,
            journal_watermark: 50,
            commit_time_ms: 10_000,
            bitmap_flush_ms: 10_000,
            sectors_per_bit: None,
            check_key: true,
            background_writeback: true,
        }
    }
}

/// Why a device cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The device or the options are not usable.
    #[error("{0}")]
    Invalid(String),
    /// I/O on the device failed (replay, recalculation, superblock).
    #[error(transparent)]
    Io(#[from] BlockError),
}

/// Counters shown by `dmkit status`.
#[derive(Debug, Default)]
pub struct IntegrityStats {
    /// Blocks whose tag did not match (the kernel's `number_of_mismatches`).
    pub mismatches: AtomicU64,
    /// Blocks read and checked.
    pub blocks_read: AtomicU64,
    /// Blocks written.
    pub blocks_written: AtomicU64,
    /// Journal commits.
    pub journal_commits: AtomicU64,
    /// Journal write-backs in place.
    pub journal_writebacks: AtomicU64,
    /// Writes that found the journal full and waited for a write-back (the kernel's
    /// `sleep_on_endio_wait`): many mean the write-back is the bottleneck.
    pub journal_full_waits: AtomicU64,
    /// Blocks replayed from the journal at open.
    pub replayed_blocks: AtomicU64,
    /// Sectors whose tags were recalculated at open (mode B after an unclean stop).
    pub recalculated_sectors: AtomicU64,
    /// Bitmap cleanings (mode B).
    pub bitmap_cleanings: AtomicU64,
}

impl IntegrityStats {
    /// The counters as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "corruptions": g(&self.mismatches),
            "blocks_read": g(&self.blocks_read),
            "blocks_written": g(&self.blocks_written),
            "journal_commits": g(&self.journal_commits),
            "journal_writebacks": g(&self.journal_writebacks),
            "journal_full_waits": g(&self.journal_full_waits),
            "replayed_blocks": g(&self.replayed_blocks),
            "recalculated_sectors": g(&self.recalculated_sectors),
            "bitmap_cleanings": g(&self.bitmap_cleanings),
        })
    }
}

/// Ranges of logical sectors in use by a request (the kernel's `in_progress` tree).
#[derive(Default)]
pub struct RangeLock {
    held: Mutex<Held>,
    cv: Condvar,
    next: AtomicU64,
}

/// The held ranges (start, end, id), and how many requests wait for one of them to go.
#[derive(Default)]
struct Held {
    ranges: Vec<(u64, u64, u64)>,
    /// Waiters: a release wakes them only when there are some, since a condition variable's
    /// wake is a system call even with nobody waiting (one per request otherwise).
    waiters: usize,
}

/// A held range; released on drop.
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeLock {
    /// Wait until [`start`, `start + n`) overlaps no held range, then hold it.
    pub fn lock(&self, start: u64, n: u64) -> RangeGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let end = start + n;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while held.ranges.iter().any(|&(s, e, _)| s < end && start < e) {
            held.waiters += 1;
            held = self.cv.wait(held).unwrap_or_else(|e| e.into_inner());
            held.waiters -= 1;
        }
        held.ranges.push((start, end, id));
        RangeGuard { lock: self, id }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.lock.held.lock().unwrap_or_else(|e| e.into_inner());
        held.ranges.retain(|&(_, _, id)| id != self.id);
        let wake = held.waiters > 0;
        drop(held);
        if wake {
            self.lock.cv.notify_all();
        }
    }
}

/// Wakes the device's background thread: to stop, or to commit and write back the journal
/// when a write filled it beyond the watermark (the kernel's commit and writer work).
#[derive(Default)]
pub struct Signal {
    m: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Signal {
    fn set(&self, stop: bool) {
        let mut g = self.m.lock().unwrap_or_else(|e| e.into_inner());
        if stop {
            g.0 = true;
        } else {
            g.1 = true;
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Wait up to `t`; returns (stop, kick) and clears the kick.
    fn wait(&self, t: Duration) -> (bool, bool) {
        let mut g = self.m.lock().unwrap_or_else(|e| e.into_inner());
        if !g.0 && !g.1 {
            g = self
                .cv
                .wait_timeout(g, t)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let r = (g.0, g.1);
        g.1 = false;
        r
    }
}

/// The state shared by the device and its timer thread.
pub struct Inner {
    /// Name for messages.
    pub name: String,
    /// The device below.
    pub lower: Arc<dyn BlockDevice>,
    /// Geometry.
    pub layout: Layout,
    /// Mode.
    pub mode: Mode,
    /// The internal hash's tagger; `None` when the layer above supplies the tags.
    pub tagger: Option<TagHasher>,
    /// Range locks.
    pub ranges: RangeLock,
    /// The tag area's pages, as the kernel's dm-bufio keeps them: every tag read and write
    /// goes through it.
    pub tag_cache: TagCache,
    /// The journal (mode J).
    pub journal: Option<Journal>,
    /// The bitmap (mode B).
    pub bitmap: Option<Bitmap>,
    /// The superblock as on disk.
    pub sb: Mutex<RawSuperblock>,
    /// Counters.
    pub stats: Arc<IntegrityStats>,
    /// Set after an I/O error in journal or bitmap upkeep (the kernel's `ic->failed`): every
    /// later request fails, and close leaves the journal for replay.
    failed: AtomicBool,
    commit_time: Duration,
    bitmap_flush: Duration,
    /// The background thread's signal.
    signal: Arc<Signal>,
    /// Whether the background thread runs (else its work is done inline).
    background: AtomicBool,
}

impl Inner {
    /// Ask the background thread to commit and write back; false when there is none (the
    /// caller then does it).
    pub fn kick_background(&self) -> bool {
        if !self.background.load(Ordering::Acquire) {
            return false;
        }
        self.signal.set(false);
        true
    }

    /// The background thread's journal work.
    fn journal_work(&self) {
        if self.failed.load(Ordering::SeqCst) {
            return;
        }
        if let Some(j) = &self.journal {
            if journal::commit(self, j).is_ok() {
                let _ = journal::writeback_if_below(self, j);
            }
        }
    }

    /// Remember that the device failed (`dm_integrity_io_error`).
    pub fn fail(&self, e: &BlockError) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            eprintln!("dmkit: {}: error on journal or metadata: {e}", self.name);
        }
    }

    pub(crate) fn check_failed(&self, offset: u64) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(BlockError::Io {
                device: self.name.clone(),
                offset,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }

    /// Write the tag cache's dirty pages, then flush the device below (what the kernel's
    /// `dm_integrity_flush_buffers` does with dm-bufio).
    pub fn flush_lower(&self) -> Result<()> {
        self.tag_cache.flush(&*self.lower)?;
        self.lower.flush()
    }

    fn write_sb(&self, sb: &mut RawSuperblock) -> Result<()> {
        sb.set_version_for(self.mode);
        self.lower.write_at(&sb.0, 0)?;
        self.lower.flush()
    }

    /// Read blocks at logical `sector` (within one area) into `buf` and check their tags;
    /// without internal hash, hand the stored tags to `tags_out` instead.
    fn read_checked(
        &self,
        sector: u64,
        buf: &mut [u8],
        check: bool,
        tags_out: Option<&mut [u8]>,
    ) -> Result<()> {
        let l = &self.layout;
        if let Some(tagger) = self.tagger.as_ref().filter(|_| check) {
            let parts = tagger.parallel_parts(buf.len());
            if parts > 1 {
                return self.read_checked_in_parts(tagger, parts, sector, buf);
            }
        }
        self.lower.read_at(buf, l.data_sector(sector) * 512)?;
        let blocks = buf.len() / l.block_size();
        self.stats
            .blocks_read
            .fetch_add(blocks as u64, Ordering::Relaxed);
        let ts = l.tag_size as usize;
        let Some(tagger) = &self.tagger else {
            return match tags_out {
                Some(t) => self.tag_cache.read(&*self.lower, l.tag_offset(sector), t),
                None => Ok(()),
            };
        };
        if !check {
            return Ok(());
        }
        // The stored and the computed tags: on the stack for requests of up to 32 blocks of
        // 32-byte tags, else in this thread's scratch (no allocation per request).
        let need = blocks * ts;
        let mut small = [0u8; 2 * 32 * 32];
        let check_with = |both: &mut [u8]| -> Result<()> {
            let (stored, computed) = both.split_at_mut(need);
            self.tag_cache
                .read(&*self.lower, l.tag_offset(sector), stored)?;
            tagger.tag_blocks_pooled(sector, buf, computed);
            if computed == stored {
                return Ok(());
            }
            let k = computed
                .chunks_exact(ts)
                .zip(stored.chunks_exact(ts))
                .position(|(c, s)| c != s)
                .unwrap_or(0);
            let sec = sector + k as u64 * l.spb();
            self.stats.mismatches.fetch_add(1, Ordering::Relaxed);
            Err(BlockError::Corrupt {
                device: self.name.clone(),
                what: "data",
                block: sec >> l.log2_spb,
            })
        };
        if 2 * need <= small.len() {
            check_with(&mut small[..2 * need])
        } else {
            super::scratch::with_scratch(2 * need, check_with)
        }
    }

    /// [`read_checked`](Inner::read_checked) of a large request with hashed tags, checked: the
    /// stored tags read first, then each share of the data read and hashed by the thread that
    /// takes it ([`side_by_side::in_shares`]), so the copy out of the lower device is not a
    /// serial step before the hashing.
    fn read_checked_in_parts(
        &self,
        tagger: &TagHasher,
        parts: usize,
        sector: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let l = &self.layout;
        let (bs, ts) = (l.block_size(), l.tag_size as usize);
        let blocks = buf.len() / bs;
        super::scratch::with_scratch(blocks * ts, |stored| {
            self.tag_cache
                .read(&*self.lower, l.tag_offset(sector), stored)?;
            let stored = &*stored;
            let check = |k: usize, data: &mut [u8]| -> Result<Option<u64>> {
                let s = sector + k as u64 * l.spb();
                self.lower.read_at(data, l.data_sector(s) * 512)?;
                let stored = &stored[k * ts..(k + data.len() / bs) * ts];
                let mut computed = vec![0u8; stored.len()];
                tagger.tag_blocks(s, data, &mut computed);
                let bad = computed
                    .chunks_exact(ts)
                    .zip(stored.chunks_exact(ts))
                    .position(|(c, s)| c != s);
                Ok(bad.map(|k| s + k as u64 * l.spb()))
            };
            let results =
                side_by_side::in_shares(buf, bs, parts, (&self.name, sector * 512), &check);
            self.stats
                .blocks_read
                .fetch_add(blocks as u64, Ordering::Relaxed);
            for r in results {
                if let Some(sec) = r? {
                    self.stats.mismatches.fetch_add(1, Ordering::Relaxed);
                    return Err(BlockError::Corrupt {
                        device: self.name.clone(),
                        what: "data",
                        block: sec >> l.log2_spb,
                    });
                }
            }
            Ok(())
        })
    }

    /// Read one area's piece, from the journal where it holds newer data; `tags` (external
    /// tags only) receives the blocks' tags.
    fn read_piece(&self, sector: u64, buf: &mut [u8], mut tags: Option<&mut [u8]>) -> Result<()> {
        let l = &self.layout;
        let bs = l.block_size();
        let ts = l.tag_size as usize;
        let check = self.mode != Mode::Recovery;
        let Some(j) = &self.journal else {
            let _r = self.ranges.lock(sector, (buf.len() / 512) as u64);
            return self.read_checked(sector, buf, check, tags);
        };
        // The journal first, holding no range: a write-back holds a section's lock while it
        // waits for a range, so a range must never be held while waiting for a section. A
        // block absent from the journal has its newest version in place (a write-back drops
        // its blocks from the journal only once they are there); the range lock below keeps
        // a write-back from changing it under the read.
        let first = sector >> l.log2_spb;
        let blocks = (buf.len() / bs) as u64;
        let in_journal = {
            let st = j.lock();
            let runs = st.newest.overlapping(first, blocks);
            for &(b, n, pos) in &runs {
                for k in 0..n {
                    let i = (b - first + k) as usize;
                    let tag = tags.as_deref_mut().map(|t| &mut t[i * ts..(i + 1) * ts]);
                    journal::read_block(l, j, pos + k as u32, &mut buf[i * bs..(i + 1) * bs], tag);
                }
            }
            runs
        };
        // The gaps between the journal's runs come from the disk.
        let mut next = first;
        let gaps = in_journal
            .iter()
            .map(|&(b, n, _)| (b, b + n))
            .chain(std::iter::once((first + blocks, first + blocks)));
        for (b, e) in gaps {
            if b > next {
                let o = ((next - first) as usize) * bs;
                let len = ((b - next) as usize) * bs;
                let s = next << l.log2_spb;
                let _r = self.ranges.lock(s, (len / 512) as u64);
                let t = tags
                    .as_deref_mut()
                    .map(|t| &mut t[o / bs * ts..(o + len) / bs * ts]);
                self.read_checked(s, &mut buf[o..o + len], check, t)?;
            }
            next = e;
        }
        Ok(())
    }

    /// Write one area's piece in place (modes D and B).
    fn write_piece(&self, sector: u64, data: &[u8], tags: &[u8]) -> Result<()> {
        let l = &self.layout;
        let n = (data.len() / 512) as u64;
        let _r = self.ranges.lock(sector, n);
        if let Some(b) = &self.bitmap {
            b.mark(self, sector, n).inspect_err(|e| self.fail(e))?;
        }
        self.lower.write_at(data, l.data_sector(sector) * 512)?;
        // Tags wait in the cache for the next flush, as in dm-bufio: mode D promises nothing
        // after a crash and mode B recalculates the regions its bitmap marks.
        self.tag_cache
            .write_back(&*self.lower, l.tag_offset(sector), tags)
    }

    /// `integrity_recalc`, run to the end before the device is served.
    fn recalc(&self) -> Result<()> {
        let l = &self.layout;
        let mut sb = self.sb.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut pos = sb.recalc_sector();
        let Some(tagger) = &self.tagger else {
            // Without internal hash there is nothing to recalculate (the kernel refuses
            // `recalculate` then): the layer above owns the tags.
            return Ok(());
        };
        let ts = l.tag_size as usize;
        let mut buf = Vec::new();
        let mut tags = Vec::new();
        while pos < l.provided_data_sectors {
            let n = RECALC_SECTORS
                .min(l.provided_data_sectors - pos)
                .min(l.area_remaining(pos));
            let (mut s, mut cnt) = (pos, n);
            let mut todo = true;
            if let Some(b) = &self.bitmap {
                let mut st = b.lock();
                if bitmap::op(&mut st.recalc, b.shift, s, cnt, Op::TestAllClear) {
                    todo = false;
                } else {
                    while bitmap::op(&mut st.recalc, b.shift, s, l.spb(), Op::TestAllClear) {
                        s += l.spb();
                        cnt -= l.spb();
                    }
                    while bitmap::op(
                        &mut st.recalc,
                        b.shift,
                        s + cnt - l.spb(),
                        l.spb(),
                        Op::TestAllClear,
                    ) {
                        cnt -= l.spb();
                    }
                }
            }
            if todo {
                buf.resize((cnt * 512) as usize, 0);
                tags.resize((cnt >> l.log2_spb) as usize * ts, 0);
                self.lower.read_at(&mut buf, l.data_sector(s) * 512)?;
                tagger.tag_blocks(s, &buf, &mut tags);
                self.tag_cache.write(&*self.lower, l.tag_offset(s), &tags)?;
                self.stats
                    .recalculated_sectors
                    .fetch_add(cnt, Ordering::Relaxed);
                if let Some(b) = &self.bitmap {
                    let start = (pos >> b.shift) << b.shift;
                    let end = ((pos + n) >> b.shift) << b.shift;
                    let mut st = b.lock();
                    bitmap::op(&mut st.recalc, b.shift, start, end - start, Op::Clear);
                }
            }
            pos += n;
        }
        // recalc_write_super
        self.lower.flush()?;
        sb.set_recalc_sector(pos);
        self.write_sb(&mut sb)?;
        *self.sb.lock().unwrap_or_else(|e| e.into_inner()) = sb;
        if let Some(b) = &self.bitmap {
            {
                let mut st = b.lock();
                let len = st.recalc.len();
                st.recalc = vec![0; len];
            }
            b.clean(self, l.provided_data_sectors)?;
            self.stats.bitmap_cleanings.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The timer work: autocommit and bitmap cleaning when due; returns how long to sleep.
    fn tick(&self) -> Duration {
        let now = Instant::now();
        let mut next = Duration::from_millis(500);
        if self.failed.load(Ordering::SeqCst) {
            return next;
        }
        if let Some(j) = &self.journal {
            let since = j.lock().dirty_since;
            if let Some(t) = since {
                let due = t + self.commit_time;
                if now >= due {
                    if journal::commit(self, j).is_ok() {
                        let _ = journal::writeback_if_below(self, j);
                    }
                } else {
                    next = next.min(due - now);
                }
            }
        }
        if let Some(b) = &self.bitmap {
            let since = b.lock().dirty_since;
            if let Some(t) = since {
                let due = t + self.bitmap_flush;
                if now >= due {
                    if b.clean(self, self.layout.provided_data_sectors).is_ok() {
                        self.stats.bitmap_cleanings.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    next = next.min(due - now);
                }
            }
        }
        next.max(Duration::from_millis(1))
    }

    /// `dm_integrity_postsuspend`: leave the device clean.
    fn shutdown(&self) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Ok(());
        }
        match self.mode {
            Mode::Journal => {
                let j = self
                    .journal
                    .as_ref()
                    .ok_or_else(|| BlockError::Unsupported {
                        device: self.name.clone(),
                        op: "journal",
                    })?;
                journal::commit(self, j)?;
                journal::writeback(self, j)?;
                self.lower.flush()?;
                journal::clean_stop(self, j)?;
                j.lock().wrote_to_journal = false;
            }
            Mode::Bitmap => {
                self.flush_lower()?;
                let l = &self.layout;
                let mut mem = vec![0u8; l.journal_bytes()];
                init_sections(l, &mut mem, 0, l.journal_sections, 0);
                write_sections(self, &mem, 0, l.journal_sections)?;
                let mut sb = self.sb.lock().unwrap_or_else(|e| e.into_inner());
                let f = sb.flags() & !SB_FLAG_DIRTY_BITMAP;
                sb.set_flags(f);
                self.write_sb(&mut sb)?;
            }
            Mode::Direct => self.flush_lower()?,
            Mode::Recovery => {}
        }
        Ok(())
    }
}

/// A dm-integrity target.
pub struct IntegrityDevice {
    inner: Arc<Inner>,
    read_only: bool,
    /// Started by the first write or flush, so that opening spawns no thread (the export
    /// forks its server after the open).
    timer: Mutex<Option<JoinHandle<()>>>,
    timer_started: AtomicBool,
    background_writeback: bool,
    replay: Option<ReplayReport>,
    closed: AtomicBool,
}

impl IntegrityDevice {
    /// Open the dm-integrity device on `lower` as the kernel activates it: read the
    /// superblock, replay the journal or recalculate dirty regions, mark the bitmap dirty.
    pub fn open(
        lower: Arc<dyn BlockDevice>,
        opts: IntegrityOptions,
    ) -> std::result::Result<IntegrityDevice, OpenError> {
        let inv = |m: String| OpenError::Invalid(format!("{}: {m}", lower.name()));
        let size = lower.size();
        if size < SB_SECTORS * 512 {
            return Err(inv(format!(
                "too small ({size} bytes) for a dm-integrity superblock"
            )));
        }
        let mut raw = vec![0u8; (SB_SECTORS * 512) as usize];
        lower.read_at(&mut raw, 0)?;
        let mut sb = RawSuperblock(raw);
        if !sb.has_magic() && sb.0.iter().all(|&b| b == 0) {
            return Err(inv(
                "the device is not initialized (no superblock): format it first (dmkit integrity format)".into(),
            ));
        }
        let layout = Layout::from_superblock(&sb, size / 512).map_err(|e| inv(e.0))?;
        let mode = opts.mode;
        let read_only = mode == Mode::Recovery;
        if lower.read_only() && !read_only {
            return Err(inv(
                "the device is read-only: open it with --integrity-recovery-mode".into(),
            ));
        }
        let flags = sb.flags();
        let salt = (flags & SB_FLAG_FIXED_HMAC != 0).then(|| sb.salt());
        let tagger = match opts.alg {
            Some(alg) => Some(
                TagHasher::new(
                    alg,
                    opts.key.as_ref().map(|k| k.as_slice()),
                    salt,
                    layout.tag_size as usize,
                    layout.block_size(),
                )
                .map_err(|e| inv(e.to_string()))?,
            ),
            // The kernel's words: bitmap mode recalculates tags, which needs an internal hash.
            None if mode == Mode::Bitmap => {
                return Err(inv("Bitmap mode can be only used with internal hash".into()))
            }
            None => None,
        };
        if flags & SB_FLAG_RECALCULATING != 0
            && sb.recalc_sector() < layout.provided_data_sectors
            && flags & SB_FLAG_FIXED_HMAC != 0
            && opts.key.is_some()
        {
            return Err(inv("Recalculating with HMAC is disabled for security reasons (the kernel's legacy_recalculate is not supported)".into()));
        }
        let log2_bpbb = bitmap::log2_blocks_per_bit(&layout, opts.sectors_per_bit);
        let inner = Inner {
            name: opts.name.clone(),
            lower: lower.clone(),
            bitmap: (mode == Mode::Bitmap).then(|| Bitmap::new(&layout, log2_bpbb)),
            layout,
            mode,
            tagger,
            ranges: RangeLock::default(),
            tag_cache: TagCache::new(size),
            journal: None,
            sb: Mutex::new(sb.clone()),
            stats: Arc::new(IntegrityStats::default()),
            failed: AtomicBool::new(false),
            commit_time: Duration::from_millis(u64::from(opts.commit_time_ms)),
            signal: Arc::new(Signal::default()),
            background: AtomicBool::new(false),
            bitmap_flush: Duration::from_millis(u64::from(opts.bitmap_flush_ms).max(1)),
        };
        let mut inner = inner;
        let mut report = None;
        if mode != Mode::Recovery {
            let l = inner.layout.clone();
            let mut jstate = None;
            if flags & SB_FLAG_DIRTY_BITMAP != 0 {
                let nb = bitmap::Bitmap::new(&l, log2_bpbb).n_blocks;
                let mut disk = vec![0u8; nb * super::rw_meta::BITMAP_BLOCK_SIZE];
                lower.read_at(&mut disk, l.journal_offset())?;
                let same = u32::from(sb.log2_blocks_per_bitmap_bit()) == log2_bpbb;
                if let Some(b) = &inner.bitmap {
                    let mut guard = b.lock();
                    let st = &mut *guard;
                    if same {
                        st.disk = disk.clone();
                        st.recalc = disk.clone();
                        st.may_write = disk.clone();
                        if !bitmap::op(
                            &mut st.disk,
                            b.shift,
                            0,
                            l.provided_data_sectors,
                            Op::TestAllClear,
                        ) {
                            sb.set_flags(sb.flags() | SB_FLAG_RECALCULATING);
                            sb.set_recalc_sector(0);
                        }
                    } else {
                        sb.set_log2_blocks_per_bitmap_bit(log2_bpbb as u8);
                        for v in [&mut st.disk, &mut st.recalc, &mut st.may_write] {
                            bitmap::op(v, b.shift, 0, l.provided_data_sectors, Op::Set);
                        }
                        b.write_all(&inner, st)?;
                        sb.set_flags(sb.flags() | SB_FLAG_RECALCULATING);
                        sb.set_recalc_sector(0);
                    }
                } else {
                    let shift = l.log2_spb + u32::from(sb.log2_blocks_per_bitmap_bit());
                    if !(same
                        && bitmap::op(
                            &mut disk,
                            shift,
                            0,
                            l.provided_data_sectors,
                            Op::TestAllClear,
                        ))
                    {
                        sb.set_flags(sb.flags() | SB_FLAG_RECALCULATING);
                        sb.set_recalc_sector(0);
                    }
                    let mut mem = vec![0u8; l.journal_bytes()];
                    init_sections(&l, &mut mem, 0, l.journal_sections, 0);
                    write_sections(&inner, &mem, 0, l.journal_sections)?;
                    let (st, mem, r) = replay::replay(&inner, mode)?;
                    jstate = Some((st, mem));
                    report = Some(r);
                    sb.set_flags(sb.flags() & !SB_FLAG_DIRTY_BITMAP);
                }
                inner.write_sb(&mut sb)?;
            } else {
                let (st, mem, r) = replay::replay(&inner, mode)?;
                jstate = Some((st, mem));
                report = Some(r);
                if let Some(b) = &inner.bitmap {
                    sb.set_flags(sb.flags() | SB_FLAG_DIRTY_BITMAP);
                    sb.set_log2_blocks_per_bitmap_bit(log2_bpbb as u8);
                    inner.write_sb(&mut sb)?;
                    let mut guard = b.lock();
                    let st = &mut *guard;
                    let rs = sb.recalc_sector();
                    if sb.flags() & SB_FLAG_RECALCULATING != 0 && rs < l.provided_data_sectors {
                        let n = l.provided_data_sectors - rs;
                        for v in [&mut st.disk, &mut st.recalc, &mut st.may_write] {
                            bitmap::op(v, b.shift, rs, n, Op::Set);
                        }
                    }
                    b.write_all(&inner, st)?;
                }
            }
            *inner.sb.lock().unwrap_or_else(|e| e.into_inner()) = sb.clone();
            if mode == Mode::Journal {
                let (st, mem) =
                    jstate.ok_or_else(|| inv("journal state missing after replay".into()))?;
                inner.journal = Some(Journal::new(&l, st, mem, opts.journal_watermark));
            }
            if sb.flags() & SB_FLAG_RECALCULATING != 0 {
                let rs = sb.recalc_sector();
                if rs < l.provided_data_sectors {
                    inner.recalc()?;
                } else if rs > l.provided_data_sectors {
                    sb.set_recalc_sector(l.provided_data_sectors);
                    inner.lower.flush()?;
                    inner.write_sb(&mut sb)?;
                    *inner.sb.lock().unwrap_or_else(|e| e.into_inner()) = sb.clone();
                }
            }
        }
        let inner = Arc::new(inner);
        if opts.check_key && mode != Mode::Recovery && inner.tagger.is_some() {
            check_samples(&inner)?;
        }
        Ok(IntegrityDevice {
            inner,
            read_only,
            timer: Mutex::new(None),
            timer_started: AtomicBool::new(false),
            background_writeback: opts.background_writeback,
            replay: report,
            closed: AtomicBool::new(false),
        })
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<IntegrityStats> {
        self.inner.stats.clone()
    }

    /// The geometry.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// What the journal replay at open did (`None` in mode R or when the bitmap was dirty).
    pub fn replay_report(&self) -> Option<&ReplayReport> {
        self.replay.as_ref()
    }

    /// Mode B: flush, then clear the dirty bitmap on disk now, as the kernel does every
    /// `bitmap_flush_interval` (a no-op in other modes).
    pub fn clean_bitmap(&self) -> Result<()> {
        self.inner.check_failed(0)?;
        if let Some(b) = &self.inner.bitmap {
            b.clean(&self.inner, self.inner.layout.provided_data_sectors)?;
            self.inner
                .stats
                .bitmap_cleanings
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stop as the kernel's suspend does: commit and write back the journal, or clean the
    /// bitmap, so that the next open finds a clean device. Also done on drop.
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.signal.set(true);
        if let Some(t) = self.timer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        self.inner.background.store(false, Ordering::Release);
        self.inner.shutdown()
    }

    /// Start the timer thread of modes J and B if it is not running yet.
    fn start_timer(&self) {
        if self.timer_started.load(Ordering::Relaxed)
            || !matches!(self.inner.mode, Mode::Journal | Mode::Bitmap)
        {
            return;
        }
        let mut t = self.timer.lock().unwrap_or_else(|e| e.into_inner());
        if self.timer_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let signal = self.inner.signal.clone();
        match std::thread::Builder::new()
            .name(format!("integrity-{}", self.inner.name))
            .spawn(move || timer_loop(weak, signal))
        {
            Ok(h) => {
                *t = Some(h);
                self.inner
                    .background
                    .store(self.background_writeback, Ordering::Release);
            }
            Err(e) => eprintln!(
                "dmkit: {}: cannot start the commit timer ({e}); commits happen at flush and watermark only",
                self.inner.name
            ),
        }
    }

    fn check(&self, offset: u64, len: usize) -> Result<()> {
        check_range(&self.inner.name, offset, len, self.size())?;
        let mask = self.inner.layout.block_size() as u64 - 1;
        if offset & mask != 0 || len as u64 & mask != 0 {
            return Err(BlockError::Io {
                device: self.inner.name.clone(),
                offset,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        self.inner.check_failed(offset)
    }
}

/// Refuse a wrong algorithm or key at open: when every one of up to 16 blocks spread over the
/// device has a bad tag, nothing written through this algorithm and key can be read.
fn check_samples(inner: &Inner) -> std::result::Result<(), OpenError> {
    let l = &inner.layout;
    let blocks = l.provided_data_sectors >> l.log2_spb;
    let mut buf = vec![0u8; l.block_size()];
    let mut bad = 0;
    let mut good = false;
    let mut n = 0;
    for block in super::samples::sample_blocks(blocks) {
        n += 1;
        match inner.read_checked(block << l.log2_spb, &mut buf, true, None) {
            Ok(()) => {
                good = true;
                break;
            }
            Err(BlockError::Corrupt { .. }) => bad += 1,
            Err(e) => return Err(e.into()),
        }
    }
    // Sampling is not reading: leave the counters to real reads.
    inner.stats.mismatches.fetch_sub(bad, Ordering::Relaxed);
    inner.stats.blocks_read.store(0, Ordering::Relaxed);
    if good || n == 0 {
        return Ok(());
    }
    Err(OpenError::Invalid(format!(
        "{}: {}; --integrity-recovery-mode reads it unchecked",
        inner.lower.name(),
        super::samples::wrong_key_reason(
            inner
                .tagger
                .as_ref()
                .map_or("none", |t| t.algorithm().name())
        )
    )))
}

fn timer_loop(inner: Weak<Inner>, signal: Arc<Signal>) {
    let mut sleep = Duration::from_millis(100);
    loop {
        let (stop, kick) = signal.wait(sleep);
        if stop {
            return;
        }
        let Some(i) = inner.upgrade() else { return };
        if kick {
            i.journal_work();
        }
        sleep = i.tick();
    }
}

impl Drop for IntegrityDevice {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            eprintln!("dmkit: {}: clean stop failed: {e}", self.inner.name);
        }
    }
}

impl BlockDevice for IntegrityDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }
    fn size(&self) -> u64 {
        self.inner.layout.provided_data_sectors * 512
    }
    fn logical_block_size(&self) -> u32 {
        self.inner.layout.block_size() as u32
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.inner.tagger.is_none() && self.inner.mode != Mode::Recovery {
            return Err(self.no_internal_hash());
        }
        self.read_blocks(buf, None, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let Some(tagger) = &self.inner.tagger else {
            return Err(self.no_internal_hash());
        };
        let l = &self.inner.layout;
        if !buf.len().is_multiple_of(l.block_size()) {
            // write_blocks refuses it with the error the caller expects.
            return self.write_blocks(buf, &[], offset);
        }
        if let Some(j) = &self.inner.journal {
            // Copied and tagged straight into the journal's memory, on the cores.
            self.begin_write(offset, buf.len())?;
            let blocks = buf.len() / l.block_size();
            return journal::journal_write_with(&self.inner, j, offset / 512, blocks, &mut |p| {
                tagger.fill_pieces(buf, offset, p)
            });
        }
        let need = buf.len() / l.block_size() * l.tag_size as usize;
        super::scratch::with_scratch(need, |tags| {
            tagger.tag_blocks_pooled(offset / 512, buf, tags);
            self.write_blocks(buf, tags, offset)
        })
    }
    fn flush(&self) -> Result<()> {
        self.flush_device()
    }
    /// The server has this device now: this copy's close (at drop) must not commit, write
    /// back or clean anything, whatever its stale memory holds.
    fn hand_over(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.inner.lower.hand_over()
    }
}

impl TaggedBlockDevice for IntegrityDevice {
    fn tag_size(&self) -> usize {
        self.inner.layout.tag_size as usize
    }
    fn read_tagged(&self, buf: &mut [u8], tags: &mut [u8], offset: u64) -> Result<()> {
        self.check_tags(buf.len(), tags.len(), offset)?;
        self.read_blocks(buf, Some(tags), offset)
    }
    fn write_tagged(&self, buf: &[u8], tags: &[u8], offset: u64) -> Result<()> {
        self.check_tags(buf.len(), tags.len(), offset)?;
        self.write_blocks(buf, tags, offset)
    }
    /// With a journal, `fill` writes into the journal's memory: the data is not copied there
    /// from a buffer of the layer above.
    fn write_tagged_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [TaggedPiece<'_>]),
    ) -> Result<()> {
        let l = &self.inner.layout;
        self.check_tags(len, len / l.block_size() * l.tag_size as usize, offset)?;
        self.check(offset, len)?;
        let Some(j) = &self.inner.journal else {
            let (bs, ts) = (l.block_size(), l.tag_size as usize);
            let (data, tags) = crate::block::fill_buffers(offset, len, bs, ts, fill);
            return self.write_blocks(&data, &tags, offset);
        };
        self.begin_write(offset, len)?;
        journal::journal_write_with(&self.inner, j, offset / 512, len / l.block_size(), fill)
    }
}

impl IntegrityDevice {
    /// Plain reads and writes of a device whose tags come from above: refused (the kernel
    /// fails such bios too, there being no tag to store or return).
    fn no_internal_hash(&self) -> BlockError {
        BlockError::Unsupported {
            device: self.inner.name.clone(),
            op: "I/O without tags on a device without internal hash",
        }
    }

    /// Tagged I/O needs a device without internal hash and one tag per block.
    fn check_tags(&self, len: usize, tags: usize, offset: u64) -> Result<()> {
        let l = &self.inner.layout;
        if self.inner.tagger.is_some() {
            return Err(BlockError::Unsupported {
                device: self.inner.name.clone(),
                op: "tags from above on a device with an internal hash",
            });
        }
        if tags != len / l.block_size() * l.tag_size as usize {
            return Err(BlockError::Io {
                device: self.inner.name.clone(),
                offset,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        Ok(())
    }

    /// Read whole blocks at `offset`; `tags` receives their tags (external tags only).
    fn read_blocks(&self, buf: &mut [u8], mut tags: Option<&mut [u8]>, offset: u64) -> Result<()> {
        self.check(offset, buf.len())?;
        let l = &self.inner.layout;
        let ts = l.tag_size as usize;
        let bs = l.block_size();
        let mut sector = offset / 512;
        let mut done = 0usize;
        while done < buf.len() {
            let n = (l.area_remaining(sector) as usize * 512).min(buf.len() - done);
            let t = tags
                .as_deref_mut()
                .map(|t| &mut t[done / bs * ts..(done + n) / bs * ts]);
            self.inner.read_piece(sector, &mut buf[done..done + n], t)?;
            done += n;
            sector += (n / 512) as u64;
        }
        Ok(())
    }

    /// What every write does first: refused on a read-only device or outside whole blocks of
    /// the device; the commit timer started and the blocks counted.
    fn begin_write(&self, offset: u64, len: usize) -> Result<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.inner.name.clone(),
            });
        }
        self.check(offset, len)?;
        self.start_timer();
        self.inner.stats.blocks_written.fetch_add(
            (len / self.inner.layout.block_size()) as u64,
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Write whole blocks at `offset` with their `tags`.
    fn write_blocks(&self, buf: &[u8], tags: &[u8], offset: u64) -> Result<()> {
        self.begin_write(offset, buf.len())?;
        let inner = &self.inner;
        let l = &inner.layout;
        let ts = l.tag_size as usize;
        if let Some(j) = &inner.journal {
            return journal::journal_write(inner, j, offset / 512, buf, tags);
        }
        let mut sector = offset / 512;
        let mut done = 0usize;
        while done < buf.len() {
            let n = (l.area_remaining(sector) as usize * 512).min(buf.len() - done);
            let t0 = done / l.block_size() * ts;
            let t1 = (done + n) / l.block_size() * ts;
            inner.write_piece(sector, &buf[done..done + n], &tags[t0..t1])?;
            done += n;
            sector += (n / 512) as u64;
        }
        Ok(())
    }

    fn flush_device(&self) -> Result<()> {
        self.inner.check_failed(0)?;
        self.start_timer();
        match &self.inner.journal {
            Some(j) => {
                journal::commit(&self.inner, j)?;
                let below = j.lock().free_sectors <= j.threshold;
                if below && !self.inner.kick_background() {
                    journal::writeback(&self.inner, j)?;
                }
                Ok(())
            }
            None => self.inner.flush_lower(),
        }
    }
}
