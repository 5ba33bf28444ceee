//! A parsed LUKS header of either version, and what is asked of it by version: read it with
//! cryptsetup's verdict, unlock a keyslot, find the data segment, change keyslots, and build
//! the right stack of targets (dm-crypt, or dm-crypt in an authenticated mode over
//! dm-integrity). Only this file and the volume handle look at the version.

use super::{LuksError, VolumeKey};
use crate::block::BlockDevice;
use crate::crypt::luks1::{self, Luks1Header};
use crate::crypt::luks2::activate::{self, ActivateOptions, DataSegment};
use crate::crypt::luks2::copies;
use crate::crypt::luks2::header::luks_version;
use crate::crypt::luks2::integrity::{self, IntegrityActivation};
use crate::crypt::luks2::{dump, keyslot, Luks2Header, PbkdfParams};
use crate::crypt::target::CryptDevice;
use std::sync::Arc;

/// A parsed LUKS header of either version.
pub enum Header {
    /// LUKS2.
    V2(Box<Luks2Header>),
    /// LUKS1.
    V1(Box<Luks1Header>),
}

/// An activated stack: its top device, and its counters for `status`.
pub struct Stack {
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
                let loaded = copies::read(dev)?;
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
pub fn stack(
    seg: &DataSegment,
    data: Arc<dyn BlockDevice>,
    vk: &[u8],
    opts: &ActivateOptions,
    iopts: &IntegrityActivation,
) -> Result<Stack, LuksError> {
    match &seg.integrity {
        Some(itype) => {
            let dev = integrity::crypt_device(seg, itype, data, vk, opts, iopts)?;
            let stats = dev.stats();
            Ok(Stack {
                device: Arc::new(dev),
                stats: Arc::new(move || stats.to_json()),
            })
        }
        None => {
            let dev: CryptDevice = activate::crypt_device(seg, data, vk, opts)?;
            let stats = dev.stats();
            Ok(Stack {
                device: Arc::new(dev),
                stats: Arc::new(move || stats.to_json()),
            })
        }
    }
}

impl Header {
    /// 1 or 2.
    pub fn version(&self) -> u16 {
        match self {
            Header::V2(_) => 2,
            Header::V1(_) => 1,
        }
    }

    /// How many keyslots are in use.
    pub fn active_keyslots(&self) -> usize {
        match self {
            Header::V2(h) => h.metadata.keyslots.len(),
            Header::V1(h) => h.keyslots.iter().filter(|k| k.active).count(),
        }
    }

    /// Whether keyslot `slot` is in use.
    pub fn has_keyslot(&self, slot: u32) -> bool {
        match self {
            Header::V2(h) => h.metadata.keyslots.contains_key(&slot),
            Header::V1(h) => h.keyslots.get(slot as usize).is_some_and(|k| k.active),
        }
    }

    /// Add a keyslot on `dev` for `pass` holding `vk` (in `slot`, or the first free one).
    /// LUKS1 takes only the PBKDF2 iterations or time from `p`.
    pub(super) fn add_keyslot(
        &mut self,
        dev: &dyn BlockDevice,
        vk: &[u8],
        pass: &[u8],
        p: &PbkdfParams,
        slot: Option<u32>,
    ) -> Result<u32, LuksError> {
        match self {
            Header::V2(h) => keyslot::add(dev, h, vk, pass, p, slot, None),
            Header::V1(h) => {
                luks1::add_key(dev, h, vk, pass, p.force_iterations, p.iter_time_ms, slot)
            }
        }
    }

    /// Wipe keyslot `slot` on `dev`.
    pub(super) fn kill_keyslot(
        &mut self,
        dev: &dyn BlockDevice,
        slot: u32,
    ) -> Result<(), LuksError> {
        match self {
            Header::V2(h) => keyslot::kill(dev, h, slot),
            Header::V1(h) => luks1::kill_slot(dev, h, slot),
        }
    }

    /// Write `uuid` (lowercased) into the header on `dev`.
    pub(super) fn set_uuid(&mut self, dev: &dyn BlockDevice, uuid: &str) -> Result<(), LuksError> {
        match self {
            Header::V2(h) => {
                h.uuid = uuid.to_ascii_lowercase();
                h.write(dev)
            }
            Header::V1(h) => {
                h.uuid = uuid.to_ascii_lowercase();
                let bytes = h.encode()?;
                dev.write_at(&bytes, 0)
                    .map_err(|e| LuksError::Invalid(e.to_string()))?;
                dev.flush().map_err(|e| LuksError::Invalid(e.to_string()))
            }
        }
    }

    /// Write `label` into the header on `dev` (LUKS2 only: LUKS1 has no label).
    pub(super) fn set_label(
        &mut self,
        dev: &dyn BlockDevice,
        label: &str,
    ) -> Result<(), LuksError> {
        match self {
            Header::V2(h) => {
                h.label = label.to_string();
                h.write(dev)
            }
            Header::V1(_) => Err(LuksError::Invalid("LUKS1 has no label".into())),
        }
    }

    /// Bytes a header backup covers: headers and keyslots (LUKS2), everything before the data
    /// (LUKS1), as cryptsetup saves them.
    pub fn backup_len(&self) -> u64 {
        match self {
            Header::V2(h) => h.metadata_end(),
            Header::V1(h) => h.payload_offset as u64 * 512,
        }
    }

    /// cryptsetup's verdict on a header backup (`crypt_header_restore`): the primary magic's
    /// version picks the reader, and a backup without that magic (or with version 0) is no
    /// backup, whatever copy follows (`Ok(None)`).
    pub fn read_backup(dev: &dyn BlockDevice) -> Result<Option<Header>, LuksError> {
        let mut first = [0u8; 8];
        if dev.size() >= 8 {
            dev.read_at(&mut first, 0)
                .map_err(|e| LuksError::Invalid(e.to_string()))?;
        }
        Ok(match luks_version(&first) {
            None | Some(0) => None,
            Some(1) => Some(Header::V1(Box::new(luks1::read(dev)?))),
            Some(_) => Some(Header::V2(Box::new(copies::read(dev)?.header))),
        })
    }

    /// `luksDump`'s text (bytes: metadata strings are printed as they are); `device` names
    /// the device in LUKS1's dump.
    pub fn dump_text(&self, device: &str) -> Vec<u8> {
        match self {
            Header::V2(h) => dump::text(h),
            Header::V1(h) => luks1::dump_text(h, device),
        }
    }

    /// The JSON metadata (LUKS2), or the header as JSON (LUKS1).
    pub fn dump_json(&self) -> serde_json::Value {
        match self {
            Header::V2(h) => h.metadata.to_value(),
            Header::V1(h) => luks1::dump_json(h),
        }
    }

    /// `luksDump --dump-volume-key`'s text for `vk`; `device` names the device.
    pub(super) fn volume_key_text(&self, device: &str, vk: &[u8]) -> String {
        let head = match self {
            Header::V2(h) => dump::luks2_volume_key_header(h),
            Header::V1(h) => dump::VolumeKeyHeader {
                cipher: Some(h.cipher_name.clone()),
                mode: Some(h.cipher_mode.clone()),
                payload_sectors: h.payload_offset as u64,
            },
        };
        dump::volume_key_text(device, &head, self.uuid(), vk)
    }
}
