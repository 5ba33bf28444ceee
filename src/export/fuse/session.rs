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

use super::mount::{clone_fuse_fd, ctx};
use super::proto::*;
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
pub(super) struct Request<'a> {
    /// The opcode (`FUSE_*`).
    pub opcode: u32,
    /// The inode the request is about (`FUSE_ROOT_ID` for the root).
    pub nodeid: u64,
    /// The fixed arguments after the in-header (for WRITE, `fuse_write_in` only), at most
    /// [`MAX_ARGS`] bytes; handlers check the length they need.
    pub args: &'a [u8],
    /// A WRITE's payload, page-aligned; empty for every other opcode.
    pub payload: &'a [u8],
    /// This thread's counters.
    pub counters: &'a Counters,
}

/// Where a request's answer goes: one `writev` on the thread's descriptor.
pub(super) struct Reply {
    fd: RawFd,
    unique: u64,
}

impl Reply {
    /// Answer with `payload` (pieces sent back to back).
    pub fn ok(&self, payload: &[&[u8]]) {
        reply(self.fd, self.unique, 0, payload);
    }
    /// Answer with an errno.
    pub fn err(&self, errno: i32) {
        reply(self.fd, self.unique, errno, &[]);
    }
    /// Answer `Ok(payload)` or `Err(errno)`.
    pub fn result(&self, r: Result<Vec<u8>, i32>) {
        match r {
            Ok(p) => self.ok(&[&p]),
            Err(e) => self.err(e),
        }
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
    fn handle(&self, req: &Request<'_>, scratch: &mut Self::Scratch, reply: &Reply, s: &State);
}

/// Session state a filesystem may read or update while handling a request.
pub(super) struct State {
    /// OPENs (and OPENDIRs) not yet RELEASEd: the mount's users, for `close`'s "still in use".
    pub open_handles: AtomicI64,
    /// The negotiated minor protocol version (0 before INIT).
    pub minor: AtomicU32,
}

struct Shared<F> {
    fs: F,
    state: State,
    counters: Vec<Counters>,
    /// Set once INIT has been answered, with the negotiated minor version.
    init: Mutex<Option<Result<u32, String>>>,
    init_cv: Condvar,
    live_threads: AtomicUsize,
    exited: (Mutex<()>, Condvar),
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
    /// threads, and wait until the kernel's INIT has been answered.
    pub fn start(
        mountpoint: &Path,
        master: OwnedFd,
        via_fusermount: bool,
        fs: F,
        threads: usize,
    ) -> io::Result<Self> {
        let threads = threads.max(1);
        let master = Arc::new(master);
        let shared = Arc::new(Shared {
            fs,
            state: State {
                open_handles: AtomicI64::new(0),
                minor: AtomicU32::new(0),
            },
            counters: (0..threads).map(|_| Counters::default()).collect(),
            init: Mutex::new(None),
            init_cv: Condvar::new(),
            live_threads: AtomicUsize::new(threads),
            exited: (Mutex::new(()), Condvar::new()),
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
                Some(Err(m)) => return Err(io::Error::other(m.clone())),
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
        // Unmounting aborts the connection, which makes every blocked read return ENODEV.
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
            for h in self.threads.drain(..) {
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
    fn via_fusermount(&self) -> bool {
        self.via_fusermount
    }
    fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        Session::unmount(self, wait)
    }
}

impl<F: Filesystem> Drop for Session<F> {
    fn drop(&mut self) {
        if self.mounted.load(Ordering::SeqCst) {
            let _ = self.unmount(Duration::from_secs(2));
        }
    }
}

/// The request loop of one serving thread.
fn serve<F: Filesystem>(shared: Arc<Shared<F>>, fd: Arc<OwnedFd>, idx: usize) {
    let raw = fd.as_raw_fd();
    let mut head = [0u8; HEAD];
    // The kernel refuses reads into buffers smaller than header + write_in + max_write.
    let mut data = AlignedBuf::new(MAX_WRITE + PAGE);
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
        if n < IN_HEADER {
            eprintln!("dmkit: fuse: short request of {n} bytes ignored");
            continue;
        }
        let opcode = ne_u32(&head, 4);
        let unique = ne_u64(&head, 8);
        let nodeid = ne_u64(&head, 16);
        let r = Reply { fd: raw, unique };
        ctr.requests.fetch_add(1, Ordering::Relaxed);
        let (req_args, payload): (&[u8], &[u8]) = if opcode == FUSE_WRITE {
            if n < HEAD {
                r.err(libc::EINVAL);
                continue;
            }
            let size = ne_u32(&head, IN_HEADER + 16) as usize;
            if n != HEAD + size {
                r.err(libc::EINVAL);
                continue;
            }
            (&head[IN_HEADER..HEAD], &data.all()[..size])
        } else {
            // Every other request is small: gather its arguments contiguously.
            args.clear();
            args.extend_from_slice(&head[IN_HEADER..n.min(HEAD)]);
            if n > HEAD {
                let rest = (n - HEAD).min(MAX_ARGS);
                args.extend_from_slice(&data.all()[..rest]);
            }
            (&args, &[])
        };
        match opcode {
            FUSE_INIT => init(&shared, &r, req_args),
            // No reply expected: interrupts are ignored (every request finishes quickly).
            FUSE_INTERRUPT | FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_NOTIFY_REPLY => {}
            FUSE_DESTROY => r.ok(&[]),
            _ => {
                let req = Request {
                    opcode,
                    nodeid,
                    args: req_args,
                    payload,
                    counters: ctr,
                };
                shared.fs.handle(&req, &mut scratch, &r, &shared.state);
            }
        }
    }
    if shared.live_threads.fetch_sub(1, Ordering::SeqCst) == 1 {
        let _g = shared.exited.0.lock().unwrap_or_else(|e| e.into_inner());
        shared.exited.1.notify_all();
    }
}

fn init<F: Filesystem>(shared: &Shared<F>, r: &Reply, args: &[u8]) {
    if args.len() < 16 {
        r.err(libc::EINVAL);
        return;
    }
    let major = ne_u32(args, 0);
    let minor = ne_u32(args, 4);
    let max_readahead = ne_u32(args, 8);
    let flags = ne_u32(args, 12);
    if major > KERNEL_MAJOR {
        // The kernel resends INIT with our major version.
        let mut o = Out::new();
        o.u32(KERNEL_MAJOR).u32(KERNEL_MINOR).zeros(56);
        r.ok(&[&o.0]);
        return;
    }
    let mut g = shared.init.lock().unwrap_or_else(|e| e.into_inner());
    if major < KERNEL_MAJOR || minor < 28 {
        let m = format!("kernel FUSE protocol {major}.{minor} is too old (need 7.28)");
        eprintln!("dmkit: {m}");
        r.err(libc::EPROTO);
        *g = Some(Err(m));
        shared.init_cv.notify_all();
        return;
    }
    let minor = minor.min(KERNEL_MINOR);
    let mut o = Out::new();
    o.u32(KERNEL_MAJOR)
        .u32(minor)
        .u32(max_readahead)
        .u32(flags & shared.fs.init_flags())
        .u16(MAX_BACKGROUND)
        .u16(CONGESTION_THRESHOLD)
        .u32(MAX_WRITE as u32)
        .u32(1) // time_gran
        .u16(MAX_PAGES)
        .u16(0) // map_alignment
        .u32(0) // flags2
        .u32(0) // max_stack_depth
        .zeros(24); // request_timeout + unused
    shared.state.minor.store(minor, Ordering::Relaxed);
    r.ok(&[&o.0]);
    *g = Some(Ok(minor));
    shared.init_cv.notify_all();
}
