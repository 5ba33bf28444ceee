//! A minimal FUSE server exporting one block device as one regular file.
//!
//! It speaks the kernel protocol directly over `/dev/fuse` (no libfuse): the root of the mount
//! is the file itself (`rootmode=100000`), mounted over a regular file path, exactly like
//! qemu-storage-daemon's FUSE export. Several threads serve the connection; each one reads a
//! request, calls the [`BlockDevice`] inline and writes the reply. There is no queue, channel
//! or worker pool between the request and the device: parallelism comes from the kernel
//! handing concurrent requests to concurrent readers.
//!
//! Data moves with as few copies as the protocol allows: a request is read with `readv` into
//! an 80-byte header area plus a page-aligned data buffer, so WRITE payloads land aligned
//! (ready for an `O_DIRECT` backend); READ replies are sent with `writev` from a page-aligned
//! per-thread buffer the device read into directly.

use crate::block::{BlockDevice, BlockError};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Serving threads when none is asked for.
pub const DEFAULT_THREADS: usize = 4;
/// Largest WRITE payload (and READ size) negotiated with the kernel.
pub const MAX_WRITE: usize = 1 << 20;
const MAX_PAGES: u16 = 256;
/// Kernel protocol version we speak. Nothing we use changed layout between 7.31 and 7.38; the
/// newer minor lets the kernel honour `FOPEN_NOFLUSH` and `FOPEN_PARALLEL_DIRECT_WRITES`.
const KERNEL_MAJOR: u32 = 7;
const KERNEL_MINOR: u32 = 38;
/// Background requests (readahead, async direct I/O) the kernel keeps in flight. The kernel's
/// default of 12 would cap `iodepth=32` libaio runs; 128 lets them through.
const MAX_BACKGROUND: u16 = 128;
const CONGESTION_THRESHOLD: u16 = 96;
/// Attribute cache lifetime: the size never changes while mounted.
const ATTR_VALID_SECS: u64 = 3600;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const WRITE_IN: usize = 40;
/// Head of a request read separately so that a WRITE payload starts on a page boundary.
const HEAD: usize = IN_HEADER + WRITE_IN;
const PAGE: usize = 4096;
/// Non-WRITE requests we parse are all under this size.
const MAX_ARGS: usize = 512;
/// After this many logged I/O errors, only count them (corruptions are always logged).
const MAX_LOGGED_ERRORS: u64 = 100;

// Opcodes (include/uapi/linux/fuse.h).
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FSYNC: u32 = 20;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_NOTIFY_REPLY: u32 = 41;
const FUSE_BATCH_FORGET: u32 = 42;
const FUSE_FALLOCATE: u32 = 43;
const FUSE_LSEEK: u32 = 46;

// INIT flags.
const FUSE_ASYNC_READ: u32 = 1 << 0;
const FUSE_BIG_WRITES: u32 = 1 << 5;
const FUSE_ASYNC_DIO: u32 = 1 << 15;
const FUSE_MAX_PAGES: u32 = 1 << 22;

// OPEN reply flags.
const FOPEN_KEEP_CACHE: u32 = 1 << 1;
const FOPEN_NOFLUSH: u32 = 1 << 5;
const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

const FATTR_SIZE: u32 = 1 << 3;

/// `FUSE_DEV_IOC_CLONE` = `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: u64 = 0x8004_e500;

/// How to serve a device.
#[derive(Debug, Clone, Copy)]
pub struct FuseOptions {
    /// Number of serving threads (at least 1).
    pub threads: usize,
    /// Honour `fallocate(PUNCH_HOLE)` by discarding on the device.
    pub allow_discards: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: DEFAULT_THREADS,
            allow_discards: false,
        }
    }
}

/// Per-thread counters, on their own cache line so serving threads never share one.
#[derive(Default)]
#[repr(align(64))]
struct Counters {
    requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    io_errors: AtomicU64,
    corruptions: AtomicU64,
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
    /// Requests that failed with an I/O error (corruptions excluded).
    pub io_errors: u64,
    /// Requests that hit a corrupted block.
    pub corruptions: u64,
}

