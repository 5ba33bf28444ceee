//! The verified device: a read-only [`BlockDevice`] that checks every data block it returns
//! against the hash tree, on the thread serving the request.
//!
//! Hash blocks are verified once, up to the root, and kept in a bounded cache; data blocks are
//! verified on every read, or only the first time with `check_at_most_once` (as the kernel's
//! option of that name, which only defends against offline tampering).
//!
//! Verified data blocks are kept in a bounded cache, the userspace counterpart of the page
//! cache the kernel's dm-verity sits under: a block is hashed when it is read from the data
//! device, and served from memory, already trusted, while it stays cached. Changing the data
//! device afterwards cannot change what is served, so this is no weaker than verifying every
//! read (unlike `check_at_most_once`, which re-reads unverified data).

use super::cache::BlockCache;
use super::data_cache::DataCache;
use super::fec::source::FecSource;
use super::params::{TreeLayout, VerityParams};
use super::store::BlockStore;
use crate::block::{check_range, side_by_side, BlockDevice, BlockError, Result};
use crate::hash::hash_blocks;
use crate::logcap::LogCap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Run-time options of a verified device.
#[derive(Debug, Clone)]
pub struct VerityOptions {
    /// Name used in messages (the device name given to `open`).
    pub name: String,
    /// Verify each data block only on its first read.
    pub check_at_most_once: bool,
    /// Log corruption and serve the data anyway.
    pub ignore_corruption: bool,
    /// Most hash blocks to keep verified in memory.
    pub cache_blocks: usize,
    /// Bytes of verified data blocks to keep in memory (0: hash every read).
    pub data_cache_bytes: u64,
    /// The FEC device and its options: corrupt blocks are rebuilt from it (the verity
    /// superblock does not name it, so it is given at every open, as with veritysetup).
    pub fec: Option<(std::path::PathBuf, super::fec::FecOptions)>,
}

/// Default size of the verified data cache.
pub const DEFAULT_DATA_CACHE_BYTES: u64 = 256 << 20;

impl Default for VerityOptions {
    fn default() -> Self {
        VerityOptions {
            name: "verity".to_string(),
            check_at_most_once: false,
            ignore_corruption: false,
            cache_blocks: 16384,
            data_cache_bytes: DEFAULT_DATA_CACHE_BYTES,
            fec: None,
        }
    }
}

/// Counters shown by `dmkit status`.
#[derive(Debug, Default)]
pub struct VerityStats {
    /// Data blocks whose digest did not match.
    pub data_corruptions: AtomicU64,
    /// Hash blocks whose digest did not match their parent.
    pub hash_corruptions: AtomicU64,
    /// Data blocks verified.
    pub verified_blocks: AtomicU64,
    /// Hash blocks read from the hash device (cache misses).
    pub hash_block_reads: AtomicU64,
    /// Data blocks served from the verified data cache.
    pub data_cache_hits: AtomicU64,
    /// Blocks (data or hash) that failed their digest and were rebuilt from the FEC area.
    pub fec_corrected: AtomicU64,
    /// Blocks that failed their digest and the FEC area could not rebuild.
    pub fec_uncorrectable: AtomicU64,
    /// Whether the device has a FEC area (the FEC counters are shown only then).
    pub fec: std::sync::atomic::AtomicBool,
    /// Data blocks served from the block store (the remote layer's persistent cache), each
    /// verified again.
    pub store_hits: AtomicU64,
    /// Stored copies that failed their digest (a tampered or torn cache entry): dropped and
    /// fetched again from the origin.
    pub store_rejects: AtomicU64,
    /// Data blocks fetched again from the origin after failing their digest.
    pub refetches: AtomicU64,
    /// Of those, the blocks that verified the second time.
    pub refetch_recovered: AtomicU64,
    /// Whether the device has a block store (its counters are shown only then).
    pub store: std::sync::atomic::AtomicBool,
}

/// How many FEC corrections may be in progress on one thread. The kernel allowed four nested
/// ones (`DM_VERITY_FEC_MAX_RECURSION`) until "dm-verity: disable recursive forward error
/// correction" (6.19, backported to the stable kernels: Debian 12's 6.1.192 has it), which
/// made a correction needed inside a correction fail with EIO: the nesting cost up to 253^4
/// round reads, and the nested call overwrote the outer one's buffers.
pub const FEC_MAX_RECURSION: u32 = 1;

