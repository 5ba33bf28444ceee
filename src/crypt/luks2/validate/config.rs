//! The config section (`hdr_validate_config`) and its requirements
//! (`hdr_validate_requirements`): header and keyslots-area sizes LUKS2 allows, the keyslots
//! area ending before the data, flags and mandatory requirements as arrays of strings.

use super::segments::minimal_offset;
use super::{contains, contains_string, metadata_size, section, show, str_to_u64, Type, R};
use crate::crypt::luks2::header::HEADER_SIZES;
use crate::crypt::luks2::jsonc::Value;

/// Largest keyslots area cryptsetup accepts (128 MiB).
pub const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;

/// Whether `flag` names an online reencryption ("online-reencrypt" or "online-reencrypt-vN").
fn reencrypt_candidate(flag: &[u8]) -> bool {
    if flag == b"online-reencrypt" {
        return true;
    }
    match flag.strip_prefix(b"online-reencrypt-v") {
        Some(v) => !v.is_empty() && v.iter().all(u8::is_ascii_digit),
        None => false,
    }
}

/// `LUKS2_reencrypt_requirement_candidate`.
pub(super) fn has_reencrypt_candidate(root: &Value) -> bool {
    root.get("config")
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .filter_map(Value::get_string)
                .any(|f| reencrypt_candidate(&f))
        })
}

fn all_strings(v: &Value, what: &str) -> R {
    if v.as_array()
        .unwrap_or_default()
        .iter()
        .any(|x| x.as_bytes().is_none())
    {
        return Err(format!("{what} holds a value that is not a string"));
    }
    Ok(())
}

pub(super) fn requirements(root: &Value) -> R {
    let config = contains(root, "metadata", "config", Type::Object)?;
    let mut online = 0;
    if config.get("requirements").is_some() {
        let r = contains(config, "config", "requirements", Type::Object)?;
        if r.get("mandatory").is_some() {
            let m = contains(r, "config.requirements", "mandatory", Type::Array)?;
            all_strings(m, "config.requirements.mandatory")?;
            online = m
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(Value::get_string)
                .filter(|f| reencrypt_candidate(f))
                .count();
        }
    }
    if online > 1 {
        return Err("config.requirements.mandatory: more than one online-reencrypt flag".into());
    }
    Ok(())
}

pub(super) fn validate(root: &Value) -> R {
    section(root, "config")?;
    let config = root.get("config").expect("checked above");
    let js = contains_string(config, "config", "json_size")?;
    let json_size = str_to_u64(js)
        .ok_or_else(|| format!("config.json_size \"{}\" is not a number", show(js)))?;
    let ks = contains_string(config, "config", "keyslots_size")?;
    let keyslots_size = str_to_u64(ks)
        .ok_or_else(|| format!("config.keyslots_size \"{}\" is not a number", show(ks)))?;
    let meta = json_size.wrapping_add(4096);
    debug_assert_eq!(meta, metadata_size(root));
    if !HEADER_SIZES.contains(&meta) {
        return Err(format!(
            "config.json_size {json_size} makes a header size LUKS2 does not allow"
        ));
    }
    if !keyslots_size.is_multiple_of(4096) || keyslots_size > MAX_KEYSLOTS_SIZE {
        return Err(format!(
            "config.keyslots_size {keyslots_size} is not a multiple of 4096 up to 128 MiB"
        ));
    }
    let data = minimal_offset(root.get("segments"));
    if data != 0 && (data < keyslots_size || data - keyslots_size < 2 * meta) {
        return Err(format!(
            "config.keyslots_size {keyslots_size} reaches into the data at offset {data}"
        ));
    }
    if config.get("flags").is_some() {
        let f = contains(config, "config", "flags", Type::Array)?;
        all_strings(f, "config.flags")?;
    }
    Ok(())
}
