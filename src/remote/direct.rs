//! A remote object as a block device that fetches exactly what is read, on the calling thread:
//! for the small reads made while a stack is being opened (a partition table, a LUKS header
//! and its keyslots, sidecar files). [`super::device::RemoteDevice`] would start its read-ahead
//! fetcher threads on a sequential read, and an export must fork its server from a process
//! that runs no other thread.

use super::device::block_error;
use super::RangeSource;
use crate::block::{BlockDevice, BlockError, Result};
use std::sync::Arc;

/// Reads of an object, one range request each, no read-ahead and no threads.
pub struct DirectDevice {
    source: Arc<dyn RangeSource>,
}

impl DirectDevice {
    /// A device over `source`.
    pub fn new(source: Arc<dyn RangeSource>) -> DirectDevice {
        DirectDevice { source }
    }
}

impl BlockDevice for DirectDevice {
    fn name(&self) -> &str {
        self.source.name()
    }
    fn size(&self) -> u64 {
        self.source.identity().len
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.source
            .read_range(offset, buf)
            .map_err(|e| block_error(self.source.name(), offset, e))
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(BlockError::ReadOnly {
            device: self.source.name().to_string(),
        })
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}
