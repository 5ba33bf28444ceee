//! `luks reencrypt --encrypt --reduce-device-size` (the header at the device's start, the
//! data shifted while it is encrypted) against cryptsetup 2.6.1 both ways: the metadata of
//! `--init-only` field for field, full runs, `--init-only` by one tool resumed by the other,
//! each tool killed (SIGKILL) mid-run and finished by the other, a cut at every write of a run
//! resumed by dmkit and by cryptsetup, a device left mid-encryption opened in dmkit, and the
//! refusals. The plaintext is checked without dmkit: the volume key from `cryptsetup luksDump
//! --dump-volume-key`, the sectors decrypted with OpenSSL's AES-XTS.
//!
//! Needs cryptsetup (and /dev/fuse for the open test): skips without them, fails under CI=1.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::reencrypt::{must, shape};
use common::rng::SplitMix64;
use common::run::Workspace;
use common::DMKIT;
use dmkit::block::{for_each_crash_state, BlockDevice, FaultyDevice, LoggedOp, MemoryDevice};
use dmkit::crypt::luks2::copies;
use dmkit::crypt::luks2::reencrypt::engine::unlock_keys;
use dmkit::crypt::luks2::reencrypt::{datashift, ReencryptState, RunOutcome};
use serde_json::Value;
use std::fs;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const KEY: &str = "shift and encrypt";
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// 12 MiB device, 2 MiB given up: a 1 MiB header, 10 MiB of plaintext, ten hotzones.
const SIZE: usize = 12 << 20;
const REDUCE: &str = "2M";
const SHIFT: usize = 1 << 20;

/// A plaintext device to encrypt in place.
struct Dev {
    e: Workspace,
    img: String,
    key: String,
    plain: Vec<u8>,
    shift: usize,
}

fn missing() -> bool {
    tool_missing("cryptsetup", "cryptsetup-bin")
}

impl Dev {
    fn new(seed: u64) -> Dev {
        Dev::sized(seed, SIZE, SHIFT)
    }

    fn sized(seed: u64, size: usize, shift: usize) -> Dev {
        let (e, key, img, plain) = common::reencrypt::plain_image(seed, size, KEY, "disk.img");
        Dev {
            e,
            img,
            key,
            plain,
            shift,
        }
    }

    /// The bytes of plaintext the device keeps (its size less the reduction).
    fn kept(&self) -> &[u8] {
        &self.plain[..self.plain.len() - 2 * self.shift]
    }

    /// cryptsetup, run in the workspace (its temporary header file is made in the current
    /// directory).
    fn cryptsetup(&self, args: &[&str]) -> Output {
        Command::new("cryptsetup")
            .args(args)
            .current_dir(self.e.dir())
            .stdin(Stdio::null())
            .output()
            .expect("cryptsetup runs")
    }

    fn meta(&self) -> Value {
        let out = must(
            "luksDump",
            self.cryptsetup(&["luksDump", "--dump-json-metadata", &self.img]),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The header says a reencryption is under way (read raw: it may be half made).
    fn under_way(&self) -> bool {
        fs::read(&self.img).is_ok_and(|b| {
            b[..32 << 10]
                .windows(19)
                .any(|w| w == b"online-reencrypt-v2")
        })
    }

    fn crashed(&self) -> bool {
        self.under_way() && self.meta().to_string().contains("in-reencryption")
    }

    /// The command line of `program` (dmkit or cryptsetup) reencrypting this device offline,
    /// run in the workspace (cryptsetup makes its temporary header file in the current
    /// directory).
    fn command(&self, program: &str, extra: &[&str]) -> Command {
        common::reencrypt::offline_command(
            program,
            &["--key-file", &self.key],
            extra,
            &self.img,
            self.e.dir(),
        )
    }

    fn run(&self, program: &str, extra: &[&str]) {
        common::reencrypt::run_must(program, extra, self.command(program, extra));
    }

    /// Start encrypting with `program`, SIGKILL it `delay` after the header is in place;
    /// whether it was still running then.
    fn kill(&self, program: &str, delay: Duration) -> bool {
        let cmd = self.command(program, &encrypt(&[]));
        common::reencrypt::kill_when_under_way(cmd, &|| self.under_way(), delay)
    }

    /// Finish with `program` what is left: cryptsetup wants a crashed hotzone repaired first.
    fn finish(&self, program: &str) {
        if self.under_way() {
            self.resume(program);
        }
    }

    /// The last hotzone committed, the teardown not yet: one crypt data segment left (the
    /// backup segments aside, which are there until the teardown). cryptsetup 2.6.1 cannot
    /// resume its own run from there either (see the cut test).
    fn tail(&self) -> bool {
        let m = self.meta();
        let backup = |v: &Value| {
            v["flags"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f.as_str().is_some_and(|f| f.starts_with("backup-")))
            })
        };
        m["config"].get("requirements").is_some()
            && m["segments"].as_object().is_some_and(|s| {
                let data: Vec<&Value> = s.values().filter(|v| !backup(v)).collect();
                data.len() == 1 && data[0]["type"] == "crypt"
            })
    }

