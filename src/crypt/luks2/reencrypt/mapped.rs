//! A hotzone of a data device that is a file in RAM (tmpfs), mapped into memory: re-keyed in
//! the page cache itself, so the data is never copied in (`pread`) nor out (`pwrite`). On a
//! machine bounded by memory bandwidth those two copies cost more than the crypto. The
//! journal area is mapped the same way, so the journal is one parallel copy from the data's
//! mapping, not `pwrite`s that serialise on the file's lock.
//!
//! The data is mapped one hotzone at a time and not populated: the workers' first touches
//! fault their own pages in, on all cores, 16 pages a fault (fault-around), where
//! `MAP_POPULATE` walked every page on one thread (and marked each accessed, an LRU lock
//! round trip per page): a fifth of a 1 GiB journal re-key's CPU, none of it parallel. A
//! finished hotzone's mapping is unmapped by a [`Reaper`] thread while the next one is
//! worked on, not between them. The journal area, rewritten by every hotzone, is mapped once
//! and populated.
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

// SAFETY: the mapping is plain memory owned by this value; access goes through `&mut self`.
unsafe impl Send for Mapped {}

impl Mapped {
    /// Map `[at, at + len)` of `dev` when `dev` stores it untransformed in a regular file on
    /// a tmpfs, populated at once: for a range written again and again (the journal area).
    pub fn new(dev: &dyn BlockDevice, at: u64, len: u64) -> Option<Mapped> {
        Mapped::map(dev, at, len, true)
    }

    /// [`Mapped::new`] left to fault in on first touch, by whichever thread touches each
    /// page, and marked sequential (`MADV_SEQUENTIAL`): its pages are not marked accessed
    /// again when unmapped. For a range touched once (a hotzone of the data).
    pub fn lazy(dev: &dyn BlockDevice, at: u64, len: u64) -> Option<Mapped> {
        Mapped::map(dev, at, len, false)
    }

    fn map(dev: &dyn BlockDevice, at: u64, len: u64, populate: bool) -> Option<Mapped> {
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
        let flags = if populate {
            libc::MAP_SHARED | libc::MAP_POPULATE
        } else {
            libc::MAP_SHARED
        };
        // SAFETY: a new shared mapping of a range of an open file; the kernel picks the
        // address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.as_raw_fd(),
                libc::off_t::try_from(start).ok()?,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        if !populate {
            // SAFETY: advice on the mapping just made. Only a hint: its failure changes
            // nothing but speed.
            unsafe { libc::madvise(base, total, libc::MADV_SEQUENTIAL) };
        }
        Some(Mapped {
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

    /// The mapped bytes of `[at, at + len)` of the device (within what is mapped).
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

/// A thread that unmaps the mappings handed to it, so that unmapping a finished hotzone (a
/// page table walk over all its pages) overlaps the work on the next one. Dropping it waits
/// for what it was given.
pub struct Reaper {
    tx: Option<std::sync::mpsc::Sender<Mapped>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reaper {
    /// Start the thread; `None` if it cannot be started (mappings are then unmapped where
    /// they are dropped).
    pub fn start() -> Option<Reaper> {
        let (tx, rx) = std::sync::mpsc::channel::<Mapped>();
        let thread = std::thread::Builder::new()
            .name("dmkit-unmap".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()?;
        Some(Reaper {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Unmap `m` on the reaper's thread.
    pub fn retire(&self, m: Mapped) {
        if let Some(tx) = &self.tx {
            // A send fails only when the thread is gone; the mapping comes back and is
            // unmapped here.
            if let Err(std::sync::mpsc::SendError(m)) = tx.send(m) {
                drop(m);
            }
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
