//! Online reencryption as the tests drive it: a `luks reencrypt NAME` started in the
//! background, waiting until it is mid-way, `status --json` of an open device, and synced
//! writes and reads of the served file.

use super::run::Workspace;
use std::fs;
use std::os::unix::fs::FileExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Cheap keyslots for the tests' formats and reencryptions.
pub const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// `len` bytes of a pattern that differs with `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[2] ^ seed)
        .collect()
}

/// Write `data` at `off` of `path` and fsync it.
pub fn write_synced(path: &str, off: u64, data: &[u8]) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
    f.sync_all().unwrap();
}

/// `len` bytes at `off` of `path`.
pub fn read(path: &str, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, off)
        .unwrap();
    b
}

/// `dmkit status NAME --json`, the device's object.
pub fn status(e: &Workspace, name: &str) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_slice(&e.dmkit(&["status", name, "--json"]).stdout).unwrap();
    match v {
        serde_json::Value::Array(mut a) => a.remove(0),
        v => v,
    }
}

/// `dmkit luks reencrypt NAME ...` started in the background, JSON progress on its stdout.
pub fn start_reencrypt(e: &Workspace, name: &str, pass: &str, extra: &[&str]) -> Child {
    let mut args = vec![
        "luks",
        "reencrypt",
        name,
        "--key-file",
        pass,
        "--batch-mode",
    ];
    args.extend(FAST);
    args.push("--progress-json");
    args.extend(extra);
    super::run::command(super::DMKIT, &args, Some(e.run.path()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait until the online reencryption of `name` has done some but not all of its work; the
/// bytes done.
pub fn wait_mid_way(e: &Workspace, name: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = &status(e, name)["reencryption"];
        let (done, size) = (
            r["done"].as_u64().unwrap_or(0),
            r["size"].as_u64().unwrap_or(0),
        );
        if done > 0 {
            assert!(
                done < size,
                "the reencryption finished before it could be interrupted"
            );
            return done;
        }
        assert!(Instant::now() < deadline, "no reencryption progress: {r}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// After a killed server, on the device `dev` reopened as `name`: it serves `want`, `luks
/// reencrypt NAME` with `resume` finishes online, it still serves `want`, and it is closed.
pub fn resume_served(
    e: &Workspace,
    dev: &str,
    name: &str,
    pass: &str,
    want: &[u8],
    resume: &[&str],
) {
    assert!(
        read(dev, 0, want.len()) == want,
        "read back differs after the crash"
    );
    let r = start_reencrypt(e, name, pass, resume)
        .wait_with_output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        read(dev, 0, want.len()) == want,
        "read back differs after resume"
    );
    e.run.close(name);
}
