//! The runtime directory and the files of one device name in it, with the checks that make it
//! safe to trust.
//!
//! ```text
//! $RUN_DIR/NAME                 the exported device: an empty regular file, FUSE-mounted over
//! $RUN_DIR/.dmkit/NAME.json     state: pid, kind, path, loop device, claims, details
//! $RUN_DIR/.dmkit/NAME.sock     control socket: one command per connection
//! $RUN_DIR/.dmkit/NAME.log      the server's stderr (kept after close, for post-mortems)
//! $RUN_DIR/.dmkit/NAME.lock     flock'ed by the server for its whole life: the liveness test
//! ```
//!
//! A server runs with the opener's privileges and acts on what these files say (it signals the
//! pid in a state file, writes its log), so a directory someone else could have prepared is
//! refused: both directories must be real directories (not symlinks) owned by us and writable
//! by nobody else, and every file in them is opened with `O_NOFOLLOW`.

use super::{io_err, ExportError, Result};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Default runtime directory for root.
pub const DEFAULT_RUN_DIR: &str = "/run/dmkit";
/// Environment variable overriding the runtime directory.
pub const RUN_DIR_ENV: &str = "DMKIT_RUN_DIR";
/// Logs of closed devices kept beside the open ones (the most recent).
const KEPT_LOGS: usize = 16;

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The runtime directory: `$DMKIT_RUN_DIR`; else `/run/dmkit` for root and
/// `$XDG_RUNTIME_DIR/dmkit` (or `/tmp/dmkit-UID` without it) for everyone else.
pub fn run_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var(RUN_DIR_ENV) {
        return d;
    }
    let uid = euid();
    if uid == 0 {
        return PathBuf::from(DEFAULT_RUN_DIR);
    }
    match var("XDG_RUNTIME_DIR") {
        Some(x) => x.join("dmkit"),
        None => PathBuf::from(format!("/tmp/dmkit-{uid}")),
    }
}

/// Check a device name: non-empty, at most 127 bytes, no '/', no leading '.', no NUL.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(ExportError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 127 {
        return bad("it is longer than 127 bytes");
    }
    if name.contains('/') {
        return bad("it contains '/'");
    }
    if name.starts_with('.') {
        return bad("it starts with '.'");
    }
    if name.contains('\0') {
        return bad("it contains a NUL byte");
    }
    Ok(())
}

/// Refuse a directory that is a symlink, not ours, or writable by others (`others_mask`: the
/// mode bits nobody else may have).
fn check_dir(dir: &Path, others_mask: u32) -> Result<()> {
    let m = fs::symlink_metadata(dir).map_err(io_err(format!("{}: cannot stat", dir.display())))?;
    let refuse = |why: String| {
        Err(ExportError::Invalid(format!(
            "{}: {why}; refusing to use it as dmkit's run directory",
            dir.display()
        )))
    };
    if m.file_type().is_symlink() {
        return refuse("is a symbolic link".into());
    }
    if !m.is_dir() {
        return refuse("is not a directory".into());
    }
    if m.uid() != euid() {
        return refuse(format!(
            "belongs to uid {}, not to you (uid {})",
            m.uid(),
            euid()
        ));
    }
    if m.mode() & others_mask != 0 {
        return refuse(format!(
            "its mode {:o} lets others write",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

fn make_dir(dir: &Path, mode: u32) -> Result<()> {
    match fs::DirBuilder::new().mode(mode).create(dir) {
        // Exactly `mode`, whatever the umask took off (a umask of 0277 would leave even the
        // owner unable to create files in it).
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("{}: cannot set its mode", dir.display()))),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err(format!("{}: cannot create", dir.display()))(e)),
    }
}

/// Where a name's files live.
pub(super) struct Paths {
    pub name: String,
    pub dev: PathBuf,
    pub state: PathBuf,
    pub sock: PathBuf,
    pub log: PathBuf,
    pub lock: PathBuf,
    pub private: PathBuf,
}

impl Paths {
    /// Resolve `name`'s files. `create`: make the directories (for opening). The directories
    /// are checked whenever they exist; when they don't, nothing can be open in them.
    pub fn new(name: &str, create: bool) -> Result<Paths> {
        validate_name(name)?;
        let run = run_dir();
        let private_dir = run.join(".dmkit");
        // Checked before anything is created in them, and again once they exist.
        let check = || -> Result<()> {
            if fs::symlink_metadata(&run).is_ok() {
                check_dir(&run, 0o022)?;
            }
            if fs::symlink_metadata(&private_dir).is_ok() {
                check_dir(&private_dir, 0o077)?;
            }
            Ok(())
        };
        check()?;
        if create {
            if let Some(parent) = run.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent)
                    .map_err(io_err(format!("{}: cannot create", parent.display())))?;
            }
            // Others may look up names in /run/dmkit (like /dev/mapper); a user's own run
            // directory is theirs alone.
            make_dir(&run, if euid() == 0 { 0o755 } else { 0o700 })?;
            check_dir(&run, 0o022)?;
            make_dir(&private_dir, 0o700)?;
            check()?;
        }
        // Mount points are compared with /proc/self/mountinfo, which shows resolved paths.
        let run = fs::canonicalize(&run).unwrap_or(run);
        let private = run.join(".dmkit");
        Ok(Paths {
            name: name.to_string(),
            dev: run.join(name),
            state: private.join(format!("{name}.json")),
            sock: private.join(format!("{name}.sock")),
            log: private.join(format!("{name}.log")),
            lock: private.join(format!("{name}.lock")),
            private,
        })
    }
}