    /// cryptsetup 2.6.1's `--resume-only` refuses the tail state (its next hotzone has no
    /// plaintext segment) and writes nothing past the header: unlike the in-place encryption
    /// under a detached header, whose tail state it encrypts a second time, this one needs
    /// no dmkit run to avoid it (and cannot: the moved copy is wiped between the last
    /// hotzone's commit and the metadata's drop).
    fn cryptsetup_refuses_tail(&self, what: &str) {
        let before = fs::read(&self.img).unwrap();
        let out = self
            .command("cryptsetup", &["--resume-only"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("Failed to set device segments"),
            "{what}: cryptsetup on the tail state: {err}"
        );
        let after = fs::read(&self.img).unwrap();
        assert!(
            after[self.shift..] == before[self.shift..],
            "{what}: cryptsetup changed the data refusing the tail state"
        );
        assert!(self.tail(), "{what}: cryptsetup changed the metadata");
    }

    /// Resume with `program` a device in reencryption.
    fn resume(&self, program: &str) {
        if program == "cryptsetup" && self.tail() {
            self.cryptsetup_refuses_tail("killed run");
            eprintln!("the tail state, which cryptsetup 2.6.1 refuses: dmkit tears down");
            self.run(DMKIT, &["--resume-only"]);
            return;
        }
        if program == "cryptsetup" && self.crashed() {
            let out =
                self.cryptsetup(&["repair", "--batch-mode", "--key-file", &self.key, &self.img]);
            must("cryptsetup repair", out);
            // Recovering the last hotzone finishes the reencryption.
            if self.meta()["config"].get("requirements").is_none() {
                return;
            }
        }
        // The metadata in the message: which state a tool could not resume.
        let segments = self.meta()["segments"].to_string();
        let out = self.command(program, &["--resume-only"]).output().unwrap();
        must(
            &format!("{program} --resume-only (segments {segments})"),
            out,
        );
    }

    /// Encrypted to the end: cryptsetup opens it, the data past the header decrypts to the
    /// plaintext the device kept.
    fn encrypted(&self, what: &str) {
        let m = self.meta();
        assert!(m["config"].get("requirements").is_none(), "{what}: {m}");
        let test = [
            "open",
            "--test-passphrase",
            "--key-file",
            &self.key,
            &self.img,
        ];
        must(
            &format!("{what}: open --test-passphrase"),
            self.cryptsetup(&test),
        );
        let seg = &m["segments"]["0"];
        assert_eq!(seg["type"], "crypt", "{what}");
        assert_eq!(seg["offset"], self.shift.to_string(), "{what}");
        assert_eq!(m["segments"].as_object().unwrap().len(), 1, "{what}: {m}");
        let ss = seg["sector_size"].as_u64().unwrap() as usize;
        let img = fs::read(&self.img).unwrap();
        let vk = common::volume_key::cryptsetup(&self.key, &self.img, None);
        check_ciphertext(&vk, &img, self.shift, ss, self.kept(), what);
        // The moved copy of the first segment does not stay behind in the clear.
        let tail = &img[img.len() - self.shift..];
        assert!(
            tail != &self.plain[..self.shift],
            "{what}: moved copy not wiped"
        );
    }
}

/// The ciphertext at `shift` in `img` decrypts (key `vk`, sectors of `ss`) to `plain`.
fn check_ciphertext(vk: &[u8], img: &[u8], shift: usize, ss: usize, plain: &[u8], what: &str) {
    let back = common::xts::xts(vk, &img[shift..shift + plain.len()], ss, 0, false);
    if back != plain {
        let first = back
            .chunks(512)
            .zip(plain.chunks(512))
            .position(|(a, b)| a != b)
            .unwrap();
        panic!("{what}: the plaintext differs from sector {first}");
    }
}

fn encrypt(extra: &[&'static str]) -> Vec<&'static str> {
    encrypt_by(REDUCE, extra)
}

/// `--encrypt --reduce-device-size reduce` with cheap KDFs and `extra`.
fn encrypt_by(reduce: &'static str, extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["--encrypt", "--reduce-device-size", reduce];
    v.extend(KDF);
    v.extend(extra);
    v
}

#[test]
fn init_only_writes_what_cryptsetup_writes() {
    if missing() {
        return;
    }
    for (extra, what) in [(&[][..], "512"), (&["--sector-size", "4096"][..], "4096")] {
        let d = Dev::new(1);
        let c = Dev::new(1);
        d.run(DMKIT, &encrypt(&[&["--init-only"], extra].concat()));
        c.run("cryptsetup", &encrypt(&[&["--init-only"], extra].concat()));
        assert_eq!(shape(d.meta()), shape(c.meta()), "sector size {what}");
        let (a, b) = (fs::read(&d.img).unwrap(), fs::read(&c.img).unwrap());
        // The data after the header and the moved copy at the end are the same bytes.
        assert!(a[SHIFT..] == b[SHIFT..], "sector size {what}: data differs");
        assert!(a[SIZE - SHIFT..] == d.plain[..SHIFT]);
    }
}

#[test]
fn full_runs_and_crossed_resumes() {
    if missing() {
        return;
    }
    let d = Dev::new(2);
    d.run(DMKIT, &encrypt(&[]));
    d.encrypted("dmkit --encrypt --reduce-device-size");
    let d = Dev::new(3);
    d.run(DMKIT, &encrypt(&["--sector-size", "4096"]));
    d.encrypted("dmkit --encrypt --reduce-device-size --sector-size 4096");
    // Plaintext that is not a whole number of shifts: the last hotzone before the moved
    // segment is shorter.
    let d = Dev::sized(4, (11 << 20) + (512 << 10), SHIFT);
    d.run(DMKIT, &encrypt(&[]));
    d.encrypted("10.5 MiB of plaintext");
    // The volume key given in a file.
    let d = Dev::new(6);
    let vk: Vec<u8> = SplitMix64(66).bytes(64);
    let vk_file = d.e.s("vk.bin");
    fs::write(&vk_file, &vk).unwrap();
    d.run(
        DMKIT,
        &[&encrypt(&[])[..], &["--volume-key-file", &vk_file]].concat(),
    );
    d.encrypted("--volume-key-file");
    assert_eq!(common::volume_key::cryptsetup(&d.key, &d.img, None), vk);
    for (init, resume) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        let d = Dev::new(5);
        d.run(init, &encrypt(&["--init-only"]));
        assert!(d.under_way(), "{init} --init-only");
        d.run(resume, &["--resume-only"]);
        d.encrypted(&format!("{init} --init-only, {resume} --resume-only"));
    }
}

#[test]
fn killed_midway_is_finished_by_the_other_tool() {
    if missing() {
        return;
    }
    common::reencrypt::killed_both_ways(0xd5, 120, |round| Dev::new(10 + round));
}

impl common::reencrypt::Killable for Dev {
    fn kill(&self, program: &str, delay: Duration) -> bool {
        Dev::kill(self, program, delay)
    }
    fn crashed(&self) -> bool {
        Dev::crashed(self)
    }
    fn finish(&self, program: &str) {
        Dev::finish(self, program)
    }
    fn check(&self, what: &str) {
        self.encrypted(what)
    }
}

/// A small device (the smallest shift that holds the header) so that every write of a run
/// can be cut: dmkit resumes from every state, cryptsetup from every fourth.
#[test]
fn a_cut_at_every_write_resumes_in_both_tools() {
    if missing() {
        return;
    }
    let shift = 512 << 10;
    let d = Dev::sized(20, (3 << 20) + (512 << 10), shift);
    d.run(DMKIT, &encrypt_by("1M", &["--init-only"]));
    let vk = common::volume_key::cryptsetup(&d.key, &d.img, None);
    let base = fs::read(&d.img).unwrap();
    let run = |dev: &dyn BlockDevice| -> RunOutcome {
        let mut h = copies::read(dev).unwrap().header;
        let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
        let keys = unlock_keys(dev, &h, &st, KEY.as_bytes(), None).unwrap();
        datashift::run(dev, dev, &mut h, &keys, &mut |_| true).unwrap()
    };
    let faulty = FaultyDevice::new(MemoryDevice::from_vec("disk", base.clone()));
    faulty.start_log();
    assert_eq!(run(&faulty), RunOutcome::Finished);
    let log = faulty.take_log();
    let writes = log
        .iter()
        .filter(|o| matches!(o, LoggedOp::Write { .. }))
        .count();
    assert!(writes > 20, "{writes} writes");
    let check = |img: &[u8], what: &str| {
        let h = copies::read(&MemoryDevice::from_vec("check", img.to_vec()))
            .unwrap()
            .header;
        assert!(
            h.metadata.config.requirements.is_empty(),
            "{what}: still in reencryption"
        );
        let ss = h.metadata.segments[&0].sector_size as usize;
        check_ciphertext(&vk, img, shift, ss, d.kept(), what);
    };
    let mut states = 0;
    let mut by_cryptsetup = 0;
    let (mut tails, mut after_drop) = (0, 0);
    for_each_crash_state(&base, &log, |what, img| {
        states += 1;
        let mem = MemoryDevice::from_vec("crashed", img.to_vec());
        let st = ReencryptState::read(&copies::read(&mem).unwrap().header.metadata).unwrap();
        // The last hotzone committed, the teardown not yet: every byte is encrypted and one
        // crypt segment is left. cryptsetup 2.6.1 cannot resume its own run from there
        // (its next hotzone has no plaintext segment), dmkit tears down.
        let tail = st
            .as_ref()
            .is_some_and(|st| st.segments.len() == 1 && st.segments[0].kind == "crypt");
        if st.is_some() {
            assert_eq!(run(&mem), RunOutcome::Finished, "{what}");
        }
        check(&mem.contents(), &format!("dmkit after {what}"));
        if tail {
            fs::write(&d.img, img).unwrap();
            // The killed runs' check sees the same state (it once missed it, counting the
            // backup segments, and sent it to cryptsetup).
            assert!(d.tail(), "{what}: the tail state is not recognized");
            d.cryptsetup_refuses_tail(what);
            tails += 1;
        } else if states % 4 == 1 || st.is_none() {
            // A sample of the states, and every one after the metadata's drop.
            by_cryptsetup += 1;
            fs::write(&d.img, img).unwrap();
            if st.is_some() {
                d.resume("cryptsetup");
            } else {
                let cmd = d.command("cryptsetup", &["--resume-only"]);
                common::reencrypt::not_in_progress(cmd, &format!("cryptsetup after {what}"));
                assert!(
                    fs::read(&d.img).unwrap()[shift..] == img[shift..],
                    "cryptsetup after {what}: data changed"
                );
                after_drop += 1;
            }
            check(
                &fs::read(&d.img).unwrap(),
                &format!("cryptsetup after {what}"),
            );
        }
    });
    assert!(states > writes, "{states} states");
    assert!(tails > 0, "the state after the last hotzone was never cut");
    assert!(after_drop > 0, "no state after the metadata's drop was cut");
    eprintln!(
        "{states} states after {writes} writes; cryptsetup was handed {by_cryptsetup} \
         ({after_drop} after the metadata's drop: nothing to resume), refused {tails} (after \
         the last hotzone)"
    );
}

#[test]
fn a_device_left_mid_encryption_opens_in_dmkit() {
    if missing() || fuse_missing() {
        return;
    }
    let (mut rng, mut seen) = (SplitMix64(0x5f7), 0);
    for round in 0..6u64 {
        let d = Dev::new(30 + round);
        let first = if round % 2 == 0 { DMKIT } else { "cryptsetup" };
        d.kill(first, Duration::from_millis(rng.below(100)));
        if !d.under_way() {
            continue;
        }
        let segs = d.meta()["segments"].as_object().unwrap().len();
        seen += usize::from(segs > 4);
        let name = format!("shift{round}");
        let back = common::reencrypt::read_served(&d.e, &["--key-file", &d.key, &d.img], &name);
        assert!(
            back.len() >= d.kept().len() && back[..d.kept().len()] == *d.kept(),
            "round {round} ({first} killed, {segs} segments): read back differs"
        );
        d.finish(DMKIT);
        d.encrypted(&format!("round {round}, after the open"));
    }
    assert!(seen > 0, "never caught mid-way");
}

#[test]
fn refusals_match_cryptsetup() {
    if missing() {
        return;
    }
    let cases: [(&str, usize, &str); 4] = [
        (
            "1000",
            SIZE,
            "Reduce size must be multiple of 512 bytes sector.",
        ),
        ("2G", SIZE, "Maximum device reduce size is 1 GiB."),
        ("64k", SIZE, "No space for new keyslot."),
        ("40M", 20 << 20, "is too small."),
    ];
    for (reduce, size, msg) in cases {
        let d = Dev::sized(40, size, 0);
        let mut args = vec!["--encrypt", "--reduce-device-size", reduce];
        args.extend(KDF);
        let out = d.command(DMKIT, &args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{reduce}: {err}");
        assert!(err.contains(msg), "{reduce}: {err}");
        assert!(
            fs::read(&d.img).unwrap() == d.plain,
            "{reduce}: device changed"
        );
        let theirs = d.command("cryptsetup", &args).output().unwrap();
        assert_eq!(theirs.status.code(), Some(1), "cryptsetup {reduce}");
        assert!(
            String::from_utf8_lossy(&theirs.stderr).contains(msg),
            "cryptsetup {reduce}"
        );
    }
    // An encrypted device is not encrypted again.
    let d = Dev::new(41);
    d.run(DMKIT, &encrypt(&[]));
    let before = fs::read(&d.img).unwrap();
    let out = d.command(DMKIT, &encrypt(&[])).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is already LUKS device"));
    assert!(fs::read(&d.img).unwrap() == before);
}
