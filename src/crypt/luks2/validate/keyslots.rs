//! The keyslots section: the generic rules (`hdr_validate_keyslots`), the areas they occupy
//! (`hdr_validate_areas`), and the rules of each keyslot type cryptsetup knows
//! (`LUKS2_keyslots_validate`: "luks2" and "reencrypt"). Keyslots of other types are carried
//! along unchecked beyond the generic rules, as in cryptsetup.

use super::digests::count_for_keyslot;
use super::{
    atoi, contains, contains_string, get_u64, is_u32, metadata_size, numbered, reqs, requirements,
    section, show, str_to_u64, Type, R,
};
use crate::crypt::luks2::jsonc::Value;

pub(super) fn validate(root: &Value) -> R {
    let keyslots = section(root, "keyslots")?;
    for (key, ks) in keyslots.iter() {
        let what = format!("keyslot {}", show(key));
        if !numbered(key) {
            return Err(format!("keyslots: key \"{}\" is not a number", show(key)));
        }
        contains_string(ks, &what, "type")?;
        let key_size = contains(ks, &what, "key_size", Type::Int)?;
        if !is_u32(key_size) {
            return Err(format!("{what}: key_size is not a 32-bit number"));
        }
    }
    Ok(())
}

/// Where the keyslots area ends: both header copies and config.keyslots_size.
pub(super) fn areas_end(root: &Value) -> u64 {
    let ks = get_u64(root.get("config").and_then(|c| c.get("keyslots_size")));
    metadata_size(root).wrapping_mul(2).wrapping_add(ks)
}

/// `hdr_validate_areas`: every keyslot area is a numbered offset and size inside the keyslots
/// area, and no two areas overlap.
pub(super) fn areas(root: &Value) -> R {
    let Some(keyslots) = root.get("keyslots").and_then(Value::as_object) else {
        return Err("metadata: \"keyslots\" is missing".into());
    };
    if root.get("segments").is_none() {
        return Err("metadata: \"segments\" is missing".into());
    }
    let meta = metadata_size(root);
    let end = areas_end(root);
    let mut ix = Vec::with_capacity(keyslots.len());
    for (key, ks) in keyslots.iter() {
        let what = format!("keyslot {}.area", show(key));
        let area = contains(ks, &what, "area", Type::Object)?;
        contains_string(area, &what, "type")?;
        let off = contains_string(area, &what, "offset")?;
        let size = contains_string(area, &what, "size")?;
        if !numbered(off) || !numbered(size) {
            return Err(format!("{what}: offset or size is not a number"));
        }
        match (str_to_u64(off), str_to_u64(size)) {
            (Some(o), Some(s)) => ix.push((o, s, show(key))),
            _ => return Err(format!("{what}: offset or size does not fit in 64 bits")),
        }
    }
    for (i, (off, len, id)) in ix.iter().enumerate() {
        if *off < meta.wrapping_mul(2) {
            return Err(format!(
                "keyslot {id}: area offset {off} lies in the header copies"
            ));
        }
        if *len == 0 {
            return Err(format!("keyslot {id}: area size is 0"));
        }
        if *off > u64::MAX - len {
            return Err(format!("keyslot {id}: area offset + size overflows"));
        }
        if off + len > end {
            return Err(format!(
                "keyslot {id}: area {off}..{} reaches beyond the keyslots area (ends at {end})",
                off + len
            ));
        }
        for (j, (o2, l2, id2)) in ix.iter().enumerate() {
            if i == j {
                continue;
            }
            if *o2 > u64::MAX - l2 {
                return Err(format!("keyslot {id2}: area offset + size overflows"));
            }
            if off >= o2 && *off < o2 + l2 {
                return Err(format!("keyslot {id}: area overlaps keyslot {id2}"));
            }
        }
    }
    Ok(())
}

