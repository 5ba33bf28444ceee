//! The persistent cache of a remote image's verified data blocks, keyed by the verity root
//! hash (so every mirror of one image shares it): `DIR/<root hash>/` holds `data` (a fixed
//! number of block-sized slots), `index` (which block each slot holds, in least recently used
//! order) and the pinned areas (`hash`: the hash tree; `signature`). See docs/remote-cache.md.
//!
//! Nothing here is trusted. Only blocks that verified against the tree are written, and every
//! block read back is verified again by the verity layer (a tampered or torn slot is dropped
//! and the block fetched again). The index is replaced atomically (written beside, synced,
//! renamed) and checked when loaded, so a crash leaves the old index or the new one, and a
//! slot written after the last index save is only lost, never trusted. Directory 0700, files
//! 0600: the cache shows which blocks of an image a host read.

mod index;
pub mod store;

use index::Index;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

pub use store::RemoteStore;

/// Default bound of one image's cache.
pub const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

/// Saving the index after this many changes (and when the cache is dropped).
const SAVE_EVERY: u64 = 256;

/// Striped slot locks: a slot is never read while it is being rewritten.
const STRIPES: usize = 64;

/// Where the cache lives and how large it may grow.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// The directory holding one subdirectory per root hash.
    pub dir: PathBuf,
    /// Most bytes of data blocks kept for one image (the pinned hash tree comes on top).
    pub max_bytes: u64,
}

impl CacheOptions {
    /// `$XDG_CACHE_HOME/dmkit/remote`, else `$HOME/.cache/dmkit/remote`, else
    /// `/var/cache/dmkit/remote`.
    pub fn default_dir() -> PathBuf {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })
            .unwrap_or_else(|| PathBuf::from("/var/cache"));
        base.join("dmkit").join("remote")
    }
}

/// Counters of the cache, for `status`.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Blocks found in the cache (each then verified again above).
    pub hits: AtomicU64,
    /// Blocks looked up and not found.
    pub misses: AtomicU64,
    /// Verified blocks written.
    pub inserts: AtomicU64,
    /// Blocks evicted to stay within the bound.
    pub evictions: AtomicU64,
    /// Entries dropped because they failed verification.
    pub rejects: AtomicU64,
}

/// Why the cache could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("{}: {what}: {source}", path.display())]
pub struct CacheError {
    /// The file or directory.
    pub path: PathBuf,
    /// What was being done.
    pub what: &'static str,
    /// The error.
    #[source]
    pub source: io::Error,
}

fn err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> CacheError + 'a {
    move |source| CacheError {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// One image's persistent cache.
pub struct DiskCache {
    dir: PathBuf,
    block_size: usize,
    data: File,
    index: Mutex<Index>,
    stripes: Vec<RwLock<()>>,
    stats: CacheStats,
    /// Changes since the index was last saved.
    unsaved: AtomicU64,
}

/// Create `dir` (and its parents) and make it private.
pub fn private_dir(dir: &Path) -> Result<(), CacheError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err(dir, "cannot create the cache directory"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(err(dir, "cannot make the cache directory private"))
}

/// Open (or create) a private file.
fn private_file(path: &Path) -> Result<File, CacheError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(err(path, "cannot open"))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err(path, "cannot make private"))?;
    Ok(f)
}

/// Write `bytes` to `path` atomically: a private file beside it, synced, renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CacheError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let f = private_file(&tmp)?;
    f.write_all_at(bytes, 0)
        .and_then(|()| f.sync_data())
        .map_err(err(&tmp, "cannot write"))?;
    std::fs::rename(&tmp, path).map_err(err(path, "cannot replace"))?;
    if let Some(parent) = path.parent() {
        // The rename itself made durable.
        let _ = File::open(parent).and_then(|d| d.sync_all());
    }
    Ok(())
}

