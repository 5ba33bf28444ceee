//! The errors of the dm-integrity layer: one enum, each variant naming the field, option or
//! device at fault.

use crate::block::BlockError;

/// Why a dm-integrity operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    /// Fewer bytes than a superblock.
    #[error("superblock is truncated ({0} bytes, need 512)")]
    Truncated(usize),
    /// No "integrt" magic: not a dm-integrity device.
    #[error("magic: not a dm-integrity device (no \"integrt\" superblock)")]
    Magic,
    /// A superblock or journal field holds a value the kernel refuses.
    #[error("{field}: {reason}")]
    Field {
        /// The on-disk field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Not one sampled block has a valid tag: the `--integrity` algorithm or key is not the
    /// one the device was formatted with (see [`super::samples`]).
    #[error("{0}")]
    WrongKey(String),
    /// A layout that does not fit the device.
    #[error("{0}")]
    Geometry(String),
    /// A bad option value (named as on the command line).
    #[error("{option}: {reason}")]
    Option {
        /// The option, e.g. "--tag-size".
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An algorithm we do not implement.
    #[error("--integrity: unsupported integrity algorithm {0:?} (crc32c, crc32, sha1, sha256, hmac-sha256, hmac-sha1, hmac-sha512)")]
    Algorithm(String),
    /// A key that does not suit the algorithm.
    #[error("{0}")]
    Key(String),
    /// I/O on a device.
    #[error(transparent)]
    Io(#[from] BlockError),
    /// A field that does not fit the bytes it is read from (the error names it).
    #[error(transparent)]
    Codec(#[from] crate::codec::Error),
}

impl IntegrityError {
    /// A field error.
    pub fn field(field: &'static str, reason: impl Into<String>) -> Self {
        IntegrityError::Field {
            field,
            reason: reason.into(),
        }
    }

    /// An option error.
    pub fn option(option: &'static str, reason: impl Into<String>) -> Self {
        IntegrityError::Option {
            option,
            reason: reason.into(),
        }
    }
}

/// Result type of the integrity layer.
pub type Result<T> = std::result::Result<T, IntegrityError>;
