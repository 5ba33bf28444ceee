//! The crypt target in an authenticated mode (LUKS2 `--integrity`): dm-crypt over a
//! dm-integrity device without internal hash. Every sector is sealed on write, its
//! metadata (tag, and IV when random) handed down as the integrity device's tag; on read the
//! tags come back with the data and every sector is verified before it is decrypted.
//!
//! A sector that does not verify fails the whole request with `EIO` (`Corrupt`), is logged
//! (the kernel's `INTEGRITY AEAD ERROR, sector N`) and counted; the caller's buffer is zeroed,
//! so nothing unauthenticated is ever returned. A small request is served inline on the
//! serving thread; a large one is split over the cores, each part read and opened (or copied
//! and sealed) by its own thread, so that the copy out of the lower device is not a serial step
//! beside the hashing.

use crate::block::{
    check_range, side_by_side, BlockDevice, BlockError, Result, TaggedBlockDevice, TaggedPiece,
};
use crate::crypt::cipher::SectorAead;
use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters shown by `dmkit status`.
#[derive(Debug, Default)]
pub struct AeadStats {
    /// Sectors verified and decrypted.
    pub sectors_decrypted: AtomicU64,
    /// Sectors sealed.
    pub sectors_encrypted: AtomicU64,
    /// Sectors whose tag did not verify.
    pub auth_failures: AtomicU64,
}

impl AeadStats {
    /// The counters as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "sectors_decrypted": g(&self.sectors_decrypted),
            "sectors_encrypted": g(&self.sectors_encrypted),
            "integrity_errors": g(&self.auth_failures),
        })
    }
}

/// Largest piece of a request sealed or opened at once (bounds the scratch buffers).
const CHUNK: usize = 1 << 20;

thread_local! {
    /// Per serving thread: the ciphertext of the write being served, and the tags of the
    /// request (no plaintext is left in them), reused so a request allocates nothing.
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Run `f` with this thread's scratch buffers, sized `data` and `tags` bytes (fresh ones
/// when they are in use further up the stack on this thread).
fn with_scratch<R>(data: usize, tags: usize, f: impl FnOnce(&mut [u8], &mut [u8]) -> R) -> R {
    SCRATCH.with(|c| {
        let mut own = (Vec::new(), Vec::new());
        let mut guard = c.try_borrow_mut();
        let (d, t) = match guard.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut own,
        };
        d.resize(d.len().max(data), 0);
        t.resize(t.len().max(tags), 0);
        f(&mut d[..data], &mut t[..tags])
    })
}

/// dm-crypt with `integrity:N:aead` (or `:none`) over a tag-carrying device.
pub struct AeadCryptDevice {
    name: String,
    lower: Arc<dyn TaggedBlockDevice>,
    aead: SectorAead,
    read_only: bool,
    stats: Arc<AeadStats>,
}

