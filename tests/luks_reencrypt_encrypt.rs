//! `luks reencrypt --encrypt --header HDR` of a plaintext device and `--decrypt` of a device
//! with a detached header, against cryptsetup 2.6.1 both ways: full runs, `--init-only` by
//! one tool resumed by the other, and each tool killed (SIGKILL) mid-run and finished by the
//! other. The plaintext is checked without dmkit: the volume key from `cryptsetup luksDump
//! --dump-volume-key`, the sectors decrypted with OpenSSL's AES-XTS. A device dmkit leaves
//! mid-encryption opens in dmkit (both segments served) and reads back the original.
//!
//! Needs cryptsetup (and /dev/fuse for the open test): skips without them, fails under CI=1.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::rng::SplitMix64;
use common::run::Workspace;
use common::DMKIT;
use serde_json::Value;
use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "plain to cipher";
const SIZE: usize = 8 << 20;
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// One data device and its detached header file.
struct Pair {
    e: Workspace,
    data: String,
    hdr: String,
    key: String,
    plain: Vec<u8>,
}

fn cryptsetup(args: &[&str]) -> std::process::Output {
    Command::new("cryptsetup")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cryptsetup runs")
}

fn succeed(program: &str, args: &[String]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pair {
    /// A plaintext device of random bytes; no header yet.
    fn plain(seed: u64) -> Pair {
        let (e, key, data, plain) = common::reencrypt::plain_image(seed, SIZE, KEY, "data.img");
        let hdr = e.s("hdr.img");
        Pair {
            e,
            data,
            hdr,
            key,
            plain,
        }
    }

    /// The plaintext encrypted under a detached header cryptsetup formats.
    fn luks(seed: u64) -> Pair {
        let p = Pair::plain(seed);
        let mut args = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
        args.extend(KDF);
        args.extend(["--header", &p.hdr, "--key-file", &p.key, &p.data]);
        let out = cryptsetup(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seg = &p.meta()["segments"]["0"];
        let ss = seg["sector_size"].as_u64().unwrap() as usize;
        let ct = common::xts::xts(&p.volume_key(), &p.plain, ss, 0, true);
        fs::write(&p.data, ct).unwrap();
        p
    }

    fn meta(&self) -> Value {
        let out = cryptsetup(&["luksDump", "--dump-json-metadata", &self.hdr]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn volume_key(&self) -> Vec<u8> {
        common::volume_key::cryptsetup(&self.key, &self.hdr, None)
    }

    /// The header file says a reencryption is under way (read raw: it may be half made).
    fn under_way(&self) -> bool {
        fs::read(&self.hdr).is_ok_and(|b| {
            b[..b.len().min(32 << 10)]
                .windows(19)
                .any(|w| w == b"online-reencrypt-v2")
        })
    }

    /// The command line of `program` (dmkit or cryptsetup) reencrypting this pair offline.
    fn argv(&self, program: &str, extra: &[&str]) -> Vec<String> {
        let tail = ["--key-file", &self.key, "--header", &self.hdr];
        common::reencrypt::argv(program, &tail, extra, &self.data)
    }

    fn run(&self, program: &str, extra: &[&str]) {
        succeed(program, &self.argv(program, extra));
    }

    /// Start `program`, SIGKILL it `delay` after the header is in reencryption; whether it was
    /// still running then.
    fn kill(&self, program: &str, extra: &[&str], delay: Duration) -> bool {
        let mut cmd = Command::new(program);
        cmd.args(self.argv(program, extra));
        common::reencrypt::kill_when_under_way(cmd, &|| self.under_way(), delay)
    }

    /// Finish with `program` what is left: cryptsetup wants a crashed hotzone repaired first.
    fn finish(&self, program: &str) {
        if !self.under_way() {
            return;
        }
        if program == "cryptsetup" && self.meta().to_string().contains("in-reencryption") {
            let repair = ["repair", "--batch-mode", "--key-file", &self.key];
            let mut args: Vec<String> = repair.iter().map(|s| s.to_string()).collect();
            args.extend(["--header".into(), self.hdr.clone(), self.data.clone()]);
            succeed("cryptsetup", &args);
        }
        self.run(program, &["--resume-only"]);
    }

    /// Encrypted to the end: cryptsetup opens it, the data decrypts to the plaintext.
    fn encrypted(&self, what: &str) {
        let m = self.meta();
        assert!(m["config"].get("requirements").is_none(), "{what}: {m}");
        let test = ["open", "--test-passphrase", "--key-file", &self.key];
        let out = cryptsetup(&[&test[..], &["--header", &self.hdr, &self.data]].concat());
        assert!(
            out.status.success(),
            "{what}: cryptsetup open --test-passphrase"
        );
        let seg = &m["segments"]["0"];
        assert_eq!(seg["type"], "crypt", "{what}");
        let ss = seg["sector_size"].as_u64().unwrap() as usize;
        let ct = fs::read(&self.data).unwrap();
        let back = common::xts::xts(&self.volume_key(), &ct, ss, 0, false);
        assert!(back == self.plain, "{what}: the plaintext differs");
    }

    /// Decrypted to the end: the data is the plaintext, the header as cryptsetup leaves it
    /// (one linear segment, no keyslot, no digest).
    fn decrypted(&self, what: &str) {
        let m = self.meta();
        assert!(m["config"].get("requirements").is_none(), "{what}: {m}");
        let segs = m["segments"].as_object().unwrap();
        assert_eq!(segs.len(), 1, "{what}: {m}");
        assert_eq!(m["segments"]["0"]["type"], "linear", "{what}");
        assert!(m["digests"].as_object().unwrap().is_empty(), "{what}: {m}");
        assert!(m["keyslots"].as_object().unwrap().is_empty(), "{what}: {m}");
        assert!(
            fs::read(&self.data).unwrap() == self.plain,
            "{what}: the data is not the plaintext"
        );
    }
}

fn missing() -> bool {
    tool_missing("cryptsetup", "cryptsetup-bin")
}

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = KDF.to_vec();
    v.extend(extra);
    v
}

#[test]
fn encrypt_full_runs_in_every_resilience_mode() {
    if missing() {
        return;
    }
    for (i, mode) in ["checksum", "journal", "none"].into_iter().enumerate() {
        let p = Pair::plain(i as u64);
        p.run(DMKIT, &with(&["--encrypt", "--resilience", mode]));
        p.encrypted(&format!("dmkit --encrypt --resilience {mode}"));
    }
    let p = Pair::plain(7);
    let extra = with(&["--encrypt", "--sector-size", "4096", "--key-size", "256"]);
    p.run(
        DMKIT,
        &[&extra[..], &["--cipher", "aes-xts-plain64"]].concat(),
    );
    p.encrypted("dmkit --encrypt --sector-size 4096 --key-size 256");
    assert_eq!(p.meta()["segments"]["0"]["sector_size"], 4096);
}

#[test]
fn encrypt_initialized_by_one_tool_resumes_in_the_other() {
    if missing() {
        return;
    }
    for (init, resume) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        for mode in ["checksum", "journal"] {
            let p = Pair::plain(20);
            p.run(
                init,
                &with(&["--encrypt", "--init-only", "--resilience", mode]),
            );
            assert!(p.under_way(), "{init} --init-only");
            p.run(resume, &["--resume-only"]);
            p.encrypted(&format!(
                "{init} --init-only, {resume} --resume-only ({mode})"
            ));
        }
    }
}

/// Each tool started on a fresh pair (`make`) with `verb`, SIGKILLed at a random moment of
/// its run, and finished by the other; `check` judges the result.
fn kill_rounds(seed: u64, make: fn(u64) -> Pair, verb: &'static str, check: fn(&Pair, &str)) {
    let mut rng = SplitMix64(seed);
    for (first, then) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        for (round, mode) in ["checksum", "journal", "checksum"].into_iter().enumerate() {
            let p = make(seed + round as u64);
            let extra = with(&[verb, "--resilience", mode, "--hotzone-size", "64k"]);
            let delay = Duration::from_millis(rng.below(250));
            let killed = p.kill(first, &extra, delay);
            let crashed = p.under_way() && p.meta().to_string().contains("in-reencryption");
            let what = format!(
                "{first} {verb} ({mode}) killed after {delay:?} (running: {killed}, crashed hotzone: {crashed})"
            );
            eprintln!("{what}");
            p.finish(then);
            check(&p, &what);
        }
    }
}

#[test]
fn encrypt_killed_midway_is_finished_by_the_other_tool() {
    if missing() {
        return;
    }
    kill_rounds(30, Pair::plain, "--encrypt", Pair::encrypted);
}

#[test]
fn decrypt_full_runs_and_crossed_resumes() {
    if missing() {
        return;
    }
    for (i, mode) in ["checksum", "journal", "none"].into_iter().enumerate() {
        let p = Pair::luks(40 + i as u64);
        p.run(DMKIT, &["--decrypt", "--resilience", mode]);
        p.decrypted(&format!("dmkit --decrypt --resilience {mode}"));
    }
    for (init, resume) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        let p = Pair::luks(45);
        p.run(init, &with(&["--decrypt", "--init-only"]));
        assert!(p.under_way(), "{init} --decrypt --init-only");
        p.run(resume, &["--resume-only"]);
        p.decrypted(&format!(
            "{init} --decrypt --init-only, {resume} --resume-only"
        ));
    }
}

