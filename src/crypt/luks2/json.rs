//! The LUKS2 JSON metadata with cryptsetup's conventions: 64-bit values as decimal strings,
//! object keys as decimal ids, binary values in base64. Unknown fields, tokens and sections are
//! kept and written back unchanged.
//!
//! The text is screened (nesting depth, number of values) before serde sees it, and every
//! number is range-checked while the typed view is built, so a hostile header can neither
//! exhaust memory nor smuggle in an offset that later overflows.

use crate::crypt::luks::kdf::{Argon2Variant, Kdf};
use crate::crypt::luks::MAX_KEYSLOTS;
use base64::Engine;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Deepest nesting of arrays/objects accepted (cryptsetup's own metadata needs 5).
pub const MAX_DEPTH: usize = 32;
/// Most JSON values accepted in one metadata area.
pub const MAX_VALUES: usize = 100_000;
/// Largest keyslots area cryptsetup accepts (128 MiB).
pub const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;

type R<T> = Result<T, String>;

/// The whole metadata document.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    /// Keyslots by id.
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// Tokens by id, kept verbatim.
    pub tokens: BTreeMap<u32, Value>,
    /// How tokens were spelled when read or imported (see [`super::token_text::Spellings`]).
    pub token_text: super::token_text::Spellings,
    /// Segments by id.
    pub segments: BTreeMap<u32, Segment>,
    /// Digests by id.
    pub digests: BTreeMap<u32, Digest>,
    /// The config section.
    pub config: Config,
    /// Top-level keys we do not know, kept for rewriting.
    pub extra: Map<String, Value>,
}

/// A keyslot.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyslot {
    /// "luks2" (a passphrase keyslot) or another type we only carry along ("reencrypt").
    pub kind: String,
    /// Size of the key it stores (the volume key), bytes.
    pub key_size: u32,
    /// 0 ignore, 1 normal (absent), 2 prefer.
    pub priority: Option<u32>,
    /// The keyslot area.
    pub area: Area,
    /// AF splitter parameters (luks2 keyslots).
    pub af: Option<Af>,
    /// KDF and its parameters (luks2 keyslots).
    pub kdf: Option<Kdf>,
    /// The object as read, for unknown fields.
    pub raw: Map<String, Value>,
    /// Why this keyslot cannot be used although cryptsetup's rules accept the header (an
    /// unknown KDF, a parameter out of range): it is carried along unchanged and refused
    /// only when someone tries to open it.
    pub problem: Option<String>,
}

/// Where a keyslot's material lives and how it is encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Area {
    /// "raw" for luks2 keyslots.
    pub kind: String,
    /// Byte offset in the header device.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
    /// Cipher of the area ("aes-xts-plain64").
    pub encryption: String,
    /// Key size of that cipher, bytes (what the KDF derives).
    pub key_size: u32,
}

/// AF splitter parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Af {
    /// Number of stripes (4000).
    pub stripes: u32,
    /// Diffuse hash.
    pub hash: String,
}

/// A data segment.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// "crypt" (or "linear" during reencryption).
    pub kind: String,
    /// Byte offset on the data device.
    pub offset: u64,
    /// Bytes, or `None` for "dynamic" (to the end of the device).
    pub size: Option<u64>,
    /// IV of the first sector, in 512-byte units.
    pub iv_tweak: u64,
    /// Cipher ("aes-xts-plain64").
    pub encryption: String,
    /// Encryption sector size, bytes.
    pub sector_size: u32,
    /// Segment flags.
    pub flags: Vec<String>,
    /// The object as read.
    pub raw: Map<String, Value>,
    /// Why the segment cannot be activated although the header is valid (kept unchanged).
    pub problem: Option<String>,
}

