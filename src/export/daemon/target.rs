//! What `close` and `status` are given: a device's name, or a path that stands for one (its
//! exported file, a tree's mount point, its loop device), and how a name is printed so that it
//! can be typed back.

use super::namelock::NameLock;
use super::rundir::{run_dir, validate_name, Paths};
use super::state;
use super::{ExportError, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// The name `target` stands for:
/// - a name with something open under it (a state file, or a server holding its lock);
/// - else a path: the exported file or mount point recorded in a state file, or the loop
///   device of an open device; a file directly in the run directory is its own name (a device
///   still being opened has no state file yet);
/// - else, when `target` is a valid name, that name (the caller says it is not active).
///
/// A path that stands for nothing open is [`ExportError::NotOpenAt`]; the mount point of an
/// `image open` stack is refused with the command that closes it (`dmkit image close`): its
/// file system is mounted on the device.
pub fn resolve_target(target: &str) -> Result<String> {
    let as_name = validate_name(target).is_ok();
    if as_name && is_known(target) {
        return Ok(target.to_string());
    }
    let given = Path::new(target);
    if as_name && fs::symlink_metadata(given).is_err() {
        return Ok(target.to_string());
    }
    let abs = absolute(given);
    for name in super::client::names_with_state() {
        let Some(st) = Paths::new(&name, false).ok().and_then(|p| state::read(&p)) else {
            continue;
        };
        if st.path == abs || st.loop_device.as_deref() == Some(abs.as_path()) {
            return Ok(name);
        }
        if st.details["mountpoint"].as_str().map(Path::new) == Some(abs.as_path()) {
            return Err(ExportError::Invalid(format!(
                "{}: an image is open there; close it with `dmkit image close {}`",
                abs.display(),
                shell_word(&abs.to_string_lossy())
            )));
        }
    }
    let run = fs::canonicalize(run_dir()).unwrap_or_else(|_| run_dir());
    if abs.parent() == Some(run.as_path()) {
        if let Some(n) = abs.file_name().and_then(|n| n.to_str()) {
            if validate_name(n).is_ok() {
                return Ok(n.to_string());
            }
        }
    }
    if as_name {
        return Ok(target.to_string());
    }
    Err(ExportError::NotOpenAt { path: abs })
}

/// Whether something is open (or was, and died) under `name`.
fn is_known(name: &str) -> bool {
    Paths::new(name, false).is_ok_and(|p| state::read(&p).is_some() || NameLock::held(&p.lock))
}

/// `path` made absolute with its symbolic links resolved. A FUSE mount whose server died
/// cannot be stat'ed (ENOTCONN), so when the path itself cannot be resolved its parent is,
/// and the last component is kept as given.
fn absolute(path: &Path) -> PathBuf {
    if let Ok(p) = fs::canonicalize(path) {
        return p;
    }
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(file)) => fs::canonicalize(parent)
            .map(|p| p.join(file))
            .unwrap_or(abs.clone()),
        _ => abs,
    }
}

/// `s` as one shell word: as it is when it holds only characters no shell treats specially,
/// else single-quoted. A name such as `srv\x2dtree` (the escaped mount point `/srv-tree`)
/// loses its backslash when typed bare.
pub fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What to type after `dmkit close` for the device `name` served at `path`: the mount point of
/// a tree (its name is an escaped path nobody would guess), else the name; one shell word.
pub fn typeable(name: &str, path: &Path, tree: bool) -> String {
    if tree {
        shell_word(&path.to_string_lossy())
    } else {
        shell_word(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("data"), "data");
        assert_eq!(shell_word("/srv/tree"), "/srv/tree");
        assert_eq!(shell_word(r"srv\x2dtree"), r"'srv\x2dtree'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn paths_of_dead_mounts_resolve_through_their_parent() {
        let d = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(d.path()).unwrap();
        assert_eq!(absolute(&d.path().join("gone")), real.join("gone"));
        assert_eq!(absolute(d.path()), real);
    }
}
