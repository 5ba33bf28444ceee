//! Writing a new LUKS2 header (cryptsetup's `luksFormat`): layout of headers, keyslots area and
//! data segment, a random volume key, its digest and keyslot 0.

use super::digest;
use super::header::{Luks2Header, HEADER_SIZES};
use super::json::{Config, Metadata, Segment, MAX_KEYSLOTS_SIZE};
use super::keyslot::{self, PbkdfParams};
use crate::block::BlockDevice;
use crate::crypt::luks::{LuksError, VolumeKey};
use std::collections::BTreeMap;

/// cryptsetup's default data offset (and detached keyslots reach): 16 MiB.
pub const DEFAULT_DATA_OFFSET: u64 = 16 << 20;

/// What to format.
#[derive(Debug, Clone)]
pub struct FormatParams {
    /// Data cipher, dm-crypt notation ("aes-xts-plain64").
    pub cipher: String,
    /// Volume key size in bytes.
    pub key_size: usize,
    /// KDF of keyslot 0; its hash is also the AF and digest hash.
    pub pbkdf: PbkdfParams,
    /// Encryption sector size (default: 4096 when the data area is 4 KiB aligned, else 512).
    pub sector_size: Option<u32>,
    /// Label.
    pub label: String,
    /// Subsystem.
    pub subsystem: String,
    /// UUID (default: random).
    pub uuid: Option<String>,
    /// Size of one header copy (16 KiB .. 4 MiB).
    pub metadata_size: u64,
    /// Size of the keyslots area.
    pub keyslots_size: Option<u64>,
    /// Data offset in bytes on the data device.
    pub data_offset: Option<u64>,
    /// Whether the header lives on a device of its own (`--header`).
    pub detached: bool,
    /// Use this volume key instead of a random one.
    pub volume_key: Option<VolumeKey>,
    /// The segment's `integrity.type` (`hmac(sha256)`, `aead`, `poly1305`, `none`): `cipher`
    /// is then an authenticated mode and `key_size` counts the MAC key too. The integrity
    /// device under the segment is written separately ([`super::integrity::format`]).
    pub integrity: Option<String>,
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            cipher: "aes-xts-plain64".into(),
            key_size: 64,
            pbkdf: PbkdfParams::default(),
            sector_size: None,
            label: String::new(),
            subsystem: String::new(),
            uuid: None,
            metadata_size: 16 << 10,
            keyslots_size: None,
            data_offset: None,
            detached: false,
            volume_key: None,
            integrity: None,
        }
    }
}

