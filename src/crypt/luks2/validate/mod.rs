//! Validation of LUKS2 JSON metadata with cryptsetup 2.6's rules, section by section as
//! cryptsetup's `LUKS2_hdr_validate` runs them: requirements, tokens, digests, segments,
//! keyslots, config, keyslot areas, the JSON size, then the keyslot types. A header copy that
//! fails any of them is as corrupt as one with a bad checksum.
//!
//! The rules work on the json-c view of the text ([`super::jsonc`]) because that is what they
//! were written against: a field that is present but `null`, a number where a string belongs,
//! a key such as "007" all behave here as they do in cryptsetup.

mod config;
mod digests;
mod keyslots;
mod segments;
mod tokens;

use super::jsonc::{c_str, Object, Style, Value};

type R = Result<(), String>;

/// Which of json-c's types a field must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Object,
    Array,
    String,
    Int,
}

impl Type {
    fn matches(self, v: &Value) -> bool {
        match self {
            Type::Object => matches!(v, Value::Object(_)),
            Type::Array => matches!(v, Value::Array(_)),
            Type::String => matches!(v, Value::Str(_)),
            Type::Int => v.is_int(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Type::Object => "an object",
            Type::Array => "an array",
            Type::String => "a string",
            Type::Int => "an integer",
        }
    }
}

/// Bytes for a message.
pub(crate) fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `json_contains`: `key` of `v` exists and has type `t`. `what` names `v` in the error.
pub(crate) fn contains<'a>(
    v: &'a Value,
    what: &str,
    key: &str,
    t: Type,
) -> Result<&'a Value, String> {
    match v.get(key) {
        Some(x) if t.matches(x) => Ok(x),
        Some(_) => Err(format!("{what}: \"{key}\" is not {}", t.name())),
        None => Err(format!("{what}: \"{key}\" is missing")),
    }
}

/// `json_contains_string`: a string of at least one character (before any NUL).
pub(crate) fn contains_string<'a>(v: &'a Value, what: &str, key: &str) -> Result<&'a [u8], String> {
    let s = contains(v, what, key, Type::String)?
        .as_bytes()
        .unwrap_or_default();
    if c_str(s).is_empty() {
        return Err(format!("{what}: \"{key}\" is empty"));
    }
    Ok(c_str(s))
}

/// The object `key` of the top level.
pub(crate) fn section<'a>(root: &'a Value, key: &str) -> Result<&'a Object, String> {
    Ok(contains(root, "metadata", key, Type::Object)?
        .as_object()
        .expect("checked type"))
}

/// cryptsetup's `numbered`: every byte a digit (an empty key passes, as there).
pub(crate) fn numbered(s: &[u8]) -> bool {
    s.iter().all(u8::is_ascii_digit)
}

