//! Claims on backing storage: who may write which bytes of a file or block device.
//!
//! device-mapper refuses to put two read-write mappings on one device and refuses to format a
//! device that is mapped; dmkit has no kernel to ask, so every mapping takes a claim on the
//! byte range it maps. A claim is an open-file-description lock (`F_OFD_SETLK`) on the backing
//! file's inode:
//!
//! - it follows the inode, so a symlink or a hard link to the same file meets the same claim;
//! - it belongs to an open file description, which a forked server inherits, and dies with the
//!   last descriptor of it: a killed server leaves no stale claim;
//! - ranges let a LUKS keyslot change (the header area) go on while the data area is mapped,
//!   exactly as cryptsetup allows, while `luksFormat` (the whole device) is refused.
//!
//! Read-only mappings take shared claims, so several verity devices may read one data file;
//! a read-write mapping takes an exclusive one.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a claim covers and how, as recorded in a server's state so that a refused claim can
/// name its holder.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimInfo {
    /// The path the claim was taken through (absolute when it could be resolved).
    pub path: PathBuf,
    /// `st_dev` of the claimed inode.
    pub dev: u64,
    /// `st_ino` of the claimed inode.
    pub ino: u64,
    /// First claimed byte.
    pub start: u64,
    /// Claimed bytes; 0 means "to the end, however large the file grows".
    pub len: u64,
    /// Exclusive (read-write) or shared (read-only).
    pub exclusive: bool,
}

impl ClaimInfo {
    /// Whether this claim and a wanted one on the same inode cannot both be held.
    pub fn conflicts(&self, dev: u64, ino: u64, start: u64, len: u64, exclusive: bool) -> bool {
        self.dev == dev
            && self.ino == ino
            && (self.exclusive || exclusive)
            && ranges_overlap(self.start, self.len, start, len)
    }

    /// "bytes 0 to the end" or "bytes 4096..8192", for messages.
    pub fn range_text(&self) -> String {
        range_text(self.start, self.len)
    }
}

fn ranges_overlap(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    let end = |s: u64, l: u64| {
        if l == 0 {
            u64::MAX
        } else {
            s.saturating_add(l)
        }
    };
    a < end(b, blen) && b < end(a, alen)
}

/// "bytes 0 to the end" or "bytes 4096..8192".
pub fn range_text(start: u64, len: u64) -> String {
    if len == 0 {
        format!("bytes {start} to the end")
    } else {
        format!("bytes {start}..{}", start.saturating_add(len))
    }
}

/// A held claim: the lock lives as long as this value (and every forked copy of its
/// descriptor).
#[derive(Debug)]
pub struct Claim {
    // A duplicate of the backing device's descriptor: the same open file description, so the
    // lock is the mapping's own and the file cannot be swapped under it.
    _file: File,
    info: ClaimInfo,
}

