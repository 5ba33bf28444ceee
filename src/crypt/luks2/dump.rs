//! `luksDump` text, field for field as cryptsetup 2.6 prints it, so scripts that read
//! cryptsetup's output read ours.

use super::header::{Luks2Header, RawCopy};
use super::jsonc::{self, Value};
use super::{base64, validate};
use crate::crypt::luks::MAX_KEYSLOTS;
use std::fmt::Write;

/// Bytes as cryptsetup's `crypt_log_hex` prints them: "xx " each, `indent` after every 16.
pub fn hex_lines(bytes: &[u8], indent: &str) -> String {
    let mut s = String::new();
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i % 16 == 0 {
            s.push('\n');
            s.push_str(indent);
        }
        let _ = write!(s, "{b:02x} ");
    }
    s
}

/// The text of `cryptsetup luksDump` for a LUKS2 header, byte for byte: it walks the JSON
/// metadata the way cryptsetup's `LUKS2_hdr_dump` does (ids 0..31 looked up by name, values
/// read with json-c's conversions), so odd but valid metadata prints as it does there.
pub fn text(h: &Luks2Header) -> Vec<u8> {
    match &h.raw {
        Some(raw) => render(h, raw),
        None => {
            // A header made here: the text it would have on disk.
            let area = h.metadata.to_text().into_bytes();
            let json = jsonc::parse_area(&area)
                .map(|(v, _)| v)
                .unwrap_or(jsonc::Value::Null);
            let raw = RawCopy {
                json,
                label: h.label.clone().into_bytes(),
                subsystem: h.subsystem.clone().into_bytes(),
                uuid: h.uuid.clone().into_bytes(),
            };
            render(h, &raw)
        }
    }
}

/// `printf("%s")` of `json_object_get_string`: "(null)" for a missing value, as glibc prints
/// a NULL string.
fn s(v: Option<&Value>) -> Vec<u8> {
    v.and_then(Value::get_string)
        .map_or_else(|| b"(null)".to_vec(), |c| c.into_owned())
}

fn or(b: &[u8], none: &str) -> Vec<u8> {
    if b.is_empty() {
        none.as_bytes().to_vec()
    } else {
        b.to_vec()
    }
}

/// A member of section `name` with id `i` as cryptsetup finds it (by the name "%d").
fn by_id<'a>(root: &'a Value, name: &str, i: u32) -> Option<&'a Value> {
    root.get(name)?.get(&i.to_string())
}

/// `hexprint_base64`: the decoded bytes, 16 per line; nothing at all when it does not decode.
fn hex_base64(o: &mut Vec<u8>, v: Option<&Value>, indent: &str) {
    // json-c gives the length of strings only: anything else decodes as empty.
    let bytes = match v {
        Some(Value::Str(s)) => base64::decode(s),
        _ => base64::decode(b""),
    };
    let Some(bytes) = bytes else { return };
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i % 16 == 0 {
            o.extend_from_slice(format!("\n\t{indent}").as_bytes());
        }
        o.extend_from_slice(format!("{b:02x} ").as_bytes());
    }
    o.push(b'\n');
}

fn line(o: &mut Vec<u8>, parts: &[&[u8]]) {
    for p in parts {
        o.extend_from_slice(p);
    }
}

fn u32_of(v: Option<&Value>) -> u32 {
    v.map_or(0, Value::get_int64) as u32
}

fn render(h: &Luks2Header, raw: &RawCopy) -> Vec<u8> {
    let root = &raw.json;
    let mut o = Vec::new();
    let w = &mut o;
    let meta =
        validate::get_u64(root.get("config").and_then(|c| c.get("json_size"))).wrapping_add(4096);
    let ks_size = validate::get_u64(root.get("config").and_then(|c| c.get("keyslots_size")));
    line(w, &[b"LUKS header information\nVersion:       \t2\n"]);
    line(w, &[format!("Epoch:         \t{}\n", h.seqid).as_bytes()]);
    line(
        w,
        &[format!("Metadata area: \t{meta} [bytes]\n").as_bytes()],
    );
    line(
        w,
        &[format!("Keyslots area: \t{ks_size} [bytes]\n").as_bytes()],
    );
    line(
        w,
        &[b"UUID:          \t", &or(&raw.uuid, "(no UUID)"), b"\n"],
    );
    line(
        w,
        &[b"Label:         \t", &or(&raw.label, "(no label)"), b"\n"],
    );
    line(
        w,
        &[
            b"Subsystem:     \t",
            &or(&raw.subsystem, "(no subsystem)"),
            b"\n",
        ],
    );
    config(w, root);
    segments(w, root);
    keyslots(w, root);
    tokens(w, root);
    digests(w, root);
    o
}

