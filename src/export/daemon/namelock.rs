//! The name lock: an exclusive `flock` on `NAME.lock`, held by a device's server for its whole
//! life. Liveness is this lock rather than a pid check: the kernel releases it the moment the
//! server dies, however it dies, and pids get reused.

use super::{io_err, ExportError, Result};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A held name lock.
pub(super) struct NameLock {
    // Holding the descriptor holds the lock.
    _file: File,
    path: PathBuf,
}

impl NameLock {
    /// Take the lock without waiting; `None` when someone holds it.
    pub fn try_take(path: &Path) -> Result<Option<NameLock>> {
        for _ in 0..100 {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(path)
                .map_err(io_err(format!("{}: cannot open", path.display())))?;
            // SAFETY: flock(2) on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Ok(None);
                }
                return Err(io_err(format!("{}: cannot lock", path.display()))(e));
            }
            // The previous holder removes the file before exiting: make sure we locked the file
            // that is at the path now, not one that was just unlinked.
            let ours = file.metadata().map(|m| (m.dev(), m.ino())).ok();
            let there = fs::symlink_metadata(path).map(|m| (m.dev(), m.ino())).ok();
            if ours.is_some() && ours == there {
                // Exactly 0600 like every private file, whatever the umask took off.
                file.set_permissions(fs::Permissions::from_mode(0o600))
                    .map_err(io_err(format!("{}: cannot set its mode", path.display())))?;
                return Ok(Some(NameLock {
                    _file: file,
                    path: path.to_path_buf(),
                }));
            }
        }
        Err(ExportError::Failed(format!(
            "{}: cannot take the lock (it keeps being replaced)",
            path.display()
        )))
    }

    /// Whether a live process holds the lock at `path`.
    pub fn held(path: &Path) -> bool {
        let Ok(file) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
        else {
            return false;
        };
        // SAFETY: flock(2) on a descriptor we own; closing it right after releases the shared
        // lock if we got it.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
    }

    /// Remove the lock file while still holding the lock, then release it.
    pub fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }
}
