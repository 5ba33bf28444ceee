//! Transmission requests: the 28-byte header, and the checks that turn it into a command the
//! server may run, or a refusal that keeps the connection usable. No length or offset from the
//! client is trusted: a payload is never longer than [`ExportInfo::max_payload`], a range
//! never reaches past the export, and a refused WRITE still has its payload consumed so the
//! next request is read from the right place.

use super::export::ExportInfo;
use super::proto::*;
use crate::codec::{self, Reader};

/// A request header as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Command flags (`NBD_CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`NBD_CMD_*`).
    pub kind: u16,
    /// The client's cookie, echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes (of the payload, for WRITE).
    pub len: u32,
}

impl Header {
    /// Parse a header; `None` when the magic is wrong, after which the stream cannot be
    /// trusted to be at a request boundary (the connection is closed).
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Option<Header> {
        let mut r = Reader::new(b);
        if r.u32_be("magic").ok()? != REQUEST_MAGIC {
            return None;
        }
        Self::fields(&mut r).ok()
    }

    /// The fields after the magic, in wire order.
    fn fields(r: &mut Reader<'_>) -> Result<Header, codec::Error> {
        Ok(Header {
            flags: r.u16_be("flags")?,
            kind: r.u16_be("type")?,
            cookie: r.u64_be("cookie")?,
            offset: r.u64_be("offset")?,
            len: r.u32_be("length")?,
        })
    }

    /// The payload bytes that follow this header on the wire.
    pub fn payload(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.len
        } else {
            0
        }
    }
}

/// A checked command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes at `offset`.
    Read {
        /// Offset.
        offset: u64,
        /// Length (at most the maximum payload).
        len: u32,
    },
    /// Write the `len`-byte payload at `offset`.
    Write {
        /// Offset.
        offset: u64,
        /// Length of the payload that follows (at most the maximum payload).
        len: u32,
        /// Durable before the reply.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Discard a range.
    Trim {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// Durable before the reply.
        fua: bool,
    },
    /// Make a range read back as zeros.
    WriteZeroes {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// Durable before the reply.
        fua: bool,
        /// Fail with `ENOTSUP` rather than write zeros.
        fast: bool,
    },
    /// The client is leaving.
    Disconnect,
}

/// A request the server will not run: the error to reply with, a message for the client,
/// and the payload bytes to consume before the next request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// NBD error number.
    pub error: u32,
    /// Why, for the client (structured replies carry it).
    pub message: String,
    /// Bytes of payload still on the wire.
    pub skip: u32,
}