impl DiskCache {
    /// The cache of the image with root hash `root` under `opts.dir`, for data blocks of
    /// `block_size` bytes. A cache made for another block size, or whose index does not
    /// parse, is started afresh.
    pub fn open(opts: &CacheOptions, root: &[u8], block_size: u32) -> Result<Self, CacheError> {
        private_dir(&opts.dir)?;
        let dir = opts.dir.join(hex::encode(root));
        private_dir(&dir)?;
        let slots = (opts.max_bytes / block_size as u64).max(1);
        let data_path = dir.join("data");
        let data = private_file(&data_path)?;
        let index_path = dir.join("index");
        let index = match std::fs::read(&index_path) {
            Ok(bytes) => Index::parse(&bytes, block_size, slots).unwrap_or_else(|| {
                // A garbled index (or one for another bound): nothing in `data` is known.
                Index::new(block_size, slots)
            }),
            Err(_) => Index::new(block_size, slots),
        };
        // The file never holds more than the slots the bound allows.
        let limit = slots * block_size as u64;
        let len = data
            .metadata()
            .map_err(err(&data_path, "cannot stat"))?
            .len();
        if len > limit {
            data.set_len(limit)
                .map_err(err(&data_path, "cannot shrink"))?;
        }
        Ok(DiskCache {
            dir,
            block_size: block_size as usize,
            data,
            index: Mutex::new(index),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            stats: CacheStats::default(),
            unsaved: AtomicU64::new(0),
        })
    }

    /// The image's cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The counters.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// Blocks held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The blocks held, least recently used first, with their slots.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        self.lock().entries()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stripe(&self, slot: u64) -> &RwLock<()> {
        &self.stripes[(slot % STRIPES as u64) as usize]
    }

    /// Copy block `block` into `out` if held (unverified: the caller verifies).
    pub fn get(&self, block: u64, out: &mut [u8]) -> bool {
        let mut index = self.lock();
        let Some(slot) = index.touch(block) else {
            drop(index);
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let _reading = self.stripe(slot).read().unwrap_or_else(|e| e.into_inner());
        drop(index);
        let ok = self
            .data
            .read_exact_at(out, slot * self.block_size as u64)
            .is_ok();
        if ok {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Keep verified block `block`, evicting the least recently used one when full.
    pub fn insert(&self, block: u64, bytes: &[u8]) {
        let mut index = self.lock();
        let (slot, evicted) = index.assign(block);
        if evicted {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let _writing = self.stripe(slot).write().unwrap_or_else(|e| e.into_inner());
        drop(index);
        if self
            .data
            .write_all_at(bytes, slot * self.block_size as u64)
            .is_err()
        {
            // A full disk: forget the slot rather than trust whatever it holds.
            self.lock().remove(block);
            return;
        }
        self.stats.inserts.fetch_add(1, Ordering::Relaxed);
        self.changed();
    }

    /// Drop block `block` (its copy failed verification).
    pub fn remove(&self, block: u64) {
        if self.lock().remove(block) {
            self.stats.rejects.fetch_add(1, Ordering::Relaxed);
            self.changed();
        }
    }

    fn changed(&self) {
        if self.unsaved.fetch_add(1, Ordering::Relaxed) + 1 >= SAVE_EVERY {
            let _ = self.save();
        }
    }

    /// Write the index (atomically). The data slots it names are synced first, so a saved
    /// index rarely names a slot whose write was lost (and such a slot would only fail
    /// verification and be fetched again).
    pub fn save(&self) -> Result<(), CacheError> {
        self.unsaved.store(0, Ordering::Relaxed);
        let bytes = self.lock().serialize();
        self.data
            .sync_data()
            .map_err(err(&self.dir.join("data"), "cannot sync"))?;
        write_atomic(&self.dir.join("index"), &bytes)
    }

    /// A pinned file of the image's cache (`hash`, `signature`), if present.
    pub fn read_pinned(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(name)).ok()
    }

    /// Pin `bytes` as `name` (replaced atomically). Pinned files are outside the bound and
    /// never evicted; they are verified whenever they are read back.
    pub fn write_pinned(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        write_atomic(&self.dir.join(name), bytes)
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        if self.unsaved.load(Ordering::Relaxed) > 0 {
            let _ = self.save();
        }
    }
}
