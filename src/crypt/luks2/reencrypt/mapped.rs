//! A hotzone of a data device that is a file in RAM (tmpfs), mapped into memory: re-keyed in
//! the page cache itself, so the data is never copied in (`pread`) nor out (`pwrite`). On a
//! machine bounded by memory bandwidth those two copies cost more than the crypto. The
//! journal area is mapped the same way, so the journal is one parallel copy from the data's
//! mapping, not `pwrite`s that serialise on the file's lock.
//!
//! Only tmpfs: on a disk filesystem the first write to each page of a shared mapping faults
//! for dirty tracking (`page_mkwrite`, a journal handle per page on ext4) and populating the
//! mapping reads the disk synchronously; measured, that made a 1 GiB re-key slower than
//! cryptsetup's `pread`/`pwrite`. Disk files and block devices keep the read/write path.

use crate::block::BlockDevice;
use std::os::fd::AsRawFd;

/// A shared, writable mapping of part of a file.
pub struct Mapped {
    base: *mut libc::c_void,
    len: usize,
    delta: usize,
    /// The device offset of the first mapped byte past `delta`.
    at: u64,
}

/// How much of the data one mapping covers: hotzones smaller than this (the journal's) reuse
/// it instead of mapping and unmapping each time.
pub const WINDOW: u64 = 256 << 20;

// SAFETY: the mapping is plain memory owned by this value; access goes through `&mut self`.
unsafe impl Send for Mapped {}

impl Mapped {
    /// Map `[at, at + len)` of `dev` when `dev` stores it untransformed in a regular file on
    /// a tmpfs.
    pub fn new(dev: &dyn BlockDevice, at: u64, len: u64) -> Option<Mapped> {
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let (fd, off) = dev.passthrough(at, len)?;
        // SAFETY: fstat and fstatfs write into structs we own, on a descriptor borrowed from
        // `dev`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
            || unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0
            || fs.f_type as i64 != TMPFS_MAGIC
        {
            return None;
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let start = off / page * page;
        let delta = (off - start) as usize;
        let total = usize::try_from(len).ok()?.checked_add(delta)?;
        // SAFETY: a new shared mapping of a range of an open file; the kernel picks the
        // address. Populated at once: one call instead of a fault per page.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                libc::off_t::try_from(start).ok()?,
            )
        };
        (base != libc::MAP_FAILED).then_some(Mapped {
            base,
            len: total,
            delta,
            at,
        })
    }

    /// The mapped hotzone.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `base..base + len` is mapped readable and writable while `self` lives, and
        // `&mut self` makes this the only view.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.base as *mut u8).add(self.delta),
                self.len - self.delta,
            )
        }
    }

    /// Whether `[at, at + len)` of the device is mapped.
    pub fn covers(&self, at: u64, len: u64) -> bool {
        at >= self.at && at + len <= self.at + (self.len - self.delta) as u64
    }

    /// The mapped bytes of `[at, at + len)` of the device (which [`Mapped::covers`]).
    pub fn range(&mut self, at: u64, len: u64) -> &mut [u8] {
        let from = (at - self.at) as usize;
        &mut self.bytes()[from..from + len as usize]
    }

    /// Write `[at, at + len)` of the device back to the file (`msync(MS_SYNC)`); the
    /// device's flush then makes it durable like any write.
    pub fn sync(&mut self, at: u64, len: u64) -> std::io::Result<()> {
        let first = self.delta + (at - self.at) as usize;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let start = first / page * page;
        // SAFETY: msync on a page-aligned part of the mapping this value owns.
        let rc = unsafe {
            libc::msync(
                (self.base as *mut u8).add(start) as *mut libc::c_void,
                first + len as usize - start,
                libc::MS_SYNC,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Start writing `[at, at + len)` of `dev` back to its disk without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`) when it is a file; the flush that follows still
/// decides durability. Errors surface at that flush.
pub fn start_writeback(dev: &dyn BlockDevice, at: u64, len: u64) {
    if let Some((fd, off)) = dev.passthrough(at, len) {
        // SAFETY: sync_file_range on a descriptor borrowed from `dev`, integer arguments.
        unsafe {
            libc::sync_file_range(
                fd.as_raw_fd(),
                off as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
