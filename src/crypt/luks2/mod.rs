//! LUKS2, on-disk compatible with cryptsetup: the binary header pair and its JSON metadata,
//! keyslots (PBKDF2/Argon2 + the AF splitter), the volume key digest, and the data segment.
//!
//! The pieces shared with LUKS1 (the AF splitter, the KDFs, keyslot area encryption and the
//! error type) live here too; [`super::luks1`] uses them.
//!
//! Nothing read from disk is trusted: every size and offset is checked against the device
//! before it is used, and the JSON text is screened before it is parsed.

pub mod activate;
pub mod af;
pub mod area;
pub mod base64;
pub mod copies;
pub mod digest;
pub mod dump;
pub mod format;
pub mod hash;
pub mod header;
pub mod integrity;
#[cfg(test)]
mod integrity_tests;
pub mod json;
pub mod jsonc;
pub mod keyslot;
pub mod signatures;
pub mod validate;

pub use format::{format, FormatParams};
pub use header::{LoadedHeader, Luks2Header};
pub use json::{Metadata, Segment};
pub use kdf::{Argon2Variant, Kdf};
pub use keyslot::{PbkdfKind, PbkdfParams};

pub mod kdf;

use crate::block::BlockError;

/// A volume (master) key: in locked memory kept out of core dumps, wiped when dropped.
pub type VolumeKey = crate::crypt::secret::SecretBytes;

/// Errors of the LUKS1 and LUKS2 formats.
#[derive(Debug, thiserror::Error)]
pub enum LuksError {
    /// The device holds no LUKS header.
    #[error("{device}: not a LUKS device (no LUKS header found)")]
    NotLuks {
        /// Device name.
        device: String,
    },
    /// A header is damaged or inconsistent.
    #[error("{device}: {what}")]
    Corrupt {
        /// Device name.
        device: String,
        /// What is wrong, naming the field.
        what: String,
    },
    /// Both LUKS2 header copies are damaged.
    #[error("{device}: both LUKS2 header copies are corrupt: primary: {primary}; secondary: {secondary}")]
    BothCorrupt {
        /// Device name.
        device: String,
        /// Why the primary copy was refused.
        primary: String,
        /// Why the secondary copy was refused.
        secondary: String,
    },
    /// The passphrase opens no keyslot (cryptsetup's words).
    #[error("No key available with this passphrase.")]
    WrongPassphrase,
    /// No keyslot can give the wanted key (all unbound, or of other types), as cryptsetup
    /// says it.
    #[error("No usable keyslot is available.")]
    NoUsableKeyslot,
    /// The header needs a feature we do not implement.
    #[error("{device}: unsupported LUKS2 requirement {requirement:?}; refusing to activate")]
    Requirement {
        /// Device name.
        device: String,
        /// The requirement from `config.requirements.mandatory`.
        requirement: String,
    },
    /// An algorithm or parameter we cannot handle.
    #[error("unsupported {0}")]
    Unsupported(String),
    /// Bad parameters from the caller.
    #[error("{0}")]
    Invalid(String),
    /// A cryptographic primitive failed.
    #[error("crypto error: {0}")]
    Crypto(String),
    /// A keyslot's KDF cannot get the memory it asks for (cryptsetup's words, exit code 3).
    #[error("{0}: Not enough available memory to open a keyslot.")]
    NoMemory(String),
    /// I/O on the device failed.
    #[error(transparent)]
    Io(#[from] BlockError),
}

impl LuksError {
    /// cryptsetup's exit code for this error: 2 for a wrong passphrase, 3 when a keyslot's
    /// KDF cannot have its memory, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LuksError::WrongPassphrase => 2,
            LuksError::NoMemory(_) => 3,
            _ => 1,
        }
    }

    /// The same error, its message prefixed with the device and keyslot it happened in.
    pub fn in_keyslot(self, device: &str, id: u32) -> LuksError {
        let at = |m: String| format!("{device}: keyslot {id}: {m}");
        match self {
            LuksError::Invalid(m) => LuksError::Invalid(at(m)),
            LuksError::Unsupported(m) => LuksError::Invalid(at(format!("unsupported {m}"))),
            LuksError::Crypto(m) => LuksError::Crypto(at(m)),
            LuksError::NoMemory(m) => LuksError::NoMemory(at(m)),
            other => other,
        }
    }
}

/// The most keyslots (and tokens) LUKS2 metadata may have.
pub const MAX_KEYSLOTS: u32 = 32;
/// The AF stripes cryptsetup always uses.
pub const STRIPES: u32 = 4000;
/// Salt length of keyslots and digests.
pub const SALT_SIZE: usize = 32;
