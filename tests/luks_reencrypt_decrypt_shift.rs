//! `luks reencrypt --decrypt --header NEWFILE` of a LUKS2 device whose header is at its start
//! (the header exported to NEWFILE, the plaintext moved down to byte 0 while it is decrypted)
//! against cryptsetup 2.6.1 both ways: the metadata and bytes of `--init-only` field for field,
//! full runs, `--init-only` by one tool resumed by the other, each tool killed (SIGKILL)
//! mid-run and finished by the other, a cut at every write of a run resumed by dmkit and by
//! cryptsetup, a device left mid-decryption opened in dmkit, and the refusals. The ciphertext
//! is made without dmkit (cryptsetup's volume key, OpenSSL's AES-XTS), and the plaintext read
//! back is compared with the original.
//!
//! Needs cryptsetup (and /dev/fuse for the open test): skips without them, fails under CI=1.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::reencrypt::{must, shape};
use common::rng::SplitMix64;
use common::run::Workspace;
use common::DMKIT;
use dmkit::block::Window;
use dmkit::block::{for_each_crash_state, BlockDevice, FaultyDevice, LoggedOp, MemoryDevice};
use dmkit::crypt::luks2::copies;
use dmkit::crypt::luks2::reencrypt::engine::unlock_keys;
use dmkit::crypt::luks2::reencrypt::{decrypt_shift, ReencryptState, RunOutcome};
use serde_json::Value;
use std::fs;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const KEY: &str = "decrypt and shift";
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// The data offset (and shift): 1 MiB, the smallest cryptsetup's --offset allows with room
/// for a keyslot and the moved segment's checksums.
const SHIFT: usize = 1 << 20;
/// 8 MiB devices: 7 MiB of data, six hotzones and the moved segment.
const SIZE: usize = 8 << 20;

/// An encrypted device with its header at its start, and the plaintext it holds.
struct Dev {
    e: Workspace,
    img: String,
    key: String,
    hdr: String,
    plain: Vec<u8>,
}

fn missing() -> bool {
    tool_missing("cryptsetup", "cryptsetup-bin")
}

impl Dev {
    fn new(seed: u64) -> Dev {
        Dev::sized(seed, SIZE, 512)
    }

    /// A `size`-byte device formatted by cryptsetup with a 1 MiB data offset and sectors of
    /// `sector`, its data the AES-XTS ciphertext (OpenSSL, cryptsetup's volume key) of
    /// pseudo-random plaintext.
    fn sized(seed: u64, size: usize, sector: usize) -> Dev {
        let (e, key, img, _) = common::reencrypt::plain_image(seed, size, KEY, "disk.img");
        let ss = sector.to_string();
        let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode"];
        args.extend(KDF);
        args.extend([
            "--key-file",
            &key,
            "--offset",
            "2048",
            "--sector-size",
            &ss,
            &img,
        ]);
        common::run::ok("cryptsetup", &args);
        let vk = common::volume_key::cryptsetup(&key, &img, None);
        let plain = SplitMix64(seed ^ 0x9e37).bytes(size - SHIFT);
        let mut bytes = fs::read(&img).unwrap();
        bytes[SHIFT..].copy_from_slice(&common::xts::xts(&vk, &plain, sector, 0, true));
        fs::write(&img, &bytes).unwrap();
        let hdr = e.s("exported.hdr");
        Dev {
            e,
            img,
            key,
            hdr,
            plain,
        }
    }

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
            self.cryptsetup(&[
                "luksDump",
                "--dump-json-metadata",
                "--header",
                &self.hdr,
                &self.img,
            ]),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The header file says a decryption is under way (read raw: it may be half made).
    fn under_way(&self) -> bool {
        fs::read(&self.hdr).is_ok_and(|b| {
            b.len() > 32 << 10
                && b[..32 << 10]
                    .windows(19)
                    .any(|w| w == b"online-reencrypt-v3")
        })
    }

    fn crashed(&self) -> bool {
        self.under_way() && self.meta().to_string().contains("in-reencryption")
    }

