//! `cryptsetup convert`: LUKS1 <-> LUKS2 in place, with cryptsetup 2.6's layout and refusals
//! (`lib/luks2/luks2_luks1_convert.c`).
//!
//! LUKS1 keeps its key material from 4 KiB on; LUKS2 keeps two 16 KiB header copies first, so
//! every keyslot area moves by 28 KiB (up when converting to LUKS2, down when converting back)
//! and the keyslot descriptions are translated. The volume key is never needed: keyslots,
//! digest and salts are carried over as they are. Like cryptsetup, the move and the header
//! write are not atomic: the moved areas overlap the old ones, so a crash between them leaves
//! a header that no longer matches its key material (take a header backup first).

use super::LuksError;
use crate::block::BlockDevice;
use crate::crypt::luks::kdf::Kdf;
use crate::crypt::luks::{area, STRIPES};
use crate::crypt::luks1::{Luks1Header, Luks1Keyslot, NUM_KEYSLOTS};
use crate::crypt::luks2::json::Metadata;
use crate::crypt::luks2::Luks2Header;
use base64::Engine;
use serde_json::json;

/// Size of one LUKS2 header copy a conversion writes.
const HDR_16K: u64 = 16384;
/// Where LUKS1 key material starts.
const LUKS1_KEYSLOTS: u64 = 4096;
/// How far keyslot areas move: LUKS2's two header copies minus LUKS1's 4 KiB header area.
const SHIFT: u64 = 2 * HDR_16K - LUKS1_KEYSLOTS;
const SECTOR: u64 = 512;

/// The keyslot areas to move and by how much: `len` bytes from `from` to `to`.
pub(super) struct Move {
    /// Source offset.
    pub from: u64,
    /// Destination offset.
    pub to: u64,
    /// Bytes.
    pub len: u64,
}

/// Bytes of one keyslot's key material for a key of `key_bytes` (AF_split_sectors).
fn material(key_bytes: u64) -> u64 {
    (key_bytes * STRIPES as u64).div_ceil(SECTOR) * SECTOR
}

fn invalid(m: impl Into<String>) -> LuksError {
    LuksError::Invalid(m.into())
}

/// "aes-xts-plain64" -> ("aes", "xts-plain64"), as `crypt_parse_name_and_mode` splits it (a
/// cipher without a mode gets "cbc-plain").
fn name_and_mode(cipher: &str) -> (String, String) {
    match cipher.split_once('-') {
        Some((c, m)) => (c.to_string(), m.to_string()),
        None => (cipher.to_string(), "cbc-plain".to_string()),
    }
}

