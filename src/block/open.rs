//! Opening the files and block devices a volume works on, with one typed error that names the
//! file, so every format's handle and the command line report a failure the same way.

use super::{FileDevice, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Why a backing file or device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// It does not exist (cryptsetup's "no such device", exit 4).
    #[error("{}: cannot open: {source}", path.display())]
    NotFound {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A block device opened for writing is claimed by someone else: mounted, or held by the
    /// kernel or another device (`O_EXCL` gave `EBUSY`).
    #[error("cannot use {}: it is in use", path.display())]
    Busy {
        /// The path.
        path: PathBuf,
    },
    /// Any other failure (permissions, a directory, ...).
    #[error("{}: cannot open: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl OpenError {
    /// cryptsetup's exit code for this failure: 4 missing, 5 busy, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            OpenError::NotFound { .. } => 4,
            OpenError::Busy { .. } => 5,
            OpenError::Io { .. } => 1,
        }
    }

    /// The path that could not be opened.
    pub fn path(&self) -> &Path {
        match self {
            OpenError::NotFound { path, .. }
            | OpenError::Busy { path }
            | OpenError::Io { path, .. } => path,
        }
    }
}

/// Open `path` to read or inspect it (no exclusive claim).
pub fn open_device(path: &Path, read_only: bool, direct: bool) -> Result<FileDevice, OpenError> {
    open_with(path, read_only, direct, false)
}

/// Open `path` as the backing device of a mapping or a format: like [`open_device`], and a
/// block device opened for writing is claimed exclusively (`O_EXCL`), as device-mapper claims
/// its devices: refused while mounted or in use, and not mountable while we hold it.
pub fn open_backing(path: &Path, read_only: bool, direct: bool) -> Result<FileDevice, OpenError> {
    open_with(path, read_only, direct, !read_only)
}

fn open_with(
    path: &Path,
    read_only: bool,
    direct: bool,
    exclusive: bool,
) -> Result<FileDevice, OpenError> {
    let opts = OpenOptions {
        read_only,
        direct,
        exclusive,
    };
    FileDevice::open(path, opts).map_err(|source| {
        let path = path.to_path_buf();
        match source.raw_os_error() {
            Some(libc::ENOENT) => OpenError::NotFound { path, source },
            Some(libc::EBUSY) if exclusive => OpenError::Busy { path },
            _ => OpenError::Io { path, source },
        }
    })
}
