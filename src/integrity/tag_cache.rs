//! A cache of the tag area, as the kernel keeps its metadata in dm-bufio buffers: a read of a
//! few blocks needs a few bytes of tags, and without the cache every read would cost a second
//! system call for them. Pages of 4 KiB of the lower device, write-through (the bytes on disk
//! are always current: ordering and crash safety are the callers', exactly as without the
//! cache), bounded, and kept consistent without a global lock:
//!
//! - a reader that misses holds the page's shard lock while it reads the page from disk and
//!   inserts it;
//! - a writer writes the disk first, then updates each cached page under its shard lock.
//!
//! Whatever the interleaving, a page inserted from an old disk state is updated by the writer
//! that changed it afterwards. Device-level range locks already keep a block's tag bytes from
//! being read and written at once; the shard locks only order whole pages.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::block::{BlockDevice, Result};

/// Bytes per cached page.
const PAGE: u64 = 4096;
/// Shards (independent locks).
const SHARDS: u64 = 64;
/// Pages per shard before it is emptied: 64 x 64 x 4 KiB = 16 MiB at most per device.
const MAX_PAGES_PER_SHARD: usize = 64;

/// The cache of one device's tag area.
pub struct TagCache {
    shards: Vec<Mutex<HashMap<u64, Box<[u8]>>>>,
    /// Size of the lower device (the last page may be short).
    device_size: u64,
}

impl TagCache {
    /// An empty cache over a lower device of `device_size` bytes.
    pub fn new(device_size: u64) -> TagCache {
        TagCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            device_size,
        }
    }

    fn shard(&self, page: u64) -> MutexGuard<'_, HashMap<u64, Box<[u8]>>> {
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

    /// Fill `out` with the lower device's bytes at `offset`, from the cache where it can.
    pub fn read(&self, lower: &dyn BlockDevice, offset: u64, out: &mut [u8]) -> Result<()> {
        for (page, at, from, n) in Self::pieces(offset, out.len()) {
            let mut shard = self.shard(page);
            if let Some(p) = shard.get(&page) {
                out[from..from + n].copy_from_slice(&p[at..at + n]);
                continue;
            }
            let start = page * PAGE;
            let len = PAGE.min(self.device_size.saturating_sub(start)) as usize;
            let mut p = vec![0u8; PAGE as usize].into_boxed_slice();
            lower.read_at(&mut p[..len], start)?;
            out[from..from + n].copy_from_slice(&p[at..at + n]);
            if shard.len() >= MAX_PAGES_PER_SHARD {
                shard.clear();
            }
            shard.insert(page, p);
        }
        Ok(())
    }

    /// Write `data` to the lower device at `offset`, then bring the cached pages up to date
    /// (or drop them when the write failed: what the disk holds is then unknown).
    pub fn write(&self, lower: &dyn BlockDevice, offset: u64, data: &[u8]) -> Result<()> {
        let res = lower.write_at(data, offset);
        for (page, at, from, n) in Self::pieces(offset, data.len()) {
            let mut shard = self.shard(page);
            if res.is_err() {
                shard.remove(&page);
            } else if let Some(p) = shard.get_mut(&page) {
                p[at..at + n].copy_from_slice(&data[from..from + n]);
            }
        }
        res
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
