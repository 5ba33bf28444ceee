//! [`PlainVolume`]: dm-crypt plain mode (`cryptsetup open --type plain`), a raw key and no
//! header: the cipher, the key size and the geometry say everything.
//!
//! ```no_run
//! use dmkit::crypt::plain::{PlainParams, PlainVolume};
//! use std::path::Path;
//!
//! # fn main() -> Result<(), dmkit::crypt::plain::PlainError> {
//! let params = PlainParams {
//!     cipher: "aes-xts-plain64".into(),
//!     key_bits: 512,
//!     ..PlainParams::default()
//! };
//! let volume = PlainVolume::new(params)?;
//! let key = [7u8; 64];
//! let active = volume.activate("secret", Path::new("disk.img"), &key)?;
//! println!("{} bytes", active.device.size());
//! # Ok(())
//! # }
//! ```

use crate::block::online::{Online, OnlineError, RefreshFlags, Unlock};
use crate::block::{Activated, BlockDevice, Claim, ClaimError, OpenError};
use crate::crypt::cipher::{new_sector_cipher, CipherSpec};
use crate::crypt::target::{CryptDevice, CryptParams, ServedCrypt};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

/// Why a plain volume cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum PlainError {
    /// A parameter is wrong (the message names the option).
    #[error("{0}")]
    Invalid(String),
    /// The device could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The range is claimed by another device or command.
    #[error(transparent)]
    Claim(#[from] ClaimError),
}

crate::block::open::volume_failure!(PlainError);

impl PlainError {
    /// cryptsetup's exit code: 4 for a missing device, 5 for a busy one, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            PlainError::Invalid(_) => 1,
            PlainError::Open(e) => e.exit_code(),
            PlainError::Claim(ClaimError::Busy { .. }) => 5,
            PlainError::Claim(_) => 1,
        }
    }
}

/// Cipher, key size and geometry of a plain volume (cryptsetup's options).
#[derive(Clone, Debug)]
pub struct PlainParams {
    /// Cipher, dm-crypt style (`aes-xts-plain64`, `aes-cbc-essiv:sha256`, ...).
    pub cipher: String,
    /// Key size in bits.
    pub key_bits: usize,
    /// Start of the encrypted data, in 512-byte sectors.
    pub offset: u64,
    /// IV offset (`--skip`), in 512-byte sectors.
    pub skip: u64,
    /// Size in 512-byte sectors (default: from `offset` to the end of the device).
    pub size: Option<u64>,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Count IVs in `sector_size` units.
    pub iv_large_sectors: bool,
    /// Pass discards down.
    pub allow_discards: bool,
    /// Refuse writes.
    pub read_only: bool,
}

impl Default for PlainParams {
    fn default() -> Self {
        PlainParams {
            cipher: "aes-cbc-essiv:sha256".into(),
            key_bits: 256,
            offset: 0,
            skip: 0,
            size: None,
            sector_size: 512,
            iv_large_sectors: false,
            allow_discards: false,
            read_only: false,
        }
    }
}

/// A plain-mode volume, its cipher and key size checked.
pub struct PlainVolume {
    params: PlainParams,
    spec: CipherSpec,
}

impl PlainVolume {
    /// Check the cipher and the key size.
    pub fn new(params: PlainParams) -> Result<PlainVolume, PlainError> {
        let spec =
            CipherSpec::parse(&params.cipher).map_err(|e| PlainError::Invalid(e.to_string()))?;
        if params.key_bits == 0 || !params.key_bits.is_multiple_of(8) {
            return Err(PlainError::Invalid(format!(
                "--key-size {}: must be a multiple of 8 bits",
                params.key_bits
            )));
        }
        spec.check_key_size(params.key_bits / 8)
            .map_err(|e| PlainError::Invalid(format!("--key-size: {e}")))?;
        Ok(PlainVolume { params, spec })
    }