/// Plan LUKS1 -> LUKS2 for `h1` on the header device `dev` (`regular`: a file, which may be
/// extended; a payload offset of 0 means a detached header: the whole device is header). Returns
/// the new header and the move; `grow_to` is set when a detached header file must first be
/// extended (cryptsetup's `device_fallocate`).
pub(super) fn plan_to_luks2(
    h1: &Luks1Header,
    dev: &dyn BlockDevice,
    regular: bool,
) -> Result<(Luks2Header, Move, Option<u64>), LuksError> {
    let dev_size = dev.size();
    let per = material(h1.key_bytes as u64);
    let offsets = h1.keyslots.iter().map(|k| k.key_material_offset as u64);
    let (first, last) = offsets.fold((u64::MAX, 0), |(lo, hi), o| (lo.min(o), hi.max(o)));
    let luks1_size = ((last * SECTOR + per).div_ceil(LUKS1_KEYSLOTS)) * LUKS1_KEYSLOTS;
    if first * SECTOR != LUKS1_KEYSLOTS {
        return Err(invalid(format!(
            "Unsupported keyslots material offset: {first} (sectors; cryptsetup converts only headers whose key material starts at sector 8)."
        )));
    }
    let cipher = if h1.cipher_mode.is_empty() {
        h1.cipher_name.clone()
    } else {
        h1.cipher()
    };
    if area::check(&cipher, h1.key_bytes as usize).is_err() {
        return Err(invalid(format!(
            "Unable to use cipher specification {}-{} for LUKS2.",
            h1.cipher_name, h1.cipher_mode
        )));
    }
    let mut magic = [0u8; 8];
    if dev_size >= luks1_size + 8 {
        dev.read_at(&mut magic, luks1_size)?;
        if &magic == b"LUKSMETA" {
            return Err(invalid(
                "Unable to convert header with LUKSMETA additional metadata.",
            ));
        }
    }
    let mut max_size = match h1.payload_offset as u64 * SECTOR {
        0 => dev_size,
        n => n,
    };
    let required = luks1_size + SHIFT;
    let mut grow_to = None;
    if max_size < required {
        // cryptsetup extends a regular header file (a detached header) and gives up on
        // anything else; a file that is already large enough "extends" trivially, and the
        // metadata check below then refuses keyslots that would overlap the data.
        if regular {
            if dev_size < required {
                grow_to = Some(required);
            }
            max_size = required;
        } else {
            return Err(invalid("Unable to move keyslot area. Not enough space."));
        }
    }
    let keyslots_size = (max_size - 2 * HDR_16K) / 4096 * 4096;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut keyslots = serde_json::Map::new();
    let mut active = Vec::new();
    for (i, k) in h1.keyslots.iter().enumerate() {
        if !k.active {
            continue;
        }
        active.push(json!(i.to_string()));
        keyslots.insert(
            i.to_string(),
            json!({
                "type": "luks2",
                "key_size": h1.key_bytes,
                "kdf": {"type": "pbkdf2", "hash": h1.hash_spec, "iterations": k.iterations, "salt": b64(&k.salt)},
                "af": {"type": "luks1", "hash": h1.hash_spec, "stripes": STRIPES},
                "area": {
                    "type": "raw",
                    "encryption": cipher,
                    "key_size": h1.key_bytes,
                    "offset": (k.key_material_offset as u64 * SECTOR + SHIFT).to_string(),
                    "size": per.div_ceil(4096) * 4096,
                },
            }),
        );
        // cryptsetup writes the area size as a string like every 64-bit value.
        let size = per.div_ceil(4096) * 4096;
        keyslots[&i.to_string()]["area"]["size"] = json!(size.to_string());
    }
    let doc = json!({
        "keyslots": keyslots,
        "tokens": {},
        "segments": {"0": {
            "type": "crypt",
            "offset": (h1.payload_offset as u64 * SECTOR).to_string(),
            "iv_tweak": "0",
            "size": "dynamic",
            "encryption": cipher,
            "sector_size": 512,
        }},
        "digests": {"0": {
            "type": "pbkdf2",
            "keyslots": active,
            "segments": ["0"],
            "hash": h1.hash_spec,
            "salt": b64(&h1.mk_digest_salt),
            "digest": b64(&h1.mk_digest),
            "iterations": h1.mk_digest_iterations,
        }},
        "config": {
            "json_size": (HDR_16K - 4096).to_string(),
            "keyslots_size": keyslots_size.to_string(),
        },
    });
    let metadata = Metadata::parse(doc.to_string().as_bytes(), HDR_16K).map_err(|e| {
        invalid(format!(
            "Cannot convert to LUKS2 format - invalid metadata. ({e})"
        ))
    })?;
    let buf_size = luks1_size - LUKS1_KEYSLOTS;
    if buf_size > keyslots_size {
        return Err(invalid(
            "Unable to move keyslot area. LUKS2 keyslots area too small.",
        ));
    }
    let header = Luks2Header {
        hdr_size: HDR_16K,
        seqid: 1,
        label: String::new(),
        subsystem: String::new(),
        uuid: h1.uuid.chars().take(36).collect(),
        checksum_alg: "sha256".into(),
        metadata,
        raw: None,
    };
    let mv = Move {
        from: LUKS1_KEYSLOTS,
        to: 2 * HDR_16K,
        len: buf_size,
    };
    Ok((header, mv, grow_to))
}

