//! Starting a server: in the background (fork, detach, report readiness over a pipe) or in
//! this process (`--foreground`), and hardening the process that will hold the device's keys.

use super::namelock::NameLock;
use super::rundir::{create_private, Paths};
use super::server::{self, Server};
use super::stale::{busy, cleanup_stale};
use super::{io_err, ExportError, ExportSpec, Job, Opened, Result, TreeSpec};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(1)
}

/// [`thread_count`], given a moment to fall to 1: a thread that was just joined (the KDF's
/// lanes) is still counted until the kernel has reaped it, a little after `join` returns.
fn settled_thread_count() -> usize {
    let mut n = thread_count();
    for _ in 0..100 {
        if n <= 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        n = thread_count();
    }
    n
}

/// `--loop` needs /dev/loop-control, which only root may use: say so before anything starts
/// (commands call this before they unlock or claim anything).
pub fn check_loop_allowed(name: &str, want_loop: bool) -> Result<()> {
    // SAFETY: geteuid cannot fail.
    if want_loop && unsafe { libc::geteuid() } != 0 {
        return Err(ExportError::Invalid(format!(
            "{name}: --loop needs root (loop devices are set up through /dev/loop-control); \
             without --loop the device is served as a file under the run directory, no root \
             needed"
        )));
    }
    Ok(())
}

/// Open `spec.name`: fork a background server, wait until it serves, return where.
///
/// **Call this before the process has spawned any thread** (rayon pools included): it forks,
/// and the child continues without exec, so a thread holding a lock at fork time would leave
/// that lock held forever in the server. Returns an error if other threads exist.
///
/// The server detaches (double fork, `setsid`), closes every descriptor it inherited from the
/// caller, makes itself non-dumpable, sends its output to `NAME.log`, mounts the FUSE export,
/// starts its threads, attaches the loop device if asked, writes `NAME.json`, opens the control
/// socket and only then reports ready. On failure it reports the error and leaves nothing
/// behind.
pub fn open(spec: ExportSpec) -> Result<Opened> {
    launch(Job::Device(spec))
}

/// Serve a read-only tree in the background, as [`open`] serves a device (same rules: call it
/// before any thread exists). Returns once the tree is mounted at `spec.mountpoint`.
pub fn open_tree(spec: TreeSpec) -> Result<Opened> {
    launch(Job::Tree(spec))
}

fn launch(job: Job) -> Result<Opened> {
    job.threads()?;
    job.check()?;
    // Where the job is served: the device file, or the tree's mount point.
    let served_at = match &job {
        Job::Tree(t) => Some(t.mountpoint.clone()),
        Job::Device(_) => None,
    };
    check_loop_allowed(job.name(), job.wants_loop())?;
    let p = Paths::new(job.name(), true)?;
    let n = settled_thread_count();
    if n > 1 {
        return Err(ExportError::Failed(format!(
            "open {}: the process already runs {n} threads; open must be called before any \
             thread is spawned (or use serve_foreground)",
            job.name()
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
            0 => server_main(job, p, lock, wr),
            // SAFETY: _exit(2) skips atexit handlers and stdio flushing, which belong to the
            // parent.
            _ => unsafe { libc::_exit(0) },
        }
    }
    // The server (a copy of this process) owns the device from the fork on, so this copy
    // must not write to it again: dropping `job` below would otherwise run the layers' clean
    // stop (a dm-integrity journal commit and bitmap cleaning) over what the server writes.
    job.hand_over();
    drop(job);
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
            path: served_at.unwrap_or_else(|| p.dev.clone()),
            loop_device: reply["loop"].as_str().map(PathBuf::from),
            nbd: reply["nbd"].as_str().map(String::from),
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
fn server_main(job: Job, p: Paths, lock: NameLock, wr: OwnedFd) -> ! {
    close_inherited_descriptors();
    redirect_stdio(&p.log);
    protect_secrets();
    let mut wr = File::from(wr);
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    match Server::start(job, p, lock, pid) {
        Err(e) => {
            eprintln!("dmkit: {e}");
            let msg = json!({"ok": false, "error": e.to_string(), "kind": e.kind()});
            let _ = writeln!(wr, "{msg}");
            drop(wr);
            std::process::exit(1);
        }
        Ok(mut server) => {
            let msg = json!({
                "ok": true,
                "pid": pid,
                "loop": server.state.loop_device,
                "nbd": server.state.nbd_uri,
            });
            let _ = writeln!(wr, "{msg}");
            drop(wr);
            let ending = server.run();
            let result = server.teardown();
            server::finish(ending, &result);
            let code = if result.is_ok() { 0 } else { 1 };
            let _ = io::stderr().flush();
            std::process::exit(code);
        }
    }
}

/// Close every descriptor above stderr that the caller of `dmkit` handed down to us: a lock
/// the caller holds (`flock 9`), the write end of a `$(...)` capture. Everything dmkit opened
/// itself is close-on-exec (Rust opens all files so), which tells the two apart.
fn close_inherited_descriptors() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_GETFD only reads the descriptor flags; close(2) of a descriptor nobody in
        // this process uses (it is not close-on-exec, so dmkit did not open it).
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::close(fd);
            }
        }
    }
}

/// A serving process holds a volume key for as long as the device is open, where the kernel
/// would keep it in kernel memory: no core file, no ptrace or /proc/PID/mem reads by the same
/// user, and a broken control connection must not kill it.
pub(super) fn protect_secrets() {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) and signal(SIGPIPE, SIG_IGN) take plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// stdin from /dev/null, stdout and stderr to the log (best effort: /dev/null if it fails).
fn redirect_stdio(log: &Path) {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let out = create_private(log, true);
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
    serve_job_foreground(Job::Device(spec), on_ready)
}

/// Serve a read-only tree in this process, as [`serve_foreground_with`] serves a device.
pub fn serve_tree_foreground(spec: TreeSpec, on_ready: impl FnOnce(&Opened)) -> Result<()> {
    serve_job_foreground(Job::Tree(spec), on_ready)
}

fn serve_job_foreground(job: Job, on_ready: impl FnOnce(&Opened)) -> Result<()> {
    job.threads()?;
    job.check()?;
    check_loop_allowed(job.name(), job.wants_loop())?;
    let p = Paths::new(job.name(), true)?;
    let lock = NameLock::try_take(&p.lock)?.ok_or_else(|| busy(&p))?;
    cleanup_stale(&p)?;
    protect_secrets();
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let mut server = Server::start(job, p, lock, pid)?;
    on_ready(&Opened {
        name: server.state.name.clone(),
        path: server.state.path.clone(),
        loop_device: server.state.loop_device.clone(),
        nbd: server.state.nbd_uri.clone(),
        pid,
    });
    let ending = server.run();
    let result = server.teardown();
    server::finish(ending, &result);
    result
}