struct Shared {
    device: Arc<dyn BlockDevice>,
    allow_discards: bool,
    counters: Vec<Counters>,
    /// Set once INIT has been answered, with the negotiated minor version.
    init: Mutex<Option<Result<u32, String>>>,
    init_cv: Condvar,
    minor: AtomicU32,
    /// Aligned writes share it; a read-modify-write of a partial block takes it exclusively so
    /// no concurrent write to the same block is lost.
    rmw: RwLock<()>,
    logged_errors: AtomicU64,
    live_threads: AtomicUsize,
    exited: (Mutex<()>, Condvar),
    mtime: u64,
    uid: u32,
    gid: u32,
}

/// A mounted, serving FUSE export. Unmounts (lazily) when dropped.
pub struct FuseExport {
    mountpoint: PathBuf,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    mounted: AtomicBool,
    st_dev: u64,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: path contains a NUL byte", p.display()),
        )
    })
}

fn ctx(what: String, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl FuseExport {
    /// Mount a FUSE filesystem whose root is a regular file holding `device` over
    /// `mountpoint` (an existing regular file), start the serving threads and wait until the
    /// kernel's INIT has been answered.
    pub fn mount(
        mountpoint: &Path,
        device: Arc<dyn BlockDevice>,
        opts: FuseOptions,
    ) -> io::Result<FuseExport> {
        let threads = opts.threads.max(1);
        let mp = cpath(mountpoint)?;
        // SAFETY: open(2) on a constant NUL-terminated path; the fd is owned right below.
        let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(ctx(
                "/dev/fuse: cannot open".into(),
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a freshly opened descriptor nobody else owns.
        let master = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let data = format!(
            "fd={},rootmode=100000,user_id={uid},group_id={gid},allow_other,default_permissions",
            master.as_raw_fd()
        );
        let data = CString::new(data).map_err(|_| io::Error::other("mount options"))?;
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"dmkit".as_ptr(),
                mp.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(ctx(
                format!("{}: cannot mount FUSE", mountpoint.display()),
                io::Error::last_os_error(),
            ));
        }
        let mtime = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let shared = Arc::new(Shared {
            device,
            allow_discards: opts.allow_discards,
            counters: (0..threads).map(|_| Counters::default()).collect(),
            init: Mutex::new(None),
            init_cv: Condvar::new(),
            minor: AtomicU32::new(0),
            rmw: RwLock::new(()),
            logged_errors: AtomicU64::new(0),
            live_threads: AtomicUsize::new(threads),
            exited: (Mutex::new(()), Condvar::new()),
            mtime,
            uid,
            gid,
        });
        let mut export = FuseExport {
            mountpoint: mountpoint.to_path_buf(),
            shared: shared.clone(),
            threads: Vec::with_capacity(threads),
            mounted: AtomicBool::new(true),
            st_dev: 0,
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
                Ok(h) => export.threads.push(h),
                Err(e) => {
                    shared
                        .live_threads
                        .fetch_sub(threads - idx, Ordering::SeqCst);
                    return Err(ctx("cannot start a serving thread".into(), e));
                }
            }
        }
        drop(master);
        export.wait_init(Duration::from_secs(10))?;
        // Only now: any access to the mount point blocks until INIT has been answered.
        export.st_dev = std::fs::metadata(mountpoint)
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .unwrap_or(0);
        Ok(export)
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

    /// The mount point (the exported file's path).
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The negotiated FUSE minor protocol version.
    pub fn protocol_minor(&self) -> u32 {
        self.shared.minor.load(Ordering::Relaxed)
    }

    /// The counters so far.
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
    /// serving whoever still has the file open until this process exits. Returns whether the
    /// unmount had to be lazy.
    pub fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        if !self.mounted.swap(false, Ordering::SeqCst) {
            return Ok(false);
        }
        let lazy = unmount_path(&self.mountpoint, self.st_dev)?;
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

impl Drop for FuseExport {
    fn drop(&mut self) {
        if self.mounted.load(Ordering::SeqCst) {
            let _ = self.unmount(Duration::from_secs(2));
        }
    }
}

/// Unmount `path` if it is still the FUSE mount identified by `st_dev` (0: don't check),
/// retrying a busy unmount for about a second before detaching lazily. Returns whether the
/// unmount was lazy.
pub fn unmount_path(path: &Path, st_dev: u64) -> io::Result<bool> {
    let c = cpath(path)?;
    for attempt in 0..20 {
        if st_dev != 0 {
            match std::fs::metadata(path) {
                Ok(m) if std::os::unix::fs::MetadataExt::dev(&m) == st_dev => {}
                // ENOTCONN (dead server) still means mounted; anything else: already gone.
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {}
                _ => return Ok(false),
            }
        }
        // SAFETY: umount2(2) with a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // A loop device being torn down, or an fput still in flight: give it a moment.
            Some(libc::EBUSY) if attempt < 19 => std::thread::sleep(Duration::from_millis(50)),
            Some(libc::EBUSY) => break,
            Some(libc::EINVAL) => return Ok(false), // not a mount point (any more)
            _ => return Err(ctx(format!("{}: cannot unmount", path.display()), e)),
        }
    }
    // SAFETY: umount2(2) with a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(ctx(
                format!("{}: cannot detach the mount", path.display()),
                e,
            ));
        }
    }
    Ok(true)
}