/// Plan LUKS2 -> LUKS1 for `h2`, refused where cryptsetup refuses (with its words): a data
/// sector size other than 512, a digest other than one PBKDF2 digest, a wrapped-key cipher,
/// more than one segment, tokens, keyslots above 7, and keyslots LUKS1 cannot describe
/// (another KDF or hash, another AF, another area cipher or size).
pub(super) fn plan_to_luks1(h2: &Luks2Header) -> Result<(Luks1Header, Move), LuksError> {
    let m = &h2.metadata;
    let digest = m
        .digests
        .get(&0)
        .ok_or_else(|| invalid("Cannot convert to LUKS1 format - there is no digest 0."))?;
    let seg = m
        .segments
        .get(&0)
        .ok_or_else(|| invalid("Cannot convert to LUKS1 format - there is no segment 0."))?;
    if seg.sector_size != 512 {
        return Err(invalid("Cannot convert to LUKS1 format - default segment encryption sector size is not 512 bytes."));
    }
    if digest.kind != "pbkdf2" || m.digests.len() != 1 {
        return Err(invalid(
            "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible.",
        ));
    }
    let hash = digest.hash.clone();
    let (cipher, _) = name_and_mode(&seg.encryption);
    if cipher.starts_with("paes") {
        return Err(invalid(format!(
            "Cannot convert to LUKS1 format - device uses wrapped key cipher {cipher}."
        )));
    }
    if m.segments.len() != 1 {
        return Err(invalid(
            "Cannot convert to LUKS1 format - device uses more segments.",
        ));
    }
    if !m.tokens.is_empty() {
        return Err(invalid(format!(
            "Cannot convert to LUKS1 format - LUKS2 header contains {} token(s).",
            m.tokens.len()
        )));
    }
    let key_size = digest
        .keyslots
        .iter()
        .find_map(|k| m.keyslots.get(k))
        .map(|k| k.key_size)
        .ok_or_else(|| {
            invalid("Cannot convert to LUKS1 format - no keyslot holds the volume key.")
        })?;
    let area_size = material(key_size as u64).div_ceil(4096) * 4096;
    for (&i, k) in &m.keyslots {
        if i as usize >= NUM_KEYSLOTS {
            return Err(invalid(format!(
                "Cannot convert to LUKS1 format - slot {i} (over maximum slots) is still active."
            )));
        }
        let pbkdf2_hash = matches!(&k.kdf, Some(Kdf::Pbkdf2 { hash: h, .. }) if *h == hash);
        let af =
            k.af.as_ref()
                .is_some_and(|a| a.stripes == STRIPES && a.hash == hash);
        let compatible = k.kind == "luks2"
            && k.problem.is_none()
            && pbkdf2_hash
            && af
            && k.area.encryption == seg.encryption
            && k.area.key_size == key_size
            && k.area.size == area_size;
        if !compatible {
            return Err(invalid(format!(
                "Cannot convert to LUKS1 format - keyslot {i} is not LUKS1 compatible."
            )));
        }
    }
    // Free LUKS1 keyslots get the first free gaps of the keyslots area, each taken in turn
    // (cryptsetup's placeholder keyslots), so that no two share key material.
    let mut used: Vec<(u64, u64)> = m
        .keyslots
        .values()
        .map(|k| (k.area.offset, k.area.size))
        .collect();
    let (min, max) = (2 * h2.hdr_size, h2.metadata_end());
    let mut keyslots: Vec<Luks1Keyslot> = Vec::with_capacity(NUM_KEYSLOTS);
    let mut last = None;
    for i in 0..NUM_KEYSLOTS as u32 {
        let ks = m.keyslots.get(&i);
        let offset = match ks {
            Some(k) => k.area.offset,
            None => {
                let at = find_gap(&used, min, max, area_size).ok_or_else(|| {
                    invalid("Cannot convert to LUKS1 format - no room for a keyslot area.")
                })?;
                used.push((at, area_size));
                at
            }
        };
        let sector = offset / SECTOR;
        let material_offset = u32::try_from(sector)
            .ok()
            .and_then(|s| s.checked_sub((SHIFT / SECTOR) as u32))
            .ok_or_else(|| {
                invalid(format!(
                    "keyslot {i}: area offset {offset} cannot be a LUKS1 key material offset"
                ))
            })?;
        let mut slot = Luks1Keyslot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            key_material_offset: material_offset,
            stripes: STRIPES,
        };
        if let Some(k) = ks {
            slot.active = true;
            last = Some(k);
            if let Some(Kdf::Pbkdf2 {
                iterations, salt, ..
            }) = &k.kdf
            {
                slot.iterations = *iterations;
                if salt.len() == 32 {
                    slot.salt.copy_from_slice(salt);
                }
            }
        }
        keyslots.push(slot);
    }
    let last =
        last.ok_or_else(|| invalid("Cannot convert to LUKS1 format - no active keyslot."))?;
    let (cipher_name, cipher_mode) = name_and_mode(&last.area.encryption);
    let hash_spec = match &last.kdf {
        Some(Kdf::Pbkdf2 { hash, .. }) => hash.clone(),
        _ => hash.clone(),
    };
    if digest.digest.len() < 20 || digest.salt.len() != 32 {
        return Err(invalid(
            "Cannot convert to LUKS1 format - the digest does not fit LUKS1.",
        ));
    }
    let payload = u32::try_from(seg.offset / SECTOR)
        .map_err(|_| invalid("Cannot convert to LUKS1 format - the data offset is too large."))?;
    let mut mk_digest = [0u8; 20];
    mk_digest.copy_from_slice(&digest.digest[..20]);
    let mut mk_digest_salt = [0u8; 32];
    mk_digest_salt.copy_from_slice(&digest.salt);
    let h1 = Luks1Header {
        cipher_name,
        cipher_mode,
        hash_spec,
        payload_offset: payload,
        key_bytes: key_size,
        mk_digest,
        mk_digest_salt,
        mk_digest_iterations: digest.iterations,
        uuid: h2.uuid.chars().take(36).collect(),
        keyslots: keyslots
            .try_into()
            .map_err(|_| invalid("eight keyslots expected"))?,
        raw: Vec::new(),
    };
    let mv = Move {
        from: 2 * HDR_16K,
        to: LUKS1_KEYSLOTS,
        len: m.config.keyslots_size,
    };
    Ok((h1, mv))
}