/// A volume key digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Digest {
    /// "pbkdf2".
    pub kind: String,
    /// Keyslots whose key it checks.
    pub keyslots: Vec<u32>,
    /// Segments that key encrypts.
    pub segments: Vec<u32>,
    /// PBKDF2 hash.
    pub hash: String,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// Salt.
    pub salt: Vec<u8>,
    /// The digest.
    pub digest: Vec<u8>,
    /// The object as read.
    pub raw: Map<String, Value>,
    /// Why the digest cannot check keys although the header is valid (kept unchanged).
    pub problem: Option<String>,
}

/// The config section.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Size of the JSON area (header size - 4096).
    pub json_size: u64,
    /// Size of the keyslots area after the two headers.
    pub keyslots_size: u64,
    /// Persistent activation flags ("allow-discards", ...).
    pub flags: Vec<String>,
    /// `requirements.mandatory`.
    pub requirements: Vec<String>,
    /// The object as read.
    pub raw: Map<String, Value>,
}

/// Check nesting depth and value count before parsing, so a JSON bomb is refused cheaply.
pub fn screen(text: &[u8]) -> R<()> {
    let (mut depth, mut values, mut in_str, mut esc) = (0usize, 1usize, false, false);
    for &b in text {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!("JSON nested deeper than {MAX_DEPTH} levels"));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' | b':' => {
                values += 1;
                if values > MAX_VALUES {
                    return Err(format!("JSON has more than {MAX_VALUES} values"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn obj<'a>(v: &'a Value, what: &str) -> R<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| format!("{what} is not a JSON object"))
}

fn field<'a>(o: &'a Map<String, Value>, key: &str, what: &str) -> R<&'a Value> {
    o.get(key)
        .ok_or_else(|| format!("{what}: missing \"{key}\""))
}

fn string(o: &Map<String, Value>, key: &str, what: &str) -> R<String> {
    field(o, key, what)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what}.{key} is not a string"))
}

/// A u64 written as a decimal string (cryptsetup's convention for offsets and sizes).
fn u64_str(o: &Map<String, Value>, key: &str, what: &str) -> R<u64> {
    let s = string(o, key, what)?;
    parse_u64(&s).ok_or_else(|| format!("{what}.{key} {s:?} is not a decimal number"))
}

fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn u32_num(o: &Map<String, Value>, key: &str, what: &str) -> R<u32> {
    field(o, key, what)?
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("{what}.{key} is not a number in 0..2^32"))
}

fn b64(o: &Map<String, Value>, key: &str, what: &str, max: usize) -> R<Vec<u8>> {
    let s = string(o, key, what)?;
    if s.len() > max * 4 / 3 + 4 {
        return Err(format!("{what}.{key} is longer than {max} bytes"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(&s)
        .map_err(|_| format!("{what}.{key} is not base64"))
}

fn strings(v: &Value, what: &str) -> R<Vec<String>> {
    v.as_array()
        .ok_or_else(|| format!("{what} is not an array"))?
        .iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{what} holds a non-string"))
        })
        .collect()
}

fn ids(v: &Value, what: &str) -> R<Vec<u32>> {
    strings(v, what)?
        .iter()
        .map(|s| {
            parse_id(s).ok_or_else(|| format!("{what}: {s:?} is not an id below {MAX_KEYSLOTS}"))
        })
        .collect()
}

fn parse_id(s: &str) -> Option<u32> {
    parse_u64(s)
        .filter(|&n| n < MAX_KEYSLOTS as u64 && (s == "0" || !s.starts_with('0')))
        .map(|n| n as u32)
}

/// An id as cryptsetup looks it up ("%d" of 0..31): other keys are invisible to it.
fn canonical_id(s: &str) -> Option<u32> {
    parse_id(s)
}

/// The json-c view as serde values: strings that are not UTF-8 get U+FFFD, NaN and
/// infinities become null (serde has no such numbers).
pub fn to_serde(v: &super::jsonc::Value) -> Value {
    use super::jsonc::Value as J;
    match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Int(n) => Value::from(*n),
        J::UInt(n) => Value::from(*n),
        J::Double(d, _) => serde_json::Number::from_f64(*d).map_or(Value::Null, Value::Number),
        J::Str(s) => Value::String(String::from_utf8_lossy(s).into_owned()),
        J::Array(a) => Value::Array(a.iter().map(to_serde).collect()),
        J::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), to_serde(v)))
                .collect(),
        ),
    }
}

