//! `dmkit image open` as an ordinary user: the image's tree served by dmkit's FUSE server from
//! the userspace reader, with a writable layer from fuse-overlayfs or from the kernel's
//! OverlayFS in the server's user namespace. Run as `nobody` (the test drops root itself with
//! setpriv; run without root it runs as the user it is):
//!
//! - every file, directory and symlink read through the mount agrees with `image mtree` of the
//!   same image (type, mode, size, SHA-256, link target; the user owns every node there);
//! - writes land in the upper layer, the image is not changed, `status` names the mode;
//! - `close` leaves no mount, no process and no directory behind;
//! - a flipped byte in one file's data fails that file with EIO, and only it;
//! - bad input is refused in one line, with nothing left behind.
//!
//! Needs mkfs.erofs, fusermount3, fuse-overlayfs and unprivileged user namespaces: skipped with
//! a reason outside CI, a failure in CI.

mod common;

use common::env::{in_ci, is_root, missing, tool_missing};
use common::run::{output, Workspace};
use common::xor_byte;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const DMKIT: &str = common::DMKIT;

fn prerequisites() -> bool {
    if !is_root() && in_ci() {
        return missing("CI runs as root, and the test drops to nobody itself: not root here");
    }
    tool_missing("mkfs.erofs", "erofs-utils")
        || tool_missing("fusermount3", "fuse3")
        || tool_missing("fuse-overlayfs", "fuse-overlayfs")
        || (is_root() && tool_missing("setpriv", "util-linux"))
}

/// An image and the unprivileged user's run directory and mount point beside it.
struct Setup {
    _ws: Workspace,
    tree: PathBuf,
    img: PathBuf,
    run: PathBuf,
    mnt: PathBuf,
}

