//! `dmkit integrity open|close|status` end to end: format, open (modes J, B, D, R), write
//! through the served file, close, reopen, read back; a flipped bit answered with EIO and
//! counted in `status`; a wrong key refused in one line; ext4 on the loop device.
//!
//! Needs root and /dev/fuse (loop devices for the ext4 case): missing ones fail the test when
//! `CI` is set and skip it otherwise.

mod common;

use common::env::{fuse_missing, loop_missing, tool_missing};
use common::rng::SplitMix64;
use common::run::Workspace;
use dmkit::integrity::rw_meta::{Layout, RawSuperblock};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

const SIZE: u64 = 16 << 20;

fn served(ws: &Workspace, args: &[&str], name: &str) -> String {
    let out = ws.dmkit(args);
    assert!(
        out.status.success(),
        "dmkit {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ws.run.track(name);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .expect("the served path")
        .to_string()
}

fn status(ws: &Workspace, name: &str) -> serde_json::Value {
    let s = ws.run.ok(&["integrity", "status", name, "--json"]);
    serde_json::from_str(&s).unwrap()
}

#[test]
fn open_write_close_reopen_in_every_mode() {
    if fuse_missing() {
        return;
    }
    let ws = Workspace::new();
    let img = ws.sparse("img", SIZE);
    ws.run.ok(&[
        "integrity",
        "format",
        "--batch-mode",
        "--sector-size",
        "4096",
        &img,
    ]);
    let data = SplitMix64(5).bytes(1 << 20);
    let mut expect = Vec::new();
    for (round, mode) in [
        &[][..],
        &["-B"][..],
        &["--integrity-no-journal"][..],
        &[][..],
    ]
    .iter()
    .enumerate()
    {
        let mut args = vec!["integrity", "open", &img, "it"];
        args.extend_from_slice(mode);
        let path = served(&ws, &args, "it");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let size = f.metadata().unwrap().len();
        if expect.is_empty() {
            expect = vec![0u8; size as usize];
        }
        let at = (round as u64 * 3 + 1) << 20;
        f.write_all_at(&data, at).unwrap();
        f.sync_all().unwrap();
        expect[at as usize..at as usize + data.len()].copy_from_slice(&data);
        let mut back = vec![0u8; size as usize];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == expect, "round {round}: read back while open");
        drop(f);
        let v = status(&ws, "it");
        assert_eq!(v["kind"], "integrity");
        let letter = ["J", "B", "D", "J"][round];
        assert_eq!(v["details"]["integrity_mode"], letter, "{v}");
        assert_eq!(v["details"]["sector_size"], 4096);
        assert_eq!(v["details"]["integrity"], "crc32c");
        assert_eq!(v["stats"]["corruptions"], 0);
        assert!(v["stats"]["blocks_written"].as_u64().unwrap() >= 256, "{v}");
        ws.run.close("it");
    }
    // Recovery mode: read-only, unchecked, and the same data.
    let path = served(
        &ws,
        &["integrity", "open", &img, "it", "--integrity-recovery-mode"],
        "it",
    );
    let back = std::fs::read(&path).unwrap();
    assert!(back == expect, "recovery mode reads the data");
    assert!(
        OpenOptions::new().write(true).open(&path).is_err(),
        "recovery mode is read-only"
    );
    ws.run.close("it");
}

#[test]
fn a_flipped_bit_is_eio_and_counted() {
    if fuse_missing() {
        return;
    }
    let ws = Workspace::new();
    let img = ws.sparse("img", SIZE);
    ws.run.ok(&["integrity", "format", "--batch-mode", &img]);
    let raw = std::fs::read(&img).unwrap();
    let l = Layout::from_superblock(&RawSuperblock(raw[..4096].to_vec()), SIZE / 512).unwrap();
    let block = 1000u64;
    common::xor_byte(
        std::path::Path::new(&img),
        l.data_sector(block) * 512 + 100,
        0x04,
    );
    let path = served(&ws, &["integrity", "open", &img, "it", "-B"], "it");
    let f = OpenOptions::new().read(true).open(&path).unwrap();
    let mut b = [0u8; 512];
    let e = f.read_exact_at(&mut b, block * 512).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Another page (the page cache reads whole pages) reads fine.
    f.read_exact_at(&mut b, (block + 64) * 512).unwrap();
    drop(f);
    let v = status(&ws, "it");
    // The kernel may ask again (readahead, then the page alone): each failed read counts.
    let n = v["stats"]["corruptions"].as_u64().unwrap();
    assert!(n >= 1, "{v}");
    assert_eq!(
        v["export"]["corruptions"], n,
        "every mismatch reached a reader: {v}"
    );
    let text = ws.run.ok(&["integrity", "status", "it"]);
    assert!(
        text.contains("corruptions:") && text.contains("integrity mode:"),
        "{text}"
    );
    ws.run.close("it");
}

#[test]
fn a_wrong_key_is_one_line_and_no_device() {
    if fuse_missing() {
        return;
    }
    let ws = Workspace::new();
    let img = ws.sparse("img", SIZE);
    std::fs::write(ws.path("key"), [7u8; 32]).unwrap();
    std::fs::write(ws.path("bad"), [8u8; 32]).unwrap();
    let key = ws.s("key");
    ws.run.ok(&[
        "integrity",
        "format",
        "--batch-mode",
        "-I",
        "hmac-sha256",
        "--integrity-key-file",
        &key,
        &img,
    ]);
    let out = ws.dmkit(&[
        "integrity",
        "open",
        &img,
        "it",
        "-I",
        "hmac-sha256",
        "--integrity-key-file",
        &ws.s("bad"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("wrong --integrity algorithm or key"), "{err}");
    let out = ws.dmkit(&["integrity", "open", &img, "it", "-I", "sha256"]);
    assert_eq!(out.status.code(), Some(1));
    served(
        &ws,
        &[
            "integrity",
            "open",
            &img,
            "it",
            "-I",
            "hmac-sha256",
            "--integrity-key-file",
            &key,
        ],
        "it",
    );
    ws.run.close("it");
}

#[test]
fn ext4_on_the_loop_device_survives_close_and_reopen() {
    if fuse_missing() || loop_missing() || tool_missing("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let ws = Workspace::new();
    let img = ws.sparse("img", 64 << 20);
    ws.run.ok(&[
        "integrity",
        "format",
        "--batch-mode",
        "--sector-size",
        "4096",
        &img,
    ]);
    let out = ws.dmkit(&["integrity", "open", &img, "it", "--loop"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ws.run.track("it");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let lo = stdout.lines().nth(1).expect("loop device").to_string();
    common::run::ok("mkfs.ext4", &["-q", "-F", &lo]);
    common::run::ok("e2fsck", &["-fn", &lo]);
    ws.run.close("it");
    let out = ws.dmkit(&["integrity", "open", &img, "it", "--loop", "-B"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ws.run.track("it");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let lo = stdout.lines().nth(1).expect("loop device").to_string();
    common::run::ok("e2fsck", &["-fn", &lo]);
    ws.run.close("it");
}
