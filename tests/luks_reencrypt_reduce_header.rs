//! `luks reencrypt --encrypt --reduce-device-size S --header HDR` (the header file S bytes,
//! the data encrypted in place, backward, S bytes at a time) against cryptsetup 2.6.1 both
//! ways: the metadata of `--init-only` field for field, full runs checked by decrypting with
//! each tool, `--init-only` by one tool resumed by the other, each tool stopped (SIGTERM) and
//! killed (SIGKILL) mid-run and finished by the other, a cut at every write of a run resumed
//! by dmkit and by cryptsetup, cryptsetup's own run cut after its last hotzone (which it
//! encrypts a second time; dmkit finishes it), a device cryptsetup cannot finish (between one
//! and two shifts), and the refusals.
//!
//! A SIGKILL inside a hotzone leaves bytes half rewritten in place with no copy anywhere: no
//! tool can recover them (cryptsetup's repair fills them with the plaintext one shift before).
//! dmkit refuses that state and changes nothing; the test checks the refusal and that every
//! byte outside the hotzone is still right.
//!
//! Needs cryptsetup (and strace for the cut of cryptsetup's own run): skips without them,
//! fails under CI=1.

mod common;

use common::env::{tool_missing, tools_missing};
use common::reencrypt::{
    kill_when_under_way, logged_run, must, not_in_progress, offline_command, refuses, run_must,
    shape,
};
use common::rng::SplitMix64;
use common::run::Workspace;
use common::DMKIT;
use dmkit::block::{for_each_crash_state, BlockDevice, MemoryDevice, Window};
use dmkit::crypt::luks::LuksError;
use dmkit::crypt::luks2::reencrypt::engine::unlock_keys;
use dmkit::crypt::luks2::reencrypt::{datashift, ReencryptState, RunOutcome};
use dmkit::crypt::luks2::{copies, Segment};
use serde_json::Value;
use std::fs;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const KEY: &str = "reduce with a header";
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// The smallest reduction whose keyslots area holds a 512-bit keyslot and the reencrypt one.
const REDUCE: &str = "512k";
const SHIFT: usize = 512 << 10;

fn missing() -> bool {
    tool_missing("cryptsetup", "cryptsetup-bin")
}

/// A plaintext device with the header file to be.
struct Dev {
    e: Workspace,
    img: String,
    hdr: String,
    key: String,
    plain: Vec<u8>,
}

impl Dev {
    fn new(seed: u64, size: usize) -> Dev {
        let (e, key, img, plain) = common::reencrypt::plain_image(seed, size, KEY, "disk.img");
        let hdr = e.s("hdr.img");
        Dev {
            e,
            img,
            hdr,
            key,
            plain,
        }
    }

    fn command(&self, program: &str, extra: &[&str]) -> Command {
        let tail = ["--key-file", &self.key, "--header", &self.hdr];
        offline_command(program, &tail, extra, &self.img, self.e.dir())
    }

    fn run(&self, program: &str, extra: &[&str]) {
        run_must(program, extra, self.command(program, extra));
    }

    fn output(&self, program: &str, extra: &[&str]) -> Output {
        self.command(program, extra).output().unwrap()
    }

