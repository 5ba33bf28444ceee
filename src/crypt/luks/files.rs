//! Files dmkit creates that hold key material or LUKS headers (header backups, detached
//! headers): created new (`O_EXCL`, so nothing already there is overwritten and no symlink is
//! followed) with the owner-only mode they need, whatever the umask, as cryptsetup creates
//! them (`open(O_CREAT|O_EXCL, S_IRUSR)` for a backup, `S_IRUSR|S_IWUSR` for a header).

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of a header backup (cryptsetup's `-r--------`).
pub const BACKUP_MODE: u32 = 0o400;
/// Mode of a detached header file.
pub const HEADER_MODE: u32 = 0o600;

/// Create `path`, which must not exist, for reading and writing, with exactly `mode`. The
/// descriptor is writable whatever `mode` says (it was opened before the mode applies).
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    // The umask may have taken bits off `mode` (the owner's too, with a umask like 0277):
    // set exactly the mode meant, on the descriptor.
    if let Err(e) = f.set_permissions(Permissions::from_mode(mode)) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn created_with_the_exact_mode_and_never_over_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b");
        let f = create_new(&p, BACKUP_MODE).unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o7777, 0o400);
        let e = create_new(&p, HEADER_MODE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(dir.path().join("target"), &link).unwrap();
        assert!(create_new(&link, HEADER_MODE).is_err());
        assert!(
            !dir.path().join("target").exists(),
            "a symlink was followed"
        );
    }
}
