//! The transmission phase of one connection: requests read, checked, run on the device and
//! answered inline, one after the other, on the connection's own thread (devices that wait on
//! a network are served by [`super::inflight`] instead). Replies to reads go
//! out from the buffer the device filled; replies to small requests are batched by the
//! [`Wire`].

use super::export::ExportInfo;
use super::proto::*;
use super::request::{check, Command, Header, Refusal};
use super::wire::{Stream, Wire};
use crate::block::aligned::AlignedBuf;
use crate::block::BlockError;
use crate::codec::Writer;
use crate::export::bytes::ByteDevice;
use serde::Serialize;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one client, or of every client of an export.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct Counters {
    /// Requests received.
    pub requests: AtomicU64,
    /// Bytes returned by READ.
    pub bytes_read: AtomicU64,
    /// Bytes written by WRITE.
    pub bytes_written: AtomicU64,
    /// Requests answered with an error by the device (refused requests are not counted).
    pub io_errors: AtomicU64,
    /// Of those, the requests that failed on a corrupted block.
    pub corruptions: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CounterValues {
    /// Requests received.
    pub requests: u64,
    /// Bytes returned by READ.
    pub bytes_read: u64,
    /// Bytes written by WRITE.
    pub bytes_written: u64,
    /// Requests the device failed.
    pub io_errors: u64,
    /// Of those, corruptions.
    pub corruptions: u64,
}

impl Counters {
    /// The values now.
    pub fn values(&self) -> CounterValues {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CounterValues {
            requests: l(&self.requests),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            io_errors: l(&self.io_errors),
            corruptions: l(&self.corruptions),
        }
    }
}

pub(super) fn add(c: [&AtomicU64; 2], n: u64) {
    for a in c {
        a.fetch_add(n, Ordering::Relaxed);
    }
}

/// How a connection's transmission ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// The client closed the connection between requests.
    HungUp,
}

/// READs at least this long are sent with `sendfile(2)` when the device stores them as they
/// are in a file ([`crate::block::BlockDevice::passthrough`]) and the stream is a plain
/// socket; shorter ones are batched with other replies, which pays more.
pub const SEND_FILE_MIN: u32 = 64 << 10;

/// Buffer memory a connection keeps between requests: one that grew for a larger request (up
/// to [`super::MAX_PAYLOAD`]) gives the rest back after it.
pub(super) const KEEP_BUFFER: usize = 4 << 20;

/// One connection's transmission phase.
pub struct Transmission<'a> {
    export: &'a ExportInfo,
    bytes: &'a ByteDevice,
    structured: bool,
    client: &'a Counters,
    totals: &'a Counters,
    /// Reads land here; read-modify-writes are assembled here.
    io: AlignedBuf,
    /// WRITE payloads land here, page-aligned.
    payload: AlignedBuf,
}

impl<'a> Transmission<'a> {
    /// The transmission phase of a client that negotiated `structured` replies (or not).
    pub(crate) fn new(
        export: &'a ExportInfo,
        bytes: &'a ByteDevice,
        structured: bool,
        client: &'a Counters,
        totals: &'a Counters,
    ) -> Self {
        Transmission {
            export,
            bytes,
            structured,
            client,
            totals,
            io: AlignedBuf::new(1 << 20),
            payload: AlignedBuf::new(0),
        }
    }