    fn cryptsetup(&self, args: &[&str]) -> Output {
        Command::new("cryptsetup")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn meta(&self) -> Value {
        let dump = ["luksDump", "--dump-json-metadata", &self.hdr];
        serde_json::from_slice(&must("luksDump", self.cryptsetup(&dump)).stdout).unwrap()
    }

    /// The header file says a reencryption is under way.
    fn under_way(&self) -> bool {
        fs::read(&self.hdr).is_ok_and(|b| {
            b.len() >= 16 << 10
                && b[..16 << 10]
                    .windows(19)
                    .any(|w| w == b"online-reencrypt-v2")
        })
    }

    fn crashed(&self) -> bool {
        self.under_way() && self.meta().to_string().contains("in-reencryption")
    }

    fn volume_key(&self) -> Vec<u8> {
        common::volume_key::cryptsetup(&self.key, &self.img, Some(&self.hdr))
    }

    /// Encrypted to the end, as cryptsetup leaves it: one dynamic crypt segment at 0, the
    /// whole device decrypting (the key from cryptsetup) to the plaintext.
    fn encrypted(&self, what: &str) {
        let m = self.meta();
        assert!(m["config"].get("requirements").is_none(), "{what}: {m}");
        let segs = m["segments"].as_object().unwrap();
        assert_eq!(segs.len(), 1, "{what}: {m}");
        let seg = &segs["0"];
        assert_eq!(
            (&seg["type"], &seg["offset"], &seg["size"]),
            (&"crypt".into(), &"0".into(), &"dynamic".into()),
            "{what}"
        );
        assert_eq!(m["keyslots"].as_object().unwrap().len(), 1, "{what}: {m}");
        let ss = seg["sector_size"].as_u64().unwrap() as usize;
        let img = fs::read(&self.img).unwrap();
        let back = common::xts::xts(&self.volume_key(), &img, ss, 0, false);
        assert!(back == self.plain, "{what}: the data does not decrypt back");
    }

    /// Decrypted in place by `program`: the plaintext again.
    fn decrypts_with(&self, program: &str) {
        self.run(program, &["--decrypt"]);
        assert!(
            fs::read(&self.img).unwrap() == self.plain,
            "{program} --decrypt"
        );
    }

    /// A hotzone cut by a SIGKILL: dmkit refuses it and writes nothing, and every byte
    /// outside it is right (plaintext before it, ciphertext after).
    fn refused_and_intact_outside(&self, what: &str) {
        let m = self.meta();
        let (hdr, img) = (fs::read(&self.hdr).unwrap(), fs::read(&self.img).unwrap());
        let out = self.output(DMKIT, &["--resume-only"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains("cannot be recovered"), "{what}: {err}");
        assert!(
            fs::read(&self.hdr).unwrap() == hdr,
            "{what}: header changed"
        );
        assert!(fs::read(&self.img).unwrap() == img, "{what}: data changed");
        let segs = m["segments"].as_object().unwrap();
        let hot = segs
            .values()
            .find(|s| s.to_string().contains("in-reencryption"))
            .unwrap();
        let num = |v: &Value| v.as_str().unwrap().parse::<usize>().unwrap();
        let (start, end) = (num(&hot["offset"]), num(&hot["offset"]) + num(&hot["size"]));
        assert!(
            img[..start] == self.plain[..start],
            "{what}: plaintext before"
        );
        let back = common::xts::xts(
            &self.volume_key(),
            &img[end..],
            512,
            end as u64 / 512,
            false,
        );
        assert!(back == self.plain[end..], "{what}: ciphertext after");
    }
}

fn encrypt(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["--encrypt", "--reduce-device-size", REDUCE];
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
        let (d, c) = (Dev::new(1, 3 << 20), Dev::new(1, 3 << 20));
        d.run(DMKIT, &encrypt(&[&["--init-only"], extra].concat()));
        c.run("cryptsetup", &encrypt(&[&["--init-only"], extra].concat()));
        assert_eq!(shape(d.meta()), shape(c.meta()), "sector size {what}");
        let (a, b) = (fs::read(&d.hdr).unwrap(), fs::read(&c.hdr).unwrap());
        assert_eq!((a.len(), b.len()), (SHIFT, SHIFT), "header file sizes");
        assert!(
            fs::read(&d.img).unwrap() == d.plain,
            "dmkit wrote to the data"
        );
    }
}

#[test]
fn full_runs_and_crossed_resumes() {
    if missing() {
        return;
    }
    // A whole number of shifts, and not (the part beyond them goes first).
    for (seed, size) in [(2, 3 << 20), (3, (3 << 20) + (128 << 10))] {
        let d = Dev::new(seed, size);
        d.run(DMKIT, &encrypt(&[]));
        d.encrypted(&format!("dmkit, {size} bytes"));
        let c = Dev::new(seed, size);
        c.run("cryptsetup", &encrypt(&[]));
        assert_eq!(shape(d.meta()), shape(c.meta()), "the end, {size} bytes");
        d.decrypts_with("cryptsetup");
        c.decrypts_with(DMKIT);
    }
    let d = Dev::new(4, 2 << 20);
    d.run(DMKIT, &encrypt(&["--sector-size", "4096"]));
    d.encrypted("--sector-size 4096");
    for (init, resume) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        let d = Dev::new(5, (2 << 20) + (64 << 10));
        d.run(init, &encrypt(&["--init-only"]));
        d.run(resume, &["--resume-only"]);
        d.encrypted(&format!("{init} --init-only, {resume} --resume-only"));
    }
}

