//! A fault-injecting block device for tests: fail, corrupt or drop a chosen read or write; and
//! a crash model: record the writes and flushes of an operation, then rebuild every state the
//! device could hold had power been lost at any point of it.

use super::{BlockDevice, BlockError, Result};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Which operation a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// `read_at`.
    Read,
    /// `write_at`.
    Write,
}

/// What happens when a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The operation fails with `EIO` and does nothing.
    Fail,
    /// A read returns data with one bit flipped at `bit` (counted from the request start);
    /// a write stores data with that bit flipped.
    Corrupt {
        /// Bit index within the request.
        bit: u64,
    },
    /// A write reports success but stores nothing (a lost write); a read returns zeros.
    Drop,
}

/// One fault: fires on the `nth` (0-based) operation of `op` that touches `offset_range`
/// (any operation if `None`), then stays armed only if `sticky`.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Operation kind.
    pub op: OpKind,
    /// Only operations overlapping this byte range count.
    pub offset_range: Option<(u64, u64)>,
    /// Which matching operation fires (0 = the first).
    pub nth: u64,
    /// What happens.
    pub kind: FaultKind,
    /// Fire on every matching operation from `nth` on.
    pub sticky: bool,
}

struct Armed {
    fault: Fault,
    seen: u64,
}

/// One recorded operation (see [`FaultyDevice::start_log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoggedOp {
    /// Bytes stored at an offset.
    Write {
        /// Byte offset.
        offset: u64,
        /// What was stored.
        data: Vec<u8>,
    },
    /// A flush: every write before it is durable.
    Flush,
}

/// Wraps a device and injects [`Fault`]s.
pub struct FaultyDevice<D> {
    inner: D,
    faults: Mutex<Vec<Armed>>,
    fired: AtomicU64,
    log: Mutex<Option<Vec<LoggedOp>>>,
}

impl<D: BlockDevice> FaultyDevice<D> {
    /// Wrap `inner` with no faults armed.
    pub fn new(inner: D) -> Self {
        FaultyDevice {
            inner,
            faults: Mutex::new(Vec::new()),
            fired: AtomicU64::new(0),
            log: Mutex::new(None),
        }
    }

    /// Record every write that stores data, and every flush, from now on.
    pub fn start_log(&self) {
        *self.log.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// Stop recording; what was recorded since [`start_log`](Self::start_log).
    pub fn take_log(&self) -> Vec<LoggedOp> {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// How many operations have been recorded since [`start_log`](Self::start_log) (0 when
    /// not recording): lets a test tell which recorded operations an acknowledged request
    /// came after.
    pub fn log_len(&self) -> usize {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, Vec::len)
    }

    fn record(&self, op: LoggedOp) {
        if let Some(log) = self.log.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            log.push(op);
        }
    }

    /// Arm a fault.
    pub fn arm(&self, fault: Fault) {
        self.lock().push(Armed { fault, seen: 0 });
    }

