//! A cache of the tag area, as the kernel keeps its metadata in dm-bufio buffers: a read of a
//! few blocks needs a few bytes of tags, and without the cache every read would cost a second
//! system call for them. Pages of 64 KiB of the lower device, bounded by a share of memory as dm-bufio's
//! cache (the least recently used page goes first), kept consistent without
//! a global lock, and written two ways:
//!
//! - [`TagCache::write`] is write-through: the disk first, then each cached page under its
//!   shard lock. Mode J uses it: a journal section may be reused once its write-back is
//!   flushed, so its tags must be on disk by then.
//! - [`TagCache::write_back`] only changes the cached page and marks it dirty, as dm-bufio
//!   does; [`TagCache::flush`] (every flush of the device, and before the bitmap of mode B
//!   is cleaned) and evictions write dirty pages. Modes D and B use it: D promises nothing
//!   after a crash, and B recalculates the tags of every region its bitmap still marks.
//!
//! A reader that misses holds the page's shard lock while it reads the page from disk and
//! inserts it; whatever the interleaving, a page inserted from an old disk state is updated
//! by the writer that changed it afterwards. Device-level range locks already keep a block's
//! tag bytes from being read and written at once; the shard locks only order whole pages.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::block::{BlockDevice, Result};

/// Bytes per cached page.
/// 128 sectors, the kernel's default `buffer_sectors` (its dm-bufio unit for metadata): a
/// sequential reader of a cold disk then reads its tags in one request per 64 KiB of tags
/// (8 MiB of data with 4-byte tags on 512-byte sectors), not one per 4 KiB.
const PAGE: u64 = 64 << 10;
/// Shards (independent locks).
const SHARDS: u64 = 64;
/// The smallest bound of one device's cache.
const MIN_BYTES: u64 = 16 << 20;
/// The largest bound of one device's cache: the tags of 4 GiB of data with 32-byte tags on
/// 512-byte sectors, or of 32 GiB with crc32c's 4 bytes.
const MAX_BYTES: u64 = 256 << 20;
/// The share of the machine's memory one device's cache may take, in percent: dm-bufio's
/// `DM_BUFIO_MEMORY_PERCENT`.
const MEMORY_PERCENT: u64 = 2;

/// One cached page.
struct Page {
    bytes: Box<[u8]>,
    /// The byte range changed since it was last written to the disk (written alone, as
    /// dm-bufio writes a partially dirty buffer).
    dirty: Option<(usize, usize)>,
    /// The shard's clock when the page was last used: the least recently used page of a
    /// full shard is the one evicted, as dm-bufio's LRU list does.
    used: u64,
}

/// The pages of one shard and its use clock.
#[derive(Default)]
struct Shard {
    pages: HashMap<u64, Page>,
    clock: u64,
}

impl Shard {
    /// The next tick of the use clock.
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

/// The cache of one device's tag area.
pub struct TagCache {
    shards: Vec<Mutex<Shard>>,
    /// Size of the lower device (the last page may be short).
    device_size: u64,
    /// Pages per shard before the least recently used one is evicted.
    max_pages_per_shard: usize,
    /// Dirty pages, so that a flush with none costs nothing.
    dirty: AtomicUsize,
}

/// The machine's memory in bytes, or `None` where it cannot be told.
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && size > 0).then(|| pages as u64 * size as u64)
}

/// The bound of one device's cache: dm-bufio's share of memory, within
/// [`MIN_BYTES`, `MAX_BYTES`], so that the tags of a working set the size of a usual volume
/// stay cached (a random reader then costs one system call per request, as on verity,
/// whose hash blocks are cached the same way) while a huge device cannot take the memory.
fn default_bound() -> u64 {
    physical_memory()
        .map(|m| m / 100 * MEMORY_PERCENT)
        .unwrap_or(MIN_BYTES)
        .clamp(MIN_BYTES, MAX_BYTES)
}

impl TagCache {
    /// An empty cache over a lower device of `device_size` bytes, bounded by a share of the
    /// machine's memory as dm-bufio's cache (2%, within 16 MiB..256 MiB).
    pub fn new(device_size: u64) -> TagCache {
        TagCache::with_bound(device_size, default_bound())
    }