fn b64_text(b: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
}

impl Metadata {
    /// Parse and validate the metadata text of a header of `hdr_size` bytes with cryptsetup's
    /// rules ([`super::validate`]), then build the typed view.
    pub fn parse(text: &[u8], hdr_size: u64) -> R<Metadata> {
        screen(text)?;
        let json_size = hdr_size.saturating_sub(4096) as usize;
        if text.len() >= json_size {
            return Err(format!(
                "JSON metadata of {} bytes does not fit in the {json_size}-byte JSON area",
                text.len()
            ));
        }
        let mut area = text.to_vec();
        area.resize(json_size, 0);
        let tree = super::validate::parse_and_validate(&area)?;
        Ok(Metadata::from_tree(&tree))
    }

    /// The typed view of metadata that passed validation. Parts cryptsetup accepts but dmkit
    /// cannot use (an unknown KDF, a digest type it does not know, ...) are kept verbatim and
    /// marked with the reason, which is reported only when they are used.
    pub fn from_tree(tree: &super::jsonc::Value) -> Metadata {
        let v = to_serde(tree);
        let empty = Map::new();
        let root = v.as_object().unwrap_or(&empty);
        let sec = |name: &str| -> Vec<(u32, &Value)> {
            root.get(name)
                .and_then(Value::as_object)
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, v)| canonical_id(k).map(|id| (id, v)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let keyslots = sec("keyslots")
            .into_iter()
            .map(|(id, v)| {
                let what = format!("keyslot {id}");
                (
                    id,
                    Keyslot::parse(v, &what).unwrap_or_else(|e| Keyslot::opaque(v, e)),
                )
            })
            .collect();
        let tokens = sec("tokens")
            .into_iter()
            .map(|(id, v)| (id, v.clone()))
            .collect();
        let token_text = super::token_text::Spellings::of_tree(tree, canonical_id, to_serde);
        let segments = sec("segments")
            .into_iter()
            .map(|(id, v)| {
                let what = format!("segment {id}");
                (
                    id,
                    Segment::parse(v, &what).unwrap_or_else(|e| Segment::opaque(v, e)),
                )
            })
            .collect();
        let digests = sec("digests")
            .into_iter()
            .map(|(id, v)| {
                let what = format!("digest {id}");
                (
                    id,
                    Digest::parse(v, &what).unwrap_or_else(|e| Digest::opaque(v, e)),
                )
            })
            .collect();
        let config = root
            .get("config")
            .map(|c| Config::parse(c).unwrap_or_else(|_| Config::opaque(c)))
            .unwrap_or_else(|| Config::opaque(&Value::Null));
        let extra = root
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "keyslots" | "tokens" | "segments" | "digests" | "config"
                )
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Metadata {
            keyslots,
            tokens,
            token_text,
            segments,
            digests,
            config,
            extra,
        }
    }

    /// Check the metadata as it would be written with cryptsetup's rules, for a header of
    /// `hdr_size` bytes.
    pub fn validate(&self, hdr_size: u64) -> R<()> {
        let json_size = hdr_size.saturating_sub(4096) as usize;
        let text = self.to_text();
        if text.len() >= json_size {
            return Err(format!(
                "JSON metadata of {} bytes does not fit in the {json_size}-byte JSON area",
                text.len()
            ));
        }
        let mut area = text.into_bytes();
        area.resize(json_size, 0);
        super::validate::parse_and_validate(&area).map(|_| ())
    }

