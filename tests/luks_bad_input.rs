//! `dmkit luks` refuses bad input the way the CLI contract says: exactly one stderr line
//! `dmkit: ...` naming what is wrong, the documented exit code (2 for a wrong passphrase, 1
//! otherwise), no panic, and not one byte of the image changed.
//!
//! Hostile headers are built here byte by byte, with valid checksums, so the parser's own
//! checks (not the checksum) must catch them.

mod common;

use common::run::Workspace;
use common::xor_byte;
use sha2::{Digest, Sha256};
use std::fs;
use std::path::Path;

/// A workspace with the passphrase files `pass` and `wrong`.
fn env() -> Workspace {
    let e = Workspace::new();
    fs::write(e.path("pass"), "right passphrase").unwrap();
    fs::write(e.path("wrong"), "wrong passphrase").unwrap();
    e
}

/// The LUKS fixtures of these tests, in a workspace made by [`env`].
trait Fixtures {
    fn luks2(&self) -> String;
    fn refuses(&self, img: &str, args: &[&str], code: i32, needle: &str);
}

impl Fixtures for Workspace {
    /// A 20 MiB LUKS2 image with a cheap PBKDF2 keyslot 0.
    fn luks2(&self) -> String {
        let img = self.s("disk.img");
        fs::File::create(&img).unwrap().set_len(20 << 20).unwrap();
        let o = self.dmkit(&[
            "luks",
            "format",
            "-q",
            "--key-file",
            &self.s("pass"),
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            &img,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        img
    }
    /// Run dmkit on `img` and check it fails with `code`, one line containing `needle`, and
    /// leaves the image as it was.
    fn refuses(&self, img: &str, args: &[&str], code: i32, needle: &str) {
        let before = fs::read(img).unwrap();
        let o = self.dmkit(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(code),
            "dmkit {args:?}: exit code; stderr: {err}"
        );
        assert!(!err.contains("panicked"), "dmkit {args:?} panicked: {err}");
        assert_eq!(
            err.lines().count(),
            1,
            "dmkit {args:?}: want one stderr line, got: {err}"
        );
        assert!(err.starts_with("dmkit: "), "dmkit {args:?}: {err}");
        assert!(
            err.contains(needle),
            "dmkit {args:?}: {err:?} does not mention {needle:?}"
        );
        assert!(
            fs::read(img).unwrap() == before,
            "dmkit {args:?} modified the image"
        );
    }
}

fn json_of(img: &str) -> serde_json::Value {
    let b = fs::read(img).unwrap();
    let area = &b[4096..16384];
    let end = area.iter().position(|&c| c == 0).unwrap();
    serde_json::from_slice(&area[..end]).unwrap()
}

/// One header copy (binary header + JSON area) with a valid sha256 checksum.
fn header_copy(json: &[u8], hdr_size: u64, offset: u64, seqid: u64) -> Vec<u8> {
    let mut b = vec![0u8; hdr_size as usize];
    b[..6].copy_from_slice(if offset == 0 {
        b"LUKS\xba\xbe"
    } else {
        b"SKUL\xba\xbe"
    });
    b[6..8].copy_from_slice(&2u16.to_be_bytes());
    b[8..16].copy_from_slice(&hdr_size.to_be_bytes());
    b[16..24].copy_from_slice(&seqid.to_be_bytes());
    b[72..78].copy_from_slice(b"sha256");
    b[168..204].copy_from_slice(b"0c3ed3d5-4b0a-4c52-9b3a-1f1d2d0a0b0c");
    b[256..264].copy_from_slice(&offset.to_be_bytes());
    let n = json.len().min(hdr_size as usize - 4096);
    b[4096..4096 + n].copy_from_slice(&json[..n]);
    let sum = Sha256::digest(&b);
    b[448..480].copy_from_slice(&sum);
    b
}

/// Write both header copies with `json` into `img`.
fn write_headers(img: &str, json: &[u8], hdr_size: u64) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(&header_copy(json, hdr_size, 0, 9), 0)
        .unwrap();
    f.write_all_at(&header_copy(json, hdr_size, hdr_size, 9), hdr_size)
        .unwrap();
}

fn edit_json(img: &str, f: impl Fn(&mut serde_json::Value)) {
    let mut v = json_of(img);
    f(&mut v);
    write_headers(img, v.to_string().as_bytes(), 16384);
}

fn flip(img: &str, offset: u64) {
    xor_byte(Path::new(img), offset, 0x55);
}

#[test]
fn wrong_passphrase_exits_2_with_cryptsetups_words() {
    let e = env();
    let img = e.luks2();
    let w = e.s("wrong");
    for args in [
        vec!["luks", "test-passphrase", "--key-file", &w, &img],
        vec!["luks", "open", "--key-file", &w, &img, "x"],
        vec!["luks", "dump", "--dump-volume-key", "--key-file", &w, &img],
        vec![
            "luks",
            "add-key",
            "--key-file",
            &w,
            "--new-keyfile",
            &w,
            &img,
        ],
        vec!["luks", "remove-key", "--key-file", &w, &img],
    ] {
        e.refuses(&img, &args, 2, "No key available with this passphrase.");
    }
}

#[test]
fn corrupt_primary_falls_back_to_the_secondary_and_says_so() {
    let e = env();
    let img = e.luks2();
    flip(&img, 4096 + 20);
    let before = fs::read(&img).unwrap();
    let o = e.dmkit(&["luks", "test-passphrase", "--key-file", &e.s("pass"), &img]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("primary LUKS2 header needs repair") && err.contains("secondary"),
        "{err}"
    );
    assert!(fs::read(&img).unwrap() == before);
}

#[test]
fn both_copies_corrupt_is_a_clear_error() {
    let e = env();
    let img = e.luks2();
    flip(&img, 4096 + 20);
    flip(&img, 16384 + 4096 + 20);
    e.refuses(
        &img,
        &["luks", "dump", &img],
        1,
        "both LUKS2 header copies are corrupt",
    );
    e.refuses(
        &img,
        &["luks", "test-passphrase", "--key-file", &e.s("pass"), &img],
        1,
        "both LUKS2 header copies are corrupt",
    );
}

#[test]
fn unknown_mandatory_requirement_refuses_activation() {
    let e = env();
    let img = e.luks2();
    edit_json(&img, |v| {
        v["config"]["requirements"] = serde_json::json!({"mandatory": ["x-future-feature"]})
    });
    e.refuses(
        &img,
        &["luks", "open", "--key-file", &e.s("pass"), &img, "r0"],
        1,
        "unsupported LUKS2 requirement \"x-future-feature\"",
    );
    let o = e.dmkit(&["luks", "dump", &img]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("x-future-feature"));
}

#[test]
fn json_bombs_are_refused() {
    let e = env();
    let img = e.luks2();
    let deep = format!("{{\"keyslots\":{}", "[".repeat(8000));
    write_headers(&img, deep.as_bytes(), 16384);
    e.refuses(&img, &["luks", "dump", &img], 1, "nested deeper");
    // Two million values in a 4 MiB JSON area: parsed in one pass (json-c takes them too),
    // then refused for what the document lacks.
    let img2 = e.s("wide.img");
    fs::File::create(&img2).unwrap().set_len(16 << 20).unwrap();
    let mut wide =
        String::from("{\"keyslots\":{},\"tokens\":{\"0\":{\"type\":\"x\",\"keyslots\":[],\"v\":[");
    while wide.len() < (4 << 20) - 4096 - 16 {
        wide.push_str("0,");
    }
    wide.push_str("0]}}}");
    write_headers(&img2, wide.as_bytes(), 4 << 20);
    e.refuses(&img2, &["luks", "dump", &img2], 1, "\"config\" is missing");
}

/// An edit of the JSON metadata.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

#[test]
fn absurd_sizes_and_offsets_are_refused() {
    let e = env();
    let pass = e.s("pass");
    let cases: Vec<(Edit, &str, bool)> = vec![
        (
            Box::new(|v| v["keyslots"]["0"]["area"]["offset"] = "18446744073709551615".into()),
            "area",
            false,
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["area"]["size"] = "99999999999".into()),
            "beyond the keyslots area",
            false,
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["key_size"] = 100000.into()),
            "key_size",
            false,
        ),
        (
            Box::new(|v| v["segments"]["0"]["offset"] = "1099511627776".into()),
            "no data after the data offset",
            true,
        ),
        (
            Box::new(|v| v["segments"]["0"]["size"] = "1099511627776".into()),
            "beyond the end of the device",
            true,
        ),
        (
            Box::new(|v| v["segments"]["0"]["sector_size"] = 3000.into()),
            "sector_size",
            false,
        ),
        (
            Box::new(|v| v["config"]["keyslots_size"] = "18446744073709551615".into()),
            "keyslots_size",
            false,
        ),
        (
            Box::new(|v| v["config"]["json_size"] = "4096".into()),
            "json_size",
            false,
        ),
        (
            Box::new(|v| v["digests"]["0"]["keyslots"] = serde_json::json!(["7"])),
            "keyslot 7",
            false,
        ),
        (
            Box::new(|v| v["digests"]["0"]["iterations"] = (-1).into()),
            "iterations",
            false,
        ),
    ];
    for (edit, needle, at_open) in cases {
        let img = e.luks2();
        edit_json(&img, |v| edit(v));
        if at_open {
            e.refuses(
                &img,
                &["luks", "open", "--key-file", &pass, &img, "z"],
                1,
                needle,
            );
        } else {
            e.refuses(
                &img,
                &["luks", "test-passphrase", "--key-file", &pass, &img],
                1,
                needle,
            );
        }
    }
    // An impossible header size in the binary header of both copies.
    let img = e.luks2();
    for at in [8u64, 16384 + 8] {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&u64::MAX.to_be_bytes(), at).unwrap();
    }
    e.refuses(&img, &["luks", "dump", &img], 1, "header size");
}

