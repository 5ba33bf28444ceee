//! `luksFormat`: a new LUKS2 (or LUKS1) header with keyslot 0, in two steps so a caller can
//! ask before anything is written: [`Formatter::new`] checks every parameter, opens the device
//! and claims it; [`Formatter::format`] writes. With integrity, the write order is the one a
//! crash cannot turn into a header that opens over unsealed sectors: the old header is wiped,
//! then the integrity superblock and journal, then every sector sealed, then the header.

use super::{LuksError, VolumeKey};
use crate::block::{BlockDevice, Claim, FileDevice};
use crate::crypt::cipher::AeadKind;
use crate::crypt::luks1;
use crate::crypt::luks2::{self, integrity as luks2_integrity, FormatParams, PbkdfParams};
use std::path::{Path, PathBuf};

/// What to format.
#[derive(Clone, Debug, Default)]
pub struct FormatSpec {
    /// The device or image.
    pub device: PathBuf,
    /// A detached header file, LUKS2 or LUKS1 (created owner-only if missing).
    pub header: Option<PathBuf>,
    /// LUKS1 instead of LUKS2.
    pub luks1: bool,
    /// The data cipher (`aes-xts-plain64`, ...).
    pub cipher: String,
    /// Volume key size in bits (default: the cipher's).
    pub key_bits: Option<u32>,
    /// Keyslot 0's KDF.
    pub pbkdf: PbkdfParams,
    /// Encryption sector size (LUKS2).
    pub sector_size: Option<u32>,
    /// Label (LUKS2).
    pub label: Option<String>,
    /// Subsystem (LUKS2).
    pub subsystem: Option<String>,
    /// UUID (default: random).
    pub uuid: Option<String>,
    /// Size of one LUKS2 header copy (default 16 KiB).
    pub metadata_size: Option<u64>,
    /// Size of the LUKS2 keyslots area.
    pub keyslots_size: Option<u64>,
    /// Data offset in 512-byte sectors.
    pub offset: Option<u64>,
    /// Authenticated encryption (LUKS2).
    pub integrity: Option<IntegritySpec>,
}

/// Authenticated encryption of a LUKS2 format.
#[derive(Clone, Debug, Default)]
pub struct IntegritySpec {
    /// hmac-sha256, hmac-sha512, aead, poly1305 or none.
    pub name: String,
    /// MAC key size in bits (hmac-*; default: the hash's output size).
    pub key_bits: Option<u32>,
    /// Leave the sectors unsealed (reading one never written fails).
    pub no_wipe: bool,
}

/// A checked format, its device open and claimed, nothing written yet.
pub struct Formatter {
    spec: FormatSpec,
    data: FileDevice,
    _claim: Claim,
    integrity: Option<(&'static str, AeadKind)>,
    key_bits: u32,
}

impl Formatter {
    /// Check `spec`, open its device and claim all of it (a device in use is not formatted,
    /// as cryptsetup's "Cannot format device ... in use").
    pub fn new(spec: FormatSpec) -> Result<Formatter, LuksError> {
        if spec.luks1 {
            luks1_refusals(&spec)?;
        }
        if spec.offset.is_some_and(|o| !o.is_multiple_of(8)) {
            // crypt_set_data_offset, for either version.
            return Err(LuksError::Invalid(
                "Data offset is not multiple of 4096 bytes.".into(),
            ));
        }
        let integrity = match &spec.integrity {
            Some(_) if spec.header.is_some() => {
                return Err(LuksError::Invalid(
                    "--integrity with a detached --header is not supported (the integrity superblock lives on DEVICE at the data offset)".into(),
                ))
            }
            Some(i) => {
                let itype = luks2_integrity::integrity_type(&i.name)?;
                let (kind, vk_len) =
                    luks2_integrity::key_layout(&spec.cipher, itype, spec.key_bits, i.key_bits)?;
                Some((itype, kind, vk_len))
            }
            None => None,
        };
        let key_bits = match &integrity {
            Some((_, _, vk_len)) => *vk_len as u32 * 8,
            None => {
                let cipher = crate::crypt::cipher::CipherSpec::parse(&spec.cipher)
                    .map_err(|e| LuksError::Invalid(format!("--cipher: {e}")))?;
                let key_bits = spec
                    .key_bits
                    .unwrap_or(cipher.default_key_size() as u32 * 8);
                if !key_bits.is_multiple_of(8)
                    || cipher.check_key_size(key_bits as usize / 8).is_err()
                {
                    return Err(LuksError::Invalid(format!(
                        "--key-size: {key_bits} bits is not valid for {}",
                        spec.cipher
                    )));
                }
                key_bits
            }
        };
        if !spec.device.exists() {
            return Err(LuksError::NoDevice(format!(
                "{}: no such device or file",
                spec.device.display()
            )));
        }
        // The claim covers the whole device, for as long as the format runs.
        let data = crate::block::open_backing(&spec.device, spec.header.is_some(), false)?;
        let claim = Claim::take(data.file(), &spec.device, 0, 0, spec.header.is_none())?;
        Ok(Formatter {
            integrity: integrity.map(|(t, k, _)| (t, k)),
            spec,
            data,
            _claim: claim,
            key_bits,
        })
    }