fn config(w: &mut Vec<u8>, root: &Value) {
    let config = root.get("config");
    let flags = config
        .and_then(|c| c.get("flags"))
        .and_then(Value::as_array)
        .unwrap_or_default();
    let reqs = config
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
        .unwrap_or_default();
    line(w, &[b"Flags:       \t"]);
    for f in flags {
        line(w, &[&s(Some(f)), b" "]);
    }
    line(
        w,
        &[if flags.is_empty() { b"(no flags)" } else { b"" }, b"\n"],
    );
    if reqs.is_empty() {
        line(w, &[b"\n"]);
    } else {
        line(w, &[b"Requirements:\t"]);
        for r in reqs {
            line(w, &[&s(Some(r)), b" "]);
        }
        line(w, &[b"\n\n"]);
    }
}

fn segments(w: &mut Vec<u8>, root: &Value) {
    line(w, &[b"Data segments:\n"]);
    for i in 0..MAX_KEYSLOTS {
        let Some(seg) = by_id(root, "segments", i) else {
            continue;
        };
        line(
            w,
            &[format!("  {i}: ").as_bytes(), &s(seg.get("type")), b"\n"],
        );
        let off = validate::get_u64(seg.get("offset"));
        line(w, &[format!("\toffset: {off} [bytes]\n").as_bytes()]);
        if s(seg.get("size")) == b"dynamic" {
            line(w, &[b"\tlength: (whole device)\n"]);
        } else {
            let n = validate::get_u64(seg.get("size"));
            line(w, &[format!("\tlength: {n} [bytes]\n").as_bytes()]);
        }
        if let Some(e) = seg.get("encryption") {
            line(w, &[b"\tcipher: ", &s(Some(e)), b"\n"]);
        }
        if let Some(ss) = seg.get("sector_size") {
            line(
                w,
                &[format!("\tsector: {} [bytes]\n", u32_of(Some(ss))).as_bytes()],
            );
        }
        if let Some(t) = seg.get("integrity").and_then(|i| i.get("type")) {
            line(w, &[b"\tintegrity: ", &s(Some(t)), b"\n"]);
        }
        if let Some(flags) = seg.get("flags") {
            let list = flags.as_array().unwrap_or_default();
            if let Some((first, rest)) = list.split_first() {
                line(w, &[b"\tflags : ", &s(Some(first))]);
                for f in rest {
                    line(w, &[b", ", &s(Some(f))]);
                }
                line(w, &[b"\n"]);
            }
        }
        line(w, &[b"\n"]);
    }
}

fn priority(ks: &Value) -> &'static str {
    match ks.get("priority").map_or(1, Value::get_int) {
        0 => "ignored",
        1 => "normal",
        2 => "preferred",
        _ => "invalid",
    }
}

/// Whether keyslot `i`'s key opens a regular segment (`LUKS2_keyslot_for_segment` with
/// `CRYPT_ONE_SEGMENT`); cryptsetup marks the others "(unbound)".
fn bound(root: &Value, i: u32) -> bool {
    let digest_of = |section: &str, id: u32| -> Option<i32> {
        let name = id.to_string();
        root.get("digests")?.as_object()?.iter().find_map(|(k, d)| {
            d.get(section)?
                .as_array()?
                .iter()
                .any(|x| x.get_string().as_deref() == Some(name.as_bytes()))
                .then(|| validate::atoi(k))
        })
    };
    let Some(kd) = digest_of("keyslots", i) else {
        return false;
    };
    let regular = root
        .get("segments")
        .and_then(Value::as_object)
        .map_or(0, |o| {
            o.iter()
                .filter(|(_, s)| !validate::segment_has_flag(s, b"backup-", true))
                .count()
        });
    (0..regular as u32).any(|s| digest_of("segments", s) == Some(kd))
}

