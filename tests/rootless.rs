//! Serving without root: an unprivileged user created for the test opens a device (mounted
//! through fusermount3 under `$XDG_RUNTIME_DIR/dmkit`), reads it, sees its status and closes
//! it. Only that user can read the decrypted/served data (not even root, without
//! `allow_other`); the server is not dumpable (its /proc files are not the user's to read);
//! `--loop` is refused with a clear message; `status` as that user of root's device says whose
//! it is.
//!
//! Needs root (to create the user), /dev/fuse usable by everyone (mode 0666, as Debian's udev
//! sets it), fusermount3 (fuse3), useradd and setpriv: missing ones fail the test when `CI` is
//! set and skip it otherwise.

mod common;

use common::env::{is_root, missing, tool_missing};
use common::run::{ok, output_within, Run};
use common::sys::mounted;
use common::DMKIT;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A system user that exists for the test's duration.
struct User {
    name: String,
    uid: u32,
}

impl User {
    fn create() -> User {
        let name = format!("dmkt{}", std::process::id());
        ok(
            "useradd",
            &[
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ],
        );
        let uid = ok("id", &["-u", &name]).trim().parse().unwrap();
        User { name, uid }
    }

    /// `program args...` as this user, with only PATH and XDG_RUNTIME_DIR in the environment.
    fn run(&self, xdg: &Path, program: &Path, args: &[&str]) -> Run {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid",
            &self.name,
            "--regid",
            &self.name,
            "--clear-groups",
            "--",
        ])
        .arg("env")
        .arg("-i")
        .arg("PATH=/usr/sbin:/usr/bin:/sbin:/bin")
        .arg(format!("XDG_RUNTIME_DIR={}", xdg.display()))
        .arg(program)
        .args(args);
        let out = output_within(&mut cmd, Duration::from_secs(60));
        Run {
            what: format!("{} {args:?} as {}", program.display(), self.name),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-u", &self.name])
            .status();
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

fn prerequisites_missing() -> bool {
    if !is_root() {
        return missing("not running as root (creating a user needs it)");
    }
    let fuse_mode = fs::metadata("/dev/fuse").map(|m| m.mode() & 0o777);
    if fuse_mode.map(|m| m & 0o006 != 0o006).unwrap_or(true) {
        return missing(
            "/dev/fuse is not usable by other users (Debian's udev makes it 0666; \
             scripts/deps.sh does too): rootless FUSE needs it",
        );
    }
    if fs::metadata("/")
        .map(|m| m.mode() & 0o001 == 0)
        .unwrap_or(true)
    {
        return missing(
            "/ is not searchable by other users (a chroot unpacked into a private directory?): \
             no other user can run a program; scripts/deps.sh makes it 0755 as on Debian",
        );
    }
    if !Path::new("/etc/mtab").exists() {
        return missing(
            "/etc/mtab is missing: fusermount3 cannot unmount a user's mount without it \
             (scripts/deps.sh links it to /proc/self/mounts, as Debian does)",
        );
    }
    tool_missing("fusermount3", "fuse3")
        || tool_missing("useradd", "passwd")
        || tool_missing("setpriv", "util-linux")
}

#[test]
fn an_unprivileged_user_opens_reads_and_closes() {
    if prerequisites_missing() {
        return;
    }
    let user = User::create();
    // Everything in a directory of the user's own: a copy of dmkit (the build tree may be
    // unreachable for others), the backing file and the runtime directory.
    let tmp = tempfile::tempdir().unwrap();
    let home: PathBuf = fs::canonicalize(tmp.path()).unwrap();
    let dmkit = home.join("dmkit");
    fs::copy(DMKIT, &dmkit).unwrap();
    let disk = home.join("disk.img");
    let data = common::rng::bytes(11, 4 << 20);
    fs::write(&disk, &data).unwrap();
    let xdg = home.join("xdg");
    fs::create_dir(&xdg).unwrap();
    for p in [&home, &xdg] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o700)).unwrap();
    }
    ok(
        "chown",
        &["-R", &format!("{0}:{0}", user.name), home.to_str().unwrap()],
    );
    let d = disk.to_str().unwrap();

    let r = user.run(&xdg, &dmkit, &["linear", "open", d, "mine"]);
    r.assert_ok();
    let file = xdg.join("dmkit/mine");
    assert_eq!(r.stdout.trim(), file.to_str().unwrap(), "{}", r.describe());
    assert!(mounted(&file));

    // The user reads the data...
    let r = user.run(
        &xdg,
        Path::new("/usr/bin/cmp"),
        &[file.to_str().unwrap(), d],
    );
    r.assert_ok();
    // ... nobody else does, root included (no allow_other).
    let e = fs::read(&file).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");

    let r = user.run(&xdg, &dmkit, &["status", "mine", "--json"]);
    r.assert_ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["state"], "active");
    let pid = v["pid"].as_u64().unwrap();
    // The server is not dumpable: its /proc files belong to root, not to the user.
    let environ = format!("/proc/{pid}/environ");
    let r = user.run(&xdg, Path::new("/usr/bin/head"), &["-c", "1", &environ]);
    assert_ne!(r.code, Some(0), "{}", r.describe());
    assert!(r.stderr.contains("Permission denied"), "{}", r.describe());

    // A loop device needs root: said before anything happens.
    let other = home.join("other.img");
    fs::write(&other, [0u8; 65536]).unwrap();
    ok("chown", &[&user.name, other.to_str().unwrap()]);
    let r = user.run(
        &xdg,
        &dmkit,
        &["linear", "open", "--loop", other.to_str().unwrap(), "lp"],
    );
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("--loop needs root"), "{}", r.describe());
    // image open works without root; bad input is refused without a word of --loop.
    let mp = home.join("mnt");
    fs::create_dir(&mp).unwrap();
    ok("chown", &[&user.name, mp.to_str().unwrap()]);
    let r = user.run(
        &xdg,
        &dmkit,
        &[
            "image",
            "open",
            other.to_str().unwrap(),
            mp.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, Some(1), "{}", r.describe());
    // Without root, image open serves the tree itself (tests/image_rootless.rs): a file that
    // is no image is refused in one line naming it.
    for said in [other.to_str().unwrap(), "neither a GPT disk image"] {
        assert!(r.stderr.contains(said), "no {said:?}: {}", r.describe());
    }
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.describe());
    for wrong in ["--loop", "writ"] {
        assert!(
            !r.stderr.contains(wrong),
            "says {wrong:?}: {}",
            r.describe()
        );
    }

    // Root's device, in /run/dmkit: the user is told whose it is, not "inactive".
    let theirs = format!("dmkt-root-{}", std::process::id());
    let root_open = |args: &[&str]| {
        let mut cmd = Command::new(DMKIT);
        cmd.args(args).env_remove("DMKIT_RUN_DIR");
        output_within(&mut cmd, Duration::from_secs(60))
    };
    assert!(root_open(&[
        "linear",
        "open",
        "--read-only",
        other.to_str().unwrap(),
        &theirs
    ])
    .status
    .success());
    let r = user.run(&xdg, &dmkit, &["status", &theirs]);
    // Root's state, log and control socket are out of the user's reach.
    let sock = format!("/run/dmkit/.dmkit/{theirs}.sock");
    let log = format!("/run/dmkit/.dmkit/{theirs}.log");
    let peek = user.run(&xdg, Path::new("/usr/bin/head"), &["-c", "1", &log]);
    let poke = user.run(&xdg, Path::new("/usr/bin/test"), &["-S", &sock]);
    let closed = root_open(&["close", &theirs]);
    assert!(
        peek.stderr.contains("Permission denied"),
        "{}",
        peek.describe()
    );
    assert_eq!(poke.code, Some(1), "{}", poke.describe());
    assert!(
        closed.status.success(),
        "{}",
        String::from_utf8_lossy(&closed.stderr)
    );
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        r.stderr.contains("served by another user"),
        "{}",
        r.describe()
    );

    let r = user.run(&xdg, &dmkit, &["close", "mine"]);
    r.assert_ok();
    assert!(!mounted(&file) && !file.exists());
    assert_eq!(fs::read(&disk).unwrap(), data);
    assert!(fs::metadata(&xdg).unwrap().uid() == user.uid);
}
