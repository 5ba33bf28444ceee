//! A block device over a regular file or a block device node, with pread/pwrite.

use super::{check_range, BlockDevice, BlockError, Result};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Open read-only.
    pub read_only: bool,
    /// Bypass the page cache (`O_DIRECT`); requests must then be aligned to the logical block
    /// size of the underlying storage.
    pub direct: bool,
    /// Claim a block device for ourselves (`O_EXCL`): the open fails with `EBUSY` while it is
    /// mounted or claimed by someone else, and mounting it fails while we hold it, as with a
    /// device-mapper table. No effect on regular files (see [`super::Claim`] for those).
    pub exclusive: bool,
}

/// A block device backed by a file (or a block device node).
pub struct FileDevice {
    name: String,
    file: File,
    size: u64,
    read_only: bool,
}

impl FileDevice {
    /// Open `path` with `opts`.
    pub fn open(path: &Path, opts: OpenOptions) -> io::Result<Self> {
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(!opts.read_only);
        let mut flags = 0;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        if opts.exclusive {
            // Without O_CREAT, Linux gives O_EXCL this meaning for block devices only.
            flags |= libc::O_EXCL;
        }
        o.custom_flags(flags);
        let file = o.open(path)?;
        let size = file_size(&file)?;
        Ok(FileDevice {
            name: path.display().to_string(),
            file,
            size,
            read_only: opts.read_only,
        })
    }

    /// The same open file (one open file description: its claims are this one's), with its
    /// size as it is now (the file or block device may have grown or shrunk since).
    pub fn reopened(&self) -> io::Result<FileDevice> {
        let file = self.file.try_clone()?;
        let size = file_size(&file)?;
        Ok(FileDevice {
            name: self.name.clone(),
            file,
            size,
            read_only: self.read_only,
        })
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn io_err(&self, offset: u64, source: io::Error) -> BlockError {
        BlockError::Io {
            device: self.name.clone(),
            offset,
            source,
        }
    }
}

/// Size of a regular file, or of a block device (which reports 0 in its metadata).
pub fn file_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    // Block devices: seeking to the end is the portable way to learn the size.
    let mut f = file;
    let end = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(end)
}

impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, offset, buf.len(), self.size)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_err(offset, e))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        check_range(&self.name, offset, buf.len(), self.size)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io_err(offset, e))
    }
    fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data().map_err(|e| self.io_err(0, e))
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        check_range(&self.name, offset, len as usize, self.size)?;
        let (off, l) = (offset as libc::off_t, len as libc::off_t);
        // Punching a hole keeps the file size and reads back zeros, like a discard on a
        // thinly provisioned device.
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate on an fd we own, with plain integer arguments.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, l) };
        if rc != 0 {
            return Err(self.io_err(offset, io::Error::last_os_error()));
        }
        Ok(())
    }
    /// A punched hole reads back as zeros, in a regular file and on a block device alike (the
    /// kernel turns `PUNCH_HOLE` on a block device into a write-zeroes that may unmap).
    fn discard_zeroes(&self) -> bool {
        true
    }
    fn passthrough(&self, offset: u64, len: u64) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        use std::os::fd::AsFd;
        check_range(&self.name, offset, usize::try_from(len).ok()?, self.size).ok()?;
        Some((self.file.as_fd(), offset))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileTypeExt;
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        check_range(
            &self.name,
            offset,
            usize::try_from(len).unwrap_or(usize::MAX),
            self.size,
        )?;
        let fd = self.file.as_raw_fd();
        let block = self
            .file
            .metadata()
            .map_err(|e| self.io_err(offset, e))?
            .file_type()
            .is_block_device();
        let rc = if block {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKZEROOUT reads two u64 (start, length) through the pointer, which
            // points at a live array of two u64.
            unsafe { libc::ioctl(fd, BLKZEROOUT, range.as_ptr()) }
        } else {
            // ZERO_RANGE keeps the blocks allocated (a preallocated image stays so), which a
            // punched hole would not.
            // SAFETY: fallocate on an fd we own, with plain integer arguments.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_ZERO_RANGE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY) => Err(BlockError::Unsupported {
                device: self.name.clone(),
                op: "write zeroes",
            }),
            _ => Err(self.io_err(offset, e)),
        }
    }
}

/// `BLKZEROOUT`, `_IO(0x12, 127)`: zero a byte range of a block device (the kernel uses the
/// device's write-zeroes command where it has one, and writes zero pages otherwise).
const BLKZEROOUT: libc::c_ulong = 0x127f;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_writes_and_refuses_past_end() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&[7u8; 8192]).unwrap();
        let dev = FileDevice::open(tmp.path(), OpenOptions::default()).unwrap();
        assert_eq!(dev.size(), 8192);
        dev.write_at(&[1, 2], 4096).unwrap();
        let mut buf = [0u8; 3];
        dev.read_at(&mut buf, 4095).unwrap();
        assert_eq!(buf, [7, 1, 2]);
        assert!(dev.read_at(&mut buf, 8190).is_err());
        let ro = FileDevice::open(
            tmp.path(),
            OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        assert!(matches!(
            ro.write_at(&[0], 0),
            Err(BlockError::ReadOnly { .. })
        ));
    }

    #[test]
    fn write_zeroes_zeroes_only_its_range_and_keeps_the_size() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let dev = FileDevice::open(&path, OpenOptions::default()).unwrap();
        match dev.write_zeroes(4096, 8192) {
            // A filesystem without ZERO_RANGE says so; the caller writes zeros instead.
            Err(BlockError::Unsupported { .. }) => return,
            r => r.unwrap(),
        }
        let mut buf = vec![0u8; 64 << 10];
        dev.read_at(&mut buf, 0).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 7));
        assert!(buf[4096..12288].iter().all(|&b| b == 0));
        assert!(buf[12288..].iter().all(|&b| b == 7));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 10);
        assert!(matches!(
            dev.write_zeroes(60 << 10, 8192),
            Err(BlockError::OutOfRange { .. })
        ));
    }
}