    /// The compact JSON text cryptsetup writes, sections in its order.
    pub fn to_text(&self) -> String {
        fn sec<T>(m: &BTreeMap<u32, T>, f: impl Fn(&T) -> Value) -> Value {
            Value::Object(m.iter().map(|(k, v)| (k.to_string(), f(v))).collect())
        }
        let mut parts = vec![
            (
                "keyslots".to_string(),
                sec(&self.keyslots, Keyslot::to_value),
            ),
            ("tokens".to_string(), sec(&self.tokens, Value::clone)),
            (
                "segments".to_string(),
                sec(&self.segments, Segment::to_value),
            ),
            ("digests".to_string(), sec(&self.digests, Digest::to_value)),
            ("config".to_string(), self.config.to_value()),
        ];
        parts.extend(self.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let body: Vec<String> = parts
            .iter()
            .map(|(k, v)| match k.as_str() {
                // Tokens keep their key order and number spellings, as json-c keeps them.
                "tokens" => format!("\"tokens\":{}", self.token_text.section(&self.tokens)),
                _ => format!("{}:{}", Value::String(k.clone()), v),
            })
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// The metadata as a JSON value (for `dump --json`).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.to_text()).expect("our own JSON parses")
    }

    /// The digest that checks keys for segment `segment`.
    pub fn segment_digest(&self, segment: u32) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.segments.contains(&segment))
            .map(|(&i, d)| (i, d))
    }

    /// The digest bound to `keyslot`.
    pub fn keyslot_digest(&self, keyslot: u32) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.keyslots.contains(&keyslot))
            .map(|(&i, d)| (i, d))
    }
}

/// `json_object_get_string` of a value as C sees it: a string up to its NUL, others as their
/// JSON text.
fn c_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.split('\0').next().unwrap_or_default().to_string(),
        other => other.to_string(),
    }
}

/// `json_object_get_int64` on a value: numbers saturated, strings read like `strtoll`,
/// booleans as 0/1, anything else 0.
fn int64_like(v: &Value) -> i64 {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|_| i64::MAX))
            .or_else(|| n.as_f64().map(|f| f as i64))
            .unwrap_or(0),
        Value::Bool(b) => *b as i64,
        Value::String(s) => super::jsonc::Value::Str(s.clone().into_bytes()).get_int64(),
        _ => 0,
    }
}

/// The unsigned number in `o[key]` ("123" or 123), 0 when there is none.
fn loose_u64(o: &Map<String, Value>, key: &str) -> u64 {
    match o.get(key) {
        Some(Value::String(s)) => parse_u64(s).unwrap_or(0),
        Some(v) => v.as_u64().unwrap_or(0),
        None => 0,
    }
}

