//! `close` and `status` take what `status` prints: a device's name, its exported file, or the
//! mount point of a tree (absolute or relative), and a name printed for typing back is one
//! shell word. A path that stands for nothing open is one clear line and exit 4.

mod common;

use common::env::fuse_missing;
use common::run::{assert_refused, command, output_within, Run, Workspace};
use common::status_field;
use common::sys::{kill, mounted, pid_gone, wait_until};
use std::fs;
use std::path::Path;
use std::time::Duration;

/// `dmkit args...` in `ws`'s run directory, from the working directory `cwd`.
fn dmkit_in(ws: &Workspace, cwd: &Path, args: &[&str]) -> Run {
    let mut cmd = command(common::DMKIT, args, Some(ws.run.path()));
    cmd.current_dir(cwd);
    let what = format!("(cd {}; dmkit {})", cwd.display(), args.join(" "));
    Run::new(what, &output_within(&mut cmd, Duration::from_secs(60)))
}

#[test]
fn close_and_status_by_the_exported_file() {
    if fuse_missing() {
        return;
    }
    let ws = Workspace::new();
    fs::write(ws.path("img"), vec![7u8; 1 << 20]).unwrap();
    let out = ws.run.ok(&["linear", "open", &ws.s("img"), "lin"]);
    ws.run.track("lin");
    let file = out.lines().next().unwrap().to_string();
    assert_eq!(Path::new(&file), ws.run.path().join("lin"));

    // Absolute and relative (from the run directory's parent) paths of the file.
    let r = ws.run.run(&["status", &file]).ok();
    assert_eq!(
        r.stdout.lines().next(),
        Some(&*format!("{file} is active."))
    );
    let parent = ws.run.path().parent().unwrap();
    let r = dmkit_in(&ws, parent, &["status", "run/lin", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["name"], "lin");

    // The layers' own close and status are the same commands.
    ws.run.run(&["luks", "status", &file]).assert_ok();
    ws.run.run(&["integrity", "status", &file]).assert_ok();
    dmkit_in(&ws, parent, &["verity", "close", "./run/lin"]).assert_ok();
    assert!(!mounted(Path::new(&file)), "{file} still mounted");
    let r = ws.run.run(&["status", &file]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    assert_eq!(r.stdout.trim(), format!("{file} is inactive."));
}

#[test]
fn close_and_status_by_mount_point() {
    if fuse_missing() {
        return;
    }
    let ws = Workspace::new();
    let tree = ws.path("tree");
    fs::create_dir(&tree).unwrap();
    fs::write(tree.join("a"), b"sealed").unwrap();
    ws.run.ok(&["fsverity", "seal", &ws.s("tree")]);
    // A dash in the mount point: the derived name has a `\x2d` escape in it.
    let mp = ws.path("my-tree");
    fs::create_dir(&mp).unwrap();
    let mp_s = mp.to_str().unwrap();
    ws.run.ok(&["fsverity", "mount", &ws.s("tree"), mp_s]);
    let r = ws.run.run(&["status"]).ok();
    assert_eq!(
        r.stdout.lines().next(),
        Some(&*format!("{mp_s} is active.")),
        "{}",
        r.describe()
    );
    // The name row is the escaped name as one shell word: single-quoted, backslash kept.
    let shown = status_field(&r.stdout, "name").expect("a name row");
    let name = shown
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or_else(|| panic!("name not quoted: {shown}"));
    assert!(name.contains(r"\x2d"), "{name}");
    ws.run.run(&["status", name]).assert_ok();
    // By mount point, absolute and relative.
    ws.run.run(&["status", mp_s]).assert_ok();
    dmkit_in(&ws, ws.dir(), &["status", "my-tree"]).assert_ok();
    // A killed server: the hint names the mount point, and closing by it cleans up.
    let v: serde_json::Value =
        serde_json::from_str(&ws.run.ok(&["status", mp_s, "--json"])).unwrap();
    let pid = v["pid"].as_u64().unwrap() as u32;
    kill(pid, libc::SIGKILL);
    wait_until("the server is gone", || pid_gone(pid));
    let r = ws.run.run(&["status"]);
    assert!(
        r.stdout
            .contains(&format!("`dmkit close {mp_s}` cleans up")),
        "{}",
        r.describe()
    );
    dmkit_in(&ws, ws.dir(), &["close", "my-tree/"]).assert_ok();
    assert!(!mounted(&mp), "still mounted");
    let r = ws.run.run(&["status", mp_s]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
}

#[test]
fn a_path_that_is_not_open_is_one_line() {
    let ws = Workspace::new();
    let nowhere = ws.path("nowhere");
    fs::create_dir(&nowhere).unwrap();
    for cmd in ["close", "status"] {
        let r = ws.run.run(&[cmd, nowhere.to_str().unwrap()]);
        assert_refused(
            &r,
            4,
            &[&[nowhere.to_str().unwrap()], &["no device or mount"]],
        );
    }
    // A name that is not open stays the old message.
    let r = ws.run.run(&["close", "nosuch"]);
    assert_refused(&r, 4, &[&["nosuch"], &["not active"]]);
}
