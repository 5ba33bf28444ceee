//! A window onto part of a device, as a dm-linear target maps it: `[offset, offset + size)` of
//! the device below, seen from 0. LUKS2 with integrity puts dm-integrity at the data segment's
//! offset this way.

use super::{check_range, BlockDevice, Result};

/// `size` bytes of `lower` (an `Arc<dyn BlockDevice>`, a `&dyn BlockDevice`, ...) from byte
/// `offset`.
pub struct Window<D> {
    lower: D,
    offset: u64,
    size: u64,
}

impl<D: BlockDevice> Window<D> {
    /// The window `[offset, offset + size)` of `lower`; `None` when it does not lie inside.
    pub fn new(lower: D, offset: u64, size: u64) -> Option<Window<D>> {
        let end = offset.checked_add(size)?;
        (end <= lower.size()).then_some(Window {
            lower,
            offset,
            size,
        })
    }
}

impl<D: BlockDevice> BlockDevice for Window<D> {
    fn name(&self) -> &str {
        self.lower.name()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        self.lower.logical_block_size()
    }
    fn read_only(&self) -> bool {
        self.lower.read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.name(), offset, buf.len(), self.size)?;
        self.lower.read_at(buf, self.offset + offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(self.name(), offset, buf.len(), self.size)?;
        self.lower.write_at(buf, self.offset + offset)
    }
    fn flush(&self) -> Result<()> {
        self.lower.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.name(), offset, len as usize, self.size)?;
        self.lower.discard(self.offset + offset, len)
    }
    fn discard_zeroes(&self) -> bool {
        self.lower.discard_zeroes()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.name(), offset, len as usize, self.size)?;
        self.lower.write_zeroes(self.offset + offset, len)
    }
    fn passthrough(&self, offset: u64, len: u64) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        check_range(self.name(), offset, usize::try_from(len).ok()?, self.size).ok()?;
        self.lower.passthrough(self.offset + offset, len)
    }
    fn hand_over(&self) {
        self.lower.hand_over()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;
    use std::sync::Arc;

    #[test]
    fn maps_into_the_range_and_refuses_beyond_it() {
        let m = Arc::new(MemoryDevice::new("m", 8192));
        assert!(Window::new(m.clone(), 4096, 4097).is_none());
        let w = Window::new(m.clone(), 4096, 2048).unwrap();
        w.write_at(&[7u8; 512], 1024).unwrap();
        let mut b = [0u8; 512];
        m.read_at(&mut b, 5120).unwrap();
        assert_eq!(b, [7u8; 512]);
        assert!(w.write_at(&[1u8; 512], 2048).is_err());
        assert!(w.read_at(&mut b, 1536 + 1).is_err());
    }
}
