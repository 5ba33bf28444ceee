//! LUKS2 reencryption interop with cryptsetup 2.6.1, both directions: what `dmkit luks
//! reencrypt` writes, cryptsetup opens and resumes; what cryptsetup leaves (killed mid-way),
//! dmkit finishes. The plaintext is checked independently of dmkit: the volume key comes from
//! `cryptsetup luksDump --dump-volume-key` and the data is decrypted with OpenSSL's AES-XTS.
//!
//! Kills are SIGKILL at a random moment once the reencryption metadata is on disk, with
//! small hotzones so that they land inside the hotzone loop; a header left with a hotzone
//! `in-reencryption` goes through `cryptsetup repair` before `reencrypt --resume-only`, as
//! cryptsetup requires. The `none` resilience is only run to completion: by design (and in
//! cryptsetup) a crash inside one of its hotzones loses that hotzone.

mod common;

use common::env::tool_missing;
use common::rng::SplitMix64;
use common::run::{ok as run, Workspace};
use common::DMKIT;
use openssl::symm::Mode;
use serde_json::Value;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Command;
use std::time::Duration;

const PASS: &str = "reencrypt me";
const DATA_OFFSET: u64 = 16 << 20;
const DATA: usize = 8 << 20;

/// AES-XTS over dm-crypt sectors (plain64 IVs in 512-byte units from 0).
fn xts(key: &[u8], data: &[u8], sector_size: usize, mode: Mode) -> Vec<u8> {
    common::xts::xts(key, data, sector_size, 0, matches!(mode, Mode::Encrypt))
}

/// The metadata as cryptsetup dumps it.
fn json(img: &str) -> Value {
    serde_json::from_str(&run(
        "cryptsetup",
        &["luksDump", "--dump-json-metadata", img],
    ))
    .unwrap()
}

fn in_reencryption(img: &str) -> bool {
    json(img)["config"].get("requirements").is_some()
}

struct Case {
    e: Workspace,
    /// The data device.
    img: String,
    /// The header: `img`, or a detached header file.
    hdr: String,
    pass: String,
    plain: Vec<u8>,
}

/// A cryptsetup LUKS2 image holding random plaintext.
fn case(seed: u64) -> Case {
    case_with(seed, false)
}

/// [`case`], the header in a file of its own when `detached` (the data then starts at 0).
fn case_with(seed: u64, detached: bool) -> Case {
    let e = Workspace::new();
    let pass = e.s("pass");
    fs::write(&pass, PASS).unwrap();
    let (img, hdr, offset) = if detached {
        let hdr = e.sparse("hdr.img", 16 << 20);
        (e.sparse("disk.img", DATA as u64), hdr, 0)
    } else {
        let img = e.sparse("disk.img", DATA_OFFSET + DATA as u64);
        (img.clone(), img, DATA_OFFSET)
    };
    let format = "luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --sector-size 4096";
    let mut args: Vec<&str> = format.split(' ').collect();
    if detached {
        args.extend(["--header", &hdr]);
    }
    args.extend(["--key-file", &pass, &img]);
    run("cryptsetup", &args);
    let plain = SplitMix64(seed).bytes(DATA);
    let ct = xts(
        &common::volume_key::cryptsetup(&pass, &hdr, None),
        &plain,
        4096,
        Mode::Encrypt,
    );
    let mut f = fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&ct).unwrap();
    Case {
        e,
        img,
        hdr,
        pass,
        plain,
    }
}

impl Case {
    /// cryptsetup opens the finished device and its data decrypts to the original plaintext.
    fn check(&self, what: &str) {
        let m = json(&self.hdr);
        assert!(
            m["config"].get("requirements").is_none(),
            "{what}: still in reencryption: {m}"
        );
        let mut test = vec!["open", "--test-passphrase", "--key-file", &self.pass];
        test.extend(self.header());
        test.push(&self.img);
        run("cryptsetup", &test);
        let seg = &m["segments"]["0"];
        assert_eq!(seg["encryption"], "aes-xts-plain64", "{what}");
        let ss = seg["sector_size"].as_u64().unwrap() as usize;
        let off: u64 = seg["offset"].as_str().unwrap().parse().unwrap();
        let mut ct = vec![0u8; DATA];
        let mut f = fs::File::open(&self.img).unwrap();
        f.seek(SeekFrom::Start(off)).unwrap();
        f.read_exact(&mut ct).unwrap();
        let got = xts(
            &common::volume_key::cryptsetup(&self.pass, &self.hdr, None),
            &ct,
            ss,
            Mode::Decrypt,
        );
        assert!(got == self.plain, "{what}: the plaintext differs");
    }

