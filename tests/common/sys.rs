//! Looking at the system from tests: mounts, processes, loop devices, aligned buffers.

use std::path::Path;
use std::time::{Duration, Instant};

/// Whether something is mounted at `path` (as /proc/self/mountinfo spells it).
pub fn mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap().replace(' ', "\\040");
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Whether process `pid` is gone (a zombie with no thread left counts as gone).
pub fn pid_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie leader is gone only once it is the last task of its group: its other
        // threads (a FUSE or ring thread finishing a request) may still be exiting, and they
        // hold the process's files (its lock, its control socket) until they are done.
        Ok(s) => {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                && std::fs::read_dir(format!("/proc/{pid}/task")).map_or(true, |d| d.count() <= 1)
        }
        Err(_) => true,
    }
}

/// The state letter /proc/PID/stat shows for process `pid` (`'T'` stopped, `'Z'` zombie...).
pub fn process_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls `f` until it holds; fails the test after 15 s, naming `what`.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A buffer of `len + 4096` bytes and the offset of its page-aligned window (for O_DIRECT).
pub fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 4096];
    let off = v.as_ptr().align_offset(4096);
    (v, off)
}

/// The backing file of loop device `dev` (`/dev/loopN`), from sysfs.
pub fn loop_backing(dev: &str) -> Option<String> {
    let name = Path::new(dev).file_name()?.to_str()?.to_string();
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Sends `sig` to `pid`.
pub fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process the test started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill {pid}");
}