impl Setup {
    fn new() -> Option<Setup> {
        if prerequisites() {
            return None;
        }
        let ws = Workspace::new();
        let tree = ws.path("tree");
        let w = |rel: &str, data: &[u8], mode: u32| {
            let p = tree.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, data).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        w("etc/hostname", b"demo\n", 0o644);
        w("etc/secret", b"root only\n", 0o600);
        w("empty", b"", 0o644);
        for (i, n) in [1usize, 4095, 4096, 4097, 300 << 10]
            .into_iter()
            .enumerate()
        {
            w(
                &format!("sizes/f{n}"),
                &common::rng::bytes(40 + i as u64, n),
                0o644,
            );
        }
        w("bin/tool", &common::rng::bytes(50, 70 << 10), 0o755);
        std::fs::create_dir_all(tree.join("emptydir")).unwrap();
        std::os::unix::fs::symlink("bin/tool", tree.join("link")).unwrap();
        std::os::unix::fs::symlink("x/".repeat(60) + "target", tree.join("long-link")).unwrap();
        std::fs::hard_link(tree.join("bin/tool"), tree.join("bin/tool-hard")).unwrap();
        let pub_dir = common::run::world_dir(&ws, "pub");
        let img = pub_dir.join("root.img");
        let out = output(
            DMKIT,
            &[
                "image",
                "build",
                "--timestamp",
                "1700000000",
                tree.to_str().unwrap(),
                img.to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::set_permissions(&img, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mnt = pub_dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
        let run = pub_dir.join("run");
        Some(Setup {
            _ws: ws,
            tree,
            img,
            run,
            mnt,
        })
    }

    /// `PROGRAM ARGS` as the unprivileged user (nobody, when we are root), with this setup's
    /// run directory.
    fn user(&self, program: &str, args: &[&str]) -> Output {
        let mut cmd = if is_root() {
            let mut c = std::process::Command::new("setpriv");
            c.args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                program,
            ]);
            c
        } else {
            std::process::Command::new(program)
        };
        cmd.args(args)
            .env("DMKIT_RUN_DIR", &self.run)
            .env_remove("XDG_RUNTIME_DIR");
        common::run::output_within(&mut cmd, Duration::from_secs(60))
    }

    fn dmkit(&self, args: &[&str]) -> Output {
        self.user(DMKIT, args)
    }

    fn sh(&self, script: &str) -> Output {
        self.user("sh", &["-c", script])
    }

    /// `sh -c SCRIPT` as the user, in the mount namespace of server `pid` when given (where a
    /// userns-mode stack is mounted; its FUSE tree answers only the namespace's processes).
    fn sh_in(&self, pid: Option<u64>, script: &str) -> Output {
        match pid {
            None => self.sh(script),
            Some(p) => self.user(
                "nsenter",
                &[
                    "-t",
                    &p.to_string(),
                    "-U",
                    "-m",
                    "--preserve-credentials",
                    "sh",
                    "-c",
                    script,
                ],
            ),
        }
    }

    fn mnt_s(&self) -> &str {
        self.mnt.to_str().unwrap()
    }

    /// Open as the user with `overlay`; the JSON `open` printed.
    fn open(&self, overlay: &str) -> Value {
        let out = self.dmkit(&[
            "image",
            "open",
            "--json",
            "--overlay",
            overlay,
            self.img.to_str().unwrap(),
            self.mnt_s(),
        ]);
        assert!(
            out.status.success(),
            "open --overlay {overlay}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Setup {
    /// A test that failed half-way still closes what it opened (a no-op after `close`).
    fn drop(&mut self) {
        let _ = self.dmkit(&["image", "close", self.mnt_s()]);
    }
}

/// One node as `image mtree` describes it, without owners: type, mode, size, SHA-256, target.
type Desc = BTreeMap<String, String>;

/// `image mtree` lines by path (`./a`, directories with their `/` dropped), owners apart.
fn parse_mtree(text: &str) -> (Desc, BTreeMap<String, String>) {
    let mut desc = BTreeMap::new();
    let mut owners = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split(' ');
        let path = it.next().unwrap().trim_end_matches('/').to_string();
        let mut fields = Vec::new();
        let mut own = Vec::new();
        for f in it {
            if f.starts_with("uid=") || f.starts_with("gid=") {
                own.push(f.to_string());
            } else {
                fields.push(f.to_string());
            }
        }
        desc.insert(path.clone(), fields.join(" "));
        owners.insert(path, own.join(" "));
    }
    (desc, owners)
}

/// The same description of the tree at `root`, read as the user through the mount: find(1)
/// for types, modes, sizes and targets, sha256sum(1) for contents.
fn walk(s: &Setup, ns: Option<u64>, root: &str) -> (Desc, BTreeMap<String, String>) {
    let out = s.sh_in(ns, &format!(
        "cd '{root}' && find . -printf '%y %m %s %U %G %p|%l\\n' && echo --- && find . -type f -exec sha256sum {{}} +"
    ));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "walk of {root}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (list, sums) = text.split_once("---\n").unwrap();
    let sums: BTreeMap<&str, &str> = sums
        .lines()
        .map(|l| {
            let (h, p) = l.split_once("  ").unwrap();
            (p, h)
        })
        .collect();
    let mut desc = BTreeMap::new();
    let mut owners = BTreeMap::new();
    for l in list.lines() {
        let (head, target) = l.split_once('|').unwrap();
        let mut it = head.splitn(6, ' ');
        let (ty, mode, size, uid, gid, path) = (
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
        );
        let mode = format!("mode={:04o}", u32::from_str_radix(mode, 8).unwrap());
        let d = match ty {
            "d" => format!("type=dir {mode}"),
            "l" => format!("type=link link={target}"),
            "f" if size == "0" => format!("type=file {mode} size=0"),
            "f" => format!("type=file {mode} size={size} sha256sum={}", sums[path]),
            other => format!("type={other} {mode}"),
        };
        let path = path.to_string();
        desc.insert(path.clone(), d);
        owners.insert(path, format!("uid={uid} gid={gid}"));
    }
    (desc, owners)
}

/// Whether anything under `p` (a path prefix) is mounted in this mount namespace.
fn mounted_under(p: &Path) -> Vec<String> {
    let want = p.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(want)))
        .map(String::from)
        .collect()
}

/// Processes (not zombies) whose command line mentions `needle`, and process `pid` if alive.
fn living(needle: &str, pid: Option<u64>) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(n) = e.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if zombie || stat.is_empty() {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if Some(n) == pid || (cmd.contains(needle) && n != std::process::id() as u64) {
            found.push(format!("{n}: {cmd}"));
        }
    }
    found
}

/// After `close`: no mount under the mount point or the run directory, no server or
/// fuse-overlayfs left, and of the run directory only the server's log.
fn assert_nothing_left(s: &Setup, pid: Option<u64>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = living(s.run.to_str().unwrap(), pid);
        if procs.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left running: {procs:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mounted_under(&s.mnt), Vec::<String>::new());
    assert_eq!(mounted_under(&s.run), Vec::<String>::new());
    let mut left = Vec::new();
    for e in walkdir(&s.run) {
        if e.extension().is_none_or(|x| x != "log") && e != s.run.join(".dmkit") {
            left.push(e);
        }
    }
    assert_eq!(left, Vec::<PathBuf>::new(), "left in the run directory");
    assert_eq!(std::fs::read_dir(&s.mnt).unwrap().count(), 0);
}

fn walkdir(d: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(walkdir(&p));
            }
            v.push(p);
        }
    }
    v
}