fn clone_fuse_fd(master: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: open(2) on a constant NUL-terminated path.
    let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a freshly opened descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let src: u32 = master.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the source fd) from the pointer, which is valid
    // for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &src as *const u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A heap buffer with a page-aligned window, so `O_DIRECT` backends can use it as is.
struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let raw = vec![0u8; len + PAGE];
        let off = raw.as_ptr().align_offset(PAGE);
        AlignedBuf { raw, off, len }
    }
    fn ensure(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        self.ensure(len);
        &mut self.raw[self.off..self.off + len]
    }
    fn all(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

fn ne_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(a)
}

fn ne_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(a)
}

/// Builds small reply payloads in native byte order.
struct Out(Vec<u8>);

impl Out {
    fn new() -> Self {
        Out(Vec::with_capacity(128))
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// Write one reply: out-header plus payload pieces, in a single `writev`.
fn reply(fd: RawFd, unique: u64, error: i32, payload: &[&[u8]]) {
    let len = OUT_HEADER + payload.iter().map(|p| p.len()).sum::<usize>();
    let mut hdr = [0u8; OUT_HEADER];
    hdr[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    hdr[4..8].copy_from_slice(&(-error).to_ne_bytes());
    hdr[8..16].copy_from_slice(&unique.to_ne_bytes());
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 3];
    iov[0] = libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: OUT_HEADER,
    };
    let mut n = 1;
    for p in payload.iter().filter(|p| !p.is_empty()).take(2) {
        iov[n] = libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        };
        n += 1;
    }
    // SAFETY: every iovec points into a buffer that lives until writev returns; the kernel
    // only reads from them.
    let rc = unsafe { libc::writev(fd, iov.as_ptr(), n as libc::c_int) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // ENOENT: the request was interrupted and the kernel no longer waits for it.
        // ENODEV: the connection is gone; the next read ends the thread.
        if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) {
            eprintln!("dmkit: fuse: cannot send reply to request {unique}: {e}");
        }
    }
}