/// Why a claim could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Someone holds a conflicting claim.
    #[error("{}: {} is in use", path.display(), range_text(*start, *len))]
    Busy {
        /// The file.
        path: PathBuf,
        /// `st_dev` of the file.
        dev: u64,
        /// `st_ino` of the file.
        ino: u64,
        /// First wanted byte.
        start: u64,
        /// Wanted bytes (0: to the end).
        len: u64,
        /// Whether an exclusive claim was wanted.
        exclusive: bool,
    },
    /// The lock call failed for another reason.
    #[error("{}: cannot lock: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl Claim {
    /// Claim `[start, start + len)` of `file` (opened at `path`; `len` 0 means to the end),
    /// exclusively or shared, without waiting. An exclusive claim needs `file` open for writing,
    /// a shared one for reading.
    pub fn take(
        file: &File,
        path: &Path,
        start: u64,
        len: u64,
        exclusive: bool,
    ) -> Result<Claim, ClaimError> {
        let io_err = |source| ClaimError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = file.metadata().map_err(io_err)?;
        let dup = file.try_clone().map_err(io_err)?;
        let to_off = |v: u64| {
            libc::off_t::try_from(v).map_err(|_| io_err(io::ErrorKind::InvalidInput.into()))
        };
        let fl = libc::flock {
            l_type: if exclusive {
                libc::F_WRLCK
            } else {
                libc::F_RDLCK
            } as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: to_off(start)?,
            l_len: to_off(len)?,
            // Must be 0 for open-file-description locks.
            l_pid: 0,
        };
        // SAFETY: fcntl(2) F_OFD_SETLK reads a `struct flock` that outlives the call, on a
        // descriptor we own.
        let rc = unsafe { libc::fcntl(dup.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        // Before anything else can overwrite errno.
        let err = (rc != 0).then(io::Error::last_os_error);
        let info = ClaimInfo {
            path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            dev: meta.dev(),
            ino: meta.ino(),
            start,
            len,
            exclusive,
        };
        if let Some(e) = err {
            if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
                return Err(ClaimError::Busy {
                    path: info.path,
                    dev: info.dev,
                    ino: info.ino,
                    start,
                    len,
                    exclusive,
                });
            }
            return Err(io_err(e));
        }
        Ok(Claim { _file: dup, info })
    }

    /// The claim of `len` bytes from the same start instead (a resized mapping), taken on the
    /// same open file description so that it never conflicts with this one; what this one
    /// covered beyond the new end is released.
    pub fn retake(&self, len: u64) -> Result<Claim, ClaimError> {
        let i = &self.info;
        let new = Claim::take(&self._file, &i.path, i.start, len, i.exclusive)?;
        let new_end = i.start.saturating_add(len);
        let old_end = if i.len == 0 {
            0
        } else {
            i.start.saturating_add(i.len)
        };
        if len != 0 && (old_end == 0 || old_end > new_end) {
            let fl = libc::flock {
                l_type: libc::F_UNLCK as libc::c_short,
                l_whence: libc::SEEK_SET as libc::c_short,
                l_start: libc::off_t::try_from(new_end).unwrap_or(libc::off_t::MAX),
                l_len: libc::off_t::try_from(old_end.saturating_sub(new_end)).unwrap_or(0),
                l_pid: 0,
            };
            // SAFETY: fcntl(2) F_OFD_SETLK reads a `struct flock` that outlives the call, on
            // a descriptor we own. An unlock that fails leaves a larger claim: harmless.
            unsafe { libc::fcntl(new._file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        }
        Ok(new)
    }

    /// What this claim covers.
    pub fn info(&self) -> &ClaimInfo {
        &self.info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim that must be free now, but may be held a moment longer by a process another
    /// test thread is starting: a child holds copies of every descriptor (ours included)
    /// between its fork and its exec, and with them our locks.
    fn take_released(path: &Path, start: u64, len: u64) -> Claim {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match Claim::take(&open(path, true), path, start, len, true) {
                Ok(c) => return c,
                Err(e) if std::time::Instant::now() < deadline => {
                    assert!(matches!(e, ClaimError::Busy { .. }), "{e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => panic!("still held after its claim was dropped: {e}"),
            }
        }
    }

    fn open(path: &Path, write: bool) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .unwrap()
    }

    #[test]
    fn exclusive_claims_exclude_overlaps_through_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, vec![0u8; 8192]).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&p, &hard).unwrap();

        let a = Claim::take(&open(&p, true), &p, 4096, 0, true).unwrap();
        // Other descriptions of the same inode, through every name, are refused on overlap.
        for name in [&p, &link, &hard] {
            let e = Claim::take(&open(name, true), name, 0, 8192, true).unwrap_err();
            assert!(matches!(e, ClaimError::Busy { .. }), "{e}");
            let e = Claim::take(&open(name, false), name, 5000, 1, false).unwrap_err();
            assert!(matches!(e, ClaimError::Busy { .. }), "{e}");
        }
        // A disjoint range (a LUKS header next to its mapped data) is fine.
        let header = Claim::take(&open(&link, true), &link, 0, 4096, true).unwrap();
        assert_eq!(header.info().path, std::fs::canonicalize(&p).unwrap());
        drop((a, header));
        // Released with the claim.
        take_released(&hard, 0, 0);
    }

    #[test]
    fn shared_claims_coexist_and_block_writers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        let r1 = Claim::take(&open(&p, false), &p, 0, 0, false).unwrap();
        let r2 = Claim::take(&open(&p, false), &p, 0, 0, false).unwrap();
        assert!(Claim::take(&open(&p, true), &p, 0, 0, true).is_err());
        drop((r1, r2));
        take_released(&p, 0, 0);
    }

    #[test]
    fn recorded_claims_know_their_conflicts() {
        let c = ClaimInfo {
            path: "/x".into(),
            dev: 1,
            ino: 2,
            start: 4096,
            len: 0,
            exclusive: false,
        };
        assert!(!c.conflicts(1, 2, 0, 0, false));
        assert!(c.conflicts(1, 2, 0, 0, true));
        assert!(!c.conflicts(1, 2, 0, 4096, true));
        assert!(c.conflicts(1, 2, 0, 4097, true));
        assert!(!c.conflicts(1, 3, 0, 0, true));
        assert_eq!(c.range_text(), "bytes 4096 to the end");
    }
}
