//! LUKS2 with integrity (`luksFormat --integrity`): dm-crypt in an authenticated mode over a
//! dm-integrity device without internal hash that starts at the data segment's offset, as
//! cryptsetup sets them up.
//!
//! - The segment names the pair: `"encryption": "aes-xts-plain64"` and
//!   `"integrity": {"type": "hmac(sha256)", "journal_encryption": "none",
//!   "journal_integrity": "none"}`; the volume key is the encryption key then the MAC key.
//! - Format writes the integrity superblock and journal the kernel writes on first activation
//!   (no salt, `fix_padding`), then, unless told not to, initialises every sector: zeros
//!   sealed with their tags, written straight to their places on all cores (cryptsetup
//!   writes zeros through the stacked devices instead).
//! - Open stacks the same two targets the kernel stacks: [`IntegrityDevice`] in mode J (or D
//!   with `--integrity-no-journal`), then [`AeadCryptDevice`].

use super::activate::{ActivateOptions, DataSegment};
use crate::block::aligned::AlignedBuf;
use crate::block::{BlockDevice, BlockError, TaggedBlockDevice, Window};
use crate::crypt::cipher::{AeadKind, SectorAead};
use crate::crypt::luks::LuksError;
use crate::crypt::target::AeadCryptDevice;
use crate::integrity::device::{IntegrityDevice, IntegrityOptions};
use crate::integrity::format::{self as iformat, FormatParams as IntegrityFormatParams};
use crate::integrity::geometry::Geometry;
use crate::integrity::rw_meta::Mode;
use crate::integrity::superblock::read_superblock;
use std::sync::Arc;

/// The LUKS2 `integrity.type` for cryptsetup's `--integrity` name: `hmac-sha256` →
/// `hmac(sha256)`, `hmac-sha512` → `hmac(sha512)`; `aead`, `poly1305` and `none` as they are.
pub fn integrity_type(name: &str) -> Result<&'static str, LuksError> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "hmac-sha256" | "hmac(sha256)" => "hmac(sha256)",
        "hmac-sha512" | "hmac(sha512)" => "hmac(sha512)",
        "aead" => "aead",
        "poly1305" => "poly1305",
        "none" => "none",
        other => {
            return Err(LuksError::Invalid(format!(
                "--integrity {other:?} is not hmac-sha256, hmac-sha512, aead, poly1305 or none"
            )))
        }
    })
}

/// The mode and volume key size of `cipher` with integrity `itype` (a LUKS2 `integrity.type`):
/// `cipher_key_bits` is cryptsetup's `--key-size` (the encryption key alone; default 512 for
/// XTS, 256 otherwise), `mac_key_bits` its `--integrity-key-size` (default: the hash's size).
pub fn key_layout(
    cipher: &str,
    itype: &str,
    cipher_key_bits: Option<u32>,
    mac_key_bits: Option<u32>,
) -> Result<(AeadKind, usize), LuksError> {
    let kind = AeadKind::from_luks2(cipher, itype).map_err(|e| {
        LuksError::Invalid(format!(
            "{e} (pairs: aes-xts-plain64 + hmac-sha256/hmac-sha512, aes-xts-random + hmac-sha256/none, aes-gcm-random + aead, chacha20-random + poly1305)"
        ))
    })?;
    let bytes = |bits: u32, what: &str| {
        if bits == 0 || !bits.is_multiple_of(8) {
            Err(LuksError::Invalid(format!(
                "{what} {bits} is not a positive multiple of 8 bits"
            )))
        } else {
            Ok(bits as usize / 8)
        }
    };
    let xts = matches!(kind, AeadKind::AuthencXts { .. } | AeadKind::XtsRandom);
    let enc = match cipher_key_bits {
        Some(b) => bytes(b, "--key-size")?,
        None if xts => 64,
        None => 32,
    };
    let mac = match (kind, mac_key_bits) {
        (AeadKind::AuthencXts { .. }, Some(b)) => bytes(b, "--integrity-key-size")?,
        (AeadKind::AuthencXts { .. }, None) => kind.auth_size(),
        (_, Some(_)) => {
            return Err(LuksError::Invalid(format!(
                "--integrity-key-size: {cipher} with integrity {itype} has no separate MAC key"
            )))
        }
        (_, None) => 0,
    };
    let total = enc + mac;
    // The same check the sealer makes, before anything is written.
    SectorAead::new(kind, &vec![0x5a; total], 512).map_err(|e| {
        LuksError::Invalid(format!(
            "--key-size/--integrity-key-size: {e} ({}-bit encryption key, {}-bit MAC key)",
            enc * 8,
            mac * 8
        ))
    })?;
    Ok((kind, total))
}

