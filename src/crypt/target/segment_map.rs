//! [`SegmentMap`]: several devices served one after the other as one device, the way a
//! multi-target device-mapper table maps them. A LUKS2 device in the middle of a reencryption
//! is served this way: the part already rewritten through a crypt target with the new key (or
//! linear, when decrypting), the rest with the old one.

use crate::block::{check_range, BlockDevice, BlockError, Result};
use std::sync::Arc;

/// One part of a [`SegmentMap`]: `device` (seen from its byte 0) serves `[start, start + len)`.
struct Part {
    start: u64,
    len: u64,
    device: Arc<dyn BlockDevice>,
}

/// Devices concatenated: part `i` serves its range of the map.
pub struct SegmentMap {
    name: String,
    size: u64,
    block: u32,
    read_only: bool,
    parts: Vec<Part>,
}

impl SegmentMap {
    /// A map named `name` of `parts` (`(start, len, device)`, in order, contiguous from 0,
    /// each device at least `len` bytes). Refuses gaps, overlaps and short devices.
    pub fn new(
        name: &str,
        parts: Vec<(u64, u64, Arc<dyn BlockDevice>)>,
    ) -> std::result::Result<SegmentMap, String> {
        let mut at = 0u64;
        let mut block = 512;
        let mut read_only = false;
        let mut out = Vec::with_capacity(parts.len());
        for (i, (start, len, device)) in parts.into_iter().enumerate() {
            if start != at || len == 0 || device.size() < len {
                return Err(format!(
                    "{name}: segment {i} ({start}+{len}, device of {} bytes) does not follow at {at}",
                    device.size()
                ));
            }
            block = block.max(device.logical_block_size());
            read_only |= device.read_only();
            at = start + len;
            out.push(Part { start, len, device });
        }
        if out.is_empty() {
            return Err(format!("{name}: no segment"));
        }
        for p in &out {
            if p.start % block as u64 != 0 || p.len % block as u64 != 0 {
                return Err(format!(
                    "{name}: segment at {}+{} is not aligned to the {block}-byte blocks",
                    p.start, p.len
                ));
            }
        }
        Ok(SegmentMap {
            name: name.to_string(),
            size: at,
            block,
            read_only,
            parts: out,
        })
    }

    /// The pieces of `[offset, offset + len)`: (part, offset in the part, offset in the
    /// request, length).
    fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = (&Part, u64, usize, usize)> {
        let end = offset + len;
        self.parts.iter().filter_map(move |p| {
            let (s, e) = (offset.max(p.start), end.min(p.start + p.len));
            (s < e).then(|| (p, s - p.start, (s - offset) as usize, (e - s) as usize))
        })
    }
}

impl BlockDevice for SegmentMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        self.block
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, offset, buf.len(), self.size)?;
        for (p, at, from, n) in self.split(offset, buf.len() as u64) {
            p.device.read_at(&mut buf[from..from + n], at)?;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(&self.name, offset, buf.len(), self.size)?;
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        for (p, at, from, n) in self.split(offset, buf.len() as u64) {
            p.device.write_at(&buf[from..from + n], at)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        for p in &self.parts {
            p.device.flush()?;
        }
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range(&self.name, offset, len as usize, self.size)?;
        for (p, at, _, n) in self.split(offset, len) {
            p.device.discard(at, n as u64)?;
        }
        Ok(())
    }
    fn hand_over(&self) {
        for p in &self.parts {
            p.device.hand_over();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    #[test]
    fn reads_and_writes_across_segments() {
        let a: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("a", 4096));
        let b: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("b", 8192));
        let m = SegmentMap::new("m", vec![(0, 4096, a.clone()), (4096, 8192, b.clone())]).unwrap();
        assert_eq!(m.size(), 12288);
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        m.write_at(&data, 2048).unwrap();
        let mut back = vec![0u8; 8192];
        m.read_at(&mut back, 2048).unwrap();
        assert_eq!(back, data);
        let mut head = vec![0u8; 2048];
        b.read_at(&mut head, 0).unwrap();
        assert_eq!(head, data[2048..4096]);
        assert!(m.read_at(&mut [0u8; 512], 12288).is_err());
    }

    #[test]
    fn refuses_gaps_and_short_devices() {
        let a: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("a", 4096));
        assert!(SegmentMap::new("m", vec![(512, 512, a.clone())]).is_err());
        assert!(SegmentMap::new("m", vec![(0, 8192, a.clone())]).is_err());
        assert!(SegmentMap::new("m", vec![]).is_err());
    }
}
