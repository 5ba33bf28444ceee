//! What a careful Unix program does, checked: a closed stdout ends a command quietly (no
//! panic); a server keeps none of its caller's descriptors (a lock the caller holds, the pipe
//! of a `$(...)`); a run directory that is not ours, or a state file that names a process that
//! is not our server, is never trusted; counters agree and logs stay bounded however often a
//! reader retries a corrupt block.
//!
//! Needs root and /dev/fuse for the serving parts: missing ones fail the test when `CI` is set
//! and skip it otherwise.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::run::{command, output_within, Workspace};
use common::status_field;
use common::sys::pid_gone;
use common::DMKIT;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs dmkit with stdout a pipe nobody reads any more; returns (signal, exit code, stderr).
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, Option<i32>, String) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(rd);
    let out = Command::new(DMKIT)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(wr))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.signal(), out.status.code(), err)
}

#[test]
fn a_closed_stdout_ends_commands_quietly() {
    let w = Workspace::new();
    fs::write(w.path("data.img"), common::rng::bytes(1, 1 << 20)).unwrap();
    let (data, hash) = (w.s("data.img"), w.s("hash.img"));
    w.run.ok(&["verity", "format", &data, &hash]);
    fs::write(w.path("file.bin"), b"hello").unwrap();
    let file = w.s("file.bin");
    let commands: [&[&str]; 6] = [
        &["verity", "dump", &hash, "--json"],
        &["verity", "dump", &hash],
        &["verity", "format", "--json", &data, &w.s("hash2.img")],
        &["fsverity", "digest", &file],
        &["status", "--json"],
        &["--help"],
    ];
    for args in commands {
        let (signal, code, err) = with_closed_stdout(args);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // Like coreutils: ended by SIGPIPE, or done before noticing.
        assert!(
            signal == Some(libc::SIGPIPE) || code == Some(0),
            "{args:?}: signal {signal:?}, exit {code:?}: {err}"
        );
    }
}

#[test]
fn a_server_keeps_none_of_its_callers_descriptors() {
    if fuse_missing() || tool_missing("flock", "util-linux") {
        return;
    }
    let w = Workspace::new();
    let disk = w.sparse("disk.img", 1 << 20);
    let lock = w.s("caller.lock");
    // The caller holds a lock on fd 9 while it opens a device; once the caller is gone, the
    // lock must be free (the server did not inherit it).
    let script = format!("exec 9>{lock}; flock 9; {DMKIT} linear open {disk} held");
    let mut cmd = command("bash", &["-c", &script], Some(w.run.path()));
    let out = output_within(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.run.track("held");
    let f = fs::File::open(&lock).unwrap();
    // SAFETY: flock(2) on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "the caller's lock is still held after it exited");
    w.run.close("held");

    // `$(...)` with a copy of the capture pipe on fd 3: returns as soon as open does.
    let script = format!("out=$({DMKIT} linear open {disk} cap 3>&1); echo \"$out\"");
    let mut cmd = command("bash", &["-c", &script], Some(w.run.path()));
    let out = output_within(&mut cmd, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout)
        .trim()
        .ends_with("/cap"));
    w.run.track("cap");
    w.run.close("cap");
}

#[test]
fn run_directories_that_are_not_ours_are_refused() {
    if fuse_missing() {
        return;
    }
    let w = Workspace::new();
    let disk = w.sparse("disk.img", 1 << 20);
    for (name, mode, owner) in [("nobodys", 0o755, Some(65534)), ("shared", 0o777, None)] {
        let dir = w.path(name);
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
        }
        let mut cmd = command(DMKIT, &["linear", "open", &disk, "x"], Some(&dir));
        let out = output_within(&mut cmd, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains("refusing to use it as dmkit's run directory"),
            "{name}: {err}"
        );
        assert!(
            !dir.join(".dmkit").exists() && !dir.join("x").exists(),
            "{name}"
        );
    }
}