/// Between one and two shifts of data, cryptsetup 2.6.1 stops after its first hotzone
/// ("Failed to update reencryption context.") and cannot resume; dmkit finishes it, and
/// encrypts such a device itself.
#[test]
fn a_device_cryptsetup_cannot_finish() {
    if missing() {
        return;
    }
    let size = SHIFT + (128 << 10);
    let d = Dev::new(6, size);
    let out = d.output("cryptsetup", &encrypt(&[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Failed to update reencryption context."),
        "cryptsetup: {err}"
    );
    d.run(DMKIT, &["--resume-only"]);
    d.encrypted("cryptsetup's stuck run finished by dmkit");
    let d = Dev::new(7, size);
    d.run(DMKIT, &encrypt(&[]));
    d.encrypted("dmkit, one and a quarter shifts");
}

/// Start encrypting with `program`, send `signal` `delay` after the header is in place;
/// whether it was still running then.
fn signal(d: &Dev, program: &str, signal: i32, delay: Duration) -> bool {
    let mut cmd = d.command(program, &encrypt(&[]));
    if signal == libc::SIGKILL {
        return kill_when_under_way(cmd, &|| d.under_way(), delay);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while !d.under_way() {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(delay);
    let running = child.try_wait().unwrap().is_none();
    // SAFETY: kill(2) on our own child, which has not been waited for yet.
    unsafe { libc::kill(child.id() as i32, signal) };
    let _ = child.wait();
    running
}

/// Each tool stopped (SIGTERM: at a hotzone boundary) and killed (SIGKILL: anywhere) at
/// random points of an 8 MiB run, the other tool finishing; a kill inside a hotzone is
/// refused by dmkit with everything outside it intact.
#[test]
fn stopped_or_killed_midway_is_finished_by_the_other_tool() {
    if missing() {
        return;
    }
    let mut rng = SplitMix64(0x36);
    let mut finished = 0;
    for (first, then) in [(DMKIT, "cryptsetup"), ("cryptsetup", DMKIT)] {
        for (sig, rounds) in [(libc::SIGTERM, 2), (libc::SIGKILL, 3)] {
            for round in 0..rounds {
                let d = Dev::new(10 + round, 8 << 20);
                let delay = Duration::from_millis(rng.below(150));
                let running = signal(&d, first, sig, delay);
                let what = format!("{first} signal {sig} after {delay:?} (running: {running})");
                eprintln!("{what}, crashed hotzone: {}", d.crashed());
                if d.crashed() {
                    assert_eq!(sig, libc::SIGKILL, "{what}: SIGTERM left a hotzone");
                    d.refused_and_intact_outside(&what);
                    continue;
                }
                if d.under_way() {
                    d.run(then, &["--resume-only"]);
                    finished += 1;
                }
                d.encrypted(&what);
            }
        }
    }
    assert!(finished > 0, "no run was ever finished by the other tool");
}

/// `hdr` and `data` (a header file and its device, as bytes) are encrypted to the end, as
/// [`Dev::encrypted`] checks it, read by dmkit's header parser: no requirement left, one
/// dynamic crypt segment at 0, one keyslot, the data decrypting with `vk` to `plain`.
fn encrypted_bytes(hdr: &[u8], data: &[u8], vk: &[u8], plain: &[u8], what: &str) {
    let m = copies::read(&MemoryDevice::from_vec("check", hdr.to_vec()))
        .unwrap()
        .header
        .metadata;
    assert!(
        m.config.requirements.is_empty(),
        "{what}: still in reencryption"
    );
    assert_eq!(m.segments.len(), 1, "{what}: segments");
    let seg = &m.segments[&0];
    assert_eq!(
        (seg.kind.as_str(), seg.offset, seg.size),
        ("crypt", 0, None),
        "{what}"
    );
    assert_eq!(m.keyslots.len(), 1, "{what}: keyslots");
    let back = common::xts::xts(vk, data, seg.sector_size as usize, 0, false);
    assert!(back == plain, "{what}: the data does not decrypt back");
}

/// A run over five hotzones (the 128 KiB beyond the whole shifts, then four of 512 KiB), the
/// header file and the data as one image so that every write can be cut in order. That is
/// exact for two files: every header write and every hotzone is flushed before the other
/// file is written, so a cut never leaves writes pending on both. Every state is tried with
/// both tools (a few dozen, a few seconds: no sampling): dmkit finishes or refuses it,
/// cryptsetup opens what dmkit finished (its `luksDump` and volume key, the data decrypted
/// with OpenSSL) and resumes what it can.
#[test]
fn a_cut_at_every_write_resumes_in_both_tools() {
    if missing() {
        return;
    }
    let size = (2 << 20) + (128 << 10);
    let d = Dev::new(20, size);
    d.run(DMKIT, &encrypt(&["--init-only"]));
    let vk = d.volume_key();
    let base = [fs::read(&d.hdr).unwrap(), fs::read(&d.img).unwrap()].concat();
    /// The header file and the data of the one image `dev`.
    fn windows(dev: &dyn BlockDevice) -> (Window<&dyn BlockDevice>, Window<&dyn BlockDevice>) {
        let data = dev.size() - SHIFT as u64;
        let hdr = Window::new(dev, 0, SHIFT as u64).unwrap();
        (hdr, Window::new(dev, SHIFT as u64, data).unwrap())
    }
    let state = |dev: &dyn BlockDevice| {
        let h = copies::read(&windows(dev).0).unwrap().header;
        ReencryptState::read(&h.metadata).unwrap()
    };
    let run = |dev: &dyn BlockDevice| -> Result<RunOutcome, LuksError> {
        let (hdr, data) = windows(dev);
        let mut h = copies::read(&hdr).unwrap().header;
        let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
        let keys = unlock_keys(&hdr, &h, &st, KEY.as_bytes(), None).unwrap();
        datashift::run(&hdr, &data, &mut h, &keys, &mut |_| true)
    };
    let (log, writes) = logged_run(&base, |dev| run(dev).unwrap());
    // Five writes a hotzone (two header copies on each side of the data); the last hotzone's
    // closing pair drops the metadata, then the reencrypt keyslot's area is wiped.
    assert_eq!(writes, 5 * 5 + 1, "writes of the run");
    let to_files = |img: &[u8]| {
        fs::write(&d.hdr, &img[..SHIFT]).unwrap();
        fs::write(&d.img, &img[SHIFT..]).unwrap();
    };
    let (mut states, mut finished, mut refused) = (0, 0, 0);
    let (mut by_cryptsetup, mut short, mut after_last) = (0, 0, 0);
    for_each_crash_state(&base, &log, |what, img| {
        states += 1;
        let mem = MemoryDevice::from_vec("crashed", img.to_vec());
        let st = state(&mem);
        if st.as_ref().is_some_and(|st| st.hot.is_some()) {
            // Cut inside a hotzone: its bytes were being rewritten in place and no copy of
            // them exists (datashift without a moved segment keeps none), so nothing tells
            // whether they are plaintext or ciphertext. dmkit refuses and writes nothing (the
            // library here, the command line with the bytes outside the hotzone checked);
            // cryptsetup 2.6.1 wants a `repair`, which fills the hotzone with the plaintext
            // from one shift before it (data lost silently), so it is not asked.
            let err = run(&mem).unwrap_err().to_string();
            assert!(err.contains("cannot be recovered"), "{what}: {err}");
            assert!(
                mem.contents() == img,
                "{what}: dmkit wrote to a cut hotzone"
            );
            to_files(img);
            d.refused_and_intact_outside(what);
            refused += 1;
            return;
        }
        if st.is_some() {
            assert_eq!(run(&mem).unwrap(), RunOutcome::Finished, "{what}");
        }
        let done = mem.contents();
        encrypted_bytes(&done[..SHIFT], &done[SHIFT..], &vk, &d.plain, what);
        to_files(&done);
        d.encrypted(&format!("cryptsetup opens dmkit's result after {what}"));
        finished += 1;
        let Some(st) = st else {
            // After the last hotzone (its closing header write drops the metadata, the
            // secondary copy first): cryptsetup finds no reencryption to resume, says so and
            // changes nothing, and opens the data as dmkit would have finished it.
            to_files(img);
            let cmd = d.command("cryptsetup", &["--resume-only"]);
            not_in_progress(cmd, &format!("cryptsetup after {what}"));
            let now = [fs::read(&d.hdr).unwrap(), fs::read(&d.img).unwrap()].concat();
            encrypted_bytes(&now[..SHIFT], &now[SHIFT..], &vk, &d.plain, what);
            assert!(
                now[SHIFT..] == img[SHIFT..],
                "cryptsetup after {what}: data changed"
            );
            d.encrypted(&format!("cryptsetup --resume-only after {what}"));
            after_last += 1;
            return;
        };
        let crypt = |s: &Segment| s.kind == "crypt";
        // Every byte encrypted and the metadata still there: cryptsetup 2.6.1 resumes that
        // state at progress 0 and encrypts the whole device a second time, reporting success
        // (see `cryptsetup_cut_after_its_last_hotzone`). dmkit's runs never leave it.
        assert!(
            !st.segments.iter().all(crypt),
            "{what}: every byte encrypted and the metadata still there"
        );
        let first_zone = st
            .segments
            .iter()
            .find(|s| crypt(s))
            .is_some_and(|s| size as u64 - s.offset < SHIFT as u64);
        if first_zone {
            // Only dmkit's first hotzone (the part beyond the whole shifts) is encrypted:
            // cryptsetup 2.6.1 refuses to resume with "Device ... is too small." and leaves
            // the data and the metadata as they were (it only rewrites a stale primary copy
            // from the secondary); dmkit finishes (checked above).
            to_files(img);
            let meta = d.meta();
            let cmd = d.command("cryptsetup", &["--resume-only"]);
            refuses(cmd, "is too small.", &format!("cryptsetup after {what}"));
            let now = fs::read(&d.img).unwrap();
            assert!(now == img[SHIFT..], "cryptsetup after {what}: data changed");
            assert_eq!(d.meta(), meta, "cryptsetup after {what}: metadata changed");
            short += 1;
        } else {
            to_files(img);
            d.run("cryptsetup", &["--resume-only"]);
            d.encrypted(&format!("cryptsetup --resume-only after {what}"));
            by_cryptsetup += 1;
        }
    });
    assert!(states > writes, "{states} states");
    assert!(short > 0, "the state after the first hotzone was never cut");
    assert!(after_last > 0, "no state after the last hotzone was cut");
    eprintln!(
        "{states} states after {writes} writes: dmkit finished {finished} (each opened by \
         cryptsetup) and refused {refused} cut hotzones; cryptsetup resumed {by_cryptsetup}, \
         refused {short} after the first hotzone and found nothing to resume in the \
         {after_last} after the last"
    );
}

impl Dev {
    /// cryptsetup encrypting under strace, with `inject` (strace's fault injection) if any;
    /// its fsyncs are logged to `trace`.
    fn cryptsetup_traced(&self, trace: &str, inject: Option<String>) -> Output {
        let tail = ["--key-file", &self.key, "--header", &self.hdr];
        let mut c = Command::new("strace");
        c.args(["-f", "-o", trace, "-e", "trace=fsync"]);
        if let Some(i) = inject {
            c.args(["-e", &i]);
        }
        c.arg("cryptsetup")
            .args(common::reencrypt::argv(
                "cryptsetup",
                &tail,
                &encrypt(&[]),
                &self.img,
            ))
            .current_dir(self.e.dir())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Every byte encrypted, the reencryption metadata still there: one data segment, crypt.
    fn tail(&self) -> bool {
        if !self.under_way() {
            return false;
        }
        let m = self.meta();
        let data: Vec<&Value> = m["segments"]
            .as_object()
            .unwrap()
            .values()
            .filter(|v| !v.to_string().contains("backup-"))
            .collect();
        data.len() == 1 && data[0]["type"] == "crypt"
    }

    /// The data decrypted `times` times with cryptsetup's volume key.
    fn decrypted(&self, times: usize) -> Vec<u8> {
        let (vk, mut data) = (self.volume_key(), fs::read(&self.img).unwrap());
        for _ in 0..times {
            data = common::xts::xts(&vk, &data, 512, 0, false);
        }
        data
    }
}

/// cryptsetup 2.6.1's own run cut after its last hotzone's commit and before its teardown
/// (SIGKILL at an fsync, by strace's fault injection; the fsyncs are tried from the last back
/// until the header shows that state). Resumed by cryptsetup, it starts again at progress 0
/// and encrypts the whole device a second time, reporting success; resumed by dmkit, it only
/// loses its metadata. dmkit's own runs never leave that state (the cut test above).
#[test]
fn cryptsetup_cut_after_its_last_hotzone() {
    if missing() || tools_missing(&[("strace", "strace")]) {
        return;
    }
    let size = 2 << 20;
    let d = Dev::new(30, size);
    let trace = d.e.s("fsync.trace");
    must("strace cryptsetup", d.cryptsetup_traced(&trace, None));
    let fsyncs = fs::read_to_string(&trace)
        .unwrap()
        .matches("fsync(")
        .count();
    let cut = (1..=fsyncs).rev().find_map(|n| {
        let d = Dev::new(30, size);
        let kill = format!("inject=fsync:signal=SIGKILL:when={n}");
        let out = d.cryptsetup_traced(&trace, Some(kill));
        assert!(!out.status.success(), "fsync {n} of {fsyncs}: not killed");
        d.tail().then_some(d)
    });
    let d = cut.expect("no fsync of cryptsetup's run left its tail state");
    let (hdr, img) = (fs::read(&d.hdr).unwrap(), fs::read(&d.img).unwrap());
    d.run("cryptsetup", &["--resume-only"]);
    assert!(d.meta()["config"].get("requirements").is_none());
    assert!(
        d.decrypted(1) != d.plain,
        "cryptsetup resumed its tail state right"
    );
    assert!(
        d.decrypted(2) == d.plain,
        "cryptsetup's resume of its tail state: not the plaintext encrypted twice either"
    );
    fs::write(&d.hdr, hdr).unwrap();
    fs::write(&d.img, img).unwrap();
    d.run(DMKIT, &["--resume-only"]);
    d.encrypted("dmkit --resume-only of cryptsetup's tail state");
}

#[test]
fn refusals_match_cryptsetup() {
    if missing() {
        return;
    }
    let cases: [(&str, usize, &str); 6] = [
        ("16k", 2 << 20, "Unsupported LUKS2 metadata size options."),
        ("514k", 2 << 20, "Unsupported LUKS2 metadata size options."),
        ("256M", 2 << 20, "Unsupported LUKS2 metadata size options."),
        ("64k", 2 << 20, "No space for new keyslot."),
        (
            "4M",
            2 << 20,
            "Failed to initialize LUKS2 reencryption in metadata.",
        ),
        (
            "1000",
            2 << 20,
            "Reduce size must be multiple of 512 bytes sector.",
        ),
    ];
    for (reduce, size, msg) in cases {
        let d = Dev::new(40, size);
        let mut args = vec!["--encrypt", "--reduce-device-size", reduce];
        args.extend(KDF);
        let out = d.output(DMKIT, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{reduce}: {err}");
        assert!(err.contains(msg), "{reduce}: {err}");
        assert!(
            fs::read(&d.img).unwrap() == d.plain,
            "{reduce}: data changed"
        );
        assert!(!d.under_way(), "{reduce}: a header was written");
        let theirs = d.output("cryptsetup", &args);
        assert_eq!(theirs.status.code(), Some(1), "cryptsetup {reduce}");
        assert!(
            String::from_utf8_lossy(&theirs.stderr).contains(msg),
            "cryptsetup {reduce}: {}",
            String::from_utf8_lossy(&theirs.stderr)
        );
    }
    // A header file that holds a LUKS header already is not formatted again.
    let d = Dev::new(41, 2 << 20);
    d.run(DMKIT, &encrypt(&[]));
    let before = fs::read(&d.hdr).unwrap();
    let out = d.output(DMKIT, &encrypt(&[]));
    assert_eq!(out.status.code(), Some(1));
    assert!(fs::read(&d.hdr).unwrap() == before);
}