fn loose_str(o: &Map<String, Value>, key: &str) -> String {
    o.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl Keyslot {
    /// A keyslot dmkit cannot use, kept as it is, with the reason.
    fn opaque(v: &Value, problem: String) -> Keyslot {
        let empty = Map::new();
        let o = v.as_object().unwrap_or(&empty);
        let a = o.get("area").and_then(Value::as_object).unwrap_or(&empty);
        Keyslot {
            kind: loose_str(o, "type"),
            key_size: loose_u64(o, "key_size").min(u32::MAX as u64) as u32,
            priority: None,
            area: Area {
                kind: loose_str(a, "type"),
                offset: loose_u64(a, "offset"),
                size: loose_u64(a, "size"),
                encryption: loose_str(a, "encryption"),
                key_size: loose_u64(a, "key_size").min(u32::MAX as u64) as u32,
            },
            af: None,
            kdf: None,
            raw: o.clone(),
            problem: Some(problem),
        }
    }

    fn parse(v: &Value, what: &str) -> R<Keyslot> {
        let o = obj(v, what)?;
        let kind = string(o, "type", what)?;
        let key_size = u32_num(o, "key_size", what)?;
        if key_size == 0 || key_size > 512 {
            return Err(format!("{what}: key_size {key_size} is not in 1..=512"));
        }
        let priority = match o.get("priority") {
            None => None,
            Some(_) => {
                let p = u32_num(o, "priority", what)?;
                if p > 2 {
                    return Err(format!("{what}: priority {p} is not 0, 1 or 2"));
                }
                Some(p)
            }
        };
        let aw = format!("{what}.area");
        let ao = obj(field(o, "area", what)?, &aw)?;
        let luks2 = kind == "luks2";
        let area = Area {
            kind: string(ao, "type", &aw)?,
            offset: u64_str(ao, "offset", &aw)?,
            size: u64_str(ao, "size", &aw)?,
            encryption: if luks2 {
                string(ao, "encryption", &aw)?
            } else {
                String::new()
            },
            key_size: if luks2 {
                u32_num(ao, "key_size", &aw)?
            } else {
                0
            },
        };
        if luks2 && (area.kind != "raw" || area.key_size == 0 || area.key_size > 512) {
            return Err(format!(
                "{aw}: type {:?} / key_size {} unsupported",
                area.kind, area.key_size
            ));
        }
        let (mut af, mut kdf) = (None, None);
        if luks2 {
            let fw = format!("{what}.af");
            let fo = obj(field(o, "af", what)?, &fw)?;
            if string(fo, "type", &fw)? != "luks1" {
                return Err(format!("{fw}: only type \"luks1\" is supported"));
            }
            let stripes = u32_num(fo, "stripes", &fw)?;
            if stripes == 0 {
                return Err(format!("{fw}.stripes is 0"));
            }
            af = Some(Af {
                stripes,
                hash: string(fo, "hash", &fw)?,
            });
            kdf = Some(parse_kdf(field(o, "kdf", what)?, &format!("{what}.kdf"))?);
        }
        Ok(Keyslot {
            kind,
            key_size,
            priority,
            area,
            af,
            kdf,
            raw: o.clone(),
            problem: None,
        })
    }

    /// The keyslot as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
        if self.kind != "luks2" || self.problem.is_some() {
            return Value::Object(o);
        }
        o.insert("type".into(), self.kind.clone().into());
        o.insert("key_size".into(), self.key_size.into());
        match self.priority {
            Some(p) => o.insert("priority".into(), p.into()),
            None => o.remove("priority"),
        };
        let mut a = o
            .get("area")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        a.insert("type".into(), self.area.kind.clone().into());
        a.insert("offset".into(), self.area.offset.to_string().into());
        a.insert("size".into(), self.area.size.to_string().into());
        a.insert("encryption".into(), self.area.encryption.clone().into());
        a.insert("key_size".into(), self.area.key_size.into());
        o.insert("area".into(), Value::Object(a));
        if let Some(af) = &self.af {
            let mut f = o
                .get("af")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            f.insert("type".into(), "luks1".into());
            f.insert("stripes".into(), af.stripes.into());
            f.insert("hash".into(), af.hash.clone().into());
            o.insert("af".into(), Value::Object(f));
        }
        if let Some(k) = &self.kdf {
            o.insert("kdf".into(), kdf_value(k));
        }
        Value::Object(o)
    }
}

fn parse_kdf(v: &Value, what: &str) -> R<Kdf> {
    let o = obj(v, what)?;
    let kind = string(o, "type", what)?;
    let salt = b64(o, "salt", what, 1024)?;
    if salt.is_empty() {
        return Err(format!("{what}.salt is empty"));
    }
    match kind.as_str() {
        "pbkdf2" => {
            // Values are checked when the KDF runs, as cryptsetup does (Kdf::derive).
            Ok(Kdf::Pbkdf2 {
                hash: string(o, "hash", what)?,
                iterations: u32_num(o, "iterations", what)?,
                salt,
            })
        }
        "argon2i" | "argon2id" => {
            let variant = if kind == "argon2i" {
                Argon2Variant::I
            } else {
                Argon2Variant::Id
            };
            // Values are checked when the KDF runs, as cryptsetup does (Kdf::derive).
            let (time, memory, cpus) = (
                u32_num(o, "time", what)?,
                u32_num(o, "memory", what)?,
                u32_num(o, "cpus", what)?,
            );
            Ok(Kdf::Argon2 {
                variant,
                time,
                memory,
                cpus,
                salt,
            })
        }
        other => Err(format!("{what}: unknown type {other:?}")),
    }
}

