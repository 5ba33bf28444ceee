//! The rules on small documents, one broken thing at a time.

use super::super::jsonc::parse_area;
use super::*;

const GOOD: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2","time":4,"memory":32768,"cpus":2,"salt":"c2FsdA=="}}},"tokens":{"0":{"type":"luks2-keyring","keyslots":["0"],"key_description":"k"}},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"c2FsdA==","digest":"ZGln"}},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;

fn check(text: &str) -> R {
    let mut area = text.as_bytes().to_vec();
    area.resize(12288, 0);
    let (v, _) = parse_area(&area).expect("parses");
    validate(&v, 12288)
}

#[test]
fn accepts_cryptsetups_own_shape_with_a_legacy_kdf() {
    check(GOOD).unwrap();
}

#[test]
fn refuses_what_cryptsetup_refuses() {
    let cases = [
        (
            r#""keyslots":["0"],"key_description""#,
            r#""keyslots":["1"],"key_description""#,
        ),
        (
            r#""encryption":"aes-xts-plain64","sector_size""#,
            r#""encryption":"","sector_size""#,
        ),
        (
            r#""keyslots_size":"16744448""#,
            r#""keyslots_size":"16781312""#,
        ),
        (
            r#""keyslots":["0"],"segments""#,
            r#""keyslots":[],"segments""#,
        ),
        (r#""sector_size":4096"#, r#""sector_size":4097"#),
        (r#""key_size":64,"af""#, r#""key_size":4294967296,"af""#),
        (r#""size":"dynamic""#, r#""size":"-512""#),
    ];
    for (from, to) in cases {
        assert!(GOOD.contains(from), "{from}");
        let bad = GOOD.replace(from, to);
        assert!(check(&bad).is_err(), "accepted: {to}");
    }
}

#[test]
fn numbers_as_c_reads_them() {
    assert_eq!(str_to_u64(b"-1"), Some(u64::MAX));
    assert_eq!(str_to_u64(b" +12"), Some(12));
    assert_eq!(str_to_u64(b"18446744073709551616"), None);
    assert_eq!(str_to_u64(b"12x"), None);
    assert!(numbered(b""));
    assert!(!numbered(b"1a"));
}
