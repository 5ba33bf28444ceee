//! Opening a LUKS2 device left in the middle of a reencryption, as cryptsetup's
//! `_open_and_activate_reencrypt_device` does: unlock the old and the new volume key with the
//! one passphrase, check them and the reencryption parameters against the reencrypt keyslot's
//! digest, and serve every data segment with its own cipher and key (or linear) as one device
//! (`LUKS2_activate_multi`).
//!
//! A hotzone the reencryption was rewriting when it stopped (a segment flagged
//! `in-reencryption`) is recovered from its resilience data the way
//! `reencrypt_recover_segment` does it: per block from the checksums of the old ciphertext,
//! from the journal copy, or from the data's old place (datashift). A read-only open recovers
//! it in memory and writes nothing. A read-write open writes the recovered hotzone with the
//! new key, as cryptsetup does, when the metadata may stay as it is (checksum resilience:
//! recovering again later finds every block already new and leaves it); with a journal or a
//! datashift the metadata must move past the hotzone before anything may be written, which
//! is the reencryption engine's job, so that open is refused with what to run.

use super::activate::{self, ActivateOptions, DataSegment};
use super::header::Luks2Header;
use super::json::Segment;
use super::keyslot;
use super::reencrypt::state::{Direction, Mode, ReencryptState, Resilience, Status};
use super::reencrypt::verify;
use crate::block::Window;
use crate::block::{check_range, BlockDevice, BlockError};
use crate::crypt::luks::af::message_digest;
use crate::crypt::luks::{LuksError, VolumeKey};
use crate::crypt::target::SegmentMap;
use std::collections::BTreeMap;
use std::sync::Arc;
use zeroize::Zeroizing;

/// The served device of a volume in reencryption, and what `status` tells of it.
pub struct ReencryptActivation {
    /// The segment map.
    pub device: Arc<dyn BlockDevice>,
    /// The keyslot whose passphrase opened the keys.
    pub keyslot: u32,
    /// Status details: mode, direction, resilience, segments.
    pub details: serde_json::Value,
}

/// The reencryption state of a header, refusing one cryptsetup could not open either.
pub fn state(h: &Luks2Header) -> Result<Option<ReencryptState>, LuksError> {
    ReencryptState::read(&h.metadata)
}

/// Unlock the key of every digest the reencryption needs with `pass` (from `slot` only when
/// given), as `LUKS2_keyslot_open_all_segments` does; the keyslot that opened the last one.
pub fn unlock_all(
    hdr_dev: &dyn BlockDevice,
    h: &Luks2Header,
    st: &ReencryptState,
    pass: &[u8],
    slot: Option<u32>,
) -> Result<(u32, BTreeMap<u32, VolumeKey>), LuksError> {
    let mut keys = BTreeMap::new();
    let mut opened = None;
    for d in st.digests() {
        let (s, k) = keyslot::unlock(hdr_dev, h, pass, slot, keyslot::Segment::Digest(d))?;
        keys.insert(d, k);
        opened = Some(s);
    }
    let slot =
        opened.ok_or_else(|| LuksError::Invalid("Reencryption metadata is invalid.".into()))?;
    Ok((slot, keys))
}

/// One segment's parameters as a crypt or linear view of `lower` from byte `offset`, `len`
/// bytes, IVs from `iv` (512-byte units); `key` for crypt segments.
pub(crate) fn segment_view(
    seg: &Segment,
    lower: Arc<dyn BlockDevice>,
    offset: u64,
    len: u64,
    iv: u64,
    key: Option<&VolumeKey>,
    opts: &ActivateOptions,
) -> Result<Arc<dyn BlockDevice>, LuksError> {
    match seg.kind.as_str() {
        "linear" => Window::new(lower, offset, len)
            .map(|w| Arc::new(w) as Arc<dyn BlockDevice>)
            .ok_or_else(|| {
                LuksError::Invalid(format!(
                    "linear segment {offset}+{len} is beyond the end of the device"
                ))
            }),
        "crypt" => {
            let key = key.ok_or_else(|| {
                LuksError::Invalid(
                    "Reencryption metadata is invalid (no key for a crypt segment).".into(),
                )
            })?;
            let ds = DataSegment {
                cipher: seg.encryption.clone(),
                offset,
                size: len,
                sector_size: seg.sector_size,
                iv_tweak: iv,
                allow_discards: false,
                integrity: None,
            };
            if seg.integrity_type().is_some() {
                return Err(LuksError::Unsupported(
                    "reencryption of a segment with integrity".into(),
                ));
            }
            Ok(Arc::new(activate::crypt_device(&ds, lower, key, opts)?))
        }
        other => Err(LuksError::Unsupported(format!(
            "data segment of type {other:?}"
        ))),
    }
}

/// The hotzone's plaintext, served from memory on a read-only open (wiped when dropped).
struct PlainZone {
    name: String,
    data: Zeroizing<Vec<u8>>,
}