fn kdf_value(k: &Kdf) -> Value {
    match k {
        Kdf::Pbkdf2 {
            hash,
            iterations,
            salt,
        } => serde_json::json!({
            "type": "pbkdf2", "hash": hash, "iterations": iterations, "salt": b64_text(salt),
        }),
        Kdf::Argon2 {
            variant,
            time,
            memory,
            cpus,
            salt,
        } => serde_json::json!({
            "type": variant.name(), "time": time, "memory": memory, "cpus": cpus, "salt": b64_text(salt),
        }),
    }
}

impl Segment {
    /// A segment dmkit cannot activate, kept as it is, with the reason.
    fn opaque(v: &Value, problem: String) -> Segment {
        let empty = Map::new();
        let o = v.as_object().unwrap_or(&empty);
        let size = match o.get("size").and_then(Value::as_str) {
            Some("dynamic") => None,
            _ => Some(loose_u64(o, "size")),
        };
        Segment {
            kind: loose_str(o, "type"),
            offset: loose_u64(o, "offset"),
            size,
            iv_tweak: loose_u64(o, "iv_tweak"),
            encryption: loose_str(o, "encryption"),
            sector_size: 512,
            flags: Vec::new(),
            raw: o.clone(),
            problem: Some(problem),
        }
    }

    fn parse(v: &Value, what: &str) -> R<Segment> {
        let o = obj(v, what)?;
        let kind = string(o, "type", what)?;
        let offset = u64_str(o, "offset", what)?;
        let size_s = string(o, "size", what)?;
        let size = if size_s == "dynamic" {
            None
        } else {
            Some(parse_u64(&size_s).ok_or_else(|| {
                format!("{what}.size {size_s:?} is neither \"dynamic\" nor a number")
            })?)
        };
        let flags = match o.get("flags") {
            Some(f) => strings(f, &format!("{what}.flags"))?,
            None => Vec::new(),
        };
        let (mut iv_tweak, mut encryption, mut sector_size) = (0, String::new(), 512);
        if kind == "crypt" {
            iv_tweak = u64_str(o, "iv_tweak", what)?;
            encryption = string(o, "encryption", what)?;
            sector_size = u32_num(o, "sector_size", what)?;
            if !matches!(sector_size, 512 | 1024 | 2048 | 4096) {
                return Err(format!(
                    "{what}.sector_size {sector_size} is not 512, 1024, 2048 or 4096"
                ));
            }
        }
        if !offset.is_multiple_of(512)
            || size.is_some_and(|s| !s.is_multiple_of(sector_size as u64))
        {
            return Err(format!(
                "{what}: offset {offset} or size {size_s} is not sector-aligned"
            ));
        }
        Ok(Segment {
            kind,
            offset,
            size,
            iv_tweak,
            encryption,
            sector_size,
            flags,
            raw: o.clone(),
            problem: None,
        })
    }

    /// The `integrity.type` of a crypt segment with integrity (`hmac(sha256)`, `aead`, ...).
    pub fn integrity_type(&self) -> Option<String> {
        self.raw
            .get("integrity")?
            .get("type")?
            .as_str()
            .map(str::to_string)
    }

    /// Give the segment an `integrity` object as cryptsetup writes it (no journal
    /// encryption or MAC).
    pub fn set_integrity(&mut self, itype: &str) {
        self.raw.insert(
            "integrity".into(),
            serde_json::json!({
                "type": itype,
                "journal_encryption": "none",
                "journal_integrity": "none",
            }),
        );
    }