/// The integrity geometry cryptsetup's format leaves at `offset` of a device of
/// `device_bytes`, for `kind` and `sector_size`.
pub fn plan(
    kind: AeadKind,
    sector_size: u32,
    device_bytes: u64,
    offset: u64,
) -> Result<iformat::FormatPlan, LuksError> {
    let p = IntegrityFormatParams::external_tags(kind.metadata_size() as u16, sector_size);
    iformat::plan(&p, device_bytes.saturating_sub(offset))
        .map_err(|e| LuksError::Invalid(format!("integrity: {e}")))
}

/// Where format writes: the device, and the same device opened with `O_DIRECT` (when the
/// storage allows it) for the sealed sectors, so that gigabytes of ciphertext do not go
/// through the page cache.
#[derive(Clone, Copy)]
pub struct FormatTarget<'a> {
    /// The device, buffered.
    pub dev: &'a dyn BlockDevice,
    /// The same device with `O_DIRECT`, used for 4 KiB-aligned writes from aligned buffers.
    pub direct: Option<&'a dyn BlockDevice>,
}

/// Write the integrity superblock and journal of `plan` at `offset` of `to`, then (with
/// `wipe`) seal every sector of zeros in place with `vk`; `progress(done, total)` in bytes.
pub fn format(
    to: FormatTarget<'_>,
    offset: u64,
    plan: &iformat::FormatPlan,
    kind: AeadKind,
    vk: &[u8],
    wipe: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), LuksError> {
    let dev = to.dev;
    let size = dev.size().saturating_sub(offset);
    let name = dev.name().to_string();
    let beyond = || LuksError::Invalid(format!("{name}: data offset {offset} is beyond the end"));
    let window = Window::new(dev, offset, size).ok_or_else(beyond)?;
    iformat::write(&window, None, plan, &mut |_, _| {})
        .map_err(|e| LuksError::Invalid(format!("{name}: integrity: {e}")))?;
    if wipe {
        let aead = SectorAead::new(kind, vk, plan.geometry.sector_size() as usize)
            .map_err(|e| LuksError::Invalid(e.to_string()))?;
        let direct = match to.direct {
            Some(d) => Some(Window::new(d, offset, size).ok_or_else(beyond)?),
            None => None,
        };
        let out = Writer {
            buffered: &window,
            direct: direct.as_ref().map(|d| d as &dyn BlockDevice),
            offset,
        };
        wipe_sealed(out, &plan.geometry, &aead, progress)?;
        if let Some(d) = &direct {
            d.flush()?;
        }
    }
    window.flush()?;
    Ok(())
}

/// Writes of the wipe: direct where offset (on the device), length and buffer are 4 KiB
/// aligned, buffered otherwise.
#[derive(Clone, Copy)]
struct Writer<'a> {
    buffered: &'a dyn BlockDevice,
    direct: Option<&'a dyn BlockDevice>,
    /// Where the window starts on the device (alignment is the device's).
    offset: u64,
}

impl Writer<'_> {
    fn name(&self) -> &str {
        self.buffered.name()
    }
    fn write_at(&self, buf: &[u8], at: u64) -> Result<(), BlockError> {
        let a = ALIGN as u64;
        match self.direct {
            Some(d)
                if (self.offset + at).is_multiple_of(a)
                    && buf.len().is_multiple_of(ALIGN)
                    && (buf.as_ptr() as usize).is_multiple_of(ALIGN) =>
            {
                d.write_at(buf, at)
            }
            _ => self.buffered.write_at(buf, at),
        }
    }
}

/// Alignment of direct I/O.
const ALIGN: usize = 4096;

/// Data bytes sealed per thread per step.
const WIPE_STEP: usize = 4 << 20;

