//! Block devices: the one trait every layer implements and consumes, and the backends at the
//! bottom of a stack (a file, memory, and a fault-injecting device for tests).
//!
//! Like a device-mapper target, each layer owns the device below it and is itself a
//! [`BlockDevice`]. Methods take `&self` and the trait is `Send + Sync`, so an exporter can
//! serve many requests at once and each layer does its work inline on the serving thread.

pub mod activated;
pub mod aligned;
mod claim;
mod faulty;
mod file;
pub mod helpers;
pub mod linear;
mod memory;
pub mod online;
pub mod open;
pub mod side_by_side;
pub mod signature;
pub mod stream_copy;
mod window;

pub use activated::{Activated, StatsFn};
pub use claim::{range_text, Claim, ClaimError, ClaimInfo};
pub use faulty::{
    for_each_crash_state, Fault, FaultKind, FaultyDevice, LoggedOp, OpKind, MAX_PENDING_WRITES,
};
pub use file::{FileDevice, OpenOptions};
pub use memory::MemoryDevice;
pub use open::{open_backing, open_device, BackingFailure, OpenError, VolumeFailure};
pub use window::Window;

use std::io;

/// Errors a block device reports. `Corrupt` is distinct so exporters can surface it as `EIO`
/// and count it, exactly as the kernel does for a dm-verity or dm-integrity mismatch.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// An I/O error from the layer below.
    #[error("{device}: I/O error at byte {offset}: {source}")]
    Io {
        /// Device name (path or layer name).
        device: String,
        /// Byte offset of the failed request.
        offset: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A request reaches past the end of the device.
    #[error("{device}: request at byte {offset} of {len} bytes is beyond the device size {size}")]
    OutOfRange {
        /// Device name.
        device: String,
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request.
        len: u64,
        /// Size of the device.
        size: u64,
    },
    /// A write or discard on a read-only device.
    #[error("{device}: device is read-only")]
    ReadOnly {
        /// Device name.
        device: String,
    },
    /// The operation is not supported by this device (for example discard).
    #[error("{device}: {op} is not supported")]
    Unsupported {
        /// Device name.
        device: String,
        /// The operation.
        op: &'static str,
    },
    /// Data failed an integrity check (hash or tag mismatch).
    #[error("{device}: {what} block {block} is corrupted")]
    Corrupt {
        /// Device name.
        device: String,
        /// What kind of block ("data", "hash").
        what: &'static str,
        /// Block number, in that kind's block size.
        block: u64,
    },
}

impl BlockError {
    /// The errno an exporter should return to the kernel for this error.
    pub fn errno(&self) -> i32 {
        match self {
            BlockError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            BlockError::OutOfRange { .. } => libc::EINVAL,
            BlockError::ReadOnly { .. } => libc::EROFS,
            BlockError::Unsupported { .. } => libc::EOPNOTSUPP,
            BlockError::Corrupt { .. } => libc::EIO,
        }
    }
}

/// Result type of block device operations.
pub type Result<T> = std::result::Result<T, BlockError>;

/// A block device: a fixed-size array of bytes read and written at byte offsets.
///
/// Offsets and lengths of `read_at`/`write_at` should be multiples of
/// [`logical_block_size`](BlockDevice::logical_block_size); backends at the bottom of the stack
/// accept any alignment, layers may require it.
pub trait BlockDevice: Send + Sync {
    /// A short name for messages (a path, or the layer's name).
    fn name(&self) -> &str;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// The smallest unit of I/O the device accepts.
    fn logical_block_size(&self) -> u32 {
        512
    }
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// Fill `buf` from `offset`. Reads past the end are an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Write `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Make written data durable.
    fn flush(&self) -> Result<()>;
    /// Tell the device a range is no longer needed.
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Err(BlockError::Unsupported {
            device: self.name().to_string(),
            op: "discard",
        })
    }
    /// Whether a successful [`discard`](BlockDevice::discard) leaves the range reading back as
    /// zeros (a hole punched in a file does; a discard under encryption reads back as
    /// whatever the zeros decrypt to). `false`, the default, when unknown: callers that need
    /// zeros then write them.
    fn discard_zeroes(&self) -> bool {
        false
    }
    /// Make `[offset, offset + len)` read back as zeros without transferring them, where the
    /// storage can (the kernel's REQ_OP_WRITE_ZEROES): the allocation stays, unlike a discard.
    /// `Unsupported` when it cannot; the caller then writes zeros itself.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Err(BlockError::Unsupported {
            device: self.name().to_string(),
            op: "write zeroes",
        })
    }
    /// Where `[offset, offset + len)` is stored as it is, untransformed, in a file: the file
    /// and the offset in it. An exporter may then send those bytes with `sendfile(2)`, straight
    /// from the page cache, instead of reading them through the stack (dm-linear's remapping,
    /// seen from above). `None`, the default, for every layer that transforms or checks data.
    fn passthrough(&self, offset: u64, len: u64) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        let _ = (offset, len);
        None
    }
    /// This process has handed the device to another one (the server it forked to serve it,
    /// which got a copy of everything in memory): from now on this copy must never write to
    /// the storage below, not even when it is dropped, or it would overwrite what the server
    /// wrote since (a dm-integrity journal and dirty bitmap flushed on drop by the launcher
    /// after the fork made the device unopenable after a crash of the server). The default
    /// does nothing: a layer that writes only when asked to has nothing to give up. Layers
    /// forward it to the devices they stack on.
    fn hand_over(&self) {}
    /// Whether a read may wait on a network (an object fetched over HTTP): an exporter then
    /// keeps several of a client's requests in flight at once, as their time is spent waiting,
    /// not computing. `false`, the default, for local storage, which an exporter serves inline
    /// (a queue there costs more than it gives). Layers forward it from the devices they read.
    fn blocks_on_network(&self) -> bool {
        false
    }
}

