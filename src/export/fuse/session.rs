//! One FUSE connection and its serving threads, whatever the filesystem behind it.
//!
//! The session owns what every FUSE server needs: the threads, each reading requests from its
//! own cloned `/dev/fuse` descriptor and answering them inline; the INIT negotiation; the
//! counters; and the unmount that ends it. What a request means is the [`Filesystem`]'s
//! business: the single-file block export ([`super::file`]) and the read-only tree
//! ([`super::tree`]) are two implementations.
//!
//! A request is read with `readv` into an 80-byte head (in-header plus the largest fixed
//! argument block, WRITE's) and a page-aligned data buffer, so a WRITE payload lands aligned
//! for an `O_DIRECT` backend. Nothing is queued between the request and the filesystem.
//!
//! When the kernel offers FUSE over io_uring at INIT (and the user did not ask it away), the
//! session also sets up one ring queue per CPU ([`super::uring`]): requests then arrive on the
//! queue of the CPU that issued them and are answered inline by the thread pinned to it; the
//! `/dev/fuse` threads stay for what the kernel still sends that way (FORGETs, interrupts), and
//! serve everything when the ring cannot be used.

use super::mount::{clone_fuse_fd, ctx};
use super::proto::*;
use super::request::{InHeader, InitIn, Request};
use super::transport::{not_offered, possible_cpus, Transport, TransportChoice, TRANSPORT_ENV};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Per-thread counters, on their own cache line so serving threads never share one.
#[derive(Default)]
#[repr(align(64))]
pub(super) struct Counters {
    pub requests: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub io_errors: AtomicU64,
    pub corruptions: AtomicU64,
}

/// A snapshot of an export's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportStats {
    /// Requests served (all opcodes).
    pub requests: u64,
    /// Bytes returned by READ.
    pub bytes_read: u64,
    /// Bytes accepted by WRITE.
    pub bytes_written: u64,
    /// Requests answered with an error, whatever the cause (corruptions included): what
    /// readers and writers saw fail.
    pub io_errors: u64,
    /// Of those, the requests that failed on a corrupted block.
    pub corruptions: u64,
}

/// One request as a filesystem sees it.
pub(super) struct Call<'a> {
    /// The inode the request is about (`FUSE_ROOT_ID` for the root).
    pub nodeid: u64,
    /// The decoded request (a WRITE's payload page-aligned in it).
    pub op: Request<'a>,
    /// This thread's counters.
    pub counters: &'a Counters,
}

/// Bytes of a reply kept aside when the request's buffer still holds its payload (a WRITE's
/// answer, `fuse_write_out`, is 8).
const STAGED: usize = 64;

/// What a request was answered with, for a transport that sends it after the handler returns.
pub(super) struct Answer {
    /// 0, or the errno.
    pub error: i32,
    /// Bytes of data: at the start of the request's buffer, or in `staged`.
    pub len: usize,
    /// The data when the request's buffer was not free (`len` bytes of it).
    pub staged: Option<[u8; STAGED]>,
}

/// Where a request's answer goes: one `writev` on the thread's `/dev/fuse` descriptor right
/// away, or an [`Answer`] the ring queue's thread commits.
///
/// A request that carried no payload leaves its buffer (page-aligned, as large as the largest
/// READ) free for the answer: [`Reply::buffer`] lends it, so a READ lands where the transport
/// sends it from, with no copy.
pub(super) struct Reply<'a> {
    unique: u64,
    /// `/dev/fuse` to write the answer to; `None` on a ring.
    fd: Option<RawFd>,
    buf: Option<&'a mut [u8]>,
    answer: Option<Answer>,
}

impl<'a> Reply<'a> {
    /// The answer to request `unique` read from `fd`; `buf`, when free, may hold its data.
    pub fn dev(fd: RawFd, unique: u64, buf: Option<&'a mut [u8]>) -> Self {
        Reply {
            unique,
            fd: Some(fd),
            buf,
            answer: None,
        }
    }