/// Seal zeros into every provided sector of the integrity device `dev` (geometry `g`): each
/// interleave area's data is split between the cores, sealed and written by each, then the
/// area's tag run is written in one piece.
fn wipe_sealed(
    dev: Writer<'_>,
    g: &Geometry,
    aead: &SectorAead,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), LuksError> {
    let threads = crate::integrity::tags::hashing_threads().max(1);
    let ts = g.tag_size() as usize;
    let bs = g.sector_size() as usize;
    let total = g.provided_data_sectors() * 512;
    let mut done = 0u64;
    let mut bufs: Vec<AlignedBuf> = (0..threads).map(|_| AlignedBuf::new(WIPE_STEP)).collect();
    let mut tag_buf = AlignedBuf::new(0);
    for area in g.area_iter() {
        let bytes = (area.data_sectors * 512) as usize;
        let blocks = bytes / bs;
        let run = (area.metadata_sectors * 512) as usize;
        if tag_buf.len() != run {
            tag_buf = AlignedBuf::new(run);
        }
        let tags = tag_buf.all();
        let per = blocks.div_ceil(threads).max(1);
        let results: Vec<Result<(), BlockError>> = std::thread::scope(|s| {
            let handles: Vec<_> = tags[..blocks * ts]
                .chunks_mut(per * ts)
                .zip(bufs.iter_mut())
                .enumerate()
                .map(|(t, (tag_part, buf))| {
                    s.spawn(move || -> Result<(), BlockError> {
                        let first = t * per;
                        let n = tag_part.len() / ts;
                        let mut k = 0;
                        while k < n {
                            let m = (n - k).min(WIPE_STEP / bs);
                            let data = &mut buf.all()[..m * bs];
                            data.fill(0);
                            let block = (first + k) as u64;
                            let sector = area.first_logical + block * (bs as u64 / 512);
                            aead.seal_sectors(
                                sector,
                                data,
                                &mut tag_part[k * ts..(k + m) * ts],
                                ts,
                            )
                            .map_err(|e| BlockError::Io {
                                device: dev.name().to_string(),
                                offset: sector * 512,
                                source: std::io::Error::other(e.to_string()),
                            })?;
                            dev.write_at(data, area.data_start * 512 + block * bs as u64)?;
                            k += m;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(BlockError::Io {
                            device: dev.name().to_string(),
                            offset: 0,
                            source: std::io::Error::other("a wipe thread panicked"),
                        })
                    })
                })
                .collect()
        });
        for r in results {
            r?;
        }
        dev.write_at(tags, area.metadata_start * 512)?;
        done += bytes as u64;
        progress(done, total);
    }
    Ok(())
}

/// Options of an activation with integrity.
#[derive(Debug, Clone, Default)]
pub struct IntegrityActivation {
    /// `--integrity-no-journal`: mode D instead of J.
    pub no_journal: bool,
}

/// The stacked integrity and crypt targets for `seg` (a segment with integrity `itype`) over
/// `lower`, keyed with `vk`.
pub fn crypt_device(
    seg: &DataSegment,
    itype: &str,
    lower: Arc<dyn BlockDevice>,
    vk: &[u8],
    opts: &ActivateOptions,
    iopts: &IntegrityActivation,
) -> Result<AeadCryptDevice, LuksError> {
    let name = lower.name().to_string();
    let corrupt = |what: String| LuksError::Corrupt {
        device: name.clone(),
        what,
    };
    let kind = AeadKind::from_luks2(&seg.cipher, itype)
        .map_err(|e| LuksError::Unsupported(e.to_string()))?;
    if seg.iv_tweak != 0 {
        return Err(LuksError::Unsupported(format!(
            "iv_tweak {} on a segment with integrity",
            seg.iv_tweak
        )));
    }
    let size = lower.size().saturating_sub(seg.offset);
    let window: Arc<dyn BlockDevice> = Arc::new(
        Window::new(lower, seg.offset, size)
            .ok_or_else(|| corrupt(format!("data offset {} is beyond the end", seg.offset)))?,
    );
    let sb = read_superblock(&*window).map_err(|e| {
        corrupt(format!(
            "no valid dm-integrity superblock at the data offset {}: {e}",
            seg.offset
        ))
    })?;
    if usize::from(sb.integrity_tag_size) != kind.metadata_size() {
        return Err(corrupt(format!(
            "integrity superblock tag_size {} does not match {} with {itype} ({} bytes)",
            sb.integrity_tag_size,
            seg.cipher,
            kind.metadata_size()
        )));
    }
    if sb.sector_size() != seg.sector_size {
        return Err(corrupt(format!(
            "integrity superblock sector size {} differs from the segment's sector_size {}",
            sb.sector_size(),
            seg.sector_size
        )));
    }
    let mode = match (opts.read_only, iopts.no_journal) {
        // Read-only: nothing may be written, not even a journal replay (the kernel's mode R
        // still hands the tags up, and dm-crypt still checks them).
        (true, _) => Mode::Recovery,
        (false, true) => Mode::Direct,
        (false, false) => Mode::Journal,
    };
    let integrity = IntegrityDevice::open(
        window,
        IntegrityOptions::external_tags(&format!("{}_dif", opts.name), mode),
    )
    .map_err(|e| corrupt(format!("integrity: {e}")))?;
    let aead = SectorAead::new(kind, vk, seg.sector_size as usize)
        .map_err(|e| LuksError::Invalid(e.to_string()))?;
    let lower: Arc<dyn TaggedBlockDevice> = Arc::new(integrity);
    AeadCryptDevice::new(&opts.name, lower, aead, opts.read_only).map_err(LuksError::Invalid)
}
