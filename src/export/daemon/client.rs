//! The commands that talk to running servers: `close` (now or deferred), `status`, and naming
//! the holder of a claim.

use super::namelock::NameLock;
use super::rundir::{run_dir, validate_name, Paths, DEFAULT_RUN_DIR};
use super::stale::{busy, cleanup_stale, loops_backed_by};
use super::state::{self, State};
use super::{ExportError, Result};
use crate::block::ClaimError;
use crate::export::mountinfo::is_mounted;
use serde_json::{json, Value};
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a server has to answer a control request. A `close` answer comes after the
/// teardown (loop detach, unmount), which takes well under this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `close` waits for an unresponsive server to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// How `close` goes about it (cryptsetup's `close`, `close --deferred`,
/// `close --cancel-deferred`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseMode {
    /// Close now; refuse (exit 5) while the device is in use.
    Now,
    /// Close now if unused, else as soon as the last user goes.
    Deferred,
    /// Withdraw a deferred close.
    CancelDeferred,
}

/// What `close` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The server stopped and everything is gone.
    Closed,
    /// The device is in use: it will close when the last user goes.
    Deferred,
    /// A pending deferred close was withdrawn.
    Cancelled,
    /// The server had died; what it left behind was removed.
    CleanedUp,
}

/// Send one control command to a server and read its one-line JSON answer.
fn request(sock: &Path, cmd: &str, timeout: Duration) -> io::Result<Value> {
    let s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let line = format!("{cmd}\n");
    // MSG_NOSIGNAL: a server that died between connect and send is an error, not a SIGPIPE
    // (the command line leaves SIGPIPE at its default so that `| head` ends it quietly).
    // SAFETY: send(2) from a buffer that outlives the call, on a connected socket we own.
    let n = unsafe {
        libc::send(
            s.as_raw_fd(),
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n != line.len() as isize {
        return Err(io::Error::last_os_error());
    }
    let mut answer = String::new();
    BufReader::new((&s).take(1 << 20)).read_line(&mut answer)?;
    serde_json::from_str(&answer).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: bad answer: {e}", sock.display()),
        )
    })
}

/// Whether the state's pid is still the server that wrote it: the pid runs, is not a zombie,
/// and started when the server did (a reused pid started at another time). A state without a
/// start time names no process we may signal.
fn is_server(st: &State) -> bool {
    if st.pid == 0 || st.start_ticks == 0 {
        return false;
    }
    match (state::process_state(st.pid), state::start_ticks(st.pid)) {
        (Some('Z') | None, _) | (_, None) => false,
        (Some(_), Some(t)) => t == st.start_ticks,
    }
}

