//! `luks reencrypt --keep-key`, `--volume-key-file` (a re-key) and `--device-size` against
//! cryptsetup 2.6.1, both directions: one tool starts (or is killed mid-run, SIGKILL), the
//! other finishes with `--resume-only` (after `cryptsetup repair` when a hotzone was left
//! `in-reencryption`). The data is checked without dmkit: the volume key from `cryptsetup
//! luksDump --dump-volume-key`, the sectors decrypted with OpenSSL's AES-XTS; cryptsetup
//! opens the result. Refusals give cryptsetup's messages and exit codes.
//!
//! Needs cryptsetup: skips without it, fails under CI=1.

mod common;

use common::env::tool_missing;
use common::rng::SplitMix64;
use common::run::{ok as run, Workspace};
use common::DMKIT;
use serde_json::Value;
use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

const PASS: &str = "options of a re-key";
const DATA_OFFSET: usize = 16 << 20;
const DATA: usize = 8 << 20;
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn missing() -> bool {
    tool_missing("cryptsetup", "cryptsetup")
}

/// The metadata as cryptsetup dumps it.
fn json(img: &str) -> Value {
    serde_json::from_str(&run(
        "cryptsetup",
        &["luksDump", "--dump-json-metadata", img],
    ))
    .unwrap()
}

/// A cryptsetup LUKS2 image (512-byte sectors) holding random plaintext.
struct Case {
    e: Workspace,
    img: String,
    pass: String,
    plain: Vec<u8>,
    /// The volume key before the reencryption.
    key: Vec<u8>,
}

impl Case {
    fn new(seed: u64) -> Case {
        let e = Workspace::new();
        let pass = e.s("pass");
        fs::write(&pass, PASS).unwrap();
        let img = e.sparse("disk.img", (DATA_OFFSET + DATA) as u64);
        let mut args = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
        args.extend(KDF);
        args.extend(["--sector-size", "512", "--key-file", &pass, &img]);
        run("cryptsetup", &args);
        let plain = SplitMix64(seed).bytes(DATA);
        let key = common::volume_key::cryptsetup(&pass, &img, None);
        let mut raw = fs::read(&img).unwrap();
        raw[DATA_OFFSET..].copy_from_slice(&common::xts::xts(&key, &plain, 512, 0, true));
        fs::write(&img, raw).unwrap();
        Case {
            e,
            img,
            pass,
            plain,
            key,
        }
    }

    fn in_reencryption(&self) -> bool {
        json(&self.img)["config"].get("requirements").is_some()
    }

    /// The command line of `program` reencrypting this case offline with `extra`.
    fn argv(&self, program: &str, extra: &[&str]) -> Vec<String> {
        let tail = ["--key-file", self.pass.as_str()];
        common::reencrypt::argv(program, &tail, extra, &self.img)
    }

    fn output(&self, program: &str, extra: &[&str]) -> std::process::Output {
        Command::new(program)
            .args(self.argv(program, extra))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, program: &str, extra: &[&str]) {
        common::reencrypt::must(&format!("{program} {extra:?}"), self.output(program, extra));
    }

    /// `program extra` killed (SIGKILL) `delay` after the header is in reencryption.
    fn kill(&self, program: &str, extra: &[&str], delay: Duration) -> bool {
        let mut cmd = Command::new(program);
        cmd.args(self.argv(program, extra));
        common::reencrypt::kill_when_under_way(
            cmd,
            &|| common::reencrypt::header_under_way(&self.img),
            delay,
        )
    }

    /// Finish with `program` whatever is left (`extra` given to the resume).
    fn finish(&self, program: &str, extra: &[&str]) {
        if !self.in_reencryption() {
            return;
        }
        if program == "cryptsetup" && json(&self.img).to_string().contains("in-reencryption") {
            run(
                "cryptsetup",
                &[
                    "repair",
                    "--batch-mode",
                    "--key-file",
                    &self.pass,
                    &self.img,
                ],
            );
        }
        let mut args = vec!["--resume-only"];
        args.extend(extra);
        self.ok(program, &args);
    }