/// `strtoull(s, &end, 10)` that must consume the whole C string without overflow
/// (cryptsetup's `json_str_to_uint64`): leading white space and a sign are allowed, and a minus
/// sign negates modulo 2^64, as in C.
pub(crate) fn str_to_u64(s: &[u8]) -> Option<u64> {
    let s = c_str(s);
    let start = s
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
        .unwrap_or(s.len());
    let t = &s[start..];
    let (neg, digits) = match t.first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() {
        // No conversion: end points at the start, which is the terminator only for "".
        return s.is_empty().then_some(0);
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

/// `crypt_jobj_get_uint64`: `str_to_u64` of `json_object_get_string`, 0 when it fails.
pub fn get_u64(v: Option<&Value>) -> u64 {
    v.and_then(Value::get_string)
        .and_then(|s| str_to_u64(&s))
        .unwrap_or(0)
}

/// `validate_json_uint32`: an integer in 0..=u32::MAX.
pub(crate) fn is_u32(v: &Value) -> bool {
    (0..=u32::MAX as i64).contains(&v.get_int64()) && !matches!(v, Value::UInt(_))
}

/// `atoi` of a numbered key: `strtol` clamped to a long, then cut to an int.
pub fn atoi(key: &[u8]) -> i32 {
    let mut v: i128 = 0;
    for &d in key.iter().take_while(|c| c.is_ascii_digit()) {
        v = (v * 10 + (d - b'0') as i128).min(i64::MAX as i128);
    }
    v as i64 as i32
}

/// The mandatory requirements, as a bit set like `LUKS2_config_get_requirements`.
pub(crate) mod reqs {
    /// "offline-reencrypt".
    pub const OFFLINE_REENCRYPT: u32 = 1;
    /// "online-reencrypt", "-v2", "-v3".
    pub const ONLINE_REENCRYPT: u32 = 2;
    /// Anything else.
    pub const UNKNOWN: u32 = 1 << 31;
}

/// The requirement bits of `config.requirements.mandatory` (assumed validated).
pub(crate) fn requirements(root: &Value) -> u32 {
    let Some(list) = root
        .get("config")
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
    else {
        return 0;
    };
    list.iter()
        .map(|v| match v.get_string().as_deref() {
            Some(b"offline-reencrypt") => reqs::OFFLINE_REENCRYPT,
            Some(b"online-reencrypt" | b"online-reencrypt-v2" | b"online-reencrypt-v3") => {
                reqs::ONLINE_REENCRYPT
            }
            _ => reqs::UNKNOWN,
        })
        .fold(0, |a, b| a | b)
}

/// `parse_and_validate_json`: one JSON object from the start of the area, NULs after it, and
/// every metadata rule; a failing header gets cryptsetup's one repair and a second chance.
pub fn parse_and_validate(area: &[u8]) -> Result<Value, String> {
    let (mut v, end) = super::jsonc::parse_area(area).map_err(|e| format!("JSON metadata: {e}"))?;
    if area.first() != Some(&b'{') {
        return Err("the JSON area does not start with '{'".into());
    }
    if end >= area.len() {
        return Err("the JSON area has no NUL after the metadata".into());
    }
    if let Some(i) = area[end..].iter().position(|&c| c != 0) {
        return Err(format!(
            "byte {} of the JSON area, after the metadata, is not NUL",
            end + i
        ));
    }
    if validate(&v, area.len() as u64).is_err() {
        repair(&mut v);
    }
    validate(&v, area.len() as u64)?;
    Ok(v)
}

/// Bytes of one header copy: config.json_size + the 4096-byte binary header.
fn metadata_size(root: &Value) -> u64 {
    get_u64(root.get("config").and_then(|c| c.get("json_size"))).wrapping_add(4096)
}

/// Every rule of `LUKS2_hdr_validate` for the metadata of a header whose JSON area is
/// `json_area_size` bytes.
pub fn validate(root: &Value, json_area_size: u64) -> R {
    if root.as_object().is_none() {
        return Err("the JSON metadata is not an object".into());
    }
    config::requirements(root)?;
    tokens::validate(root)?;
    digests::validate(root)?;
    segments::validate(root)?;
    keyslots::validate(root)?;
    config::validate(root)?;
    keyslots::areas(root)?;
    json_size(root, json_area_size)?;
    keyslots::types(root)
}

/// `hdr_validate_json_size`: config.json_size matches the binary header, and the metadata as
/// cryptsetup would write it fits the area.
fn json_size(root: &Value, json_area_size: u64) -> R {
    let declared = get_u64(root.get("config").and_then(|c| c.get("json_size")));
    if declared != json_area_size {
        return Err(format!(
            "config.json_size {declared} does not match the JSON area of {json_area_size} bytes in the binary header"
        ));
    }
    let len = root.to_json(Style::Plain).len() as u64;
    if len > json_area_size {
        return Err(format!(
            "the JSON metadata ({len} bytes) does not fit its {json_area_size}-byte area"
        ));
    }
    Ok(())
}

/// `LUKS2_hdr_repair`: drop parameters a luks2 keyslot's KDF does not use (old cryptsetup
/// versions left them), the one glitch cryptsetup repairs in memory before validating again.
pub fn repair(root: &mut Value) {
    let Value::Object(top) = root else { return };
    let Some((_, Value::Object(keyslots))) = top.0.iter_mut().find(|(k, _)| k == b"keyslots")
    else {
        return;
    };
    for (_, ks) in keyslots.0.iter_mut() {
        let Value::Object(ks) = ks else { continue };
        if ks.get("type").and_then(Value::as_bytes).map(c_str) != Some(b"luks2") {
            continue;
        }
        let Some((_, Value::Object(kdf))) = ks.0.iter_mut().find(|(k, _)| k == b"kdf") else {
            continue;
        };
        let keep: &[&[u8]] = match kdf.get("type").and_then(Value::as_bytes).map(c_str) {
            Some(b"pbkdf2") => &[b"type", b"salt", b"hash", b"iterations"],
            Some(b"argon2i" | b"argon2id") => &[b"type", b"salt", b"time", b"memory", b"cpus"],
            _ => continue,
        };
        // Keys end at their first NUL, as json-c stores them.
        kdf.0.retain(|(k, _)| keep.contains(&c_str(k)));
    }
}

#[cfg(test)]
mod tests;

/// Whether a segment has `flag` (or, with `prefix`, a flag starting with it).
pub fn segment_has_flag(seg: &Value, flag: &[u8], prefix: bool) -> bool {
    segments::has_flag(seg, flag, prefix)
}

/// Bytes the headers and the keyslots area take (`LUKS2_hdr_and_areas_size`): what the device
/// must at least hold.
pub fn hdr_and_areas_size(root: &Value) -> u64 {
    keyslots::areas_end(root)
}