/// Both rootless modes: the tree agrees with `image mtree`, writes go to the upper layer,
/// `status` names the mode, `close` leaves nothing.
/// Whether `nobody` may create a user namespace here (the userns overlay mode needs it). A
/// machine (or container) that forbids it truly lacks the mode: it is skipped, saying why.
fn userns_allowed() -> bool {
    let ok = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "unshare",
            "--user",
            "true",
        ])
        .status()
        .is_ok_and(|st| st.success());
    if !ok {
        eprintln!(
            "userns overlay mode skipped: nobody may not create a user namespace here \
             (unprivileged user namespaces are off)"
        );
    }
    ok
}

#[test]
fn rootless_open_reads_writes_and_closes_clean() {
    let Some(s) = Setup::new() else {
        return;
    };
    let img_s = s.img.to_str().unwrap();
    let before = std::fs::read(&s.img).unwrap();
    let out = s.dmkit(&["image", "mtree", img_s]);
    assert!(out.status.success());
    let (want, want_owners) = parse_mtree(&String::from_utf8(out.stdout).unwrap());
    assert!(want.len() > 12, "{want:?}");
    let userns = userns_allowed();
    for (overlay, mode) in [
        ("fuse-overlayfs", "rootless fuse+fuse-overlayfs"),
        ("userns", "rootless fuse+userns-overlay"),
    ] {
        if overlay == "userns" && !userns {
            continue;
        }
        let t = Instant::now();
        let o = s.open(overlay);
        assert_eq!(o["mode"], mode);
        let pid = o["server_pid"].as_u64().unwrap();
        // Where the writable tree is, and the read-only tree under it.
        let merged = if overlay == "userns" {
            format!("/proc/{pid}/root{}", s.mnt_s())
        } else {
            s.mnt_s().to_string()
        };
        let st = s.dmkit(&["image", "status", "--json", s.mnt_s()]);
        assert!(st.status.success());
        let st: Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(st["details"]["mode"], mode);
        assert_eq!(st["mounted"]["overlay"], true, "{st}");
        assert_eq!(st["mounted"]["lower"], true, "{st}");
        let lower = st["details"]["lower"].as_str().unwrap().to_string();
        let ns = (overlay == "userns").then_some(pid);

        // The whole tree, read through the merged mount, is the image's.
        let (got, got_owners) = walk(&s, None, &merged);
        assert_eq!(got, want, "{overlay}: merged tree");
        // The user owns what they see there (root in the namespace, or squashed)...
        let me = if is_root() { "65534" } else { "" };
        if !me.is_empty() {
            assert!(
                got_owners
                    .values()
                    .all(|o| o == &format!("uid={me} gid={me}")),
                "{got_owners:?}"
            );
        }
        // ... and in the read-only tree, served as the user's so that root-only files read.
        let (low, low_owners) = walk(&s, ns, &lower);
        assert_eq!(low, want, "{overlay}: read-only tree");
        if ns.is_none() {
            assert_eq!(low_owners, got_owners);
        } else {
            // Root in the namespace is the user outside it.
            assert!(
                low_owners.values().all(|o| o == "uid=0 gid=0"),
                "{low_owners:?}"
            );
        }
        assert!(want_owners.values().all(|o| o == "uid=0 gid=0"));

        // Writes land in the upper layer.
        let w = s.sh(&format!(
            "set -e; cd '{merged}'; echo written > etc/motd; echo more >> etc/hostname; \
             mkdir -p new/dir; echo x > new/dir/f; rm sizes/f1; cat etc/motd etc/hostname"
        ));
        assert!(
            w.status.success(),
            "{overlay}: writes: {}",
            String::from_utf8_lossy(&w.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&w.stdout), "written\ndemo\nmore\n");
        let upper = st["details"]["upper"].as_str().unwrap();
        let u = s.sh_in(ns, &format!("cat '{upper}/etc/motd' '{upper}/new/dir/f'"));
        assert_eq!(
            String::from_utf8_lossy(&u.stdout),
            "written\nx\n",
            "{overlay}"
        );
        let r = s.sh_in(ns, &format!("cat '{lower}/etc/hostname'"));
        assert_eq!(String::from_utf8_lossy(&r.stdout), "demo\n");
        // Read-only, whoever asks.
        let ro = s.sh_in(ns, &format!("echo x > '{lower}/etc/hostname'"));
        assert!(!ro.status.success());

        let c = s.dmkit(&["image", "close", s.mnt_s()]);
        assert!(
            c.status.success(),
            "{overlay}: close: {}",
            String::from_utf8_lossy(&c.stderr)
        );
        assert_nothing_left(&s, Some(pid));
        eprintln!("{overlay}: open, walk, write, close: {:?}", t.elapsed());
    }
    assert!(
        std::fs::read(&s.img).unwrap() == before,
        "the image changed"
    );
    // The tree the image was built from is what the mount showed.
    assert_eq!(
        std::fs::read(s.tree.join("etc/hostname")).unwrap(),
        b"demo\n"
    );
}

