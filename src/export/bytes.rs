//! A block device addressed at any byte, as every exporter needs it: the FUSE file and the NBD
//! server both take byte offsets and lengths from their clients, while a layer may accept only
//! whole logical blocks. Reads fetch the enclosing aligned range; a write of a partial block
//! is a read-modify-write. One [`ByteDevice`] is shared by every exporter of a device, so that
//! its read-modify-write lock covers them all (an NBD write and a FUSE write to the same block
//! never lose each other), and so that their error logs share one cap.

use crate::block::aligned::AlignedBuf;
use crate::block::{BlockDevice, BlockError, Result};
use crate::logcap::LogCap;
use std::sync::{Arc, RwLock};

/// Zeros written per call when a range is zeroed by writing.
const ZERO_CHUNK: u64 = 1 << 20;

fn round_down(v: u64, a: u64) -> u64 {
    v / a * a
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// A block device with byte-granular access; see the module documentation.
pub(crate) struct ByteDevice {
    device: Arc<dyn BlockDevice>,
    /// Aligned writes share it; a read-modify-write of a partial block takes it exclusively so
    /// no concurrent write to the same block is lost.
    rmw: RwLock<()>,
    io_error_log: LogCap,
    corruption_log: LogCap,
}

impl ByteDevice {
    /// Byte access to `device`.
    pub(crate) fn new(device: Arc<dyn BlockDevice>) -> ByteDevice {
        ByteDevice {
            device,
            rmw: RwLock::new(()),
            io_error_log: LogCap::new("I/O errors", crate::logcap::DEFAULT_LIMIT),
            corruption_log: LogCap::new("corruptions", crate::logcap::DEFAULT_LIMIT),
        }
    }

    /// The device.
    pub(crate) fn device(&self) -> &dyn BlockDevice {
        &*self.device
    }

    /// The device's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.device.size()
    }

    /// The device's logical block size (at least 1).
    pub(crate) fn block(&self) -> u64 {
        u64::from(self.device.logical_block_size().max(1))
    }

    /// Log `e` (capped, corruptions apart from other errors); returns whether it was a
    /// corruption. Callers count both.
    pub(crate) fn report(&self, e: &BlockError) -> bool {
        if let BlockError::Corrupt { .. } = e {
            self.corruption_log.log(|| e.to_string());
            true
        } else {
            self.io_error_log.log(|| e.to_string());
            false
        }
    }

    /// Read `[offset, offset + len)`, which lies inside the device, into `buf`; returns where
    /// the requested bytes start in `buf` (the device may only accept whole blocks: the
    /// enclosing aligned range is read, and the reply comes from the middle of it, with no
    /// extra copy either way).
    pub(crate) fn read(&self, offset: u64, len: usize, buf: &mut AlignedBuf) -> Result<usize> {
        if len == 0 {
            return Ok(0);
        }
        let (start, end) = self.enclosing(offset, len)?;
        self.device
            .read_at(buf.get((end - start) as usize), start)?;
        Ok((offset - start) as usize)
    }

    /// [`ByteDevice::read`] into a buffer that cannot grow (one the kernel shares): `None`,
    /// with nothing read, when the enclosing aligned range does not fit in `buf`.
    pub(crate) fn read_into(
        &self,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<Option<usize>> {
        if len == 0 {
            return Ok(Some(0));
        }
        let (start, end) = self.enclosing(offset, len)?;
        let Some(b) = buf.get_mut(..(end - start) as usize) else {
            return Ok(None);
        };
        self.device.read_at(b, start)?;
        Ok(Some((offset - start) as usize))
    }

    /// The aligned range the device reads for `[offset, offset + len)`, which must lie inside
    /// the device.
    fn enclosing(&self, offset: u64, len: usize) -> Result<(u64, u64)> {
        let size = self.size();
        crate::block::check_range(self.device.name(), offset, len, size)?;
        let lbs = self.block();
        let start = round_down(offset, lbs);
        let end = round_up(offset + len as u64, lbs).min(size);
        Ok((start, end))
    }

    /// Write `data` at `offset`; the range lies inside the device.
    pub(crate) fn write(&self, data: &[u8], offset: u64, buf: &mut AlignedBuf) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let size = self.size();
        crate::block::check_range(self.device.name(), offset, data.len(), size)?;
        let lbs = self.block();
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(lbs) && (end.is_multiple_of(lbs) || end == size) {
            let _g = self.rmw.read().unwrap_or_else(|e| e.into_inner());
            return self.device.write_at(data, offset);
        }
        // Partial first or last block: read-modify-write the enclosing aligned range, alone.
        let _g = self.rmw.write().unwrap_or_else(|e| e.into_inner());
        let start = round_down(offset, lbs);
        let aend = round_up(end, lbs).min(size);
        let b = buf.get((aend - start) as usize);
        let first = (lbs as usize).min(b.len());
        self.device.read_at(&mut b[..first], start)?;
        let last_start = round_down(end.min(aend - 1), lbs).max(start);
        if last_start > start {
            let at = (last_start - start) as usize;
            self.device.read_at(&mut b[at..], last_start)?;
        }
        let at = (offset - start) as usize;
        b[at..at + data.len()].copy_from_slice(data);
        self.device.write_at(b, start)
    }

    /// Make `[offset, offset + len)` read back as zeros by writing zeros.
    pub(crate) fn zero(&self, offset: u64, len: u64, buf: &mut AlignedBuf) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let zeros = vec![0u8; len.min(ZERO_CHUNK) as usize];
        let mut at = offset;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| self.out_of_range(offset, len))?;
        while at < end {
            let n = (end - at).min(ZERO_CHUNK);
            self.write(&zeros[..n as usize], at, buf)?;
            at += n;
        }
        Ok(())
    }

    /// Discard `[offset, offset + len)`: the whole blocks inside it are discarded, the partial
    /// blocks at its edges zeroed, so the range reads back as zeros wherever the device's
    /// discard does (a punched hole), and its edges always.
    pub(crate) fn punch(&self, offset: u64, len: u64, buf: &mut AlignedBuf) -> Result<()> {
        self.split(offset, len, buf, |inner, n| self.device.discard(inner, n))
    }

    /// Make `[offset, offset + len)` read back as zeros, through the device's own
    /// `write_zeroes` for the whole blocks where it has one. Where it has none, zeros are
    /// written, unless `fast` (NBD's `FAST_ZERO`): the caller then wants `Unsupported`
    /// rather than a slow zeroing.
    pub(crate) fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        fast: bool,
        buf: &mut AlignedBuf,
    ) -> Result<()> {
        self.split(offset, len, buf, |inner, n| {
            match self.device.write_zeroes(inner, n) {
                Err(BlockError::Unsupported { .. }) if !fast => {
                    let mut b = AlignedBuf::new(0);
                    self.zero(inner, n, &mut b)
                }
                r => r,
            }
        })
    }

    /// `inner` on the whole blocks of `[offset, offset + len)` (under the shared lock, as an
    /// aligned write), zeros written on its partial edges.
    fn split(
        &self,
        offset: u64,
        len: u64,
        buf: &mut AlignedBuf,
        inner: impl FnOnce(u64, u64) -> Result<()>,
    ) -> Result<()> {
        let size = self.size();
        let end = match offset.checked_add(len) {
            Some(e) if e <= size => e,
            _ => return Err(self.out_of_range(offset, len)),
        };
        if len == 0 {
            return Ok(());
        }
        let lbs = self.block();
        let inner_start = round_up(offset, lbs);
        // A last partial block at the end of the device is whole for the device.
        let inner_end = if end == size {
            end
        } else {
            round_down(end, lbs)
        }
        .max(inner_start);
        if inner_end <= inner_start {
            return self.zero(offset, len, buf);
        }
        if self.device.read_only() {
            return Err(BlockError::ReadOnly {
                device: self.device.name().to_string(),
            });
        }
        self.zero(offset, inner_start - offset, buf)?;
        {
            let _g = self.rmw.read().unwrap_or_else(|e| e.into_inner());
            inner(inner_start, inner_end - inner_start)?;
        }
        self.zero(inner_end, end - inner_end, buf)
    }

    fn out_of_range(&self, offset: u64, len: u64) -> BlockError {
        BlockError::OutOfRange {
            device: self.device.name().to_string(),
            offset,
            len,
            size: self.size(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    /// A device that only accepts whole 4 KiB blocks, to exercise the unaligned paths.
    pub(crate) struct Strict(pub MemoryDevice);

    impl BlockDevice for Strict {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn logical_block_size(&self) -> u32 {
            4096
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            assert_eq!(offset % 4096, 0);
            assert!(buf.len().is_multiple_of(4096) || offset + buf.len() as u64 == self.size());
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
            assert_eq!(offset % 4096, 0);
            assert!(buf.len().is_multiple_of(4096) || offset + buf.len() as u64 == self.size());
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> Result<()> {
            assert_eq!(offset % 4096, 0);
            assert!(len.is_multiple_of(4096) || offset + len == self.size());
            self.0.discard(offset, len)
        }
    }

    fn pattern(size: usize) -> Vec<u8> {
        (0..size).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn strict(size: usize) -> ByteDevice {
        ByteDevice::new(Arc::new(Strict(MemoryDevice::from_vec(
            "strict",
            pattern(size),
        ))))
    }

    fn all(b: &ByteDevice, buf: &mut AlignedBuf) -> Vec<u8> {
        let size = b.size() as usize;
        let at = b.read(0, size, buf).unwrap();
        buf.as_slice()[at..at + size].to_vec()
    }

    #[test]
    fn unaligned_reads() {
        let size = 3 * 4096 + 100;
        let b = strict(size);
        let want = pattern(size);
        let mut buf = AlignedBuf::new(0);
        for &(off, len) in &[
            (0, 4096),
            (1, 10),
            (4000, 200),
            (4096 * 3, 100),
            (100, 12000),
        ] {
            let at = b.read(off as u64, len, &mut buf).unwrap();
            assert_eq!(
                &buf.as_slice()[at..at + len],
                &want[off..off + len],
                "{off}+{len}"
            );
        }
        assert!(b.read(size as u64 - 1, 2, &mut buf).is_err());
        assert!(b.read(u64::MAX, 2, &mut buf).is_err());
        // Into a fixed buffer: the enclosing blocks must fit, or nothing is read.
        let mut fixed = AlignedBuf::new(2 * 4096);
        let at = b.read_into(4000, 200, fixed.all()).unwrap().unwrap();
        assert_eq!(&fixed.as_slice()[at..at + 200], &want[4000..4200]);
        assert_eq!(b.read_into(100, 8100, fixed.all()).unwrap(), None);
        assert!(b.read_into(size as u64, 1, fixed.all()).is_err());
    }

    #[test]
    fn unaligned_writes_keep_neighbours() {
        let size = 4 * 4096;
        let b = strict(size);
        let mut want = pattern(size);
        let mut buf = AlignedBuf::new(0);
        for &(off, len) in &[(10usize, 5usize), (4090, 12), (4096, 4096), (5000, 9000)] {
            let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ 0x5a).collect();
            b.write(&data, off as u64, &mut buf).unwrap();
            want[off..off + len].copy_from_slice(&data);
        }
        assert!(b.write(&[1; 10], size as u64 - 5, &mut buf).is_err());
        assert_eq!(all(&b, &mut buf), want);
    }

    #[test]
    fn punch_and_write_zeroes_zero_their_range_only() {
        let size = 4 * 4096;
        let b = strict(size);
        let mut want = pattern(size);
        let mut buf = AlignedBuf::new(0);
        b.punch(100, 10000, &mut buf).unwrap();
        want[100..10100].fill(0);
        assert_eq!(all(&b, &mut buf), want);
        // Strict has no write_zeroes: zeros are written, except when asked to be fast.
        b.write(&[9; 4096], 4096, &mut buf).unwrap();
        want[4096..8192].fill(9);
        assert!(matches!(
            b.write_zeroes(4096, 4096, true, &mut buf),
            Err(BlockError::Unsupported { .. })
        ));
        assert_eq!(all(&b, &mut buf), want);
        b.write_zeroes(4000, 5000, false, &mut buf).unwrap();
        want[4000..9000].fill(0);
        assert_eq!(all(&b, &mut buf), want);
        assert!(b.write_zeroes(size as u64, 1, false, &mut buf).is_err());
        assert!(b.punch(u64::MAX, 2, &mut buf).is_err());
    }
}