    fn command(&self, program: &str, extra: &[&str]) -> Command {
        common::reencrypt::offline_command(
            program,
            &["--key-file", &self.key, "--header", &self.hdr],
            extra,
            &self.img,
            self.e.dir(),
        )
    }

    fn run(&self, program: &str, extra: &[&str]) {
        common::reencrypt::run_must(program, extra, self.command(program, extra));
    }

    /// Start decrypting with `program`, SIGKILL it `delay` after the header file says the
    /// decryption is under way; whether it was still running then.
    fn kill(&self, program: &str, delay: Duration) -> bool {
        let cmd = self.command(program, &decrypt(&[]));
        common::reencrypt::kill_when_under_way(cmd, &|| self.under_way(), delay)
    }

    /// Resume with `program`: cryptsetup wants a crashed hotzone repaired first.
    fn resume(&self, program: &str) {
        if program == "cryptsetup" && self.crashed() {
            let out = self.cryptsetup(&[
                "repair",
                "--batch-mode",
                "--key-file",
                &self.key,
                "--header",
                &self.hdr,
                &self.img,
            ]);
            must("cryptsetup repair", out);
            if self.meta()["config"].get("requirements").is_none() {
                return;
            }
        }
        self.run(program, &["--resume-only"]);
    }

    /// Decrypted to the end: the header file holds one linear segment at 0 and no keyslot
    /// (as cryptsetup leaves it), the device's first bytes are the plaintext.
    fn decrypted(&self, what: &str) {
        self.decrypted_leaving(what, false)
    }

    /// As [`Self::decrypted`]; with `unbound_keyslots`, keyslots of the old key may be left
    /// when bound to no segment: dmkit drops the reencryption metadata before it destroys the
    /// old keyslots (so a crash never leaves a device in reencryption whose old key nothing
    /// unlocks), and a kill between the two leaves them.
    fn decrypted_leaving(&self, what: &str, unbound_keyslots: bool) {
        let m = self.meta();
        assert!(m["config"].get("requirements").is_none(), "{what}: {m}");
        let segs = m["segments"].as_object().unwrap();
        assert_eq!(segs.len(), 1, "{what}: {m}");
        assert_eq!(segs["0"]["type"], "linear", "{what}");
        assert_eq!(segs["0"]["offset"], "0", "{what}");
        let slots = m["keyslots"].as_object().unwrap();
        if unbound_keyslots {
            for d in m["digests"].as_object().unwrap().values() {
                assert_eq!(d["segments"], serde_json::json!([]), "{what}: {m}");
            }
        } else {
            assert!(slots.is_empty(), "{what}: {m}");
        }
        check_plain(&fs::read(&self.img).unwrap(), &self.plain, what);
    }
}

/// `img` starts with `plain`.
fn check_plain(img: &[u8], plain: &[u8], what: &str) {
    if img[..plain.len()] != *plain {
        let first = img
            .chunks(512)
            .zip(plain.chunks(512))
            .position(|(a, b)| a != b)
            .unwrap();
        panic!("{what}: the plaintext differs from sector {first}");
    }
}

/// `--decrypt` with cheap KDFs and `extra`.
fn decrypt(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["--decrypt"];
    v.extend(KDF);
    v.extend(extra);
    v
}

