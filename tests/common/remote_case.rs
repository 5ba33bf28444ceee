//! A verity volume served as remote objects for the remote-layer tests (issue 28): data and
//! hash files made by veritysetup, opened through [`dmkit::remote::verity`] over any
//! [`RangeSource`] (a [`LocalRange`] here; an nginx URL where the transport is merged).

use dmkit::block::{Activated, BlockDevice};
use dmkit::remote::cache::CacheOptions;
use dmkit::remote::device::RemoteOptions;
use dmkit::remote::verity::{open, RemoteVerity};
use dmkit::remote::{LocalRange, RangeSource};
use dmkit::verity::volume::ParamsSource;
use dmkit::verity::VerityOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Data block size of the cases.
pub const BS: usize = 4096;

/// A formatted volume in a private directory.
pub struct Case {
    pub dir: PathBuf,
    pub data: PathBuf,
    pub hash: PathBuf,
    pub bytes: Vec<u8>,
    pub root_hex: String,
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `blocks` blocks of seeded data, formatted by `veritysetup format` (the real tool); `None`
/// (skipped, or a failure under CI=1) without veritysetup.
pub fn case(tag: &str, blocks: usize, seed: u64) -> Option<Case> {
    if super::env::tool_missing("veritysetup", "cryptsetup-bin") {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("dmkit-remote-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = super::rng::SplitMix64(seed).bytes(blocks * BS);
    let (data, hash) = (dir.join("data.img"), dir.join("hash.img"));
    std::fs::write(&data, &bytes).unwrap();
    let out = super::run::ok(
        "veritysetup",
        &["format", data.to_str().unwrap(), hash.to_str().unwrap()],
    );
    let root_hex = out
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .expect("veritysetup prints the root hash")
        .trim()
        .to_string();
    Some(Case {
        dir,
        data,
        hash,
        bytes,
        root_hex,
    })
}

impl Case {
    /// The cache directory of this case.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.join("cache")
    }

    /// The image's own cache directory (under the root hash).
    pub fn image_cache(&self) -> PathBuf {
        self.cache_dir().join(&self.root_hex)
    }

    /// Open the volume with `data` as the data object (a mirror, or a damaged copy), the
    /// case's hash file, and a cache of `cache_bytes` (none when 0).
    pub fn open_with(&self, data: &Path, cache_bytes: u64, prefetch: bool) -> Activated {
        let d: Arc<dyn RangeSource> = Arc::new(LocalRange::open(data).unwrap());
        let h: Arc<dyn RangeSource> = Arc::new(LocalRange::open(&self.hash).unwrap());
        self.open_sources(d, h, cache_bytes, prefetch)
    }

    /// Open the volume over the given objects.
    pub fn open_sources(
        &self,
        data: Arc<dyn RangeSource>,
        hash: Arc<dyn RangeSource>,
        cache_bytes: u64,
        prefetch: bool,
    ) -> Activated {
        let opened = open(RemoteVerity {
            data,
            hash,
            params: ParamsSource::Superblock { hash_offset: 0 },
            remote: RemoteOptions::default(),
            cache: (cache_bytes > 0).then(|| CacheOptions {
                dir: self.cache_dir(),
                max_bytes: cache_bytes,
            }),
            prefetch,
        })
        .unwrap();
        let root = hex::decode(&self.root_hex).unwrap();
        opened
            .activate(
                &root,
                VerityOptions {
                    name: "remote".into(),
                    // No memory cache: every read goes to the persistent cache or the object,
                    // which is what these tests look at.
                    data_cache_bytes: 0,
                    ..VerityOptions::default()
                },
            )
            .unwrap()
    }

    /// Block `b` of the original data.
    pub fn block(&self, b: u64) -> &[u8] {
        &self.bytes[b as usize * BS..(b as usize + 1) * BS]
    }
}

/// One counter of an activated volume's `status`.
pub fn stat(a: &Activated, key: &str) -> u64 {
    let f = a.stats.as_ref().expect("remote volumes have counters");
    f()[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {key} in {}", f()))
}

/// Read block `b` of the device.
pub fn read_block(dev: &dyn BlockDevice, b: u64) -> dmkit::block::Result<Vec<u8>> {
    let mut buf = vec![0u8; BS];
    dev.read_at(&mut buf, b * BS as u64).map(|()| buf)
}

/// The cache's slots: block number → the bytes its slot holds, read from the files.
pub fn cached_blocks(image_cache: &Path) -> Vec<(u64, Vec<u8>)> {
    let index = std::fs::read(image_cache.join("index")).unwrap();
    let data = std::fs::read(image_cache.join("data")).unwrap();
    let body = &index[24..index.len() - 32];
    body.chunks_exact(16)
        .map(|e| {
            let block = u64::from_le_bytes(e[..8].try_into().unwrap());
            let slot = u64::from_le_bytes(e[8..].try_into().unwrap()) as usize;
            let bytes = data.get(slot * BS..(slot + 1) * BS).unwrap_or(&[]).to_vec();
            (block, bytes)
        })
        .collect()
}

/// The byte offset of block `b`'s slot in the cache's data file.
pub fn slot_offset(image_cache: &Path, b: u64) -> u64 {
    let index = std::fs::read(image_cache.join("index")).unwrap();
    let body = &index[24..index.len() - 32];
    body.chunks_exact(16)
        .find(|e| u64::from_le_bytes(e[..8].try_into().unwrap()) == b)
        .map(|e| u64::from_le_bytes(e[8..].try_into().unwrap()) * BS as u64)
        .unwrap_or_else(|| panic!("block {b} is not cached"))
}
