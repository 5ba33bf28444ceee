//! A minimal FUSE server speaking the kernel protocol directly over `/dev/fuse` (no libfuse),
//! with two filesystems:
//!
//! - [`mount_device`]: one block device as one regular file, the root of the mount
//!   (`rootmode=100000`), mounted over a regular file path exactly like qemu-storage-daemon's
//!   FUSE export;
//! - [`mount_tree`]: a read-only directory tree from a [`TreeSource`] (the sealed fs-verity
//!   trees), mounted over a directory.
//!
//! Both give a [`Mounted`]: the one session type serves either filesystem.
//!
//! The `session` runs several threads on one connection; each one reads a request, calls the
//! filesystem inline and writes the reply. When the kernel offers FUSE over io_uring, requests
//! come instead through one ring queue per CPU (`uring`), each served inline by a thread
//! pinned to its CPU; [`Transport`] says which is in use. There is no queue, channel or worker pool between
//! the request and the device: parallelism comes from the kernel handing concurrent requests
//! to concurrent readers. Data moves with as few copies as the protocol allows: WRITE payloads
//! land page-aligned (ready for an `O_DIRECT` backend); READ replies are sent with `writev`
//! from a page-aligned per-thread buffer the data was read into directly.

mod file;
mod mount;
mod proto;
pub mod request;
mod session;
mod transport;
pub mod tree;
mod uring;

pub use mount::unmount_path;
pub use proto::{DEFAULT_THREADS, MAX_WRITE};
pub use session::ExportStats;
pub use transport::{uring_switch, Transport, TransportChoice, ENABLE_URING, TRANSPORT_ENV};
pub use tree::{mount_tree, NodeAttr, NodeKind, ReadFailure, TreeSource, Xattrs, ROOT_INODE};

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
    /// `/dev/fuse` threads, io_uring queues, or whichever the kernel allows.
    pub transport: TransportChoice,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: DEFAULT_THREADS,
            allow_discards: false,
            transport: TransportChoice::Auto,
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
    /// How requests reach the server.
    fn transport(&self) -> Transport;
    /// Whether fusermount3 mounted it (a non-root user's mount).
    fn via_fusermount(&self) -> bool;
    /// Drop the kernel's cached attributes and pages of the root (the served file changed
    /// size: a resize).
    fn invalidate(&self) {}
    /// Unmount and wait (up to `wait`) for the serving threads; whether it had to be lazy.
    fn unmount(&mut self, wait: Duration) -> io::Result<bool>;
}

/// Mount a FUSE filesystem whose root is a regular file holding `device` over `mountpoint`
/// (an existing regular file), start the serving threads (or ring queues, as `opts.transport`
/// and the kernel allow) and wait until the kernel's INIT has been answered. Unmounts (lazily) when dropped.
pub fn mount_device(
    mountpoint: &Path,
    device: Arc<dyn BlockDevice>,
    opts: FuseOptions,
) -> io::Result<Box<dyn Mounted>> {
    mount_device_shared(mountpoint, Arc::new(ByteDevice::new(device)), opts)
}

/// [`mount_device`] of a device other exporters serve too (the NBD server), through the byte
/// access they share.
pub(crate) fn mount_device_shared(
    mountpoint: &Path,
    bytes: Arc<ByteDevice>,
    opts: FuseOptions,
) -> io::Result<Box<dyn Mounted>> {
    let (master, via_fusermount) = mount::mount(mountpoint, mount::Root::File)?;
    let fs = FileFs::new(bytes, opts.allow_discards);
    let session = Session::start(
        mountpoint,
        master,
        via_fusermount,
        fs,
        opts.threads,
        opts.transport,
    )?;
    Ok(Box::new(session))
}
