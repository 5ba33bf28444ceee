//! device-mapper's "still in use": `close` refuses a device that is mounted or open (exit 5)
//! and the filesystem on it keeps working; `--deferred` closes it when the last user goes and
//! `--cancel-deferred` withdraws that; a stopped server still closes promptly; a dead server is
//! reported as inactive (exit 4) and `close` cleans up after it.
//!
//! Needs root, /dev/fuse and loop devices (mkfs.ext4, mount, debugfs for the filesystem
//! tests): missing ones fail the test when `CI` is set and skip it otherwise.

mod common;

use common::env::{fuse_missing, loop_missing, tool_missing};
use common::run::{ok, output, Workspace};
use common::status_field;
use common::sys::{kill, loop_backing, mounted, pid_gone, process_state, wait_until};
use std::fs;
use std::path::Path;

/// A workspace with a zeroed 32 MiB backing file `disk.img`.
fn workspace() -> Workspace {
    let w = Workspace::new();
    w.sparse("disk.img", 32 << 20);
    w
}

/// `dmkit linear open disk.img NAME extra...`; returns the output lines (file, loop device).
fn open(w: &Workspace, name: &str, extra: &[&str]) -> Vec<String> {
    let disk = w.s("disk.img");
    let mut args = vec!["linear", "open", disk.as_str(), name];
    args.extend_from_slice(extra);
    let out = w.run.ok(&args);
    w.run.track(name);
    out.lines().map(str::to_string).collect()
}

fn pid_of(w: &Workspace, name: &str) -> u32 {
    let v: serde_json::Value =
        serde_json::from_slice(&w.dmkit(&["status", name, "--json"]).stdout).unwrap();
    v["pid"].as_u64().expect("pid") as u32
}

fn status_text(w: &Workspace, name: &str) -> String {
    String::from_utf8_lossy(&w.dmkit(&["status", name]).stdout).into_owned()
}

#[test]
fn close_refuses_a_mounted_device_and_deferred_close_waits_for_the_unmount() {
    if loop_missing()
        || tool_missing("mkfs.ext4", "e2fsprogs")
        || tool_missing("debugfs", "e2fsprogs")
    {
        return;
    }
    let w = workspace();
    let lines = open(&w, "fs", &["--loop"]);
    let (file, dev) = (Path::new(&lines[0]).to_path_buf(), lines[1].clone());
    ok("mkfs.ext4", &["-q", &dev]);
    let mnt = w.path("mnt");
    fs::create_dir(&mnt).unwrap();
    ok("mount", &[dev.as_str(), mnt.to_str().unwrap()]);
    let unmount = unmount_on_drop(&mnt);
    fs::write(mnt.join("before"), "written before close").unwrap();

    let r = w.run.run(&["close", "fs"]);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    assert!(
        r.stderr.contains("device fs is still in use"),
        "{}",
        r.describe()
    );
    assert!(
        r.stderr
            .contains(&format!("{dev} is mounted on {}", mnt.display())),
        "{}",
        r.describe()
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.describe());
    // Nothing was torn down: the filesystem still works.
    assert!(mounted(&file));
    fs::write(mnt.join("after"), "written after the refused close").unwrap();
    ok("sync", &[mnt.join("after").to_str().unwrap()]);
    assert_eq!(
        fs::read_to_string(mnt.join("before")).unwrap(),
        "written before close"
    );

    // Deferred: accepted at once, the device stays until the last user goes...
    let pid = pid_of(&w, "fs");
    w.run.ok(&["close", "--deferred", "fs"]);
    assert!(status_field(&status_text(&w, "fs"), "deferred close").is_some());
    // ... and can be withdrawn.
    w.run.ok(&["close", "--cancel-deferred", "fs"]);
    assert!(status_field(&status_text(&w, "fs"), "deferred close").is_none());
    w.run.ok(&["close", "--deferred", "fs"]);
    assert!(!pid_gone(pid));
    drop(unmount);
    wait_until("the deferred close", || pid_gone(pid));
    assert!(!mounted(&file) && !file.exists());
    wait_until("the loop device to let go", || {
        loop_backing(&dev).as_deref() != Some(file.to_str().unwrap())
    });
    let r = w.run.run(&["status", "fs"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    // Both files reached the disk.
    let cat = |f: &str| ok("debugfs", &["-R", &format!("cat /{f}"), &w.s("disk.img")]);
    assert_eq!(cat("before"), "written before close");
    assert_eq!(cat("after"), "written after the refused close");
}

/// Unmounts `mnt` when dropped (also when the test fails).
fn unmount_on_drop(mnt: &Path) -> impl Drop + '_ {
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = output("umount", &[self.0]);
        }
    }
    Unmount(mnt)
}

