//! The lifecycle behind `open`, `close` and `status`: a background server per open device.
//!
//! Layout of the runtime directory (`$DMKIT_RUN_DIR`, default `/run/dmkit`):
//!
//! ```text
//! $RUN_DIR/NAME                 the exported device: an empty regular file, FUSE-mounted over
//! $RUN_DIR/.dmkit/NAME.json     state: pid, kind, path, loop device, details, start time
//! $RUN_DIR/.dmkit/NAME.sock     control socket: one command per connection, "status" or "close"
//! $RUN_DIR/.dmkit/NAME.log      the server's stdout/stderr (kept after close, for post-mortems)
//! $RUN_DIR/.dmkit/NAME.lock     flock'ed by the server for its whole life: the liveness test
//! ```
//!
//! Liveness is an `flock` rather than a pid check: the lock is released by the kernel the
//! moment the server dies, however it dies, and pids get reused.

use super::fuse::{unmount_path, ExportStats, FuseExport, FuseOptions, DEFAULT_THREADS};
use super::loopdev::{self, LoopDevice};
use crate::block::BlockDevice;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Default runtime directory.
pub const DEFAULT_RUN_DIR: &str = "/run/dmkit";
/// Environment variable overriding the runtime directory.
pub const RUN_DIR_ENV: &str = "DMKIT_RUN_DIR";
/// How long `close` waits for the server to exit before killing it.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// Errors of the export lifecycle. [`ExportError::exit_code`] gives cryptsetup's exit code.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The device name cannot be used.
    #[error("invalid device name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Wrong parameters.
    #[error("{0}")]
    Invalid(String),
    /// The name is already open (or being opened).
    #[error("device {name} is busy: {reason}")]
    Busy {
        /// The device name.
        name: String,
        /// Why ("already open at /run/dmkit/NAME (pid 123)", ...).
        reason: String,
    },
    /// No device of that name is open.
    #[error("device {name} is not active")]
    NotOpen {
        /// The device name.
        name: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the file.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The server failed (to start, or to stop cleanly); the message says why.
    #[error("{0}")]
    Failed(String),
}

impl ExportError {
    /// cryptsetup's exit code for this error: 5 busy, 4 not open, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExportError::Busy { .. } => 5,
            ExportError::NotOpen { .. } => 4,
            _ => 1,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ExportError::Busy { .. } => "busy",
            ExportError::NotOpen { .. } => "not-open",
            ExportError::InvalidName { .. } | ExportError::Invalid(_) => "invalid",
            ExportError::Io { .. } | ExportError::Failed(_) => "failed",
        }
    }
}

type Result<T> = std::result::Result<T, ExportError>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ExportError {
    let what = what.into();
    move |source| ExportError::Io { what, source }
}

/// Live counters of a layer, shown by `status` (called on the server's control thread).
pub type StatsFn = Arc<dyn Fn() -> Value + Send + Sync>;

/// What to export and how.
pub struct ExportSpec {
    /// Device name: the file is `$RUN_DIR/NAME`.
    pub name: String,
    /// The top of the stack to serve.
    pub device: Arc<dyn BlockDevice>,
    /// The kind of device ("verity", "linear", "crypt", ...), shown by `status`.
    pub kind: String,
    /// Also attach a loop device (`/dev/loopN`) to the exported file.
    pub loop_device: bool,
    /// Ask for direct I/O on the loop device (`LO_FLAGS_DIRECT_IO`); silently off when refused.
    pub direct_io_loop: bool,
    /// Honour discards (`fallocate(PUNCH_HOLE)` on the file, or discards on the loop device).
    pub allow_discards: bool,
    /// Serving threads (0 means the default, 4).
    pub threads: usize,
    /// Static facts shown by `status` (backing paths, root hash, options).
    pub details: Value,
    /// Live counters shown by `status`.
    pub stats: Option<StatsFn>,
}

/// A device that is open and served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The device name.
    pub name: String,
    /// The exported file, `$RUN_DIR/NAME`.
    pub path: PathBuf,
    /// The loop device, when one was asked for.
    pub loop_device: Option<PathBuf>,
    /// The server's pid.
    pub pid: u32,
}

