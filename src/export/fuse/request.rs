//! FUSE requests decoded in one place: the in-header ([`InHeader`]) and the opcode's fixed
//! arguments into a typed [`Request`], through the bounds-checked [`crate::codec`] reader
//! (native byte order, as the kernel writes them). The session dispatches on the variant; no
//! handler slices request bytes.
//!
//! A request whose arguments are shorter than its opcode needs decodes to
//! [`Request::Malformed`] (the filesystem answers `EINVAL`, or what it answers that opcode
//! whatever its arguments); nothing a request holds can make the decoder panic.

use super::proto::*;
use crate::codec::{self, Reader};

/// `fuse_in_header`: what every request starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Bytes of the whole request (header, arguments, payload).
    pub len: u32,
    /// The opcode (`FUSE_*`).
    pub opcode: u32,
    /// The request's id, echoed in the answer.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
    /// Caller's user id.
    pub uid: u32,
    /// Caller's group id.
    pub gid: u32,
    /// Caller's process id.
    pub pid: u32,
}

impl InHeader {
    /// Decode the first 40 bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<InHeader, codec::Error> {
        let mut r = Reader::new(b);
        let h = InHeader {
            len: r.u32_ne("len")?,
            opcode: r.u32_ne("opcode")?,
            unique: r.u64_ne("unique")?,
            nodeid: r.u64_ne("nodeid")?,
            uid: r.u32_ne("uid")?,
            gid: r.u32_ne("gid")?,
            pid: r.u32_ne("pid")?,
        };
        r.skip(4, "total_extlen and padding")?;
        Ok(h)
    }
}

/// `fuse_init_in`: the kernel's protocol version and what it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    /// Protocol major version.
    pub major: u32,
    /// Protocol minor version.
    pub minor: u32,
    /// Largest read-ahead the kernel will do.
    pub max_readahead: u32,
    /// `FUSE_*` capability flags.
    pub flags: u32,
    /// The second word of flags (0 without `FUSE_INIT_EXT`).
    pub flags2: u32,
}

/// One request, by opcode, with the arguments the server uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `FUSE_LOOKUP`: the name (up to its NUL) in the directory `nodeid`.
    Lookup {
        /// The name.
        name: &'a [u8],
    },
    /// `FUSE_FORGET` (no answer).
    Forget,
    /// `FUSE_BATCH_FORGET` (no answer).
    BatchForget,
    /// `FUSE_INTERRUPT` (no answer).
    Interrupt,
    /// `FUSE_NOTIFY_REPLY` (no answer).
    NotifyReply,
    /// `FUSE_GETATTR`.
    Getattr,
    /// `FUSE_SETATTR`: which attributes (`FATTR_*`) and the new size.
    Setattr {
        /// `FATTR_*` bits of the attributes to set.
        valid: u32,
        /// The size asked for (with `FATTR_SIZE`).
        size: u64,
    },
    /// `FUSE_READLINK`.
    Readlink,
    /// `FUSE_OPEN` with the `open(2)` flags (0 when the kernel sent none).
    Open {
        /// `O_*` flags.
        flags: u32,
    },
    /// `FUSE_READ`.
    Read {
        /// File handle from OPEN.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes asked for.
        size: u32,
    },
    /// `FUSE_WRITE` with its payload (the size the arguments announce, checked).
    Write {
        /// File handle from OPEN.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// `FUSE_STATFS`.
    Statfs,
    /// `FUSE_RELEASE`, with the handle when the kernel sent one.
    Release {
        /// File handle from OPEN.
        fh: Option<u64>,
    },
    /// `FUSE_FSYNC`.
    Fsync,
    /// `FUSE_GETXATTR`: the attribute's full name, and the caller's buffer size (0: the
    /// value's size is asked).
    Getxattr {
        /// The name (up to its NUL).
        name: &'a [u8],
        /// The buffer size.
        size: u32,
    },
    /// `FUSE_LISTXATTR`, with the caller's buffer size (0: the list's size is asked).
    Listxattr {
        /// The buffer size.
        size: u32,
    },
    /// `FUSE_FLUSH`.
    Flush,
    /// `FUSE_INIT`: the kernel's protocol version and what it offers.
    Init(InitIn),
    /// `FUSE_OPENDIR`.
    Opendir,
    /// `FUSE_READDIR` or `FUSE_READDIRPLUS`.
    Readdir {
        /// Whether it is READDIRPLUS (entries with attributes).
        plus: bool,
        /// Position to continue from.
        offset: u64,
        /// Bytes the answer may take.
        size: u32,
    },
    /// `FUSE_RELEASEDIR`.
    Releasedir,
    /// `FUSE_FSYNCDIR`.
    Fsyncdir,
    /// `FUSE_ACCESS`.
    Access,
    /// `FUSE_DESTROY`.
    Destroy,
    /// `FUSE_FALLOCATE`.
    Fallocate {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        length: u64,
        /// `FALLOC_FL_*` mode.
        mode: u32,
    },
    /// `FUSE_LSEEK`.
    Lseek {
        /// Byte offset.
        offset: u64,
        /// `SEEK_DATA` or `SEEK_HOLE` (or anything else, refused).
        whence: u32,
    },
    /// An opcode whose arguments are shorter than it needs (or a WRITE whose payload is not
    /// the size it announces).
    Malformed {
        /// The opcode.
        opcode: u32,
        /// What was missing.
        error: codec::Error,
    },
    /// An opcode this server does not know.
    Unknown {
        /// The opcode.
        opcode: u32,
    },
}

