//! [`RemoteDevice`]: a read-only [`BlockDevice`] over a [`RangeSource`], the bottom of a stack
//! whose data lives in object storage.
//!
//! Nothing read here is trusted (the verity layer above checks every block), so the device is
//! free to fetch more than asked: reads are widened to whole blocks, a large read is split into
//! pieces fetched in parallel by a small pool of fetcher threads (each transport keeps one
//! kept-alive connection per thread), and sequential reads start a read-ahead that doubles at
//! every sequential read up to a bound, is kept that far ahead of the reader at every read,
//! and stops at the first random one. A read is sequential when it starts where one of the
//! last few reads ended, or, while a read-ahead runs, within a few read lengths of the furthest
//! end: readers with several reads in flight (an NBD client's queue depth, served at once) have
//! them arrive slightly out of order. A region may be
//! *pinned*: fetched whole at open and served from memory (the hash tree, the FEC area).
//!
//! [`RemoteDevice::read_fresh`] reads bypassing the read-ahead buffers: what the verity layer
//! asks for when a block failed its digest.

use super::{RangeSource, RemoteError};
use crate::block::{check_range, BlockDevice, BlockError, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// How a remote device fetches.
///
/// Memory: the read-ahead keeps at most about `2 * max_readahead` bytes of chunks (the oldest
/// fetched chunks are dropped first), plus the chunks in flight (at most `fetchers` being
/// fetched, and the window's chunks queued for them, each `chunk` bytes); random reads keep
/// nothing beyond the read itself.
#[derive(Debug, Clone, Copy)]
pub struct RemoteOptions {
    /// Reads are widened to multiples of this (the verity data block size).
    pub block_size: u32,
    /// Fetcher threads, so several ranges are in flight at once.
    pub fetchers: usize,
    /// Size of one fetched piece of a large read or of the read-ahead.
    pub chunk: u64,
    /// Most bytes read ahead of a sequential reader.
    pub max_readahead: u64,
}

/// Fetcher threads by default: with a 20 ms round trip, 8 chunks of 1 MiB in flight are
/// 400 MB/s of read-ahead, more than a verified reader here uses.
pub const DEFAULT_FETCHERS: usize = 8;

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            block_size: 4096,
            fetchers: DEFAULT_FETCHERS,
            // One request per MiB: at a 20 ms round trip the request's wait, not its bytes, is
            // the cost, so chunks are large (a random read is never widened to one: it fetches
            // its own blocks only).
            chunk: 1 << 20,
            max_readahead: 16 << 20,
        }
    }
}

/// Counters of the device, beside the transport's own.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Bytes served from read-ahead buffers.
    pub readahead_hits: AtomicU64,
    /// Bytes fetched ahead of a sequential reader.
    pub readahead_bytes: AtomicU64,
    /// Bytes served from the pinned region.
    pub pinned_bytes: AtomicU64,
}

/// A chunk of the read-ahead, fetched or on its way.
enum Chunk {
    InFlight,
    Ready(Arc<Vec<u8>>),
    Failed,
}

/// Recent reads' ends remembered by the sequential detector: a reader with several reads in
/// flight (an NBD client's queue) may have its reads arrive a little out of order.
const RECENT_ENDS: usize = 16;

/// Read-ahead state: chunks by index, the order they arrived in (for eviction), and the
/// sequential detector.
#[derive(Default)]
struct Ahead {
    chunks: HashMap<u64, Chunk>,
    order: VecDeque<u64>,
    /// Where the last few reads ended: a read starting at one of them is sequential.
    ends: VecDeque<u64>,
    /// Bytes to read ahead now (0: random access).
    window: u64,
}

type Job = Box<dyn FnOnce() + Send>;

/// Fetcher threads of one process.
struct Pool {
    pid: u32,
    jobs: mpsc::Sender<Job>,
}