/// A random RFC 4122 version 4 UUID, as text.
pub fn random_uuid() -> String {
    let mut u = [0u8; 16];
    getrandom::getrandom(&mut u).expect("the kernel's random source");
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    let h = hex::encode(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Whether `s` is a UUID in its canonical text form.
pub fn valid_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// The header layout: (keyslots_size, data_offset).
pub fn layout(p: &FormatParams) -> Result<(u64, u64), LuksError> {
    let inv = |s: String| Err(LuksError::Invalid(s));
    if !HEADER_SIZES.contains(&p.metadata_size) {
        return inv(format!(
            "--luks2-metadata-size {} is not one of 16k, 32k, ..., 4m",
            p.metadata_size
        ));
    }
    // LUKS2_generate_hdr's rules: a given data offset sizes the keyslots area (detached or
    // not), an explicit area shrinks to fit before it, and without an offset the data
    // follows the area, 1 MiB aligned (a detached header leaves the data at 0).
    let min = 2 * p.metadata_size;
    if let Some(k) = p.keyslots_size {
        if !k.is_multiple_of(4096) || k > MAX_KEYSLOTS_SIZE {
            return inv(format!(
                "--luks2-keyslots-size {k} is not a multiple of 4096 up to 128 MiB"
            ));
        }
    }
    let offset = p.data_offset.filter(|&o| o > 0);
    if let Some(o) = offset {
        if !o.is_multiple_of(512) {
            return inv(format!("data offset {o} is not a multiple of 512"));
        }
        if o < min {
            return inv("Requested data offset is too small.".into());
        }
    }
    let mut keyslots_size = match (p.keyslots_size.filter(|&k| k > 0), offset) {
        (Some(k), _) => k,
        (None, Some(o)) => o - min,
        (None, None) => 0,
    };
    keyslots_size = (keyslots_size / 4096 * 4096).min(MAX_KEYSLOTS_SIZE);
    if keyslots_size == 0 {
        keyslots_size = DEFAULT_DATA_OFFSET - min;
    }
    if let Some(o) = offset {
        if keyslots_size + min > o {
            keyslots_size = o - min;
        }
    }
    let data_offset = match offset {
        Some(o) => o,
        None if p.detached => 0,
        None => (min + keyslots_size).div_ceil(1 << 20) * (1 << 20),
    };
    Ok((keyslots_size, data_offset))
}

/// The encryption sector size of a format: `--sector-size`, else cryptsetup's choice
/// (`_crypt_format_luks2` with `sector_size_autodetect`): 4096, unless an `--offset` (counted
/// in 512-byte sectors, as cryptsetup tests it) is not a multiple of 4096 sectors, or the
/// device size less the default 1 MiB alignment (nothing for a detached header) is not a
/// multiple of 4096 bytes; then 512.
pub fn sector_size(p: &FormatParams, data_size: u64) -> Result<u32, LuksError> {
    const AUTO: u64 = 4096;
    let offset_misaligned = p
        .data_offset
        .is_some_and(|o| !(o / 512).is_multiple_of(AUTO));
    let alignment = if p.detached { 0 } else { 1 << 20 };
    let size_misaligned = !data_size.wrapping_sub(alignment).is_multiple_of(AUTO);
    Ok(match p.sector_size {
        Some(s) if matches!(s, 512 | 1024 | 2048 | 4096) => s,
        Some(s) => {
            return Err(LuksError::Invalid(format!(
                "--sector-size {s} is not 512, 1024, 2048 or 4096"
            )))
        }
        None if offset_misaligned || size_misaligned => 512,
        None => AUTO as u32,
    })
}

/// cryptsetup's warning after a format that leaves no data sector on a data device of
/// `data_size` bytes (it formats anyway: the device may grow before it is opened).
pub fn no_room_warning(data_name: &str, data_size: u64, data_offset: u64) -> Option<String> {
    (data_size <= data_offset).then(|| {
        format!(
            "Device {data_name} is too small for activation, there is no remaining space for data."
        )
    })
}

/// Format: write a LUKS2 header with keyslot 0 opened by `passphrase` to `hdr_dev` (the data
/// device itself unless detached; `data_size` is the data device's size). Returns the header
/// and the volume key.
pub fn format(
    hdr_dev: &dyn BlockDevice,
    data_size: u64,
    p: &FormatParams,
    passphrase: &[u8],
) -> Result<(Luks2Header, VolumeKey), LuksError> {
    let prepared = prepare(hdr_dev, data_size, p)?;
    write(hdr_dev, prepared, p, passphrase)
}

/// A format decided and checked, nothing written yet: the header (no keyslot), the volume
/// key, and where the metadata ends.
pub struct Prepared {
    /// The header, keyslot 0 not yet added.
    pub header: Luks2Header,
    /// The volume key (drawn, or `p.volume_key`).
    pub volume_key: VolumeKey,
    /// End of the header copies and keyslots area, in bytes.
    pub metadata_end: u64,
}

/// Every check of [`format()`], and the volume key, before anything is written: what runs
/// between this and [`write()`] (the integrity device's format) may rely on the header being
/// writable.
pub fn prepare(
    hdr_dev: &dyn BlockDevice,
    data_size: u64,
    p: &FormatParams,
) -> Result<Prepared, LuksError> {
    let (keyslots_size, data_offset) = layout(p)?;
    let sector_size = sector_size(p, data_size)?;
    if !data_offset.is_multiple_of(sector_size as u64) {
        return Err(LuksError::Invalid(format!(
            "data offset {data_offset} is not a multiple of the sector size {sector_size}"
        )));
    }
    // Without integrity cryptsetup formats a device with no room for data (a header for a
    // device that grows later) and only warns ([`no_room_warning`]); integrity needs sectors.
    if p.integrity.is_some() && data_size < data_offset + sector_size as u64 {
        return Err(LuksError::Invalid(format!(
            "{} is too small: {data_size} bytes leave no data after the data offset {data_offset}",
            if p.detached {
                "the data device"
            } else {
                hdr_dev.name()
            }
        )));
    }
    let metadata_end = 2 * p.metadata_size + keyslots_size;
    match &p.integrity {
        Some(itype) => {
            let kind = crate::crypt::cipher::AeadKind::from_luks2(&p.cipher, itype)
                .map_err(|e| LuksError::Unsupported(e.to_string()))?;
            crate::crypt::cipher::SectorAead::new(kind, &vec![0x5a; p.key_size], 512)
                .map_err(|e| LuksError::Unsupported(e.to_string()))?;
        }
        None => crate::crypt::luks::area::check(&p.cipher, p.key_size).map_err(|_| {
            LuksError::Unsupported(format!(
                "cipher {:?} with a {}-bit key",
                p.cipher,
                p.key_size * 8
            ))
        })?,
    }
    let uuid = match &p.uuid {
        Some(u) if valid_uuid(u) => u.to_ascii_lowercase(),
        Some(u) => return Err(LuksError::Invalid(format!("--uuid {u:?} is not a UUID"))),
        None => random_uuid(),
    };
    let vk: VolumeKey = match &p.volume_key {
        Some(k) if k.len() == p.key_size => k.clone(),
        Some(k) => {
            return Err(LuksError::Invalid(format!(
                "the volume key has {} bytes, --key-size says {}",
                k.len(),
                p.key_size
            )))
        }
        None => {
            let mut k = VolumeKey::new(vec![0u8; p.key_size]);
            getrandom::getrandom(&mut k)
                .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
            k
        }
    };
    let digest = digest::create(&vk, &p.pbkdf.hash, p.pbkdf.force_iterations.is_none())?;
    let mut segment = Segment {
        kind: "crypt".into(),
        offset: data_offset,
        size: None,
        iv_tweak: 0,
        encryption: p.cipher.clone(),
        sector_size,
        flags: Vec::new(),
        raw: Default::default(),
        problem: None,
    };
    if let Some(itype) = &p.integrity {
        segment.set_integrity(itype);
    }
    let h = Luks2Header {
        hdr_size: p.metadata_size,
        seqid: 0,
        label: p.label.clone(),
        subsystem: p.subsystem.clone(),
        uuid,
        checksum_alg: "sha256".into(),
        metadata: Metadata {
            keyslots: BTreeMap::new(),
            tokens: BTreeMap::new(),
            token_text: Default::default(),
            segments: BTreeMap::from([(0, segment)]),
            digests: BTreeMap::from([(0, digest)]),
            config: Config {
                json_size: p.metadata_size - 4096,
                keyslots_size,
                flags: Vec::new(),
                requirements: Vec::new(),
                raw: Default::default(),
            },
            extra: Default::default(),
        },
        raw: None,
    };
    // Check label and subsystem lengths before anything is written.
    h.encode()?;
    Ok(Prepared {
        header: h,
        volume_key: vk,
        metadata_end,
    })
}

/// Write a [`prepare`]d format: wipe the old headers and keyslots, add keyslot 0.
pub fn write(
    hdr_dev: &dyn BlockDevice,
    prepared: Prepared,
    p: &FormatParams,
    passphrase: &[u8],
) -> Result<(Luks2Header, VolumeKey), LuksError> {
    let Prepared {
        header: mut h,
        volume_key: vk,
        metadata_end,
    } = prepared;
    if hdr_dev.size() < metadata_end {
        return Err(LuksError::Invalid(format!(
            "{} is too small for the LUKS2 metadata and keyslots ({metadata_end} bytes)",
            hdr_dev.name()
        )));
    }
    // Old headers and keyslots must not survive under the new ones.
    keyslot::wipe(hdr_dev, 0, metadata_end)?;
    keyslot::add(hdr_dev, &mut h, &vk, passphrase, &p.pbkdf, Some(0), None)?;
    Ok((h, vk))
}
