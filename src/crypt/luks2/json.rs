//! The LUKS2 JSON metadata with cryptsetup's conventions: 64-bit values as decimal strings,
//! object keys as decimal ids, binary values in base64. Unknown fields, tokens and sections are
//! kept and written back unchanged.
//!
//! The text is screened (nesting depth, number of values) before serde sees it, and every
//! number is range-checked while the typed view is built, so a hostile header can neither
//! exhaust memory nor smuggle in an offset that later overflows.

use super::kdf::{Argon2Variant, Kdf};
use super::MAX_KEYSLOTS;
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

fn section<'a>(root: &'a Map<String, Value>, name: &str) -> R<BTreeMap<u32, &'a Value>> {
    let o = obj(field(root, name, "metadata")?, name)?;
    let mut out = BTreeMap::new();
    for (k, v) in o {
        let id = parse_id(k)
            .ok_or_else(|| format!("{name}: key {k:?} is not an id below {MAX_KEYSLOTS}"))?;
        out.insert(id, v);
    }
    Ok(out)
}

fn b64_text(b: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
}

impl Metadata {
    /// Parse and validate the metadata text of a header of `hdr_size` bytes.
    pub fn parse(text: &[u8], hdr_size: u64) -> R<Metadata> {
        screen(text)?;
        let v: Value = serde_json::from_slice(text).map_err(|e| format!("JSON metadata: {e}"))?;
        let root = obj(&v, "JSON metadata")?;
        let mut keyslots = BTreeMap::new();
        for (id, v) in section(root, "keyslots")? {
            keyslots.insert(id, Keyslot::parse(v, &format!("keyslot {id}"))?);
        }
        let mut tokens = BTreeMap::new();
        for (id, v) in section(root, "tokens")? {
            let what = format!("token {id}");
            let o = obj(v, &what)?;
            string(o, "type", &what)?;
            ids(field(o, "keyslots", &what)?, &format!("{what}.keyslots"))?;
            tokens.insert(id, v.clone());
        }
        let mut segments = BTreeMap::new();
        for (id, v) in section(root, "segments")? {
            segments.insert(id, Segment::parse(v, &format!("segment {id}"))?);
        }
        let mut digests = BTreeMap::new();
        for (id, v) in section(root, "digests")? {
            digests.insert(id, Digest::parse(v, &format!("digest {id}"))?);
        }
        let config = Config::parse(field(root, "config", "metadata")?)?;
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
        let m = Metadata {
            keyslots,
            tokens,
            segments,
            digests,
            config,
            extra,
        };
        m.validate(hdr_size)?;
        Ok(m)
    }

    /// Cross-field checks: sizes, areas inside the keyslots area and apart, references.
    pub fn validate(&self, hdr_size: u64) -> R<()> {
        let c = &self.config;
        if c.json_size != hdr_size - 4096 {
            return Err(format!(
                "config.json_size {} does not match the header size {hdr_size}",
                c.json_size
            ));
        }
        if !c.keyslots_size.is_multiple_of(4096) || c.keyslots_size > MAX_KEYSLOTS_SIZE {
            return Err(format!(
                "config.keyslots_size {} is not a multiple of 4096 up to 128 MiB",
                c.keyslots_size
            ));
        }
        let (start, end) = (2 * hdr_size, 2 * hdr_size + c.keyslots_size);
        let mut areas: Vec<(u64, u64, u32)> = Vec::new();
        for (&id, k) in &self.keyslots {
            let a = &k.area;
            let a_end = a
                .offset
                .checked_add(a.size)
                .ok_or_else(|| format!("keyslot {id}: area size overflows"))?;
            if a.offset < start || a_end > end {
                return Err(format!(
                    "keyslot {id}: area {}..{a_end} lies outside the keyslots area {start}..{end}",
                    a.offset
                ));
            }
            if let Some(&(_, _, other)) = areas.iter().find(|(s, e, _)| a.offset < *e && *s < a_end)
            {
                return Err(format!("keyslot {id}: area overlaps keyslot {other}"));
            }
            areas.push((a.offset, a_end, id));
            if let Some(af) = &k.af {
                let need = k.key_size as u64 * af.stripes as u64;
                if need > a.size {
                    return Err(format!(
                        "keyslot {id}: area of {} bytes cannot hold {} stripes of {} bytes",
                        a.size, af.stripes, k.key_size
                    ));
                }
            }
        }
        for (&id, d) in &self.digests {
            if let Some(s) = d.keyslots.iter().find(|s| !self.keyslots.contains_key(s)) {
                return Err(format!(
                    "digest {id} names keyslot {s}, which does not exist"
                ));
            }
            if let Some(s) = d.segments.iter().find(|s| !self.segments.contains_key(s)) {
                return Err(format!(
                    "digest {id} names segment {s}, which does not exist"
                ));
            }
        }
        Ok(())
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
            .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v))
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

impl Keyslot {
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
        })
    }

    /// The keyslot as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
        if self.kind != "luks2" {
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
        })
    }

    /// The segment as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
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
    fn parse(v: &Value, what: &str) -> R<Digest> {
        let o = obj(v, what)?;
        let kind = string(o, "type", what)?;
        if kind != "pbkdf2" {
            return Err(format!("{what}: unknown type {kind:?}"));
        }
        let iterations = u32_num(o, "iterations", what)?;
        let digest = b64(o, "digest", what, 64)?;
        if iterations == 0 || digest.is_empty() || digest.len() > 64 {
            return Err(format!(
                "{what}: iterations {iterations} or digest of {} bytes is invalid",
                digest.len()
            ));
        }
        Ok(Digest {
            kind,
            keyslots: ids(field(o, "keyslots", what)?, &format!("{what}.keyslots"))?,
            segments: ids(field(o, "segments", what)?, &format!("{what}.segments"))?,
            hash: string(o, "hash", what)?,
            iterations,
            salt: b64(o, "salt", what, 1024)?,
            digest,
            raw: o.clone(),
        })
    }

    /// The digest as cryptsetup writes it.
    pub fn to_value(&self) -> Value {
        let mut o = self.raw.clone();
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