    /// The answer to request `unique` of a ring entry whose payload buffer is `buf` (when free).
    pub fn ring(unique: u64, buf: Option<&'a mut [u8]>) -> Self {
        Reply {
            unique,
            fd: None,
            buf,
            answer: None,
        }
    }

    /// The request's buffer, free for the answer's data (`None` when the request's payload is
    /// in it).
    pub fn buffer(&mut self) -> Option<&mut [u8]> {
        self.buf.as_deref_mut()
    }

    fn answered(&mut self, error: i32, len: usize, staged: Option<[u8; STAGED]>) {
        if self.answer.is_some() {
            eprintln!("dmkit: fuse: request {} answered twice", self.unique);
            return;
        }
        self.answer = Some(Answer { error, len, staged });
    }

    /// Answer with `payload` (pieces sent back to back).
    pub fn ok(&mut self, payload: &[&[u8]]) {
        if let Some(fd) = self.fd {
            reply(fd, self.unique, 0, payload);
            return self.answered(0, 0, None);
        }
        let total: usize = payload.iter().map(|p| p.len()).sum();
        match self.buf.as_deref_mut() {
            Some(b) if total <= b.len() => {
                let mut at = 0;
                for p in payload {
                    b[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
                self.answered(0, total, None)
            }
            None if total <= STAGED => {
                let mut st = [0u8; STAGED];
                let mut at = 0;
                for p in payload {
                    st[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
                self.answered(0, total, Some(st))
            }
            _ => {
                eprintln!(
                    "dmkit: fuse: a {total}-byte answer to request {} does not fit",
                    self.unique
                );
                self.answered(libc::EIO, 0, None)
            }
        }
    }

    /// Answer with bytes `[start, start + len)` of [`Reply::buffer`], where the handler put
    /// them.
    pub fn ok_buffer(&mut self, start: usize, len: usize) {
        let Some(b) = self.buf.as_deref_mut() else {
            eprintln!(
                "dmkit: fuse: request {} has no buffer to answer from",
                self.unique
            );
            return self.err(libc::EIO);
        };
        if let Some(fd) = self.fd {
            reply(fd, self.unique, 0, &[&b[start..start + len]]);
            return self.answered(0, 0, None);
        }
        if start != 0 {
            // Only an unaligned read starts inside its block; the ring sends from the start.
            b.copy_within(start..start + len, 0);
        }
        self.answered(0, len, None)
    }

    /// Answer with an errno.
    pub fn err(&mut self, errno: i32) {
        if let Some(fd) = self.fd {
            reply(fd, self.unique, errno, &[]);
        }
        self.answered(errno, 0, None)
    }

    /// Answer `Ok(payload)` or `Err(errno)`.
    pub fn result(&mut self, r: Result<Vec<u8>, i32>) {
        match r {
            Ok(p) => self.ok(&[&p]),
            Err(e) => self.err(e),
        }
    }

    /// What the request was answered with; a handler that did not answer gets EIO (a ring
    /// entry must always go back to the kernel).
    pub fn finish(mut self) -> Answer {
        if self.answer.is_none() {
            eprintln!("dmkit: fuse: request {} was not answered", self.unique);
            self.err(libc::EIO);
        }
        self.answer.take().unwrap_or(Answer {
            error: libc::EIO,
            len: 0,
            staged: None,
        })
    }
}

/// What a FUSE server serves. Called on the serving threads, concurrently.
pub(super) trait Filesystem: Send + Sync + 'static {
    /// Per-thread scratch state (I/O buffers), made once per serving thread.
    type Scratch: Send;
    /// A new scratch state for one thread.
    fn scratch(&self) -> Self::Scratch;
    /// The INIT flags this filesystem wants, of those the kernel offers.
    fn init_flags(&self) -> u32;
    /// Answer one request (INIT, DESTROY, INTERRUPT and FORGETs never get here). Every
    /// opcode that expects a reply must get exactly one through `reply`.
    fn handle(&self, req: &Call<'_>, scratch: &mut Self::Scratch, reply: &mut Reply<'_>, s: &State);
}

/// Session state a filesystem may read or update while handling a request.
pub(super) struct State {
    /// OPENs (and OPENDIRs) not yet RELEASEd: the mount's users, for `close`'s "still in use".
    pub open_handles: AtomicI64,
    /// The negotiated minor protocol version (0 before INIT).
    pub minor: AtomicU32,
    /// The connection's first descriptor, for notifications (it lives as long as the session).
    pub notify_fd: RawFd,
}

/// What every serving thread of a session shares.
pub(super) struct Shared<F> {
    pub fs: F,
    pub state: State,
    /// Per thread: the `/dev/fuse` threads first, then one per ring queue.
    pub counters: Vec<Counters>,
    /// The connection's first descriptor: ring queues send their commands on it.
    pub master: Arc<OwnedFd>,
    /// `/dev/fuse` threads.
    threads: usize,
    choice: TransportChoice,
    /// Set once INIT has been answered (and the ring registered), with the negotiated minor
    /// version.
    init: Mutex<Option<Result<u32, String>>>,
    init_cv: Condvar,
    transport: Mutex<Option<Transport>>,
    live_threads: AtomicUsize,
    exited: (Mutex<()>, Condvar),
    /// The ring queues' threads, joined with the others at unmount.
    pub ring_threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<F> Shared<F> {
    /// A serving thread is about to start.
    pub fn thread_starting(&self) {
        self.live_threads.fetch_add(1, Ordering::SeqCst);
    }

    /// How many `/dev/fuse` threads there are (the ring queues' counters follow theirs).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// A serving thread ended.
    pub fn thread_done(&self) {
        if self.live_threads.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _g = self.exited.0.lock().unwrap_or_else(|e| e.into_inner());
            self.exited.1.notify_all();
        }
    }
}

/// A mounted FUSE connection with its serving threads. Unmounts (lazily) when dropped.
pub(super) struct Session<F: Filesystem> {
    mountpoint: PathBuf,
    shared: Arc<Shared<F>>,
    threads: Vec<JoinHandle<()>>,
    mounted: AtomicBool,
    st_dev: u64,
    via_fusermount: bool,
}

impl<F: Filesystem> Session<F> {
    /// Serve `fs` on the connection `master` (already mounted at `mountpoint`) with `threads`
    /// `/dev/fuse` threads and, when `choice` allows and the kernel offers it, a ring queue per
    /// CPU; wait until the kernel's INIT has been answered.
    pub fn start(
        mountpoint: &Path,
        master: OwnedFd,
        via_fusermount: bool,
        fs: F,
        threads: usize,
        choice: TransportChoice,
    ) -> io::Result<Self> {
        let threads = threads.max(1);
        let queues = possible_cpus().unwrap_or(1);
        let master = Arc::new(master);
        let shared = Arc::new(Shared {
            fs,
            state: State {
                open_handles: AtomicI64::new(0),
                minor: AtomicU32::new(0),
                notify_fd: master.as_raw_fd(),
            },
            counters: (0..threads + queues).map(|_| Counters::default()).collect(),
            master: master.clone(),
            threads,
            choice,
            init: Mutex::new(None),
            init_cv: Condvar::new(),
            transport: Mutex::new(None),
            live_threads: AtomicUsize::new(threads),
            exited: (Mutex::new(()), Condvar::new()),
            ring_threads: Mutex::new(Vec::new()),
        });
        let mut session = Session {
            mountpoint: mountpoint.to_path_buf(),
            shared: shared.clone(),
            threads: Vec::with_capacity(threads),
            mounted: AtomicBool::new(true),
            st_dev: 0,
            via_fusermount,
        };
        for idx in 0..threads {
            // A cloned descriptor gives each thread its own processing queue in the kernel
            // (less lock contention); the shared one works too, so failure is not fatal.
            let fd = clone_fuse_fd(&master)
                .map(Arc::new)
                .unwrap_or_else(|_| master.clone());
            let sh = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-{idx}"))
                .spawn(move || serve(sh, fd, idx));
            match spawned {
                Ok(h) => session.threads.push(h),
                Err(e) => {
                    shared
                        .live_threads
                        .fetch_sub(threads - idx, Ordering::SeqCst);
                    return Err(ctx("cannot start a serving thread".into(), e));
                }
            }
        }
        drop(master);
        session.wait_init(Duration::from_secs(10))?;
        // Only now: any access to the mount point blocks until INIT has been answered.
        session.st_dev = std::fs::metadata(mountpoint)
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .unwrap_or(0);
        Ok(session)
    }

    fn wait_init(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.init.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*g {
                Some(Ok(_)) => return Ok(()),
                Some(Err(m)) => {
                    return Err(io::Error::other(format!(
                        "{}: {m}",
                        self.mountpoint.display()
                    )))
                }
                None => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}: the kernel did not send FUSE INIT within {} s",
                        self.mountpoint.display(),
                        timeout.as_secs()
                    ),
                ));
            }
            g = self
                .shared
                .init_cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Open handles right now.
    pub fn open_handles(&self) -> i64 {
        self.shared.state.open_handles.load(Ordering::SeqCst)
    }

