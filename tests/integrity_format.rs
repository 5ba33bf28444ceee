//! `dmkit integrity format|dump|verify` on the host, against integritysetup's view.
//!
//! - `dumps_equal_the_kernels`: for ten option sets, `integritysetup dump` of the image dmkit
//!   formatted prints what it printed in the guest for the image the Debian 6.1 kernel
//!   formatted with the same options (the numbers below were read off the guest's dumps:
//!   `tests/kernel_integrity_format.rs` checks them against a live kernel), and `dmkit
//!   integrity dump` prints exactly what `integritysetup dump` prints; the wiped images
//!   verify clean.
//! - `bad_input_*`: wrong magic, a wrong field, a truncated device, a layout that does not fit,
//!   no integrity at all, a key file of the wrong size, bad option values: one clear line,
//!   exit 1, and the file byte-identical.
//! - `verify_*`: a flipped data byte or tag byte is named at its sector (exit 2), a wrong key
//!   fails every block, JSON lists the same.

mod common;

use common::env::tool_missing;
use common::run::{ok, output, Workspace};
use common::xor_byte;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// One option set and what the kernel made of it on an 8 MiB device: superblock version,
/// log2 interleave, tag size, journal sections, provided sectors, sector size, log2 blocks per
/// bitmap bit.
struct Case {
    opts: &'static [&'static str],
    key: Option<usize>,
    fields: (u8, u8, u16, u32, u64, u32, u8),
}

const CASES: &[Case] = &[
    Case {
        opts: &[],
        key: None,
        fields: (5, 15, 4, 1, 15944, 512, 15),
    },
    Case {
        opts: &["--integrity", "sha256", "--sector-size", "4096"],
        key: None,
        fields: (5, 15, 32, 1, 15856, 4096, 12),
    },
    Case {
        opts: &[
            "--integrity",
            "crc32",
            "--tag-size",
            "8",
            "--interleave-sectors",
            "512",
            "--journal-size",
            "65536",
        ],
        key: None,
        fields: (5, 9, 8, 1, 15944, 512, 15),
    },
    Case {
        opts: &["--integrity", "hmac-sha256", "--integrity-key-size", "32"],
        key: Some(32),
        fields: (5, 15, 32, 1, 14240, 512, 15),
    },
    Case {
        opts: &["-B", "--integrity", "sha1", "--sector-size", "1024"],
        key: None,
        fields: (5, 15, 20, 1, 15568, 1024, 14),
    },
    Case {
        opts: &[
            "--integrity-no-journal",
            "--tag-size",
            "2",
            "--sector-size",
            "2048",
            "--journal-size",
            "20000",
        ],
        key: None,
        fields: (5, 15, 2, 1, 16016, 2048, 13),
    },
    Case {
        opts: &[
            "--integrity",
            "sha1",
            "--interleave-sectors",
            "64",
            "--buffer-sectors",
            "16",
        ],
        key: None,
        fields: (5, 6, 20, 1, 14464, 512, 15),
    },
    Case {
        opts: &["--tag-size", "3", "--interleave-sectors", "1000"],
        key: None,
        fields: (5, 9, 3, 1, 15944, 512, 15),
    },
    Case {
        opts: &[
            "--integrity",
            "hmac-sha256",
            "--integrity-key-size",
            "16",
            "--tag-size",
            "16",
            "--sector-size",
            "4096",
        ],
        key: Some(16),
        fields: (5, 15, 16, 1, 15920, 4096, 12),
    },
    Case {
        opts: &[
            "--integrity",
            "crc32",
            "--tag-size",
            "8",
            "--sector-size",
            "1024",
        ],
        key: None,
        fields: (5, 15, 8, 1, 15872, 1024, 14),
    },
];

fn expected_dump(device: &str, f: (u8, u8, u16, u32, u64, u32, u8)) -> String {
    format!(
        "Info for integrity device {device}.\nsuperblock_version {}\nlog2_interleave_sectors {}\n\
         integrity_tag_size {}\njournal_sections {}\nprovided_data_sectors {}\nsector_size {}\n\
         log2_blocks_per_bitmap {}\nflags fix_padding fix_hmac \n",
        f.0, f.1, f.2, f.3, f.4, f.5, f.6
    )
}

/// The options that open (and verify) what `opts` formatted: the algorithm ones.
fn alg_opts(opts: &[&str], key: Option<&str>) -> Vec<String> {
    let mut v = Vec::new();
    let mut i = 0;
    while i < opts.len() {
        if matches!(opts[i], "--integrity" | "--integrity-key-size") {
            v.push(opts[i].to_string());
            v.push(opts[i + 1].to_string());
            i += 2;
        } else {
            i += 1 + usize::from(matches!(
                opts[i],
                "--tag-size"
                    | "--sector-size"
                    | "--interleave-sectors"
                    | "--journal-size"
                    | "--buffer-sectors"
            ));
        }
    }
    if let Some(k) = key {
        v.push("--integrity-key-file".into());
        v.push(k.into());
    }
    v
}