/// A block device that stores a tag beside every block and takes it from the layer above
/// (the kernel's bio integrity payload): dm-integrity without internal hash, under dm-crypt's
/// authenticated modes. The tags of a request are one `tag_size` slice per logical block, in
/// order.
pub trait TaggedBlockDevice: BlockDevice {
    /// Bytes of tag per logical block.
    fn tag_size(&self) -> usize;
    /// Fill `buf` from `offset` and `tags` with the blocks' stored tags (unchecked: checking
    /// is the caller's job).
    fn read_tagged(&self, buf: &mut [u8], tags: &mut [u8], offset: u64) -> Result<()>;
    /// Write `buf` at `offset` with its `tags`; a block and its tag change together.
    fn write_tagged(&self, buf: &[u8], tags: &[u8], offset: u64) -> Result<()>;
    /// Write `len` bytes of whole blocks at `offset` that `fill` produces where the device
    /// keeps them (a journal's memory), so the layer above writes its output once instead of
    /// into a buffer that is then copied. `fill` gets the pieces of the write, possibly in
    /// several calls, and must set every byte of each piece's data and tags; it cannot fail
    /// (callers check what could fail before they write). The default fills a buffer and
    /// hands it to [`write_tagged`](TaggedBlockDevice::write_tagged).
    fn write_tagged_with(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [TaggedPiece<'_>]),
    ) -> Result<()> {
        let bs = self.logical_block_size() as usize;
        let (data, tags) = fill_buffers(offset, len, bs, self.tag_size(), fill);
        self.write_tagged(&data, &tags, offset)
    }
}

/// A [`TaggedBlockDevice::write_tagged_with`] write filled into buffers of its own (for a
/// device with no memory to lend): `len` bytes of data at `offset` and the tags of their
/// `block_size`-byte blocks.
pub fn fill_buffers(
    offset: u64,
    len: usize,
    block_size: usize,
    tag_size: usize,
    fill: &mut dyn FnMut(&mut [TaggedPiece<'_>]),
) -> (Vec<u8>, Vec<u8>) {
    let mut data = vec![0u8; len];
    let mut tags = vec![0u8; len / block_size.max(1) * tag_size];
    fill(&mut [TaggedPiece {
        offset,
        data: &mut data,
        tags: &mut tags,
    }]);
    (data, tags)
}

/// Part of a [`TaggedBlockDevice::write_tagged_with`] write: whole blocks starting at byte
/// `offset` of the device, to be filled in place.
pub struct TaggedPiece<'a> {
    /// Byte offset on the device of the piece's first block.
    pub offset: u64,
    /// The blocks' bytes.
    pub data: &'a mut [u8],
    /// Their tags, one tag-size slice per block.
    pub tags: &'a mut [u8],
}

/// Check that `[offset, offset + len)` lies inside a device of `size` bytes.
pub fn check_range(device: &str, offset: u64, len: usize, size: u64) -> Result<()> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BlockError::OutOfRange {
            device: device.to_string(),
            offset,
            len,
            size,
        }),
    }
}

/// A shared or borrowed device is the device: `Arc<dyn BlockDevice>` and `&dyn BlockDevice`
/// stack like the device itself.
macro_rules! forward_block_device {
    ($($ptr:ty),*) => {$(
impl<T: BlockDevice + ?Sized> BlockDevice for $ptr {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn logical_block_size(&self) -> u32 {
        (**self).logical_block_size()
    }
    fn read_only(&self) -> bool {
        (**self).read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        (**self).discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        (**self).write_zeroes(offset, len)
    }
    fn discard_zeroes(&self) -> bool {
        (**self).discard_zeroes()
    }
    fn passthrough(&self, offset: u64, len: u64) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        (**self).passthrough(offset, len)
    }
    fn hand_over(&self) {
        (**self).hand_over()
    }
    fn blocks_on_network(&self) -> bool {
        (**self).blocks_on_network()
    }
}
    )*};
}

forward_block_device!(std::sync::Arc<T>, &T);
