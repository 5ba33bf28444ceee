//! The single-file export: one block device served as the root of a FUSE mount, a regular
//! file (like qemu-storage-daemon's FUSE export), with READ and WRITE going straight to the
//! device on the serving thread.

use super::proto::*;
use super::request::Request;
use super::session::{Call, Counters, Filesystem, Reply, State};
use crate::block::{BlockDevice, BlockError};
use crate::codec::Writer;
use crate::export::bytes::ByteDevice;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A block device as a FUSE filesystem whose root is a regular file.
pub(super) struct FileFs {
    /// The device, shared with the other exporters serving it.
    pub bytes: Arc<ByteDevice>,
    pub allow_discards: bool,
    pub mtime: u64,
    pub uid: u32,
    pub gid: u32,
}

impl FileFs {
    /// The filesystem serving `bytes`.
    pub fn new(bytes: Arc<ByteDevice>, allow_discards: bool) -> FileFs {
        let mtime = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        FileFs {
            bytes,
            allow_discards,
            mtime,
            uid,
            gid,
        }
    }
}

impl Filesystem for FileFs {
    /// The buffer READs are read into and read-modify-writes are assembled in.
    type Scratch = AlignedBuf;

    fn scratch(&self) -> AlignedBuf {
        let lbs = self.device().logical_block_size().max(1) as usize;
        AlignedBuf::new(MAX_WRITE + 2 * lbs.max(PAGE))
    }

    fn init_flags(&self) -> u32 {
        // ATOMIC_O_TRUNC: `O_TRUNC` comes with OPEN, where it is ignored as a block device
        // ignores it, instead of as a SETATTR of size 0 that a truncate(2) to 0 would send
        // too (and that must keep failing: the size of a device does not change).
        FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_ASYNC_DIO | FUSE_MAX_PAGES | FUSE_ATOMIC_O_TRUNC
    }

    fn handle(&self, req: &Call<'_>, io: &mut AlignedBuf, r: &mut Reply<'_>, st: &State) {
        let ctr = req.counters;
        match req.op {
            Request::Write { offset, data, .. } => match self.write(data, offset, io) {
                Ok(done) => {
                    ctr.bytes_written.fetch_add(done as u64, Ordering::Relaxed);
                    let mut o = Out::with_capacity(128);
                    o.u32_ne(done as u32).u32_ne(0);
                    r.ok(&[o.as_slice()]);
                }
                Err(e) => r.err(self.fail(ctr, e)),
            },
            Request::Read { offset, size, .. } => {
                match self.read_reply(offset, size as usize, io, r) {
                    Ok(len) => {
                        ctr.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
                    }
                    Err(e) => r.err(self.fail(ctr, e)),
                }
            }
            Request::Getattr => r.ok(&[&self.attr_out()]),
            Request::Setattr { valid, size } => {
                // The file is a device: its size is fixed. Mode, owner and time changes are
                // accepted and ignored, like on a block device node that is recreated.
                if valid & FATTR_SIZE != 0 {
                    if let Err(e) = self.truncate(size, req.nodeid, ctr, io, st) {
                        return r.err(e.0);
                    }
                }
                r.ok(&[&self.attr_out()]);
            }
            Request::Open { flags } => {
                let acc = flags as i32 & libc::O_ACCMODE;
                if self.device().read_only() && acc != libc::O_RDONLY {
                    return r.err(libc::EROFS);
                }
                // O_TRUNC is ignored, as on a block device: `dd of=`, `>` and `tee` write
                // over the data in place. (The kernel drops its cached size to 0 and marks
                // it stale: the next stat or read asks GETATTR and gets the device size.)
                // O_APPEND is refused: every append would land at the end of the device,
                // where there is no room; EINVAL, like every other attempt to change the size
                // (truncate to another size), and at open rather than at the first write.
                if flags as i32 & libc::O_APPEND != 0 && acc != libc::O_RDONLY {
                    return r.err(libc::EINVAL);
                }
                let mut open_flags = 0;
                if self.device().read_only() {
                    // Nothing can change the contents: keep the page cache across opens.
                    open_flags |= FOPEN_KEEP_CACHE;
                }
                let minor = st.minor.load(Ordering::Relaxed);
                if minor >= 35 {
                    // FLUSH would be a no-op: writes are already on the device.
                    open_flags |= FOPEN_NOFLUSH;
                }
                if minor >= 36 {
                    open_flags |= FOPEN_PARALLEL_DIRECT_WRITES;
                }
                let mut o = Out::with_capacity(128);
                o.u64_ne(0).u32_ne(open_flags).u32_ne(0);
                // Counted before the reply: once open(2) returns, `close` sees the user.
                st.open_handles.fetch_add(1, Ordering::SeqCst);
                r.ok(&[o.as_slice()]);
            }
            Request::Release { .. } => {
                st.open_handles.fetch_sub(1, Ordering::SeqCst);
                r.ok(&[]);
            }
            Request::Flush => r.ok(&[]),
            Request::Fsync => match self.device().flush() {
                Ok(()) => r.ok(&[]),
                Err(e) => r.err(self.fail(ctr, e)),
            },
            Request::Statfs => {
                let bsize = self.blksize();
                r.ok(&[&statfs_out(self.device().size() / bsize as u64, 1, bsize)]);
            }
            Request::Fallocate {
                offset,
                length,
                mode,
            } => match self.fallocate(offset, length, mode as i32, ctr, io) {
                Ok(()) => r.ok(&[]),
                Err(Errno(e)) => r.err(e),
            },
            Request::Lseek { offset, whence } => {
                let whence = whence as i32;
                let size = self.device().size();
                // No holes in a device: all data up to the end, one hole at the end.
                let res = match whence {
                    libc::SEEK_DATA if offset < size => Ok(offset),
                    libc::SEEK_HOLE if offset < size => Ok(size),
                    libc::SEEK_DATA | libc::SEEK_HOLE => Err(libc::ENXIO),
                    _ => Err(libc::EINVAL),
                };
                match res {
                    Ok(off) => r.ok(&[Writer::new().u64_ne(off).as_slice()]),
                    Err(e) => r.err(e),
                }
            }
            // Arguments too short for an opcode this filesystem serves.
            Request::Malformed {
                opcode: FUSE_READ | FUSE_SETATTR | FUSE_FALLOCATE | FUSE_LSEEK,
                ..
            } => r.err(libc::EINVAL),
            _ => r.err(libc::ENOSYS),
        }
    }
}