fn serve(shared: Arc<Shared>, fd: Arc<OwnedFd>, idx: usize) {
    let raw = fd.as_raw_fd();
    let lbs = shared.device.logical_block_size().max(1) as usize;
    let mut head = [0u8; HEAD];
    // The kernel refuses reads into buffers smaller than header + write_in + max_write.
    let mut req = AlignedBuf::new(MAX_WRITE + PAGE);
    let mut io = AlignedBuf::new(MAX_WRITE + 2 * lbs.max(PAGE));
    let mut args: Vec<u8> = Vec::with_capacity(MAX_ARGS);
    let ctr = &shared.counters[idx];
    loop {
        let data = req.all();
        let iov = [
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: HEAD,
            },
            libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
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
        ctr.requests.fetch_add(1, Ordering::Relaxed);
        if opcode == FUSE_WRITE {
            if n < HEAD {
                reply(raw, unique, libc::EINVAL, &[]);
                continue;
            }
            let offset = ne_u64(&head, IN_HEADER + 8);
            let size = ne_u32(&head, IN_HEADER + 16) as usize;
            if n != HEAD + size {
                reply(raw, unique, libc::EINVAL, &[]);
                continue;
            }
            let data = &req.all()[..size];
            match shared.write(data, offset, &mut io) {
                Ok(done) => {
                    ctr.bytes_written.fetch_add(done as u64, Ordering::Relaxed);
                    let mut o = Out::new();
                    o.u32(done as u32).u32(0);
                    reply(raw, unique, 0, &[&o.0]);
                }
                Err(e) => reply(raw, unique, shared.fail(ctr, e), &[]),
            }
            continue;
        }
        // Every other request we handle is small: gather its arguments contiguously.
        args.clear();
        args.extend_from_slice(&head[IN_HEADER..n.min(HEAD)]);
        if n > HEAD {
            let rest = (n - HEAD).min(MAX_ARGS);
            args.extend_from_slice(&req.all()[..rest]);
        }
        match opcode {
            FUSE_READ => {
                if args.len() < 24 {
                    reply(raw, unique, libc::EINVAL, &[]);
                    continue;
                }
                let offset = ne_u64(&args, 8);
                let size = ne_u32(&args, 16) as usize;
                match shared.read(offset, size, &mut io) {
                    Ok((start, len)) => {
                        ctr.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
                        let data = &io.all()[start..start + len];
                        reply(raw, unique, 0, &[data]);
                    }
                    Err(e) => reply(raw, unique, shared.fail(ctr, e), &[]),
                }
            }
            FUSE_INIT => shared.init(raw, unique, &args),
            FUSE_GETATTR => reply(raw, unique, 0, &[&shared.attr_out()]),
            FUSE_SETATTR => {
                if args.len() < 24 {
                    reply(raw, unique, libc::EINVAL, &[]);
                    continue;
                }
                let valid = ne_u32(&args, 0);
                let size = ne_u64(&args, 16);
                // The file is a device: its size is fixed. Mode, owner and time changes are
                // accepted and ignored, like on a block device node that is recreated.
                if valid & FATTR_SIZE != 0 && size != shared.device.size() {
                    reply(raw, unique, libc::EINVAL, &[]);
                } else {
                    reply(raw, unique, 0, &[&shared.attr_out()]);
                }
            }
            FUSE_OPEN => {
                let flags = if args.len() >= 4 { ne_u32(&args, 0) } else { 0 };
                let acc = flags as i32 & libc::O_ACCMODE;
                if shared.device.read_only() && acc != libc::O_RDONLY {
                    reply(raw, unique, libc::EROFS, &[]);
                    continue;
                }
                let mut open_flags = 0;
                if shared.device.read_only() {
                    // Nothing can change the contents: keep the page cache across opens.
                    open_flags |= FOPEN_KEEP_CACHE;
                }
                let minor = shared.minor.load(Ordering::Relaxed);
                if minor >= 35 {
                    // FLUSH would be a no-op: writes are already on the device.
                    open_flags |= FOPEN_NOFLUSH;
                }
                if minor >= 36 {
                    open_flags |= FOPEN_PARALLEL_DIRECT_WRITES;
                }
                let mut o = Out::new();
                o.u64(0).u32(open_flags).u32(0);
                reply(raw, unique, 0, &[&o.0]);
            }
            FUSE_RELEASE | FUSE_FLUSH => reply(raw, unique, 0, &[]),
            FUSE_FSYNC => match shared.device.flush() {
                Ok(()) => reply(raw, unique, 0, &[]),
                Err(e) => reply(raw, unique, shared.fail(ctr, e), &[]),
            },
            FUSE_STATFS => {
                let size = shared.device.size();
                let bsize = shared.blksize();
                let mut o = Out::new();
                o.u64(size / bsize as u64) // blocks
                    .u64(0) // bfree
                    .u64(0) // bavail
                    .u64(1) // files
                    .u64(0) // ffree
                    .u32(bsize)
                    .u32(255) // namelen
                    .u32(bsize) // frsize
                    .u32(0)
                    .zeros(24);
                reply(raw, unique, 0, &[&o.0]);
            }
            FUSE_FALLOCATE => {
                if args.len() < 28 {
                    reply(raw, unique, libc::EINVAL, &[]);
                    continue;
                }
                let offset = ne_u64(&args, 8);
                let length = ne_u64(&args, 16);
                let mode = ne_u32(&args, 24) as i32;
                match shared.fallocate(offset, length, mode, &mut io) {
                    Ok(()) => reply(raw, unique, 0, &[]),
                    Err(Errno(e)) => reply(raw, unique, e, &[]),
                }
            }
            FUSE_LSEEK => {
                if args.len() < 20 {
                    reply(raw, unique, libc::EINVAL, &[]);
                    continue;
                }
                let offset = ne_u64(&args, 8);
                let whence = ne_u32(&args, 16) as i32;
                let size = shared.device.size();
                // No holes in a device: all data up to the end, one hole at the end.
                let r = match whence {
                    libc::SEEK_DATA if offset < size => Ok(offset),
                    libc::SEEK_HOLE if offset < size => Ok(size),
                    libc::SEEK_DATA | libc::SEEK_HOLE => Err(libc::ENXIO),
                    _ => Err(libc::EINVAL),
                };
                match r {
                    Ok(off) => reply(raw, unique, 0, &[&off.to_ne_bytes()]),
                    Err(e) => reply(raw, unique, e, &[]),
                }
            }
            // No reply expected: interrupts are ignored (every request finishes quickly).
            FUSE_INTERRUPT | FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_NOTIFY_REPLY => {}
            FUSE_DESTROY => reply(raw, unique, 0, &[]),
            _ => reply(raw, unique, libc::ENOSYS, &[]),
        }
    }
    if shared.live_threads.fetch_sub(1, Ordering::SeqCst) == 1 {
        let _g = shared.exited.0.lock().unwrap_or_else(|e| e.into_inner());
        shared.exited.1.notify_all();
    }
}

