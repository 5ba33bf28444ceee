//! The `reencrypt` keyslot as cryptsetup allocates it (`reenc_keyslot_alloc`): the largest
//! free gap of the keyslots area holds the hotzone's protection, priority "ignore", key size 1.

use super::state::{Direction, Mode, Resilience};
use crate::crypt::luks::LuksError;
use crate::crypt::luks2::header::Luks2Header;
use crate::crypt::luks2::json::{Area, Keyslot};
use serde_json::{json, Value};

/// The largest free range of the keyslots area (`LUKS2_find_area_max_gap`).
pub fn max_gap(h: &Luks2Header) -> Option<(u64, u64)> {
    let mut used: Vec<(u64, u64)> = h
        .metadata
        .keyslots
        .values()
        .filter(|k| k.area.offset > 0)
        .map(|k| (k.area.offset, k.area.size))
        .collect();
    used.sort_unstable();
    let end = h.metadata_end();
    used.push((end, 1));
    let (mut best, mut at) = ((0, 0), 2 * h.hdr_size);
    for (off, len) in used {
        if at < off && off - at > best.1 {
            best = (at, off - at);
        }
        at = off + len;
    }
    (best.1 > 0).then_some(best)
}

/// The reencrypt keyslot for `mode` walking `direction`, protecting hotzones with
/// `resilience` (the data moving by `shift` bytes in the datashift modes), its area at `area`.
pub fn keyslot(
    mode: Mode,
    direction: Direction,
    resilience: &Resilience,
    area: (u64, u64),
    shift: u64,
) -> Keyslot {
    let mut a = json!({
        "offset": area.0.to_string(),
        "size": area.1.to_string(),
        "type": resilience.word(),
    });
    if let Resilience::Checksum { hash, sector_size }
    | Resilience::DatashiftChecksum { hash, sector_size } = resilience
    {
        a["hash"] = Value::from(hash.clone());
        a["sector_size"] = Value::from(*sector_size);
    }
    if matches!(
        resilience,
        Resilience::Datashift | Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal
    ) {
        a["shift_size"] = Value::from(shift.to_string());
    }
    let raw = json!({
        "area": a,
        "type": "reencrypt",
        "key_size": 1,
        "mode": mode.word(),
        "direction": direction.word(),
        "priority": 0,
    });
    Keyslot {
        kind: "reencrypt".into(),
        key_size: 1,
        priority: Some(0),
        area: Area {
            kind: resilience.word().into(),
            offset: area.0,
            size: area.1,
            encryption: String::new(),
            key_size: 0,
        },
        af: None,
        kdf: None,
        raw: raw.as_object().cloned().unwrap_or_default(),
        problem: None,
    }
}

/// The hotzone length cryptsetup picks (`reencrypt_length`): what the protection area can
/// cover, at most 1 GiB and a quarter of the memory, at most `max` when given, a multiple of
/// `alignment`.
pub fn hotzone_length(
    resilience: &Resilience,
    area_len: u64,
    max: Option<u64>,
    alignment: u64,
) -> Result<u64, LuksError> {
    let mut len = match resilience {
        Resilience::None => max.unwrap_or(super::DEFAULT_NONE_HOTZONE),
        Resilience::Checksum { hash, sector_size } => {
            let size = crate::crypt::luks::af::message_digest(hash)?.size() as u64;
            area_len / size * u64::from(*sector_size)
        }
        Resilience::Journal => area_len,
        other => {
            return Err(LuksError::Unsupported(format!(
                "a hotzone protected by {} outside a data shift",
                other.word()
            )))
        }
    };
    len = len.min(super::MAX_HOTZONE);
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        len = len.min(pages as u64 * page as u64 / 4);
    }
    if let Some(m) = max {
        len = len.min(m);
    }
    len -= len % alignment;
    if len < 512 {
        return Err(LuksError::Invalid(format!(
            "the reencryption hotzone would be {len} bytes (alignment {alignment})"
        )));
    }
    Ok(len)
}
