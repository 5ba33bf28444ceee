//! A minimal FUSE server speaking the kernel protocol directly over `/dev/fuse` (no libfuse),
//! with two filesystems:
//!
//! - [`FuseExport`]: one block device as one regular file, the root of the mount
//!   (`rootmode=100000`), mounted over a regular file path exactly like qemu-storage-daemon's
//!   FUSE export;
//! - [`TreeMount`]: a read-only directory tree from a [`TreeSource`] (the sealed fs-verity
//!   trees), mounted over a directory.
//!
//! The [`session`] runs several threads on one connection; each one reads a request, calls the
//! filesystem inline and writes the reply. There is no queue, channel or worker pool between
//! the request and the device: parallelism comes from the kernel handing concurrent requests
//! to concurrent readers. Data moves with as few copies as the protocol allows: WRITE payloads
//! land page-aligned (ready for an `O_DIRECT` backend); READ replies are sent with `writev`
//! from a page-aligned per-thread buffer the data was read into directly.

mod file;
mod mount;
mod proto;
mod session;
pub mod tree;

pub use mount::unmount_path;
pub use proto::{DEFAULT_THREADS, MAX_WRITE};
pub use session::ExportStats;
pub use tree::{NodeAttr, NodeKind, ReadFailure, TreeMount, TreeSource, ROOT_INODE};

use crate::block::BlockDevice;
use crate::export::bytes::ByteDevice;
use file::FileFs;
use session::Session;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How to serve a device.
#[derive(Debug, Clone, Copy)]
pub struct FuseOptions {
    /// Number of serving threads (at least 1).
    pub threads: usize,
    /// Honour `fallocate(PUNCH_HOLE)` by discarding on the device.
    pub allow_discards: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: DEFAULT_THREADS,
            allow_discards: false,
        }
    }
}

/// A mounted, serving FUSE filesystem, whatever it serves: what the daemon needs of it.
pub trait Mounted: Send {
    /// Open handles right now (files, and directories of a tree).
    fn open_handles(&self) -> i64;
    /// The counters so far.
    fn stats(&self) -> ExportStats;
    /// The negotiated FUSE minor protocol version.
    fn protocol_minor(&self) -> u32;
    /// Whether fusermount3 mounted it (a non-root user's mount).
    fn via_fusermount(&self) -> bool;
    /// Unmount and wait (up to `wait`) for the serving threads; whether it had to be lazy.
    fn unmount(&mut self, wait: Duration) -> io::Result<bool>;
}

impl Mounted for FuseExport {
    fn open_handles(&self) -> i64 {
        FuseExport::open_handles(self)
    }
    fn stats(&self) -> ExportStats {
        FuseExport::stats(self)
    }
    fn protocol_minor(&self) -> u32 {
        FuseExport::protocol_minor(self)
    }
    fn via_fusermount(&self) -> bool {
        FuseExport::via_fusermount(self)
    }
    fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        FuseExport::unmount(self, wait)
    }
}

impl<S: TreeSource> Mounted for TreeMount<S> {
    fn open_handles(&self) -> i64 {
        TreeMount::open_handles(self)
    }
    fn stats(&self) -> ExportStats {
        TreeMount::stats(self)
    }
    fn protocol_minor(&self) -> u32 {
        TreeMount::protocol_minor(self)
    }
    fn via_fusermount(&self) -> bool {
        TreeMount::via_fusermount(self)
    }
    fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        TreeMount::unmount(self, wait)
    }
}

/// A mounted, serving FUSE export of one device as one file. Unmounts (lazily) when dropped.
pub struct FuseExport {
    session: Session<FileFs>,
    via_fusermount: bool,
}

impl FuseExport {
    /// Mount a FUSE filesystem whose root is a regular file holding `device` over
    /// `mountpoint` (an existing regular file), start the serving threads and wait until the
    /// kernel's INIT has been answered.
    pub fn mount(
        mountpoint: &Path,
        device: Arc<dyn BlockDevice>,
        opts: FuseOptions,
    ) -> io::Result<FuseExport> {
        Self::mount_shared(mountpoint, Arc::new(ByteDevice::new(device)), opts)
    }

    /// [`FuseExport::mount`] of a device other exporters serve too (the NBD server), through
    /// the byte access they share.
    pub(crate) fn mount_shared(
        mountpoint: &Path,
        bytes: Arc<ByteDevice>,
        opts: FuseOptions,
    ) -> io::Result<FuseExport> {
        let (master, via_fusermount) = mount::mount(mountpoint, mount::Root::File)?;
        let fs = FileFs::new(bytes, opts.allow_discards);
        let session = Session::start(mountpoint, master, fs, opts.threads)?;
        Ok(FuseExport {
            session,
            via_fusermount,
        })
    }

    /// The mount point (the exported file's path).
    pub fn path(&self) -> &Path {
        self.session.path()
    }

    /// Whether fusermount3 mounted it (a non-root user's export).
    pub fn via_fusermount(&self) -> bool {
        self.via_fusermount
    }

    /// Open file handles on the exported file right now (OPENs not yet RELEASEd), the loop
    /// device's included.
    pub fn open_handles(&self) -> i64 {
        self.session.open_handles()
    }

    /// The negotiated FUSE minor protocol version.
    pub fn protocol_minor(&self) -> u32 {
        self.session.protocol_minor()
    }

    /// The counters so far.
    pub fn stats(&self) -> ExportStats {
        self.session.stats()
    }

    /// Unmount and wait (up to `wait`) for the serving threads to end. A busy mount is retried
    /// for about a second and then detached lazily (`MNT_DETACH`); the threads then keep
    /// serving whoever still has the file open until this process exits. Returns whether the
    /// unmount had to be lazy.
    pub fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        self.session.unmount(wait)
    }
}