    /// The key length in bytes (what a key file gives).
    pub fn key_len(&self) -> usize {
        self.params.key_bits / 8
    }

    /// Activate `device` with `key` as `name`: the crypt target over the range, which is
    /// claimed for as long as the result lives.
    pub fn activate(&self, name: &str, device: &Path, key: &[u8]) -> Result<Activated, PlainError> {
        let p = &self.params;
        let cipher =
            new_sector_cipher(&self.spec, key).map_err(|e| PlainError::Invalid(e.to_string()))?;
        let dev = crate::block::open_backing(device, p.read_only, false)?;
        let dev_size = dev.size();
        let offset = p
            .offset
            .checked_mul(512)
            .ok_or_else(|| PlainError::Invalid(format!("--offset {}: too large", p.offset)))?;
        let size = match p.size {
            Some(s) => s
                .checked_mul(512)
                .ok_or_else(|| PlainError::Invalid(format!("--size {s}: too large")))?,
            None => {
                if offset >= dev_size {
                    return Err(PlainError::Invalid(format!(
                        "{}: --offset {} sectors is at or beyond the end of the device ({} bytes)",
                        device.display(),
                        p.offset,
                        dev_size
                    )));
                }
                dev_size - offset
            }
        };
        let claim = Claim::take(dev.file(), device, offset, size, !p.read_only)?;
        let params = CryptParams {
            name: name.to_string(),
            offset,
            size,
            sector_size: p.sector_size,
            iv_offset: p.skip,
            iv_large_sectors: p.iv_large_sectors,
            allow_discards: p.allow_discards,
            read_only: p.read_only,
        };
        let dup = dev.reopened().map_err(|e| {
            PlainError::Invalid(format!("{}: cannot reopen: {e}", device.display()))
        })?;
        let crypt = CryptDevice::new(Arc::new(dup), cipher, params)
            .map_err(|e| PlainError::Invalid(format!("{}: {e}", device.display())))?;
        let implementation = crypt.cipher_implementation();
        let stats = crypt.stats();
        let backing = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
        let details = json!({
            "backing": backing,
            "cipher": self.spec.to_string(),
            "key_size_bits": p.key_bits,
            "offset_sectors": p.offset,
            "skip_sectors": p.skip,
            "sector_size": p.sector_size,
            "iv_large_sectors": p.iv_large_sectors,
            "implementation": implementation,
        });
        let served = ServedCrypt::new(crypt, dev, &claim)?;
        let device = served.device();
        Ok(Activated {
            name: name.to_string(),
            device,
            kind: "crypt".to_string(),
            details,
            stats: Some(Arc::new(move || stats.to_json())),
            claims: vec![claim],
            allow_discards: p.allow_discards,
            online: Some(Arc::new(PlainOnline(served))),
        })
    }
}

/// A plain volume open online: it can be resized (cryptsetup `resize` works on plain
/// devices); suspend, resume and refresh are LUKS verbs.
struct PlainOnline(ServedCrypt);

impl PlainOnline {
    fn luks_only<T>(&self) -> Result<T, OnlineError> {
        Err(OnlineError::invalid(format!(
            "{}: This operation is supported only for LUKS device.",
            self.0.params().name
        )))
    }
}

impl Online for PlainOnline {
    fn resize(&self, sectors: Option<u64>) -> Result<u64, OnlineError> {
        self.0.resize(sectors, None)
    }
    fn suspend(&self) -> Result<(), OnlineError> {
        self.luks_only()
    }
    fn resume(&self, _: &Unlock) -> Result<(), OnlineError> {
        self.luks_only()
    }
    fn refresh(&self, _: &Unlock, _: RefreshFlags) -> Result<(), OnlineError> {
        self.luks_only()
    }
    fn suspended(&self) -> bool {
        false
    }
    fn allow_discards(&self) -> bool {
        self.0.params().allow_discards
    }
    fn closing(&self) {
        self.0.close();
    }
}