/// A flipped byte in one file's data: that file fails with EIO through the mount, every
/// other file reads, `status` counts the corruption.
#[test]
fn a_corrupt_block_fails_only_its_file() {
    let Some(s) = Setup::new() else {
        return;
    };
    let data = std::fs::read(&s.img).unwrap();
    let needle = std::fs::read(s.tree.join("sizes/f307200")).unwrap();
    let at = data
        .windows(64)
        .position(|w| w == &needle[200_000..200_064])
        .unwrap();
    xor_byte(&s.img, at as u64, 0x01);
    // Through the kernel's overlay in the user namespace, and through the read-only tree under
    // fuse-overlayfs (which itself answers a failed read with zeros: see `image open`'s
    // warning).
    let userns = userns_allowed();
    for overlay in ["userns", "fuse-overlayfs"] {
        if overlay == "userns" && !userns {
            continue;
        }
        let o = s.open(overlay);
        let pid = o["server_pid"].as_u64().unwrap();
        let st = s.dmkit(&["image", "status", "--json", s.mnt_s()]);
        let st: Value = serde_json::from_slice(&st.stdout).unwrap();
        let root = match overlay {
            "userns" => format!("/proc/{pid}/root{}", s.mnt_s()),
            _ => st["details"]["lower"].as_str().unwrap().to_string(),
        };
        let out = s.sh(&format!(
            "cd '{root}' && for f in $(find . -type f | sort); do cat \"$f\" > /dev/null 2>&1 || echo \"FAIL $f\"; done; cat sizes/f307200 > /dev/null"
        ));
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(text, "FAIL ./sizes/f307200\n", "{overlay}: {err} at {at}");
        assert!(err.contains("Input/output error"), "{err}");
        let st = s.dmkit(&["image", "status", "--json", s.mnt_s()]);
        let st: Value = serde_json::from_slice(&st.stdout).unwrap();
        assert!(st["stats"]["corruptions"].as_u64().unwrap() >= 1, "{st}");
        let c = s.dmkit(&["image", "close", s.mnt_s()]);
        assert!(c.status.success());
        assert_nothing_left(&s, Some(pid));
    }
}

/// Bad input: one line naming what is wrong, a non-zero exit, nothing left behind.
#[test]
fn bad_input_is_refused_in_one_line() {
    let Some(s) = Setup::new() else {
        return;
    };
    let img_s = s.img.to_str().unwrap();
    let plain = s.run.with_file_name("plain.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let truncated = s.run.with_file_name("short.img");
    std::fs::write(&truncated, &std::fs::read(&s.img).unwrap()[..300 << 10]).unwrap();
    std::fs::set_permissions(&truncated, std::fs::Permissions::from_mode(0o644)).unwrap();
    let nodir = s.run.with_file_name("nodir");
    let mnt = s.mnt_s();
    for (args, code, text) in [
        (
            vec!["image", "open", "/nonexistent.img", mnt],
            1,
            "/nonexistent.img",
        ),
        (
            vec!["image", "open", plain.to_str().unwrap(), mnt],
            1,
            "plain.img",
        ),
        (
            vec!["image", "open", truncated.to_str().unwrap(), mnt],
            1,
            "short.img",
        ),
        (
            vec!["image", "open", img_s, nodir.to_str().unwrap()],
            1,
            "nodir",
        ),
        (
            vec!["image", "open", "--root-hash", &"ab".repeat(32), img_s, mnt],
            2,
            "root.img",
        ),
        (vec!["image", "close", mnt], 4, "no image is open"),
    ] {
        let out = s.dmkit(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert_nothing_left(&s, None);
    }
    // Opened twice at one mount point: busy (5), the first one untouched.
    s.open("fuse-overlayfs");
    let out = s.dmkit(&["image", "open", img_s, mnt]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A busy mount point is not closed under its user.
    let mut holder = std::process::Command::new(if is_root() { "setpriv" } else { "sh" });
    if is_root() {
        holder.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh"]);
    }
    let mut holder = holder
        .args(["-c", &format!("cd '{mnt}/etc' && exec sleep 30")])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = s.dmkit(&["image", "close", mnt]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("in use"), "{err}");
    let _ = holder.kill();
    let _ = holder.wait();
    let c = s.dmkit(&["image", "close", mnt]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert_nothing_left(&s, None);
}