/// The state file, `$RUN_DIR/.dmkit/NAME.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    name: String,
    kind: String,
    pid: u32,
    path: PathBuf,
    loop_device: Option<PathBuf>,
    #[serde(default)]
    loop_direct_io: bool,
    size: u64,
    read_only: bool,
    allow_discards: bool,
    threads: usize,
    started: u64,
    log: PathBuf,
    details: Value,
}

/// The runtime directory: `$DMKIT_RUN_DIR`, or `/run/dmkit`.
pub fn run_dir() -> PathBuf {
    match std::env::var_os(RUN_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_RUN_DIR),
    }
}

/// Check a device name: non-empty, at most 127 bytes, no '/', no leading '.', no NUL.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(ExportError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 127 {
        return bad("it is longer than 127 bytes");
    }
    if name.contains('/') {
        return bad("it contains '/'");
    }
    if name.starts_with('.') {
        return bad("it starts with '.'");
    }
    if name.contains('\0') {
        return bad("it contains a NUL byte");
    }
    Ok(())
}

/// Where a name's files live.
struct Paths {
    name: String,
    dev: PathBuf,
    state: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    lock: PathBuf,
    private: PathBuf,
}

impl Paths {
    /// `create`: make the directories (for opening); otherwise only resolve them.
    fn new(name: &str, create: bool) -> Result<Paths> {
        validate_name(name)?;
        let run = run_dir();
        let private = run.join(".dmkit");
        if create {
            fs::create_dir_all(&run)
                .map_err(io_err(format!("{}: cannot create", run.display())))?;
            match fs::create_dir(&private) {
                Ok(()) => {
                    // The control sockets and logs are root's business only.
                    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).map_err(
                        io_err(format!("{}: cannot set permissions", private.display())),
                    )?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(format!("{}: cannot create", private.display()))(e)),
            }
        }
        // Mount points are compared with /proc/self/mountinfo, which shows resolved paths.
        let run = fs::canonicalize(&run).unwrap_or(run);
        let private = run.join(".dmkit");
        Ok(Paths {
            name: name.to_string(),
            dev: run.join(name),
            state: private.join(format!("{name}.json")),
            sock: private.join(format!("{name}.sock")),
            log: private.join(format!("{name}.log")),
            lock: private.join(format!("{name}.lock")),
            private,
        })
    }
}

/// An exclusive `flock` on `NAME.lock`, held by the server for its whole life.
struct NameLock {
    _file: File,
    path: PathBuf,
}

impl NameLock {
    /// Take the lock without waiting; `None` when someone holds it.
    fn try_take(path: &Path) -> Result<Option<NameLock>> {
        for _ in 0..100 {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(path)
                .map_err(io_err(format!("{}: cannot open", path.display())))?;
            // SAFETY: flock(2) on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Ok(None);
                }
                return Err(io_err(format!("{}: cannot lock", path.display()))(e));
            }
            // The previous holder removes the file before exiting: make sure we locked the file
            // that is at the path now, not one that was just unlinked.
            let ours = file.metadata().map(|m| (m.dev(), m.ino())).ok();
            let there = fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
            if ours.is_some() && ours == there {
                return Ok(Some(NameLock {
                    _file: file,
                    path: path.to_path_buf(),
                }));
            }
        }
        Err(ExportError::Failed(format!(
            "{}: cannot take the lock (it keeps being replaced)",
            path.display()
        )))
    }

    /// Whether a live process holds the lock at `path`.
    fn held(path: &Path) -> bool {
        let Ok(file) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
        else {
            return false;
        };
        // SAFETY: flock(2) on a descriptor we own; closing it right after releases the shared
        // lock if we got it.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
    }

    /// Remove the lock file while still holding the lock, then release it.
    fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn read_state(p: &Paths) -> Option<State> {
    let text = fs::read_to_string(&p.state).ok()?;
    serde_json::from_str(&text).ok()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Unescape a path field of /proc/self/mountinfo (`\040` for space, etc.).
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Whether something is mounted at `path` (compared as given: pass a resolved path).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.as_os_str().as_bytes();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| unescape_mountinfo(mp) == want)
}

/// Every loop device whose backing file is `file`.
fn loops_backed_by(file: &Path) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("loop"))
        .map(|n| PathBuf::from(format!("/dev/{n}")))
        .filter(|d| loopdev::backing_file(d).as_deref() == Some(file))
        .collect()
}