#[test]
fn init_only_writes_what_cryptsetup_writes() {
    if missing() {
        return;
    }
    let journal = ["--resilience", "journal", "--hotzone-size", "512k"];
    for (sector, extra) in [(512, &[][..]), (4096, &journal[..])] {
        let d = Dev::sized(1, SIZE, sector);
        let c = Dev::sized(1, SIZE, sector);
        fs::copy(&d.img, &c.img).unwrap();
        d.run(DMKIT, &decrypt(&[&["--init-only"], extra].concat()));
        c.run("cryptsetup", &decrypt(&[&["--init-only"], extra].concat()));
        let what = format!("sector size {sector} {extra:?}");
        assert_eq!(shape(d.meta()), shape(c.meta()), "{what}");
        let m = d.meta();
        assert_eq!(
            m["config"]["requirements"]["mandatory"][0],
            "online-reencrypt-v3"
        );
        // The devices are the same bytes (magic wiped, first segment moved), and so are the
        // header files past their copies (the keyslots area).
        assert!(
            fs::read(&d.img).unwrap() == fs::read(&c.img).unwrap(),
            "{what}: devices"
        );
        let (a, b) = (fs::read(&d.hdr).unwrap(), fs::read(&c.hdr).unwrap());
        assert_eq!(a.len(), SHIFT, "{what}");
        assert!(a[32 << 10..] == b[32 << 10..], "{what}: keyslots areas");
        let mode = |p: &str| {
            use std::os::unix::fs::PermissionsExt;
            fs::metadata(p).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&d.hdr), mode(&c.hdr), "{what}: header file mode");
    }
}

#[test]
fn full_runs_and_crossed_resumes() {
    if missing() {
        return;
    }
    let d = Dev::new(2);
    d.run(DMKIT, &decrypt(&[]));
    d.decrypted("dmkit --decrypt");
    let d = Dev::sized(3, SIZE, 4096);
    d.run(
        DMKIT,
        &decrypt(&["--resilience", "journal", "--hotzone-size", "512k"]),
    );
    d.decrypted("dmkit --decrypt --sector-size 4096 --resilience journal, 512k moved");
    // Less data than the shift: the moved segment is all of it.
    let d = Dev::sized(4, SHIFT + (512 << 10), 512);
    d.run(DMKIT, &decrypt(&[]));
    d.decrypted("0.5 MiB of data");
    for (init, resume) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        let d = Dev::new(5);
        d.run(init, &decrypt(&["--init-only"]));
        assert!(d.under_way(), "{init} --init-only");
        d.run(resume, &["--resume-only"]);
        d.decrypted(&format!("{init} --init-only, {resume} --resume-only"));
    }
}

#[test]
fn killed_midway_is_finished_by_the_other_tool() {
    if missing() {
        return;
    }
    common::reencrypt::killed_both_ways(0xdec, 60, |round| Dev::new(10 + round));
}

impl common::reencrypt::Killable for Dev {
    fn kill(&self, program: &str, delay: Duration) -> bool {
        Dev::kill(self, program, delay)
    }
    fn crashed(&self) -> bool {
        Dev::crashed(self)
    }
    fn finish(&self, program: &str) {
        if self.under_way() {
            self.resume(program);
        }
    }
    fn check(&self, what: &str) {
        self.decrypted_leaving(what, true)
    }
}

