//! The transmission phase with several requests of one connection in flight, for devices whose
//! reads wait on a network ([`crate::block::BlockDevice::blocks_on_network`]): a remote image
//! spends a read's time waiting for a round trip, so a client's queue depth is worth as many
//! round trips at once. Local devices keep the inline path of [`super::transmit`] (a queue
//! there costs more than it gives).
//!
//! The connection's thread reads and checks requests and hands READs to a small pool of
//! workers of this connection; each worker reads from the device and sends its reply whole,
//! holding the one lock on the socket's writing half for the whole message (a simple or
//! structured reply as negotiated), so replies never interleave (they may come out of order,
//! which NBD allows: the cookie says which request each answers). Every other command waits
//! for the READs in flight to finish and runs on the connection's thread, so a FLUSH (or a
//! write) is ordered after everything before it, as in the inline path. A DISC, a hang-up or
//! a broken socket stops reading requests, and the requests already handed over are finished
//! (and answered, if the socket still takes it) before the connection ends.

use super::export::ExportInfo;
use super::proto::*;
use super::request::{check, Command, Header, Refusal};
use super::transmit::{
    add, apply, client_message, error_reply, read_header, Counters, Ending, KEEP_BUFFER,
};
use super::wire::{Socket, Stream, Wire};
use crate::block::aligned::AlignedBuf;
use crate::block::BlockError;
use crate::export::bytes::ByteDevice;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};

/// Workers of one connection: READs in flight at once. Above the queue depths clients use by
/// default (fio's jobs here use 8; QEMU keeps up to 16 requests of a guest in flight); each
/// idle worker costs a thread and at most `KEEP_BUFFER` bytes of buffer.
pub const WORKERS: usize = 16;

/// A READ handed to a worker.
struct Job {
    req: Header,
    offset: u64,
    len: u32,
}

/// What the reader and the workers of a connection share.
struct Shared<'a> {
    bytes: &'a ByteDevice,
    structured: bool,
    counters: [&'a Counters; 2],
    /// The writing half of the connection; one whole reply per lock.
    out: Mutex<Socket>,
    /// READs handed over and not yet answered.
    pending: Mutex<usize>,
    idle: Condvar,
    /// A reply could not be sent: the connection is over.
    broken: AtomicBool,
}