/// Remove what a dead server left behind: loop devices on its file, the mount, the files.
/// The caller holds the name's lock, so no server is running.
fn cleanup_stale(p: &Paths) -> Result<()> {
    let mut errors = Vec::new();
    for dev in loops_backed_by(&p.dev) {
        if let Err(e) = loopdev::detach(&dev) {
            errors.push(e.to_string());
        }
    }
    for _ in 0..8 {
        if !is_mounted(&p.dev) {
            break;
        }
        if let Err(e) = unmount_path(&p.dev, 0) {
            errors.push(e.to_string());
            break;
        }
    }
    for f in [&p.sock, &p.state] {
        if let Err(e) = fs::remove_file(f) {
            if e.kind() != io::ErrorKind::NotFound {
                errors.push(format!("{}: cannot remove: {e}", f.display()));
            }
        }
    }
    if !is_mounted(&p.dev) {
        if let Err(e) = fs::remove_file(&p.dev) {
            if e.kind() != io::ErrorKind::NotFound {
                errors.push(format!("{}: cannot remove: {e}", p.dev.display()));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ExportError::Failed(format!(
            "cannot clean up after the dead server of {}: {}",
            p.name,
            errors.join("; ")
        )))
    }
}

fn busy(p: &Paths) -> ExportError {
    let reason = match read_state(p) {
        Some(s) => format!(
            "already open at {} (pid {}); close it first with `dmkit close {}`",
            s.path.display(),
            s.pid,
            p.name
        ),
        None => "it is being opened by another process".to_string(),
    };
    ExportError::Busy {
        name: p.name.clone(),
        reason,
    }
}

/// Fail with [`ExportError::Busy`] if `name` is open; clean up what a dead server of that name
/// left behind (mount, loop device, files).
pub fn ensure_not_open(name: &str) -> Result<()> {
    let p = Paths::new(name, true)?;
    let lock = NameLock::try_take(&p.lock)?.ok_or_else(|| busy(&p))?;
    cleanup_stale(&p)?;
    lock.remove();
    Ok(())
}

fn threads_of(spec: &ExportSpec) -> Result<usize> {
    match spec.threads {
        0 => Ok(DEFAULT_THREADS),
        n @ 1..=256 => Ok(n),
        n => Err(ExportError::Invalid(format!(
            "threads: {n} is out of range (1 to 256)"
        ))),
    }
}

fn thread_count() -> usize {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(1)
}

/// Open `spec.name`: fork a background server, wait until it serves, return where.
///
/// **Call this before the process has spawned any thread** (rayon pools included): it forks,
/// and the child continues without exec, so a thread holding a lock at fork time would leave
/// that lock held forever in the server. Returns an error if other threads exist. Every
/// descriptor open in the caller stays open in the server.
///
/// The server detaches (double fork, `setsid`), sends its output to `NAME.log`, mounts the
/// FUSE export, starts its threads, attaches the loop device if asked, writes `NAME.json`,
/// opens the control socket and only then reports ready. On failure it reports the error
/// and leaves nothing behind.
pub fn open(spec: ExportSpec) -> Result<Opened> {
    threads_of(&spec)?;
    let p = Paths::new(&spec.name, true)?;
    let n = thread_count();
    if n > 1 {
        return Err(ExportError::Failed(format!(
            "open {}: the process already runs {n} threads; open must be called before any \
             thread is spawned (or use serve_foreground)",
            spec.name
        )));
    }
    let lock = NameLock::try_take(&p.lock)?.ok_or_else(|| busy(&p))?;
    cleanup_stale(&p)?;
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io_err("cannot create a pipe")(io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned here only.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fork(2); the process is single-threaded (checked above), so the child may run
    // arbitrary code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io_err("cannot fork the server")(io::Error::last_os_error()));
    }
    if child == 0 {
        drop(rd);
        // SAFETY: setsid(2) in a fresh child, which cannot be a process group leader.
        unsafe { libc::setsid() };
        // Fork again so the server is not a session leader (it can never get a controlling
        // terminal) and is reparented to init: nobody has to reap it.
        // SAFETY: fork(2), still single-threaded.
        match unsafe { libc::fork() } {
            0 => server_main(spec, p, lock, wr),
            // SAFETY: _exit(2) skips atexit handlers and stdio flushing, which belong to the
            // parent.
            _ => unsafe { libc::_exit(0) },
        }
    }
    drop(wr);
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child (the intermediate one, which exits at once).
    unsafe { libc::waitpid(child, &mut status, 0) };
    let mut msg = String::new();
    let read = File::from(rd).read_to_string(&mut msg);
    drop(lock);
    let line = msg.lines().next().unwrap_or("");
    let reply: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(_) => {
            let why = read.err().map(|e| format!(": {e}")).unwrap_or_default();
            return Err(ExportError::Failed(format!(
                "the server of {} exited during startup{why} (see {})",
                p.name,
                p.log.display()
            )));
        }
    };
    if reply["ok"].as_bool() == Some(true) {
        return Ok(Opened {
            name: p.name.clone(),
            path: p.dev.clone(),
            loop_device: reply["loop"].as_str().map(PathBuf::from),
            pid: reply["pid"].as_u64().unwrap_or(0) as u32,
        });
    }
    let m = reply["error"]
        .as_str()
        .unwrap_or("unknown error")
        .to_string();
    Err(match reply["kind"].as_str() {
        Some("busy") => ExportError::Busy {
            name: p.name.clone(),
            reason: m,
        },
        Some("invalid") => ExportError::Invalid(m),
        _ => ExportError::Failed(m),
    })
}

