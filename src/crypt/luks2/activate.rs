//! From an unlocked header to a crypt target: segment 0 checked against the data device, the
//! mandatory requirements honoured, and dm-crypt's table parameters as cryptsetup sets them.

use super::header::Luks2Header;
use crate::block::BlockDevice;
use crate::crypt::cipher::{new_sector_cipher, CipherSpec};
use crate::crypt::luks::LuksError;
use crate::crypt::target::{CryptDevice, CryptParams};
use std::sync::Arc;

/// The data segment as dm-crypt would be given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSegment {
    /// Cipher ("aes-xts-plain64").
    pub cipher: String,
    /// Byte offset on the data device.
    pub offset: u64,
    /// Bytes of decrypted device.
    pub size: u64,
    /// Encryption sector size.
    pub sector_size: u32,
    /// IV offset in 512-byte units (`iv_tweak`).
    pub iv_tweak: u64,
    /// Whether the header asks for discards (`config.flags` "allow-discards").
    pub allow_discards: bool,
    /// The segment's `integrity.type` (`hmac(sha256)`, `aead`, ...): dm-crypt in an
    /// authenticated mode over dm-integrity.
    pub integrity: Option<String>,
}

/// Refuse headers whose mandatory requirements we do not implement (anything but the online
/// reencryption cryptsetup 2.6 writes): activating them could corrupt data.
pub fn check_requirements(h: &Luks2Header, device: &str) -> Result<(), LuksError> {
    let m = &h.metadata;
    let known = super::reencrypt::state::requirement_version(m);
    match m
        .config
        .requirements
        .iter()
        .find(|r| known.is_none() || !r.starts_with("online-reencrypt"))
    {
        Some(r) => Err(LuksError::Requirement {
            device: device.to_string(),
            requirement: r.clone(),
        }),
        None => Ok(()),
    }
}

/// The data area of a header in reencryption, for the claim and `status`: from the lowest
/// offset any segment (backups included) uses to the end of the device, with the new
/// segment's cipher. The segments themselves are mapped by `reencrypt_open`.
fn reencrypt_area(
    h: &Luks2Header,
    data_name: &str,
    data_size: u64,
) -> Result<DataSegment, LuksError> {
    let m = &h.metadata;
    let st = super::reencrypt::ReencryptState::read(m)?
        .ok_or_else(|| LuksError::Invalid("not in reencryption".into()))?;
    let offset = m.segments.values().map(|s| s.offset).min().unwrap_or(0);
    if offset >= data_size {
        return Err(LuksError::Invalid(format!(
            "Device {data_name} is too small."
        )));
    }
    Ok(DataSegment {
        cipher: st.fin.encryption.clone(),
        offset,
        size: (data_size - offset) / 512 * 512,
        sector_size: st.fin.sector_size.max(st.previous.sector_size),
        iv_tweak: 0,
        allow_discards: m.config.flags.iter().any(|f| f == "allow-discards"),
        integrity: None,
    })
}

/// Segment 0 of `h`, checked against a data device of `data_size` bytes. `detached` says the
/// header lives elsewhere, so the data may start at offset 0.
pub fn data_segment(
    h: &Luks2Header,
    data_name: &str,
    data_size: u64,
    detached: bool,
) -> Result<DataSegment, LuksError> {
    let corrupt = |what: String| LuksError::Corrupt {
        device: data_name.to_string(),
        what,
    };
    check_requirements(h, data_name)?;
    let m = &h.metadata;
    if super::reencrypt::state::status(m) != super::reencrypt::Status::None {
        return reencrypt_area(h, data_name, data_size);
    }
    if m.segments.len() != 1 {
        return Err(LuksError::Unsupported(format!(
            "{} data segments (only one is supported)",
            m.segments.len()
        )));
    }
    let s = m
        .segments
        .get(&0)
        .ok_or_else(|| corrupt("no data segment 0".into()))?;
    if s.kind != "crypt" {
        return Err(LuksError::Unsupported(format!(
            "data segment of type {:?}",
            s.kind
        )));
    }
    if !detached && s.offset < h.metadata_end() {
        return Err(corrupt(format!(
            "data segment offset {} overlaps the LUKS2 metadata and keyslots ({} bytes)",
            s.offset,
            h.metadata_end()
        )));
    }
    let ss = s.sector_size as u64;
    if s.integrity_type().is_some() && s.size.is_some() {
        return Err(corrupt(
            "data segment with integrity has a fixed size (it must be \"dynamic\")".into(),
        ));
    }
    let size = match s.size {
        Some(n) => {
            if s.offset.checked_add(n).is_none_or(|end| end > data_size) {
                return Err(corrupt(format!(
                    "data segment {}+{n} reaches beyond the end of the device ({data_size} bytes, truncated?)",
                    s.offset
                )));
            }
            n
        }
        None => data_size.saturating_sub(s.offset) / ss * ss,
    };
    if size == 0 {
        return Err(corrupt(format!(
            "no data after the data offset {} (device of {data_size} bytes)",
            s.offset
        )));
    }
    Ok(DataSegment {
        cipher: s.encryption.clone(),
        offset: s.offset,
        size,
        sector_size: s.sector_size,
        iv_tweak: s.iv_tweak,
        allow_discards: m.config.flags.iter().any(|f| f == "allow-discards"),
        integrity: s.integrity_type(),
    })
}

/// Options of an activation.
#[derive(Debug, Clone, Default)]
pub struct ActivateOptions {
    /// Device name (messages, status).
    pub name: String,
    /// Pass discards down.
    pub allow_discards: bool,
    /// Refuse writes.
    pub read_only: bool,
}

/// The crypt target for `seg` over `lower`, keyed with the volume key.
pub fn crypt_device(
    seg: &DataSegment,
    lower: Arc<dyn BlockDevice>,
    vk: &[u8],
    opts: &ActivateOptions,
) -> Result<CryptDevice, LuksError> {
    let spec = CipherSpec::parse(&seg.cipher).map_err(|e| LuksError::Unsupported(e.to_string()))?;
    let cipher = new_sector_cipher(&spec, vk).map_err(|e| LuksError::Unsupported(e.to_string()))?;
    let mut p = CryptParams::new(&opts.name, seg.offset, seg.size);
    p.sector_size = seg.sector_size;
    p.iv_offset = seg.iv_tweak;
    // cryptsetup sets iv_large_sectors only for plain mode and BitLocker: LUKS2 IVs count
    // 512-byte units whatever the sector size.
    p.iv_large_sectors = false;
    p.allow_discards = opts.allow_discards || seg.allow_discards;
    p.read_only = opts.read_only;
    CryptDevice::new(lower, cipher, p).map_err(|e| LuksError::Invalid(e.to_string()))
}