thread_local! {
    /// FEC corrections in progress on this thread (the kernel's per-bio `fio->level`).
    static FEC_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The hash device as the kernel's FEC reads it: through dm-bufio, where a hash block
/// corrected from the FEC area replaced the bytes read, so a later round sees the corrected
/// block while it stays cached (verified blocks are the bytes on disk anyway).
struct CachedHash<'a> {
    dev: &'a VerityDevice,
}

impl BlockDevice for CachedHash<'_> {
    fn name(&self) -> &str {
        self.dev.hash.name()
    }
    fn size(&self) -> u64 {
        self.dev.hash.size()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let hbs = self.dev.layout.hash_block_size;
        if offset.is_multiple_of(hbs) && buf.len() as u64 == hbs {
            if let Some(b) = self.dev.cache.get(offset / hbs) {
                buf.copy_from_slice(&b);
                return Ok(());
            }
        }
        self.dev.hash.read_at(buf, offset)
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(BlockError::ReadOnly {
            device: self.dev.hash.name().to_string(),
        })
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

/// A dm-verity target.
pub struct VerityDevice {
    data: Arc<dyn BlockDevice>,
    hash: Arc<dyn BlockDevice>,
    params: VerityParams,
    layout: TreeLayout,
    root: Vec<u8>,
    opts: VerityOptions,
    cache: BlockCache,
    /// Verified data blocks; `None` when disabled, or when corruption is ignored (a corrupt
    /// block must be logged on every read, never cached as good).
    data_cache: Option<DataCache>,
    /// One bit per data block, set once verified (only with `check_at_most_once`).
    verified: Option<Vec<AtomicU64>>,
    stats: Arc<VerityStats>,
    /// Ignored corruptions are logged here (the exporter logs the ones it returns as errors).
    ignored_log: LogCap,
    /// The FEC area corrupt blocks are rebuilt from, if any.
    fec: Option<FecSource>,
    /// Where data blocks are also kept and fetched again from (remote images).
    store: Option<Arc<dyn BlockStore>>,
    /// Corrections and failed corrections are logged here.
    fec_log: LogCap,
}

impl VerityDevice {
    /// Build the device. Sizes must already have been checked against the parameters.
    pub fn new(
        data: Arc<dyn BlockDevice>,
        hash: Arc<dyn BlockDevice>,
        params: VerityParams,
        root: Vec<u8>,
        opts: VerityOptions,
    ) -> std::result::Result<Self, super::params::ParamsError> {
        params.validate()?;
        let layout = TreeLayout::new(&params)?;
        let verified = opts.check_at_most_once.then(|| {
            (0..params.data_blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect()
        });
        Ok(VerityDevice {
            cache: BlockCache::new(opts.cache_blocks),
            data_cache: (opts.data_cache_bytes >= params.data_block_size as u64
                && !opts.ignore_corruption)
                .then(|| {
                    DataCache::new(
                        (opts.data_cache_bytes / params.data_block_size as u64) as usize,
                        params.data_block_size as usize,
                    )
                }),
            data,
            hash,
            params,
            layout,
            root,
            opts,
            verified,
            stats: Arc::new(VerityStats::default()),
            ignored_log: LogCap::new("ignored corruptions", crate::logcap::DEFAULT_LIMIT),
            fec: None,
            store: None,
            fec_log: LogCap::new("FEC corrections", crate::logcap::DEFAULT_LIMIT),
        })
    }

    /// The device with `fec` to rebuild corrupt blocks from.
    pub fn with_fec(mut self, fec: FecSource) -> Self {
        self.fec = Some(fec);
        self.stats.fec.store(true, Ordering::Relaxed);
        self
    }

    /// The device with `store` to serve data blocks from (each verified again) and to keep
    /// verified data blocks in; a block failing its digest is fetched again through it.
    pub fn with_store(mut self, store: Arc<dyn BlockStore>) -> Self {
        self.store = Some(store);
        self.stats.store.store(true, Ordering::Relaxed);
        self
    }

    /// `what` block `block` (covered index `index`) failed its digest: its bytes rebuilt from
    /// the FEC area if they then hash to `want`, counted and logged either way.
    ///
    /// A correction's erasure pass looks up the digests of the round's other data blocks,
    /// which may need a hash block corrected in turn: as in the kernel, that nested
    /// correction fails at once ([`FEC_MAX_RECURSION`]), silently, so the data blocks under
    /// that hash block are not marked as erasures.
    fn rebuild(&self, what: &str, block: u64, index: Option<u64>, want: &[u8]) -> Option<Vec<u8>> {
        let (fec, index) = (self.fec.as_ref()?, index?);
        let name = &self.opts.name;
        let depth = FEC_DEPTH.with(|d| d.get());
        if depth >= FEC_MAX_RECURSION {
            return None;
        }
        FEC_DEPTH.with(|d| d.set(depth + 1));
        let is_bad = |d: u64, bytes: &[u8]| {
            self.data_digest(d)
                .is_some_and(|want| self.hash_one(bytes) != want)
        };
        let hash = CachedHash { dev: self };
        let r = fec.rebuild(&*self.data, &hash, index, &is_bad, |b| {
            self.hash_one(b) == want
        });
        FEC_DEPTH.with(|d| d.set(depth));
        match r {
            Ok(Some(bytes)) => {
                self.stats.fec_corrected.fetch_add(1, Ordering::Relaxed);
                self.fec_log
                    .log(|| format!("{name}: {what} block {block} corrected from the FEC area"));
                Some(bytes)
            }
            Ok(None) => {
                self.stats.fec_uncorrectable.fetch_add(1, Ordering::Relaxed);
                self.fec_log
                    .log(|| format!("{name}: {what} block {block} is beyond what FEC corrects"));
                None
            }
            Err(e) => {
                self.stats.fec_uncorrectable.fetch_add(1, Ordering::Relaxed);
                self.fec_log
                    .log(|| format!("{name}: {what} block {block}: FEC failed: {e}"));
                None
            }
        }
    }

    /// The digest the tree expects for data block `block` (`verity_hash_for_block`), `None`
    /// when its hash blocks cannot be verified or corrected.
    fn data_digest(&self, block: u64) -> Option<Vec<u8>> {
        if self.layout.levels() == 0 {
            return Some(self.root.clone());
        }
        let bits = self.layout.hashes_per_block_bits;
        let hb = self.hash_block(0, block >> bits).ok()?;
        let pos = (block & ((1 << bits) - 1)) as usize * self.layout.entry_size;
        Some(hb[pos..pos + self.layout.digest_size].to_vec())
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<VerityStats> {
        self.stats.clone()
    }

    /// The tree geometry.
    pub fn layout(&self) -> &TreeLayout {
        &self.layout
    }

    /// Check the top of the tree against the root hash (cheap: one hash block). Used by `open`
    /// to refuse a wrong root hash, salt or hash device up front; logs nothing and counts
    /// nothing, since it runs before the device serves anyone.
    pub fn check_root(&self) -> Result<bool> {
        let levels = self.layout.levels();
        let (mut buf, offset, dev) = if levels == 0 {
            (
                vec![0u8; self.params.data_block_size as usize],
                0,
                &self.data,
            )
        } else {
            let hbs = self.layout.hash_block_size;
            let top = self.layout.level_start[levels - 1];
            (vec![0u8; hbs as usize], top * hbs, &self.hash)
        };
        dev.read_at(&mut buf, offset)?;
        if self.hash_one(&buf) == self.root {
            return Ok(true);
        }
        // A corrupt top block is rebuilt from the FEC area as a read would rebuild it (the
        // kernel checks nothing at load and corrects it on the first read); a wrong root hash
        // rebuilds nothing and is not counted.
        let Some(fec) = &self.fec else {
            return Ok(false);
        };
        let index = match levels {
            0 => Some(fec.data_index(0)),
            _ => fec.hash_index(offset / self.layout.hash_block_size),
        };
        let Some(index) = index else {
            return Ok(false);
        };
        // No erasures: which data blocks are bad is known only through this very block.
        let rebuilt = fec.rebuild(&*self.data, &*self.hash, index, &|_, _| false, |b| {
            self.hash_one(b) == self.root
        });
        Ok(matches!(rebuilt, Ok(Some(_))))
    }

    fn corrupt(&self, what: &'static str, block: u64) -> Result<()> {
        let counter = if what == "data" {
            &self.stats.data_corruptions
        } else {
            &self.stats.hash_corruptions
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.opts.ignore_corruption {
            // Nothing reaches the exporter, which logs errors: say it here, like the kernel.
            self.ignored_log.log(|| {
                format!(
                    "{}: {what} block {block} is corrupted (ignored)",
                    self.opts.name
                )
            });
            return Ok(());
        }
        Err(BlockError::Corrupt {
            device: self.opts.name.clone(),
            what,
            block,
        })
    }

    fn hash_one(&self, block: &[u8]) -> Vec<u8> {
        let (prefix, suffix) = self.params.salt_parts();
        self.params.hash.hash(&[prefix, block, suffix])
    }

    /// Hash block `index` of `level`, verified up to the root.
    fn hash_block(&self, level: usize, index: u64) -> Result<Arc<[u8]>> {
        let abs = self.layout.level_start[level] + index;
        if let Some(b) = self.cache.get(abs) {
            return Ok(b);
        }
        let hbs = self.layout.hash_block_size;
        let mut buf = vec![0u8; hbs as usize];
        self.hash.read_at(&mut buf, abs * hbs)?;
        self.stats.hash_block_reads.fetch_add(1, Ordering::Relaxed);
        let digest = self.hash_one(&buf);
        let ds = self.layout.digest_size;
        let parent;
        let want: &[u8] = if level + 1 == self.layout.levels() {
            &self.root
        } else {
            let bits = self.layout.hashes_per_block_bits;
            parent = self.hash_block(level + 1, index >> bits)?;
            let pos =
                (index & (self.layout.hashes_per_block() - 1)) as usize * self.layout.entry_size;
            &parent[pos..pos + ds]
        };
        if digest[..] != *want {
            let index = self.fec.as_ref().and_then(|f| f.hash_index(abs));
            match self.rebuild("hash", abs, index, want) {
                Some(fixed) => buf = fixed,
                None => {
                    self.corrupt("hash", abs)?;
                    return Ok(Arc::from(buf));
                }
            }
        }
        let block: Arc<[u8]> = Arc::from(buf);
        self.cache.insert(abs, block.clone());
        Ok(block)
    }

    fn is_verified(&self, block: u64) -> bool {
        self.verified.as_ref().is_some_and(|v| {
            v[(block / 64) as usize].load(Ordering::Relaxed) & (1 << (block % 64)) != 0
        })
    }

    fn mark_verified(&self, block: u64) {
        if let Some(v) = &self.verified {
            v[(block / 64) as usize].fetch_or(1 << (block % 64), Ordering::Relaxed);
        }
    }

    /// Fill `buf` with whole data blocks from data block `first`: cached blocks are copied,
    /// each run of missing blocks is read with one request, verified as a batch and cached.
    fn read_blocks(&self, buf: &mut [u8], first: u64) -> Result<()> {
        let Some(cache) = &self.data_cache else {
            return self.read_run(buf, first);
        };
        let dbs = self.params.data_block_size as usize;
        let n = buf.len() / dbs;
        let mut i = 0;
        // Counted locally and added once: a shared counter bumped per block would bounce its
        // cache line between the serving threads.
        let mut hits = 0;
        while i < n {
            if cache.get_into(first + i as u64, &mut buf[i * dbs..(i + 1) * dbs]) {
                hits += 1;
                i += 1;
                continue;
            }
            let run_start = i;
            i += 1;
            while i < n && !cache.contains(first + i as u64) {
                i += 1;
            }
            let run = &mut buf[run_start * dbs..i * dbs];
            let run_first = first + run_start as u64;
            self.read_run(run, run_first)?;
            for (k, block) in run.chunks_exact(dbs).enumerate() {
                cache.insert(run_first + k as u64, block);
            }
        }
        if hits > 0 {
            self.stats
                .data_cache_hits
                .fetch_add(hits, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Fill `run` (whole data blocks from `first`) from the block store where it holds them
    /// and from the data device otherwise, verify it, and hand the store the blocks that
    /// verified and it did not hold.
    fn read_run(&self, run: &mut [u8], first: u64) -> Result<()> {
        let dbs = self.params.data_block_size as usize;
        let Some(store) = &self.store else {
            return self.read_run_from_data(run, first);
        };
        let n = run.len() / dbs;
        let from_store: Vec<bool> = run
            .chunks_exact_mut(dbs)
            .enumerate()
            .map(|(k, b)| store.lookup(first + k as u64, b))
            .collect();
        let mut k = 0;
        while k < n {
            if from_store[k] {
                k += 1;
                continue;
            }
            let start = k;
            while k < n && !from_store[k] {
                k += 1;
            }
            self.data.read_at(
                &mut run[start * dbs..k * dbs],
                (first + start as u64) * dbs as u64,
            )?;
        }
        let hits = from_store.iter().filter(|&&s| s).count() as u64;
        if hits > 0 {
            self.stats.store_hits.fetch_add(hits, Ordering::Relaxed);
        }
        let states = self.verify_blocks(run, first, &from_store)?;
        for (k, state) in states.iter().enumerate() {
            let fresh = match state {
                Checked::Verified => !from_store[k],
                Checked::Recovered => true,
                Checked::Skipped | Checked::Bad => false,
            };
            if fresh {
                store.insert(first + k as u64, &run[k * dbs..(k + 1) * dbs]);
            }
        }
        Ok(())
    }

    /// [`read_run`](VerityDevice::read_run) without a block store: the run read from the data
    /// device and verified. A large run is cut into shares, each read and hashed by the thread
    /// that takes it (this one and the [helpers](crate::block::helpers)), as dm-integrity's
    /// checked reads are: a 1 MiB read is then not bound by one core, and the copy out of the
    /// data device is not a serial step before the hashing. The first failure in block order
    /// is returned.
    fn read_run_from_data(&self, run: &mut [u8], first: u64) -> Result<()> {
        let dbs = self.params.data_block_size as usize;
        let parts = side_by_side::parts_for(run.len());
        if parts < 2 || self.layout.levels() == 0 {
            self.data.read_at(run, first * dbs as u64)?;
            return self.verify_blocks(run, first, &[]).map(drop);
        }
        let read_and_verify = |k: usize, share: &mut [u8]| -> Result<()> {
            let at = first + k as u64;
            self.data.read_at(share, at * dbs as u64)?;
            self.verify_blocks(share, at, &[]).map(drop)
        };
        let whole = (self.opts.name.as_str(), first * dbs as u64);
        for r in side_by_side::in_shares(run, dbs, parts, whole, &read_and_verify) {
            r?;
        }
        Ok(())
    }

    /// Data block `block` failed its digest `want`: a stored copy is dropped, the block is
    /// fetched again from the origin bypassing every cache, then rebuilt from the FEC area;
    /// the bytes that verify, if any.
    fn recover(&self, block: u64, from_store: bool, want: &[u8]) -> Option<Vec<u8>> {
        if let Some(store) = &self.store {
            if from_store {
                self.stats.store_rejects.fetch_add(1, Ordering::Relaxed);
                store.reject(block);
            }
            self.stats.refetches.fetch_add(1, Ordering::Relaxed);
            let mut fresh = vec![0u8; self.params.data_block_size as usize];
            if store.refetch(block, &mut fresh).is_ok() && self.hash_one(&fresh) == want {
                self.stats.refetch_recovered.fetch_add(1, Ordering::Relaxed);
                return Some(fresh);
            }
        }
        self.rebuild("data", block, Some(block), want)
    }

    /// Verify `buf`, which holds whole data blocks starting at data block `first`;
    /// `from_store[i]` says block `i` came from the block store (empty: none did), which is
    /// then checked even when `check_at_most_once` saw it verified. Returns what happened to
    /// each block.
    fn verify_blocks(
        &self,
        buf: &mut [u8],
        first: u64,
        from_store: &[bool],
    ) -> Result<Vec<Checked>> {
        let dbs = self.params.data_block_size as usize;
        let n = buf.len() / dbs;
        let ds = self.layout.digest_size;
        let (prefix, suffix) = self.params.salt_parts();
        let stored = |i: usize| from_store.get(i).copied().unwrap_or(false);
        let mut states = vec![Checked::Skipped; n];
        if self.layout.levels() == 0 {
            let digest = self.hash_one(&buf[..dbs]);
            states[0] = if digest == self.root {
                Checked::Verified
            } else if let Some(fixed) = self.recover(0, stored(0), &self.root.clone()) {
                buf[..dbs].copy_from_slice(&fixed);
                Checked::Recovered
            } else {
                self.corrupt("data", 0)?;
                Checked::Bad
            };
            return Ok(states);
        }
        // Hash every block that needs it in one batch (multi-buffer lanes), then compare
        // block by block against the level-0 hash blocks.
        let todo: Vec<usize> = (0..n)
            .filter(|&i| stored(i) || !self.is_verified(first + i as u64))
            .collect();
        if todo.is_empty() {
            return Ok(states);
        }
        let mut digests = vec![0u8; todo.len() * ds];
        if todo.len() == n {
            hash_blocks(self.params.hash, prefix, suffix, buf, dbs, &mut digests);
        } else {
            for (k, &i) in todo.iter().enumerate() {
                let block = &buf[i * dbs..(i + 1) * dbs];
                self.params
                    .hash
                    .hash_parts(&[prefix, block, suffix], &mut digests[k * ds..(k + 1) * ds]);
            }
        }
        let bits = self.layout.hashes_per_block_bits;
        let mut current: Option<(u64, Arc<[u8]>)> = None;
        for (k, &i) in todo.iter().enumerate() {
            let block = first + i as u64;
            let hidx = block >> bits;
            let hb = match &current {
                Some((idx, hb)) if *idx == hidx => hb.clone(),
                _ => {
                    let hb = self.hash_block(0, hidx)?;
                    current = Some((hidx, hb.clone()));
                    hb
                }
            };
            let pos = (block & ((1 << bits) - 1)) as usize * self.layout.entry_size;
            let want = &hb[pos..pos + ds];
            states[i] = if want == &digests[k * ds..(k + 1) * ds] {
                self.mark_verified(block);
                Checked::Verified
            } else if let Some(fixed) = self.recover(block, stored(i), want) {
                buf[i * dbs..(i + 1) * dbs].copy_from_slice(&fixed);
                self.mark_verified(block);
                Checked::Recovered
            } else {
                self.corrupt("data", block)?;
                Checked::Bad
            };
        }
        self.stats
            .verified_blocks
            .fetch_add(todo.len() as u64, Ordering::Relaxed);
        Ok(states)
    }
}

/// What verifying one data block found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checked {
    /// Not checked: verified before (`check_at_most_once`).
    Skipped,
    /// Its bytes matched the tree.
    Verified,
    /// Its bytes did not match; a copy fetched again (or rebuilt from FEC) did.
    Recovered,
    /// Nothing matched (served anyway only with `ignore_corruption`).
    Bad,
}

impl BlockDevice for VerityDevice {
    fn name(&self) -> &str {
        &self.opts.name
    }
    fn size(&self) -> u64 {
        self.params.data_size()
    }
    fn logical_block_size(&self) -> u32 {
        self.params.data_block_size
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.opts.name, offset, buf.len(), self.size())?;
        let dbs = self.params.data_block_size as u64;
        if offset.is_multiple_of(dbs) && (buf.len() as u64).is_multiple_of(dbs) {
            return self.read_blocks(buf, offset / dbs);
        }
        // Unaligned: read and verify the enclosing blocks, then copy out the part asked for.
        let start = offset / dbs * dbs;
        let end = (offset + buf.len() as u64).div_ceil(dbs) * dbs;
        let mut tmp = vec![0u8; (end - start) as usize];
        self.read_blocks(&mut tmp, start / dbs)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(BlockError::ReadOnly {
            device: self.opts.name.clone(),
        })
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn hand_over(&self) {
        self.data.hand_over();
        self.hash.hand_over()
    }
    fn blocks_on_network(&self) -> bool {
        self.data.blocks_on_network() || self.hash.blocks_on_network()
    }
}

impl VerityStats {
    /// The counters as JSON, for `status`.
    pub fn to_json(&self) -> serde_json::Value {
        let data = self.data_corruptions.load(Ordering::Relaxed);
        let hash = self.hash_corruptions.load(Ordering::Relaxed);
        let mut j = serde_json::json!({
            // Every corrupt block detected, whether the reader got EIO or (with
            // ignore_corruption) the data: the figure `status` shows as "corruptions".
            "corruptions": data + hash,
            "data_corruptions": data,
            "hash_corruptions": hash,
            "verified_blocks": self.verified_blocks.load(Ordering::Relaxed),
            "hash_block_reads": self.hash_block_reads.load(Ordering::Relaxed),
            "data_cache_hits": self.data_cache_hits.load(Ordering::Relaxed),
        });
        if self.store.load(Ordering::Relaxed) {
            j["store_hits"] = self.store_hits.load(Ordering::Relaxed).into();
            j["store_rejects"] = self.store_rejects.load(Ordering::Relaxed).into();
            j["refetches"] = self.refetches.load(Ordering::Relaxed).into();
            j["refetch_recovered"] = self.refetch_recovered.load(Ordering::Relaxed).into();
        }
        if self.fec.load(Ordering::Relaxed) {
            j["fec_corrected"] = self.fec_corrected.load(Ordering::Relaxed).into();
            j["fec_uncorrectable"] = self.fec_uncorrectable.load(Ordering::Relaxed).into();
        }
        j
    }
}
