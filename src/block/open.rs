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

/// A backing file that could not be opened or claimed: what every volume handle's error can
/// be besides its format's own failures.
#[derive(Debug)]
pub enum BackingFailure {
    /// The file could not be opened.
    Open(OpenError),
    /// A range of it could not be claimed.
    Claim(super::ClaimError),
}

/// The errors of the volume handles (`LuksVolume`, `PlainVolume`, `VerityVolume`,
/// `IntegrityVolume`, linear), seen the same way: a front end words a missing, busy or
/// unclaimable backing file once, whatever the format, and takes the rest as they are.
pub trait VolumeFailure: std::fmt::Display + Sized {
    /// cryptsetup's exit code for this error.
    fn exit_code(&self) -> i32;
    /// This error as a backing-file failure, or itself when it is another kind.
    fn into_backing(self) -> Result<BackingFailure, Self>;
}

/// Implements [`VolumeFailure`] for an error enum with `Open(OpenError)` and
/// `Claim(ClaimError)` variants and an inherent `exit_code`.
macro_rules! volume_failure {
    ($error:ty) => {
        impl $crate::block::VolumeFailure for $error {
            fn exit_code(&self) -> i32 {
                <$error>::exit_code(self)
            }
            fn into_backing(self) -> ::std::result::Result<$crate::block::BackingFailure, Self> {
                match self {
                    Self::Open(e) => Ok($crate::block::BackingFailure::Open(e)),
                    Self::Claim(e) => Ok($crate::block::BackingFailure::Claim(e)),
                    e => Err(e),
                }
            }
        }
    };
}
pub(crate) use volume_failure;