    /// Disarm all faults.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// How many faults have fired.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Armed>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fault to apply to this operation, if any.
    fn fire(&self, op: OpKind, offset: u64, len: usize) -> Option<FaultKind> {
        let mut faults = self.lock();
        let end = offset + len as u64;
        let mut hit = None;
        faults.retain_mut(|a| {
            if a.fault.op != op {
                return true;
            }
            if let Some((lo, hi)) = a.fault.offset_range {
                if end <= lo || offset >= hi {
                    return true;
                }
            }
            let n = a.seen;
            a.seen += 1;
            if n == a.fault.nth || (a.fault.sticky && n > a.fault.nth) {
                if hit.is_none() {
                    hit = Some(a.fault.kind);
                }
                return a.fault.sticky;
            }
            true
        });
        if hit.is_some() {
            self.fired.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    fn injected(&self, offset: u64) -> BlockError {
        BlockError::Io {
            device: self.inner.name().to_string(),
            offset,
            source: io::Error::other("injected fault"),
        }
    }
}

fn flip(buf: &mut [u8], bit: u64) {
    if buf.is_empty() {
        return;
    }
    let bit = bit % (buf.len() as u64 * 8);
    buf[(bit / 8) as usize] ^= 1 << (bit % 8);
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        match self.fire(OpKind::Read, offset, buf.len()) {
            None => self.inner.read_at(buf, offset),
            Some(FaultKind::Fail) => Err(self.injected(offset)),
            Some(FaultKind::Corrupt { bit }) => {
                self.inner.read_at(buf, offset)?;
                flip(buf, bit);
                Ok(())
            }
            Some(FaultKind::Drop) => {
                buf.fill(0);
                Ok(())
            }
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let stored = match self.fire(OpKind::Write, offset, buf.len()) {
            None => buf.to_vec(),
            Some(FaultKind::Fail) => return Err(self.injected(offset)),
            Some(FaultKind::Corrupt { bit }) => {
                let mut copy = buf.to_vec();
                flip(&mut copy, bit);
                copy
            }
            Some(FaultKind::Drop) => return Ok(()),
        };
        self.inner.write_at(&stored, offset)?;
        self.record(LoggedOp::Write {
            offset,
            data: stored,
        });
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()?;
        self.record(LoggedOp::Flush);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.discard(offset, len)
    }
    fn hand_over(&self) {
        self.inner.hand_over()
    }
}

/// Most unflushed writes [`for_each_crash_state`] accepts (it tries every subset of them).
pub const MAX_PENDING_WRITES: usize = 10;

/// Call `f` with every state a device that held `base` could be left in by a power cut at any
/// point of `log`: for each prefix of the log, every write before its last flush is on the
/// device, and any subset of the writes after it (a volatile write cache keeps no order). The
/// first argument of `f` describes the state. Panics when more than [`MAX_PENDING_WRITES`]
/// writes go unflushed (a test design error: flush more often, or log less).
pub fn for_each_crash_state(base: &[u8], log: &[LoggedOp], mut f: impl FnMut(&str, &[u8])) {
    let mut durable = base.to_vec();
    let apply = |img: &mut Vec<u8>, op: &LoggedOp| {
        if let LoggedOp::Write { offset, data } = op {
            let at = *offset as usize;
            img[at..at + data.len()].copy_from_slice(data);
        }
    };
    let mut pending: Vec<usize> = Vec::new();
    for cut in 0..=log.len() {
        assert!(
            pending.len() <= MAX_PENDING_WRITES,
            "{} writes without a flush before operation {cut}",
            pending.len()
        );
        for mask in 0u32..(1 << pending.len()) {
            let mut img = durable.clone();
            for (bit, &i) in pending.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    apply(&mut img, &log[i]);
                }
            }
            f(
                &format!(
                    "power cut before operation {cut} of {}, unflushed writes kept: {mask:#b} of {:?}",
                    log.len(),
                    pending
                ),
                &img,
            );
        }
        match log.get(cut) {
            Some(LoggedOp::Flush) => {
                for i in pending.drain(..) {
                    apply(&mut durable, &log[i]);
                }
            }
            Some(LoggedOp::Write { .. }) => pending.push(cut),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    #[test]
    fn fail_corrupt_drop() {
        let dev = FaultyDevice::new(MemoryDevice::new("m", 4096));
        dev.arm(Fault {
            op: OpKind::Write,
            offset_range: None,
            nth: 1,
            kind: FaultKind::Drop,
            sticky: false,
        });
        dev.write_at(&[1], 0).unwrap();
        dev.write_at(&[2], 1).unwrap(); // dropped
        dev.write_at(&[3], 2).unwrap();
        assert_eq!(&dev.inner().contents()[..3], &[1, 0, 3]);

        dev.arm(Fault {
            op: OpKind::Read,
            offset_range: Some((1024, 2048)),
            nth: 0,
            kind: FaultKind::Fail,
            sticky: false,
        });
        let mut b = [0u8; 1];
        dev.read_at(&mut b, 0).unwrap();
        assert!(dev.read_at(&mut b, 1500).is_err());
        dev.read_at(&mut b, 1500).unwrap();

        dev.arm(Fault {
            op: OpKind::Read,
            offset_range: None,
            nth: 0,
            kind: FaultKind::Corrupt { bit: 1 },
            sticky: true,
        });
        let mut b = [0u8; 1];
        dev.read_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 1 ^ 2);
        dev.read_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 1 ^ 2);
        assert_eq!(dev.fired(), 4);
    }

    #[test]
    fn crash_states_keep_flushed_writes_and_any_subset_of_the_rest() {
        let dev = FaultyDevice::new(MemoryDevice::new("m", 8));
        dev.start_log();
        dev.write_at(&[1], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2], 1).unwrap();
        dev.write_at(&[3], 2).unwrap();
        let log = dev.take_log();
        assert_eq!(log.len(), 4);
        let mut seen = Vec::new();
        for_each_crash_state(&[0u8; 8], &log, |_, img| seen.push(img[..3].to_vec()));
        // Cuts before ops 0, 1 (write 0 pending: 2 states), 2, 3 (1 pending), 4 (2 pending).
        assert_eq!(seen.len(), 1 + 2 + 1 + 2 + 4);
        assert!(seen.contains(&vec![0, 0, 0]));
        assert!(seen.contains(&vec![1, 0, 3]));
        assert!(seen.contains(&vec![1, 2, 3]));
        assert!(
            !seen.contains(&vec![0, 2, 0]),
            "a write after a flush before it"
        );
    }
}