    /// Serve requests until the client leaves. An error is an I/O error on the connection or
    /// a request without the request magic: the connection is closed.
    pub fn run<S: Stream>(&mut self, wire: &mut Wire<S>) -> io::Result<Ending> {
        let mut h = [0u8; REQUEST_LEN];
        loop {
            if !wire.read_header(&mut h)? {
                return Ok(Ending::HungUp);
            }
            let Some(req) = Header::parse(&h) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a request without the request magic",
                ));
            };
            add([&self.client.requests, &self.totals.requests], 1);
            match check(&req, self.export, self.structured) {
                Err(Refusal {
                    error,
                    message,
                    skip,
                }) => {
                    wire.skip(u64::from(skip))?;
                    self.reply_error(wire, &req, error, &message)?;
                }
                Ok(Command::Disconnect) => {
                    wire.flush()?;
                    return Ok(Ending::Disconnect);
                }
                Ok(cmd) => self.execute(wire, &req, cmd)?,
            }
            self.io.cap(KEEP_BUFFER);
            self.payload.cap(KEEP_BUFFER);
        }
    }

    fn execute<S: Stream>(
        &mut self,
        wire: &mut Wire<S>,
        req: &Header,
        cmd: Command,
    ) -> io::Result<()> {
        let r = match cmd {
            Command::Read { offset, len } if len >= SEND_FILE_MIN && wire.can_send_file() => {
                if let Some((file, at)) = self.bytes.device().passthrough(offset, u64::from(len)) {
                    add(
                        [&self.client.bytes_read, &self.totals.bytes_read],
                        u64::from(len),
                    );
                    let h = read_header(self.structured, req, offset, len);
                    return wire.send_file(&[&h], file, at, len as usize);
                }
                return self.read(wire, req, offset, len);
            }
            Command::Read { offset, len } => return self.read(wire, req, offset, len),
            Command::Disconnect => return Ok(()),
            Command::Write { len, .. } => {
                let data = self.payload.get(len as usize);
                // A client that hangs up in the middle of a payload leaves nothing written.
                wire.read_exact(data)?;
                apply(
                    self.bytes,
                    cmd,
                    data,
                    &mut self.io,
                    [self.client, self.totals],
                )
            }
            _ => apply(
                self.bytes,
                cmd,
                &[],
                &mut self.io,
                [self.client, self.totals],
            ),
        };
        match r {
            Ok(()) => wire.send(&[&simple_reply(0, req.cookie)]),
            Err(e) => self.fail(wire, req, e),
        }
    }

    /// A READ through the stack: read into the buffer, reply from it.
    fn read<S: Stream>(
        &mut self,
        wire: &mut Wire<S>,
        req: &Header,
        offset: u64,
        len: u32,
    ) -> io::Result<()> {
        match self.bytes.read(offset, len as usize, &mut self.io) {
            Ok(at) => {
                add(
                    [&self.client.bytes_read, &self.totals.bytes_read],
                    u64::from(len),
                );
                let h = read_header(self.structured, req, offset, len);
                let data = &self.io.as_slice()[at..at + len as usize];
                wire.send(&[&h, data])
            }
            Err(e) => self.fail(wire, req, e),
        }
    }

    /// Count, log and answer a device error.
    fn fail<S: Stream>(&self, wire: &mut Wire<S>, req: &Header, e: BlockError) -> io::Result<()> {
        add([&self.client.io_errors, &self.totals.io_errors], 1);
        if self.bytes.report(&e) {
            add([&self.client.corruptions, &self.totals.corruptions], 1);
        }
        self.reply_error(wire, req, nbd_errno(e.errno()), &client_message(&e))
    }

    fn reply_error<S: Stream>(
        &self,
        wire: &mut Wire<S>,
        req: &Header,
        error: u32,
        message: &str,
    ) -> io::Result<()> {
        wire.send(&[&error_reply(self.structured, req, error, message)])
    }
}

/// Run a command that is neither READ nor DISC on `bytes` (`payload`: a WRITE's data), with
/// `io` for read-modify-writes; counts written bytes in `counters`.
pub(super) fn apply(
    bytes: &ByteDevice,
    cmd: Command,
    payload: &[u8],
    io: &mut AlignedBuf,
    counters: [&Counters; 2],
) -> crate::block::Result<()> {
    // FUA: the device's flush, which makes this write durable with every other.
    let durable = |fua: bool| {
        if fua {
            bytes.device().flush()
        } else {
            Ok(())
        }
    };
    match cmd {
        Command::Write { offset, len, fua } => bytes
            .write(payload, offset, io)
            .and_then(|()| durable(fua))
            .inspect(|()| {
                add(
                    [&counters[0].bytes_written, &counters[1].bytes_written],
                    u64::from(len),
                )
            }),
        Command::Flush => bytes.device().flush(),
        Command::Trim { offset, len, fua } => bytes
            .punch(offset, u64::from(len), io)
            .and_then(|()| durable(fua)),
        Command::WriteZeroes {
            offset,
            len,
            fua,
            fast,
        } => bytes
            .write_zeroes(offset, u64::from(len), fast, io)
            .and_then(|()| durable(fua)),
        Command::Read { .. } | Command::Disconnect => Ok(()),
    }
}

/// The whole reply to a request that failed with NBD error `error`: a simple reply, or a
/// structured `ERROR` chunk carrying `message` (cut to 4 KiB).
pub(super) fn error_reply(structured: bool, req: &Header, error: u32, message: &str) -> Vec<u8> {
    if !structured {
        return simple_reply(error, req.cookie).to_vec();
    }
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut w = Writer::with_capacity(STRUCTURED_HEADER_LEN + 6 + msg.len());
    w.bytes(&structured_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        req.cookie,
        (6 + msg.len()) as u32,
    ))
    .u32_be(error)
    .u16_be(msg.len() as u16)
    .bytes(msg);
    w.into_inner()
}

/// The header of a successful READ's reply, before the data: an `OFFSET_DATA` chunk's
/// header and offset, or a simple reply.
pub(super) fn read_header(structured: bool, req: &Header, offset: u64, len: u32) -> Vec<u8> {
    if structured {
        let mut w = Writer::with_capacity(STRUCTURED_HEADER_LEN + 8);
        w.bytes(&structured_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            req.cookie,
            len + 8,
        ))
        .u64_be(offset);
        w.into_inner()
    } else {
        simple_reply(0, req.cookie).to_vec()
    }
}

