//! The commands that talk to running servers: `close` (now or deferred), `status`, and naming
//! the holder of a claim.

use super::control::{self, CloseHow, FailKind, Reply, Request};
use super::namelock::NameLock;
use super::rundir::{run_dir, validate_name, Paths, DEFAULT_RUN_DIR};
use super::stale::{busy, cleanup_stale, loops_backed_by};
use super::state::{self, State};
use super::{ExportError, Result};
use crate::block::ClaimError;
use crate::export::mountinfo::is_mounted;
use serde_json::{json, Value};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a server has to answer a control request. A `close` answer comes after the
/// teardown (loop detach, unmount), which takes well under this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `close` waits for an unresponsive server to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);
/// How long a resize, suspend, resume or refresh may take (a resume runs the keyslot's KDF).
const ONLINE_TIMEOUT: Duration = Duration::from_secs(300);

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

/// Send one request to a server and read its replies: progress frames go to `progress`, the
/// final reply is returned. A request carrying a passphrase goes only to a server of our own
/// user (or root), checked with `SO_PEERCRED`. A server of an older dmkit that refused this
/// protocol version gets the request again in its own when the request's body is the same
/// there (so that a `close` of it checks its users as ever, instead of a signal).
fn call(
    sock: &Path,
    req: &Request,
    timeout: Duration,
    mut progress: impl FnMut(u64, u64),
) -> io::Result<Reply> {
    match call_in(sock, req, timeout, &mut progress, control::VERSION) {
        Err(e) => match control::other_version(&e) {
            Some(v) if (control::same_since(req)..control::VERSION).contains(&v) => {
                call_in(sock, req, timeout, &mut progress, v)
            }
            _ => Err(e),
        },
        r => r,
    }
}

/// [`call`] in protocol `version`.
fn call_in(
    sock: &Path,
    req: &Request,
    timeout: Duration,
    progress: &mut dyn FnMut(u64, u64),
    version: u16,
) -> io::Result<Reply> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    if req.has_secret() {
        let uid = control::peer_uid(s.as_fd())?;
        if !control::peer_allowed(uid) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: the server runs as uid {uid}, not as you; not sending it a passphrase",
                    sock.display()
                ),
            ));
        }
    }
    let frame = control::in_version(&req.encode(), version);
    let mut sent = 0;
    while sent < frame.len() {
        // MSG_NOSIGNAL: a server that died between connect and send is an error, not a SIGPIPE
        // (the command line leaves SIGPIPE at its default so that `| head` ends it quietly).
        // SAFETY: send(2) from a buffer that outlives the call, on a connected socket we own.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                frame[sent..].as_ptr().cast(),
                frame.len() - sent,
                libc::MSG_NOSIGNAL,
            )
        };
        if n <= 0 {
            return Err(io::Error::last_os_error());
        }
        sent += n as usize;
    }
    loop {
        let f = control::read_frame_in(&mut s, version)?;
        match Reply::decode(&f).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: bad answer: {e}", sock.display()),
            )
        })? {
            Reply::Progress { done, total } => progress(done, total),
            r => return Ok(r),
        }
    }
}

/// [`call`] without progress.
fn request(sock: &Path, req: &Request, timeout: Duration) -> io::Result<Reply> {
    call(sock, req, timeout, |_, _| {})
}

/// Send `req` to the server of `name` (resize, suspend, resume, refresh) and return its
/// answer; `progress` gets a long request's progress. A refusal carries the server's exit
/// code.
pub fn ask(name: &str, req: &Request, progress: impl FnMut(u64, u64)) -> Result<Value> {
    let p = Paths::new(name, false)?;
    if !NameLock::held(&p.lock) {
        return Err(ExportError::NotOpen {
            name: name.to_string(),
        });
    }
    match call(&p.sock, req, ONLINE_TIMEOUT, progress) {
        Ok(Reply::Done(v)) => Ok(v),
        Ok(Reply::Failed { code, message, .. }) => Err(ExportError::Refused {
            code: i32::from(code),
            message,
        }),
        Ok(Reply::Progress { .. }) => unreachable!("call returns the final reply"),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            Err(ExportError::Permission(e.to_string()))
        }
        Err(e) => Err(ExportError::Failed(answer_error(name, &e))),
    }
}

/// What a user is told when the server of `name` gave no answer `call` could read.
fn answer_error(name: &str, e: &io::Error) -> String {
    match control::other_version(e) {
        Some(v) => control::mismatch(name, v, control::VERSION),
        None => format!("{name}: the server does not answer: {e}"),
    }
}

/// Whether the state's pid is still the server that wrote it: the pid runs, is not a zombie,
/// and started when the server did (a reused pid started at another time). A state without a
/// start time names no process we may signal.
fn is_server(st: &State) -> bool {
    if st.pid == 0 || st.start_ticks == 0 {
        return false;
    }
    match (state::process_state(st.pid), state::start_ticks(st.pid)) {
        (None, _) | (_, None) => false,
        // A zombie main thread whose other threads still exit: they hold the device's files,
        // so the server is not gone yet (the next open would find its backing in use).
        (Some('Z'), Some(t)) => t == st.start_ticks && state::threads(st.pid) > 1,
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
        // A stopped server (SIGSTOP, a debugger let go) cannot answer: let it run again. Sent
        // whatever /proc says, since a SIGSTOP still being delivered shows no 'T' yet.
        signal(&st, libc::SIGCONT);
        let how = match mode {
            CloseMode::Now => CloseHow::Now,
            CloseMode::Deferred => CloseHow::Deferred,
            CloseMode::CancelDeferred => CloseHow::CancelDeferred,
        };
        match request(&p.sock, &Request::Close(how), REQUEST_TIMEOUT) {
            Ok(Reply::Done(v)) => {
                if mode == CloseMode::CancelDeferred {
                    return Ok(Closed::Cancelled);
                }
                if v["deferred"].as_bool() == Some(true) {
                    return Ok(Closed::Deferred);
                }
                // The server answers after its teardown, then exits.
                wait_gone(&st, Duration::from_secs(5));
            }
            Ok(Reply::Progress { .. }) => unreachable!("call returns the final reply"),
            Ok(Reply::Failed { kind, message, .. }) => {
                let m = message;
                return Err(match kind {
                    FailKind::Busy => ExportError::InUse {
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
                // A server stopped since acts on SIGTERM only once it runs again.
                signal(&st, libc::SIGCONT);
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
            match request(&p.sock, &Request::Status, Duration::from_secs(10)) {
                Ok(Reply::Done(v)) => out.push(v),
                Ok(Reply::Failed { message, .. }) => {
                    base["state"] = json!("unresponsive");
                    base["error"] = json!(message);
                    out.push(base);
                }
                Ok(Reply::Progress { .. }) => unreachable!("call returns the final reply"),
                Err(e) => {
                    base["state"] = json!(if state.is_some() {
                        "unresponsive"
                    } else {
                        "starting"
                    });
                    base["error"] = json!(match control::other_version(&e) {
                        Some(v) => control::mismatch(n, v, control::VERSION),
                        None => e.to_string(),
                    });
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
