//! The segments section (`hdr_validate_segments`): numbered ids without gaps, regular
//! segments before backup ones, sizes and offsets as sector-aligned decimal strings, crypt
//! segments complete and bound to a digest, and regular segments that do not overlap.

use super::{
    atoi, contains, contains_string, numbered, reqs, requirements, section, show, str_to_u64, Type,
    R,
};
use crate::crypt::luks2::jsonc::{c_str, Object, Value};

/// `json_segment_contains_flag` with a prefix (`backup-` marks reencryption backups).
pub(crate) fn has_flag(seg: &Value, flag: &[u8], prefix: bool) -> bool {
    seg.get("flags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::get_string)
        .any(|f| {
            if prefix {
                f.starts_with(flag)
            } else {
                &f[..] == flag
            }
        })
}

fn is_backup(seg: &Value) -> bool {
    has_flag(seg, b"backup-", true)
}

/// Segment `i` by its canonical id.
fn by_id(segments: &Object, i: i64) -> Option<&Value> {
    segments.get(&(i as u32).to_string())
}

/// `json_segment_get_offset` / `_size` (0 when absent or not a number).
fn field_u64(seg: &Value, key: &str) -> u64 {
    super::get_u64(seg.get(key))
}

/// The smallest offset of a regular segment (0 when one starts at 0, u64::MAX when none).
pub(super) fn minimal_offset(segments: Option<&Value>) -> u64 {
    let Some(segments) = segments.and_then(Value::as_object) else {
        return 0;
    };
    let mut min = u64::MAX;
    for (_, s) in segments.iter().filter(|(_, s)| !is_backup(s)) {
        let o = field_u64(s, "offset");
        if o == 0 {
            return 0;
        }
        min = min.min(o);
    }
    min
}

fn crypt_segment(seg: &Value, key: &[u8], what: &str, size: u64, digests: &Value) -> R {
    let iv = contains_string(seg, what, "iv_tweak")?;
    contains_string(seg, what, "encryption")?;
    let sector = contains(seg, what, "sector_size", Type::Int)?;
    if let Some(integrity) = seg.get("integrity") {
        contains(seg, what, "integrity", Type::Object)?;
        let iw = format!("{what}.integrity");
        for k in ["type", "journal_encryption", "journal_integrity"] {
            contains_string(integrity, &iw, k)?;
        }
    }
    if !super::is_u32(sector) {
        return Err(format!("{what}: sector_size is not a 32-bit number"));
    }
    let sector = sector.get_int64() as u64;
    if sector == 0 || !sector.is_multiple_of(512) {
        return Err(format!(
            "{what}: sector_size {sector} is not a multiple of 512"
        ));
    }
    if !numbered(iv) || str_to_u64(iv).is_none() {
        return Err(format!("{what}: iv_tweak \"{}\" is not a number", show(iv)));
    }
    if !size.is_multiple_of(sector) {
        return Err(format!(
            "{what}: size {size} is not a multiple of the sector size {sector}"
        ));
    }
    let bound = digests.as_object().is_some_and(|d| {
        d.iter().any(|(_, d)| {
            d.get("segments")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v.get_string().as_deref() == Some(key)))
        })
    });
    if !bound {
        return Err(format!("{what}: no digest is assigned to it"));
    }
    Ok(())
}