/// What a client is told about a device error: what failed and where, without the server's
/// paths.
pub(super) fn client_message(e: &BlockError) -> String {
    match e {
        BlockError::Corrupt { what, block, .. } => format!("{what} block {block} is corrupted"),
        BlockError::Io { offset, source, .. } => format!("I/O error at byte {offset}: {source}"),
        BlockError::OutOfRange { offset, len, .. } => {
            format!("{len} bytes at {offset} reach past the end")
        }
        BlockError::ReadOnly { .. } => "the device is read-only".into(),
        BlockError::Unsupported { op, .. } => format!("{op} is not supported"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{BlockDevice, MemoryDevice};
    use crate::export::nbd::export::MAX_PAYLOAD;
    use std::sync::Arc;

    /// Reads touching block 2 (4 KiB blocks) fail as a corrupt verity block would.
    struct CorruptBlock2(MemoryDevice);

    impl BlockDevice for CorruptBlock2 {
        fn name(&self) -> &str {
            "c"
        }
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn read_only(&self) -> bool {
            true
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> crate::block::Result<()> {
            if offset < 3 * 4096 && offset + buf.len() as u64 > 2 * 4096 {
                return Err(BlockError::Corrupt {
                    device: "c".into(),
                    what: "data",
                    block: 2,
                });
            }
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, _: &[u8], _: u64) -> crate::block::Result<()> {
            unreachable!("read-only")
        }
        fn flush(&self) -> crate::block::Result<()> {
            Ok(())
        }
    }

    fn req(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    fn serve(
        dev: Arc<dyn BlockDevice>,
        input: Vec<u8>,
        structured: bool,
    ) -> (io::Result<Ending>, Vec<u8>, CounterValues) {
        let e = ExportInfo::new("d", "", dev.size(), 512, dev.read_only(), false);
        crate::export::nbd::replay::transmission(dev, &e, &input, structured)
    }

    #[test]
    fn writes_read_back_and_bad_requests_keep_the_connection() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("m", 1 << 20));
        let mut input = req(CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 4);
        input.extend_from_slice(b"abcd");
        // Out of range, with its payload: refused, the payload skipped.
        input.extend(req(CMD_WRITE, 0, 2, (1 << 20) - 2, 4));
        input.extend_from_slice(b"wxyz");
        input.extend(req(CMD_READ, 0, 3, 4094, 8));
        input.extend(req(CMD_FLUSH, 0, 4, 0, 0));
        input.extend(req(CMD_DISC, 0, 5, 0, 0));
        let (r, out, c) = serve(dev.clone(), input, false);
        assert_eq!(r.unwrap(), Ending::Disconnect);
        let mut want = simple_reply(0, 1).to_vec();
        want.extend(simple_reply(EINVAL, 2));
        want.extend(simple_reply(0, 3));
        want.extend_from_slice(b"\0\0abcd\0\0");
        want.extend(simple_reply(0, 4));
        assert_eq!(out, want);
        assert_eq!((c.requests, c.bytes_written, c.bytes_read), (5, 4, 8));
    }

    #[test]
    fn structured_reads_and_errors() {
        let dev: Arc<dyn BlockDevice> = Arc::new(CorruptBlock2(MemoryDevice::new("m", 1 << 16)));
        let mut input = req(CMD_READ, 0, 7, 0, 16);
        input.extend(req(CMD_READ, 0, 8, 8192, 512));
        input.extend(req(CMD_READ, 0, 9, 0, MAX_PAYLOAD + 1));
        let (r, out, c) = serve(dev, input, true);
        assert_eq!(r.unwrap(), Ending::HungUp);
        assert_eq!(be32(&out, 0), STRUCTURED_REPLY_MAGIC);
        assert_eq!(be16(&out, 6), REPLY_TYPE_OFFSET_DATA);
        assert_eq!(be32(&out, 16), 24);
        let second = &out[20 + 24..];
        assert_eq!(be16(second, 6), REPLY_TYPE_ERROR);
        assert_eq!(be64(second, 8), 8);
        assert_eq!(be32(second, 20), EIO);
        let mlen = be16(second, 24) as usize;
        assert_eq!(&second[26..26 + mlen], b"data block 2 is corrupted");
        let third = &second[26 + mlen..];
        assert_eq!(be32(third, 20), EOVERFLOW);
        assert_eq!((c.io_errors, c.corruptions), (1, 1));
    }

    #[test]
    fn read_only_garbage_and_hangups() {
        let dev: Arc<dyn BlockDevice> =
            Arc::new(MemoryDevice::from_vec("m", vec![1; 4096]).into_read_only());
        let mut input = req(CMD_WRITE, 0, 1, 0, 512);
        input.extend_from_slice(&[0; 512]);
        input.extend(req(CMD_READ, 0, 2, 0, 4));
        let (r, out, _) = serve(dev.clone(), input.clone(), false);
        assert_eq!(r.unwrap(), Ending::HungUp);
        assert_eq!(be32(&out, 4), EPERM);
        assert_eq!(&out[32..36], &[1, 1, 1, 1]);
        // A payload cut short, a header cut short: the connection ends, nothing written.
        let mut cut = req(CMD_WRITE, 0, 1, 0, 512);
        cut.extend_from_slice(&[0; 100]);
        let rw: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("m", 4096));
        assert!(serve(rw.clone(), cut, false).0.is_err());
        assert!(
            serve(rw.clone(), req(CMD_READ, 0, 1, 0, 4)[..10].to_vec(), false)
                .0
                .is_err()
        );
        assert!(serve(rw, vec![0xff; 28], false).0.is_err());
    }
}