fn keyslots(w: &mut Vec<u8>, root: &Value) {
    line(w, &[b"Keyslots:\n"]);
    for i in 0..MAX_KEYSLOTS {
        let Some(ks) = by_id(root, "keyslots", i) else {
            continue;
        };
        let kind = s(ks.get("type"));
        let unbound = if bound(root, i) { "" } else { " (unbound)" };
        line(
            w,
            &[
                format!("  {i}: ").as_bytes(),
                &kind,
                unbound.as_bytes(),
                b"\n",
            ],
        );
        if let Some(k) = ks.get("key_size") {
            let bits = u32_of(Some(k)).wrapping_mul(8);
            line(w, &[format!("\tKey:        {bits} bits\n").as_bytes()]);
        }
        line(w, &[format!("\tPriority:   {}\n", priority(ks)).as_bytes()]);
        match kind.as_slice() {
            b"luks2" => luks2_keyslot(w, ks),
            b"reencrypt" => reencrypt_keyslot(w, ks),
            _ => {}
        }
        let id = i.to_string();
        for (k, d) in root
            .get("digests")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|o| o.iter())
        {
            for x in d
                .get("keyslots")
                .and_then(Value::as_array)
                .unwrap_or_default()
            {
                if x.get_string().as_deref() == Some(id.as_bytes()) {
                    line(w, &[b"\tDigest ID:  ", k, b"\n"]);
                }
            }
        }
    }
}

/// `luks2_keyslot_dump`.
fn luks2_keyslot(w: &mut Vec<u8>, ks: &Value) {
    let (Some(kdf), Some(af), Some(area)) = (ks.get("kdf"), ks.get("af"), ks.get("area")) else {
        return;
    };
    line(w, &[b"\tCipher:     ", &s(area.get("encryption")), b"\n"]);
    let bits = u32_of(area.get("key_size")).wrapping_mul(8);
    line(w, &[format!("\tCipher key: {bits} bits\n").as_bytes()]);
    let t = s(kdf.get("type"));
    line(w, &[b"\tPBKDF:      ", &t, b"\n"]);
    if t == b"pbkdf2" {
        line(w, &[b"\tHash:       ", &s(kdf.get("hash")), b"\n"]);
        let it = validate::get_u64(kdf.get("iterations"));
        line(w, &[format!("\tIterations: {it}\n").as_bytes()]);
    } else {
        let n = |k: &str| kdf.get(k).map_or(0, Value::get_int64) as u64;
        line(w, &[format!("\tTime cost:  {}\n", n("time")).as_bytes()]);
        line(w, &[format!("\tMemory:     {}\n", n("memory")).as_bytes()]);
        line(w, &[format!("\tThreads:    {}\n", n("cpus")).as_bytes()]);
    }
    line(w, &[b"\tSalt:       "]);
    hex_base64(w, kdf.get("salt"), "            ");
    let stripes = af.get("stripes").map_or(0, Value::get_int) as u32;
    line(w, &[format!("\tAF stripes: {stripes}\n").as_bytes()]);
    line(w, &[b"\tAF hash:    ", &s(af.get("hash")), b"\n"]);
    let off = validate::get_u64(area.get("offset"));
    let len = validate::get_u64(area.get("size"));
    line(
        w,
        &[format!("\tArea offset:{off} [bytes]\n\tArea length:{len} [bytes]\n").as_bytes()],
    );
}

