//! A dm-verity volume whose data and hash areas are remote objects: the open sequence of
//! `dmkit verity open URL NAME URL ROOT` (and of anything else that opens a remote verity
//! volume), over any [`RangeSource`].
//!
//! The superblock is read first, then the whole hash tree is fetched at open (pinned: from the
//! cache when its copy checks out against the root hash, else from the object, then saved in
//! the cache). Data blocks are fetched as they are read, verified, and only then kept in the
//! cache; cached blocks are verified again on every read.

use super::cache::{CacheOptions, DiskCache, RemoteStore};
use super::device::{RemoteDevice, RemoteOptions};
use super::prefetch;
use super::RangeSource;
use crate::block::{Activated, BlockDevice};
use crate::verity::fec::FecOptions;
use crate::verity::store::check_tree;
use crate::verity::volume::{ParamsSource, VerityVolume, VolumeError};
use crate::verity::{TreeLayout, VerityOptions, VerityParams};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How to open a remote verity volume.
pub struct RemoteVerity {
    /// The data object.
    pub data: Arc<dyn RangeSource>,
    /// The hash object (may be the data object, with a hash offset).
    pub hash: Arc<dyn RangeSource>,
    /// Where the parameters come from (a superblock in the hash object, or given).
    pub params: ParamsSource,
    /// How the objects are fetched.
    pub remote: RemoteOptions,
    /// The persistent cache; `None`: blocks are kept in memory only.
    pub cache: Option<CacheOptions>,
    /// Record the blocks read first, and fetch those a previous open recorded in the
    /// background (needs the cache).
    pub prefetch: bool,
    /// The FEC object and where its area is: read only when a block fails its digest, never
    /// cached (what it rebuilds is verified against the tree before it is served).
    pub fec: Option<(Arc<dyn RangeSource>, FecOptions)>,
}

/// The parameters of a remote volume, read before the root hash is parsed (its length
/// depends on the hash algorithm).
pub struct Opened {
    volume: VerityVolume,
    data: Arc<RemoteDevice>,
    hash: Arc<RemoteDevice>,
    spec: RemoteVerity,
}

/// Fetch the superblock (or take the given parameters) of a remote volume.
pub fn open(spec: RemoteVerity) -> Result<Opened, VolumeError> {
    let data = Arc::new(RemoteDevice::new(spec.data.clone(), spec.remote));
    let hash = Arc::new(RemoteDevice::new(
        spec.hash.clone(),
        RemoteOptions {
            block_size: 512,
            ..spec.remote
        },
    ));
    let volume = VerityVolume::from_devices(
        data.clone(),
        hash.clone(),
        spec.data.name(),
        spec.hash.name(),
        spec.params.clone(),
    )?;
    Ok(Opened {
        volume,
        data,
        hash,
        spec,
    })
}

impl Opened {
    /// The tree's parameters.
    pub fn params(&self) -> &VerityParams {
        self.volume.params()
    }

    /// Pin the hash tree, open the cache and activate the volume as `opts.name` against
    /// `root` (refused when the tree's top does not match it).
    pub fn activate(self, root: &[u8], opts: VerityOptions) -> Result<Activated, VolumeError> {
        let params = self.volume.params().clone();
        let layout = TreeLayout::new(&params).map_err(|e| VolumeError::Invalid(e.to_string()))?;
        let cache = match &self.spec.cache {
            Some(c) => Some(Arc::new(
                DiskCache::open(c, root, params.data_block_size)
                    .map_err(|e| VolumeError::Invalid(e.to_string()))?,
            )),
            None => None,
        };
        let (hash_dev, tree_from) = pin_tree(&self.hash, &params, &layout, root, cache.as_deref())?;
        let store = Arc::new(RemoteStore::new(
            cache.clone(),
            self.data.clone(),
            0,
            params.data_block_size,
        ));
        let mut volume = VerityVolume::from_devices(
            self.data.clone(),
            hash_dev.clone(),
            self.spec.data.name(),
            self.spec.hash.name(),
            ParamsSource::Given(params.clone()),
        )?
        .with_store(store);
        if let Some((source, fo)) = &self.spec.fec {
            let device = RemoteDevice::new(
                source.clone(),
                RemoteOptions {
                    block_size: 512,
                    ..self.spec.remote
                },
            );
            volume = volume.with_fec_device(Arc::new(device), source.name(), *fo);
        }
        let mut activated = volume.activate(root, opts)?;
        activated.details["remote"] = true.into();
        activated.details["hash_tree_from"] = tree_from.into();
        if let Some(c) = &cache {
            activated.details["cache_dir"] = c.dir().display().to_string().into();
        }
        let verified: Arc<dyn BlockDevice> = activated.device.clone();
        let mut prefetch_stats = None;
        if self.spec.prefetch {
            if let Some(c) = &cache {
                let recorded = prefetch::load(c.dir());
                activated.details["prefetch_blocks"] = (recorded.len() as u64).into();
                let bs = params.data_block_size;
                let p = if recorded.is_empty() {
                    prefetch::Prefetch::recording(verified.clone(), c.dir(), bs)
                } else {
                    let p =
                        prefetch::Prefetch::prefetching(verified.clone(), c.dir(), recorded, bs);
                    prefetch_stats = Some(p.stats());
                    p
                };
                activated.device = Arc::new(p);
            }
        }
        let verity_stats = activated.stats.take();
        let (data, hash) = (self.data.clone(), hash_dev);
        activated.stats = Some(Arc::new(move || {
            let mut j = verity_stats.as_ref().map_or(Value::Null, |f| f());
            remote_json(&mut j, &data, &hash, cache.as_deref());
            if let Some(p) = &prefetch_stats {
                j["prefetch_planned"] = p.planned.load(Ordering::Relaxed).into();
                j["prefetch_done"] = p.done.load(Ordering::Relaxed).into();
                j["prefetch_failed"] = p.failed.load(Ordering::Relaxed).into();
            }
            j
        }));
        Ok(activated)
    }
}