#[test]
fn close_refuses_an_open_file_and_deferred_close_follows_its_release() {
    if fuse_missing() {
        return;
    }
    let w = workspace();
    let lines = open(&w, "held", &[]);
    let file = Path::new(&lines[0]).to_path_buf();
    let handle = fs::File::open(&file).unwrap();
    let r = w.run.run(&["close", "held"]);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    assert!(r.stderr.contains("still in use"), "{}", r.describe());
    assert!(r.stderr.contains("1 open file handle"), "{}", r.describe());
    assert!(
        r.stderr.contains(&format!("pid {}", std::process::id())),
        "{}",
        r.describe()
    );
    assert_eq!(
        status_field(&status_text(&w, "held"), "open handles").as_deref(),
        Some("1")
    );

    // A deferred close of a device nobody uses happens at once.
    drop(handle);
    let pid = pid_of(&w, "held");
    let handle = fs::File::open(&file).unwrap();
    w.run.ok(&["close", "--deferred", "held"]);
    assert!(mounted(&file));
    drop(handle);
    wait_until("the deferred close", || pid_gone(pid));
    assert!(!file.exists());

    open(&w, "idle", &[]);
    let pid = pid_of(&w, "idle");
    w.run.ok(&["close", "--deferred", "idle"]);
    assert!(pid_gone(pid));
    let r = w.run.run(&["close", "--cancel-deferred", "idle"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
}

#[test]
fn a_stopped_server_still_closes_promptly() {
    if fuse_missing() {
        return;
    }
    let w = workspace();
    open(&w, "stopped", &[]);
    let pid = pid_of(&w, "stopped");
    kill(pid, libc::SIGSTOP);
    wait_until("the server to stop", || process_state(pid) == Some('T'));
    // Within the command time limit, and cleanly (the server was continued, not killed).
    let r = w.run.run(&["close", "stopped"]);
    r.assert_ok();
    assert!(pid_gone(pid));
    let log = fs::read_to_string(w.run.path().join(".dmkit/stopped.log")).unwrap();
    assert!(log.contains("dmkit: closed"), "{log}");
}

#[test]
fn a_dead_server_is_inactive_and_close_cleans_up() {
    if loop_missing() {
        return;
    }
    let w = workspace();
    let lines = open(&w, "dead", &["--loop"]);
    let file = Path::new(&lines[0]).to_path_buf();
    let pid = pid_of(&w, "dead");
    kill(pid, libc::SIGKILL);
    wait_until("the server's death", || pid_gone(pid));
    let r = w.run.run(&["status", "dead"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    assert!(
        r.stdout.contains("is inactive: its server died"),
        "{}",
        r.describe()
    );
    let r = w.run.run(&["status", "dead", "--json"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["state"], "dead");
    // Listing everything is still a success.
    w.run.ok(&["status"]);
    let r = w.run.run(&["close", "dead"]);
    r.assert_ok();
    assert!(r.stderr.contains("its server had died"), "{}", r.describe());
    assert!(!mounted(&file) && !file.exists());
    wait_until("the loop device to let go", || {
        loop_backing(&lines[1]).as_deref() != Some(file.to_str().unwrap())
    });
    // No stale claim: the backing file opens read-write again at once.
    open(&w, "again", &[]);
    w.run.close("again");
}