#[test]
fn decrypt_killed_midway_is_finished_by_the_other_tool() {
    if missing() {
        return;
    }
    kill_rounds(50, Pair::luks, "--decrypt", Pair::decrypted);
}

#[test]
fn refusals_match_cryptsetup() {
    if missing() {
        return;
    }
    let p = Pair::plain(60);
    let mut args = vec!["luks", "reencrypt", "--batch-mode", "--encrypt"];
    args.extend(["--key-file", &p.key, &p.data]);
    let out = p.e.dmkit(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without detached header"));
    assert!(fs::read(&p.data).unwrap() == p.plain);
    // A header that is already LUKS is not formatted over.
    let p = Pair::luks(61);
    let before = fs::read(&p.hdr).unwrap();
    let out = p.e.dmkit(
        &p.argv(DMKIT, &with(&["--encrypt"]))[..]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is already LUKS device"));
    assert!(fs::read(&p.hdr).unwrap() == before);
    // cryptsetup decrypts in place only with a detached header.
    let e = Workspace::new();
    let key = e.s("key");
    fs::write(&key, KEY).unwrap();
    let img = e.sparse("attached.img", 20 << 20);
    let mut fmt = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
    fmt.extend(KDF);
    fmt.extend(["--key-file", &key, &img]);
    assert!(cryptsetup(&fmt).status.success());
    let args = [
        "luks",
        "reencrypt",
        "--batch-mode",
        "--decrypt",
        "--key-file",
        &key,
        &img,
    ];
    let out = e.dmkit(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("requires --header"));
}

#[test]
fn a_device_dmkit_leaves_mid_encryption_opens_in_dmkit() {
    if missing() || fuse_missing() {
        return;
    }
    let mut rng = SplitMix64(0x0be);
    let mut seen = 0;
    for round in 0..6 {
        let p = Pair::plain(70 + round);
        let extra = with(&[
            "--encrypt",
            "--resilience",
            "journal",
            "--hotzone-size",
            "64k",
        ]);
        let delay = Duration::from_millis(rng.below(200));
        p.kill(DMKIT, &extra, delay);
        if !p.under_way() {
            continue;
        }
        let segs = p.meta()["segments"].as_object().unwrap().len();
        seen += usize::from(segs > 3);
        let name = format!("enc{round}");
        let device = ["--key-file", &p.key, "--header", &p.hdr, &p.data];
        let back = common::reencrypt::read_served(&p.e, &device, &name);
        assert!(
            back == p.plain,
            "round {round} ({segs} segments): read back differs"
        );
        p.finish(DMKIT);
        p.encrypted(&format!("round {round}, after the open"));
    }
    assert!(seen > 0, "never caught with two data segments");
}