    /// The negotiated FUSE minor protocol version.
    pub fn protocol_minor(&self) -> u32 {
        self.shared.state.minor.load(Ordering::Relaxed)
    }

    /// The transport requests come through.
    pub fn transport(&self) -> Transport {
        let g = self
            .shared
            .transport
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        g.clone().unwrap_or(Transport::DevFuse {
            threads: self.shared.threads,
            why: None,
        })
    }

    /// The counters so far, summed over the threads.
    pub fn stats(&self) -> ExportStats {
        let mut s = ExportStats::default();
        for c in &self.shared.counters {
            s.requests += c.requests.load(Ordering::Relaxed);
            s.bytes_read += c.bytes_read.load(Ordering::Relaxed);
            s.bytes_written += c.bytes_written.load(Ordering::Relaxed);
            s.io_errors += c.io_errors.load(Ordering::Relaxed);
            s.corruptions += c.corruptions.load(Ordering::Relaxed);
        }
        s
    }

    /// Unmount and wait (up to `wait`) for the serving threads to end. A busy mount is retried
    /// for about a second and then detached lazily (`MNT_DETACH`); the threads then keep
    /// serving whoever still has a file open until this process exits. Returns whether the
    /// unmount had to be lazy.
    pub fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        if !self.mounted.swap(false, Ordering::SeqCst) {
            return Ok(false);
        }
        let lazy = super::mount::unmount_path(&self.mountpoint, self.st_dev)?;
        // Unmounting aborts the connection: every blocked read returns ENODEV, and every ring
        // entry comes back with ENOTCONN.
        let deadline = Instant::now() + wait;
        let (m, cv) = &self.shared.exited;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while self.shared.live_threads.load(Ordering::SeqCst) > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        if self.shared.live_threads.load(Ordering::SeqCst) == 0 {
            let rings = std::mem::take(
                &mut *self
                    .shared
                    .ring_threads
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            for h in self.threads.drain(..).chain(rings) {
                let _ = h.join();
            }
        }
        Ok(lazy)
    }
}