impl BlockDevice for PlainZone {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> crate::block::Result<()> {
        check_range(&self.name, offset, buf.len(), self.size())?;
        buf.copy_from_slice(&self.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, _: &[u8], _: u64) -> crate::block::Result<()> {
        Err(BlockError::ReadOnly {
            device: self.name.clone(),
        })
    }
    fn flush(&self) -> crate::block::Result<()> {
        Ok(())
    }
}

fn io(e: impl std::fmt::Display) -> LuksError {
    LuksError::Invalid(format!("LUKS2 reencryption recovery failed: {e}"))
}

/// What recovery needs to know of the hotzone.
struct Hotzone<'a> {
    /// Its segment.
    seg: &'a Segment,
    /// Bytes.
    len: u64,
    /// Offset relative to the new data offset (cryptsetup's `rh->offset`).
    rel: u64,
    /// IV of its first sector for both ciphers (`crash_iv_offset`).
    iv: u64,
}

/// The old or new view of `(at, len, iv)`: `[at, at + len)` of `lower`, IVs from `iv`; old
/// parameters from `backup-previous`, new ones from `backup-final`.
fn old_new(
    st: &ReencryptState,
    keys: &BTreeMap<u32, VolumeKey>,
    lower: &Arc<dyn BlockDevice>,
    (at, len, iv): (u64, u64, u64),
    new: bool,
    opts: &ActivateOptions,
) -> Result<Arc<dyn BlockDevice>, LuksError> {
    let (seg, digest) = if new {
        (&st.fin, st.digest_new)
    } else {
        (&st.previous, st.digest_old)
    };
    let key = digest.and_then(|d| keys.get(&d));
    segment_view(seg, lower.clone(), at, len, iv, key, opts)
}

/// The plaintext of the interrupted hotzone, rebuilt from the resilience data
/// (`reencrypt_recover_segment`).
fn recover(
    hdr_dev: &Arc<dyn BlockDevice>,
    data: &Arc<dyn BlockDevice>,
    st: &ReencryptState,
    keys: &BTreeMap<u32, VolumeKey>,
    hz: &Hotzone,
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let ks = &st.keyslot;
    let opts = ActivateOptions {
        name: "reencrypt-recovery".into(),
        read_only: true,
        allow_discards: false,
    };
    let len = usize::try_from(hz.len).map_err(io)?;
    let mut plain = Zeroizing::new(vec![0u8; len]);
    // The moved first segment is protected by the secondary resilience (datashift-checksum,
    // datashift-journal); everything else by the primary one.
    let moved_zone = hz.rel == 0 && st.moved.is_some();
    let r = match (&ks.resilience, moved_zone) {
        (Resilience::DatashiftChecksum { hash, sector_size }, true) => Resilience::Checksum {
            hash: hash.clone(),
            sector_size: *sector_size,
        },
        (Resilience::DatashiftJournal, true) => Resilience::Journal,
        (Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal, false) => {
            Resilience::Datashift
        }
        (r, _) => r.clone(),
    };
    match r {
        Resilience::Checksum { hash, sector_size } => {
            let hsh = message_digest(&hash)?;
            let (bs, hs) = (sector_size as usize, hsh.size());
            if !len.is_multiple_of(bs) {
                return Err(io("hotzone is not a whole number of checksum blocks"));
            }
            let count = len / bs;
            if (count * hs) as u64 > ks.area_size {
                return Err(io("checksums do not fit the resilience area"));
            }
            let mut sums = vec![0u8; count * hs];
            hdr_dev.read_at(&mut sums, ks.area_offset)?;
            let raw: Arc<dyn BlockDevice> = Arc::new(
                Window::new(data.clone(), hz.seg.offset, hz.len)
                    .ok_or_else(|| io("hotzone beyond the device"))?,
            );
            let old = old_new(st, keys, data, (hz.seg.offset, hz.len, hz.iv), false, &opts)?;
            let new = old_new(st, keys, data, (hz.seg.offset, hz.len, hz.iv), true, &opts)?;
            let mut block = vec![0u8; bs];
            let mut sum = vec![0u8; hs];
            for s in 0..count {
                let at = (s * bs) as u64;
                raw.read_at(&mut block, at)?;
                hsh.digest_into(&[&block], &mut sum)?;
                // A block whose ciphertext still hashes as the old one was not rewritten yet.
                let from = if sum[..] == sums[s * hs..(s + 1) * hs] {
                    &old
                } else {
                    &new
                };
                from.read_at(&mut plain[s * bs..(s + 1) * bs], at)?;
            }
        }
        Resilience::Journal => {
            if hz.len > ks.area_size {
                return Err(io("hotzone larger than the journal"));
            }
            let old = old_new(
                st,
                keys,
                hdr_dev,
                (ks.area_offset, hz.len, hz.iv),
                false,
                &opts,
            )?;
            old.read_at(&mut plain, 0)?;
        }
        Resilience::Datashift => {
            let (at, iv) = if st.hot == Some(0) && st.moved.is_some() {
                (st.moved.as_ref().map_or(0, |m| m.offset), 0)
            } else {
                let base = st.fin.offset + hz.rel;
                let at = match ks.direction {
                    Direction::Forward => base.checked_add(ks.shift),
                    Direction::Backward => base.checked_sub(ks.shift),
                };
                (at.ok_or_else(|| io("shifted hotzone out of range"))?, hz.iv)
            };
            let old = old_new(st, keys, data, (at, hz.len, iv), false, &opts)?;
            old.read_at(&mut plain, 0)?;
        }
        Resilience::None => {
            return Err(LuksError::Invalid(
                "LUKS2 reencryption recovery failed.".into(),
            ))
        }
        Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal => {
            unreachable!("mapped to their primary or secondary resilience above")
        }
    }
    Ok(plain)
}

