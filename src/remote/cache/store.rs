//! [`RemoteStore`]: what the verity layer of a remote image reads through besides its data
//! device ([`crate::verity::store::BlockStore`]): the persistent cache, when there is one, and
//! the object itself for a fresh copy of a block that failed its digest.

use super::DiskCache;
use crate::block::Result;
use crate::remote::device::RemoteDevice;
use crate::verity::store::BlockStore;
use std::sync::Arc;

/// The persistent cache (optional) and the remote data object of one image.
pub struct RemoteStore {
    cache: Option<Arc<DiskCache>>,
    data: Arc<RemoteDevice>,
    /// Where the verity data area starts in the object.
    data_offset: u64,
    block_size: u64,
}

impl RemoteStore {
    /// Blocks of `block_size` bytes of the data area at `data_offset` in `data`, kept in
    /// `cache` when given.
    pub fn new(
        cache: Option<Arc<DiskCache>>,
        data: Arc<RemoteDevice>,
        data_offset: u64,
        block_size: u32,
    ) -> Self {
        RemoteStore {
            cache,
            data,
            data_offset,
            block_size: block_size as u64,
        }
    }
}

impl BlockStore for RemoteStore {
    fn lookup(&self, block: u64, out: &mut [u8]) -> bool {
        self.cache.as_ref().is_some_and(|c| c.get(block, out))
    }

    fn insert(&self, block: u64, data: &[u8]) {
        if let Some(c) = &self.cache {
            c.insert(block, data);
        }
    }

    fn reject(&self, block: u64) {
        if let Some(c) = &self.cache {
            c.remove(block);
        }
    }

    fn refetch(&self, block: u64, out: &mut [u8]) -> Result<()> {
        self.data
            .read_fresh(out, self.data_offset + block * self.block_size)
    }
}
