//! `dmkit luks format` and cryptsetup 2.6.1's `luksFormat` on the same inputs give the same
//! verdict and the same layout: the cases of cryptsetup's compat-test2 "[1] Data offset" and
//! "[28] Detached LUKS header" (a 16 MiB detached header whose data offset, 64 MiB, lies
//! beyond the 40 MiB data device), the sector size chosen with and without `--offset`, a
//! device with no room for data (formatted, with cryptsetup's warning); and the LUKS2-only
//! options refused with `--type luks1` with cryptsetup's messages and exit codes (compat-test2
//! "--luks2-metadata-size with luks1"). Needs cryptsetup: skips without it, fails under CI=1.

mod common;

use common::env::tool_missing;
use common::run::{dmkit, Workspace};
use std::fs;
use std::process::{Command, Stdio};

/// Cheap keyslots: the tests are about layouts, not the KDF.
const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// A workspace whose `pass` file holds the passphrase, or `None` without cryptsetup.
fn workspace() -> Option<Workspace> {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return None;
    }
    let e = Workspace::new();
    fs::write(e.path("pass"), "agree").unwrap();
    Some(e)
}

/// What a format left: exit code, keyslots area, data offset, sector size, header file size.
type Verdict = (Option<i32>, String, u64);

fn layout(dump: &str) -> String {
    let pick = |key: &str| {
        dump.lines()
            .find(|l| l.trim_start().starts_with(key))
            .map(|l| {
                l.split_whitespace()
                    .nth(key.split_whitespace().count())
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default()
    };
    format!(
        "keyslots={} offset={} sector={} payload={}",
        pick("Keyslots area:"),
        pick("offset:"),
        pick("sector:"),
        pick("Payload offset:")
    )
}

fn cs_dump(path: &str) -> String {
    let o = Command::new("cryptsetup")
        .args(["luksDump", path])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Format a fresh `size`-byte device with `args` (and a fresh detached header when `detached`)
/// by cryptsetup (`ours` false) or dmkit.
fn format(e: &Workspace, ours: bool, size: u64, detached: bool, args: &[&str]) -> Verdict {
    let img = e.s("dev.img");
    let hdr = e.s("hdr.img");
    let _ = fs::remove_file(&img);
    let _ = fs::remove_file(&hdr);
    e.sparse("dev.img", size);
    let pass = e.s("pass");
    let mut all: Vec<&str> = [FAST, &["--key-file", &pass]].concat();
    if detached {
        all.extend(["--header", hdr.as_str()]);
    }
    all.extend(args);
    all.push(&img);
    let code = if ours {
        let mut a = vec!["luks", "format", "--batch-mode"];
        a.extend(&all);
        dmkit(e.run.path(), &a).assert_no_panic().code
    } else {
        let mut a = vec!["luksFormat", "--batch-mode"];
        a.extend(&all);
        Command::new("cryptsetup")
            .args(&a)
            .stdin(Stdio::null())
            .output()
            .unwrap()
            .status
            .code()
    };
    let on = if detached { &hdr } else { &img };
    let file = fs::metadata(on).map(|m| m.len()).unwrap_or(0);
    let text = if code == Some(0) {
        layout(&cs_dump(on))
    } else {
        String::new()
    };
    (code, text, if code == Some(0) { file } else { 0 })
}

#[test]
fn layouts_and_sector_sizes_agree_with_cryptsetup() {
    let Some(e) = workspace() else { return };
    const M: u64 = 1 << 20;
    let cases: &[(u64, bool, &[&str])] = &[
        // compat-test2 [1]
        (40 * M, false, &["--offset", "1"]),
        (40 * M, false, &["--offset", "16385"]),
        (40 * M, false, &["--offset", "32"]),
        (40 * M, false, &["--offset", "16384"]),
        (
            40 * M,
            false,
            &["--sector-size", "1024", "--offset", "16384"],
        ),
        (40 * M, true, &["--offset", "80000"]),
        // compat-test2 [28]: exactly 16 MiB of detached header, data offset beyond the device
        (
            40 * M,
            true,
            &[
                "--luks2-keyslots-size",
                "16352k",
                "--luks2-metadata-size",
                "16k",
                "--offset",
                "131072",
            ],
        ),
        (40 * M, true, &[]),
        (40 * M, true, &["--offset", "4096"]),
        (32 * M, true, &["--offset", "2048"]),
        // the automatic sector size: --offset counted in sectors, device size less 1 MiB
        (32 * M, false, &["--offset", "2048"]),
        (32 * M, false, &["--offset", "8200"]),
        (32 * M, false, &["--offset", "12288"]),
        (32 * M + 2048, false, &[]),
        (32 * M + 2048, false, &["--offset", "4096"]),
        (
            40 * M,
            false,
            &["--luks2-keyslots-size", "4M", "--offset", "4096"],
        ),
        (32 * M, false, &["--luks2-keyslots-size", "1M"]),
        // no room for data: formatted anyway (the image grows to hold the metadata)
        (8 * M, false, &[]),
        (20 * M, false, &["--offset", "40960"]),
    ];
    let mut bad = Vec::new();
    for (size, detached, args) in cases {
        let theirs = format(&e, false, *size, *detached, args);
        let ours = format(&e, true, *size, *detached, args);
        if theirs != ours {
            bad.push(format!(
                "size {size} detached {detached} {args:?}: cryptsetup {theirs:?}, dmkit {ours:?}"
            ));
        }
    }
    assert!(bad.is_empty(), "disagreements:\n{}", bad.join("\n"));
    // The warning cryptsetup prints for a device with no room for data.
    e.sparse("small.img", 8 * M);
    let pass = e.s("pass");
    let small = e.s("small.img");
    let head = ["luks", "format", "--batch-mode"];
    let r = dmkit(
        e.run.path(),
        &[&head[..], FAST, &["--key-file", &pass, &small]].concat(),
    );
    r.assert_ok();
    assert!(
        r.stdout
            .contains("is too small for activation, there is no remaining space for data."),
        "{}",
        r.describe()
    );
}

/// LUKS1 with a detached header (`--type luks1 --header`): the same verdicts, payload offset
/// and header file size as cryptsetup, and each tool opens the other's.
#[test]
fn luks1_detached_headers_agree_with_cryptsetup() {
    let Some(e) = workspace() else { return };
    const M: u64 = 1 << 20;
    let cases: &[(u64, &[&str])] = &[
        (20 * M, &[]),
        (20 * M, &["--key-size", "256"]),
        (20 * M, &["--offset", "4096"]),
        (20 * M, &["--offset", "8"]),
        (20 * M, &["--offset", "4040"]),
        (20 * M, &["--offset", "100"]),
        (M, &["--offset", "4096"]),
    ];
    let mut bad = Vec::new();
    for (size, args) in cases {
        let all = [&["--type", "luks1"][..], args].concat();
        let theirs = format(&e, false, *size, true, &all);
        let ours = format(&e, true, *size, true, &all);
        if theirs != ours {
            bad.push(format!(
                "size {size} {args:?}: cryptsetup {theirs:?}, dmkit {ours:?}"
            ));
        }
    }
    assert!(bad.is_empty(), "disagreements:\n{}", bad.join("\n"));
    // Each tool opens the other's detached LUKS1 header.
    let pass = e.s("pass");
    let (img, hdr) = (e.s("dev.img"), e.s("hdr.img"));
    for ours in [true, false] {
        format(&e, ours, 20 * M, true, &["--type", "luks1"]);
        let args = [
            "--test-passphrase",
            "--key-file",
            &pass,
            "--header",
            &hdr,
            &img,
        ];
        let code = if ours {
            Command::new("cryptsetup")
                .arg("open")
                .args(args)
                .status()
                .unwrap()
                .code()
        } else {
            dmkit(e.run.path(), &[&["luks", "open"][..], &args].concat())
                .assert_no_panic()
                .code
        };
        assert_eq!(code, Some(0), "formatted by dmkit: {ours}");
    }
}

#[test]
fn luks2_only_options_with_luks1_are_refused_as_cryptsetup_refuses_them() {
    let Some(e) = workspace() else { return };
    let pass = e.s("pass");
    for (args, message) in [
        (
            &["--sector-size", "4096"][..],
            Some("Unsupported encryption sector size."),
        ),
        (
            &["--luks2-metadata-size", "32k"][..],
            Some("Unsupported LUKS2 metadata size options."),
        ),
        (
            &["--luks2-keyslots-size", "2M"][..],
            Some("Unsupported LUKS2 metadata size options."),
        ),
        (
            &[
                "--key-size",
                "256",
                "--luks2-metadata-size=128k",
                "--luks2-keyslots-size=128k",
            ][..],
            Some("Unsupported LUKS2 metadata size options."),
        ),
        (
            &["--integrity", "hmac-sha256"][..],
            Some("Integrity option can be used only for LUKS2 format."),
        ),
        (
            &["--offset", "4097"][..],
            Some("Data offset is not multiple of 4096 bytes."),
        ),
        // Accepted by cryptsetup (the label is not stored in LUKS1).
        (&["--label", "x"][..], None),
        (&["--subsystem", "x"][..], None),
        (&["--sector-size", "512"][..], None),
        (&["--volume-key-file", "/dev/urandom"][..], None),
    ] {
        let img = e.sparse("l1.img", 20 << 20);
        let mut common_args = vec![
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            pass.as_str(),
        ];
        common_args.extend(args);
        common_args.push(&img);
        let mut theirs = vec!["luksFormat", "--batch-mode"];
        theirs.extend(&common_args);
        let c = Command::new("cryptsetup")
            .args(&theirs)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let mut ours = vec!["luks", "format", "--batch-mode"];
        ours.extend(&common_args);
        let r = dmkit(e.run.path(), &ours);
        match message {
            Some(m) => {
                assert_eq!(c.status.code(), Some(1), "cryptsetup {args:?}");
                assert!(
                    String::from_utf8_lossy(&c.stderr).contains(m),
                    "cryptsetup {args:?}"
                );
                common::run::assert_refused(&r, 1, &[&[m]]);
            }
            None => {
                assert_eq!(c.status.code(), Some(0), "cryptsetup {args:?}");
                r.assert_ok();
                let d = cs_dump(&img);
                assert!(
                    d.contains("Version:       \t1"),
                    "{args:?}: not LUKS1:\n{d}"
                );
            }
        }
    }
}