impl<F: Filesystem> super::Mounted for Session<F> {
    fn open_handles(&self) -> i64 {
        Session::open_handles(self)
    }
    fn stats(&self) -> ExportStats {
        Session::stats(self)
    }
    fn protocol_minor(&self) -> u32 {
        Session::protocol_minor(self)
    }
    fn transport(&self) -> Transport {
        Session::transport(self)
    }
    fn via_fusermount(&self) -> bool {
        self.via_fusermount
    }
    fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        Session::unmount(self, wait)
    }
    fn invalidate(&self) {
        // The root is inode 1.
        super::proto::notify_inval_inode(self.shared.state.notify_fd, 1, 0, 0);
    }
}

impl<F: Filesystem> Drop for Session<F> {
    fn drop(&mut self) {
        if self.mounted.load(Ordering::SeqCst) {
            let _ = self.unmount(Duration::from_secs(2));
        }
    }
}

/// Route one request, whatever the transport: the session answers INIT, DESTROY and the
/// requests that expect no answer; the filesystem everything else. Returns the answer, `None`
/// when the request expects none.
pub(super) fn dispatch<F: Filesystem>(
    shared: &Arc<Shared<F>>,
    req: &Call<'_>,
    scratch: &mut F::Scratch,
    mut r: Reply<'_>,
) -> Option<Answer> {
    match req.op {
        Request::Init(ref k) => init(shared, &mut r, k),
        // No reply expected: interrupts are ignored (every request finishes quickly).
        ref op if op.expects_no_answer() => return None,
        Request::Destroy => r.ok(&[]),
        // A WRITE that is not whole, or an INIT too short to negotiate with.
        Request::Malformed {
            opcode: FUSE_WRITE | FUSE_INIT,
            ..
        } => r.err(libc::EINVAL),
        _ => shared.fs.handle(req, scratch, &mut r, &shared.state),
    }
    Some(r.finish())
}

