//! The NBD protocol's numbers (doc/proto.md of the NetworkBlockDevice project) and the
//! encoding of the messages the server sends. Everything on the wire is big-endian.

use crate::codec::{self, Reader, SliceWriter};

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: after NBDMAGIC in newstyle negotiation, and before every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// The magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: fixed newstyle negotiation.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the 124 zero bytes after `NBD_OPT_EXPORT_NAME` may be left out.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: writes are refused.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is understood.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is understood.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: `NBD_CMD_TRIM` is understood.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` is understood.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: several connections to the export see each other's flushes.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` is understood.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option: enter transmission (the old way, no error possible).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: end the negotiation.
pub const OPT_ABORT: u32 = 2;
/// Option: list the exports.
pub const OPT_LIST: u32 = 3;
/// Option: upgrade the connection to TLS.
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// Option: use structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply: done.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a list.
pub const REP_SERVER: u32 = 2;
/// Option reply: one piece of information about an export.
pub const REP_INFO: u32 = 3;
/// Option error: unknown option.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option error: refused by policy.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// Option error: malformed.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// Option error: TLS first.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option error: no such export.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// Option error: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
/// Option error: too large.
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Information type: size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Information type: the export's name.
pub const INFO_NAME: u16 = 1;
/// Information type: a description for humans.
pub const INFO_DESCRIPTION: u16 = 2;
/// Information type: block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command: read.
pub const CMD_READ: u16 = 0;
/// Command: write.
pub const CMD_WRITE: u16 = 1;
/// Command: disconnect.
pub const CMD_DISC: u16 = 2;
/// Command: make completed writes durable.
pub const CMD_FLUSH: u16 = 3;
/// Command: discard.
pub const CMD_TRIM: u16 = 4;
/// Command: make a range read back as zeros.
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Command flag: durable before the reply.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag (WRITE_ZEROES): keep the allocation.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag (WRITE_ZEROES): fail rather than be slow.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: the last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured chunk: no payload (success of a command without data).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Structured chunk: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured chunk: an error with a message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// NBD error: operation not permitted (writes to a read-only export).
pub const EPERM: u32 = 1;
/// NBD error: input/output error (a corrupt block).
pub const EIO: u32 = 5;
/// NBD error: out of memory.
pub const ENOMEM: u32 = 12;
/// NBD error: invalid argument (out of range, bad flags, unknown command).
pub const EINVAL: u32 = 22;
/// NBD error: no space left.
pub const ENOSPC: u32 = 28;
/// NBD error: a request longer than the maximum block size.
pub const EOVERFLOW: u32 = 75;
/// NBD error: not supported (a fast zero that would be slow).
pub const ENOTSUP: u32 = 95;
/// NBD error: the server is shutting down.
pub const ESHUTDOWN: u32 = 108;

/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const STRUCTURED_HEADER_LEN: usize = 20;

/// The NBD error for a system errno: the protocol has its own short list, everything else
/// is `EIO`.
pub fn nbd_errno(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EROFS => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::EOPNOTSUPP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// An option reply header (20 bytes) for a reply of `len` payload bytes.
pub fn option_reply(option: u32, reply: u32, len: u32) -> [u8; 20] {
    fixed(|w| {
        w.u64_be(REPLY_MAGIC)?
            .u32_be(option)?
            .u32_be(reply)?
            .u32_be(len)?;
        Ok(())
    })
}

/// A fixed-size header written field by field; the sizes are constants, so every field fits.
fn fixed<const N: usize>(
    put: impl FnOnce(&mut SliceWriter<'_>) -> Result<(), codec::Error>,
) -> [u8; N] {
    let mut h = [0u8; N];
    let mut w = SliceWriter::new(&mut h);
    put(&mut w).expect("a reply header's fields fit its fixed size");
    debug_assert_eq!(w.left(), 0);
    h
}

/// A simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    fixed(|w| {
        w.u32_be(SIMPLE_REPLY_MAGIC)?
            .u32_be(error)?
            .u64_be(cookie)?;
        Ok(())
    })
}

/// A structured reply chunk header for `len` payload bytes.
pub fn structured_header(
    flags: u16,
    kind: u16,
    cookie: u64,
    len: u32,
) -> [u8; STRUCTURED_HEADER_LEN] {
    fixed(|w| {
        w.u32_be(STRUCTURED_REPLY_MAGIC)?
            .u16_be(flags)?
            .u16_be(kind)?
            .u64_be(cookie)?
            .u32_be(len)?;
        Ok(())
    })
}

/// Big-endian u16 at `at` of `b`, for tests and fuzz targets that look into what the server
/// sent (the server itself reads through [`crate::codec::Reader`]). Panics when `b` is short.
pub fn be16(b: &[u8], at: usize) -> u16 {
    peek(b, at, |r| r.u16_be("u16"))
}

/// Big-endian u32 at `at` (as [`be16`]).
pub fn be32(b: &[u8], at: usize) -> u32 {
    peek(b, at, |r| r.u32_be("u32"))
}

/// Big-endian u64 at `at` (as [`be16`]).
pub fn be64(b: &[u8], at: usize) -> u64 {
    peek(b, at, |r| r.u64_be("u64"))
}

fn peek<T>(b: &[u8], at: usize, f: impl FnOnce(&mut Reader<'_>) -> Result<T, codec::Error>) -> T {
    match Reader::at(b, at, "field").and_then(|mut r| f(&mut r)) {
        Ok(v) => v,
        Err(e) => panic!("{e} at byte {at}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_big_endian() {
        let h = option_reply(OPT_GO, REP_ERR_UNSUP, 7);
        assert_eq!(be64(&h, 0), REPLY_MAGIC);
        assert_eq!(&h[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
        assert_eq!(be32(&h, 8), 7);
        assert_eq!(be32(&h, 12), 0x8000_0001);
        assert_eq!(be32(&h, 16), 7);
        let s = structured_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 0x1122, 9);
        assert_eq!(&s[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(be16(&s, 4), 1);
        assert_eq!(be16(&s, 6), 0x8001);
        assert_eq!(be64(&s, 8), 0x1122);
        let r = simple_reply(EIO, 5);
        assert_eq!(&r[0..8], &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5]);
        assert_eq!(nbd_errno(libc::EROFS), EPERM);
        assert_eq!(nbd_errno(libc::EBADMSG), EIO);
    }
}
