//! `--prefetch`: the data blocks an open of an image read first are recorded in its cache
//! directory (`prefetch`), and a later open fetches them in the background, through the
//! verified device, so they are verified and cached before a reader asks (a boot reads the
//! same blocks in the same order every time).

use crate::block::{BlockDevice, Result};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most blocks recorded (1 GiB of 4 KiB blocks read first is more than any boot).
pub const MAX_RECORDED: usize = 1 << 18;
/// The record is saved every this many new blocks (a served device is often killed, not
/// dropped), and when the recorder is dropped.
const SAVE_EVERY: usize = 256;
/// Most blocks one background read asks for.
const RUN: u64 = 64;

/// The record file of a cache directory.
pub fn record_path(cache_dir: &Path) -> PathBuf {
    cache_dir.join("prefetch")
}

/// The blocks recorded in `cache_dir`, in the order they were first read; empty when none.
pub fn load(cache_dir: &Path) -> Vec<u64> {
    let Ok(bytes) = std::fs::read(record_path(cache_dir)) else {
        return Vec::new();
    };
    bytes
        .chunks_exact(8)
        .take(MAX_RECORDED)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

struct Record {
    order: Vec<u64>,
    seen: HashSet<u64>,
    saved: usize,
}

/// The device of an open with `--prefetch`: it records which blocks of the one below are read
/// first (when nothing was recorded yet), or starts the background prefetch of the recorded
/// ones at its first read (in the process that serves it: an export opens the device, then
/// forks its server, which must be single-threaded until then).
pub struct Prefetch {
    inner: Arc<dyn BlockDevice>,
    path: PathBuf,
    block_size: u64,
    /// The record being made; `None` when prefetching.
    record: Option<Mutex<Record>>,
    /// Blocks to prefetch, until the prefetch starts.
    pending: Mutex<Option<Vec<u64>>>,
    stats: Arc<PrefetchStats>,
}

impl Prefetch {
    /// Record reads of `inner` (in blocks of `block_size`) into `cache_dir`.
    pub fn recording(inner: Arc<dyn BlockDevice>, cache_dir: &Path, block_size: u32) -> Self {
        Self::new(inner, cache_dir, block_size, None)
    }

    /// Prefetch `blocks` (of `block_size`) of `inner` once it is first read.
    pub fn prefetching(
        inner: Arc<dyn BlockDevice>,
        cache_dir: &Path,
        blocks: Vec<u64>,
        block_size: u32,
    ) -> Self {
        Self::new(inner, cache_dir, block_size, Some(blocks))
    }

    fn new(
        inner: Arc<dyn BlockDevice>,
        cache_dir: &Path,
        block_size: u32,
        blocks: Option<Vec<u64>>,
    ) -> Self {
        let stats = Arc::new(PrefetchStats::default());
        let planned = blocks.as_ref().map_or(0, Vec::len) as u64;
        stats.planned.store(planned, Ordering::Relaxed);
        Prefetch {
            inner,
            path: record_path(cache_dir),
            block_size: block_size as u64,
            record: blocks.is_none().then(|| {
                Mutex::new(Record {
                    order: Vec::new(),
                    seen: HashSet::new(),
                    saved: 0,
                })
            }),
            pending: Mutex::new(blocks),
            stats,
        }
    }

    /// The progress counters of the prefetch.
    pub fn stats(&self) -> Arc<PrefetchStats> {
        self.stats.clone()
    }

    /// Start the prefetch now, unless it has started (or this open records).
    pub fn begin(&self) {
        let blocks = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(blocks) = blocks {
            let bs = self.block_size as u32;
            let _ = start(self.inner.clone(), blocks, bs, self.stats.clone());
        }
    }

    fn note(&self, offset: u64, len: usize) {
        let Some(record) = &self.record else {
            return;
        };
        if len == 0 {
            return;
        }
        let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
        if r.order.len() >= MAX_RECORDED {
            return;
        }
        let (first, last) = (
            offset / self.block_size,
            (offset + len as u64 - 1) / self.block_size,
        );
        for b in first..=last {
            if r.order.len() < MAX_RECORDED && r.seen.insert(b) {
                r.order.push(b);
            }
        }
        if r.order.len() >= r.saved + SAVE_EVERY || r.order.len() >= MAX_RECORDED {
            self.save(&mut r);
        }
    }

    fn save(&self, r: &mut Record) {
        if r.order.len() == r.saved {
            return;
        }
        let bytes: Vec<u8> = r.order.iter().flat_map(|b| b.to_le_bytes()).collect();
        if super::cache::write_atomic(&self.path, &bytes).is_ok() {
            r.saved = r.order.len();
        }
    }

    /// Write the record now.
    pub fn flush_record(&self) {
        if let Some(record) = &self.record {
            let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
            self.save(&mut r);
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.flush_record();
    }
}

impl BlockDevice for Prefetch {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.begin();
        self.inner.read_at(buf, offset)?;
        self.note(offset, buf.len());
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<()> {
        self.flush_record();
        self.inner.flush()
    }
    fn hand_over(&self) {
        self.inner.hand_over()
    }
    fn blocks_on_network(&self) -> bool {
        self.inner.blocks_on_network()
    }
}

/// Progress of a background prefetch.
#[derive(Debug, Default)]
pub struct PrefetchStats {
    /// Blocks to fetch.
    pub planned: AtomicU64,
    /// Blocks read (verified and cached) so far.
    pub done: AtomicU64,
    /// Blocks that could not be read (they fail again when a reader asks, with its error).
    pub failed: AtomicU64,
}

/// Read `blocks` (of `block_size`) of `dev` in the background, in runs of consecutive blocks,
/// so they are verified and cached before they are asked for.
fn start(
    dev: Arc<dyn BlockDevice>,
    blocks: Vec<u64>,
    block_size: u32,
    s: Arc<PrefetchStats>,
) -> std::thread::JoinHandle<()> {
    let bs = block_size as u64;
    std::thread::Builder::new()
        .name("dmkit-prefetch".into())
        .spawn(move || {
            let limit = dev.size() / bs;
            let mut i = 0;
            while i < blocks.len() {
                let first = blocks[i];
                let mut n = 1;
                while i + (n as usize) < blocks.len()
                    && blocks[i + n as usize] == first + n
                    && n < RUN
                {
                    n += 1;
                }
                i += n as usize;
                if first + n > limit {
                    s.failed.fetch_add(n, Ordering::Relaxed);
                    continue;
                }
                let mut buf = vec![0u8; (n * bs) as usize];
                match dev.read_at(&mut buf, first * bs) {
                    Ok(()) => s.done.fetch_add(n, Ordering::Relaxed),
                    Err(_) => s.failed.fetch_add(n, Ordering::Relaxed),
                };
            }
        })
        .expect("spawn the prefetch thread")
}