/// The body of the forked server; never returns.
fn server_main(spec: ExportSpec, p: Paths, lock: NameLock, wr: OwnedFd) -> ! {
    redirect_stdio(&p.log);
    let mut wr = File::from(wr);
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    match Server::start(spec, p, lock, pid) {
        Err(e) => {
            eprintln!("dmkit: {e}");
            let msg = json!({"ok": false, "error": e.to_string(), "kind": e.kind()});
            let _ = writeln!(wr, "{msg}");
            drop(wr);
            std::process::exit(1);
        }
        Ok(mut server) => {
            let msg = json!({"ok": true, "pid": pid, "loop": server.state.loop_device});
            let _ = writeln!(wr, "{msg}");
            drop(wr);
            let closer = server.run();
            let result = server.teardown();
            finish_close(closer, &result);
            let code = if result.is_ok() { 0 } else { 1 };
            let _ = io::stderr().flush();
            std::process::exit(code);
        }
    }
}

/// stdin from /dev/null, stdout and stderr to the log (best effort: /dev/null if it fails).
fn redirect_stdio(log: &Path) {
    let null = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let out = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(log);
    if let Ok(n) = &null {
        // SAFETY: dup2(2) onto the standard descriptors, with valid source descriptors.
        unsafe { libc::dup2(n.as_raw_fd(), 0) };
    }
    if let Some(f) = out.as_ref().ok().or(null.as_ref().ok()) {
        // SAFETY: as above.
        unsafe {
            libc::dup2(f.as_raw_fd(), 1);
            libc::dup2(f.as_raw_fd(), 2);
        }
    }
}

/// Serve `spec` in this process until SIGTERM, SIGINT or `dmkit close NAME`.
pub fn serve_foreground(spec: ExportSpec) -> Result<()> {
    serve_foreground_with(spec, |_| {})
}

/// [`serve_foreground`], calling `on_ready` once the device is served (to print its path).
///
/// Call it before spawning threads too: SIGTERM and SIGINT are blocked in the calling thread
/// and read through a signalfd, so a thread spawned earlier would still take the default
/// action (death) for them.
pub fn serve_foreground_with(spec: ExportSpec, on_ready: impl FnOnce(&Opened)) -> Result<()> {
    threads_of(&spec)?;
    let p = Paths::new(&spec.name, true)?;
    let lock = NameLock::try_take(&p.lock)?.ok_or_else(|| busy(&p))?;
    cleanup_stale(&p)?;
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let mut server = Server::start(spec, p, lock, pid)?;
    on_ready(&Opened {
        name: server.state.name.clone(),
        path: server.state.path.clone(),
        loop_device: server.state.loop_device.clone(),
        pid,
    });
    let closer = server.run();
    let result = server.teardown();
    finish_close(closer, &result);
    result
}

