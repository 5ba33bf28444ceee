//! One bounds-checked reader and writer for every binary format dmkit parses or writes (the
//! dm-integrity superblock and journal, LUKS1 and LUKS2 binary headers, the NBD handshake,
//! FUSE requests and replies, ext4 inode times), after rustls' `codec`.
//!
//! A [`Reader`] walks a `&[u8]`: every read names the field it reads, and a read past the end
//! is an [`Error::Truncated`] naming it, never a panic. Integers come in little (`_le`), big
//! (`_be`) and native (`_ne`, the FUSE kernel ABI) byte order. A [`Writer`] appends to a
//! `Vec<u8>` (it cannot run out of room); a [`SliceWriter`] writes into a fixed `&mut [u8]` at
//! a cursor that can be moved to a field's offset, and refuses a write past the end with
//! [`Error::NoRoom`].
//!
//! ```
//! use dmkit::codec::{Reader, Writer};
//! let mut w = Writer::new();
//! w.u16_be(2).u32_le(7).bytes(b"ab");
//! let bytes = w.into_inner();
//! let mut r = Reader::new(&bytes);
//! assert_eq!(r.u16_be("version").unwrap(), 2);
//! assert_eq!(r.u32_le("count").unwrap(), 7);
//! assert_eq!(r.rest(), b"ab");
//! assert!(r.u8("more").is_err());
//! ```

/// Calls `$cb! { $pre ... }` with every integer field kind: its method name, type, and the
/// conversions from and to bytes, so the reader and both writers list them once.
macro_rules! int_kinds {
    ($cb:ident { $($pre:tt)* }) => {
        $cb! { $($pre)*
            /// A little-endian `u16`.
            u16_le: u16 = from_le_bytes, to_le_bytes;
            /// A big-endian `u16`.
            u16_be: u16 = from_be_bytes, to_be_bytes;
            /// A native-endian `u16`.
            u16_ne: u16 = from_ne_bytes, to_ne_bytes;
            /// A little-endian `u32`.
            u32_le: u32 = from_le_bytes, to_le_bytes;
            /// A big-endian `u32`.
            u32_be: u32 = from_be_bytes, to_be_bytes;
            /// A native-endian `u32`.
            u32_ne: u32 = from_ne_bytes, to_ne_bytes;
            /// A little-endian `u64`.
            u64_le: u64 = from_le_bytes, to_le_bytes;
            /// A big-endian `u64`.
            u64_be: u64 = from_be_bytes, to_be_bytes;
            /// A native-endian `u64`.
            u64_ne: u64 = from_ne_bytes, to_ne_bytes;
        }
    };
}

mod reader;
mod writer;

#[cfg(test)]
mod tests;

pub use reader::Reader;
pub use writer::{SliceWriter, Writer};

/// Why a read or a write did not fit its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A read of `what` needed `need` bytes where `have` were left.
    #[error("{what}: truncated (need {need} bytes, have {have})")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the read needed.
        need: usize,
        /// Bytes left in the buffer.
        have: usize,
    },
    /// A write of `what` needed `need` bytes where `have` were left.
    #[error("{what}: no room (need {need} bytes, have {have})")]
    NoRoom {
        /// The field being written.
        what: &'static str,
        /// Bytes the write needed.
        need: usize,
        /// Bytes left in the buffer.
        have: usize,
    },
}

/// Which way a buffer is being walked, for the error a bounds check gives.
#[derive(Debug, Clone, Copy)]
enum Side {
    Read,
    Write,
}

impl Side {
    /// Whether `need` bytes fit in the `have` left; if not, the error naming `what`.
    fn check(self, what: &'static str, need: usize, have: usize) -> Result<(), Error> {
        if need <= have {
            return Ok(());
        }
        Err(match self {
            Side::Read => Error::Truncated { what, need, have },
            Side::Write => Error::NoRoom { what, need, have },
        })
    }
}

impl Error {
    /// The field the failed read or write was about.
    pub fn what(&self) -> &'static str {
        match *self {
            Error::Truncated { what, .. } | Error::NoRoom { what, .. } => what,
        }
    }
}