pub(super) fn validate(root: &Value) -> R {
    let segments = section(root, "segments")?;
    let count = segments.len() as i64;
    if count < 1 {
        return Err("segments: the section is empty".into());
    }
    let Some(digests) = root.get("digests") else {
        return Err("metadata: \"digests\" is missing".into());
    };
    let mut first_backup: i64 = -1;
    for (key, seg) in segments.iter() {
        let what = format!("segment {}", show(key));
        if !numbered(key) {
            return Err(format!("segments: key \"{}\" is not a number", show(key)));
        }
        let kind = contains_string(seg, &what, "type")?;
        let offset = contains_string(seg, &what, "offset")?;
        let size_s = contains_string(seg, &what, "size")?;
        if !numbered(offset) {
            return Err(format!(
                "{what}: offset \"{}\" is not a number",
                show(offset)
            ));
        }
        let offset =
            str_to_u64(offset).ok_or_else(|| format!("{what}: offset does not fit in 64 bits"))?;
        let size = if size_s == b"dynamic" {
            0
        } else {
            match numbered(size_s).then(|| str_to_u64(size_s)).flatten() {
                Some(n) if n > 0 => n,
                _ => {
                    return Err(format!(
                        "{what}: size \"{}\" is not a positive number",
                        show(size_s)
                    ))
                }
            }
        };
        if !offset.is_multiple_of(512) || !size.is_multiple_of(512) {
            return Err(format!(
                "{what}: offset {offset} or size {size} is not a multiple of 512"
            ));
        }
        if seg.get("flags").is_some() {
            let flags = contains(seg, &what, "flags", Type::Array)?;
            if flags
                .as_array()
                .unwrap_or_default()
                .iter()
                .any(|f| f.as_bytes().is_none())
            {
                return Err(format!("{what}: flags holds a value that is not a string"));
            }
        }
        let i = atoi(key) as i64;
        if is_backup(seg) {
            if first_backup < 0 || i < first_backup {
                first_backup = i;
            }
        } else if first_backup >= 0 && i >= first_backup {
            return Err(format!(
                "{what}: a regular segment after backup segment {first_backup}"
            ));
        }
        if c_str(kind) == b"crypt" {
            crypt_segment(seg, key, &what, size, digests)?;
        }
    }
    if first_backup == 0 {
        return Err("segments: no regular segment".into());
    }
    if first_backup >= count {
        return Err(format!(
            "segments: gap before backup segment {first_backup}"
        ));
    }
    let regular = if first_backup < 0 {
        count
    } else {
        first_backup
    };
    let mut intervals = Vec::with_capacity(regular as usize);
    for i in 0..regular {
        let s = by_id(segments, i)
            .ok_or_else(|| format!("segments: segment {i} is missing (a gap)"))?;
        let len = field_u64(s, "size");
        intervals.push((
            field_u64(s, "offset"),
            if len == 0 { u64::MAX } else { len },
        ));
    }
    intervals_apart(&intervals)?;
    for i in regular..count {
        by_id(segments, i).ok_or_else(|| format!("segments: segment {i} is missing (a gap)"))?;
    }
    reencrypt(root, segments, regular, count)
}

/// `validate_segment_intervals`: only the last may be dynamic (u64::MAX), none overlap.
fn intervals_apart(ix: &[(u64, u64)]) -> R {
    for (i, &(off, len)) in ix.iter().enumerate() {
        if len == u64::MAX && i != ix.len() - 1 {
            return Err(format!(
                "segment {i}: only the last segment may be \"dynamic\""
            ));
        }
        for (j, &(o2, l2)) in ix.iter().enumerate() {
            if i == j {
                continue;
            }
            if l2 != u64::MAX && o2 > u64::MAX - l2 {
                return Err(format!("segment {j}: offset + size overflows"));
            }
            if off >= o2 && (l2 == u64::MAX || off < o2 + l2) {
                return Err(format!("segment {i} overlaps segment {j}"));
            }
        }
    }
    Ok(())
}

/// `json_segment_cmp`: the same type, and for crypt segments the same sector size and cipher.
fn same_segment(a: &Value, b: &Value) -> bool {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::get_string).map(|c| c.into_owned());
    let (Some(ta), Some(tb)) = (s(a, "type"), s(b, "type")) else {
        return false;
    };
    if ta != tb {
        return false;
    }
    if ta != b"crypt" {
        return true;
    }
    let n = |v: &Value| v.get("sector_size").map_or(0, Value::get_int);
    n(a) == n(b) && s(a, "encryption") == s(b, "encryption")
}

/// `validate_reencrypt_segments`: with an online-reencryption requirement, both backup
/// segments exist and every regular segment matches one of them.
fn reencrypt(root: &Value, segments: &Object, regular: i64, count: i64) -> R {
    if requirements(root) & reqs::ONLINE_REENCRYPT == 0 {
        return Ok(());
    }
    let (mut fin, mut prev) = (None, None);
    for i in regular..count {
        let s = by_id(segments, i).ok_or("segments: a backup segment is missing")?;
        if has_flag(s, b"backup-final", false) {
            fin = Some(s);
        } else if has_flag(s, b"backup-previous", false) {
            prev = Some(s);
        }
    }
    let (Some(fin), Some(prev)) = (fin, prev) else {
        return Err("segments: a reencryption backup segment is missing".into());
    };
    for i in 0..regular {
        let s = by_id(segments, i).ok_or("segments: a segment is missing")?;
        let ok = if has_flag(s, b"in-reencryption", false) {
            same_segment(s, fin)
        } else {
            same_segment(s, fin) || same_segment(s, prev)
        };
        if !ok {
            return Err(format!(
                "segment {i}: matches neither reencryption backup segment"
            ));
        }
    }
    Ok(())
}