/// A negative reply code, already an errno.
struct Errno(i32);

impl FileFs {
    fn device(&self) -> &dyn BlockDevice {
        self.bytes.device()
    }

    fn blksize(&self) -> u32 {
        self.device().logical_block_size().max(PAGE as u32)
    }

    /// Count and log a device error; returns the errno for the reply. Every failure counts
    /// as an I/O error (the reader saw one); corruptions are counted apart as well. Both logs
    /// are capped.
    fn fail(&self, ctr: &Counters, e: BlockError) -> i32 {
        ctr.io_errors.fetch_add(1, Ordering::Relaxed);
        if self.bytes.report(&e) {
            ctr.corruptions.fetch_add(1, Ordering::Relaxed);
        }
        e.errno()
    }

    fn attr_out(&self) -> Vec<u8> {
        let size = self.device().size();
        let mode = libc::S_IFREG
            | if self.device().read_only() {
                0o400
            } else {
                0o600
            };
        let mut o = Out::with_capacity(128);
        o.u64_ne(ATTR_VALID_SECS)
            .u32_ne(0)
            .u32_ne(0)
            .u64_ne(1) // ino
            .u64_ne(size)
            .u64_ne(size.div_ceil(512))
            .u64_ne(self.mtime) // atime
            .u64_ne(self.mtime) // mtime
            .u64_ne(self.mtime) // ctime
            .u32_ne(0)
            .u32_ne(0)
            .u32_ne(0)
            .u32_ne(mode)
            .u32_ne(1) // nlink
            .u32_ne(self.uid)
            .u32_ne(self.gid)
            .u32_ne(0) // rdev
            .u32_ne(self.blksize())
            .u32_ne(0); // flags
        o.into_inner()
    }

    /// How many of `size` bytes at `offset` there are: like a regular file, a read across the
    /// end is short.
    fn readable(&self, offset: u64, size: usize) -> usize {
        let dev_size = self.device().size();
        if offset >= dev_size {
            return 0;
        }
        (size as u64).min(dev_size - offset) as usize
    }

    /// Read `[offset, offset + size)` clamped at the end of the device into `io`; returns where
    /// the requested bytes start in `io` and how many there are.
    fn read(
        &self,
        offset: u64,
        size: usize,
        io: &mut AlignedBuf,
    ) -> Result<(usize, usize), BlockError> {
        let len = self.readable(offset, size);
        if len == 0 {
            return Ok((0, 0));
        }
        Ok((self.bytes.read(offset, len, io)?, len))
    }

