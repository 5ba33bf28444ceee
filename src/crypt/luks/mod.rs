//! What LUKS1 and LUKS2 share, and one handle on a LUKS volume whatever its version.
//!
//! [`LuksVolume`] is to dmkit what libcryptsetup's `struct crypt_device` is to cryptsetup: it
//! owns the header device, the parsed header (LUKS1 or LUKS2, read with cryptsetup's verdict
//! on versions), the claim that keeps other writers away, and every secret it unlocks. Each
//! verb is a method, and every decision that depends on the version (the write order of a
//! keyslot change, the integrity wipe order of a format) is taken here, never by the caller.
//! A volume key never leaves the library on a keyslot change: [`LuksVolume::unlock_key`] hands
//! back an opaque [`UnlockedKey`] that only this module can read.
//!
//! ```no_run
//! use dmkit::crypt::luks::{ActivateParams, LuksVolume};
//! use std::path::Path;
//!
//! # fn main() -> Result<(), dmkit::crypt::luks::LuksError> {
//! let volume = LuksVolume::open(Path::new("disk.img"), None, false, None)?;
//! let data = volume.data(true)?;
//! let params = ActivateParams { name: "disk".into(), read_only: true, ..Default::default() };
//! let active = volume.activate(data, b"passphrase", None, &params)?;
//! let mut sector = vec![0u8; active.device.logical_block_size() as usize];
//! active.device.read_at(&mut sector, 0)?;
//! # Ok(())
//! # }
//! ```
//!
//! The shared pieces: the AF splitter ([`af`]), the KDFs ([`kdf`]), keyslot area encryption
//! ([`area`]), hashes by their LUKS names ([`hash`]), the error type and the volume key.

mod admin;
pub mod af;
pub mod area;
mod backup;
mod convert;
mod decrypt_export;
mod encrypt;
pub mod files;
mod format;
pub mod hash;
pub mod header;
pub mod kdf;
pub mod keyring;
mod online;
mod online_reencrypt;
mod reencrypt;
mod reencrypting;
pub mod remote;
mod unserved;
mod volume;

pub use admin::Priority;
pub use backup::{HeaderRestore, RestoreQuestion};
pub use encrypt::{encrypt_init, encrypt_init_in_place, encrypt_init_shift};
pub use format::{FormatSpec, Formatter, IntegritySpec};
pub use header::Header;
pub use reencrypt::SegmentParams;
pub use volume::{ActivateParams, DataDevice, LuksVolume, UnlockedKey};

use crate::block::{BlockError, ClaimError, OpenError};

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
    /// A device or file named by the caller is missing (cryptsetup's exit code 4).
    #[error("{0}")]
    NoDevice(String),
    /// The volume is in use and the operation needs it closed (cryptsetup's exit code 5).
    #[error("{0}")]
    Busy(String),
    /// A token could not give a passphrase that opens a keyslot (cryptsetup's exit code 2).
    #[error("{0}")]
    TokenDenied(String),
    /// A file could not be opened (missing, busy or refused).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A range of the device is claimed by another device or command.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// I/O on the device failed.
    #[error(transparent)]
    Io(#[from] BlockError),
}

crate::block::open::volume_failure!(LuksError);

impl LuksError {
    /// cryptsetup's exit code for this error: 2 for a wrong passphrase, 3 when a keyslot's
    /// KDF cannot have its memory, 4 for a missing device, 5 for a busy one, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LuksError::WrongPassphrase => 2,
            LuksError::NoMemory(_) => 3,
            LuksError::NoDevice(_) => 4,
            LuksError::Busy(_) => 5,
            LuksError::TokenDenied(_) => 2,
            LuksError::Open(e) => e.exit_code(),
            LuksError::Claim(ClaimError::Busy { .. }) => 5,
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

/// The LUKS version a cryptsetup `--type` word names: `None` for `luks` (either version),
/// 1 for `luks1`, 2 for `luks2`.
pub fn version_named(word: &str) -> Result<Option<u16>, LuksError> {
    match word {
        "luks" => Ok(None),
        "luks1" => Ok(Some(1)),
        "luks2" => Ok(Some(2)),
        o => Err(LuksError::Invalid(format!(
            "--type: {o:?} is not luks, luks1 or luks2"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::version_named;

    #[test]
    fn words() {
        assert_eq!(version_named("luks").unwrap(), None);
        assert_eq!(version_named("luks1").unwrap(), Some(1));
        assert_eq!(version_named("luks2").unwrap(), Some(2));
        for bad in ["", "LUKS2", "plain", "luks3"] {
            assert_eq!(version_named(bad).unwrap_err().exit_code(), 1, "{bad}");
        }
    }
}
