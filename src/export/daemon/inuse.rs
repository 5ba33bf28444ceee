//! Is an open device still used? device-mapper refuses to remove a device whose open count is
//! not zero ("still in use"); dmkit's device is the exported file and, with `--loop`, the loop
//! device on it. The exported file's opens are counted exactly by the FUSE server (OPEN and
//! RELEASE requests); the loop device has no count the kernel shows, so it is "used" when it is
//! mounted or held exclusively (an `O_EXCL` open fails) or when a process has it open.

use crate::export::mountinfo;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why the loop device `dev` is in use, or `None` if nobody uses it.
pub(super) fn loop_users(dev: &Path) -> Option<String> {
    let meta = fs::metadata(dev).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    if let Some(mp) = mountinfo::mount_point_of(major, minor) {
        return Some(format!("{} is mounted on {mp}", dev.display()));
    }
    let excl = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(dev);
    if let Err(e) = excl {
        if e.raw_os_error() == Some(libc::EBUSY) {
            return Some(format!(
                "{} is held exclusively (mounted in another namespace, or claimed by a device stacked on it)",
                dev.display()
            ));
        }
    }
    let holders = processes_holding(dev);
    (!holders.is_empty()).then(|| format!("{} is open by {}", dev.display(), holders.join(", ")))
}

/// "pid 123 (mount)" for every process other than this one with a descriptor open on `path`.
/// Descriptors are compared by their link text, never stat'ed: a stat could hang on another
/// process's unresponsive FUSE mount.
pub(super) fn processes_holding(path: &Path) -> Vec<String> {
    let me = std::process::id();
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in procs.filter_map(|e| e.ok()) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds
            .filter_map(|e| e.ok())
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == path));
        if holds {
            let comm = fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            out.push(format!("pid {pid} ({})", comm.trim()));
        }
    }
    out
}