/// The rules of the "luks2" keyslot type (`luks2_keyslot_validate`).
fn luks2(ks: &Value, what: &str) -> R {
    let kdf = contains(ks, what, "kdf", Type::Object)?;
    let af = contains(ks, what, "af", Type::Object)?;
    let area = contains(ks, what, "area", Type::Object)?;
    let kw = format!("{what}.kdf");
    let n = kdf.as_object().map_or(0, |o| o.len());
    match contains_string(kdf, &kw, "type")? {
        b"pbkdf2" => {
            if n != 4 {
                return Err(format!(
                    "{kw}: pbkdf2 takes exactly type, salt, hash and iterations"
                ));
            }
            contains_string(kdf, &kw, "hash")?;
            contains(kdf, &kw, "iterations", Type::Int)?;
            contains_string(kdf, &kw, "salt")?;
        }
        b"argon2i" | b"argon2id" => {
            if n != 5 {
                return Err(format!(
                    "{kw}: argon2 takes exactly type, salt, time, memory and cpus"
                ));
            }
            for k in ["time", "memory", "cpus"] {
                contains(kdf, &kw, k, Type::Int)?;
            }
            contains_string(kdf, &kw, "salt")?;
        }
        // Other KDF names (the legacy "argon2") pass here and fail only when used.
        _ => {}
    }
    let fw = format!("{what}.af");
    if contains_string(af, &fw, "type")? != b"luks1" {
        return Err(format!("{fw}: type is not \"luks1\""));
    }
    contains_string(af, &fw, "hash")?;
    contains(af, &fw, "stripes", Type::Int)?;
    let aw = format!("{what}.area");
    if contains_string(area, &aw, "type")? != b"raw" {
        return Err(format!("{aw}: type is not \"raw\""));
    }
    contains_string(area, &aw, "encryption")?;
    contains(area, &aw, "key_size", Type::Int)?;
    contains_string(area, &aw, "offset")?;
    contains_string(area, &aw, "size")?;
    Ok(())
}

/// The rules of the "reencrypt" keyslot type (`reenc_keyslot_validate`).
fn reencrypt(ks: &Value, what: &str) -> R {
    let Some(area) = ks.get("area") else {
        return Err(format!("{what}: \"area\" is missing"));
    };
    let Some(area_type) = area.get("type") else {
        return Err(format!("{what}.area: \"type\" is missing"));
    };
    let key_size = contains(ks, what, "key_size", Type::Int);
    let mode = contains_string(ks, what, "mode");
    let direction = contains_string(ks, what, "direction");
    let (key_size, mode, direction) = (key_size?, mode?, direction?);
    if !is_u32(key_size) || key_size.get_int64() != 1 {
        return Err(format!("{what}: key_size of a reencrypt keyslot must be 1"));
    }
    if !matches!(mode, b"reencrypt" | b"encrypt" | b"decrypt") {
        return Err(format!("{what}: mode \"{}\" is unknown", show(mode)));
    }
    if !matches!(direction, b"forward" | b"backward") {
        return Err(format!(
            "{what}: direction \"{}\" is unknown",
            show(direction)
        ));
    }
    let aw = format!("{what}.area");
    let t = area_type
        .get_string()
        .map(|c| c.into_owned())
        .unwrap_or_default();
    match t.as_slice() {
        b"checksum" | b"datashift-checksum" => {
            contains_string(area, &aw, "hash")?;
            let s = contains(area, &aw, "sector_size", Type::Int)?;
            let n = s.get_int64();
            if !is_u32(s) || n < 512 || (n & (n - 1)) != 0 {
                return Err(format!("{aw}: sector_size is not a power of two from 512"));
            }
        }
        b"datashift" | b"datashift-journal" => {
            let shift = str_to_u64(contains_string(area, &aw, "shift_size")?).unwrap_or(0);
            if shift == 0 || !shift.is_multiple_of(512) {
                return Err(format!(
                    "{aw}: shift_size is not a positive multiple of 512"
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// `LUKS2_keyslots_validate`: each keyslot of a known type passes that type's rules, luks2
/// keyslots belong to exactly one digest, and reencrypt keyslots match the requirements.
pub(super) fn types(root: &Value) -> R {
    let reqs = requirements(root);
    let keyslots = section(root, "keyslots")?;
    let mut reencrypt_count = 0;
    for (key, ks) in keyslots.iter() {
        let what = format!("keyslot {}", show(key));
        let kind = ks
            .get("type")
            .and_then(Value::get_string)
            .map(|c| c.into_owned());
        match kind.as_deref() {
            Some(b"luks2") => {
                luks2(ks, &what)?;
                let id = (atoi(key) as u32).to_string();
                let n = count_for_keyslot(root, id.as_bytes());
                if n != 1 {
                    return Err(format!("{what}: assigned to {n} digests, not exactly 1"));
                }
            }
            Some(b"reencrypt") => {
                reencrypt(ks, &what)?;
                reencrypt_count += 1;
            }
            _ => {}
        }
    }
    if reqs & reqs::ONLINE_REENCRYPT != 0 && reencrypt_count == 0 {
        return Err(
            "keyslots: the online-reencryption requirement has no reencrypt keyslot".into(),
        );
    }
    if reencrypt_count > 0 && !super::config::has_reencrypt_candidate(root) {
        return Err("keyslots: a reencrypt keyslot without the reencryption requirement".into());
    }
    if reencrypt_count > 1 {
        return Err("keyslots: more than one reencrypt keyslot".into());
    }
    Ok(())
}