    /// Bytes of the volume key (what a `--volume-key-file` must hold: cryptsetup reads that
    /// many bytes of it).
    pub fn key_bytes(&self) -> usize {
        self.key_bits as usize / 8
    }

    /// The file the header goes to (the device, or the detached header).
    pub fn header_path(&self) -> &Path {
        self.spec.header.as_deref().unwrap_or(&self.spec.device)
    }

    /// Write the header with keyslot 0 for `pass` holding `volume_key` (default: a random
    /// one); `progress(done, total)` in bytes while integrity sectors are sealed. Every check
    /// comes first: a refused format writes nothing. An image file smaller than the LUKS2
    /// metadata grows to hold it, as with cryptsetup. Gives cryptsetup's warning when the data
    /// device has no room left for data (formatted anyway, as cryptsetup does).
    pub fn format(
        self,
        pass: &[u8],
        volume_key: Option<VolumeKey>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Option<String>, LuksError> {
        let s = &self.spec;
        if s.luks1 {
            return self.format_luks1(pass, volume_key);
        }
        let p = FormatParams {
            cipher: s.cipher.clone(),
            key_size: self.key_bits as usize / 8,
            pbkdf: s.pbkdf.clone(),
            sector_size: s.sector_size,
            label: s.label.clone().unwrap_or_default(),
            subsystem: s.subsystem.clone().unwrap_or_default(),
            uuid: s.uuid.clone(),
            metadata_size: s.metadata_size.unwrap_or(16 << 10),
            keyslots_size: s.keyslots_size,
            data_offset: s.offset.map(|o| o.saturating_mul(512)),
            detached: s.header.is_some(),
            volume_key,
            integrity: self.integrity.map(|(t, _)| t.to_string()),
        };
        let data_size = self.data.size();
        let (hdr_dev, _header_claim) = match &s.header {
            Some(h) => {
                let (keyslots_size, _) = luks2::format::layout(&p)?;
                let (dev, claim) = detached_header(h, 2 * p.metadata_size + keyslots_size)?;
                (dev, Some(claim))
            }
            None => (self.data, None),
        };
        let prepared = luks2::format::prepare(&hdr_dev, data_size, &p)?;
        let data_offset = prepared
            .header
            .metadata
            .segments
            .get(&0)
            .map_or(0, |seg| seg.offset);
        let hdr_path = s.header.as_deref().unwrap_or(&s.device);
        let hdr_dev = grown(hdr_dev, hdr_path, prepared.metadata_end)?;
        if let Some((_, kind)) = self.integrity {
            let wipe = !s.integrity.as_ref().is_some_and(|i| i.no_wipe);
            format_integrity(&s.device, &hdr_dev, &prepared, kind, wipe, progress)?;
        }
        luks2::format::write(&hdr_dev, prepared, &p, pass)?;
        // The data device may have grown with the header (a file container).
        let data_size = if s.header.is_some() {
            data_size
        } else {
            hdr_dev.size()
        };
        Ok(luks2::format::no_room_warning(
            &s.device.display().to_string(),
            data_size,
            data_offset,
        ))
    }

    /// LUKS1, on the device or in a detached header file (data at `--offset`, 0 by
    /// default, as cryptsetup). Gives cryptsetup's warning when the data device has no room
    /// left for data.
    fn format_luks1(
        &self,
        pass: &[u8],
        volume_key: Option<VolumeKey>,
    ) -> Result<Option<String>, LuksError> {
        let s = &self.spec;
        // --label and --subsystem are ignored, as cryptsetup ignores them for LUKS1.
        let uuid = s.uuid.clone().unwrap_or_else(luks2::format::random_uuid);
        if !luks2::format::valid_uuid(&uuid) {
            return Err(LuksError::Invalid(format!("--uuid {uuid:?} is not a UUID")));
        }
        let offset = s
            .offset
            .map(|o| {
                u32::try_from(o)
                    .map_err(|_| LuksError::Invalid("--offset is too large for LUKS1".into()))
            })
            .transpose()?;
        let key_bytes = self.key_bits / 8;
        let (payload, hdr_dev, _claim) = match &s.header {
            None => (luks1::Payload::Attached(offset), None, None),
            Some(h) => {
                let payload = offset.unwrap_or(0);
                let end = luks1::header_sectors(key_bytes);
                if payload != 0 && payload < end {
                    // Before the header file is touched.
                    return Err(LuksError::Invalid(
                        "Data offset for LUKS header must be either 0 or higher than header size."
                            .into(),
                    ));
                }
                // cryptsetup sizes the file to the header, or to the data offset if larger.
                let need = u64::from(end.max(payload)) * 512;
                let (dev, claim) = detached_header(h, need)?;
                (luks1::Payload::Detached(payload), Some(dev), Some(claim))
            }
        };
        let dev: &dyn crate::block::BlockDevice = match &hdr_dev {
            Some(d) => d,
            None => &self.data,
        };
        let (h, _) = luks1::format(
            dev,
            &s.cipher,
            key_bytes,
            &s.pbkdf.hash,
            &uuid,
            s.pbkdf.force_iterations,
            s.pbkdf.iter_time_ms,
            payload,
            pass,
            volume_key,
        )?;
        Ok(match payload {
            luks1::Payload::Detached(_) => luks2::format::no_room_warning(
                &s.device.display().to_string(),
                self.data.size(),
                u64::from(h.payload_offset) * 512,
            ),
            luks1::Payload::Attached(_) => None,
        })
    }
}

/// `dev` (the file at `path`), grown to `end` bytes when it is a regular file smaller than
/// that (cryptsetup writes the whole metadata area into a small image and so extends it).
fn grown(dev: FileDevice, path: &Path, end: u64) -> Result<FileDevice, LuksError> {
    let is_file = dev.file().metadata().is_ok_and(|m| m.is_file());
    if dev.size() >= end || !is_file {
        return Ok(dev);
    }
    dev.file()
        .set_len(end)
        .map_err(|e| LuksError::Invalid(format!("{}: {e}", path.display())))?;
    Ok(crate::block::open_device(path, false, false)?)
}

/// cryptsetup's refusals of LUKS2-only options with `--type luks1` (`action_luksFormat`),
/// with its words, before anything is asked or opened.
fn luks1_refusals(spec: &FormatSpec) -> Result<(), LuksError> {
    let refuse = |m: &str| Err(LuksError::Invalid(m.into()));
    if spec.sector_size.is_some_and(|n| n > 512) {
        return refuse("Unsupported encryption sector size.");
    }
    if spec.integrity.is_some() {
        return refuse("Integrity option can be used only for LUKS2 format.");
    }
    if spec.metadata_size.is_some() || spec.keyslots_size.is_some() {
        return refuse("Unsupported LUKS2 metadata size options.");
    }
    Ok(())
}

/// A detached header file, created owner-only if missing (it holds the keyslots), as
/// cryptsetup does; an existing file or device is used as it is. A file is grown to `need`
/// bytes (headers and keyslots).
fn detached_header(h: &Path, need: u64) -> Result<(FileDevice, Claim), LuksError> {
    let cannot =
        |e| LuksError::NoDevice(format!("{}: cannot create header file: {e}", h.display()));
    let f = match super::files::create_new(h, super::files::HEADER_MODE) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(h)
            .map_err(cannot)?,
        Err(e) => return Err(cannot(e)),
    };
    let claim = Claim::take(&f, h, 0, 0, true)?;
    let meta = f
        .metadata()
        .map_err(|e| LuksError::Invalid(e.to_string()))?;
    if meta.is_file() && meta.len() < need {
        f.set_len(need)
            .map_err(|e| LuksError::Invalid(format!("{}: {e}", h.display())))?;
    }
    Ok((crate::block::open_device(h, false, false)?, claim))
}

/// The integrity half of `luksFormat --integrity`, between the checks and the header: the
/// old header goes first (a format cut short leaves no header that opens), then the
/// integrity superblock and journal, then (with `wipe`) every sector sealed with the volume
/// key the header will hold.
fn format_integrity(
    path: &Path,
    dev: &FileDevice,
    prepared: &luks2::format::Prepared,
    kind: AeadKind,
    wipe: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), LuksError> {
    let seg = prepared
        .header
        .metadata
        .segments
        .get(&0)
        .ok_or_else(|| LuksError::Invalid("the new header has no data segment".into()))?;
    let plan = luks2_integrity::plan(kind, seg.sector_size, dev.size(), seg.offset)?;
    luks2::keyslot::wipe(dev, 0, prepared.metadata_end)?;
    // The sealed sectors bypass the page cache where the storage allows O_DIRECT (tmpfs and
    // a few others do not).
    let direct = crate::block::open_backing(path, false, true).ok();
    let to = luks2_integrity::FormatTarget {
        dev,
        direct: direct.as_ref().map(|d| d as &dyn BlockDevice),
    };
    luks2_integrity::format(
        to,
        seg.offset,
        &plan,
        kind,
        &prepared.volume_key,
        wipe,
        progress,
    )
}