fn key_file(ws: &Workspace, len: usize) -> String {
    let name = format!("key{len}");
    std::fs::write(ws.path(&name), vec![b'K'; len]).unwrap();
    ws.s(&name)
}

#[test]
fn dumps_equal_the_kernels() {
    let have_tool = !tool_missing("integritysetup", "cryptsetup-bin");
    let ws = Workspace::new();
    for (i, c) in CASES.iter().enumerate() {
        for wipe in [false, true] {
            let img = ws.sparse(&format!("c{i}-{wipe}.img"), 8 * MIB);
            let key = c.key.map(|n| key_file(&ws, n));
            let mut args: Vec<String> = vec![
                "integrity".into(),
                "format".into(),
                "-q".into(),
                img.clone(),
            ];
            args.extend(c.opts.iter().map(|s| s.to_string()));
            if let Some(k) = &key {
                args.extend(["--integrity-key-file".to_string(), k.clone()]);
            }
            if !wipe {
                args.push("--no-wipe".into());
            }
            ok(common::DMKIT, &args);
            let want = expected_dump(&img, c.fields);
            let ours = ok(common::DMKIT, &["integrity", "dump", &img]);
            assert_eq!(ours, want, "case {i}: {:?}", c.opts);
            if have_tool {
                let theirs = ok("integritysetup", &["dump", &img]);
                assert_eq!(
                    theirs, want,
                    "case {i}: integritysetup dump of {:?}",
                    c.opts
                );
            }
            let j: serde_json::Value =
                serde_json::from_str(&ok(common::DMKIT, &["integrity", "dump", "--json", &img]))
                    .unwrap();
            assert_eq!(j["provided_data_sectors"], c.fields.4);
            assert_eq!(j["flags"], serde_json::json!(["fix_padding", "fix_hmac"]));
            if wipe {
                let mut v = vec!["integrity".to_string(), "verify".into(), img.clone()];
                v.extend(alg_opts(c.opts, key.as_deref()));
                let out = ok(common::DMKIT, &v);
                assert!(out.contains("no corruption"), "case {i}: {out}");
            }
        }
    }
}