    fn dmkit(&self, extra: &[&str]) -> std::process::Output {
        self.dmkit_key(&self.pass, extra)
    }

    /// `--header HDR` when the header is detached.
    fn header(&self) -> Vec<&str> {
        if self.hdr == self.img {
            Vec::new()
        } else {
            vec!["--header", &self.hdr]
        }
    }

    fn in_reencryption(&self) -> bool {
        in_reencryption(&self.hdr)
    }

    /// `dmkit luks reencrypt --batch-mode --key-file KEY EXTRA... IMG`.
    fn dmkit_key(&self, key: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec!["luks", "reencrypt", "--batch-mode", "--key-file", key];
        args.extend(self.header());
        args.extend_from_slice(extra);
        args.push(&self.img);
        self.e.dmkit(&args)
    }

    fn dmkit_ok(&self, extra: &[&str]) {
        let out = self.dmkit(extra);
        assert!(
            out.status.success(),
            "dmkit luks reencrypt {extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `cryptsetup reencrypt` as its tests run it offline.
    fn cryptsetup_args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = [
            "reencrypt",
            "--batch-mode",
            "--force-offline-reencrypt",
            "--key-file",
            &self.pass,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(self.header().iter().chain(extra).map(|s| s.to_string()));
        a.push(self.img.clone());
        a
    }

    /// Start `program args`, wait until the header says it is in reencryption, then kill it
    /// (SIGKILL) after `delay`. Returns whether it was still running when killed.
    fn kill_midway(&self, program: &str, args: &[String], delay: Duration) -> bool {
        let mut cmd = Command::new(program);
        cmd.args(args);
        common::reencrypt::kill_when_under_way(
            cmd,
            &|| common::reencrypt::header_under_way(&self.hdr),
            delay,
        )
    }

    /// Finish with cryptsetup what was interrupted: repair a crashed hotzone, then resume.
    fn cryptsetup_finish(&self) {
        if !self.in_reencryption() {
            return;
        }
        if json(&self.hdr).to_string().contains("in-reencryption") {
            let mut repair = vec!["repair", "--batch-mode", "--key-file", &self.pass];
            repair.extend(self.header());
            repair.push(&self.img);
            run("cryptsetup", &repair);
        }
        let a = self.cryptsetup_args(&["--resume-only"]);
        run("cryptsetup", &a);
    }
}

fn no_cryptsetup() -> bool {
    tool_missing("cryptsetup", "cryptsetup")
}

#[test]
fn dmkit_reencrypts_and_cryptsetup_opens_the_result() {
    if no_cryptsetup() {
        return;
    }
    for (i, extra) in [
        &["--resilience", "checksum"][..],
        &["--resilience", "journal", "--key-size", "256"][..],
        &["--resilience", "none", "--sector-size", "512"][..],
        &[
            "--resilience",
            "checksum",
            "--resilience-hash",
            "sha1",
            "--hotzone-size",
            "1M",
        ][..],
    ]
    .iter()
    .enumerate()
    {
        let c = case(i as u64);
        let before = common::volume_key::cryptsetup(&c.pass, &c.img, None);
        c.dmkit_ok(extra);
        c.check(&format!("{extra:?}"));
        assert_ne!(
            common::volume_key::cryptsetup(&c.pass, &c.img, None),
            before,
            "{extra:?}: the key did not change"
        );
    }
}

#[test]
fn cryptsetup_resumes_what_dmkit_initialized() {
    if no_cryptsetup() {
        return;
    }
    for mode in ["checksum", "journal"] {
        let c = case(10);
        c.dmkit_ok(&["--init-only", "--resilience", mode]);
        assert!(c.in_reencryption());
        run("cryptsetup", &c.cryptsetup_args(&["--resume-only"]));
        c.check(mode);
    }
}

#[test]
fn dmkit_resumes_what_cryptsetup_initialized() {
    if no_cryptsetup() {
        return;
    }
    let c = case(11);
    run(
        "cryptsetup",
        &c.cryptsetup_args(&[
            "--init-only",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ]),
    );
    c.dmkit_ok(&["--resume-only"]);
    c.check("cryptsetup --init-only, dmkit --resume-only");
}

/// Three rounds per resilience mode: `start` starts the reencryption of a fresh case (the
/// program and its arguments), it is killed at a random moment, and `finish` completes it.
fn kill_rounds(
    seed: u64,
    start: impl Fn(&Case, &str) -> (String, Vec<String>),
    finish: impl Fn(&Case),
) {
    let mut rng = SplitMix64(seed);
    for mode in ["checksum", "journal"] {
        for round in 0..3 {
            let c = case(seed + round);
            let (program, args) = start(&c, mode);
            let delay = Duration::from_millis(rng.below(300));
            let what = format!("{mode} round {round}, kill after {delay:?}");
            let killed = c.kill_midway(&program, &args, delay);
            eprintln!("{what}: killed mid-way: {killed}");
            finish(&c);
            c.check(&what);
        }
    }
}

#[test]
fn cryptsetup_finishes_a_killed_dmkit() {
    if no_cryptsetup() {
        return;
    }
    let start = |c: &Case, mode: &str| {
        let args = ["luks", "reencrypt", "--batch-mode", "--key-file", &c.pass]
            .into_iter()
            .chain(["--resilience", mode, "--hotzone-size", "64k", &c.img])
            .map(str::to_string)
            .collect();
        (DMKIT.to_string(), args)
    };
    kill_rounds(20, start, Case::cryptsetup_finish);
}

#[test]
fn dmkit_finishes_a_killed_cryptsetup() {
    if no_cryptsetup() {
        return;
    }
    let start = |c: &Case, mode: &str| {
        let extra = [
            "--resilience",
            mode,
            "--hotzone-size",
            "64k",
            "--pbkdf",
            "pbkdf2",
        ];
        let mut extra = extra.to_vec();
        extra.extend(["--pbkdf-force-iterations", "1000"]);
        ("cryptsetup".to_string(), c.cryptsetup_args(&extra))
    };
    kill_rounds(30, start, |c| {
        if c.in_reencryption() {
            c.dmkit_ok(&["--resume-only"]);
        }
    });
}

#[test]
fn detached_header_both_ways() {
    if no_cryptsetup() {
        return;
    }
    let c = case_with(50, true);
    c.dmkit_ok(&["--resilience", "journal", "--progress-json"]);
    c.check("dmkit, detached header");
    let c = case_with(51, true);
    c.dmkit_ok(&["--init-only"]);
    run("cryptsetup", &c.cryptsetup_args(&["--resume-only"]));
    c.check("dmkit --init-only, cryptsetup --resume-only, detached header");
    let c = case_with(52, true);
    let extra = [
        "--hotzone-size",
        "64k",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
    ];
    let killed = c.kill_midway(
        "cryptsetup",
        &c.cryptsetup_args(&extra),
        Duration::from_millis(100),
    );
    eprintln!("detached: cryptsetup killed mid-way: {killed}");
    if c.in_reencryption() {
        c.dmkit_ok(&["--resume-only"]);
    }
    c.check("cryptsetup killed, dmkit resumes, detached header");
}

#[test]
fn progress_json_lines() {
    if no_cryptsetup() {
        return;
    }
    let c = case(60);
    let out = c.dmkit(&[
        "--resilience",
        "journal",
        "--hotzone-size",
        "1M",
        "--progress-json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 8, "{} progress lines", lines.len());
    let last = lines.last().unwrap();
    assert_eq!(last["device_bytes"], last["device_size"]);
    assert_eq!(last["device_size"], DATA.to_string());
    c.check("progress json");
}

#[test]
fn refusals() {
    if no_cryptsetup() {
        return;
    }
    let c = case(40);
    let out = c.dmkit(&["--resume-only"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in progress"));
    let out = c.dmkit(&["--resilience", "datashift"]);
    assert_eq!(out.status.code(), Some(1));
    let wrong = c.e.s("wrong");
    fs::write(&wrong, "nope").unwrap();
    let code = |out: std::process::Output| out.status.code();
    assert_eq!(code(c.dmkit_key(&wrong, &[])), Some(2));
    assert!(!c.in_reencryption());
    c.dmkit_ok(&["--init-only"]);
    let out = c.dmkit(&["--init-only"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(code(c.dmkit_key(&wrong, &["--resume-only"])), Some(2));
    c.dmkit_ok(&["--resume-only"]);
    c.check("after refusals");
}