impl AeadCryptDevice {
    /// The target over `lower`, whose blocks must be the encryption sectors and whose tags
    /// must hold the mode's metadata.
    pub fn new(
        name: &str,
        lower: Arc<dyn TaggedBlockDevice>,
        aead: SectorAead,
        read_only: bool,
    ) -> std::result::Result<AeadCryptDevice, String> {
        let ss = aead.sector_size();
        if lower.logical_block_size() as usize != ss {
            return Err(format!(
                "{}: integrity block size {} differs from the encryption sector size {ss}",
                lower.name(),
                lower.logical_block_size()
            ));
        }
        if lower.tag_size() < aead.kind().metadata_size() {
            return Err(format!(
                "{}: integrity tags of {} bytes cannot hold {} bytes of {:?} metadata",
                lower.name(),
                lower.tag_size(),
                aead.kind().metadata_size(),
                aead.kind()
            ));
        }
        Ok(AeadCryptDevice {
            name: name.to_string(),
            read_only: read_only || lower.read_only(),
            lower,
            aead,
            stats: Arc::new(AeadStats::default()),
        })
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<AeadStats> {
        self.stats.clone()
    }

    fn check(&self, offset: u64, len: usize) -> Result<()> {
        check_range(&self.name, offset, len, self.size())?;
        let mask = self.aead.sector_size() as u64 - 1;
        if offset & mask != 0 || len as u64 & mask != 0 {
            return Err(BlockError::Io {
                device: self.name.clone(),
                offset,
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        Ok(())
    }

    fn crypto_error(&self, offset: u64, e: impl std::fmt::Display) -> BlockError {
        BlockError::Io {
            device: self.name.clone(),
            offset,
            source: io::Error::other(e.to_string()),
        }
    }

    fn chunk(&self) -> usize {
        CHUNK - CHUNK % self.aead.sector_size()
    }
}

impl BlockDevice for AeadCryptDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.lower.size()
    }
    fn logical_block_size(&self) -> u32 {
        self.aead.sector_size() as u32
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len())?;
        let ss = self.aead.sector_size();
        let ts = self.lower.tag_size();
        let most = buf.len().min(self.chunk());
        with_scratch(0, most / ss * ts, |_, tags| {
            self.read_chunks(buf, tags, offset)
        })
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        self.check(offset, buf.len())?;
        if self.aead.seal_cannot_fail() {
            return self.seal_into_lower(buf, offset);
        }
        let ss = self.aead.sector_size();
        let ts = self.lower.tag_size();
        let most = buf.len().min(self.chunk());
        with_scratch(most, most / ss * ts, |scratch, tags| {
            let mut done = 0;
            while done < buf.len() {
                let n = self.chunk().min(buf.len() - done);
                let off = offset + done as u64;
                let (s, t) = (&mut scratch[..n], &mut tags[..n / ss * ts]);
                let results = self.in_parts(&buf[done..done + n], s, t, off, &|at, src, s, t| {
                    self.aead
                        .seal_sectors_from(at / 512, src, s, t, ts)
                        .map_err(|e| self.crypto_error(at, e))
                });
                results.into_iter().collect::<Result<Vec<()>>>()?;
                self.lower.write_tagged(s, t, off)?;
                self.stats
                    .sectors_encrypted
                    .fetch_add((n / ss) as u64, Ordering::Relaxed);
                done += n;
            }
            Ok(())
        })
    }
    fn flush(&self) -> Result<()> {
        self.lower.flush()
    }
    fn hand_over(&self) {
        self.lower.hand_over()
    }
}

impl AeadCryptDevice {
    /// Run `work` on the parts of one chunk side by side, on as many threads as
    /// [`SectorAead::parallel_parts`] gives for its size (the calling thread and scoped threads
    /// of the pool, each taking the next part as it finishes one; no queue). `work` gets each
    /// part's byte offset on the device, its slice of `src` (empty when `src` is), of `data`
    /// and of `tags`.
    #[allow(clippy::type_complexity)]
    fn in_parts<R: Send>(
        &self,
        src: &[u8],
        data: &mut [u8],
        tags: &mut [u8],
        offset: u64,
        work: &(dyn Fn(u64, &[u8], &mut [u8], &mut [u8]) -> Result<R> + Sync),
    ) -> Vec<Result<R>> {
        let ss = self.aead.sector_size();
        let ts = self.lower.tag_size();
        let parts = self.aead.parallel_parts(data.len());
        if parts <= 1 {
            return vec![work(offset, src, data, tags)];
        }
        // Four shares per core, each core taking the next as it finishes one.
        let per = (data.len() / ss).div_ceil(parts * 4);
        let jobs: Vec<_> = data
            .chunks_mut(per * ss)
            .zip(tags.chunks_mut(per * ts))
            .enumerate()
            .map(|(i, (d, t))| {
                let at = offset + (i * per * ss) as u64;
                let from = (i * per * ss).min(src.len());
                let to = (from + d.len()).min(src.len());
                (at, &src[from..to], d, t)
            })
            .collect();
        side_by_side::share(jobs, parts, &|(at, src, d, t)| work(at, src, d, t))
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(self.panicked(offset))))
            .collect()
    }

    fn panicked(&self, offset: u64) -> BlockError {
        self.crypto_error(offset, "a crypto thread panicked")
    }

    /// Seal `buf` (whole sectors at `offset`) straight into the lower device's memory, a chunk
    /// at a time, the sectors of a chunk split over the cores: the ciphertext is written once,
    /// where the journal keeps it, and the plaintext is never copied. Only for a mode whose
    /// sealing cannot fail, since the lower device has taken the sectors once it lends them;
    /// if a seal fails all the same, the chunk's sectors are stored zeroed with zero tags,
    /// so they fail to verify rather than read back wrong.
    fn seal_into_lower(&self, buf: &[u8], offset: u64) -> Result<()> {
        let ss = self.aead.sector_size();
        let ts = self.lower.tag_size();
        let mut done = 0;
        while done < buf.len() {
            let n = self.chunk().min(buf.len() - done);
            let off = offset + done as u64;
            let src = &buf[done..done + n];
            let mut failed = None;
            self.lower.write_tagged_with(off, n, &mut |pieces| {
                // `fill` may be called more than once per write: keep the first failure.
                if let Err(e) = self.seal_pieces(src, off, pieces, ss, ts) {
                    failed.get_or_insert(e);
                    for p in pieces.iter_mut() {
                        p.data.fill(0);
                        p.tags.fill(0);
                    }
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
            self.stats
                .sectors_encrypted
                .fetch_add((n / ss) as u64, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }

    /// Seal the plaintext `src` (at byte `offset`) into `pieces`, split over the cores.
    fn seal_pieces(
        &self,
        src: &[u8],
        offset: u64,
        pieces: &mut [TaggedPiece<'_>],
        ss: usize,
        ts: usize,
    ) -> Result<()> {
        let seal = |at: u64, d: &mut [u8], t: &mut [u8]| -> Result<()> {
            let from = (at - offset) as usize;
            let plain = src.get(from..from + d.len()).ok_or_else(|| {
                self.crypto_error(at, "the lower device lent sectors outside the write")
            })?;
            self.aead
                .seal_sectors_from(at / 512, plain, d, t, ts)
                .map_err(|e| self.crypto_error(at, e))
        };
        // Split by what this call fills: the journal may hand a write's pieces over in more
        // than one call, one of them a single section.
        let parts = self
            .aead
            .parallel_parts(pieces.iter().map(|p| p.data.len()).sum());
        if parts == 1 {
            // A small write: on this thread, nothing to split.
            return pieces
                .iter_mut()
                .try_for_each(|p| seal(p.offset, p.data, p.tags));
        }
        // Four shares per core, each core taking the next as it finishes one.
        let groups = side_by_side::split_pieces(pieces, parts * 4, ss, ts);
        let work = |group: Vec<side_by_side::Span<'_>>| -> Result<()> {
            group.into_iter().try_for_each(|(at, d, t)| seal(at, d, t))
        };
        side_by_side::share(groups, parts, &work)
            .into_iter()
            .try_for_each(|r| r.unwrap_or_else(|| Err(self.panicked(offset))))
    }

    /// Read, verify and decrypt `buf` at `offset` a chunk at a time, with `tags` for a
    /// chunk's tags.
    fn read_chunks(&self, buf: &mut [u8], tags: &mut [u8], offset: u64) -> Result<()> {
        let ss = self.aead.sector_size();
        let ts = self.lower.tag_size();
        let mut done = 0;
        while done < buf.len() {
            let n = self.chunk().min(buf.len() - done);
            let t = &mut tags[..n / ss * ts];
            let off = offset + done as u64;
            let piece = &mut buf[done..done + n];
            // Each part is read and opened by its own core: the copy out of the lower device
            // is not a serial step before the hashing.
            let results = self.in_parts(&[], piece, t, off, &|at, _, d, t| {
                self.lower.read_tagged(d, t, at)?;
                self.aead
                    .open_sectors(at / 512, d, t, ts)
                    .map_err(|e| self.crypto_error(at, e))
            });
            let mut bad = Vec::new();
            for r in results {
                match r {
                    Ok(b) => bad.extend(b),
                    Err(e) => {
                        buf.fill(0);
                        return Err(e);
                    }
                }
            }
            if let Some(&first) = bad.first() {
                self.stats
                    .auth_failures
                    .fetch_add(bad.len() as u64, Ordering::Relaxed);
                for s in &bad {
                    eprintln!("dmkit: {}: INTEGRITY AEAD ERROR, sector {s}", self.name);
                }
                buf.fill(0);
                // The block in this device's sector size (the log line above has the kernel's
                // 512-byte sector).
                return Err(BlockError::Corrupt {
                    device: self.name.clone(),
                    what: "data",
                    block: first * 512 / ss as u64,
                });
            }
            self.stats
                .sectors_decrypted
                .fetch_add((n / ss) as u64, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }
}