/// `LUKS2_find_area_gap`: the first range of `len` bytes from `min` between the used areas.
fn find_gap(used: &[(u64, u64)], min: u64, max: u64, len: u64) -> Option<u64> {
    let mut sorted: Vec<(u64, u64)> = used
        .iter()
        .copied()
        .filter(|&(o, l)| o != 0 && l != 0)
        .collect();
    sorted.sort();
    let mut offset = min;
    for (o, l) in sorted {
        if offset < o && offset + len <= o {
            break;
        }
        offset = o + l;
    }
    (offset + len <= max).then_some(offset)
}

/// Move the keyslot areas on `dev` (overlapping ranges, copied in the safe direction), then
/// flush. Both ranges must lie on the device (cryptsetup reads the new range first to make
/// sure a trimmed backup is refused).
pub(super) fn move_areas(dev: &dyn BlockDevice, mv: &Move) -> Result<(), LuksError> {
    let end = mv.from.max(mv.to).saturating_add(mv.len);
    if end > dev.size() {
        return Err(invalid(format!(
            "Unable to move keyslot area. ({} is {} bytes, {end} needed)",
            dev.name(),
            dev.size()
        )));
    }
    const CHUNK: u64 = 1 << 20;
    let mut buf = crate::crypt::secret::SecretBytes::zeroed(CHUNK as usize);
    let chunks = mv.len.div_ceil(CHUNK);
    for n in 0..chunks {
        // Moving up, the last chunk goes first, so nothing is overwritten before it is read.
        let i = if mv.to > mv.from { chunks - 1 - n } else { n };
        let at = i * CHUNK;
        let len = (mv.len - at).min(CHUNK) as usize;
        dev.read_at(&mut buf[..len], mv.from + at)?;
        dev.write_at(&buf[..len], mv.to + at)?;
    }
    dev.flush()?;
    Ok(())
}