    /// The segment as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
        if self.problem.is_some() {
            return Value::Object(o);
        }
        o.insert("type".into(), self.kind.clone().into());
        o.insert("offset".into(), self.offset.to_string().into());
        o.insert(
            "size".into(),
            self.size
                .map_or("dynamic".to_string(), |s| s.to_string())
                .into(),
        );
        if self.kind == "crypt" {
            o.insert("iv_tweak".into(), self.iv_tweak.to_string().into());
            o.insert("encryption".into(), self.encryption.clone().into());
            o.insert("sector_size".into(), self.sector_size.into());
        }
        Value::Object(o)
    }
}

impl Digest {
    /// A digest dmkit cannot check keys with, kept as it is, with the reason.
    fn opaque(v: &Value, problem: String) -> Digest {
        let empty = Map::new();
        let o = v.as_object().unwrap_or(&empty);
        let list = |k: &str| -> Vec<u32> {
            o.get(k)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().and_then(canonical_id))
                .collect()
        };
        Digest {
            kind: loose_str(o, "type"),
            keyslots: list("keyslots"),
            segments: list("segments"),
            hash: loose_str(o, "hash"),
            iterations: 0,
            salt: Vec::new(),
            digest: Vec::new(),
            raw: o.clone(),
            problem: Some(problem),
        }
    }

    /// A pbkdf2 digest read as cryptsetup's `PBKDF2_digest_verify` reads it: iterations as
    /// json-c converts any value to an integer, salt and digest through cryptsetup's base64
    /// decoder. A salt that is not 32 bytes or a digest of the wrong length make the digest
    /// unusable (`problem`): cryptsetup 2.6.1 then "verifies" any key, dmkit refuses.
    fn parse(v: &Value, what: &str) -> R<Digest> {
        let o = obj(v, what)?;
        let kind = string(o, "type", what)?;
        if kind != "pbkdf2" {
            return Err(format!("{what}: unknown type {kind:?}"));
        }
        let hash = o.get("hash").map(c_string).unwrap_or_default();
        // json_object_get_int64, then cut to the unsigned int cryptsetup keeps.
        let iterations = o.get("iterations").map_or(0, int64_like) as u32;
        let decode = |key: &str| {
            let text = o.get(key).and_then(Value::as_str).unwrap_or_default();
            super::base64::decode(text.as_bytes())
        };
        let salt = decode("salt").ok_or_else(|| format!("{what}.salt is not base64"))?;
        if salt.len() != crate::crypt::luks::SALT_SIZE {
            return Err(format!("{what}.salt is {} bytes, not 32", salt.len()));
        }
        let digest = decode("digest").ok_or_else(|| format!("{what}.digest is not base64"))?;
        let hash_len = crate::crypt::luks::af::message_digest(&hash)
            .map(|m| m.size())
            .ok();
        if digest.len() < 20
            || digest.len() > 64
            || (digest.len() != 20 && Some(digest.len()) != hash_len)
        {
            return Err(format!(
                "{what}.digest is {} bytes, not a {hash:?} digest",
                digest.len()
            ));
        }
        Ok(Digest {
            kind,
            keyslots: ids(field(o, "keyslots", what)?, &format!("{what}.keyslots"))?,
            segments: ids(field(o, "segments", what)?, &format!("{what}.segments"))?,
            hash,
            iterations,
            salt,
            digest,
            raw: o.clone(),
            problem: None,
        })
    }

    /// The digest as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
        if self.problem.is_some() {
            return Value::Object(o);
        }
        let list =
            |v: &[u32]| Value::Array(v.iter().map(|i| Value::String(i.to_string())).collect());
        o.insert("type".into(), self.kind.clone().into());
        o.insert("keyslots".into(), list(&self.keyslots));
        o.insert("segments".into(), list(&self.segments));
        o.insert("hash".into(), self.hash.clone().into());
        o.insert("iterations".into(), self.iterations.into());
        o.insert("salt".into(), b64_text(&self.salt));
        o.insert("digest".into(), b64_text(&self.digest));
        Value::Object(o)
    }
}