fn finish_close(closer: Option<UnixStream>, result: &Result<()>) {
    if let Some(mut s) = closer {
        let reply = match result {
            Ok(()) => json!({"ok": true}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        };
        let _ = writeln!(s, "{reply}");
    }
    match result {
        Ok(()) => eprintln!("dmkit: closed"),
        Err(e) => eprintln!("dmkit: close: {e}"),
    }
}

struct Server {
    paths: Paths,
    lock: Option<NameLock>,
    fuse: Option<FuseExport>,
    loop_dev: Option<LoopDevice>,
    listener: Option<UnixListener>,
    sigfd: Option<OwnedFd>,
    old_mask: libc::sigset_t,
    stats: Option<StatsFn>,
    state: State,
    want_loop: bool,
    want_direct_io: bool,
}

impl Server {
    /// Set everything up; on failure, undo what was done and return the error.
    fn start(spec: ExportSpec, paths: Paths, lock: NameLock, pid: u32) -> Result<Server> {
        let threads = threads_of(&spec)?;
        let device = spec.device;
        // SAFETY: sigset_t is plain data; sigemptyset initializes it right away.
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut server = Server {
            state: State {
                name: spec.name.clone(),
                kind: spec.kind,
                pid,
                path: paths.dev.clone(),
                loop_device: None,
                loop_direct_io: false,
                size: device.size(),
                read_only: device.read_only(),
                allow_discards: spec.allow_discards,
                threads,
                started: now_secs(),
                log: paths.log.clone(),
                details: spec.details,
            },
            paths,
            lock: Some(lock),
            fuse: None,
            loop_dev: None,
            listener: None,
            sigfd: None,
            old_mask,
            stats: spec.stats,
            want_loop: spec.loop_device,
            want_direct_io: spec.direct_io_loop,
        };
        // Signals are taken through a signalfd in the control loop; block them before any
        // serving thread exists so that every thread inherits the mask.
        // SAFETY: signal set manipulation on local sigset_t values; pthread_sigmask and
        // signalfd with valid pointers.
        let sigfd = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
            libc::signalfd(-1, &set, libc::SFD_CLOEXEC)
        };
        server.old_mask = old_mask;
        if sigfd < 0 {
            let e = io_err("cannot create a signalfd")(io::Error::last_os_error());
            let _ = server.teardown();
            return Err(e);
        }
        // SAFETY: a fresh descriptor owned only here.
        server.sigfd = Some(unsafe { OwnedFd::from_raw_fd(sigfd) });
        if let Err(e) = server.setup(device, threads) {
            if let Err(t) = server.teardown() {
                eprintln!("dmkit: {t}");
            }
            return Err(e);
        }
        Ok(server)
    }

    fn setup(&mut self, device: Arc<dyn BlockDevice>, threads: usize) -> Result<()> {
        let dev = self.paths.dev.clone();
        match fs::symlink_metadata(&dev) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(ExportError::Failed(format!(
                    "{}: exists and is not a regular file",
                    dev.display()
                )))
            }
            Err(_) => {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&dev)
                    .map_err(io_err(format!("{}: cannot create", dev.display())))?;
            }
        }
        let lbs = device.logical_block_size();
        let read_only = device.read_only();
        let fuse = FuseExport::mount(
            &dev,
            device,
            FuseOptions {
                threads,
                allow_discards: self.state.allow_discards,
            },
        )
        .map_err(|e| ExportError::Failed(e.to_string()))?;
        eprintln!(
            "dmkit: {}: serving {} ({} bytes{}) at {} with {threads} threads, FUSE 7.{}",
            self.state.name,
            self.state.kind,
            self.state.size,
            if read_only { ", read-only" } else { "" },
            dev.display(),
            fuse.protocol_minor(),
        );
        self.fuse = Some(fuse);
        if self.want_loop {
            let l = loopdev::attach(&dev, read_only, self.want_direct_io, lbs)
                .map_err(|e| ExportError::Failed(e.to_string()))?;
            eprintln!(
                "dmkit: {}: attached {}{}",
                self.state.name,
                l.path.display(),
                if l.direct_io { " (direct I/O)" } else { "" }
            );
            self.state.loop_device = Some(l.path.clone());
            self.state.loop_direct_io = l.direct_io;
            self.loop_dev = Some(l);
        }
        self.write_state()?;
        let _ = fs::remove_file(&self.paths.sock);
        let listener = UnixListener::bind(&self.paths.sock).map_err(io_err(format!(
            "{}: cannot listen",
            self.paths.sock.display()
        )))?;
        self.listener = Some(listener);
        Ok(())
    }

    fn write_state(&self) -> Result<()> {
        let tmp = self
            .paths
            .private
            .join(format!("{}.json.tmp", self.state.name));
        let text = serde_json::to_string_pretty(&self.state)
            .map_err(|e| ExportError::Failed(format!("cannot encode the state: {e}")))?;
        fs::write(&tmp, text + "\n").map_err(io_err(format!("{}: cannot write", tmp.display())))?;
        fs::rename(&tmp, &self.paths.state).map_err(io_err(format!(
            "{}: cannot write",
            self.paths.state.display()
        )))
    }

    fn status_json(&self) -> Value {
        let mut v = serde_json::to_value(&self.state).unwrap_or_else(|_| json!({}));
        let export = self.fuse.as_ref().map(|f| f.stats()).unwrap_or_default();
        let stats = self.stats.as_ref().map(|f| f()).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("state".into(), json!("active"));
            m.insert(
                "uptime".into(),
                json!(now_secs().saturating_sub(self.state.started)),
            );
            m.insert("export".into(), export_json(&export));
            m.insert("stats".into(), stats);
        }
        v
    }

    /// Answer control requests until `close` (returned, to be answered after the teardown) or a
    /// signal.
    fn run(&mut self) -> Option<UnixStream> {
        let (Some(listener), Some(sigfd)) = (&self.listener, &self.sigfd) else {
            return None;
        };
        let (lfd, sfd) = (listener.as_raw_fd(), sigfd.as_raw_fd());
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: lfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: sfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll(2) on a two-element array that outlives the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                eprintln!("dmkit: control loop failed: {e}; shutting down");
                return None;
            }
            if fds[1].revents != 0 {
                let mut info = [0u8; 128];
                // SAFETY: reading one signalfd_siginfo (128 bytes) into a buffer of that size.
                unsafe { libc::read(sfd, info.as_mut_ptr().cast(), info.len()) };
                let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
                eprintln!("dmkit: signal {signo} received, shutting down");
                return None;
            }
            if fds[0].revents != 0 {
                let Ok((stream, _)) = listener.accept() else {
                    continue;
                };
                if let Some(closer) = self.handle(stream) {
                    return Some(closer);
                }
            }
        }
    }

    fn handle(&self, stream: UnixStream) -> Option<UnixStream> {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        let mut r = BufReader::new((&stream).take(4096));
        if r.read_line(&mut line).is_err() {
            return None;
        }
        drop(r);
        let mut stream = stream;
        match line.trim() {
            "status" => {
                let _ = writeln!(stream, "{}", self.status_json());
                None
            }
            "close" => {
                eprintln!("dmkit: close requested");
                Some(stream)
            }
            other => {
                let _ = writeln!(
                    stream,
                    "{}",
                    json!({"ok": false, "error": format!("unknown command {other:?}")})
                );
                None
            }
        }
    }

    /// Undo everything, in reverse order; idempotent. Removes the files (not the log).
    fn teardown(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        self.listener = None;
        let _ = fs::remove_file(&self.paths.sock);
        if let Some(l) = self.loop_dev.take() {
            if let Err(e) = loopdev::detach(&l.path) {
                errors.push(e.to_string());
            }
        }
        if let Some(mut f) = self.fuse.take() {
            match f.unmount(Duration::from_secs(5)) {
                Ok(true) => eprintln!(
                    "dmkit: {} was busy: detached lazily; open handles fail once the server exits",
                    self.paths.dev.display()
                ),
                Ok(false) => {}
                Err(e) => errors.push(e.to_string()),
            }
            let s = f.stats();
            eprintln!(
                "dmkit: served {} requests, {} bytes read, {} written, {} I/O errors, {} corruptions",
                s.requests, s.bytes_read, s.bytes_written, s.io_errors, s.corruptions
            );
        }
        let _ = fs::remove_file(&self.paths.state);
        if !is_mounted(&self.paths.dev) {
            if let Err(e) = fs::remove_file(&self.paths.dev) {
                if e.kind() != io::ErrorKind::NotFound {
                    errors.push(format!("{}: cannot remove: {e}", self.paths.dev.display()));
                }
            }
        }
        if let Some(l) = self.lock.take() {
            l.remove();
        }
        if self.sigfd.take().is_some() {
            // SAFETY: restoring the mask saved when the signals were blocked.
            unsafe {
                libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut())
            };
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ExportError::Failed(errors.join("; ")))
        }
    }
}