/// Serve the volume in reencryption: `hdr_dev` holds the header `h`, `data` is the whole data
/// device. Keys come from `pass` (keyslot `slot` only when given).
pub fn activate(
    hdr_dev: Arc<dyn BlockDevice>,
    h: &Luks2Header,
    data: Arc<dyn BlockDevice>,
    pass: &[u8],
    slot: Option<u32>,
    opts: &ActivateOptions,
) -> Result<ReencryptActivation, LuksError> {
    let m = &h.metadata;
    let st = state(h)?.ok_or_else(|| LuksError::Invalid("not in reencryption".into()))?;
    if st.version < 2 {
        // cryptsetup asks for `reencrypt --repair` on these (CRYPT_REENCRYPT_REPAIR_NEEDED).
        return Err(LuksError::Invalid(
            "Reencryption metadata is invalid.".into(),
        ));
    }
    let (keyslot, keys) = unlock_all(&*hdr_dev, h, &st, pass, slot)?;
    let by_digest = keys.iter().map(|(&d, k)| (d, &k[..])).collect();
    verify::check(m, &st, &by_digest)?;
    let data_offset = st.served_offset();
    let real = data.size();
    if real <= data_offset {
        return Err(LuksError::Invalid(format!(
            "Device {} is too small.",
            data.name()
        )));
    }
    let device_size = (real - data_offset) / 512 * 512;
    let extents = st.extents(device_size)?;
    let mut parts: Vec<(u64, u64, Arc<dyn BlockDevice>)> = Vec::new();
    for (i, (seg, &(start, len))) in st.segments.iter().zip(&extents).enumerate() {
        if st.status == Status::Crash && st.hot == Some(i) {
            let hz = Hotzone {
                seg,
                len,
                rel: seg
                    .offset
                    .checked_sub(st.fin.offset)
                    .ok_or_else(|| io("hotzone before the data offset"))?,
                iv: 0,
            };
            let hz = Hotzone {
                iv: if st.keyslot.mode == Mode::Decrypt {
                    hz.rel / 512
                } else {
                    seg.iv_tweak
                },
                ..hz
            };
            let plain = recover(&hdr_dev, &data, &st, &keys, &hz)?;
            let part: Arc<dyn BlockDevice> = if opts.read_only {
                Arc::new(PlainZone {
                    name: format!("{}-hotzone", opts.name),
                    data: plain,
                })
            } else {
                if !matches!(st.keyslot.resilience, Resilience::Checksum { .. }) {
                    return Err(LuksError::Invalid(format!(
                        "{}: a reencryption hotzone was interrupted (resilience {}); recovering it read-write needs the reencryption to move on first: run `cryptsetup reencrypt --resume-only` on it, or open it --readonly",
                        data.name(),
                        st.keyslot.area_type
                    )));
                }
                let new = old_new(&st, &keys, &data, (seg.offset, len, hz.iv), true, opts)?;
                new.write_at(&plain, 0)?;
                new.flush()?;
                new
            };
            parts.push((start, len, part));
            continue;
        }
        let key = m.segment_digest(i as u32).and_then(|(d, _)| keys.get(&d));
        let view = segment_view(seg, data.clone(), seg.offset, len, seg.iv_tweak, key, opts)?;
        parts.push((start, len, view));
    }
    let map = SegmentMap::new(&opts.name, parts).map_err(LuksError::Invalid)?;
    let details = serde_json::json!({
        "reencryption": {
            "status": match st.status { Status::Crash => "crash", _ => "clean" },
            "mode": format!("{:?}", st.keyslot.mode).to_lowercase(),
            "direction": format!("{:?}", st.keyslot.direction).to_lowercase(),
            "resilience": st.keyslot.area_type,
            "segments": st.segments.iter().zip(&extents).map(|(s, (start, len))| serde_json::json!({
                "type": s.kind, "start": start, "length": len, "offset": s.offset,
                "cipher": (s.kind == "crypt").then(|| s.encryption.clone()),
            })).collect::<Vec<_>>(),
        }
    });
    Ok(ReencryptActivation {
        device: Arc::new(map),
        keyslot,
        details,
    })
}