    /// The data area as it is on disk.
    fn ciphertext(&self) -> Vec<u8> {
        fs::read(&self.img).unwrap()[DATA_OFFSET..].to_vec()
    }

    /// The reencryption is over, cryptsetup opens the device, the segment has `cipher` and
    /// `sector` bytes sectors, and its first `reencrypted` bytes decrypt with the volume key
    /// to the plaintext; the rest is `rest` as it was on disk. Returns the volume key.
    fn check(
        &self,
        what: &str,
        (cipher, sector): (&str, usize),
        reencrypted: usize,
        rest: &[u8],
    ) -> Vec<u8> {
        let m = json(&self.img);
        assert!(
            m["config"].get("requirements").is_none(),
            "{what}: still in reencryption: {m}"
        );
        run(
            "cryptsetup",
            &[
                "open",
                "--test-passphrase",
                "--key-file",
                &self.pass,
                &self.img,
            ],
        );
        let seg = &m["segments"]["0"];
        assert_eq!(seg["encryption"], cipher, "{what}: {m}");
        assert_eq!(seg["sector_size"], sector as u64, "{what}: {m}");
        assert_eq!(seg["size"], "dynamic", "{what}: {m}");
        let key = common::volume_key::cryptsetup(&self.pass, &self.img, None);
        let ct = self.ciphertext();
        let got = common::xts::xts(&key, &ct[..reencrypted], sector, 0, false);
        assert!(
            got == self.plain[..reencrypted],
            "{what}: the plaintext differs"
        );
        assert!(
            rest.is_empty() || ct[reencrypted..] == rest[reencrypted..],
            "{what}: the data after --device-size changed"
        );
        key
    }
}

/// `--keep-key --sector-size 4096` (and a cipher spelling change) started by one tool, killed
/// mid-way, finished by the other: the volume key and the keyslots are those of before.
#[test]
fn keep_key_both_ways() {
    if missing() {
        return;
    }
    let mut rng = SplitMix64(0x6b65_6570);
    for (first, then) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        for (round, mode) in ["checksum", "journal"].into_iter().enumerate() {
            let c = Case::new(rng.below(1 << 32));
            let delay = Duration::from_millis(rng.below(150));
            let mut extra = vec!["--keep-key", "--sector-size", "4096", "--resilience", mode];
            extra.extend(["--hotzone-size", "64k"]);
            let killed = c.kill(first, &extra, delay);
            let what = format!("{first} --keep-key {mode} round {round}, killed: {killed}");
            eprintln!("{what}");
            c.finish(then, &[]);
            let key = c.check(&what, ("aes-xts-plain64", 4096), DATA, &[]);
            assert!(key == c.key, "{what}: the volume key changed");
            let m = json(&c.img);
            let slots: Vec<&String> = m["keyslots"].as_object().unwrap().keys().collect();
            assert_eq!(slots, ["0"], "{what}: keyslots {m}");
        }
    }
    // The cipher's IV spelling changes under the same key, dmkit initializing.
    let c = Case::new(3);
    c.ok(
        DMKIT,
        &["--keep-key", "--cipher", "aes-xts-plain", "--init-only"],
    );
    c.finish("cryptsetup", &[]);
    let key = c.check("--cipher aes-xts-plain", ("aes-xts-plain", 512), DATA, &[]);
    assert!(key == c.key);
}