fn export_json(s: &ExportStats) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}

/// Send one control command to a server and read its one-line JSON answer.
fn request(sock: &Path, cmd: &str, timeout: Duration) -> io::Result<Value> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    writeln!(s, "{cmd}")?;
    let mut line = String::new();
    BufReader::new(s.take(1 << 20)).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: bad answer: {e}", sock.display()),
        )
    })
}

/// Whether `pid` still runs (a zombie counts as gone: it serves nothing).
fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks existence.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
        return io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name, which may itself contain ')'.
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while pid_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Close `name`: detach the loop device, unmount, stop the server, remove the files, and wait
/// until the server is gone (killing it after 10 s). A server that died is cleaned up after.
pub fn close(name: &str) -> Result<()> {
    let p = Paths::new(name, false)?;
    let state = read_state(&p);
    if NameLock::held(&p.lock) {
        let Some(st) = state else {
            return Err(busy(&p));
        };
        match request(&p.sock, "close", Duration::from_secs(60)) {
            Ok(v) if v["ok"].as_bool() == Some(true) => {}
            Ok(v) => {
                let m = v["error"].as_str().unwrap_or("unknown error").to_string();
                eprintln!("dmkit: {name}: the server reported: {m}");
            }
            // No answer: ask with a signal instead (the same clean shutdown).
            Err(_) => {
                // SAFETY: kill(2) on the pid recorded by the server.
                unsafe { libc::kill(st.pid as libc::pid_t, libc::SIGTERM) };
            }
        }
        if !wait_gone(st.pid, CLOSE_GRACE) {
            // SAFETY: kill(2) on the pid recorded by the server.
            unsafe { libc::kill(st.pid as libc::pid_t, libc::SIGKILL) };
            wait_gone(st.pid, Duration::from_secs(2));
        }
    } else if state.is_none() && !is_mounted(&p.dev) && loops_backed_by(&p.dev).is_empty() {
        return Err(ExportError::NotOpen {
            name: name.to_string(),
        });
    }
    // Whatever a dead or killed server left behind.
    if let Some(lock) = NameLock::try_take(&p.lock)? {
        let r = cleanup_stale(&p);
        lock.remove();
        r?;
    }
    Ok(())
}