#[test]
fn truncated_devices_are_refused() {
    let e = env();
    let pass = e.s("pass");
    let img = e.luks2();
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    e.refuses(
        &img,
        &["luks", "open", "--key-file", &pass, &img, "t"],
        1,
        "smaller than the LUKS2 headers and keyslots",
    );
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(100 << 10)
        .unwrap();
    e.refuses(
        &img,
        &["luks", "test-passphrase", "--key-file", &pass, &img],
        1,
        "truncated",
    );
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(20 << 10)
        .unwrap();
    e.refuses(
        &img,
        &["luks", "dump", &img],
        1,
        "smaller than the LUKS2 headers and keyslots",
    );
}

#[test]
fn short_key_files_and_non_luks_devices_are_refused() {
    let e = env();
    let img = e.luks2();
    e.refuses(
        &img,
        &[
            "luks",
            "test-passphrase",
            "--key-file",
            &e.s("pass"),
            "--keyfile-size",
            "100",
            &img,
        ],
        1,
        "key file too short: need 100 bytes at offset 0, got 16",
    );
    e.refuses(
        &img,
        &[
            "luks",
            "test-passphrase",
            "--key-file",
            &e.s("pass"),
            "--keyfile-offset",
            "1000",
            &img,
        ],
        1,
        "cannot seek to --keyfile-offset 1000",
    );
    let zeros = e.s("zeros.img");
    fs::File::create(&zeros).unwrap().set_len(1 << 20).unwrap();
    e.refuses(&zeros, &["luks", "dump", &zeros], 1, "not a LUKS device");
    e.refuses(&img, &["luks", "kill-slot", &img, "0"], 1, "last one");
}