    /// Answer a READ of `[offset, offset + size)`: straight into the buffer the transport sends
    /// from when it is free and large enough (no copy), else through `io`. Returns the bytes
    /// sent; on error nothing was sent.
    fn read_reply(
        &self,
        offset: u64,
        size: usize,
        io: &mut AlignedBuf,
        r: &mut Reply<'_>,
    ) -> Result<usize, BlockError> {
        let len = self.readable(offset, size);
        if len > 0 {
            if let Some(buf) = r.buffer() {
                if let Some(start) = self.bytes.read_into(offset, len, buf)? {
                    r.ok_buffer(start, len);
                    return Ok(len);
                }
            }
        }
        let (start, len) = self.read(offset, size, io)?;
        r.ok(&[&io.all()[start..start + len]]);
        Ok(len)
    }

    /// Write `data` at `offset`, clamped at the end of the device; returns the bytes written.
    fn write(&self, data: &[u8], offset: u64, io: &mut AlignedBuf) -> Result<usize, BlockError> {
        if self.device().read_only() {
            return Err(BlockError::ReadOnly {
                device: self.device().name().to_string(),
            });
        }
        let dev_size = self.device().size();
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= dev_size {
            // A device cannot grow: like writing past the end of a block device.
            return Err(BlockError::Io {
                device: self.device().name().to_string(),
                offset,
                source: io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        let len = (data.len() as u64).min(dev_size - offset) as usize;
        self.bytes.write(&data[..len], offset, io)?;
        Ok(len)
    }

    /// A truncate (`truncate(2)`, `ftruncate(2)`; `O_TRUNC` never gets here, see OPEN) to
    /// `size`. The size stays the device's whatever happens:
    /// - to 0, the contents are thrown away: the whole device reads back as zeros, as the
    ///   emptied file would. `qemu-img convert` (and `create`) truncates to 0 and then skips
    ///   writing the source's zero ranges, trusting the file to read zeros there;
    /// - to a size in between, ignored, as `ftruncate(2)` failing on a block device is
    ///   ignored by `dd seek=N` (which truncates at the seek) and `cp --sparse` (which
    ///   truncates to the source's size after a trailing hole): both then write the data
    ///   they meant to, and everything past it stays as on a block device;
    /// - to more than the device holds, EINVAL, as `ftruncate(2)` of a block device answers.
    fn truncate(
        &self,
        size: u64,
        nodeid: u64,
        ctr: &Counters,
        io: &mut AlignedBuf,
        st: &State,
    ) -> Result<(), Errno> {
        let dev_size = self.device().size();
        if size > dev_size {
            return Err(Errno(libc::EINVAL));
        }
        if size != 0 {
            return Ok(());
        }
        if self.device().read_only() {
            return Err(Errno(libc::EROFS));
        }
        self.zero(0, dev_size, Zero::Punch, io)
            .map_err(|e| Errno(self.fail(ctr, e)))?;
        // The kernel sees the same size before and after, so it keeps its cached pages:
        // tell it they changed.
        notify_inval_inode(st.notify_fd, nodeid, 0, 0);
        Ok(())
    }

    /// `fallocate(2)` as a block device answers it, except that a punched hole always reads
    /// back as zeros (tools such as `cp --sparse=always` punch where they skip, trusting the
    /// file to read zeros there).
    fn fallocate(
        &self,
        offset: u64,
        length: u64,
        mode: i32,
        ctr: &Counters,
        io: &mut AlignedBuf,
    ) -> Result<(), Errno> {
        let dev_size = self.device().size();
        let end = offset.checked_add(length).ok_or(Errno(libc::EINVAL))?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        // Without KEEP_SIZE a range past the end would grow a file: a device has no room.
        if !keep_size && end > dev_size {
            return Err(Errno(libc::ENOSPC));
        }
        let zero = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            // Allocation: every byte of a device already exists.
            0 => return Ok(()),
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Zero::Punch,
            libc::FALLOC_FL_ZERO_RANGE => Zero::Range,
            _ => return Err(Errno(libc::EOPNOTSUPP)),
        };
        if self.device().read_only() {
            return Err(Errno(libc::EROFS));
        }
        let end = end.min(dev_size);
        if offset >= end {
            return Ok(());
        }
        self.zero(offset, end - offset, zero, io)
            .map_err(|e| Errno(self.fail(ctr, e)))
    }

    /// Make `[offset, offset + len)` (inside the device) read back as zeros: a punched hole is
    /// a discard (TRIM) where the export allows discards and the layer's discard reads back as
    /// zeros; everything else is the layer's write-zeroes, or zeros written where it has none.
    /// Partial blocks at the edges are always zeroed by writing.
    fn zero(
        &self,
        offset: u64,
        len: u64,
        how: Zero,
        io: &mut AlignedBuf,
    ) -> Result<(), BlockError> {
        if how == Zero::Punch && self.allow_discards && self.device().discard_zeroes() {
            match self.bytes.punch(offset, len, io) {
                Err(BlockError::Unsupported { .. }) => {}
                r => return r,
            }
        }
        self.bytes.write_zeroes(offset, len, false, io)
    }
}

/// Which `fallocate(2)` mode zeroes a range.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zero {
    /// `PUNCH_HOLE`: a discard where it reads back as zeros.
    Punch,
    /// `ZERO_RANGE`: the allocation stays.
    Range,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;
    use crate::export::bytes::tests::Strict;

    fn shared(size: usize) -> FileFs {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let dev = Arc::new(Strict(MemoryDevice::from_vec("strict", data)));
        FileFs::new(Arc::new(ByteDevice::new(dev)), true)
    }

    fn expect(size: usize) -> Vec<u8> {
        (0..size).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn reads_across_the_end_are_short() {
        let size = 3 * 4096 + 100;
        let sh = shared(size);
        let want = expect(size);
        let mut io = AlignedBuf::new(MAX_WRITE);
        for &(off, len) in &[(4096 * 3, 500), (100, 20000)] {
            let (s, n) = sh.read(off as u64, len, &mut io).unwrap();
            let end = (off + len).min(size);
            assert_eq!(&io.all()[s..s + n], &want[off..end], "read {off}+{len}");
        }
        assert_eq!(sh.read(size as u64, 10, &mut io).unwrap().1, 0);
    }

    #[test]
    fn writes_across_the_end_are_short() {
        let size = 4 * 4096;
        let sh = shared(size);
        let mut want = expect(size);
        let mut io = AlignedBuf::new(MAX_WRITE);
        // Across the end: short write; at the end: ENOSPC.
        assert_eq!(sh.write(&[1; 100], size as u64 - 10, &mut io).unwrap(), 10);
        want[size - 10..].fill(1);
        assert!(sh.write(&[1; 10], size as u64, &mut io).is_err());
        let (s, n) = sh.read(0, size, &mut io).unwrap();
        assert_eq!(&io.all()[s..s + n], &want[..]);
    }

    #[test]
    fn punch_hole_and_zero_range_read_back_as_zeros() {
        let size = 4 * 4096;
        let sh = shared(size);
        let mut want = expect(size);
        let mut io = AlignedBuf::new(MAX_WRITE);
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert!(sh
            .fallocate(100, 10000, mode, &Counters::default(), &mut io)
            .is_ok());
        want[100..10100].fill(0);
        let (s, n) = sh.read(0, size, &mut io).unwrap();
        assert_eq!(&io.all()[s..s + n], &want[..]);
        // ZERO_RANGE zeroes too; past the end it needs KEEP_SIZE (a device cannot grow).
        let ctr = Counters::default();
        assert!(sh
            .fallocate(12000, 300, libc::FALLOC_FL_ZERO_RANGE, &ctr, &mut io)
            .is_ok());
        want[12000..12300].fill(0);
        assert!(matches!(
            sh.fallocate(
                size as u64 - 10,
                20,
                libc::FALLOC_FL_ZERO_RANGE,
                &ctr,
                &mut io
            ),
            Err(Errno(libc::ENOSPC))
        ));
        let keep = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        assert!(sh
            .fallocate(size as u64 - 10, 20, keep, &ctr, &mut io)
            .is_ok());
        want[size - 10..].fill(0);
        let (s, n) = sh.read(0, size, &mut io).unwrap();
        assert_eq!(&io.all()[s..s + n], &want[..]);
        // Modes that move data have no meaning on a device.
        assert!(matches!(
            sh.fallocate(0, 4096, libc::FALLOC_FL_COLLAPSE_RANGE, &ctr, &mut io),
            Err(Errno(libc::EOPNOTSUPP))
        ));
    }
}
