//! The I/O side of a benchmark: Ctrl-C handling, running subprocesses (fio, veritysetup, and
//! this very `dmkit` binary) with captured output and precise wall time, a scratch directory
//! that cleans up after itself, random data files, and export guards that always close.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::bench::BenchError;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // Second signal: the user insists. Only async-signal-safe calls here.
        unsafe { libc::_exit(130) };
    }
}

/// Ctrl-C (SIGINT), SIGTERM and SIGHUP, turned into a flag the benchmark checks between
/// steps, so it can stop its subprocesses and close its exports instead of dying with them
/// open. A second signal exits at once.
#[derive(Debug, Clone, Copy)]
pub struct Interrupt {
    armed: bool,
}

impl Interrupt {
    /// Install the signal handlers (process-wide) and return the handle to check.
    pub fn install() -> Interrupt {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only touches an atomic and calls _exit, both
            // async-signal-safe; sigaction is given a fully initialised struct.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
        Interrupt { armed: true }
    }

    /// A handle that never reports an interruption (for library use without handlers).
    pub fn none() -> Interrupt {
        Interrupt { armed: false }
    }

    /// Has a signal arrived?
    pub fn is_set(&self) -> bool {
        self.armed && INTERRUPTED.load(Ordering::SeqCst)
    }

    /// `Err(Interrupted)` once a signal has arrived.
    pub fn check(&self) -> Result<(), BenchError> {
        if self.is_set() {
            Err(BenchError::Interrupted)
        } else {
            Ok(())
        }
    }
}

/// The outcome of a finished subprocess.
#[derive(Debug)]
pub struct Captured {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything it wrote on stdout.
    pub stdout: String,
    /// Everything it wrote on stderr.
    pub stderr: String,
    /// Wall time from spawn to exit.
    pub elapsed: Duration,
    /// CPU time (user + system) of the process and the children it waited for: on a machine
    /// shared with other work this moves far less than the wall time.
    pub cpu: Duration,
}

static CAPTURE_SEQ: AtomicU64 = AtomicU64::new(0);

/// Run `cmd` to completion, stdin from /dev/null, stdout and stderr captured in files under
/// `scratch` (not pipes: a daemon that `open` leaves behind may keep them open forever).
/// The process is killed on interruption or after `timeout`. `elapsed` is measured by a
/// thread blocked in `wait`, so it is precise without busy polling.
pub fn run_captured(
    cmd: &mut Command,
    scratch: &Path,
    interrupt: &Interrupt,
    timeout: Option<Duration>,
) -> Result<Captured, BenchError> {
    interrupt.check()?;
    notify(Event::Command(command_line(cmd)));
    let seq = CAPTURE_SEQ.fetch_add(1, Ordering::Relaxed);
    let out_path = scratch.join(format!(".out.{seq}"));
    let err_path = scratch.join(format!(".err.{seq}"));
    let program = cmd.get_program().to_string_lossy().into_owned();
    let io_err = |what: String| move |source| BenchError::Io { what, source };
    let out = File::create(&out_path).map_err(io_err(format!("create {}", out_path.display())))?;
    let err = File::create(&err_path).map_err(io_err(format!("create {}", err_path.display())))?;
    // Its own process group: a terminal's Ctrl-C reaches only us (so a daemon left by `open`
    // survives until we close it), and on interruption we kill the whole group (fio runs its
    // jobs in forked children).
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);

    let start = Instant::now();
    let child = cmd.spawn().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            BenchError::Missing(format!(
                "{program} not found (is it installed and on PATH?)"
            ))
        } else {
            BenchError::Io {
                what: format!("run {program}"),
                source: e,
            }
        }
    })?;
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = wait_with_cpu(pid);
        // Reaped above: dropping `child` neither waits nor kills.
        drop(child);
        let _ = tx.send((r, Instant::now()));
    });
    let mut killed = None;
    let (status, end) = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => break r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let over = timeout.is_some_and(|t| start.elapsed() > t);
                if killed.is_none() && (interrupt.is_set() || over) {
                    // SAFETY: plain kill(2) of the child's process group; the child is not
                    // reaped until the waiter's wait4() returns, and it has not (no message
                    // yet), so the group id is still ours.
                    unsafe { libc::kill(-pid, libc::SIGKILL) };
                    killed = Some(if over { "timed out" } else { "interrupted" });
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(BenchError::Tool(format!(
                    "{program}: lost track of the process"
                )))
            }
        }
    };
    let _ = waiter.join();
    let (status, cpu) = status.map_err(io_err(format!("wait for {program}")))?;
    let read = |p: &Path| -> String {
        let mut s = Vec::new();
        let _ = File::open(p).and_then(|mut f| f.read_to_end(&mut s));
        let _ = fs::remove_file(p);
        String::from_utf8_lossy(&s).into_owned()
    };
    let captured = Captured {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
        elapsed: end - start,
        cpu,
    };
    interrupt.check()?;
    if let Some(why) = killed {
        return Err(BenchError::Tool(format!("{program} {why}")));
    }
    Ok(captured)
}

