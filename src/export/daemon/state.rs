//! The state file of an open device, `NAME.json`: what `status` shows of a server, what a
//! refused claim names as its holder, and how `close` recognises the server's process.

use super::rundir::{create_private, read_private, Paths};
use super::{io_err, ExportError, Result};
use crate::block::ClaimInfo;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs;
use std::io::Write;
use std::path::PathBuf;

/// The state file's contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct State {
    pub name: String,
    pub kind: String,
    pub pid: u32,
    /// The server's start time (clock ticks since boot, field 22 of /proc/PID/stat): with the
    /// pid, it names the process beyond pid reuse.
    #[serde(default)]
    pub start_ticks: u64,
    /// The exported file, or a tree's mount point.
    pub path: PathBuf,
    /// `path` is a tree's mount point: a directory of the user's, unmounted but never removed.
    #[serde(default)]
    pub tree: bool,
    pub loop_device: Option<PathBuf>,
    #[serde(default)]
    pub loop_direct_io: bool,
    /// The FUSE file `path` is served (false with `--no-fuse`: NBD only).
    #[serde(default = "yes")]
    pub fuse: bool,
    /// The NBD URI, when the device is served over NBD.
    #[serde(default)]
    pub nbd_uri: Option<String>,
    pub size: u64,
    pub read_only: bool,
    pub allow_discards: bool,
    pub threads: usize,
    pub started: u64,
    pub log: PathBuf,
    /// The byte ranges of backing files this device holds.
    #[serde(default)]
    pub claims: Vec<ClaimInfo>,
    pub details: Value,
}

fn yes() -> bool {
    true
}

/// Read a name's state (`None` if there is none or it cannot be parsed).
pub(super) fn read(p: &Paths) -> Option<State> {
    let text = read_private(&p.state).ok()?;
    serde_json::from_str(&text).ok()
}

/// Replace a name's state atomically (a new file renamed over the old one).
pub(super) fn write(p: &Paths, state: &State) -> Result<()> {
    let tmp = p.private.join(format!("{}.json.tmp", p.name));
    let text = serde_json::to_string_pretty(state)
        .map_err(|e| ExportError::Failed(format!("cannot encode the state: {e}")))?;
    let _ = fs::remove_file(&tmp);
    let mut f =
        create_private(&tmp, true).map_err(io_err(format!("{}: cannot write", tmp.display())))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .map_err(io_err(format!("{}: cannot write", tmp.display())))?;
    fs::rename(&tmp, &p.state).map_err(io_err(format!("{}: cannot write", p.state.display())))
}

/// The start time of process `pid` in clock ticks since boot (`None` if it is gone).
pub(super) fn start_ticks(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name (which may itself hold ')'): state is the
    // 3rd field of the line, starttime the 22nd.
    let rest = s.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// How many threads of process `pid` are still there (0 if it is gone). A process whose main
/// thread has exited shows as a zombie while its other threads finish, and those still hold
/// its files.
pub(super) fn threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// The one-letter state of process `pid` (R, S, D, T, Z, ...), `None` if it is gone.
pub(super) fn process_state(pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_and_state() {
        let me = std::process::id();
        let t = start_ticks(me).unwrap();
        assert!(t > 0);
        assert_eq!(start_ticks(me), Some(t));
        // The main thread's state: the test harness may be waiting (S) or running (R).
        assert!(matches!(process_state(me), Some('R' | 'S')));
        assert!(threads(me) >= 1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        assert!(threads(me) >= 2, "this thread and the one it started");
        drop(tx);
        t.join().unwrap().ok();
        assert_eq!(threads(u32::MAX), 0, "a process that is not there has none");
    }
}