/// The request loop of one `/dev/fuse` thread.
fn serve<F: Filesystem>(shared: Arc<Shared<F>>, fd: Arc<OwnedFd>, idx: usize) {
    let raw = fd.as_raw_fd();
    let mut head = [0u8; HEAD];
    // The kernel refuses reads into buffers smaller than header + write_in + max_write; the
    // slack lets an unaligned READ of the largest size be read whole into the same buffer.
    let mut data = AlignedBuf::new(MAX_WRITE + 2 * PAGE);
    let mut args: Vec<u8> = Vec::with_capacity(MAX_ARGS);
    let mut scratch = shared.fs.scratch();
    let ctr = &shared.counters[idx];
    loop {
        let buf = data.all();
        let iov = [
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: HEAD,
            },
            libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            },
        ];
        // SAFETY: both iovecs point into buffers owned by this thread that outlive the call.
        let n = unsafe { libc::readv(raw, iov.as_ptr(), 2) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // EINTR: a signal; ENOENT: the request was interrupted before we got it.
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                // ENODEV: unmounted or aborted, the normal end.
                Some(libc::ENODEV) => break,
                _ => {
                    eprintln!("dmkit: fuse: reading requests failed: {e}");
                    break;
                }
            }
        }
        let n = n as usize;
        let Ok(h) = InHeader::decode(&head[..n.min(HEAD)]) else {
            eprintln!("dmkit: fuse: short request of {n} bytes ignored");
            continue;
        };
        let unique = h.unique;
        ctr.requests.fetch_add(1, Ordering::Relaxed);
        if h.opcode == FUSE_WRITE {
            // The payload is what follows the head: none when even the head is short.
            let payload = &data.as_slice()[..n.saturating_sub(HEAD)];
            let req = Call {
                nodeid: h.nodeid,
                op: Request::decode(h.opcode, &head[IN_HEADER..n.min(HEAD)], payload),
                counters: ctr,
            };
            dispatch(&shared, &req, &mut scratch, Reply::dev(raw, unique, None));
        } else {
            // Every other request is small: gather its arguments contiguously, which frees
            // the data buffer for the answer.
            args.clear();
            args.extend_from_slice(&head[IN_HEADER..n.min(HEAD)]);
            if n > HEAD {
                let rest = (n - HEAD).min(MAX_ARGS);
                args.extend_from_slice(&data.as_slice()[..rest]);
            }
            let req = Call {
                nodeid: h.nodeid,
                op: Request::decode(h.opcode, &args, &[]),
                counters: ctr,
            };
            let r = Reply::dev(raw, unique, Some(data.all()));
            dispatch(&shared, &req, &mut scratch, r);
        }
    }
    shared.thread_done();
}