/// A small device (three hotzones of 1 MiB, the last the moved segment), header file and data
/// as one image so that every write of a run can be cut in order: dmkit resumes from every
/// state, cryptsetup from every third.
#[test]
fn a_cut_at_every_write_resumes_in_both_tools() {
    if missing() {
        return;
    }
    let d = Dev::sized(20, 4 << 20, 512);
    d.run(DMKIT, &decrypt(&["--init-only"]));
    let hdr_len = SHIFT as u64;
    let base = [fs::read(&d.hdr).unwrap(), fs::read(&d.img).unwrap()].concat();
    let data_len = base.len() as u64 - hdr_len;
    let run = |dev: &dyn BlockDevice| -> RunOutcome {
        let hdr = Window::new(dev, 0, hdr_len).unwrap();
        let data = Window::new(dev, hdr_len, data_len).unwrap();
        let mut h = copies::read(&hdr).unwrap().header;
        let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
        let keys = unlock_keys(&hdr, &h, &st, KEY.as_bytes(), None).unwrap();
        decrypt_shift::run(&hdr, &data, &mut h, &keys, &mut |_| true, None).unwrap()
    };
    let faulty = FaultyDevice::new(MemoryDevice::from_vec("both", base.clone()));
    faulty.start_log();
    assert_eq!(run(&faulty), RunOutcome::Finished);
    let log = faulty.take_log();
    let writes = log
        .iter()
        .filter(|o| matches!(o, LoggedOp::Write { .. }))
        .count();
    assert!(writes > 15, "{writes} writes");
    let split = |img: &[u8]| (img[..SHIFT].to_vec(), img[SHIFT..].to_vec());
    let done = |hdr: &[u8], data: &[u8], what: &str| {
        let h = copies::read(&MemoryDevice::from_vec("check", hdr.to_vec()))
            .unwrap()
            .header;
        assert!(
            h.metadata.config.requirements.is_empty(),
            "{what}: still in reencryption"
        );
        check_plain(data, &d.plain, what);
    };
    let (mut states, mut by_cryptsetup) = (0, 0);
    for_each_crash_state(&base, &log, |what, img| {
        states += 1;
        let mem = MemoryDevice::from_vec("crashed", img.to_vec());
        let st = ReencryptState::read(
            &copies::read(&Window::new(&mem, 0, hdr_len).unwrap())
                .unwrap()
                .header
                .metadata,
        )
        .unwrap();
        // Every hotzone committed, the teardown not begun: cryptsetup 2.6.1 takes the
        // plaintext at 0 for the moved segment's ciphertext and decrypts it again (seen
        // here, it reports success). dmkit's run never leaves it: the teardown's header
        // write is the last hotzone's commit.
        let tail = st
            .as_ref()
            .is_some_and(|st| st.hot.is_none() && st.segments.iter().all(|s| s.kind == "linear"));
        assert!(
            !tail,
            "{what}: the state after the last hotzone was left behind"
        );
        if st.is_some() {
            assert_eq!(run(&mem), RunOutcome::Finished, "{what}");
        }
        let (h, data) = split(&mem.contents());
        done(&h, &data, &format!("dmkit after {what}"));
        if st.is_some() && states % 3 == 1 {
            by_cryptsetup += 1;
            let (h, data) = split(img);
            fs::write(&d.hdr, h).unwrap();
            fs::write(&d.img, data).unwrap();
            d.resume("cryptsetup");
            let (h, data) = (fs::read(&d.hdr).unwrap(), fs::read(&d.img).unwrap());
            done(&h, &data, &format!("cryptsetup after {what}"));
        }
    });
    assert!(states > writes, "{states} states");
    eprintln!("{states} states after {writes} writes; cryptsetup resumed {by_cryptsetup}");
}

#[test]
fn a_device_left_mid_decryption_opens_in_dmkit() {
    if missing() || fuse_missing() {
        return;
    }
    let (mut rng, mut seen) = (SplitMix64(0x5d7), 0);
    for round in 0..4u64 {
        let d = Dev::new(30 + round);
        let first = if round % 2 == 0 { DMKIT } else { "cryptsetup" };
        d.kill(first, Duration::from_millis(rng.below(40)));
        if !d.under_way() {
            continue;
        }
        let segs = d.meta()["segments"].as_object().unwrap().len();
        seen += usize::from(segs > 4);
        let name = format!("dshift{round}");
        let args = ["--key-file", &d.key, "--header", &d.hdr, &d.img];
        let back = common::reencrypt::read_served(&d.e, &args, &name);
        assert!(
            back.len() == d.plain.len() && back == d.plain,
            "round {round} ({first} killed, {segs} segments): read back differs"
        );
        d.resume(DMKIT);
        d.decrypted(&format!("round {round}, after the open"));
    }
    assert!(seen > 0, "never caught mid-way");
}

