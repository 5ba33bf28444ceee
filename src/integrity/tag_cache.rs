//! A cache of the tag area, as the kernel keeps its metadata in dm-bufio buffers: a read of a
//! few blocks needs a few bytes of tags, and without the cache every read would cost a second
//! system call for them. Pages of 4 KiB of the lower device, bounded, kept consistent without
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
/// Pages per shard before it is emptied: 64 x 4 x 64 KiB = 16 MiB at most per device.
const MAX_PAGES_PER_SHARD: usize = 4;

/// One cached page.
struct Page {
    bytes: Box<[u8]>,
    /// The byte range changed since it was last written to the disk (written alone, as
    /// dm-bufio writes a partially dirty buffer).
    dirty: Option<(usize, usize)>,
}

type Shard = HashMap<u64, Page>;

/// The cache of one device's tag area.
pub struct TagCache {
    shards: Vec<Mutex<Shard>>,
    /// Size of the lower device (the last page may be short).
    device_size: u64,
    /// Dirty pages, so that a flush with none costs nothing.
    dirty: AtomicUsize,
}

impl TagCache {
    /// An empty cache over a lower device of `device_size` bytes.
    pub fn new(device_size: u64) -> TagCache {
        TagCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            device_size,
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

    /// The bytes of `page` on the lower device (a short last page padded with zeros).
    fn load(&self, lower: &dyn BlockDevice, page: u64) -> Result<Page> {
        let start = page * PAGE;
        let len = PAGE.min(self.device_size.saturating_sub(start)) as usize;
        let mut bytes = vec![0u8; PAGE as usize].into_boxed_slice();
        lower.read_at(&mut bytes[..len], start)?;
        Ok(Page { bytes, dirty: None })
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

    /// Make room in a full shard: write its dirty pages, then empty it.
    fn make_room(&self, lower: &dyn BlockDevice, shard: &mut Shard) -> Result<()> {
        if shard.len() < MAX_PAGES_PER_SHARD {
            return Ok(());
        }
        for (&page, p) in shard.iter_mut() {
            self.store(lower, page, p)?;
        }
        shard.clear();
        Ok(())
    }

    /// Put `page`, absent from `shard`, into it: read from the disk, or zeroed when the caller
    /// is about to `overwrite` all of it; a full shard is emptied first.
    fn insert_missing<'s>(
        &self,
        lower: &dyn BlockDevice,
        shard: &'s mut Shard,
        page: u64,
        overwrite: bool,
    ) -> Result<&'s mut Page> {
        let p = if overwrite {
            Page {
                bytes: vec![0u8; PAGE as usize].into_boxed_slice(),
                dirty: None,
            }
        } else {
            self.load(lower, page)?
        };
        self.make_room(lower, shard)?;
        Ok(shard.entry(page).or_insert(p))
    }

    /// Fill `out` with the tag area's bytes at `offset`, from the cache where it can.
    pub fn read(&self, lower: &dyn BlockDevice, offset: u64, out: &mut [u8]) -> Result<()> {
        for (page, at, from, n) in Self::pieces(offset, out.len()) {
            let mut shard = self.shard(page);
            if let Some(p) = shard.get(&page) {
                out[from..from + n].copy_from_slice(&p.bytes[at..at + n]);
                continue;
            }
            let p = self.insert_missing(lower, &mut shard, page, false)?;
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
            match shard.get_mut(&page) {
                Some(p) if res.is_ok() || p.dirty.is_some() => {
                    p.bytes[at..at + n].copy_from_slice(&data[from..from + n])
                }
                Some(_) => {
                    shard.remove(&page);
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
            if !shard.contains_key(&page) {
                self.insert_missing(lower, &mut shard, page, at == 0 && n == PAGE as usize)?;
            }
            let p = shard.get_mut(&page).expect("present or inserted above");
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
                .iter()
                .filter(|(_, p)| p.dirty.is_some())
                .map(|(&k, _)| k)
                .collect();
            pages.sort_unstable();
            for page in pages {
                if let Some(p) = shard.get_mut(&page) {
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

    #[test]
    fn reads_what_was_written_across_pages_and_shards() {
        let dev = MemoryDevice::new("mem", 1 << 20);
        let c = TagCache::new(1 << 20);
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
        // Many pages: the shards empty themselves and still read right.
        for p in 0..(SHARDS * MAX_PAGES_PER_SHARD as u64 + 10) {
            let mut b = [0u8; 1];
            c.read(&dev, (p * PAGE) % (1 << 20), &mut b).unwrap();
        }
        c.read(&dev, 3000, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn write_back_reaches_the_disk_at_flush_and_at_eviction() {
        const SIZE: u64 = 32 << 20;
        let dev = MemoryDevice::new("mem", SIZE as usize);
        let c = TagCache::new(SIZE);
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
        // Filling a shard past its bound writes its dirty pages before they are dropped.
        for k in 0..=MAX_PAGES_PER_SHARD as u64 {
            let page = 1 + k * SHARDS;
            if page * PAGE < SIZE {
                c.write_back(&dev, page * PAGE, &[k as u8 + 1; 4]).unwrap();
            }
        }
        for k in 0..=MAX_PAGES_PER_SHARD as u64 {
            let page = 1 + k * SHARDS;
            if page * PAGE < SIZE {
                let mut b = [0u8; 4];
                c.read(&dev, page * PAGE, &mut b).unwrap();
                assert_eq!(b, [k as u8 + 1; 4]);
            }
        }
        c.flush(&dev).unwrap();
        assert_eq!(c.dirty.load(Ordering::Relaxed), 0);
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