impl Pool {
    fn start(threads: usize) -> Pool {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            // Detached: each ends when the device drops the sender.
            let _ = std::thread::Builder::new()
                .name(format!("dmkit-fetch-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
        }
        Pool {
            pid: std::process::id(),
            jobs: tx,
        }
    }
}

struct Shared {
    source: Arc<dyn RangeSource>,
    ahead: Mutex<Ahead>,
    arrived: Condvar,
    stats: DeviceStats,
}

/// A read-only block device reading an object through a [`RangeSource`].
pub struct RemoteDevice {
    name: String,
    size: u64,
    opts: RemoteOptions,
    shared: Arc<Shared>,
    /// The read-ahead fetchers, started at the first read-ahead in this process: a device is
    /// opened before the export forks its server, which must be single-threaded then and
    /// would not inherit threads anyway.
    pool: Mutex<Option<Pool>>,
    /// A region fetched whole at open: (start, bytes).
    pinned: Option<(u64, Vec<u8>)>,
}

/// A remote error as a block error naming the object.
pub fn block_error(name: &str, offset: u64, e: RemoteError) -> BlockError {
    BlockError::Io {
        device: name.to_string(),
        offset,
        source: std::io::Error::other(e.to_string()),
    }
}

impl RemoteDevice {
    /// A device over `source`, with `opts.fetchers` fetcher threads.
    pub fn new(source: Arc<dyn RangeSource>, opts: RemoteOptions) -> Self {
        let shared = Arc::new(Shared {
            source: source.clone(),
            ahead: Mutex::default(),
            arrived: Condvar::new(),
            stats: DeviceStats::default(),
        });
        RemoteDevice {
            name: source.name().to_string(),
            size: source.identity().len,
            opts,
            shared,
            pool: Mutex::new(None),
            pinned: None,
        }
    }

    /// Fetch `[start, start + len)` now (in parallel pieces) and serve it from memory from
    /// then on: the hash tree and FEC area, which every read needs.
    pub fn pin(mut self, start: u64, len: u64) -> Result<Self> {
        check_range(&self.name, start, len as usize, self.size)?;
        let mut bytes = vec![0u8; len as usize];
        self.fetch_parallel(&mut bytes, start)?;
        self.pinned = Some((start, bytes));
        Ok(self)
    }

    /// Serve `[start, start + bytes.len())` from `bytes`, already fetched (or read from a
    /// cache) and checked by the caller.
    pub fn pin_bytes(mut self, start: u64, bytes: Vec<u8>) -> Result<Self> {
        check_range(&self.name, start, bytes.len(), self.size)?;
        self.pinned = Some((start, bytes));
        Ok(self)
    }

    /// The pinned region, if any: its start and bytes.
    pub fn pinned(&self) -> Option<(u64, &[u8])> {
        self.pinned.as_ref().map(|(s, b)| (*s, &b[..]))
    }

    /// The object read.
    pub fn source(&self) -> &Arc<dyn RangeSource> {
        &self.shared.source
    }

    /// The device's own counters.
    pub fn device_stats(&self) -> &DeviceStats {
        &self.shared.stats
    }

    /// Read `buf` at `offset` from the object, bypassing the read-ahead buffers and the pinned
    /// region: a fresh copy for a block that failed its digest.
    pub fn read_fresh(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, offset, buf.len(), self.size)?;
        self.shared
            .source
            .read_range(offset, buf)
            .map_err(|e| block_error(&self.name, offset, e))
    }

    fn submit(&self, job: Job) -> bool {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.as_ref().is_none_or(|p| p.pid != std::process::id()) {
            *pool = Some(Pool::start(self.opts.fetchers));
        }
        pool.as_ref().is_some_and(|p| p.jobs.send(job).is_ok())
    }