/// Open a file in the private directory for writing: created 0600 if missing, never through a
/// symlink. The mode is set on the descriptor too, so it is exactly 0600 whatever the umask
/// took off, and a file left with another mode is brought back to it.
pub(super) fn create_private(path: &Path, truncate: bool) -> io::Result<File> {
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(truncate)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// Read a file of the private directory, never through a symlink.
pub(super) fn read_private(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let mut s = String::new();
    f.by_ref().take(1 << 20).read_to_string(&mut s)?;
    Ok(s)
}

/// Delete the logs of closed devices beyond the [`KEPT_LOGS`] most recent; the logs of open
/// devices (those with a state file) always stay.
pub(super) fn prune_logs(private: &Path) {
    let Ok(dir) = fs::read_dir(private) else {
        return;
    };
    let mut closed: Vec<(std::time::SystemTime, PathBuf)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let path = e.path();
            let stem = path
                .file_name()?
                .to_str()?
                .strip_suffix(".log")?
                .to_string();
            if private.join(format!("{stem}.json")).exists() {
                return None;
            }
            let m = e.metadata().ok().filter(|m| m.is_file())?;
            Some((m.modified().ok()?, path))
        })
        .collect();
    closed.sort_by_key(|c| std::cmp::Reverse(c.0));
    for (_, path) in closed.into_iter().skip(KEPT_LOGS) {
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn names() {
        assert!(validate_name("ok-name_1").is_ok());
        for bad in ["", "a/b", ".hidden", "nul\0", &"x".repeat(128)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unsafe_directories_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        fs::create_dir(&real).unwrap();
        check_dir(&real, 0o022).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(check_dir(&link, 0o022)
            .unwrap_err()
            .to_string()
            .contains("symbolic link"));
        fs::set_permissions(&real, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_dir(&real, 0o022)
            .unwrap_err()
            .to_string()
            .contains("lets others write"));
    }

    #[test]
    fn private_files_are_not_opened_through_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("victim");
        fs::write(&target, "precious").unwrap();
        let log = t.path().join("x.log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(create_private(&log, true).is_err());
        assert!(read_private(&log).is_err());
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    }

    #[test]
    fn old_logs_of_closed_devices_are_pruned() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..(KEPT_LOGS + 5) {
            let p = t.path().join(format!("d{i}.log"));
            fs::write(&p, "x").unwrap();
            let when =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(i as u64 * 100);
            fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        // d0 is the oldest but open: it stays.
        fs::write(t.path().join("d0.json"), "{}").unwrap();
        prune_logs(t.path());
        let left: Vec<_> = (0..(KEPT_LOGS + 5))
            .filter(|i| t.path().join(format!("d{i}.log")).exists())
            .collect();
        assert_eq!(left.len(), KEPT_LOGS + 1);
        assert!(left.contains(&0));
        assert!(!left.contains(&1) && left.contains(&(KEPT_LOGS + 4)));
    }
}