/// A re-key to the key in `--volume-key-file`: both tools write the same ciphertext, and
/// cryptsetup resumes what dmkit initialized with it.
#[test]
fn volume_key_file_both_ways() {
    if missing() {
        return;
    }
    let mut images = Vec::new();
    for program in [DMKIT, "cryptsetup"] {
        let c = Case::new(7);
        let vk = c.e.s("new.key");
        fs::write(&vk, SplitMix64(70).bytes(64)).unwrap();
        let mut extra = vec!["--volume-key-file", vk.as_str()];
        extra.extend(KDF);
        c.ok(program, &extra);
        let key = c.check(program, ("aes-xts-plain64", 512), DATA, &[]);
        assert!(
            key == fs::read(&vk).unwrap(),
            "{program}: not the given key"
        );
        images.push(c.ciphertext());
    }
    assert!(
        images[0] == images[1],
        "the tools wrote different ciphertext"
    );
    let c = Case::new(8);
    let vk = c.e.s("new.key");
    fs::write(&vk, SplitMix64(80).bytes(64)).unwrap();
    let mut extra = vec!["--volume-key-file", vk.as_str(), "--init-only"];
    extra.extend(KDF);
    c.ok(DMKIT, &extra);
    c.finish("cryptsetup", &[]);
    let key = c.check("dmkit --init-only", ("aes-xts-plain64", 512), DATA, &[]);
    assert!(key == fs::read(&vk).unwrap());
}

/// `--device-size 4M` of 8 MiB of data: one tool killed mid-way, the other finishing with the
/// same size; the first 4 MiB are under the new key, the rest is the old ciphertext as it
/// was (cryptsetup leaves it so, and marks the segment whole again).
#[test]
fn device_size_both_ways() {
    if missing() {
        return;
    }
    let half = DATA / 2;
    let mut rng = SplitMix64(0x7369_7a65);
    for (first, then) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        for (round, mode) in ["checksum", "journal"].into_iter().enumerate() {
            let c = Case::new(rng.below(1 << 32));
            let before = c.ciphertext();
            let delay = Duration::from_millis(rng.below(150));
            let mut extra = vec!["--device-size", "4M", "--resilience", mode];
            extra.extend(["--hotzone-size", "64k"]);
            extra.extend(KDF);
            let killed = c.kill(first, &extra, delay);
            let what = format!("{first} --device-size {mode} round {round}, killed: {killed}");
            eprintln!("{what}");
            if c.in_reencryption() {
                let m = json(&c.img);
                let sizes: Vec<&Value> = m["segments"]
                    .as_object()
                    .unwrap()
                    .values()
                    .filter(|s| s.get("flags").is_none())
                    .map(|s| &s["size"])
                    .collect();
                eprintln!("{what}: segments sized {sizes:?}");
            }
            c.finish(then, &["--device-size", "4M"]);
            let key = c.check(&what, ("aes-xts-plain64", 512), half, &before);
            assert!(key != c.key, "{what}: the key did not change");
        }
    }
}

/// Where cryptsetup refuses, dmkit refuses with its message and exit code, the header and
/// data unchanged.
#[test]
fn refusals_match_cryptsetup() {
    if missing() {
        return;
    }
    let c = Case::new(9);
    let current = c.e.s("current.key");
    fs::write(&current, &c.key).unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--keep-key"],
            "No data segment parameters changed. Reencryption aborted.",
        ),
        (
            &["--volume-key-file", &current],
            "No data segment parameters changed. Reencryption aborted.",
        ),
        (
            &["--device-size", "1000"],
            "Device size must be multiple of 512 bytes sector.",
        ),
        (
            &["--device-size", "16M"],
            "Reduced data size is larger than real device size.",
        ),
        (
            &["--device-size", "4M", "--reduce-device-size", "4M"],
            "Options --reduce-device-size and --data-size cannot be combined.",
        ),
    ];
    for (extra, msg) in cases {
        for program in [DMKIT, "cryptsetup"] {
            let before = fs::read(&c.img).unwrap();
            let out = c.output(program, extra);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{program} {extra:?}: {err}");
            assert!(err.contains(msg), "{program} {extra:?}: {err}");
            // cryptsetup adds the new key's keyslot before its size check and removes it
            // again: only its data stays the same; dmkit checks before it writes.
            let after = fs::read(&c.img).unwrap();
            let from = if program == DMKIT { 0 } else { DATA_OFFSET };
            assert!(
                after[from..] == before[from..],
                "{program} {extra:?}: the image changed"
            );
        }
    }
}