#[test]
fn corrupt_luks1_headers_are_refused() {
    let e = env();
    let img = e.s("l1.img");
    fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
    let o = e.dmkit(&[
        "luks",
        "format",
        "-q",
        "--type",
        "luks1",
        "--key-file",
        &e.s("pass"),
        "--pbkdf-force-iterations",
        "1000",
        &img,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    e.refuses(
        &img,
        &["luks", "test-passphrase", "--key-file", &e.s("wrong"), &img],
        2,
        "No key available",
    );
    // A keyslot state that is neither "enabled" nor "disabled" makes that keyslot invalid,
    // not the header: cryptsetup dumps it as disabled and no passphrase opens it.
    flip(&img, 208 + 48 * 3 + 1);
    let o = e.dmkit(&["luks", "dump", &img]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Key Slot 3: DISABLED"));
    flip(&img, 208 + 48 * 3 + 1);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&0x7fff_ffffu32.to_be_bytes(), 208 + 40)
            .unwrap();
    }
    e.refuses(
        &img,
        &["luks", "test-passphrase", "--key-file", &e.s("pass"), &img],
        1,
        "LUKS keyslot 0 is invalid",
    );
}

/// Whether the kernel refuses an allocation larger than memory and swap (overcommit heuristic
/// or never), so asking for 4 TiB fails instead of running into the OOM killer.
fn overcommit_refuses_huge() -> bool {
    fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() != "1")
}

