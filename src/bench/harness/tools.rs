//! The other programs a benchmark runs beside fio and dmkit: peers (qemu-storage-daemon) that
//! stop when dropped, loop devices that detach, their versions and readiness.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::BenchError;

/// A server process of ours (qemu-storage-daemon), stopped with SIGTERM (then SIGKILL) when
/// dropped.
pub struct Daemon {
    /// The process.
    pub child: Child,
    /// Its name, for messages.
    pub what: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own, not yet reaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    eprintln!("dmkit: warning: {} did not stop; killing it", self.what);
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
            }
        }
    }
}

/// A loop device detached when dropped.
pub struct Loop(pub PathBuf);

impl Drop for Loop {
    fn drop(&mut self) {
        if let Err(e) = crate::export::loopdev::detach(&self.0) {
            eprintln!("dmkit: warning: could not detach {}: {e}", self.0.display());
        }
    }
}

/// The first line of `PROG --version`.
pub fn tool_version(prog: &str) -> String {
    Command::new(prog)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// Fails unless `PROG --version` runs, naming the package to install.
pub fn need(prog: &str, package: &str) -> Result<(), BenchError> {
    let ok = Command::new(prog)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if ok {
        Ok(())
    } else {
        Err(BenchError::Missing(format!(
            "{prog} not found; install it (apt-get install {package})"
        )))
    }
}

/// Wait until `path` is a FUSE mount of `size` bytes served by `child`.
pub fn wait_for_size(
    path: &Path,
    size: u64,
    child: &mut Child,
    what: &str,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if fs::metadata(path).map(|m| m.len()).unwrap_or(0) == size
            && crate::export::is_mounted(path)
        {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(BenchError::Tool(format!("{what} exited early ({st})")));
        }
        if Instant::now() > deadline {
            return Err(BenchError::Tool(format!(
                "{what}: {} did not appear as a {size}-byte FUSE export within 30 s",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first MiB read through `dev`.
pub fn first_mib(dev: &Path) -> Result<Vec<u8>, BenchError> {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 20];
    fs::File::open(dev)
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|source| BenchError::Io {
            what: format!("read {}", dev.display()),
            source,
        })?;
    Ok(buf)
}

/// Starts `cmd` as a [`Daemon`] named `what`, its stdout and stderr in `log`, and waits until it
/// listens on the Unix socket `sock`; when it does not, the error carries the log's text.
pub fn start_daemon(
    mut cmd: Command,
    what: &str,
    sock: &Path,
    log: &Path,
) -> Result<Daemon, BenchError> {
    let io = |source| BenchError::Io {
        what: format!("create {}", log.display()),
        source,
    };
    let out = fs::File::create(log).map_err(io)?;
    let err = out.try_clone().map_err(io)?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let child = cmd.spawn().map_err(|source| BenchError::Io {
        what: format!("run {what}"),
        source,
    })?;
    let mut d = Daemon {
        child,
        what: what.into(),
    };
    if let Err(e) = wait_for_socket(sock, &mut d) {
        let text = fs::read_to_string(log).unwrap_or_default();
        return Err(BenchError::Tool(format!("{e}: {}", text.trim())));
    }
    Ok(d)
}

/// Wait until the Unix socket at `path` accepts connections.
pub fn wait_for_socket(path: &Path, d: &mut Daemon) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = d.child.try_wait() {
            return Err(BenchError::Tool(format!("{} exited early ({st})", d.what)));
        }
        if Instant::now() > deadline {
            return Err(BenchError::Tool(format!(
                "{}: nothing listens at {} after 30 s",
                d.what,
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether this fio has the nbd engine (Debian's links libnbd).
pub fn fio_has_nbd() -> bool {
    Command::new("fio")
        .arg("--enghelp")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == "nbd")
        })
        .unwrap_or(false)
}