impl<'a> Request<'a> {
    /// Decode opcode `opcode`'s fixed arguments `args` (for WRITE, `fuse_write_in`) and
    /// `payload` (a WRITE's data; empty otherwise).
    pub fn decode(opcode: u32, args: &'a [u8], payload: &'a [u8]) -> Request<'a> {
        Self::fields(opcode, args, payload)
            .unwrap_or_else(|error| Request::Malformed { opcode, error })
    }

    /// Decode a whole request as the kernel writes it: in-header, arguments, payload.
    pub fn decode_message(b: &'a [u8]) -> Result<(InHeader, Request<'a>), codec::Error> {
        let h = InHeader::decode(b)?;
        let mut r = Reader::at(b, IN_HEADER, "arguments")?;
        let req = if h.opcode == FUSE_WRITE {
            match r.take(WRITE_IN, "fuse_write_in") {
                Ok(args) => Request::decode(h.opcode, args, r.rest()),
                Err(error) => Request::Malformed {
                    opcode: h.opcode,
                    error,
                },
            }
        } else {
            Request::decode(h.opcode, r.rest(), &[])
        };
        Ok((h, req))
    }

    fn fields(opcode: u32, args: &'a [u8], payload: &'a [u8]) -> Result<Self, codec::Error> {
        let mut r = Reader::new(args);
        Ok(match opcode {
            FUSE_LOOKUP => Request::Lookup {
                name: args.split(|&b| b == 0).next().unwrap_or_default(),
            },
            FUSE_FORGET => Request::Forget,
            FUSE_BATCH_FORGET => Request::BatchForget,
            FUSE_INTERRUPT => Request::Interrupt,
            FUSE_NOTIFY_REPLY => Request::NotifyReply,
            FUSE_GETATTR => Request::Getattr,
            FUSE_SETATTR => {
                // fuse_setattr_in: valid, padding, fh, size, ...
                let valid = r.u32_ne("valid")?;
                r.skip(12, "padding and fh")?;
                Request::Setattr {
                    valid,
                    size: r.u64_ne("size")?,
                }
            }
            FUSE_READLINK => Request::Readlink,
            FUSE_OPEN => Request::Open {
                flags: r.u32_ne("flags").unwrap_or(0),
            },
            FUSE_READ => {
                let (fh, offset, size) = (r.u64_ne("fh")?, r.u64_ne("offset")?, r.u32_ne("size")?);
                r.skip(4, "read_flags")?;
                Request::Read { fh, offset, size }
            }
            FUSE_WRITE => {
                let (fh, offset, size) = (r.u64_ne("fh")?, r.u64_ne("offset")?, r.u32_ne("size")?);
                r.skip(WRITE_IN - 20, "write_flags, lock_owner, flags")?;
                if size as usize != payload.len() {
                    return Err(codec::Error::Truncated {
                        what: "payload",
                        need: size as usize,
                        have: payload.len(),
                    });
                }
                Request::Write {
                    fh,
                    offset,
                    data: payload,
                }
            }
            FUSE_STATFS => Request::Statfs,
            FUSE_RELEASE => Request::Release {
                fh: r.u64_ne("fh").ok(),
            },
            FUSE_FSYNC => Request::Fsync,
            FUSE_GETXATTR => {
                // fuse_getxattr_in: size, padding; then the name.
                let size = r.u32_ne("size")?;
                r.skip(4, "padding")?;
                Request::Getxattr {
                    name: r.rest().split(|&b| b == 0).next().unwrap_or_default(),
                    size,
                }
            }
            FUSE_LISTXATTR => Request::Listxattr {
                size: r.u32_ne("size")?,
            },
            FUSE_FLUSH => Request::Flush,
            FUSE_INIT => {
                let (major, minor) = (r.u32_ne("major")?, r.u32_ne("minor")?);
                let max_readahead = r.u32_ne("max_readahead")?;
                let flags = r.u32_ne("flags")?;
                let flags2 = if flags & FUSE_INIT_EXT != 0 {
                    r.u32_ne("flags2").unwrap_or(0)
                } else {
                    0
                };
                Request::Init(InitIn {
                    major,
                    minor,
                    max_readahead,
                    flags,
                    flags2,
                })
            }
            FUSE_OPENDIR => Request::Opendir,
            FUSE_READDIR | FUSE_READDIRPLUS => {
                r.skip(8, "fh")?;
                Request::Readdir {
                    plus: opcode == FUSE_READDIRPLUS,
                    offset: r.u64_ne("offset")?,
                    size: r.u32_ne("size")?,
                }
            }
            FUSE_RELEASEDIR => Request::Releasedir,
            FUSE_FSYNCDIR => Request::Fsyncdir,
            FUSE_ACCESS => Request::Access,
            FUSE_DESTROY => Request::Destroy,
            FUSE_FALLOCATE => {
                r.skip(8, "fh")?;
                Request::Fallocate {
                    offset: r.u64_ne("offset")?,
                    length: r.u64_ne("length")?,
                    mode: r.u32_ne("mode")?,
                }
            }
            FUSE_LSEEK => {
                r.skip(8, "fh")?;
                Request::Lseek {
                    offset: r.u64_ne("offset")?,
                    whence: r.u32_ne("whence")?,
                }
            }
            opcode => Request::Unknown { opcode },
        })
    }

    /// Whether the kernel expects no answer to this request.
    pub fn expects_no_answer(&self) -> bool {
        matches!(
            self,
            Request::Forget | Request::BatchForget | Request::Interrupt | Request::NotifyReply
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(opcode: u32, args: &[u8]) -> Vec<u8> {
        let mut w = codec::Writer::new();
        w.u32_ne((IN_HEADER + args.len()) as u32)
            .u32_ne(opcode)
            .u64_ne(7)
            .u64_ne(1)
            .u32_ne(0)
            .u32_ne(0)
            .u32_ne(42)
            .zeros(4)
            .bytes(args);
        w.into_inner()
    }

    #[test]
    fn read_write_and_init_decode() {
        let mut a = codec::Writer::new();
        a.u64_ne(3).u64_ne(4096).u32_ne(512).u32_ne(0);
        let m = msg(FUSE_READ, a.as_slice());
        let (h, r) = Request::decode_message(&m).unwrap();
        assert_eq!((h.unique, h.nodeid, h.pid), (7, 1, 42));
        assert_eq!(
            r,
            Request::Read {
                fh: 3,
                offset: 4096,
                size: 512
            }
        );
        let mut a = codec::Writer::new();
        a.u64_ne(0).u64_ne(8).u32_ne(3).zeros(20).bytes(b"abc");
        let m = msg(FUSE_WRITE, a.as_slice());
        let (_, r) = Request::decode_message(&m).unwrap();
        assert_eq!(
            r,
            Request::Write {
                fh: 0,
                offset: 8,
                data: b"abc"
            }
        );
        let mut a = codec::Writer::new();
        a.u32_ne(7)
            .u32_ne(38)
            .u32_ne(1 << 17)
            .u32_ne(FUSE_INIT_EXT)
            .u32_ne(9);
        let m = msg(FUSE_INIT, a.as_slice());
        let (_, r) = Request::decode_message(&m).unwrap();
        let Request::Init(init) = r else {
            panic!("not INIT: {r:?}");
        };
        assert_eq!((init.major, init.minor), (7, 38));
        assert_eq!(
            (init.max_readahead, init.flags, init.flags2),
            (1 << 17, FUSE_INIT_EXT, 9)
        );
        let m = msg(FUSE_LOOKUP, b"name\0junk");
        let (_, r) = Request::decode_message(&m).unwrap();
        assert_eq!(r, Request::Lookup { name: b"name" });
    }

    #[test]
    fn short_arguments_are_malformed_never_a_panic() {
        for opcode in 0..64 {
            for len in 0..48 {
                let args = vec![0xffu8; len];
                let b = msg(opcode, &args);
                let (_, r) = Request::decode_message(&b).unwrap();
                if let Request::Malformed { opcode: o, .. } = r {
                    assert_eq!(o, opcode);
                }
                for cut in 0..IN_HEADER {
                    assert!(Request::decode_message(&b[..cut]).is_err());
                }
            }
        }
        // The lengths the handlers always required: one byte less is malformed.
        for (opcode, need) in [
            (FUSE_READ, 24),
            (FUSE_SETATTR, 24),
            (FUSE_FALLOCATE, 28),
            (FUSE_LSEEK, 20),
            (FUSE_READDIR, 20),
            (FUSE_INIT, 16),
        ] {
            let short = Request::decode(opcode, &[0; 64][..need - 1], &[]);
            assert!(matches!(short, Request::Malformed { .. }), "{opcode}");
            let whole = Request::decode(opcode, &[0; 64][..need], &[]);
            assert!(!matches!(whole, Request::Malformed { .. }), "{opcode}");
        }
        assert_eq!(
            Request::decode(FUSE_OPEN, &[], &[]),
            Request::Open { flags: 0 }
        );
        assert_eq!(
            Request::decode(FUSE_RELEASE, &[0; 7], &[]),
            Request::Release { fh: None }
        );
        // A WRITE whose payload is not the size it announces.
        let mut a = codec::Writer::new();
        a.u64_ne(0).u64_ne(0).u32_ne(4).zeros(20);
        assert!(matches!(
            Request::decode(FUSE_WRITE, a.as_slice(), b"abc"),
            Request::Malformed { .. }
        ));
    }
}