#[test]
fn refusals_match_cryptsetup() {
    if missing() {
        return;
    }
    let d = Dev::new(40);
    let before = fs::read(&d.img).unwrap();
    // Each case: the options, a file put at --header first (None: it does not exist), the
    // exit code, and cryptsetup's words.
    let junk = d.e.s("junk.hdr");
    fs::write(&junk, b"not a header").unwrap();
    let bad_key = d.e.s("bad.key");
    fs::write(&bad_key, "wrong").unwrap();
    let mut cases: Vec<(Vec<&str>, &str, i32, &str)> = vec![
        (vec![], "", 1, "LUKS2 decryption requires --header option."),
        (
            vec!["--header", &junk],
            "",
            1,
            "is not a valid LUKS device.",
        ),
        (
            vec!["--header", "new.hdr", "--hotzone-size", "2M"],
            "",
            1,
            "Moved segment size can not be greater than data shift value.",
        ),
        (
            vec!["--header", "new.hdr", "--resume-only"],
            "",
            1,
            "Device reencryption not in progress.",
        ),
        (
            vec!["--header", "new.hdr"],
            &bad_key,
            2,
            "No key available with this passphrase.",
        ),
    ];
    let not_applied =
        "Requested --resilience option cannot be applied to current reencryption operation.";
    for (mode, msg) in [
        ("none", not_applied),
        ("datashift", not_applied),
        ("foo", "Unsupported resilience mode foo"),
    ] {
        cases.push((
            vec!["--header", "new.hdr", "--resilience", mode],
            "",
            1,
            msg,
        ));
    }
    for (opts, key, code, msg) in cases {
        for program in [DMKIT, "cryptsetup"] {
            let key = if key.is_empty() { &d.key } else { key };
            let mut args = vec!["--key-file", key];
            if !opts.contains(&"--resume-only") {
                args.push("--init-only");
            }
            args.extend(&opts);
            let mut c = Command::new(program);
            c.args(common::reencrypt::argv(
                program,
                &args,
                &decrypt(&[]),
                &d.img,
            ))
            .current_dir(d.e.dir())
            .stdin(Stdio::null());
            let out = c.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{program} {opts:?}: {err}");
            assert!(err.contains(msg), "{program} {opts:?}: {err}");
            assert!(
                fs::read(&d.img).unwrap() == before,
                "{program} {opts:?}: device changed"
            );
            assert!(
                !d.e.path("new.hdr").exists(),
                "{program} {opts:?}: header left"
            );
        }
    }
    // Not a LUKS2 device with its header at its start (the data of a detached header; one in
    // decryption already; an unmet requirement): the header to export reads as missing.
    let plain = d.e.s("plain.img");
    fs::write(&plain, &d.plain).unwrap();
    let busy = Dev::new(42);
    busy.run(DMKIT, &decrypt(&["--init-only"]));
    let req = Dev::new(43);
    {
        let dev = dmkit::block::open_device(std::path::Path::new(&req.img), false, false).unwrap();
        let mut h = copies::read(&dev).unwrap().header;
        h.metadata.config.requirements = vec!["x-future-feature".into()];
        h.write(&dev).unwrap();
    }
    for (img, key, what) in [
        (&plain, &d.key, "data of a detached header"),
        (&busy.img, &busy.key, "in decryption"),
        (&req.img, &req.key, "unmet requirement"),
    ] {
        let bytes = fs::read(img).unwrap();
        for program in [DMKIT, "cryptsetup"] {
            let dir = std::path::Path::new(img).parent().unwrap();
            let out = Command::new(program)
                .args(common::reencrypt::argv(
                    program,
                    &["--key-file", key, "--header", "other.hdr"],
                    &decrypt(&[]),
                    img,
                ))
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            eprintln!("{what}, {program}: {} {}", out.status, err.trim());
            assert_eq!(out.status.code(), Some(1), "{what}, {program}: {err}");
            let msg = if what == "unmet requirement" {
                "Unmet LUKS2 requirements detected."
            } else {
                "other.hdr does not exist or access denied."
            };
            assert!(err.contains(msg), "{what}, {program}: {err}");
            let changed = fs::read(img).unwrap() != bytes;
            let left = dir.join("other.hdr").exists();
            if program != DMKIT && what == "unmet requirement" {
                // cryptsetup 2.6.1 finds the requirement after it exported the header and
                // wiped the device's magic: it says where the backup is, and leaves it so.
                eprintln!("cryptsetup, {what}: device changed {changed}, header left {left}");
                continue;
            }
            assert!(!changed, "{what}, {program}: changed");
            assert!(!left, "{what}, {program}: header left");
        }
    }
}