/// Waits for child `pid` (not reaped yet) and returns its status and CPU time (`wait4`).
fn wait_with_cpu(pid: libc::pid_t) -> io::Result<(ExitStatus, Duration)> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid out-pointers.
        if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok((
        ExitStatus::from_raw(status),
        tv(usage.ru_utime) + tv(usage.ru_stime),
    ))
}

/// Run `cmd` and require success; the error carries its stderr.
pub fn run_ok(
    cmd: &mut Command,
    scratch: &Path,
    interrupt: &Interrupt,
    timeout: Option<Duration>,
) -> Result<Captured, BenchError> {
    let line = command_line(cmd);
    let c = run_captured(cmd, scratch, interrupt, timeout)?;
    if !c.status.success() {
        let msg = if c.stderr.trim().is_empty() {
            c.stdout.trim()
        } else {
            c.stderr.trim()
        };
        return Err(BenchError::Tool(format!(
            "`{line}` failed ({}): {msg}",
            c.status
        )));
    }
    Ok(c)
}

/// What `PROG --version` prints (trimmed), or a failure naming the package to install (also
/// when the program runs but its `--version` fails).
pub fn required_version(prog: &str, package: &str) -> Result<String, BenchError> {
    let out = Command::new(prog)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            BenchError::Missing(format!(
                "cannot run {prog} ({e}); install it (apt-get install {package}) and make sure it is on PATH"
            ))
        })?;
    if !out.status.success() {
        return Err(BenchError::Missing(format!(
            "{prog} --version failed ({})",
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `cmd` as a shell-like line, for messages.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A scratch directory created for one benchmark under a base directory and removed with
/// everything in it when dropped. Files the user already had in the base are never touched.
#[derive(Debug)]
pub struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    /// Create `BASE/dmkit-bench.<pid>.<random>`.
    pub fn create(base: &Path) -> Result<Workspace, BenchError> {
        let mut tag = [0u8; 4];
        getrandom::getrandom(&mut tag).map_err(|e| BenchError::Io {
            what: "getrandom".into(),
            source: io::Error::other(e.to_string()),
        })?;
        let dir = base.join(format!(
            "dmkit-bench.{}.{}",
            std::process::id(),
            hex::encode(tag)
        ));
        fs::create_dir_all(base).map_err(|source| BenchError::Io {
            what: format!("create {}", base.display()),
            source,
        })?;
        fs::create_dir(&dir).map_err(|source| BenchError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        Ok(Workspace { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A path inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!(
                "dmkit: warning: could not remove {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// A fast non-cryptographic generator (xoshiro256**) seeded from the OS: benchmark data only
/// needs to be incompressible and different every run, and 2 GiB must not take long to make.
/// Seeded explicitly, it draws reproducible choices (file sizes).
pub(crate) struct Xoshiro256([u64; 4]);

impl Xoshiro256 {
    /// A generator whose stream depends only on `seed` (expanded with splitmix64).
    pub(crate) fn seeded(seed: u64) -> Self {
        let mut x = seed;
        Xoshiro256(std::array::from_fn(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) | 1
        }))
    }

    pub(crate) fn from_os() -> Result<Self, BenchError> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).map_err(|e| BenchError::Io {
            what: "getrandom".into(),
            source: io::Error::other(e.to_string()),
        })?;
        let mut s = [0u64; 4];
        for (i, c) in seed.chunks_exact(8).enumerate() {
            s[i] = u64::from_le_bytes(c.try_into().expect("8 bytes")) | 1;
        }
        Ok(Xoshiro256(s))
    }

    pub(crate) fn next(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Fills whole 8-byte words of `buf` (a tail shorter than 8 bytes is left as it is).
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_exact_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
    }
}

/// Remove `path` if it exists.
pub fn remove_file(path: &Path) -> Result<(), BenchError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(BenchError::Io {
            what: format!("remove {}", path.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Print a progress line when `progress` is on; with an [`Observer`] installed, hand it the
/// line instead (it draws a progress bar, or prints plain lines when not on a terminal).
pub fn say(progress: bool, msg: String) {
    if let Some(o) = observer() {
        o.event(Event::Say(msg));
    } else if progress {
        eprintln!("{msg}");
    }
}

/// What a running benchmark tells an [`Observer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A progress line (what [`say`] prints).
    Say(String),
    /// A subprocess is started: its command line (every command of a run is recorded).
    Command(String),
    /// One measured run finished (a fio run, a cold read of an image).
    RunDone,
}

/// Watches a benchmark from outside the scenarios (`dmkit bench seeds`: its progress bar and
/// the report's list of commands), so no scenario needs a parameter for it.
pub trait Observer: Send + Sync {
    /// Called for every event, on the thread that caused it.
    fn event(&self, e: Event);
}

static OBSERVER: std::sync::RwLock<Option<std::sync::Arc<dyn Observer>>> =
    std::sync::RwLock::new(None);

/// Install (or with `None` remove) the process-wide observer.
pub fn set_observer(o: Option<std::sync::Arc<dyn Observer>>) {
    *OBSERVER.write().unwrap_or_else(|e| e.into_inner()) = o;
}

fn observer() -> Option<std::sync::Arc<dyn Observer>> {
    OBSERVER.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Tell the observer, if any, about `e`.
pub fn notify(e: Event) {
    if let Some(o) = observer() {
        o.event(e);
    }
}

/// [`write_random_file`], saying so first when `progress` is on (every scenario's first step).
pub fn write_random_data(
    progress: bool,
    path: &Path,
    size: u64,
    interrupt: &Interrupt,
) -> Result<(), BenchError> {
    say(
        progress,
        format!(
            "writing {} of random data to {}",
            super::table::format_size(size),
            path.display()
        ),
    );
    write_random_file(path, size, interrupt)
}

/// Write `size` bytes of random data to a new file at `path` (size a multiple of 8).
pub fn write_random_file(path: &Path, size: u64, interrupt: &Interrupt) -> Result<(), BenchError> {
    let io_err = |source| BenchError::Io {
        what: format!("write {}", path.display()),
        source,
    };
    let mut rng = Xoshiro256::from_os()?;
    let mut f = File::create(path).map_err(io_err)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        interrupt.check()?;
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).map_err(io_err)?;
        left -= n as u64;
    }
    f.sync_all().map_err(io_err)
}

/// Copy the first `size` bytes of `from` into the existing file `to` (a device export), in
/// 1 MiB writes, then sync it.
pub fn fill_from(
    from: &Path,
    to: &Path,
    size: u64,
    interrupt: &Interrupt,
) -> Result<(), BenchError> {
    let io_err = |source| BenchError::Io {
        what: format!("copying {} into {}", from.display(), to.display()),
        source,
    };
    let mut src = File::open(from).map_err(io_err)?;
    let mut dst = fs::OpenOptions::new()
        .write(true)
        .open(to)
        .map_err(io_err)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        interrupt.check()?;
        let n = left.min(buf.len() as u64) as usize;
        src.read_exact(&mut buf[..n]).map_err(io_err)?;
        dst.write_all(&buf[..n]).map_err(io_err)?;
        left -= n as u64;
    }
    dst.sync_all().map_err(io_err)
}

/// Read a whole file once (to warm the page cache).
pub fn read_through(path: &Path) -> Result<u64, BenchError> {
    let mut f = File::open(path).map_err(|source| BenchError::Io {
        what: format!("open {}", path.display()),
        source,
    })?;
    io::copy(&mut f, &mut io::sink()).map_err(|source| BenchError::Io {
        what: format!("read {}", path.display()),
        source,
    })
}

/// Whether `dir` is on a tmpfs (RAM), where the page cache is the storage and cannot be
/// dropped.
pub fn on_tmpfs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we own, through a valid C string path.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC
    }
}

/// Write `path`'s dirty pages and drop it from the page cache, so the next run reads it from
/// the disk (every side of a comparison gets the same treatment).
pub fn evict_from_page_cache(path: &Path) -> Result<(), BenchError> {
    use std::os::fd::AsRawFd;
    let io_err = |source| BenchError::Io {
        what: format!("evicting {} from the page cache", path.display()),
        source,
    };
    let f = File::open(path).map_err(io_err)?;
    f.sync_data().map_err(io_err)?;
    // SAFETY: posix_fadvise on a descriptor we own, with integer arguments.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io_err(io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// User + system CPU seconds of process `pid` (all its threads).
pub fn cpu_seconds(pid: u32) -> Result<f64, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
        what: format!("reading {path}"),
        source,
    })?;
    // The fields after the parenthesised command name, which may hold spaces.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| BenchError::Tool(format!("{path}: unexpected format")))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks = |i: usize| -> Result<f64, BenchError> {
        f.get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| BenchError::Tool(format!("{path}: no field {}", i + 3)))
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// How to run this very `dmkit` binary as a subprocess (never a fork of this process).
#[derive(Debug, Clone)]
pub struct Dmkit {
    /// Path of the executable.
    pub exe: PathBuf,
    /// Where exports appear (`$DMKIT_RUN_DIR`, default `/run/dmkit`).
    pub run_dir: PathBuf,
    /// How it was built: "release", "debug", or "external PATH" for `$DMKIT_BENCH_EXE`.
    pub build: String,
    /// (device, inode) of the executable when the benchmark started.
    identity: Option<(u64, u64)>,
    /// Environment variables every command gets (and the servers they start inherit).
    env: Vec<(String, String)>,
}

/// How long an `open` or `close` may take before it counts as hung.
const LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(120);

fn file_identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

impl Dmkit {
    /// The running executable (or `$DMKIT_BENCH_EXE` if set: another dmkit build, or a
    /// stand-in for tests) and the run directory from the environment.
    pub fn from_env() -> Result<Dmkit, BenchError> {
        let (exe, build) = match std::env::var_os("DMKIT_BENCH_EXE") {
            Some(p) => {
                let p = PathBuf::from(p);
                let label = format!("external {}", p.display());
                (p, label)
            }
            None => {
                let exe = std::env::current_exe().map_err(|source| BenchError::Io {
                    what: "find the dmkit executable".into(),
                    source,
                })?;
                // Rebuilt since this process started: the path now holds another build.
                let path = exe.to_string_lossy();
                let (exe, note) = match path.strip_suffix(" (deleted)") {
                    Some(p) => (PathBuf::from(p), ", rebuilt since start"),
                    None => (exe.clone(), ""),
                };
                let profile = if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                };
                (exe, format!("{profile}{note}"))
            }
        };
        let run_dir = std::env::var_os("DMKIT_RUN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/run/dmkit"));
        Ok(Dmkit {
            identity: file_identity(&exe),
            exe,
            run_dir,
            build,
            env: Vec::new(),
        })
    }

    /// Whether the executable at `exe` was replaced (rebuilt) since [`Dmkit::from_env`]: the
    /// runs then mix two builds. (A shared cargo target directory makes this easy to hit.)
    pub fn replaced(&self) -> bool {
        file_identity(&self.exe) != self.identity
    }

    /// The build for the report, marked (and warned about) when the executable was replaced
    /// while the benchmark ran.
    pub fn build_label(&self) -> String {
        if self.replaced() {
            eprintln!(
                "dmkit: warning: {} was rebuilt during the benchmark: the runs mix two builds",
                self.exe.display()
            );
            format!("{}, REBUILT DURING THE RUN", self.build)
        } else {
            self.build.clone()
        }
    }

    /// A `dmkit ARGS...` command.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = Command::new(&self.exe);
        c.args(args);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// This dmkit with `key=value` in the environment of its commands (a server started by
    /// `open` inherits it: `DMKIT_FUSE_TRANSPORT`, say).
    pub fn with_env(&self, key: &str, value: &str) -> Dmkit {
        let mut d = self.clone();
        d.env.retain(|(k, _)| k != key);
        d.env.push((key.to_string(), value.to_string()));
        d
    }

    /// The serving process of export `name` (`dmkit status NAME --json`).
    pub fn server_pid(
        &self,
        name: &str,
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<u32, BenchError> {
        let out = run_ok(
            &mut self.command(["status", name, "--json"]),
            scratch,
            interrupt,
            None,
        )?;
        let v: serde_json::Value = serde_json::from_str(&out.stdout)
            .map_err(|e| BenchError::Tool(format!("dmkit status {name} --json: {e}")))?;
        v["pid"]
            .as_u64()
            .map(|p| p as u32)
            .ok_or_else(|| BenchError::Tool(format!("dmkit status {name} --json: no pid")))
    }

    /// Run `dmkit ARGS...` (an `open` with `--nbd` that serves NAME) and return a guard that
    /// closes the export when dropped, and the NBD URI the open printed (its last line).
    pub fn open_nbd(
        &self,
        name: &str,
        args: &[String],
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<(Export, String), BenchError> {
        let mut cmd = self.command(args);
        let res = run_ok(&mut cmd, scratch, interrupt, Some(LIFECYCLE_TIMEOUT));
        let export = Export {
            dmkit: self.clone(),
            name: name.to_string(),
            path: self.run_dir.join(name),
            scratch: scratch.to_path_buf(),
            open: true,
        };
        let out = res?;
        match out.stdout.lines().last().filter(|l| l.starts_with("nbd")) {
            Some(uri) => Ok((export, uri.to_string())),
            None => Err(BenchError::Tool(format!(
                "`{}` printed no NBD URI",
                command_line(&cmd)
            ))),
        }
    }

    /// Run `dmkit ARGS...` (an `open` of some kind that serves NAME) and return a guard that
    /// closes the export when dropped.
    pub fn open(
        &self,
        name: &str,
        args: &[String],
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<Export, BenchError> {
        self.open_at(name, args, &self.run_dir.join(name), scratch, interrupt)
    }

    /// [`Dmkit::open`] for an export served at `path` (a tree's mount point) rather than
    /// in the run directory.
    pub fn open_at(
        &self,
        name: &str,
        args: &[String],
        path: &Path,
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<Export, BenchError> {
        let mut cmd = self.command(args);
        let res = run_ok(&mut cmd, scratch, interrupt, Some(LIFECYCLE_TIMEOUT));
        // Even a failed or interrupted open may have left something behind.
        let export = Export {
            dmkit: self.clone(),
            name: name.to_string(),
            path: path.to_path_buf(),
            scratch: scratch.to_path_buf(),
            open: true,
        };
        match res {
            Ok(_) if export.path.exists() => Ok(export),
            Ok(_) => Err(BenchError::Tool(format!(
                "`{}` succeeded but {} does not exist",
                command_line(&cmd),
                export.path.display()
            ))),
            Err(e) => Err(e),
        }
    }
}

/// An open export; closed with `dmkit close NAME` when dropped (even on error or Ctrl-C).
#[derive(Debug)]
pub struct Export {
    dmkit: Dmkit,
    name: String,
    path: PathBuf,
    scratch: PathBuf,
    open: bool,
}

impl Export {
    /// The exported file fio reads (`$DMKIT_RUN_DIR/NAME`), or a tree's mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The export's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Close now, reporting errors.
    pub fn close(mut self) -> Result<(), BenchError> {
        self.open = false;
        close(&self.dmkit, &self.name, &self.scratch)
    }
}

fn close(dmkit: &Dmkit, name: &str, scratch: &Path) -> Result<(), BenchError> {
    let mut cmd = dmkit.command(["close", name]);
    // Closing must work after an interruption, so it ignores the flag.
    run_ok(
        &mut cmd,
        scratch,
        &Interrupt::none(),
        Some(LIFECYCLE_TIMEOUT),
    )
    .map(|_| ())
}

impl Drop for Export {
    fn drop(&mut self) {
        if self.open {
            self.open = false;
            if let Err(e) = close(&self.dmkit, &self.name, &self.scratch) {
                eprintln!("dmkit: warning: could not close {}: {e}", self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_matches_the_reference() {
        // Reference: xoshiro256** with state {1, 2, 3, 4}.
        let mut r = Xoshiro256([1, 2, 3, 4]);
        let got: Vec<u64> = (0..3).map(|_| r.next()).collect();
        assert_eq!(got, [11520, 0, 1509978240]);
    }

    #[test]
    fn workspace_is_removed() {
        let base = std::env::temp_dir();
        let ws = Workspace::create(&base).unwrap();
        let dir = ws.dir().to_path_buf();
        write_random_file(&ws.path("d"), 4096 * 3, &Interrupt::none()).unwrap();
        assert_eq!(fs::metadata(ws.path("d")).unwrap().len(), 4096 * 3);
        assert_eq!(read_through(&ws.path("d")).unwrap(), 4096 * 3);
        drop(ws);
        assert!(!dir.exists());
    }

    #[test]
    fn captures_output_and_status() {
        let ws = Workspace::create(&std::env::temp_dir()).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let c = run_captured(&mut cmd, ws.dir(), &Interrupt::none(), None).unwrap();
        assert_eq!(c.stdout, "out\n");
        assert_eq!(c.stderr, "err\n");
        assert_eq!(c.status.code(), Some(3));
        let e = run_ok(&mut cmd, ws.dir(), &Interrupt::none(), None).unwrap_err();
        assert!(e.to_string().contains("err"), "{e}");
        let mut missing = Command::new("/nonexistent/dmkit-no-such-tool");
        let e = run_captured(&mut missing, ws.dir(), &Interrupt::none(), None).unwrap_err();
        assert!(matches!(e, BenchError::Missing(_)), "{e}");
    }
}