/// `reenc_keyslot_dump`.
fn reencrypt_keyslot(w: &mut Vec<u8>, ks: &Value) {
    let (Some(dir), Some(mode), Some(area)) = (ks.get("direction"), ks.get("mode"), ks.get("area"))
    else {
        return;
    };
    let Some(t) = area.get("type") else { return };
    let t = s(Some(t));
    line(w, &[b"\tMode:       ", &s(Some(mode)), b"\n"]);
    line(w, &[b"\tDirection:  ", &s(Some(dir)), b"\n"]);
    line(w, &[b"\tResilience: ", &t, b"\n"]);
    if t == b"checksum" {
        line(w, &[b"\tHash:       ", &s(area.get("hash")), b"\n"]);
        let ss = area.get("sector_size").map_or(0, Value::get_int);
        line(w, &[format!("\tHash data:  {ss} [bytes]\n").as_bytes()]);
    } else if t == b"datashift" {
        let n = validate::get_u64(area.get("shift_size"));
        line(w, &[format!("\tShift size: {n}[bytes]\n").as_bytes()]);
    }
    let off = validate::get_u64(area.get("offset"));
    let len = validate::get_u64(area.get("size"));
    line(
        w,
        &[format!("\tArea offset:{off} [bytes]\n\tArea length:{len} [bytes]\n").as_bytes()],
    );
}

fn tokens(w: &mut Vec<u8>, root: &Value) {
    line(w, &[b"Tokens:\n"]);
    for i in 0..MAX_KEYSLOTS {
        let Some(t) = by_id(root, "tokens", i) else {
            continue;
        };
        let kind = s(t.get("type"));
        line(w, &[format!("  {i}: ").as_bytes(), &kind, b"\n"]);
        // The built-in handler of "luks2-keyring" tokens prints their key description.
        if kind == b"luks2-keyring" {
            if let Some(d) = t.get("key_description") {
                line(w, &[b"\tKey description: ", &s(Some(d)), b"\n"]);
            }
        }
        for k in t
            .get("keyslots")
            .and_then(Value::as_array)
            .unwrap_or_default()
        {
            line(w, &[b"\tKeyslot:    ", &s(Some(k)), b"\n"]);
        }
    }
}

fn digests(w: &mut Vec<u8>, root: &Value) {
    line(w, &[b"Digests:\n"]);
    // cryptsetup looks at digest ids 0..7 only.
    for i in 0..8 {
        let Some(d) = by_id(root, "digests", i) else {
            continue;
        };
        let kind = s(d.get("type"));
        line(w, &[format!("  {i}: ").as_bytes(), &kind, b"\n"]);
        if kind == b"pbkdf2" {
            line(w, &[b"\tHash:       ", &s(d.get("hash")), b"\n"]);
            let it = d.get("iterations").map_or(0, Value::get_int64) as u64;
            line(w, &[format!("\tIterations: {it}\n").as_bytes()]);
            line(w, &[b"\tSalt:       "]);
            hex_base64(w, d.get("salt"), "            ");
            line(w, &[b"\tDigest:     "]);
            hex_base64(w, d.get("digest"), "            ");
        }
    }
}

/// The header lines of `cryptsetup luksDump --dump-volume-key`: cipher name and mode as
/// `crypt_get_cipher` / `crypt_get_cipher_mode` give them (`None` prints "(null)"), and the
/// data offset in 512-byte sectors.
pub struct VolumeKeyHeader {
    /// Cipher name ("aes").
    pub cipher: Option<String>,
    /// Cipher mode ("xts-plain64").
    pub mode: Option<String>,
    /// Data offset, sectors.
    pub payload_sectors: u64,
}

/// `crypt_parse_name_and_mode`: "aes-xts-plain64" -> ("aes", "xts-plain64"), "null" ->
/// ("cipher_null", "ecb"), "aes" -> ("aes", "cbc-plain"); names longer than 31 bytes cut.
pub fn parse_name_and_mode(s: &str) -> Option<(String, String)> {
    let cut = |t: &str| -> String { t.chars().take(31).collect() };
    let name_len = s.find('-').unwrap_or(s.len());
    if name_len > 0 && name_len <= 31 && name_len < s.len() {
        // "%31s" skips white space, then reads up to 31 other characters.
        let rest = s[name_len + 1..].trim_start();
        let mode: String = cut(rest.split(char::is_whitespace).next().unwrap_or(""));
        if !mode.is_empty() {
            let mode = if mode == "plain" {
                "cbc-plain".into()
            } else {
                mode
            };
            return Some((s[..name_len].to_string(), mode));
        }
    }
    if s == "null" || s == "cipher_null" {
        return Some(("cipher_null".into(), "ecb".into()));
    }
    if name_len > 0 {
        return Some((cut(&s[..name_len]), "cbc-plain".into()));
    }
    None
}

