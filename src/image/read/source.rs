//! The bytes a reader reads: a [`BlockDevice`] (for an image, its verified verity device)
//! behind a small cache of recently read blocks, since readers make many small reads of the
//! same metadata blocks and each verified read of a block hashes it again.

use super::{ReadError, Result};
use crate::block::BlockDevice;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Cached blocks' size.
const BLOCK: u64 = 4096;
/// Blocks kept (1 MiB): enough for a tree walk's metadata, bounded whatever the image says.
const CACHED: usize = 256;

/// A read-only byte source with a bounded block cache.
#[derive(Clone)]
pub struct Source {
    dev: Arc<dyn BlockDevice>,
    cache: Arc<Mutex<HashMap<u64, Arc<Vec<u8>>>>>,
}

impl Source {
    /// Reads of `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>) -> Source {
        Source {
            dev,
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A source over bytes in memory (tests, fuzzing).
    pub fn from_vec(data: Vec<u8>) -> Source {
        let dev = crate::block::MemoryDevice::from_vec("memory", data).into_read_only();
        Source::new(Arc::new(dev))
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.dev.size()
    }

    fn block(&self, n: u64) -> Result<Arc<Vec<u8>>> {
        if let Some(b) = self.cache.lock().expect("cache lock").get(&n) {
            return Ok(b.clone());
        }
        let start = n * BLOCK;
        let len = BLOCK.min(self.size() - start) as usize;
        let mut buf = vec![0u8; len];
        self.dev
            .read_at(&mut buf, start)
            .map_err(|e| ReadError::Io(e.to_string()))?;
        let b = Arc::new(buf);
        let mut c = self.cache.lock().expect("cache lock");
        if c.len() >= CACHED {
            c.clear();
        }
        c.insert(n, b.clone());
        Ok(b)
    }

    /// Fill `buf` from `offset`; reading past the end is an error (the metadata pointed
    /// outside the file system).
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size())
            .ok_or_else(|| {
                ReadError::Corrupt(format!(
                    "read of {} bytes at byte {offset} past the end of the file system ({} bytes)",
                    buf.len(),
                    self.size()
                ))
            })?;
        // Large reads (file data) go straight to the device: one verified read, no cache churn.
        if buf.len() as u64 >= 4 * BLOCK {
            return self
                .dev
                .read_at(buf, offset)
                .map_err(|e| ReadError::Io(e.to_string()));
        }
        let mut pos = offset;
        let mut done = 0;
        while pos < end {
            let b = self.block(pos / BLOCK)?;
            let skip = (pos % BLOCK) as usize;
            let n = (b.len() - skip).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&b[skip..skip + n]);
            done += n;
            pos += n as u64;
        }
        Ok(())
    }

    /// `len` bytes from `offset`, refused above `max` (a length from untrusted metadata).
    pub fn read_vec(&self, offset: u64, len: u64, max: u64) -> Result<Vec<u8>> {
        if len > max {
            return Err(ReadError::Corrupt(format!(
                "length {len} at byte {offset} is over the limit of {max}"
            )));
        }
        let mut v = vec![0u8; len as usize];
        self.read_exact_at(&mut v, offset)?;
        Ok(v)
    }
}

/// `std::io::Read + Seek` over a [`Source`], for readers that take one (backhand).
pub struct Cursor {
    src: Source,
    pos: u64,
    last_error: Arc<Mutex<Option<String>>>,
}

impl Cursor {
    /// A cursor at the start of `src`; the text of the last read that failed is kept in
    /// `last_error` (a reader that wraps I/O errors loses it).
    pub fn new(src: Source, last_error: Arc<Mutex<Option<String>>>) -> Cursor {
        Cursor {
            src,
            pos: 0,
            last_error,
        }
    }

    fn fail(&self, e: ReadError) -> std::io::Error {
        let text = e.to_string();
        *self.last_error.lock().expect("error lock") = Some(text.clone());
        std::io::Error::other(text)
    }
}

impl std::io::Read for Cursor {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.src.size().saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        // A buffered reader asks for more than it needs: when that fails, read only to the end
        // of the current block, so a bad block next to the one wanted fails only the read
        // that really needs it.
        let n = match self.src.read_exact_at(&mut buf[..n], self.pos) {
            Ok(()) => n,
            Err(_) if n as u64 > BLOCK - self.pos % BLOCK => {
                let m = (BLOCK - self.pos % BLOCK) as usize;
                self.src
                    .read_exact_at(&mut buf[..m], self.pos)
                    .map_err(|e| self.fail(e))?;
                m
            }
            Err(e) => return Err(self.fail(e)),
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for Cursor {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        use std::io::SeekFrom;
        let new = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.src.size().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        Ok(self.pos)
    }
}