/// Check `h` against the export: the command, its flags, its length and its range. With
/// structured replies an over-long payload is `EOVERFLOW`, as the protocol prefers, else
/// `EINVAL`.
pub fn check(h: &Header, e: &ExportInfo, structured: bool) -> Result<Command, Refusal> {
    let refuse = |error: u32, message: String| Refusal {
        error,
        message,
        skip: h.payload(),
    };
    let allowed = match h.kind {
        CMD_WRITE_ZEROES if e.has(FLAG_SEND_FAST_ZERO) => {
            CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
        }
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => CMD_FLAG_FUA,
    };
    if h.flags & !allowed != 0 {
        return Err(refuse(
            EINVAL,
            format!("flags {:#x} are not valid for command {}", h.flags, h.kind),
        ));
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    let writes = matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && e.has(FLAG_READ_ONLY) {
        return Err(refuse(EPERM, "the export is read-only".into()));
    }
    let advertised = match h.kind {
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_DISC => true,
        CMD_TRIM => e.has(FLAG_SEND_TRIM),
        CMD_WRITE_ZEROES => e.has(FLAG_SEND_WRITE_ZEROES),
        _ => false,
    };
    if !advertised {
        return Err(refuse(
            EINVAL,
            format!("command {} is not supported by this export", h.kind),
        ));
    }
    match h.kind {
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH if h.offset != 0 || h.len != 0 => {
            return Err(refuse(EINVAL, "a flush has no offset or length".into()))
        }
        CMD_FLUSH => return Ok(Command::Flush),
        _ => {}
    }
    if h.len == 0 {
        return Err(refuse(EINVAL, "a request of 0 bytes".into()));
    }
    if matches!(h.kind, CMD_READ | CMD_WRITE) && h.len > e.max_payload {
        return Err(refuse(
            if structured { EOVERFLOW } else { EINVAL },
            format!(
                "a request of {} bytes (the maximum is {})",
                h.len, e.max_payload
            ),
        ));
    }
    match h.offset.checked_add(u64::from(h.len)) {
        Some(end) if end <= e.size => {}
        _ => {
            return Err(refuse(
                EINVAL,
                format!(
                    "{} bytes at offset {} reach past the end of the export ({} bytes)",
                    h.len, h.offset, e.size
                ),
            ))
        }
    }
    let (offset, len) = (h.offset, h.len);
    Ok(match h.kind {
        CMD_READ => Command::Read { offset, len },
        CMD_WRITE => Command::Write { offset, len, fua },
        CMD_TRIM => Command::Trim { offset, len, fua },
        _ => Command::WriteZeroes {
            offset,
            len,
            fua,
            fast: h.flags & CMD_FLAG_FAST_ZERO != 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::nbd::export::MAX_PAYLOAD;

    fn header(kind: u16, flags: u16, offset: u64, len: u32) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&flags.to_be_bytes());
        b[6..8].copy_from_slice(&kind.to_be_bytes());
        b[8..16].copy_from_slice(&0xabcdu64.to_be_bytes());
        b[16..24].copy_from_slice(&offset.to_be_bytes());
        b[24..28].copy_from_slice(&len.to_be_bytes());
        b
    }

    fn chk(
        e: &ExportInfo,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
    ) -> Result<Command, Refusal> {
        let h = Header::parse(&header(kind, flags, offset, len)).unwrap();
        assert_eq!(h.cookie, 0xabcd);
        check(&h, e, true)
    }

    #[test]
    fn ranges_lengths_and_flags_are_checked() {
        let e = ExportInfo::new("d", "", 1 << 20, 512, false, false);
        assert_eq!(
            chk(&e, CMD_READ, 0, 4096, 4096),
            Ok(Command::Read {
                offset: 4096,
                len: 4096
            })
        );
        assert_eq!(
            chk(&e, CMD_WRITE, CMD_FLAG_FUA, 0, 512),
            Ok(Command::Write {
                offset: 0,
                len: 512,
                fua: true
            })
        );
        let r = chk(&e, CMD_WRITE, 0, (1 << 20) - 511, 512).unwrap_err();
        assert_eq!((r.error, r.skip), (EINVAL, 512));
        let r = chk(&e, CMD_READ, 0, u64::MAX, 2).unwrap_err();
        assert_eq!((r.error, r.skip), (EINVAL, 0));
        let r = chk(&e, CMD_WRITE, 0, 0, MAX_PAYLOAD + 1).unwrap_err();
        assert_eq!((r.error, r.skip), (EOVERFLOW, MAX_PAYLOAD + 1));
        assert_eq!(chk(&e, CMD_READ, 0, 0, 0).unwrap_err().error, EINVAL);
        assert_eq!(chk(&e, CMD_READ, 1 << 7, 0, 1).unwrap_err().error, EINVAL);
        assert_eq!(chk(&e, CMD_FLUSH, 0, 0, 0), Ok(Command::Flush));
        assert_eq!(chk(&e, CMD_FLUSH, 0, 1, 0).unwrap_err().error, EINVAL);
        assert_eq!(chk(&e, CMD_DISC, 0, 0, 0), Ok(Command::Disconnect));
        // TRIM is not advertised without discards; unknown commands are refused.
        assert_eq!(chk(&e, CMD_TRIM, 0, 0, 512).unwrap_err().error, EINVAL);
        assert_eq!(chk(&e, 5, 0, 0, 512).unwrap_err().error, EINVAL);
        assert_eq!(chk(&e, 0xffff, 0, 0, 512).unwrap_err().skip, 0);
        assert_eq!(
            chk(
                &e,
                CMD_WRITE_ZEROES,
                CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE,
                0,
                8192
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                len: 8192,
                fua: false,
                fast: true
            })
        );
        assert_eq!(
            chk(&e, CMD_READ, CMD_FLAG_NO_HOLE, 0, 1).unwrap_err().error,
            EINVAL
        );
        // Read-only: every write is EPERM, its payload still consumed.
        let ro = ExportInfo::new("d", "", 1 << 20, 512, true, false);
        let r = chk(&ro, CMD_WRITE, 0, 0, 4096).unwrap_err();
        assert_eq!((r.error, r.skip), (EPERM, 4096));
        assert_eq!(
            chk(&ro, CMD_WRITE_ZEROES, 0, 0, 4096).unwrap_err().error,
            EPERM
        );
        let mut bad = header(CMD_READ, 0, 0, 1);
        bad[0] ^= 1;
        assert_eq!(Header::parse(&bad), None);
    }
}
