//! What `dmkit integrity` refuses before it serves or scrubs anything: a superblock `dump`
//! refuses is refused by `open` and `verify` too, with the same one-line error naming the file
//! and the field; and `verify` with another `--integrity` algorithm or key than the format's
//! says so, as `open` does, instead of reporting every block corrupt.
//!
//! Nothing here mounts: the refusals come before the export, so no root or FUSE is needed.

mod common;

use common::env::tool_missing;
use common::run::{assert_refused, Run, Workspace};

const SIZE: u64 = 8 << 20;

/// `dmkit args...` in the workspace's run directory, as a [`Run`].
fn run(ws: &Workspace, args: &[&str]) -> Run {
    ws.run.run(args)
}

/// A formatted image `name` (`--batch-mode`, plus `extra` options).
fn formatted(ws: &Workspace, name: &str, extra: &[&str]) -> String {
    let img = ws.sparse(name, SIZE);
    let mut args = vec!["integrity", "format", "--batch-mode"];
    args.extend_from_slice(extra);
    args.push(&img);
    run(ws, &args).assert_ok();
    img
}

#[test]
fn a_version_6_superblock_is_refused_by_dump_verify_and_open_alike() {
    let ws = Workspace::new();
    let img = formatted(&ws, "v6.img", &[]);
    // Superblock version is byte 8; 6 is inline mode (tags in the device's integrity
    // profile), which integritysetup 2.6 does not read either.
    common::xor_byte(std::path::Path::new(&img), 8, 5 ^ 6);
    let dump = run(&ws, &["integrity", "dump", &img]);
    assert_refused(&dump, 1, &[&["v6.img"], &["version"], &["6"]]);
    let open = run(&ws, &["integrity", "open", &img, "v6"]);
    assert_refused(&open, 1, &[&["v6.img"], &["version"], &["6"]]);
    // The same words: one check, not two that could drift apart.
    assert_eq!(open.stderr, dump.stderr);
    let verify = run(&ws, &["integrity", "verify", &img]);
    assert_refused(&verify, 1, &[&["v6.img"], &["version"]]);
    assert_eq!(verify.stderr, dump.stderr);
    if !tool_missing("integritysetup", "cryptsetup-bin") {
        let theirs = common::run::text("integritysetup", &["dump", &img]);
        assert_ne!(theirs.code, Some(0), "integritysetup accepted version 6");
    }
    // Version 5 again: everything accepts it.
    common::xor_byte(std::path::Path::new(&img), 8, 5 ^ 6);
    run(&ws, &["integrity", "dump", &img]).assert_ok();
    run(&ws, &["integrity", "verify", &img]).assert_ok();
}

#[test]
fn verify_with_another_algorithm_or_key_says_so_instead_of_all_corrupt() {
    let ws = Workspace::new();
    let sha = formatted(&ws, "sha.img", &["--integrity", "sha256"]);
    // The format's algorithm: clean, exit 0.
    let good = run(&ws, &["integrity", "verify", "--integrity", "sha256", &sha]);
    good.assert_ok();
    assert!(good.stdout.contains("no corruption"), "{}", good.describe());
    // The default (crc32c) on a sha256 image: wrong algorithm, exit 1 (wrong parameters, as
    // `open` answers), not 2 (corruption found).
    let wrong = run(&ws, &["integrity", "verify", &sha]);
    assert_refused(
        &wrong,
        1,
        &[
            &["sha.img"],
            &["wrong --integrity algorithm or key"],
            &["crc32c"],
        ],
    );
    assert!(!wrong.stdout.contains("corrupt"), "{}", wrong.describe());

    std::fs::write(ws.path("key"), [7u8; 32]).unwrap();
    std::fs::write(ws.path("other"), [8u8; 32]).unwrap();
    let (key, other) = (ws.s("key"), ws.s("other"));
    let hmac = formatted(
        &ws,
        "hmac.img",
        &["--integrity", "hmac-sha256", "--integrity-key-file", &key],
    );
    let verify = |k: &str| {
        run(
            &ws,
            &[
                "integrity",
                "verify",
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                k,
                &hmac,
            ],
        )
    };
    verify(&key).assert_ok();
    assert_refused(
        &verify(&other),
        1,
        &[&["hmac.img"], &["wrong --integrity algorithm or key"]],
    );
    // `open` says the same about the same key.
    let open = run(
        &ws,
        &[
            "integrity",
            "open",
            &hmac,
            "h",
            "--integrity",
            "hmac-sha256",
            "--integrity-key-file",
            &other,
        ],
    );
    assert_refused(&open, 1, &[&["wrong --integrity algorithm or key"]]);
}

#[test]
fn verify_still_reports_real_corruption_as_corruption() {
    let ws = Workspace::new();
    let img = formatted(&ws, "c.img", &[]);
    let dump = run(&ws, &["integrity", "dump", "--json", &img]).ok();
    let j: serde_json::Value = serde_json::from_str(&dump.stdout).unwrap();
    // One flipped bit in the first data sector: one block corrupt, exit 2.
    let data = j["layout"]["initial_sectors"].as_u64().unwrap()
        + j["layout"]["metadata_run_sectors"].as_u64().unwrap();
    common::xor_byte(std::path::Path::new(&img), data * 512 + 100, 0x01);
    let r = run(&ws, &["integrity", "verify", &img]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stdout.contains("1 of "), "{}", r.describe());
}