/// The [`VolumeKeyHeader`] of a LUKS2 header: the default segment's "encryption" ("null" when
/// absent) and the smallest offset of a regular segment.
pub fn luks2_volume_key_header(h: &Luks2Header) -> VolumeKeyHeader {
    let tree;
    let root = match &h.raw {
        Some(r) => &r.json,
        None => {
            tree = jsonc::parse_area(h.metadata.to_text().as_bytes())
                .map(|(v, _)| v)
                .unwrap_or(Value::Null);
            &tree
        }
    };
    let segments = root.get("segments").and_then(Value::as_object);
    let default = segments.and_then(|o| {
        o.iter()
            .find(|(_, s)| validate::segment_has_flag(s, b"backup-final", false))
            .map(|(k, _)| validate::atoi(k) as u32)
            .or_else(|| (!o.is_empty()).then_some(0))
    });
    let cipher = default
        .and_then(|i| segments?.get(&i.to_string()))
        .and_then(|seg| match seg.get("encryption") {
            None => Some("null".to_string()),
            Some(e) => e
                .get_string()
                .map(|c| String::from_utf8_lossy(&c).into_owned()),
        })
        .and_then(|c| parse_name_and_mode(&c));
    // LUKS2_get_data_offset: the smallest offset of a segment that is not a backup, 0 wins.
    let mut min = u64::MAX >> 9;
    for (_, s) in segments.into_iter().flat_map(|o| o.iter()) {
        if validate::segment_has_flag(s, b"backup-", true) {
            continue;
        }
        min = min.min(validate::get_u64(s.get("offset")) >> 9);
    }
    VolumeKeyHeader {
        cipher: cipher.as_ref().map(|c| c.0.clone()),
        mode: cipher.map(|c| c.1),
        payload_sectors: if segments.is_some() { min } else { 0 },
    }
}

/// The text of `cryptsetup luksDump --dump-volume-key` (LUKS1 and LUKS2 alike).
pub fn volume_key_text(device: &str, head: &VolumeKeyHeader, uuid: &str, vk: &[u8]) -> String {
    let or_null = |s: &Option<String>| s.clone().unwrap_or_else(|| "(null)".into());
    let mut o = String::new();
    let _ = writeln!(o, "LUKS header information for {device}");
    let _ = writeln!(o, "Cipher name:   \t{}", or_null(&head.cipher));
    let _ = writeln!(o, "Cipher mode:   \t{}", or_null(&head.mode));
    // cryptsetup prints the offset through an int.
    let _ = writeln!(o, "Payload offset:\t{}", head.payload_sectors as i32);
    let _ = writeln!(o, "UUID:          \t{uuid}");
    let _ = writeln!(o, "MK bits:       \t{}", vk.len() * 8);
    let _ = writeln!(o, "MK dump:\t{}", hex_lines(vk, "\t\t"));
    o
}

#[cfg(test)]
mod tests {
    use super::parse_name_and_mode as p;

    #[test]
    fn cipher_names_split_as_cryptsetup_splits_them() {
        let pair = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
        assert_eq!(p("aes-xts-plain64"), pair("aes", "xts-plain64"));
        assert_eq!(p("aes-plain"), pair("aes", "cbc-plain"));
        assert_eq!(p("null"), pair("cipher_null", "ecb"));
        assert_eq!(p("serpent"), pair("serpent", "cbc-plain"));
        assert_eq!(p("aes- xts"), pair("aes", "xts"));
        assert_eq!(
            p("aes-"),
            pair("aes-", "cbc-plain").map(|(_, m)| ("aes".into(), m))
        );
        assert_eq!(p(""), None);
        assert_eq!(p("-xts"), None);
    }
}