/// What is open: one JSON object per device (all of them, or `name`). A live server answers
/// with its state, `"state": "active"`, its export counters and the layer's stats; a server
/// that died shows its last state with `"state": "dead"` (`close` cleans it up).
pub fn status(name: Option<&str>) -> Result<Vec<Value>> {
    let names: Vec<String> = match name {
        Some(n) => {
            validate_name(n)?;
            vec![n.to_string()]
        }
        None => {
            let dir = run_dir().join(".dmkit");
            let mut v: Vec<String> = match fs::read_dir(&dir) {
                Ok(d) => d
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let f = e.file_name();
                        let s = f.to_str()?;
                        let n = s.strip_suffix(".json")?;
                        validate_name(n).ok().map(|_| n.to_string())
                    })
                    .collect(),
                Err(_) => Vec::new(),
            };
            v.sort();
            v
        }
    };
    let mut out = Vec::new();
    for n in &names {
        let p = Paths::new(n, false)?;
        let state = read_state(&p);
        let live = NameLock::held(&p.lock);
        let mut base = match &state {
            Some(s) => serde_json::to_value(s).unwrap_or_else(|_| json!({})),
            None => json!({"name": n, "path": p.dev}),
        };
        if live {
            match request(&p.sock, "status", Duration::from_secs(10)) {
                Ok(v) => out.push(v),
                Err(e) => {
                    base["state"] = json!(if state.is_some() {
                        "unresponsive"
                    } else {
                        "starting"
                    });
                    base["error"] = json!(e.to_string());
                    out.push(base);
                }
            }
        } else if state.is_some() {
            base["state"] = json!("dead");
            out.push(base);
        } else if name.is_some() {
            return Err(ExportError::NotOpen { name: n.clone() });
        }
    }
    Ok(out)
}
