//! Deterministic mutations of a valid LUKS2 header, each written with valid checksums so the
//! metadata rules (not the checksum) decide: values replaced by awkward ones (lone surrogate
//! escapes, numbers out of range, wrong types), members dropped, renamed or added, bytes of
//! the JSON text changed, and binary header fields (label, uuid, checksum algorithm, sizes,
//! epoch) rewritten. The secondary copy is killed, mutated the same way, or left valid, so
//! the choice between copies is exercised too.

use crate::common::rng::SplitMix64;
use openssl::hash::{Hasher, MessageDigest};

const HDR: usize = 16384;

/// Values a mutation puts in place of another.
pub const VALUES: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00x""#,
    r#""a\u0000b""#,
    r#""""#,
    r#""0""#,
    r#""-1""#,
    r#""18446744073709551615""#,
    r#""18446744073709551616""#,
    "4294967295",
    "4294967296",
    "-1",
    "0",
    "1",
    "2",
    "5",
    "512",
    "4096",
    "1e3",
    "1.5",
    "null",
    "true",
    "[]",
    "{}",
    r#"["0"]"#,
    r#"["7"]"#,
    r#""dynamic""#,
    r#""luks2""#,
    r#""crypt""#,
    "'x'",
    "NaN",
    "99999999999999999999999",
    r#""512""#,
    r#""4096""#,
    r#""16384""#,
    r#""aes-xts-plain64""#,
    r#""sha256""#,
    r#""argon2""#,
    r#""argon2id""#,
    r#""pbkdf2""#,
    r#""raw""#,
    r#"["backup-x"]"#,
    r#""luks2-keyring""#,
    r#""reencrypt""#,
    r#""\u00e9t\u00e9""#,
    r#""x/y""#,
    "TRUE",
    "Infinity",
];

/// [`VALUES`] without the numbers json-c reads as 2^31 or more (and NaN, which it reads as
/// -2^31): as a KDF cost they would keep both tools busy for hours, so mutations that are
/// unlocked use these.
pub const CHEAP_VALUES: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00x""#,
    r#""a\u0000b""#,
    r#""""#,
    r#""0""#,
    r#""-1""#,
    r#""18446744073709551615""#,
    r#""18446744073709551616""#,
    "-1",
    "0",
    "1",
    "2",
    "5",
    "512",
    "4096",
    "1e3",
    "1.5",
    "null",
    "true",
    "[]",
    "{}",
    r#"["0"]"#,
    r#"["7"]"#,
    r#""dynamic""#,
    r#""luks2""#,
    r#""crypt""#,
    "'x'",
    r#""512""#,
    r#""4096""#,
    r#""16384""#,
    r#""aes-xts-plain64""#,
    r#""sha256""#,
    r#""argon2""#,
    r#""argon2id""#,
    r#""pbkdf2""#,
    r#""raw""#,
    r#"["backup-x"]"#,
    r#""luks2-keyring""#,
    r#""reencrypt""#,
    r#""\u00e9t\u00e9""#,
    r#""x/y""#,
    "TRUE",
];

/// Keys a mutation renames a member to, or adds.
const KEYS: &[&str] = &[
    "type",
    "keyslots",
    "segments",
    "digests",
    "tokens",
    "config",
    "priority",
    "flags",
    "key_size",
    "offset",
    "size",
    "0",
    "1",
    "7",
    "007",
    "31",
    "32",
    "",
    "area",
    "kdf",
    "af",
    "integrity",
    "requirements",
    "mandatory",
    "key_description",
    "x-unknown",
];

/// Bytes a mutation writes into the JSON text.
const BYTES: &[u8] = b"{}[],:\"\\ /*'a0-9eE.\x00\xff\t";

/// (start, end) of the JSON values in `t`, found by a scan of its strings and brackets.
fn value_spans(t: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let c = t[i];
        if c == b':' || c == b'[' || (c == b',' && in_array(t, i)) {
            let start = i + 1;
            if let Some(end) = value_end(t, start) {
                out.push((start, end));
            }
        }
        if c == b'"' {
            i = string_end(t, i).unwrap_or(t.len());
            continue;
        }
        i += 1;
    }
    out
}