/// A negative reply code, already an errno.
struct Errno(i32);

fn round_down(v: u64, a: u64) -> u64 {
    v / a * a
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Shared {
    fn blksize(&self) -> u32 {
        self.device.logical_block_size().max(PAGE as u32)
    }

    /// Count and log a device error; returns the errno for the reply.
    fn fail(&self, ctr: &Counters, e: BlockError) -> i32 {
        if let BlockError::Corrupt { .. } = e {
            ctr.corruptions.fetch_add(1, Ordering::Relaxed);
            eprintln!("dmkit: {e}");
        } else {
            ctr.io_errors.fetch_add(1, Ordering::Relaxed);
            let n = self.logged_errors.fetch_add(1, Ordering::Relaxed);
            if n < MAX_LOGGED_ERRORS {
                eprintln!("dmkit: {e}");
            } else if n == MAX_LOGGED_ERRORS {
                eprintln!("dmkit: further I/O errors are only counted");
            }
        }
        e.errno()
    }

    fn init(&self, fd: RawFd, unique: u64, args: &[u8]) {
        if args.len() < 16 {
            reply(fd, unique, libc::EINVAL, &[]);
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
            reply(fd, unique, 0, &[&o.0]);
            return;
        }
        let mut g = self.init.lock().unwrap_or_else(|e| e.into_inner());
        if major < KERNEL_MAJOR || minor < 28 {
            let m = format!("kernel FUSE protocol {major}.{minor} is too old (need 7.28)");
            eprintln!("dmkit: {m}");
            reply(fd, unique, libc::EPROTO, &[]);
            *g = Some(Err(m));
            self.init_cv.notify_all();
            return;
        }
        let minor = minor.min(KERNEL_MINOR);
        let want = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_ASYNC_DIO | FUSE_MAX_PAGES;
        let mut o = Out::new();
        o.u32(KERNEL_MAJOR)
            .u32(minor)
            .u32(max_readahead)
            .u32(flags & want)
            .u16(MAX_BACKGROUND)
            .u16(CONGESTION_THRESHOLD)
            .u32(MAX_WRITE as u32)
            .u32(1) // time_gran
            .u16(MAX_PAGES)
            .u16(0) // map_alignment
            .u32(0) // flags2
            .u32(0) // max_stack_depth
            .zeros(24); // request_timeout + unused
        self.minor.store(minor, Ordering::Relaxed);
        reply(fd, unique, 0, &[&o.0]);
        *g = Some(Ok(minor));
        self.init_cv.notify_all();
    }

    fn attr_out(&self) -> Vec<u8> {
        let size = self.device.size();
        let mode = libc::S_IFREG
            | if self.device.read_only() {
                0o400
            } else {
                0o600
            };
        let mut o = Out::new();
        o.u64(ATTR_VALID_SECS)
            .u32(0)
            .u32(0)
            .u64(1) // ino
            .u64(size)
            .u64(size.div_ceil(512))
            .u64(self.mtime) // atime
            .u64(self.mtime) // mtime
            .u64(self.mtime) // ctime
            .u32(0)
            .u32(0)
            .u32(0)
            .u32(mode)
            .u32(1) // nlink
            .u32(self.uid)
            .u32(self.gid)
            .u32(0) // rdev
            .u32(self.blksize())
            .u32(0); // flags
        o.0
    }

    /// Read `[offset, offset + size)` clamped at the end of the device into `io`; returns where
    /// the requested bytes start in `io` and how many there are.
    fn read(
        &self,
        offset: u64,
        size: usize,
        io: &mut AlignedBuf,
    ) -> Result<(usize, usize), BlockError> {
        let dev_size = self.device.size();
        if offset >= dev_size || size == 0 {
            return Ok((0, 0));
        }
        // Like a regular file: a read across the end is short.
        let len = (size as u64).min(dev_size - offset);
        let lbs = self.device.logical_block_size().max(1) as u64;
        // The device may only accept whole blocks: read the enclosing aligned range and reply
        // from the middle of it (no extra copy either way).
        let start = round_down(offset, lbs);
        let end = round_up(offset + len, lbs).min(dev_size);
        let buf = io.get((end - start) as usize);
        self.device.read_at(buf, start)?;
        Ok(((offset - start) as usize, len as usize))
    }

    /// Write `data` at `offset`, clamped at the end of the device; returns the bytes written.
    fn write(&self, data: &[u8], offset: u64, io: &mut AlignedBuf) -> Result<usize, BlockError> {
        if self.device.read_only() {
            return Err(BlockError::ReadOnly {
                device: self.device.name().to_string(),
            });
        }
        let dev_size = self.device.size();
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= dev_size {
            // A device cannot grow: like writing past the end of a block device.
            return Err(BlockError::Io {
                device: self.device.name().to_string(),
                offset,
                source: io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        let len = (data.len() as u64).min(dev_size - offset) as usize;
        self.write_range(&data[..len], offset, io)?;
        Ok(len)
    }

    fn write_range(&self, data: &[u8], offset: u64, io: &mut AlignedBuf) -> Result<(), BlockError> {
        let lbs = self.device.logical_block_size().max(1) as u64;
        let end = offset + data.len() as u64;
        let dev_size = self.device.size();
        if offset.is_multiple_of(lbs) && (end.is_multiple_of(lbs) || end == dev_size) {
            let _g = self.rmw.read().unwrap_or_else(|e| e.into_inner());
            return self.device.write_at(data, offset);
        }
        // Partial first or last block: read-modify-write the enclosing aligned range, alone.
        let _g = self.rmw.write().unwrap_or_else(|e| e.into_inner());
        let start = round_down(offset, lbs);
        let aend = round_up(end, lbs).min(dev_size);
        let buf = io.get((aend - start) as usize);
        let first = (lbs as usize).min(buf.len());
        self.device.read_at(&mut buf[..first], start)?;
        let last_start = round_down(end.min(aend - 1), lbs).max(start);
        if last_start > start {
            let at = (last_start - start) as usize;
            self.device.read_at(&mut buf[at..], last_start)?;
        }
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        self.device.write_at(buf, start)
    }

    fn fallocate(
        &self,
        offset: u64,
        length: u64,
        mode: i32,
        io: &mut AlignedBuf,
    ) -> Result<(), Errno> {
        let dev_size = self.device.size();
        let end = offset.checked_add(length).ok_or(Errno(libc::EINVAL))?;
        match mode {
            // Allocation: every byte of a device already exists.
            0 | libc::FALLOC_FL_KEEP_SIZE => {
                if end <= dev_size || mode == libc::FALLOC_FL_KEEP_SIZE {
                    Ok(())
                } else {
                    Err(Errno(libc::ENOSPC))
                }
            }
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                if !self.allow_discards {
                    return Err(Errno(libc::EOPNOTSUPP));
                }
                if self.device.read_only() {
                    return Err(Errno(libc::EROFS));
                }
                let end = end.min(dev_size);
                if offset >= end {
                    return Ok(());
                }
                let lbs = self.device.logical_block_size().max(1) as u64;
                let inner_start = round_up(offset, lbs);
                let inner_end = round_down(end, lbs).max(inner_start);
                let ctr = &self.counters[0];
                // Partial blocks at the edges are zeroed, so the range reads back as zeros
                // like a punched hole.
                let zero = |from: u64, to: u64, io: &mut AlignedBuf| -> Result<(), Errno> {
                    if to > from {
                        let z = vec![0u8; (to - from) as usize];
                        self.write_range(&z, from, io)
                            .map_err(|e| Errno(self.fail(ctr, e)))?;
                    }
                    Ok(())
                };
                if inner_end > inner_start {
                    zero(offset, inner_start, io)?;
                    self.device
                        .discard(inner_start, inner_end - inner_start)
                        .map_err(|e| Errno(self.fail(ctr, e)))?;
                    zero(inner_end, end, io)
                } else {
                    zero(offset, end, io)
                }
            }
            _ => Err(Errno(libc::EOPNOTSUPP)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    /// A device that only accepts whole 4 KiB blocks, to exercise the unaligned paths.
    struct Strict(MemoryDevice);

    impl BlockDevice for Strict {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn logical_block_size(&self) -> u32 {
            4096
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> crate::block::Result<()> {
            assert_eq!(offset % 4096, 0);
            assert!(buf.len().is_multiple_of(4096) || offset + buf.len() as u64 == self.size());
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> crate::block::Result<()> {
            assert_eq!(offset % 4096, 0);
            assert!(buf.len().is_multiple_of(4096) || offset + buf.len() as u64 == self.size());
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> crate::block::Result<()> {
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> crate::block::Result<()> {
            assert_eq!(offset % 4096, 0);
            assert_eq!(len % 4096, 0);
            self.0.discard(offset, len)
        }
    }

    fn shared(size: usize) -> Shared {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        Shared {
            device: Arc::new(Strict(MemoryDevice::from_vec("strict", data))),
            allow_discards: true,
            counters: vec![Counters::default()],
            init: Mutex::new(None),
            init_cv: Condvar::new(),
            minor: AtomicU32::new(0),
            rmw: RwLock::new(()),
            logged_errors: AtomicU64::new(0),
            live_threads: AtomicUsize::new(0),
            exited: (Mutex::new(()), Condvar::new()),
            mtime: 0,
            uid: 0,
            gid: 0,
        }
    }

    fn expect(size: usize) -> Vec<u8> {
        (0..size).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn unaligned_reads_and_eof() {
        let size = 3 * 4096 + 100;
        let sh = shared(size);
        let want = expect(size);
        let mut io = AlignedBuf::new(MAX_WRITE);
        for &(off, len) in &[
            (0, 4096),
            (1, 10),
            (4000, 200),
            (4096 * 3, 500),
            (100, 20000),
        ] {
            let (s, n) = sh.read(off as u64, len, &mut io).unwrap();
            let end = (off + len).min(size);
            assert_eq!(&io.all()[s..s + n], &want[off..end], "read {off}+{len}");
        }
        assert_eq!(sh.read(size as u64, 10, &mut io).unwrap().1, 0);
    }

    #[test]
    fn unaligned_writes_keep_neighbours() {
        let size = 4 * 4096;
        let sh = shared(size);
        let mut want = expect(size);
        let mut io = AlignedBuf::new(MAX_WRITE);
        for &(off, len) in &[(10usize, 5usize), (4090, 12), (4096, 4096), (5000, 9000)] {
            let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ 0x5a).collect();
            assert_eq!(sh.write(&data, off as u64, &mut io).unwrap(), len);
            want[off..off + len].copy_from_slice(&data);
        }
        // Across the end: short write; at the end: ENOSPC.
        assert_eq!(sh.write(&[1; 100], size as u64 - 10, &mut io).unwrap(), 10);
        want[size - 10..].fill(1);
        assert!(sh.write(&[1; 10], size as u64, &mut io).is_err());
        let (s, n) = sh.read(0, size, &mut io).unwrap();
        assert_eq!(&io.all()[s..s + n], &want[..]);
    }

    #[test]
    fn punch_hole_zeroes_edges_and_discards_middle() {
        let size = 4 * 4096;
        let sh = shared(size);
        let mut want = expect(size);
        let mut io = AlignedBuf::new(MAX_WRITE);
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert!(sh.fallocate(100, 10000, mode, &mut io).is_ok());
        want[100..10100].fill(0);
        let (s, n) = sh.read(0, size, &mut io).unwrap();
        assert_eq!(&io.all()[s..s + n], &want[..]);
        assert!(matches!(
            sh.fallocate(0, 1, libc::FALLOC_FL_ZERO_RANGE, &mut io),
            Err(Errno(libc::EOPNOTSUPP))
        ));
    }
}