    /// An empty cache holding at most about `bound` bytes (at least one page per shard).
    pub fn with_bound(device_size: u64, bound: u64) -> TagCache {
        TagCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            device_size,
            max_pages_per_shard: (bound / PAGE / SHARDS).max(1) as usize,
            dirty: AtomicUsize::new(0),
        }
    }

    fn shard(&self, page: u64) -> MutexGuard<'_, Shard> {
        self.shards[(page % SHARDS) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The pieces of `[offset, offset + len)` by page: (page, offset in page, offset in the
    /// caller's buffer, length).
    fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
        let mut done = 0usize;
        std::iter::from_fn(move || {
            if done >= len {
                return None;
            }
            let pos = offset + done as u64;
            let (page, at) = (pos / PAGE, (pos % PAGE) as usize);
            let n = (PAGE as usize - at).min(len - done);
            let piece = (page, at, done, n);
            done += n;
            Some(piece)
        })
    }

    /// Write `page` to the lower device if it is dirty.
    fn store(&self, lower: &dyn BlockDevice, page: u64, p: &mut Page) -> Result<()> {
        if let Some((lo, hi)) = p.dirty {
            lower.write_at(&p.bytes[lo..hi], page * PAGE + lo as u64)?;
            p.dirty = None;
            self.dirty.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Make room in a full shard: write the least recently used page if it is dirty and
    /// drop it, handing back its buffer for the page that takes its place (no allocation
    /// once the cache is full).
    fn make_room(&self, lower: &dyn BlockDevice, shard: &mut Shard) -> Result<Option<Box<[u8]>>> {
        if shard.pages.len() < self.max_pages_per_shard {
            return Ok(None);
        }
        let Some((&victim, _)) = shard.pages.iter().min_by_key(|(_, p)| p.used) else {
            return Ok(None);
        };
        let p = shard.pages.get_mut(&victim).expect("just found");
        self.store(lower, victim, p)?;
        Ok(shard.pages.remove(&victim).map(|p| p.bytes))
    }

    /// Put `page`, absent from `shard`, into it: read from the disk, or zeroed when the caller
    /// is about to `overwrite` all of it; the least recently used page of a full shard is
    /// evicted first. A failed read leaves the page out.
    fn insert_missing<'s>(
        &self,
        lower: &dyn BlockDevice,
        shard: &'s mut Shard,
        page: u64,
        overwrite: bool,
    ) -> Result<&'s mut Page> {
        let mut bytes = self
            .make_room(lower, shard)?
            .unwrap_or_else(|| vec![0u8; PAGE as usize].into_boxed_slice());
        let start = page * PAGE;
        let len = PAGE.min(self.device_size.saturating_sub(start)) as usize;
        if overwrite {
            bytes.fill(0);
        } else {
            lower.read_at(&mut bytes[..len], start)?;
            // A short last page: the bytes past the device read as zeros.
            bytes[len..].fill(0);
        }
        let used = shard.tick();
        Ok(shard.pages.entry(page).or_insert(Page {
            bytes,
            dirty: None,
            used,
        }))
    }

    /// Fill `out` with the tag area's bytes at `offset`, from the cache where it can.
    pub fn read(&self, lower: &dyn BlockDevice, offset: u64, out: &mut [u8]) -> Result<()> {
        for (page, at, from, n) in Self::pieces(offset, out.len()) {
            let mut shard = self.shard(page);
            let used = shard.tick();
            let p = match shard.pages.get_mut(&page) {
                Some(p) => {
                    p.used = used;
                    p
                }
                None => self.insert_missing(lower, &mut shard, page, false)?,
            };
            out[from..from + n].copy_from_slice(&p.bytes[at..at + n]);
        }
        Ok(())
    }

    /// Write `data` to the lower device at `offset`, then bring the cached pages up to date
    /// (or drop them when the write failed: what the disk holds is then unknown; a dirty page
    /// keeps its bytes, which are newer than the disk's).
    pub fn write(&self, lower: &dyn BlockDevice, offset: u64, data: &[u8]) -> Result<()> {
        let res = lower.write_at(data, offset);
        for (page, at, from, n) in Self::pieces(offset, data.len()) {
            let mut shard = self.shard(page);
            match shard.pages.get_mut(&page) {
                Some(p) if res.is_ok() || p.dirty.is_some() => {
                    p.bytes[at..at + n].copy_from_slice(&data[from..from + n])
                }
                Some(_) => {
                    shard.pages.remove(&page);
                }
                None => {}
            }
        }
        res
    }

    /// Put `data` at `offset` in the cached pages only (reading a page first if it is not
    /// cached), to reach the disk at the next [`flush`](TagCache::flush) or eviction.
    pub fn write_back(&self, lower: &dyn BlockDevice, offset: u64, data: &[u8]) -> Result<()> {
        for (page, at, from, n) in Self::pieces(offset, data.len()) {
            let mut shard = self.shard(page);
            let used = shard.tick();
            let p = match shard.pages.get_mut(&page) {
                Some(p) => p,
                None => {
                    let whole = at == 0 && n == PAGE as usize;
                    self.insert_missing(lower, &mut shard, page, whole)?
                }
            };
            p.used = used;
            p.bytes[at..at + n].copy_from_slice(&data[from..from + n]);
            p.dirty = match p.dirty {
                Some((lo, hi)) => Some((lo.min(at), hi.max(at + n))),
                None => {
                    self.dirty.fetch_add(1, Ordering::Relaxed);
                    Some((at, at + n))
                }
            };
        }
        Ok(())
    }

    /// Write every dirty page to the lower device (not flushing it: the caller does).
    pub fn flush(&self, lower: &dyn BlockDevice) -> Result<()> {
        if self.dirty.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let mut pages: Vec<u64> = shard
                .pages
                .iter()
                .filter(|(_, p)| p.dirty.is_some())
                .map(|(&k, _)| k)
                .collect();
            pages.sort_unstable();
            for page in pages {
                if let Some(p) = shard.pages.get_mut(&page) {
                    self.store(lower, page, p)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    /// Pages per shard of the small caches below.
    const SMALL: u64 = 4;

    fn small(size: u64) -> TagCache {
        TagCache::with_bound(size, SHARDS * SMALL * PAGE)
    }

    fn cached(c: &TagCache, page: u64) -> bool {
        c.shard(page).pages.contains_key(&page)
    }

    #[test]
    fn reads_what_was_written_across_pages_and_shards() {
        let dev = MemoryDevice::new("mem", 1 << 20);
        let c = small(1 << 20);
        let mut out = vec![0u8; 10000];
        c.read(&dev, 3000, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        let data: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
        c.write(&dev, 3000, &data).unwrap();
        c.read(&dev, 3000, &mut out).unwrap();
        assert_eq!(out, data);
        // The disk has it too (write-through).
        let mut disk = vec![0u8; 10000];
        dev.read_at(&mut disk, 3000).unwrap();
        assert_eq!(disk, data);
        // Many pages: the shards evict and still read right.
        for p in 0..(SHARDS * SMALL + 10) {
            let mut b = [0u8; 1];
            c.read(&dev, (p * PAGE) % (1 << 20), &mut b).unwrap();
        }
        c.read(&dev, 3000, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn the_bound_follows_memory_within_its_limits() {
        let b = default_bound();
        assert!((MIN_BYTES..=MAX_BYTES).contains(&b), "{b}");
        let c = TagCache::with_bound(1 << 30, 0);
        assert_eq!(c.max_pages_per_shard, 1, "at least one page per shard");
        let c = TagCache::with_bound(1 << 30, 256 << 20);
        assert_eq!(c.max_pages_per_shard, 64);
    }

    #[test]
    fn a_full_shard_evicts_its_least_recently_used_page() {
        const SIZE: u64 = 64 << 20;
        let dev = MemoryDevice::new("mem", SIZE as usize);
        let c = small(SIZE);
        // Pages 0, 64, 128, 192 share shard 0 and fill it.
        let pages: Vec<u64> = (0..=SMALL).map(|k| k * SHARDS).collect();
        let mut b = [0u8; 4];
        for &p in &pages[..SMALL as usize] {
            c.read(&dev, p * PAGE, &mut b).unwrap();
        }
        // Page 0 used again: page 64 is now the least recently used.
        c.read(&dev, 0, &mut b).unwrap();
        c.read(&dev, pages[SMALL as usize] * PAGE, &mut b).unwrap();
        assert!(cached(&c, 0), "the recently used page stays");
        assert!(!cached(&c, pages[1]), "the least recently used page goes");
        for &p in &pages[2..] {
            assert!(cached(&c, p));
        }
        assert_eq!(c.shard(0).pages.len(), SMALL as usize);
        // An evicted page is read again from the disk, as it is now.
        dev.write_at(&[3u8; 4], pages[1] * PAGE).unwrap();
        c.read(&dev, pages[1] * PAGE, &mut b).unwrap();
        assert_eq!(b, [3u8; 4]);
    }

    #[test]
    fn a_write_updates_a_cached_page_and_a_failed_one_drops_it() {
        let dev = MemoryDevice::new("mem", 1 << 20);
        let c = small(1 << 20);
        let mut b = [0u8; 8];
        c.read(&dev, 100, &mut b).unwrap();
        assert!(cached(&c, 0));
        c.write(&dev, 104, &[6u8; 8]).unwrap();
        c.read(&dev, 100, &mut b).unwrap();
        assert_eq!(b, [0, 0, 0, 0, 6, 6, 6, 6]);
        // A write that fails leaves the disk unknown: the clean page goes, and the next read
        // sees the disk (changed here behind the cache's back).
        let end = 1u64 << 20;
        let last = (end - 4) / PAGE;
        c.read(&dev, end - 4, &mut b[..4]).unwrap();
        assert!(cached(&c, last));
        dev.write_at(&[2u8; 4], end - 4).unwrap();
        assert!(c.write(&dev, end - 4, &[8u8; 8]).is_err());
        assert!(!cached(&c, last), "a failed write drops the clean page");
        assert!(cached(&c, 0), "other pages stay");
        let mut t = [0u8; 4];
        c.read(&dev, end - 4, &mut t).unwrap();
        assert_eq!(t, [2u8; 4], "read again from the disk");
    }

    #[test]
    fn write_back_reaches_the_disk_at_flush_and_at_eviction() {
        const SIZE: u64 = 32 << 20;
        let dev = MemoryDevice::new("mem", SIZE as usize);
        let c = small(SIZE);
        c.write_back(&dev, 100, &[9u8; 50]).unwrap();
        let mut disk = [0u8; 50];
        dev.read_at(&mut disk, 100).unwrap();
        assert_eq!(disk, [0u8; 50], "not yet on disk");
        let mut out = [0u8; 50];
        c.read(&dev, 100, &mut out).unwrap();
        assert_eq!(out, [9u8; 50], "reads see it");
        // A write-through of the same page keeps the dirty bytes around it.
        c.write(&dev, 4000, &[5u8; 10]).unwrap();
        c.flush(&dev).unwrap();
        dev.read_at(&mut disk, 100).unwrap();
        assert_eq!(disk, [9u8; 50]);
        let mut w = [0u8; 10];
        dev.read_at(&mut w, 4000).unwrap();
        assert_eq!(w, [5u8; 10]);
        // Filling a shard past its bound writes the evicted dirty page before it goes.
        let pages: Vec<u64> = (0..=SMALL)
            .map(|k| 1 + k * SHARDS)
            .filter(|p| p * PAGE < SIZE)
            .collect();
        assert_eq!(pages.len(), SMALL as usize + 1);
        for (k, &page) in pages.iter().enumerate() {
            c.write_back(&dev, page * PAGE, &[k as u8 + 1; 4]).unwrap();
        }
        assert!(!cached(&c, pages[0]));
        let mut b = [0u8; 4];
        dev.read_at(&mut b, pages[0] * PAGE).unwrap();
        assert_eq!(b, [1u8; 4], "the evicted dirty page was written");
        for (k, &page) in pages.iter().enumerate() {
            c.read(&dev, page * PAGE, &mut b).unwrap();
            assert_eq!(b, [k as u8 + 1; 4]);
        }
        c.flush(&dev).unwrap();
        assert_eq!(c.dirty.load(Ordering::Relaxed), 0);
        for (k, &page) in pages.iter().enumerate() {
            dev.read_at(&mut b, page * PAGE).unwrap();
            assert_eq!(b, [k as u8 + 1; 4]);
        }
    }

    #[test]
    fn a_reused_buffer_carries_nothing_over() {
        // One page per shard: every miss reuses the evicted page's buffer.
        let size = SHARDS * PAGE + 5000;
        let dev = MemoryDevice::new("mem", size as usize);
        let c = TagCache::with_bound(size, 0);
        dev.write_at(&vec![0xeeu8; PAGE as usize], 0).unwrap();
        let mut b = vec![0u8; PAGE as usize];
        c.read(&dev, 0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0xee));
        // Page SHARDS is short (5000 bytes): what lies past the device reads as zeros, not as
        // the bytes of page 0 whose buffer it took.
        let mut t = vec![1u8; 200];
        c.read(&dev, SHARDS * PAGE + 4900, &mut t).unwrap();
        assert!(t.iter().all(|&x| x == 0));
        let p = c.shard(SHARDS);
        assert!(p.pages[&SHARDS].bytes[5000..].iter().all(|&x| x == 0));
        drop(p);
        // A whole-page write-back into a reused buffer starts from zeros too.
        c.read(&dev, 0, &mut b).unwrap();
        c.write_back(&dev, SHARDS * PAGE, &[4u8; 16]).unwrap();
        let mut r = [0u8; 32];
        c.read(&dev, SHARDS * PAGE, &mut r).unwrap();
        assert_eq!(&r[..16], &[4u8; 16]);
        assert_eq!(&r[16..], &[0u8; 16]);
    }

    #[test]
    fn a_short_last_page_and_a_failed_write() {
        let dev = MemoryDevice::new("mem", 5000);
        let c = TagCache::new(5000);
        let mut b = [0u8; 8];
        c.read(&dev, 4992, &mut b).unwrap();
        assert!(c.write(&dev, 4996, &[1u8; 8]).is_err());
        c.write(&dev, 4990, &[7u8; 10]).unwrap();
        let mut b = [0u8; 10];
        c.read(&dev, 4990, &mut b).unwrap();
        assert_eq!(b, [7u8; 10]);
    }
}