    /// Fetch `buf` at `offset` in pieces of `opts.chunk`, `opts.fetchers` in flight at once
    /// (threads of this call only, gone when it returns: this runs at open too, before the
    /// export forks).
    fn fetch_parallel(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let chunk = self.opts.chunk.max(self.opts.block_size as u64) as usize;
        if buf.len() <= chunk {
            return self.read_fresh(buf, offset);
        }
        let pieces: Mutex<Vec<(u64, &mut [u8])>> = Mutex::new(
            buf.chunks_mut(chunk)
                .enumerate()
                .map(|(i, p)| (offset + (i * chunk) as u64, p))
                .rev()
                .collect(),
        );
        let threads = self
            .opts
            .fetchers
            .clamp(1, pieces.lock().expect("fresh").len());
        let failed: Mutex<Option<BlockError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    let next = pieces.lock().unwrap_or_else(|e| e.into_inner()).pop();
                    let Some((at, piece)) = next else {
                        return;
                    };
                    if let Err(e) = self.read_fresh(piece, at) {
                        failed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(e);
                        return;
                    }
                });
            }
        });
        match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Start fetching chunk `index` into the read-ahead buffers unless it is there already.
    /// Called with the read-ahead lock held.
    fn start_chunk(&self, ahead: &mut Ahead, index: u64) {
        if ahead.chunks.contains_key(&index) {
            return;
        }
        let chunk = self.opts.chunk;
        let start = index * chunk;
        if start >= self.size {
            return;
        }
        let len = chunk.min(self.size - start) as usize;
        ahead.chunks.insert(index, Chunk::InFlight);
        ahead.order.push_back(index);
        // Keep about twice the largest window in memory.
        let keep = (2 * self.opts.max_readahead / chunk).max(8) as usize;
        while ahead.order.len() > keep {
            let Some(old) = ahead.order.pop_front() else {
                break;
            };
            if matches!(ahead.chunks.get(&old), Some(Chunk::InFlight)) {
                ahead.order.push_back(old);
                break;
            }
            ahead.chunks.remove(&old);
        }
        let shared = self.shared.clone();
        let job: Job = Box::new(move || {
            let mut bytes = vec![0u8; len];
            let state = match shared.source.read_range(start, &mut bytes) {
                Ok(()) => Chunk::Ready(Arc::new(bytes)),
                Err(_) => Chunk::Failed,
            };
            let mut a = shared.ahead.lock().unwrap_or_else(|e| e.into_inner());
            if a.chunks.contains_key(&index) {
                a.chunks.insert(index, state);
            }
            shared.arrived.notify_all();
        });
        if !self.submit(job) {
            ahead.chunks.remove(&index);
        }
    }

    /// Serve `buf` at `offset` through the read-ahead chunks (a sequential reader), starting
    /// the fetch of every missing one and of the window after it.
    fn read_sequential(&self, buf: &mut [u8], offset: u64, window: u64) -> Result<()> {
        let chunk = self.opts.chunk;
        let end = offset + buf.len() as u64;
        let (first, last) = (offset / chunk, (end - 1) / chunk);
        let ahead_last = (end + window).min(self.size).saturating_sub(1) / chunk;
        let mut a = self.shared.ahead.lock().unwrap_or_else(|e| e.into_inner());
        for index in first..=ahead_last {
            self.start_chunk(&mut a, index);
        }
        for index in first..=last {
            loop {
                match a.chunks.get(&index) {
                    Some(Chunk::Ready(bytes)) => {
                        let bytes = bytes.clone();
                        let cs = index * chunk;
                        let from = offset.max(cs);
                        let to = end.min(cs + bytes.len() as u64);
                        buf[(from - offset) as usize..(to - offset) as usize]
                            .copy_from_slice(&bytes[(from - cs) as usize..(to - cs) as usize]);
                        self.shared
                            .stats
                            .readahead_hits
                            .fetch_add(to - from, Ordering::Relaxed);
                        break;
                    }
                    Some(Chunk::InFlight) => {
                        a = self
                            .shared
                            .arrived
                            .wait(a)
                            .unwrap_or_else(|e| e.into_inner());
                    }
                    Some(Chunk::Failed) | None => {
                        // Failed (or evicted meanwhile): fetch what is needed directly, so the
                        // transport's own error, after its retries, is what the reader sees.
                        a.chunks.remove(&index);
                        drop(a);
                        let cs = index * chunk;
                        let from = offset.max(cs);
                        let to = end.min(cs + chunk);
                        self.read_fresh(
                            &mut buf[(from - offset) as usize..(to - offset) as usize],
                            from,
                        )?;
                        a = self.shared.ahead.lock().unwrap_or_else(|e| e.into_inner());
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether a read at `offset` continues a recent one; updates the window. Returns the
    /// read-ahead window to use now (0: random access, fetch only what is asked).
    fn note_access(&self, offset: u64, len: u64) -> u64 {
        let mut a = self.shared.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let sequential = a.ends.contains(&offset) || {
            // While a stream runs, a read near its head continues it: reads in flight together
            // arrive a little out of order, by about their count times their length. A random
            // read lands there rarely (and a chunk fetched ahead is no sign: on a small object
            // the read-ahead may hold most of it).
            let head = a.ends.iter().copied().max().unwrap_or(0);
            a.window > 0 && offset.abs_diff(head) <= RECENT_ENDS as u64 * len
        };
        a.window = if sequential {
            (a.window * 2).clamp(self.opts.chunk, self.opts.max_readahead)
        } else {
            0
        };
        if a.ends.len() == RECENT_ENDS {
            a.ends.pop_front();
        }
        a.ends.push_back(offset + len);
        a.window
    }
}

impl Drop for RemoteDevice {
    fn drop(&mut self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl BlockDevice for RemoteDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, offset, buf.len(), self.size)?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some((start, bytes)) = &self.pinned {
            let end = start + bytes.len() as u64;
            if offset >= *start && offset + buf.len() as u64 <= end {
                let at = (offset - start) as usize;
                buf.copy_from_slice(&bytes[at..at + buf.len()]);
                self.shared
                    .stats
                    .pinned_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                return Ok(());
            }
        }
        // Whole blocks: a server answers any range, but the object's blocks are the unit the
        // layers above check, so fetch those.
        let bs = self.opts.block_size as u64;
        let start = offset / bs * bs;
        let end = (offset + buf.len() as u64).div_ceil(bs) * bs;
        let end = end.min(self.size);
        let window = self.note_access(start, end - start);
        if start == offset && end == offset + buf.len() as u64 {
            return self.read_aligned(buf, offset, window);
        }
        let mut tmp = vec![0u8; (end - start) as usize];
        self.read_aligned(&mut tmp, start, window)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(BlockError::ReadOnly {
            device: self.name.clone(),
        })
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(BlockError::ReadOnly {
            device: self.name.clone(),
        })
    }
    fn blocks_on_network(&self) -> bool {
        true
    }
}

impl RemoteDevice {
    fn read_aligned(&self, buf: &mut [u8], offset: u64, window: u64) -> Result<()> {
        if window > 0 {
            self.shared
                .stats
                .readahead_bytes
                .fetch_add(window, Ordering::Relaxed);
            return self.read_sequential(buf, offset, window);
        }
        self.fetch_parallel(buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::LocalRange;

    fn device(bytes: &[u8], opts: RemoteOptions) -> (RemoteDevice, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "dmkit-remote-dev-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        std::fs::write(&path, bytes).unwrap();
        let src = Arc::new(LocalRange::open(&path).unwrap());
        (RemoteDevice::new(src, opts), path)
    }

    #[test]
    fn reads_back_sequential_random_and_unaligned() {
        let bytes: Vec<u8> = (0..(3 << 20) + 4096).map(|i| (i * 7 % 251) as u8).collect();
        let opts = RemoteOptions {
            chunk: 64 << 10,
            max_readahead: 512 << 10,
            ..RemoteOptions::default()
        };
        let (dev, path) = device(&bytes, opts);
        let mut buf = vec![0u8; 128 << 10];
        for i in 0..20u64 {
            let off = i * buf.len() as u64;
            dev.read_at(&mut buf, off).unwrap();
            assert_eq!(buf, bytes[off as usize..off as usize + buf.len()]);
        }
        assert!(dev.device_stats().readahead_hits.load(Ordering::Relaxed) > 0);
        for off in [3 << 20, 12345, 1 << 20, 77] {
            let mut b = vec![0u8; 1000];
            dev.read_at(&mut b, off).unwrap();
            assert_eq!(b, bytes[off as usize..off as usize + 1000]);
        }
        let mut big = vec![0u8; 1 << 20];
        dev.read_at(&mut big, 4096).unwrap();
        assert_eq!(big, bytes[4096..4096 + (1 << 20)]);
        assert!(matches!(
            dev.write_at(&[0], 0),
            Err(BlockError::ReadOnly { .. })
        ));
        assert!(dev
            .read_at(&mut [0u8; 8192], bytes.len() as u64 - 4096)
            .is_err());
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn pinned_region_is_fetched_once() {
        let bytes: Vec<u8> = (0..1 << 20).map(|i| (i % 13) as u8).collect();
        let (dev, path) = device(&bytes, RemoteOptions::default());
        let dev = dev.pin(512 << 10, 512 << 10).unwrap();
        let before = dev.source().stats().requests;
        let mut b = vec![0u8; 4096];
        for i in 0..128u64 {
            let at = (512 << 10) + i * 4096;
            dev.read_at(&mut b, at).unwrap();
            assert!(b == bytes[at as usize..at as usize + 4096]);
        }
        assert_eq!(dev.source().stats().requests, before);
        std::fs::remove_file(path).unwrap();
    }
}