impl Config {
    /// The config section read loosely (the validated fields only).
    fn opaque(v: &Value) -> Config {
        let empty = Map::new();
        let o = v.as_object().unwrap_or(&empty);
        Config {
            json_size: loose_u64(o, "json_size"),
            keyslots_size: loose_u64(o, "keyslots_size"),
            flags: Vec::new(),
            requirements: Vec::new(),
            raw: o.clone(),
        }
    }

    fn parse(v: &Value) -> R<Config> {
        let what = "config";
        let o = obj(v, what)?;
        let flags = match o.get("flags") {
            Some(f) => strings(f, "config.flags")?,
            None => Vec::new(),
        };
        let requirements = match o.get("requirements") {
            Some(r) => match obj(r, "config.requirements")?.get("mandatory") {
                Some(m) => strings(m, "config.requirements.mandatory")?,
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        Ok(Config {
            json_size: u64_str(o, "json_size", what)?,
            keyslots_size: u64_str(o, "keyslots_size", what)?,
            flags,
            requirements,
            raw: o.clone(),
        })
    }

    /// The config as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
        o.insert("json_size".into(), self.json_size.to_string().into());
        o.insert(
            "keyslots_size".into(),
            self.keyslots_size.to_string().into(),
        );
        if self.flags.is_empty() {
            o.remove("flags");
        } else {
            o.insert("flags".into(), self.flags.clone().into());
        }
        let mut req = o
            .get("requirements")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if self.requirements.is_empty() {
            req.remove("mandatory");
        } else {
            req.insert("mandatory".into(), self.requirements.clone().into());
        }
        if req.is_empty() {
            o.remove("requirements");
        } else {
            o.insert("requirements".into(), Value::Object(req));
        }
        Value::Object(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2id","time":4,"memory":32768,"cpus":2,"salt":"njJnNyJDgG0j0nuMHEXOzwGY5QN88BsGYz/cb6ab+yI="}}},"tokens":{"3":{"type":"x-custom","keyslots":["0"],"secret":"keep me"}},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"fxAOy68E3mxDxBgGBYnCB95t7YwTXwXK94IAFsHkDPw=","digest":"XyeKHk6KY5j0B0yb8TMLZrHLYW04jCPcHau/iYxFNuo="}},"config":{"json_size":"12288","keyslots_size":"16744448","flags":["allow-discards","x-unknown"]}}"#;

    #[test]
    fn parses_and_round_trips() {
        let m = Metadata::parse(SAMPLE.as_bytes(), 16384).unwrap();
        assert_eq!(m.keyslots[&0].area.size, 258048);
        assert_eq!(m.segments[&0].sector_size, 4096);
        let again = Metadata::parse(m.to_text().as_bytes(), 16384).unwrap();
        assert_eq!(again, m);
        let v: Value = serde_json::from_str(&m.to_text()).unwrap();
        assert_eq!(v["tokens"]["3"]["secret"], "keep me");
        assert_eq!(v["config"]["flags"][1], "x-unknown");
        assert!(m.to_text().starts_with("{\"keyslots\":"));
    }

    #[test]
    fn refuses_bombs_and_bad_values() {
        let deep = "[".repeat(10_000);
        assert!(screen(deep.as_bytes()).unwrap_err().contains("nested"));
        assert!(Metadata::parse(SAMPLE.as_bytes(), 32768).is_err());
        let bad = SAMPLE.replace(
            "\"offset\":\"32768\"",
            "\"offset\":\"99999999999999999999\"",
        );
        assert!(Metadata::parse(bad.as_bytes(), 16384).is_err());
        let bad = SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":\"-1\"");
        assert!(Metadata::parse(bad.as_bytes(), 16384).is_err());
    }
}