impl Shared<'_> {
    /// Send one whole reply; a failure marks the connection broken and shuts the socket down,
    /// so the connection's thread, waiting for a request, wakes up and ends it.
    fn send(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if self.broken.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier reply could not be sent",
            ));
        }
        let r = out.write_parts(parts);
        if r.is_err() {
            self.broken.store(true, Ordering::Relaxed);
            // SAFETY: shutdown(2) on a descriptor this connection holds.
            unsafe { libc::shutdown(out.as_raw_fd(), libc::SHUT_RDWR) };
        }
        r
    }

    /// Count, log and answer a device error.
    fn fail(&self, req: &Header, e: BlockError) -> io::Result<()> {
        let [c, t] = self.counters;
        add([&c.io_errors, &t.io_errors], 1);
        if self.bytes.report(&e) {
            add([&c.corruptions, &t.corruptions], 1);
        }
        let msg = client_message(&e);
        self.send(&[&error_reply(
            self.structured,
            req,
            nbd_errno(e.errno()),
            &msg,
        )])
    }

    /// Read and answer one READ (on a worker).
    fn read(&self, job: &Job, io: &mut AlignedBuf) {
        // A reply that cannot be sent has marked the connection broken; nothing more to do.
        let _ = match self.bytes.read(job.offset, job.len as usize, io) {
            Ok(at) => {
                let [c, t] = self.counters;
                add([&c.bytes_read, &t.bytes_read], u64::from(job.len));
                let h = read_header(self.structured, &job.req, job.offset, job.len);
                self.send(&[&h, &io.as_slice()[at..at + job.len as usize]])
            }
            Err(e) => self.fail(&job.req, e),
        };
        io.cap(KEEP_BUFFER);
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *p -= 1;
        if *p == 0 {
            self.idle.notify_all();
        }
    }

    /// Wait until every READ handed over has been answered.
    fn drain(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while *p > 0 {
            p = self.idle.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Serve the requests of a client that negotiated `structured` replies (or not) on `wire`,
/// with replies sent on `out` (the same connection's writing half, see
/// [`Stream::try_clone_writer`]) by up to `workers` threads, until the client leaves. Errors
/// as for [`super::transmit::Transmission::run`].
pub(crate) fn run<S: Stream>(
    export: &ExportInfo,
    bytes: &ByteDevice,
    structured: bool,
    counters: [&Counters; 2],
    wire: &mut Wire<S>,
    out: Socket,
    workers: usize,
) -> io::Result<Ending> {
    let shared = Shared {
        bytes,
        structured,
        counters,
        out: Mutex::new(out),
        pending: Mutex::new(0),
        idle: Condvar::new(),
        broken: AtomicBool::new(false),
    };
    let workers = workers.max(1);
    // Room for one request per worker waiting: the reader runs ahead of the workers by at
    // most that much, then waits (the client's requests stay in the socket).
    let (tx, rx) = mpsc::sync_channel::<Job>(workers);
    let rx = Mutex::new(rx);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (shared, rx) = (&shared, &rx);
            scope.spawn(move || {
                let mut io = AlignedBuf::new(0);
                loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => shared.read(&job, &mut io),
                        Err(_) => return,
                    }
                }
            });
        }
        let tx = tx;
        let r = requests(export, &shared, wire, &tx);
        // The workers finish what was handed over, then see the channel closed.
        drop(tx);
        shared.drain();
        if shared.broken.load(Ordering::Relaxed) && r.is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "a reply could not be sent",
            ));
        }
        r
    })
}

/// The connection thread's loop: read, check, hand over or run each request.
fn requests<S: Stream>(
    export: &ExportInfo,
    shared: &Shared<'_>,
    wire: &mut Wire<S>,
    tx: &mpsc::SyncSender<Job>,
) -> io::Result<Ending> {
    let mut h = [0u8; REQUEST_LEN];
    let mut io = AlignedBuf::new(0);
    let mut payload = AlignedBuf::new(0);
    let [c, t] = shared.counters;
    loop {
        if shared.broken.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "a reply could not be sent",
            ));
        }
        let got = wire.read_header(&mut h);
        if shared.broken.load(Ordering::Relaxed) {
            // The read ended because a worker shut the socket down.
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "a reply could not be sent",
            ));
        }
        if !got? {
            return Ok(Ending::HungUp);
        }
        let Some(req) = Header::parse(&h) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a request without the request magic",
            ));
        };
        add([&c.requests, &t.requests], 1);
        match check(&req, export, shared.structured) {
            Err(Refusal {
                error,
                message,
                skip,
            }) => {
                wire.skip(u64::from(skip))?;
                shared.send(&[&error_reply(shared.structured, &req, error, &message)])?;
            }
            Ok(Command::Disconnect) => return Ok(Ending::Disconnect),
            Ok(Command::Read { offset, len }) => {
                *shared.pending.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                if tx.send(Job { req, offset, len }).is_err() {
                    return Err(io::Error::other("the connection's workers are gone"));
                }
            }
            Ok(cmd) => {
                // Ordered after every READ before it, as the inline path is.
                shared.drain();
                let data: &[u8] = match cmd {
                    Command::Write { len, .. } => {
                        let d = payload.get(len as usize);
                        // A client that hangs up in the middle of a payload leaves nothing
                        // written.
                        wire.read_exact(d)?;
                        d
                    }
                    _ => &[],
                };
                match apply(shared.bytes, cmd, data, &mut io, shared.counters) {
                    Ok(()) => shared.send(&[&simple_reply(0, req.cookie)])?,
                    Err(e) => shared.fail(&req, e)?,
                }
                io.cap(KEEP_BUFFER);
                payload.cap(KEEP_BUFFER);
            }
        }
    }
}