/// Add the remote counters to a layer's `status` JSON: bytes fetched, requests and retries
/// of both objects, cache hits and what verification rejected.
fn remote_json(j: &mut Value, data: &RemoteDevice, hash: &RemoteDevice, cache: Option<&DiskCache>) {
    if !j.is_object() {
        *j = serde_json::json!({});
    }
    let (d, h) = (data.source().stats(), hash.source().stats());
    let same = Arc::ptr_eq(data.source(), hash.source());
    let sum = |a: u64, b: u64| if same { a } else { a + b };
    j["remote_requests"] = sum(d.requests, h.requests).into();
    j["remote_bytes_fetched"] = sum(d.bytes_fetched, h.bytes_fetched).into();
    j["remote_retries"] = sum(d.retries, h.retries).into();
    j["readahead_hits_bytes"] = data
        .device_stats()
        .readahead_hits
        .load(Ordering::Relaxed)
        .into();
    if let Some(c) = cache {
        let s = c.stats();
        j["cache_hits"] = s.hits.load(Ordering::Relaxed).into();
        j["cache_misses"] = s.misses.load(Ordering::Relaxed).into();
        j["cache_inserts"] = s.inserts.load(Ordering::Relaxed).into();
        j["cache_evictions"] = s.evictions.load(Ordering::Relaxed).into();
        j["cache_blocks"] = (c.len() as u64).into();
    }
    // What failed its digest: cached copies dropped, and blocks fetched again.
    let failures = j["data_corruptions"].as_u64().unwrap_or(0)
        + j["hash_corruptions"].as_u64().unwrap_or(0)
        + j["store_rejects"].as_u64().unwrap_or(0)
        + j["refetch_recovered"].as_u64().unwrap_or(0);
    j["verification_failures"] = failures.into();
}

/// The hash device with the tree pinned in memory, and where the tree came from ("cache" or
/// "remote"). A cached copy is used only when every hash block checks out against `root`; a
/// fetched copy that checks out is saved in the cache. A fetched copy that does not is still
/// served (the verity layer then fails, or corrects from FEC, the blocks under the bad hash
/// blocks), never cached.
fn pin_tree(
    hash: &Arc<RemoteDevice>,
    params: &VerityParams,
    layout: &TreeLayout,
    root: &[u8],
    cache: Option<&DiskCache>,
) -> Result<(Arc<RemoteDevice>, &'static str), VolumeError> {
    if layout.levels() == 0 {
        return Ok((hash.clone(), "none"));
    }
    let start = layout.tree_start * layout.hash_block_size;
    let len = layout.hash_device_size() - start;
    if hash.size() < start + len {
        return Err(VolumeError::Verity(
            crate::verity::VerityError::HashTooSmall {
                device: hash.name().to_string(),
                have: hash.size(),
                need: start + len,
            },
        ));
    }
    let fresh = || RemoteDevice::new(hash.source().clone(), RemoteOptions::default());
    if let Some(bytes) = cache.and_then(|c| c.read_pinned("hash")) {
        if bytes.len() as u64 == len && check_tree(params, layout, root, &bytes, start).is_empty() {
            let dev = fresh()
                .pin_bytes(start, bytes)
                .map_err(VolumeError::ReadRoot)?;
            return Ok((Arc::new(dev), "cache"));
        }
    }
    let dev = fresh().pin(start, len).map_err(VolumeError::ReadRoot)?;
    let (_, bytes) = dev.pinned().expect("just pinned");
    if let Some(c) = cache {
        if check_tree(params, layout, root, bytes, start).is_empty() {
            c.write_pinned("hash", bytes)
                .map_err(|e| VolumeError::Invalid(e.to_string()))?;
        }
    }
    Ok((Arc::new(dev), "remote"))
}