/// Answer INIT: the protocol version and what this server takes of what the kernel offers.
fn init<F: Filesystem>(shared: &Arc<Shared<F>>, r: &mut Reply<'_>, k: &InitIn) {
    let InitIn {
        major,
        minor,
        max_readahead,
        flags,
        flags2,
    } = *k;
    if major > KERNEL_MAJOR {
        // The kernel resends INIT with our major version.
        let mut o = Out::with_capacity(128);
        o.u32_ne(KERNEL_MAJOR).u32_ne(KERNEL_MINOR).zeros(56);
        return r.ok(&[o.as_slice()]);
    }
    let done = |res: Result<u32, String>| {
        let mut g = shared.init.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(res);
        shared.init_cv.notify_all();
    };
    if major < KERNEL_MAJOR || minor < 28 {
        let m = format!("kernel FUSE protocol {major}.{minor} is too old (need 7.28)");
        eprintln!("dmkit: {m}");
        r.err(libc::EPROTO);
        return done(Err(m));
    }
    let minor = minor.min(KERNEL_MINOR);
    // The rings are made before the answer: once it says io_uring, the kernel holds every
    // request until each CPU's queue has registered, so they must be ready to.
    let mut why = None;
    let rings = match shared.choice {
        TransportChoice::DevFuse => None,
        _ if flags2 & FUSE_OVER_IO_URING2 == 0 => {
            why = Some(not_offered());
            None
        }
        _ => match super::uring::prepare(shared) {
            Ok(p) => Some(p),
            Err(e) => {
                why = Some(format!("cannot set up the io_uring queues: {e}"));
                None
            }
        },
    };
    let mut out_flags = flags & shared.fs.init_flags();
    let mut out_flags2 = 0;
    if flags & FUSE_INIT_EXT != 0 {
        out_flags |= FUSE_INIT_EXT;
        if rings.is_some() {
            out_flags2 |= FUSE_OVER_IO_URING2;
        }
    }
    let mut o = Out::with_capacity(128);
    o.u32_ne(KERNEL_MAJOR)
        .u32_ne(minor)
        .u32_ne(max_readahead)
        .u32_ne(out_flags)
        .u16_ne(MAX_BACKGROUND)
        .u16_ne(CONGESTION_THRESHOLD)
        .u32_ne(MAX_WRITE as u32)
        .u32_ne(1) // time_gran
        .u16_ne(MAX_PAGES)
        .u16_ne(0) // map_alignment
        .u32_ne(out_flags2)
        .u32_ne(0) // max_stack_depth
        .zeros(24); // request_timeout + unused
    shared.state.minor.store(minor, Ordering::Relaxed);
    r.ok(&[o.as_slice()]);
    // The kernel has processed the answer when the write returns: it now takes ring
    // registrations.
    let transport = match rings.map(|p| p.register()) {
        Some(Ok(t)) => t,
        Some(Err(e)) => Transport::DevFuse {
            threads: shared.threads,
            why: Some(format!("FUSE over io_uring failed to register: {e}")),
        },
        None => Transport::DevFuse {
            threads: shared.threads,
            why,
        },
    };
    let res = match (&transport, shared.choice) {
        (Transport::DevFuse { why: Some(w), .. }, TransportChoice::IoUring) => {
            Err(format!("{TRANSPORT_ENV}=io-uring: {w}"))
        }
        (Transport::DevFuse { why: Some(w), .. }, _) => {
            eprintln!("dmkit: fuse: serving through /dev/fuse: {w}");
            Ok(minor)
        }
        _ => Ok(minor),
    };
    *shared.transport.lock().unwrap_or_else(|e| e.into_inner()) = Some(transport);
    done(res);
}