/// Whether the ',' at `i` separates array elements (the nearest open bracket is '[').
fn in_array(t: &[u8], i: usize) -> bool {
    let mut depth = 0i32;
    let mut j = i;
    while j > 0 {
        j -= 1;
        match t[j] {
            b']' | b'}' => depth += 1,
            b'[' if depth == 0 => return true,
            b'{' if depth == 0 => return false,
            b'[' | b'{' => depth -= 1,
            _ => {}
        }
    }
    false
}

/// One past the closing quote of the string starting at `i`.
fn string_end(t: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < t.len() {
        match t[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// One past the value starting at `i`.
fn value_end(t: &[u8], i: usize) -> Option<usize> {
    match *t.get(i)? {
        b'"' => string_end(t, i),
        b'{' | b'[' => {
            let mut depth = 0;
            let mut j = i;
            while j < t.len() {
                match t[j] {
                    b'"' => {
                        j = string_end(t, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        b']' | b'}' => None,
        _ => {
            let n = t[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']'))?;
            Some(i + n)
        }
    }
}

/// (start of the key, end of the value) of the object members in `t`.
fn members(t: &[u8]) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for (vs, ve) in value_spans(t) {
        if vs >= 1 && t[vs - 1] == b':' {
            // The key is the string just before the ':'.
            let mut k = vs - 2;
            while k > 0
                && !(t[k] == b'"' && t[k - 1] != b'\\' && (t[k - 1] == b'{' || t[k - 1] == b','))
            {
                k -= 1;
            }
            out.push((k, vs - 1, ve));
        }
    }
    out
}

fn pick<'a, T>(r: &mut SplitMix64, items: &'a [T]) -> &'a T {
    &items[r.below(items.len() as u64) as usize]
}

/// Mutate the JSON text `t` once, with values from `values`.
fn mutate_json(r: &mut SplitMix64, t: &mut Vec<u8>, values: &[&str]) -> String {
    match r.below(6) {
        0 | 1 => {
            let vs = value_spans(t);
            let &(s, e) = pick(r, &vs);
            let v = pick(r, values);
            let old = String::from_utf8_lossy(&t[s..e]).into_owned();
            t.splice(s..e, v.bytes());
            format!("value {old:.40} -> {v}")
        }
        2 => {
            let ms = members(t);
            let &(k, _, e) = pick(r, &ms);
            // Drop the member with the comma before or after it.
            let (s, e) = if t[k - 1] == b',' {
                (k - 1, e)
            } else if t.get(e) == Some(&b',') {
                (k, e + 1)
            } else {
                (k, e)
            };
            let old = String::from_utf8_lossy(&t[s..e]).into_owned();
            t.drain(s..e);
            format!("drop {old:.60}")
        }
        3 => {
            let ms = members(t);
            let &(k, colon, _) = pick(r, &ms);
            let key = pick(r, KEYS);
            t.splice(k..colon, format!("\"{key}\"").bytes());
            format!("rename key -> {key:?}")
        }
        4 => {
            let objs: Vec<usize> = (0..t.len()).filter(|&i| t[i] == b'{').collect();
            let &o = pick(r, &objs);
            let key = pick(r, KEYS);
            let v = pick(r, values);
            let empty = t.get(o + 1) == Some(&b'}');
            let text = format!("\"{key}\":{v}{}", if empty { "" } else { "," });
            t.splice(o + 1..o + 1, text.bytes());
            format!("add {key:?}:{v}")
        }
        _ => {
            let i = r.below(t.len() as u64) as usize;
            let b = *pick(r, BYTES);
            match r.below(3) {
                0 => {
                    t[i] = b;
                    format!("byte {i} = {b:#04x}")
                }
                1 => {
                    t.insert(i, b);
                    format!("insert {b:#04x} at {i}")
                }
                _ => {
                    t.remove(i);
                    format!("delete byte {i}")
                }
            }
        }
    }
}

/// Recompute the checksum of the header copy at `at` with its own algorithm (left alone when
/// OpenSSL does not know it: then the copy is corrupt for both tools anyway).
fn fix_checksum(img: &mut [u8], at: usize, hdr: usize) {
    let alg_end = img[at + 72..at + 104]
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(32);
    let alg = String::from_utf8_lossy(&img[at + 72..at + 72 + alg_end]).into_owned();
    let Some(md) = MessageDigest::from_name(&alg) else {
        return;
    };
    let mut bin = img[at..at + 4096].to_vec();
    bin[448..512].fill(0);
    let mut h = Hasher::new(md).unwrap();
    h.update(&bin).unwrap();
    h.update(&img[at + 4096..at + hdr]).unwrap();
    let sum = h.finish().unwrap();
    img[at + 448..at + 512].fill(0);
    img[at + 448..at + 448 + sum.len()].copy_from_slice(&sum);
}

/// Mutate the binary header of the copy at `at`.
fn mutate_binary(r: &mut SplitMix64, img: &mut [u8], at: usize) -> String {
    let printable = |r: &mut SplitMix64, n: usize| -> Vec<u8> {
        (0..n).map(|_| b'!' + r.below(94) as u8).collect()
    };
    match r.below(6) {
        0 => {
            let v = printable(r, 48);
            img[at + 24..at + 72].copy_from_slice(&v);
            "label fills its 48 bytes".into()
        }
        1 => {
            let v = printable(r, 48);
            img[at + 208..at + 256].copy_from_slice(&v);
            "subsystem fills its 48 bytes".into()
        }
        2 => {
            let v = printable(r, 40);
            img[at + 168..at + 208].copy_from_slice(&v);
            "uuid fills its 40 bytes".into()
        }
        3 => {
            let alg = *pick(
                r,
                &[
                    "sha1", "sha512", "SHA256", "sha384", "md5", "x", "", "sha3-256",
                ],
            );
            img[at + 72..at + 104].fill(0);
            img[at + 72..at + 72 + alg.len()].copy_from_slice(alg.as_bytes());
            format!("checksum algorithm {alg:?}")
        }
        4 => {
            let seq = r.next();
            img[at + 16..at + 24].copy_from_slice(&seq.to_be_bytes());
            format!("epoch {seq}")
        }
        _ => {
            let size = *pick(
                r,
                &[0u64, 4096, 16384, 32768, 16385, 1 << 22, (1 << 22) + 1],
            );
            img[at + 8..at + 16].copy_from_slice(&size.to_be_bytes());
            format!("header size {size}")
        }
    }
}

/// The `n`th mutation of `base` (the 32 KiB of both header copies) and what it did; JSON values
/// come from `values` ([`VALUES`] or [`CHEAP_VALUES`]).
pub fn mutation(base: &[u8], seed: u64, n: u64, values: &[&str]) -> (Vec<u8>, String) {
    let mut r = SplitMix64(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut img = base[..2 * HDR].to_vec();
    let json_end = img[4096..HDR].iter().position(|&c| c == 0).unwrap() + 4096;
    let mut text = img[4096..json_end].to_vec();
    let binary = r.below(5) == 0;
    let what = if binary {
        mutate_binary(&mut r, &mut img, 0)
    } else {
        let w = mutate_json(&mut r, &mut text, values);
        if text.len() < HDR - 4096 {
            img[4096..HDR].fill(0);
            img[4096..4096 + text.len()].copy_from_slice(&text);
        }
        w
    };
    fix_checksum(&mut img, 0, HDR);
    let secondary = match r.below(10) {
        0..=4 => {
            img[HDR..HDR + 6].copy_from_slice(b"VACUUM");
            "secondary killed"
        }
        5..=7 => {
            let (p, s) = img.split_at_mut(HDR);
            s[4096..HDR].copy_from_slice(&p[4096..HDR]);
            if binary {
                s[8..256].copy_from_slice(&p[8..256]);
            }
            fix_checksum(&mut img, HDR, HDR);
            "secondary the same"
        }
        _ => "secondary valid",
    };
    (img, format!("{what}; {secondary}"))
}

/// The `n`th mutation of a LUKS1 image's 592-byte header (one field of the binary header or
/// of a keyslot set to an awkward value; KDF costs stay small) and what it did. Cipher names
/// and modes are drawn from what dmkit implements (AES with xts/cbc and plain, plain64 or
/// essiv:sha1/sha256 IVs): other keyslot ciphers are cipher support, not header rules.
pub fn luks1_mutation(base: &[u8], seed: u64, n: u64) -> (Vec<u8>, String) {
    let mut r = SplitMix64(seed ^ n.wrapping_mul(0xd1b5_4a32_d192_ed03));
    let mut h = base[..4096].to_vec();
    let text = |r: &mut SplitMix64, h: &mut [u8], off: usize, len: usize, opts: &[&str]| {
        let v: Vec<u8> = match r.below(opts.len() as u64 + 1) as usize {
            i if i < opts.len() => opts[i].as_bytes().to_vec(),
            // The whole field, no NUL.
            _ => (0..len).map(|_| b'a' + r.below(26) as u8).collect(),
        };
        h[off..off + len].fill(0);
        let n = v.len().min(len);
        h[off..off + n].copy_from_slice(&v[..n]);
        String::from_utf8_lossy(&v).into_owned()
    };
    let be32 = |h: &mut [u8], off: usize, v: u32| h[off..off + 4].copy_from_slice(&v.to_be_bytes());
    let what = match r.below(9) {
        0 => {
            let v = text(
                &mut r,
                &mut h,
                8,
                32,
                &["aes", "AES", "Aes", "cipher_null", ""],
            );
            format!("cipher name {v:?}")
        }
        1 => {
            let modes = [
                "xts-plain64",
                "cbc-plain",
                "cbc-plain64",
                "cbc-essiv:sha1",
                "",
                "cbc-essiv:sha256",
            ];
            let v = text(&mut r, &mut h, 40, 32, &modes);
            format!("cipher mode {v:?}")
        }
        2 => {
            let hashes = [
                "sha1",
                "SHA256",
                "sha512",
                "ripemd160",
                "md5",
                "",
                "x",
                "sha256",
            ];
            let v = text(&mut r, &mut h, 72, 32, &hashes);
            format!("hash spec {v:?}")
        }
        3 => {
            let v = *pick(
                &mut r,
                &[0u32, 1, 8, 135, 136, 1031, 1032, 2048, 20000, u32::MAX],
            );
            be32(&mut h, 104, v);
            format!("payload offset {v}")
        }
        4 => {
            let v = *pick(&mut r, &[0u32, 1, 15, 16, 24, 32, 64, 512, 513, u32::MAX]);
            be32(&mut h, 108, v);
            format!("key bytes {v}")
        }
        5 => {
            let v = *pick(&mut r, &[0u32, 1, 999, 1000, 1001]);
            be32(&mut h, 164, v);
            format!("MK iterations {v}")
        }
        6 => {
            let v = text(
                &mut r,
                &mut h,
                168,
                40,
                &["", "28632274-8c8a-493f-835b-da802e1c576b"],
            );
            format!("uuid {v:?}")
        }
        7 => {
            let i = r.below(112) as usize;
            h[i] ^= 1 << r.below(8);
            format!("bit flip in byte {i}")
        }
        _ => {
            let slot = r.below(8) as usize;
            let o = 208 + 48 * slot;
            match r.below(4) {
                0 => {
                    let v = *pick(&mut r, &[0x00AC_71F3u32, 0x0000_DEAD, 0, 1]);
                    be32(&mut h, o, v);
                    format!("keyslot {slot} state {v:#x}")
                }
                1 => {
                    let v = *pick(&mut r, &[0u32, 1, 999, 1000]);
                    be32(&mut h, o + 4, v);
                    format!("keyslot {slot} iterations {v}")
                }
                2 => {
                    let v = *pick(&mut r, &[0u32, 1, 7, 8, 64, 136, 264, 1000, 1032, 20000]);
                    be32(&mut h, o + 40, v);
                    format!("keyslot {slot} key material offset {v}")
                }
                _ => {
                    let v = *pick(&mut r, &[0u32, 1, 3999, 4000, 4001]);
                    be32(&mut h, o + 44, v);
                    format!("keyslot {slot} stripes {v}")
                }
            }
        }
    };
    (h, what)
}