#[test]
fn a_state_naming_another_process_is_never_signalled() {
    if fuse_missing() {
        return;
    }
    let w = Workspace::new();
    let private = w.run.path().join(".dmkit");
    fs::create_dir_all(&private).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let mut victim = Command::new("sleep").arg("60").spawn().unwrap();
    // A stale state (from a server long gone, its pid since reused): the lock is held (here by
    // the test), nothing answers on the socket, and the pid is an unrelated process.
    let state = serde_json::json!({
        "name": "ghost", "kind": "linear", "pid": victim.id(), "start_ticks": 1,
        "path": w.run.path().join("ghost"), "loop_device": null, "size": 4096,
        "read_only": true, "allow_discards": false, "threads": 1, "started": 0,
        "log": private.join("ghost.log"), "details": {}
    });
    fs::write(private.join("ghost.json"), state.to_string()).unwrap();
    let lock = fs::File::create(private.join("ghost.lock")).unwrap();
    // SAFETY: flock(2) on a descriptor we own.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let r = w.run.run(&["close", "ghost"]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("not signalling it"), "{}", r.describe());
    assert!(!pid_gone(victim.id()), "close killed an unrelated process");
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn counters_agree_and_corruption_logs_stay_bounded() {
    if fuse_missing() {
        return;
    }
    let w = Workspace::new();
    fs::write(w.path("data.img"), common::rng::bytes(2, 1 << 20)).unwrap();
    let (data, hash) = (w.s("data.img"), w.s("hash.img"));
    let out = w.run.ok(&["verity", "format", "--json", &data, &hash]);
    let root: serde_json::Value = serde_json::from_str(&out).unwrap();
    let root = root["root_hash"].as_str().unwrap().to_string();
    common::xor_byte(&w.path("data.img"), 5 * 4096 + 17, 0x40);
    let read_block_5 = |file: &str, times: usize| -> usize {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(file)
            .unwrap();
        let (mut v, off) = common::sys::aligned(4096);
        (0..times)
            .filter(|_| f.read_exact_at(&mut v[off..off + 4096], 5 * 4096).is_err())
            .count()
    };

    // Ignored corruption: the reader gets the data, no I/O error, one corruption counted.
    let args = ["verity", "open", "--ignore-corruption", "--data-cache", "0"];
    let mut open = args.to_vec();
    open.extend([data.as_str(), "ign", hash.as_str(), root.as_str()]);
    let file = w.run.ok(&open).trim().to_string();
    w.run.track("ign");
    assert_eq!(read_block_5(&file, 1), 0);
    let text = w.run.ok(&["status", "ign"]);
    assert_eq!(
        status_field(&text, "I/O errors").as_deref(),
        Some("0"),
        "{text}"
    );
    assert_eq!(
        status_field(&text, "corruptions").as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        status_field(&text, "data corruptions").as_deref(),
        Some("1"),
        "{text}"
    );
    w.run.close("ign");

    // Refused corruption, read 5000 times: every read fails and is counted, the log is capped.
    let mut open = vec!["verity", "open", "--data-cache", "0"];
    open.extend([data.as_str(), "eio", hash.as_str(), root.as_str()]);
    let file = w.run.ok(&open).trim().to_string();
    w.run.track("eio");
    assert_eq!(read_block_5(&file, 5000), 5000);
    let text = w.run.ok(&["status", "eio"]);
    let n = |k: &str| status_field(&text, k).unwrap().parse::<u64>().unwrap();
    assert!(n("I/O errors") >= 5000, "{text}");
    assert_eq!(n("corruptions"), n("data corruptions"), "{text}");
    assert!(n("corruptions") >= 5000, "{text}");
    w.run.close("eio");
    let log = fs::read_to_string(w.run.path().join(".dmkit/eio.log")).unwrap();
    let lines = log.lines().filter(|l| l.contains("corrupt")).count();
    assert!((100..=102).contains(&lines), "{lines} lines:\n{log}");
    assert!(log.contains("further ones are only counted"), "{log}");
}
