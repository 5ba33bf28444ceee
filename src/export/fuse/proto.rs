//! The FUSE kernel protocol as this server speaks it: opcodes, flags, sizes, and the small
//! encoders and buffers every request handler uses.

use std::io;
use std::os::fd::RawFd;

/// Serving threads when none is asked for.
pub const DEFAULT_THREADS: usize = 4;
/// Largest WRITE payload (and READ size) negotiated with the kernel.
pub const MAX_WRITE: usize = 1 << 20;
pub(super) const MAX_PAGES: u16 = 256;
/// Kernel protocol version we speak. Nothing we use changed layout between 7.31 and 7.38; the
/// newer minor lets the kernel honour `FOPEN_NOFLUSH` and `FOPEN_PARALLEL_DIRECT_WRITES`.
pub(super) const KERNEL_MAJOR: u32 = 7;
pub(super) const KERNEL_MINOR: u32 = 38;
/// Background requests (readahead, async direct I/O) the kernel keeps in flight. The kernel's
/// default of 12 would cap `iodepth=32` libaio runs; 128 lets them through.
pub(super) const MAX_BACKGROUND: u16 = 128;
pub(super) const CONGESTION_THRESHOLD: u16 = 96;
/// Attribute (and directory entry) cache lifetime: nothing served changes while mounted.
pub(super) const ATTR_VALID_SECS: u64 = 3600;

pub(super) const IN_HEADER: usize = 40;
pub(super) const OUT_HEADER: usize = 16;
pub(super) const WRITE_IN: usize = 40;
/// Head of a request read separately so that a WRITE payload starts on a page boundary.
pub(super) const HEAD: usize = IN_HEADER + WRITE_IN;
pub(super) use crate::block::aligned::PAGE;
/// Non-WRITE requests we parse are all under this size.
pub(super) const MAX_ARGS: usize = 512;

// Opcodes (include/uapi/linux/fuse.h).
pub(super) const FUSE_LOOKUP: u32 = 1;
pub(super) const FUSE_FORGET: u32 = 2;
pub(super) const FUSE_GETATTR: u32 = 3;
pub(super) const FUSE_SETATTR: u32 = 4;
pub(super) const FUSE_READLINK: u32 = 5;
pub(super) const FUSE_OPEN: u32 = 14;
pub(super) const FUSE_READ: u32 = 15;
pub(super) const FUSE_WRITE: u32 = 16;
pub(super) const FUSE_STATFS: u32 = 17;
pub(super) const FUSE_RELEASE: u32 = 18;
pub(super) const FUSE_FSYNC: u32 = 20;
pub(super) const FUSE_GETXATTR: u32 = 22;
pub(super) const FUSE_LISTXATTR: u32 = 23;
pub(super) const FUSE_FLUSH: u32 = 25;
pub(super) const FUSE_INIT: u32 = 26;
pub(super) const FUSE_OPENDIR: u32 = 27;
pub(super) const FUSE_READDIR: u32 = 28;
pub(super) const FUSE_RELEASEDIR: u32 = 29;
pub(super) const FUSE_FSYNCDIR: u32 = 30;
pub(super) const FUSE_ACCESS: u32 = 34;
pub(super) const FUSE_INTERRUPT: u32 = 36;
pub(super) const FUSE_DESTROY: u32 = 38;
pub(super) const FUSE_NOTIFY_REPLY: u32 = 41;
pub(super) const FUSE_BATCH_FORGET: u32 = 42;
pub(super) const FUSE_FALLOCATE: u32 = 43;
pub(super) const FUSE_READDIRPLUS: u32 = 44;
pub(super) const FUSE_LSEEK: u32 = 46;