/// Runs dmkit, which must fail with exit `code` and one line on stderr containing `needle`;
/// the files in `untouched` must be byte-identical afterwards.
fn refused(args: &[&str], code: i32, needle: &str, untouched: &[&Path]) {
    let before: Vec<Vec<u8>> = untouched
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let out = output(common::DMKIT, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: not one line: {stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{args:?}: {stderr:?} lacks {needle:?}"
    );
    for (p, b) in untouched.iter().zip(before) {
        assert!(
            std::fs::read(p).unwrap() == b,
            "{args:?} changed {}",
            p.display()
        );
    }
}

#[test]
fn bad_input_superblocks_are_refused_by_name() {
    let ws = Workspace::new();
    let img = ws.sparse("a.img", 8 * MIB);
    ok(
        common::DMKIT,
        &["integrity", "format", "-q", &img, "--no-wipe"],
    );
    let p = ws.path("a.img");
    // Not integrity at all: zeros, random bytes, another format's magic.
    let zero = ws.sparse("zero.img", MIB);
    let junk = ws.path("junk.img");
    std::fs::write(&junk, common::rng::bytes(7, MIB as usize)).unwrap();
    for f in [&zero, &junk.display().to_string()] {
        for cmd in ["dump", "verify"] {
            refused(
                &["integrity", cmd, f],
                1,
                "not a dm-integrity device",
                &[Path::new(f)],
            );
        }
    }
    // A wrong version and a tag size the kernel refuses.
    for (off, val, field) in [(8u64, 9u8, "version"), (11, 0xff, "integrity_tag_size")] {
        let bad = ws.path(&format!("bad{off}.img"));
        std::fs::copy(&p, &bad).unwrap();
        xor_byte(&bad, off, val ^ std::fs::read(&bad).unwrap()[off as usize]);
        let b = bad.display().to_string();
        for cmd in ["dump", "verify"] {
            refused(&["integrity", cmd, &b], 1, field, &[&bad]);
        }
    }
    // Truncated: half the device gone, and a file shorter than a superblock.
    let short = ws.path("short.img");
    std::fs::copy(&p, &short).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    let s = short.display().to_string();
    refused(
        &["integrity", "verify", &s],
        1,
        "provided_data_sectors",
        &[&short],
    );
    let tiny = ws.path("tiny.img");
    std::fs::write(&tiny, &std::fs::read(&p).unwrap()[..100]).unwrap();
    let t = tiny.display().to_string();
    refused(&["integrity", "dump", &t], 1, "truncated", &[&tiny]);
}

#[test]
fn bad_input_format_options_write_nothing() {
    let ws = Workspace::new();
    let img = ws.sparse("a.img", 8 * MIB);
    let p = ws.path("a.img");
    let small = ws.sparse("small.img", 32 << 10);
    let k16 = key_file(&ws, 16);
    let cases: &[(&[&str], &str)] = &[
        (&["--sector-size", "1000"], "--sector-size"),
        (&["--sector-size", "8192"], "--sector-size"),
        (&["--tag-size", "0"], "--tag-size"),
        (&["--tag-size", "1000"], "--tag-size"),
        (&["--journal-watermark", "101"], "--journal-watermark"),
        (&["--journal-size", "99999999999999"], "--journal-size"),
        (&["--integrity", "md5"], "--integrity"),
        (&["--integrity", "hmac-sha256"], "--integrity-key-file"),
        (
            &["--integrity", "hmac-sha256", "--integrity-key-file", &k16],
            "--integrity-key-file",
        ),
        (
            &[
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                &k16,
                "--integrity-key-size",
                "32",
            ],
            "--integrity-key-file",
        ),
        (&["--integrity-key-file", &k16], "takes no key"),
        (&["--data-device", &img], "is the device itself"),
        (&["-B", "-D"], "exclude each other"),
        (
            &["--bitmap-sectors-per-bit", "64"],
            "--bitmap-sectors-per-bit",
        ),
        (&["--salt", "00"], "--salt"),
    ];
    for (opts, needle) in cases {
        let mut args = vec!["integrity", "format", "-q", img.as_str()];
        args.extend_from_slice(opts);
        refused(&args, 1, needle, &[&p]);
    }
    // A device too small for the layout: the message names the file.
    let sp = ws.path("small.img");
    refused(
        &["integrity", "format", "-q", &small],
        1,
        &format!("{small}: device of 64 sectors"),
        &[&sp],
    );
}

#[test]
fn verify_names_corrupt_sectors() {
    let ws = Workspace::new();
    let img = ws.sparse("a.img", 8 * MIB);
    let p = ws.path("a.img");
    let k = key_file(&ws, 32);
    ok(
        common::DMKIT,
        &[
            "integrity",
            "format",
            "-q",
            &img,
            "--integrity",
            "hmac-sha256",
            "--integrity-key-file",
            &k,
            "--sector-size",
            "4096",
            "--interleave-sectors",
            "256",
        ],
    );
    let v = |extra: &[&str]| {
        let mut a = vec![
            "integrity",
            "verify",
            img.as_str(),
            "--integrity",
            "hmac-sha256",
            "--integrity-key-file",
            k.as_str(),
        ];
        a.extend_from_slice(extra);
        output(common::DMKIT, &a)
    };
    assert!(v(&[]).status.success());
    // Read the layout from the JSON dump: the data of sector 256 (second area) and the tag
    // of sector 4096.
    let j: serde_json::Value =
        serde_json::from_str(&ok(common::DMKIT, &["integrity", "dump", "--json", &img])).unwrap();
    let init = j["layout"]["initial_sectors"].as_u64().unwrap();
    let run = j["layout"]["metadata_run_sectors"].as_u64().unwrap();
    let il = j["layout"]["interleave_sectors"].as_u64().unwrap();
    assert_eq!(il, 256);
    let data_256 = (init + il + 2 * run) * 512; // area 1's data
    let area_16 = 4096 / il;
    let tag_4096 = (init + area_16 * (il + run)) * 512; // first tag of area 16
    xor_byte(&p, data_256 + 100, 1);
    xor_byte(&p, tag_4096 + 3, 0x80);
    let out = v(&[]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("2 of "), "{stdout}");
    assert!(stdout.contains("sectors 256, 4096"), "{stdout}");
    let out = v(&["--json"]);
    assert_eq!(out.status.code(), Some(2));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["bad_sectors"], serde_json::json!([256, 4096]));
    assert_eq!(j["journal"]["state"], "clean");
    // The wrong key: said as `open` says it (exit 1, wrong parameters), not every block
    // reported corrupt.
    let k2 = ws.path("key-other");
    std::fs::write(&k2, vec![b'L'; 32]).unwrap();
    let out = output(
        common::DMKIT,
        &[
            "integrity",
            "verify",
            &img,
            "--integrity",
            "hmac-sha256",
            "--integrity-key-file",
            k2.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("wrong --integrity algorithm or key") && err.contains("a.img"),
        "{err}"
    );
}

#[test]
fn verify_refuses_a_journal_with_garbage_commit_ids() {
    let ws = Workspace::new();
    let img = ws.sparse("a.img", 8 * MIB);
    ok(common::DMKIT, &["integrity", "format", "-q", &img]);
    // The commit id of the journal's first sector (right after the 8-sector superblock area).
    xor_byte(&ws.path("a.img"), 8 * 512 + 508, 0x5a);
    let out = output(common::DMKIT, &["integrity", "verify", &img]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("journal is corrupt") && stdout.contains("section 0 sector 0"),
        "{stdout}"
    );
    let out = output(common::DMKIT, &["integrity", "verify", &img, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["journal"]["state"], "unreadable");
    assert_eq!(j["bad_sectors"], serde_json::json!([]));
}