fn wait_gone(st: &State, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while is_server(st) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn signal(st: &State, sig: libc::c_int) {
    if is_server(st) {
        // SAFETY: kill(2) on the pid of a process verified to be the server (same pid and
        // start time as recorded by the server itself).
        unsafe { libc::kill(st.pid as libc::pid_t, sig) };
    }
}

/// Close `name` as `mode` says. A device in use is refused with [`ExportError::InUse`] (exit 5,
/// as cryptsetup); a server that died is cleaned up after.
pub fn close(name: &str, mode: CloseMode) -> Result<Closed> {
    let p = Paths::new(name, false)?;
    let st = state::read(&p);
    let not_open = || ExportError::NotOpen {
        name: name.to_string(),
    };
    if NameLock::held(&p.lock) {
        let Some(st) = st else {
            return Err(busy(&p));
        };
        // A stopped server (SIGSTOP, a debugger let go) cannot answer: let it run again.
        if state::process_state(st.pid) == Some('T') {
            signal(&st, libc::SIGCONT);
        }
        let cmd = match mode {
            CloseMode::Now => "close",
            CloseMode::Deferred => "close-deferred",
            CloseMode::CancelDeferred => "cancel-deferred",
        };
        match request(&p.sock, cmd, REQUEST_TIMEOUT) {
            Ok(v) if v["ok"].as_bool() == Some(true) => {
                if mode == CloseMode::CancelDeferred {
                    return Ok(Closed::Cancelled);
                }
                if v["deferred"].as_bool() == Some(true) {
                    return Ok(Closed::Deferred);
                }
                // The server answers after its teardown, then exits.
                wait_gone(&st, Duration::from_secs(5));
            }
            Ok(v) => {
                let m = v["error"].as_str().unwrap_or("unknown error").to_string();
                return Err(match v["kind"].as_str() {
                    Some("busy") => ExportError::InUse {
                        name: name.to_string(),
                        reason: m,
                    },
                    _ => ExportError::Failed(format!("{name}: the server reported: {m}")),
                });
            }
            Err(e) if mode != CloseMode::Now => {
                return Err(ExportError::Failed(format!(
                    "{name}: the server (pid {}) does not answer: {e}",
                    st.pid
                )))
            }
            // No answer, and the pid is not the server's any more (or never was): nothing
            // may be signalled.
            Err(e) if !is_server(&st) => {
                return Err(ExportError::Failed(format!(
                    "{name}: the server does not answer ({e}) and pid {} is not its process; \
                     not signalling it (the state in {} is stale)",
                    st.pid,
                    p.state.display()
                )))
            }
            // No answer: ask with a signal instead (the same clean shutdown), then insist.
            Err(e) => {
                eprintln!(
                    "dmkit: {name}: the server (pid {}) does not answer ({e}); stopping it with SIGTERM",
                    st.pid
                );
                signal(&st, libc::SIGTERM);
                if !wait_gone(&st, TERM_GRACE) {
                    signal(&st, libc::SIGKILL);
                    wait_gone(&st, Duration::from_secs(2));
                }
            }
        }
    } else if mode == CloseMode::CancelDeferred
        || (st.is_none() && !is_mounted(&p.dev) && loops_backed_by(&p.dev).is_empty())
    {
        return Err(not_open());
    }
    let was_dead = !NameLock::held(&p.lock) && state::read(&p).is_some();
    // Whatever a dead or killed server left behind.
    if let Some(lock) = NameLock::try_take(&p.lock)? {
        let r = cleanup_stale(&p);
        lock.remove();
        r?;
    }
    Ok(if was_dead {
        Closed::CleanedUp
    } else {
        Closed::Closed
    })
}

/// The names with a state file in the run directory, sorted.
pub(super) fn names_with_state() -> Vec<String> {
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

/// What is open: one JSON object per device (all of them, or `name`). A live server answers
/// with its state, `"state": "active"`, its export counters and the layer's stats; a server
/// that died shows its last state with `"state": "dead"` (`close` cleans it up).
pub fn status(name: Option<&str>) -> Result<Vec<Value>> {
    let names: Vec<String> = match name {
        Some(n) => {
            validate_name(n)?;
            vec![n.to_string()]
        }
        None => names_with_state(),
    };
    let mut out = Vec::new();
    for n in &names {
        let p = Paths::new(n, false)?;
        let state = state::read(&p);
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
            return Err(
                served_by_someone_else(n).unwrap_or(ExportError::NotOpen { name: n.clone() })
            );
        }
    }
    Ok(out)
}

/// A non-root user asking about root's device: the name is served in /run/dmkit, whose state
/// only root may read. Say so instead of "not active".
fn served_by_someone_else(name: &str) -> Option<ExportError> {
    let system = Path::new(DEFAULT_RUN_DIR).join(name);
    (run_dir() != Path::new(DEFAULT_RUN_DIR) && is_mounted(&system)).then(|| {
        ExportError::Permission(format!(
            "{}: served by another user (its state is in {DEFAULT_RUN_DIR}/.dmkit, which only \
             they may read); run status as root",
            system.display()
        ))
    })
}

/// Name the open device that holds a claim conflicting with `e` (a refused claim), for the
/// message: "device 'secret' (pid 123, read-write of bytes 16777216 to the end)".
pub fn claim_holder(e: &ClaimError) -> Option<String> {
    let ClaimError::Busy {
        dev,
        ino,
        start,
        len,
        exclusive,
        ..
    } = e
    else {
        return None;
    };
    holder(|c| c.conflicts(*dev, *ino, *start, *len, *exclusive))
}

/// Name the open device that holds any claim on the file or block device at `path` (for an
/// exclusive open refused with EBUSY), as [`claim_holder`] does.
pub fn path_holder(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok()?;
    holder(|c| c.dev == m.dev() && c.ino == m.ino())
}

fn holder(matches: impl Fn(&crate::block::ClaimInfo) -> bool) -> Option<String> {
    names_with_state().into_iter().find_map(|n| {
        let p = Paths::new(&n, false).ok()?;
        let st = state::read(&p)?;
        if !NameLock::held(&p.lock) {
            return None;
        }
        let c = st.claims.iter().find(|c| matches(c))?;
        Some(format!(
            "device '{}' (pid {}, {} of {})",
            st.name,
            st.pid,
            if c.exclusive {
                "read-write"
            } else {
                "read-only"
            },
            c.range_text()
        ))
    })
}