// INIT flags.
pub(super) const FUSE_ASYNC_READ: u32 = 1 << 0;
/// OPEN carries `O_TRUNC` instead of the kernel sending a SETATTR of size 0 after it.
pub(super) const FUSE_ATOMIC_O_TRUNC: u32 = 1 << 3;
pub(super) const FUSE_BIG_WRITES: u32 = 1 << 5;
pub(super) const FUSE_DO_READDIRPLUS: u32 = 1 << 13;
pub(super) const FUSE_READDIRPLUS_AUTO: u32 = 1 << 14;
pub(super) const FUSE_ASYNC_DIO: u32 = 1 << 15;
pub(super) const FUSE_PARALLEL_DIROPS: u32 = 1 << 18;
pub(super) const FUSE_MAX_PAGES: u32 = 1 << 22;
pub(super) const FUSE_CACHE_SYMLINKS: u32 = 1 << 23;

// OPEN reply flags.
pub(super) const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub(super) const FOPEN_CACHE_DIR: u32 = 1 << 3;
pub(super) const FOPEN_NOFLUSH: u32 = 1 << 5;
pub(super) const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

pub(super) const FATTR_SIZE: u32 = 1 << 3;

/// `FUSE_DEV_IOC_CLONE` = `_IOR(229, 0, uint32_t)`.
pub(super) const FUSE_DEV_IOC_CLONE: u64 = 0x8004_e500;

pub(super) use crate::block::aligned::AlignedBuf;

/// Builds small reply payloads (native byte order: `_ne` writes).
pub(super) type Out = crate::codec::Writer;

/// A read-only filesystem's `fuse_statfs_out`: `blocks` of `bsize` bytes and `files` nodes,
/// none free.
pub(super) fn statfs_out(blocks: u64, files: u64, bsize: u32) -> Vec<u8> {
    let mut o = Out::with_capacity(128);
    o.u64_ne(blocks)
        .u64_ne(0) // bfree
        .u64_ne(0) // bavail
        .u64_ne(files)
        .u64_ne(0) // ffree
        .u32_ne(bsize)
        .u32_ne(255) // namelen
        .u32_ne(bsize) // frsize
        .u32_ne(0)
        .zeros(24);
    o.into_inner()
}

/// Write one reply: out-header plus payload pieces, in a single `writev`.
pub(super) fn reply(fd: RawFd, unique: u64, error: i32, payload: &[&[u8]]) {
    let len = OUT_HEADER + payload.iter().map(|p| p.len()).sum::<usize>();
    let mut out = Out::with_capacity(OUT_HEADER);
    out.u32_ne(len as u32).u32_ne(-error as u32).u64_ne(unique);
    let mut hdr = out.into_inner();
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 3];
    iov[0] = libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: OUT_HEADER,
    };
    let mut n = 1;
    for p in payload.iter().filter(|p| !p.is_empty()).take(2) {
        iov[n] = libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        };
        n += 1;
    }
    // SAFETY: every iovec points into a buffer that lives until writev returns; the kernel
    // only reads from them.
    let rc = unsafe { libc::writev(fd, iov.as_ptr(), n as libc::c_int) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // ENOENT: the request was interrupted and the kernel no longer waits for it.
        // ENODEV: the connection is gone; the next read ends the thread.
        if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) {
            eprintln!("dmkit: fuse: cannot send reply to request {unique}: {e}");
        }
    }
}

/// `FUSE_NOTIFY_INVAL_INODE`: drop the kernel's cached attributes of an inode and its cached
/// pages in `[off, off + len)` (`len` 0: to the end).
const FUSE_NOTIFY_INVAL_INODE: i32 = 2;

/// Tell the kernel that the contents of inode `ino` changed in `[off, off + len)` behind its
/// page cache. A notification is a reply with no request (unique 0) whose error field carries
/// the notification code.
pub(super) fn notify_inval_inode(fd: RawFd, ino: u64, off: u64, len: u64) {
    let mut o = Out::with_capacity(128);
    o.u64_ne(ino).u64_ne(off).u64_ne(len);
    reply(fd, 0, -FUSE_NOTIFY_INVAL_INODE, &[o.as_slice()]);
}

/// `FUSE_INIT_EXT`: the INIT structures carry `flags2`.
pub(super) const FUSE_INIT_EXT: u32 = 1 << 30;
/// `FUSE_OVER_IO_URING` (bit 41 of the 64-bit flags) as a bit of `flags2`.
pub(super) const FUSE_OVER_IO_URING2: u32 = 1 << (41 - 32);
