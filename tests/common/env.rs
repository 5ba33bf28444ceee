//! What a test needs from the machine, and the one rule for when it is missing: with `CI` set
//! the test fails loudly (CI must provide everything), otherwise it prints why and is skipped.
//!
//! The checks return `true` when something is missing, so a test starts with
//! `if common::env::fuse_missing() { return; }`.

use std::path::Path;
use std::process::{Command, Stdio};

/// Whether the tests run in CI (the `CI` environment variable is set).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The running test's name (libtest names each test's thread after the test).
pub fn test_name() -> String {
    std::thread::current().name().unwrap_or("test").to_string()
}

/// A prerequisite of the running test is missing (`why`): panics when `CI` is set, otherwise
/// prints that the test is skipped and why, and returns `true`.
pub fn missing(why: &str) -> bool {
    let test = test_name();
    if in_ci() {
        panic!("{test}: cannot run in CI: {why}");
    }
    eprintln!("{test}: skipped: {why}");
    true
}

/// Whether FUSE mounts cannot be made here: they need root and a /dev/fuse that opens for
/// reading and writing. Reports what is missing through [`missing`].
pub fn fuse_missing() -> bool {
    if !is_root() {
        return missing("not running as root (mounting FUSE needs it)");
    }
    let fuse = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse");
    if fuse.is_err() {
        return missing("/dev/fuse is not available (modprobe fuse)");
    }
    false
}

/// Whether the /dev/fuse device node is absent (for tests that need nothing more of FUSE than
/// the node). Reports it through [`missing`].
pub fn fuse_device_missing() -> bool {
    !Path::new("/dev/fuse").exists()
        && missing("/dev/fuse is missing (modprobe fuse): FUSE is needed to open devices")
}

/// Whether FUSE mounts ([`fuse_missing`]) or loop devices (/dev/loop-control) are unavailable.
pub fn loop_missing() -> bool {
    fuse_missing()
        || (!Path::new("/dev/loop-control").exists()
            && missing("/dev/loop-control is missing (modprobe loop)"))
}

/// Whether `cmd` is found on PATH (`command -v`).
pub fn on_path(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `tool` is not on PATH; says to install `package` through [`missing`].
pub fn tool_missing(tool: &str, package: &str) -> bool {
    !on_path(tool)
        && missing(&format!(
            "{tool} is not installed (apt-get install {package})"
        ))
}

/// Whether any of `tools` (command, Debian package) is missing, reported through [`missing`].
/// In CI, as root, scripts/deps.sh installs what is missing first (once per test binary).
pub fn tools_missing(tools: &[(&str, &str)]) -> bool {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if in_ci() && is_root() && tools.iter().any(|(cmd, _)| !on_path(cmd)) {
        ONCE.call_once(|| {
            let deps = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/deps.sh");
            let st = Command::new("bash").arg(deps).status();
            eprintln!("{}: {deps}: {st:?}", test_name());
        });
    }
    tools.iter().any(|(cmd, pkg)| tool_missing(cmd, pkg))
}

/// Whether a private mount namespace cannot be made here because `/` is not a mount point (a
/// chroot): `unshare --mount` and systemd's tools then fail to change the root's propagation.
/// Not something CI could install: this machine truly lacks it, so even under CI the test is
/// skipped, saying why (a real machine, CI's included, has `/` mounted).
pub fn private_mounts_missing(who: &str) -> bool {
    let root_mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some("/")));
    if !root_mounted {
        eprintln!(
            "{}: skipped: / is not a mount point (a chroot): {who} cannot make a private mount namespace",
            test_name()
        );
    }
    !root_mounted
}
