//! The data pass of an offline reencryption on a disk, past the page cache (`O_DIRECT`), as
//! cryptsetup reads its hotzones. Buffered, every byte of the device is copied from the page
//! cache into the hotzone buffer and back again, and the pages are filled, dirtied and written
//! back by the kernel on the way: measured on a 256 MiB re-key, that copying was half of the
//! run's CPU time, more than the crypto. tmpfs files take the mapped path instead (`mapped`).
//!
//! Only requests aligned to 4096 bytes in the file and in memory go direct (whatever the disk's
//! logical block size, 4096 is a multiple of it); anything else, or a filesystem that refuses
//! `O_DIRECT`, takes the buffered path of the device itself. Both paths see the same bytes: the
//! kernel writes dirty cached pages of a range back before a direct read of it, and drops the
//! cached pages a direct write replaces. Durability is unchanged: the engine flushes the data
//! device (`fdatasync`) where it did before, which also flushes the disk's write cache.

use crate::block::{BlockDevice, BlockError};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

/// The alignment of every direct request: in the file, in memory and in length.
const ALIGN: u64 = 4096;

/// A second, `O_DIRECT` descriptor of the file holding a device's data.
pub struct DirectIo {
    file: File,
    /// The device's name, for errors.
    name: String,
    /// The device offset `dev_at` is at file offset `file_at`.
    dev_at: u64,
    file_at: u64,
    /// Device bytes past `dev_at` this descriptor may touch.
    len: u64,
}

impl DirectIo {
    /// A direct descriptor for `[at, at + len)` of `dev`, when `dev` stores that range
    /// untransformed in a file that is not on tmpfs (which has its own, faster path) and
    /// takes `O_DIRECT`.
    pub fn new(dev: &dyn BlockDevice, at: u64, len: u64) -> Option<DirectIo> {
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let (fd, file_at) = dev.passthrough(at, len)?;
        // SAFETY: fstatfs writes into a struct we own, on a descriptor borrowed from `dev`.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0 || fs.f_type as i64 == TMPFS_MAGIC
        {
            return None;
        }
        // Reopened through /proc: a new open file description of the same file, so the
        // device's own descriptor keeps its flags.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .ok()?;
        Some(DirectIo {
            file,
            name: dev.name().to_string(),
            dev_at: at,
            file_at,
            len,
        })
    }

    /// The file offset of device offset `at`, when a request of `n` bytes there with a buffer
    /// at `ptr` may go direct.
    fn place(&self, at: u64, n: usize, ptr: *const u8) -> Option<u64> {
        let rel = at.checked_sub(self.dev_at)?;
        if rel.checked_add(n as u64)? > self.len {
            return None;
        }
        let off = self.file_at.checked_add(rel)?;
        let aligned = off.is_multiple_of(ALIGN)
            && (n as u64).is_multiple_of(ALIGN)
            && (ptr as u64).is_multiple_of(ALIGN);
        (aligned && n > 0).then_some(off)
    }

    /// Read `buf` from device offset `at`. `None`: this request cannot go direct (the caller
    /// reads it buffered); `Some(Err)` a failed read.
    pub fn read_at(&self, buf: &mut [u8], at: u64) -> Option<Result<(), BlockError>> {
        let off = self.place(at, buf.len(), buf.as_ptr())?;
        self.outcome(self.file.read_exact_at(buf, off), at)
    }

    /// Write `buf` at device offset `at`, as [`DirectIo::read_at`] reads.
    pub fn write_at(&self, buf: &[u8], at: u64) -> Option<Result<(), BlockError>> {
        let off = self.place(at, buf.len(), buf.as_ptr())?;
        self.outcome(self.file.write_all_at(buf, off), at)
    }

    /// A direct request's result: EINVAL (a filesystem may refuse `O_DIRECT` only at the first
    /// request) sends it down the buffered path.
    fn outcome(&self, r: std::io::Result<()>, at: u64) -> Option<Result<(), BlockError>> {
        match r {
            Ok(()) => Some(Ok(())),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
            Err(source) => Some(Err(BlockError::Io {
                device: self.name.clone(),
                offset: at,
                source,
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{FileDevice, OpenOptions};

    /// On a disk filesystem (the test's temporary directory, if it is not tmpfs) aligned
    /// requests go direct and read back what was written buffered and the other way round;
    /// unaligned ones are left to the caller.
    #[test]
    fn aligned_requests_go_direct_and_agree_with_the_page_cache() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let dev = FileDevice::open(&path, OpenOptions::default()).unwrap();
        let Some(d) = DirectIo::new(&dev, 4096, (1 << 20) - 4096) else {
            eprintln!("skipped: the temporary directory is on tmpfs or refuses O_DIRECT");
            return;
        };
        let mut aligned = crate::block::aligned::AlignedBuf::new(8192 + 4096);
        let buf = aligned.all();
        dev.write_at(&[9u8; 8192], 8192).unwrap();
        match d.read_at(&mut buf[..8192], 8192) {
            Some(r) => r.unwrap(),
            None => {
                eprintln!("skipped: the filesystem refuses O_DIRECT");
                return;
            }
        }
        assert!(buf[..8192].iter().all(|&b| b == 9));
        buf.fill(5);
        d.write_at(&buf[..8192], 16384).unwrap().unwrap();
        let mut back = [0u8; 8192];
        dev.read_at(&mut back, 16384).unwrap();
        assert!(back.iter().all(|&b| b == 5));
        // Before its range, unaligned in the file, in length or in memory: not direct.
        assert!(d.read_at(&mut buf[..4096], 0).is_none());
        assert!(d.read_at(&mut buf[..4096], 4096 + 512).is_none());
        assert!(d.read_at(&mut buf[..512], 8192).is_none());
        assert!(d.read_at(&mut buf[1..4097], 8192).is_none());
    }
}