#[test]
fn failing_kdfs_end_the_search_with_cryptsetups_exit_codes() {
    // Keyslot 0 gets a KDF edited in place, keyslot 1 is intact: like cryptsetup, a KDF that
    // cannot run stops the search (exit 1), one without memory exits 3, and parameters that run
    // but differ only yield "wrong passphrase" (exit 2) and let keyslot 1 open.
    let e = env();
    let cs = !common::env::tool_missing("cryptsetup", "cryptsetup-bin");
    let second = e.s("second");
    fs::write(&second, "second passphrase").unwrap();
    let argon = |time: u64, memory: u64, cpus: u64| -> Edit {
        Box::new(move |v| {
            let salt = v["keyslots"]["0"]["kdf"]["salt"].clone();
            v["keyslots"]["0"]["kdf"] = serde_json::json!(
                {"type": "argon2id", "time": time, "memory": memory, "cpus": cpus, "salt": salt});
        })
    };
    let mut cases: Vec<(Edit, i32, i32, &str)> = vec![
        (
            Box::new(|v| v["keyslots"]["0"]["kdf"]["hash"] = "no-such-hash".into()),
            1,
            1,
            "keyslot 0: unsupported hash algorithm \"no-such-hash\"",
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["kdf"]["iterations"] = 0.into()),
            1,
            1,
            "keyslot 0: PBKDF2 with 0 iterations",
        ),
        (argon(0, 32768, 2), 1, 1, "keyslot 0: argon2id time 0"),
        (argon(1, 64, 16), 1, 1, "memory cost is too small"),
        (
            argon(1, 1024, 32),
            2,
            0,
            "No key available with this passphrase.",
        ),
    ];
    if overcommit_refuses_huge() {
        cases.push((
            argon(1, 4294967295, 1),
            3,
            3,
            "Not enough available memory to open a keyslot.",
        ));
    }
    for (edit, first, other, needle) in cases {
        let img = e.luks2();
        let o = e.dmkit(&[
            "luks",
            "add-key",
            "--key-file",
            &e.s("pass"),
            "--new-keyfile",
            &second,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            &img,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        edit_json(&img, |v| edit(v));
        for (pass, code) in [(e.s("pass"), first), (second.clone(), other)] {
            let args = ["luks", "test-passphrase", "--key-file", &pass, &img];
            if code == 0 {
                let o = e.dmkit(&args);
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            } else {
                e.refuses(&img, &args, code, needle);
            }
            if cs {
                let o = common::run::output(
                    "cryptsetup",
                    &["open", "--test-passphrase", "--key-file", &pass, &img],
                );
                assert_eq!(
                    o.status.code(),
                    Some(code),
                    "cryptsetup disagrees on {needle}"
                );
            }
        }
    }
}

/// Set the version field of the LUKS2 header copy at `offset` to `version`, and give the copy
/// a valid checksum again: only the version is wrong.
fn set_luks2_version(img: &str, offset: usize, version: u16) {
    let mut b = fs::read(img).unwrap();
    let hdr_size = u64::from_be_bytes(b[offset + 8..offset + 16].try_into().unwrap()) as usize;
    let copy = &mut b[offset..offset + hdr_size];
    copy[6..8].copy_from_slice(&version.to_be_bytes());
    copy[448..512].fill(0);
    let sum = Sha256::digest(&*copy);
    copy[448..480].copy_from_slice(&sum);
    fs::write(img, b).unwrap();
}

/// Whether cryptsetup accepts `img` with `args` (the image last), run on a copy: cryptsetup
/// repairs a damaged header copy as it reads, and the verdict must be on the image as made.
fn cryptsetup_accepts(e: &Workspace, img: &str, args: &[&str]) -> bool {
    let copy = e.s("cryptsetup-copy.img");
    fs::copy(img, &copy).unwrap();
    let mut all = args.to_vec();
    all.push(&copy);
    common::run::output("cryptsetup", &all).status.success()
}

#[test]
fn header_versions_get_cryptsetups_verdict() {
    // cryptsetup (`_crypt_load_luks`) decides by the version after the primary magic, whatever
    // the checksum: 1 is LUKS1, 2 (or no primary magic, or 0) is LUKS2 with the secondary copy
    // as fallback, anything else is refused ("Unsupported LUKS version 3."); `--type luks2`
    // reads LUKS2 whatever the primary's version, unless it is 1. The secondary copy must be
    // version 2 or it is damaged (the primary is used).
    let e = env();
    let cs = !common::env::tool_missing("cryptsetup", "cryptsetup-bin");
    let pass = e.s("pass");
    // (what, edits (copy offset, version), accepted by default, accepted with --type luks2,
    // what dmkit says when it refuses by default)
    type Case = (&'static str, Vec<(usize, u16)>, bool, bool, &'static str);
    let cases: Vec<Case> = vec![
        (
            "primary v3",
            vec![(0, 3)],
            false,
            true,
            "Unsupported LUKS version 3.",
        ),
        (
            "primary v65535",
            vec![(0, 65535)],
            false,
            true,
            "Unsupported LUKS version 65535.",
        ),
        ("primary v0", vec![(0, 0)], true, true, ""),
        ("secondary v3", vec![(16384, 3)], true, true, ""),
        ("secondary v1", vec![(16384, 1)], true, true, ""),
        (
            "primary v1 on a LUKS2 layout",
            vec![(0, 1)],
            false,
            false,
            "LUKS1 header",
        ),
        (
            "both v3",
            vec![(0, 3), (16384, 3)],
            false,
            false,
            "Unsupported LUKS version 3.",
        ),
    ];
    for (what, edits, default_ok, luks2_ok, needle) in cases {
        let img = e.luks2();
        for (offset, version) in edits {
            set_luks2_version(&img, offset, version);
        }
        let test = ["luks", "test-passphrase", "--key-file", &pass, &img];
        let typed = [
            "luks",
            "open",
            "--test-passphrase",
            "--type",
            "luks2",
            "--key-file",
            &pass,
            &img,
        ];
        if default_ok {
            let o = e.dmkit(&test);
            assert!(
                o.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let o = e.dmkit(&["luks", "dump", &img]);
            assert!(o.status.success(), "{what}: dump");
        } else {
            e.refuses(&img, &test, 1, needle);
            e.refuses(&img, &["luks", "dump", &img], 1, needle);
        }
        let o = e.dmkit(&typed);
        assert_eq!(o.status.success(), luks2_ok, "{what}: --type luks2");
        let o = e.dmkit(&["luks", "is-luks", &img]);
        assert_eq!(o.status.success(), default_ok, "{what}: is-luks");
        if cs {
            let open = ["open", "--test-passphrase", "--key-file", &pass];
            assert_eq!(
                cryptsetup_accepts(&e, &img, &open),
                default_ok,
                "{what}: cryptsetup open --test-passphrase disagrees"
            );
            assert_eq!(
                cryptsetup_accepts(&e, &img, &["luksDump"]),
                default_ok,
                "{what}: cryptsetup luksDump disagrees"
            );
            assert_eq!(
                cryptsetup_accepts(&e, &img, &["isLuks"]),
                default_ok,
                "{what}: cryptsetup isLuks disagrees"
            );
            let typed_cs = [
                "open",
                "--test-passphrase",
                "--type",
                "luks2",
                "--key-file",
                &pass,
            ];
            assert_eq!(
                cryptsetup_accepts(&e, &img, &typed_cs),
                luks2_ok,
                "{what}: cryptsetup open --type luks2 disagrees"
            );
        }
    }
}

#[test]
fn luks1_header_versions_get_cryptsetups_verdict() {
    // A LUKS1 header whose version says 3 is refused for its version; one that says 2 is read
    // as LUKS2 and has no LUKS2 header. cryptsetup agrees on both.
    let e = env();
    let cs = !common::env::tool_missing("cryptsetup", "cryptsetup-bin");
    let pass = e.s("pass");
    for (version, needle) in [(3u16, "Unsupported LUKS version 3."), (2, "LUKS2")] {
        let img = e.s("l1.img");
        fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
        let o = e.dmkit(&[
            "luks",
            "format",
            "-q",
            "--type",
            "luks1",
            "--key-file",
            &pass,
            "--pbkdf-force-iterations",
            "1000",
            &img,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
            f.write_all_at(&version.to_be_bytes(), 6).unwrap();
        }
        e.refuses(
            &img,
            &["luks", "test-passphrase", "--key-file", &pass, &img],
            1,
            needle,
        );
        if cs {
            let open = ["open", "--test-passphrase", "--key-file", &pass];
            assert!(
                !cryptsetup_accepts(&e, &img, &open),
                "LUKS1 v{version}: cryptsetup accepts it"
            );
        }
    }
}

#[test]
fn header_restore_takes_backups_by_cryptsetups_verdict() {
    // A backup is LUKS1 or LUKS2 by the version after its primary magic; without that magic
    // (or with version 0) it is no backup, even with a valid secondary copy. A version 3
    // primary is read as LUKS2 (its secondary copy), as cryptsetup does.
    let e = env();
    let cs = !common::env::tool_missing("cryptsetup", "cryptsetup-bin");
    for (version, accepted) in [(0u16, false), (3, true)] {
        let img = e.luks2();
        let backup = e.s("backup.img");
        fs::copy(&img, &backup).unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(&backup)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        set_luks2_version(&backup, 0, version);
        let args = [
            "luks",
            "header-restore",
            "-q",
            "--header-backup-file",
            &backup,
            &img,
        ];
        if accepted {
            let o = e.dmkit(&args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        } else {
            e.refuses(
                &img,
                &args,
                1,
                "Header backup file does not contain compatible LUKS header.",
            );
        }
        if cs {
            let restore = ["luksHeaderRestore", "-q", "--header-backup-file", &backup];
            assert_eq!(
                cryptsetup_accepts(&e, &e.luks2(), &restore),
                accepted,
                "backup v{version}: cryptsetup disagrees"
            );
        }
    }
}
