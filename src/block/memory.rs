//! An in-memory block device, for tests and for building images before writing them out.

use super::{check_range, BlockDevice, BlockError, Result};
use std::sync::RwLock;

/// A block device backed by a `Vec<u8>`.
pub struct MemoryDevice {
    name: String,
    data: RwLock<Vec<u8>>,
    read_only: bool,
}

impl MemoryDevice {
    /// A zero-filled device of `size` bytes.
    pub fn new(name: &str, size: usize) -> Self {
        Self::from_vec(name, vec![0; size])
    }

    /// A device holding `data`.
    pub fn from_vec(name: &str, data: Vec<u8>) -> Self {
        MemoryDevice {
            name: name.to_string(),
            data: RwLock::new(data),
            read_only: false,
        }
    }

    /// Refuse writes from now on.
    pub fn into_read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// A copy of the whole contents.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl BlockDevice for MemoryDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        check_range(&self.name, offset, buf.len(), data.len() as u64)?;
        let start = offset as usize;
        buf.copy_from_slice(&data[start..start + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        check_range(&self.name, offset, buf.len(), data.len() as u64)?;
        let start = offset as usize;
        data[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        check_range(&self.name, offset, len, data.len() as u64)?;
        let start = offset as usize;
        data[start..start + len].fill(0);
        Ok(())
    }
    fn discard_zeroes(&self) -> bool {
        true
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let len = usize::try_from(len).map_err(|_| BlockError::OutOfRange {
            device: self.name.clone(),
            offset,
            len,
            size: self.size(),
        })?;
        let zeros = vec![0u8; len];
        self.write_at(&zeros, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_and_bounds() {
        let dev = MemoryDevice::new("m", 4096);
        dev.write_at(&[1, 2, 3], 10).unwrap();
        let mut buf = [0u8; 4];
        dev.read_at(&mut buf, 9).unwrap();
        assert_eq!(buf, [0, 1, 2, 3]);
        assert!(matches!(
            dev.read_at(&mut buf, 4094),
            Err(BlockError::OutOfRange { .. })
        ));
        let ro = MemoryDevice::new("r", 16).into_read_only();
        assert!(matches!(
            ro.write_at(&[1], 0),
            Err(BlockError::ReadOnly { .. })
        ));
    }
}
