//! What a dead server leaves behind (a mount, a loop device, its files), and the "busy" answer
//! for a name that is open.

use super::namelock::NameLock;
use super::rundir::Paths;
use super::server::remove_export_file;
use super::{state, ExportError, Result};
use crate::export::fuse::unmount_path;
use crate::export::loopdev;
use crate::export::mountinfo::{is_dmkit_fuse_mount, is_mounted};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Every loop device whose backing file is `file`.
pub(super) fn loops_backed_by(file: &Path) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("loop"))
        .map(|n| PathBuf::from(format!("/dev/{n}")))
        .filter(|d| loopdev::backing_file(d).as_deref() == Some(file))
        .collect()
}

/// Remove what a dead server left behind: loop devices on its file, the mount, the files.
/// The caller holds the name's lock, so no server is running.
pub(super) fn cleanup_stale(p: &Paths) -> Result<()> {
    let mut errors = Vec::new();
    // A tree's mount point is the user's directory: only our mount over it goes.
    if let Some(st) = state::read(p).filter(|s| s.tree) {
        for _ in 0..8 {
            if !is_dmkit_fuse_mount(&st.path) {
                break;
            }
            if let Err(e) = unmount_path(&st.path, 0) {
                errors.push(e.to_string());
                break;
            }
        }
    }
    for dev in loops_backed_by(&p.dev) {
        if let Err(e) = loopdev::detach(&dev) {
            errors.push(e.to_string());
        }
    }
    for _ in 0..8 {
        if !is_mounted(&p.dev) {
            break;
        }
        if let Err(e) = unmount_path(&p.dev, 0) {
            errors.push(e.to_string());
            break;
        }
    }
    for f in [&p.sock, &p.state] {
        if let Err(e) = fs::remove_file(f) {
            if e.kind() != io::ErrorKind::NotFound {
                errors.push(format!("{}: cannot remove: {e}", f.display()));
            }
        }
    }
    if let Err(e) = remove_export_file(&p.dev) {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ExportError::Failed(format!(
            "cannot clean up after the dead server of {}: {}",
            p.name,
            errors.join("; ")
        )))
    }
}

/// The error for a name that is open (or being opened).
pub(super) fn busy(p: &Paths) -> ExportError {
    let reason = match state::read(p) {
        Some(s) => format!(
            "already open at {} (pid {}); close it first with `dmkit close {}`",
            s.path.display(),
            s.pid,
            super::typeable(&p.name, &s.path, s.tree)
        ),
        None => "it is being opened by another process".to_string(),
    };
    ExportError::Busy {
        name: p.name.clone(),
        reason,
    }
}

/// Fail with [`ExportError::Busy`] if `name` is open; clean up what a dead server of that name
/// left behind (mount, loop device, files).
pub fn ensure_not_open(name: &str) -> Result<()> {
    let p = Paths::new(name, true)?;
    let lock = NameLock::try_take(&p.lock)?.ok_or_else(|| busy(&p))?;
    cleanup_stale(&p)?;
    lock.remove();
    Ok(())
}
