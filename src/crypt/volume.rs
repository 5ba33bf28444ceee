//! One handle on a LUKS volume whatever its version, as libcryptsetup's `crypt_device` is:
//! read the header (LUKS1 or LUKS2), unlock a keyslot, find the data segment, and activate it
//! as the right stack of targets (dm-crypt, or dm-crypt in an authenticated mode over
//! dm-integrity). The command line asks this module and never decides by version itself.

use super::luks1::{self, Luks1Header};
use super::luks2::activate::{self, ActivateOptions, DataSegment};
use super::luks2::header::{self, luks_version};
use super::luks2::integrity::{self, IntegrityActivation};
use super::luks2::{keyslot, Luks2Header, LuksError, VolumeKey};
use super::target::CryptDevice;
use crate::block::BlockDevice;
use std::sync::Arc;

/// A parsed LUKS header of either version.
pub enum Header {
    /// LUKS2.
    V2(Box<Luks2Header>),
    /// LUKS1.
    V1(Box<Luks1Header>),
}

/// An activated volume: the top device of its stack, and its counters for `status`.
pub struct Activated {
    /// The decrypted (and, with integrity, authenticated) device.
    pub device: Arc<dyn BlockDevice>,
    /// The stack's counters as JSON.
    pub stats: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
}

impl Header {
    /// Read the header on `dev`, LUKS1 or LUKS2 by its version field; with a warning when a
    /// corrupt LUKS2 copy was skipped. The same as [`Header::read_as`] with no type asked for.
    pub fn read(dev: &dyn BlockDevice) -> Result<(Header, Option<String>), LuksError> {
        Self::read_as(dev, None)
    }

    /// Read the header on `dev` with cryptsetup's verdict on versions (`_crypt_load_luks`):
    /// the version field after the primary magic decides, checksum or not. Version 1 is read
    /// as LUKS1 and version 2 as LUKS2; without the primary magic (version 0) the LUKS2 reader
    /// looks for a secondary copy; any other version is refused ("Unsupported LUKS version 3.")
    /// rather than skipped for the secondary copy, as a future format may reuse that space.
    /// `want` (1 or 2, from `--type luks1|luks2`) forces that reader, as `crypt_load` with a
    /// type does, but a primary of the other known version is refused.
    pub fn read_as(
        dev: &dyn BlockDevice,
        want: Option<u16>,
    ) -> Result<(Header, Option<String>), LuksError> {
        let mut first = [0u8; 8];
        if dev.size() >= 8 {
            dev.read_at(&mut first, 0)?;
        }
        let version = luks_version(&first).unwrap_or(0);
        if let Some(w) = want.filter(|&w| matches!((w, version), (1, 2) | (2, 1))) {
            return Err(LuksError::Invalid(format!(
                "{}: the header is LUKS{version}, not of the requested type luks{w}",
                dev.name()
            )));
        }
        match want.unwrap_or(version) {
            1 => Ok((Header::V1(Box::new(luks1::read(dev)?)), None)),
            0 | 2 => {
                let loaded = header::read(dev)?;
                Ok((Header::V2(Box::new(loaded.header)), loaded.warning))
            }
            v => Err(LuksError::Corrupt {
                device: dev.name().to_string(),
                what: format!("Unsupported LUKS version {v}."),
            }),
        }
    }

    /// "LUKS2" or "LUKS1".
    pub fn type_name(&self) -> &'static str {
        match self {
            Header::V2(_) => "LUKS2",
            Header::V1(_) => "LUKS1",
        }
    }

    /// Unlock a key with `pass` from the header on `dev` (keyslot `slot` only when given):
    /// LUKS2 keys bound to `segment`, LUKS1 keys (always the data segment's).
    pub fn unlock(
        &self,
        dev: &dyn BlockDevice,
        pass: &[u8],
        slot: Option<u32>,
        segment: keyslot::Segment,
    ) -> Result<(u32, VolumeKey), LuksError> {
        match self {
            Header::V2(h) => keyslot::unlock(dev, h, pass, slot, segment),
            Header::V1(h) => luks1::unlock(dev, h, pass, slot),
        }
    }

    /// The UUID.
    pub fn uuid(&self) -> &str {
        match self {
            Header::V2(h) => &h.uuid,
            Header::V1(h) => &h.uuid,
        }
    }

    /// Data cipher, and data offset in bytes.
    pub fn cipher_and_offset(&self) -> (String, u64) {
        match self {
            Header::V2(h) => h
                .metadata
                .segments
                .get(&0)
                .map_or((String::new(), 0), |s| (s.encryption.clone(), s.offset)),
            Header::V1(h) => (h.cipher(), h.payload_offset as u64 * 512),
        }
    }

    /// The volume key size in bits (of the first keyslot for LUKS2).
    pub fn key_bits(&self) -> u32 {
        match self {
            Header::V2(h) => h
                .metadata
                .keyslots
                .values()
                .next()
                .map_or(0, |k| k.key_size * 8),
            Header::V1(h) => h.key_bytes * 8,
        }
    }

    /// The data segment on a data device `data_name` of `data_size` bytes, checked (LUKS1
    /// gets the same treatment as LUKS2); `detached` when the header lives elsewhere.
    pub fn data_segment(
        &self,
        data_name: &str,
        data_size: u64,
        detached: bool,
    ) -> Result<DataSegment, LuksError> {
        match self {
            Header::V2(h) => activate::data_segment(h, data_name, data_size, detached),
            Header::V1(h) => {
                let offset = h.payload_offset as u64 * 512;
                if offset >= data_size {
                    return Err(LuksError::Corrupt {
                        device: data_name.to_string(),
                        what: format!(
                            "payload offset {offset} is beyond the end of the device ({data_size} bytes, truncated?)"
                        ),
                    });
                }
                Ok(DataSegment {
                    cipher: h.cipher(),
                    offset,
                    size: (data_size - offset) / 512 * 512,
                    sector_size: 512,
                    iv_tweak: 0,
                    allow_discards: false,
                    integrity: None,
                })
            }
        }
    }
}

/// Activate `seg` over the data device `data` with the volume key `vk`: dm-crypt, or with
/// integrity dm-crypt in its authenticated mode over dm-integrity.
pub fn activate(
    seg: &DataSegment,
    data: Arc<dyn BlockDevice>,
    vk: &[u8],
    opts: &ActivateOptions,
    iopts: &IntegrityActivation,
) -> Result<Activated, LuksError> {
    match &seg.integrity {
        Some(itype) => {
            let dev = integrity::crypt_device(seg, itype, data, vk, opts, iopts)?;
            let stats = dev.stats();
            Ok(Activated {
                device: Arc::new(dev),
                stats: Arc::new(move || stats.to_json()),
            })
        }
        None => {
            let dev: CryptDevice = activate::crypt_device(seg, data, vk, opts)?;
            let stats = dev.stats();
            Ok(Activated {
                device: Arc::new(dev),
                stats: Arc::new(move || stats.to_json()),
            })
        }
    }
}
