//! LUKS2 devices left in the middle of a reencryption by the real cryptsetup 2.6.1 open in
//! dmkit: `cryptsetup reencrypt --force-offline-reencrypt` (re-key, `--decrypt` with a new
//! detached header, `--encrypt --reduce-device-size`) is killed with SIGKILL after a short
//! delay, retried until the header carries the reencryption requirement, for each resilience
//! mode; `dmkit luks open` then serves every segment with its own key and the plaintext read
//! back is the original everywhere. A hotzone interrupted mid-write (a segment flagged
//! `in-reencryption`) is recovered from its resilience data (checksums, journal, datashift).
//! With `--resilience none` cryptsetup writes metadata only between hotzones, so a SIGKILL
//! loses data by design: that mode is stopped with SIGTERM, which cryptsetup honours at a
//! hotzone boundary. `--init-only` headers open too, and keyslot add / UUID change are refused
//! as cryptsetup refuses them.
//!
//! Needs root, /dev/fuse and cryptsetup: skips without them, fails under CI=1.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::run::{dmkit, Workspace};
use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const PASS: &str = "reencrypt me";
/// Cheap keyslots: the tests are about the data, not the KDF.
const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const IMG: u64 = 12 << 20;

fn missing() -> bool {
    tool_missing("cryptsetup", "cryptsetup-bin") || fuse_missing()
}

fn cs(args: &[&str]) -> std::process::Output {
    Command::new("cryptsetup")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cryptsetup runs")
}

fn cs_ok(args: &[&str]) {
    let o = cs(args);
    assert!(
        o.status.success(),
        "cryptsetup {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn dump(dev: &str) -> String {
    String::from_utf8_lossy(&cs(&["luksDump", dev]).stdout).into_owned()
}

/// A LUKS2 image formatted by cryptsetup (small metadata: data at 3 MiB) whose plaintext,
/// written through dmkit, is returned.
fn plain_luks2(e: &Workspace, name: &str) -> (String, Vec<u8>) {
    let img = e.sparse(name, IMG);
    let pass = e.s("pass");
    let layout = [
        "--luks2-metadata-size",
        "16k",
        "--luks2-keyslots-size",
        "2M",
    ];
    let head = ["luksFormat", "--batch-mode", "--type", "luks2"];
    cs_ok(&[&head[..], &layout, FAST, &["--key-file", &pass, &img]].concat());
    let out = e
        .run
        .ok(&["luks", "open", "--key-file", &e.s("pass"), &img, "fill"]);
    let exported = PathBuf::from(out.lines().next().unwrap());
    let size = fs::metadata(&exported).unwrap().len() as usize;
    let data = common::rng::bytes(size as u64 ^ 0x5eed, size);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&exported).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
    }
    e.run.ok(&["close", "fill"]);
    (img, data)
}

/// Run `cryptsetup reencrypt ARGS` on `img` and stop it with `signal` after growing delays
/// until `accept(dump)` holds for the header on `hdr` (each try starts from `base`). Returns
/// whether it was reached.
fn interrupt(
    e: &Workspace,
    base: &str,
    img: &str,
    hdr: Option<&str>,
    args: &[&str],
    signal: i32,
    accept: &dyn Fn(&str) -> bool,
) -> bool {
    let run = |delay: Option<Duration>| {
        fs::copy(base, img).unwrap();
        if let Some(h) = hdr {
            let _ = fs::remove_file(h);
        }
        let mut cmd = Command::new("cryptsetup");
        // A --decrypt to a new header leaves LUKS2-temp-*.new files in the working directory.
        cmd.current_dir(e.dir());
        let pass = e.s("pass");
        let head = ["reencrypt", "--batch-mode", "--force-offline-reencrypt"];
        cmd.args(head)
            .args(["--hotzone-size", "64k"])
            .args(FAST)
            .args(["--key-file", &pass])
            .args(args)
            .arg(img)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let started = std::time::Instant::now();
        let mut child = cmd.spawn().expect("cryptsetup reencrypt starts");
        if let Some(d) = delay {
            std::thread::sleep(d);
            unsafe { libc::kill(child.id() as i32, signal) };
        }
        let _ = child.wait();
        started.elapsed()
    };
    // The whole run once, then stops spread over its length: the windows differ per mode.
    // Four passes at shifted points: a fast machine leaves short windows (a fresh-check run
    // met none in two passes for a journal decryption). On a loaded machine (CI's test lanes
    // side by side) the first run's length can mislead, so it is measured again up to three
    // times (a fresh-check met no window in 72 stops once).
    for _ in 0..3 {
        let total = run(None);
        for attempt in 0..72u32 {
            let at =
                total.mul_f64(((attempt % 18) as f64 + 0.5 + (attempt / 18) as f64 * 0.23) / 18.0);
            run(Some(at));
            if accept(&dump(hdr.unwrap_or(img))) {
                return true;
            }
        }
    }
    false
}

fn in_reencryption(d: &str) -> bool {
    d.contains("online-reencrypt")
}

fn crashed(d: &str) -> bool {
    in_reencryption(d) && d.contains("in-reencryption")
}

/// The offset of the one data segment the dump `d` shows besides the backups, if there is
/// one: cryptsetup 2.6.1 writes that state after its last hotzone, before its teardown drops
/// the metadata, and a device in it is served whole from there, as the finished one is.
fn lone_data_segment(d: &str) -> Option<u64> {
    let segments = d
        .split("Data segments:")
        .nth(1)?
        .split("Keyslots:")
        .next()?;
    let mut live = Vec::new();
    for block in segments.split("\n  ").skip(1) {
        if block.contains("backup-") {
            continue;
        }
        let offset = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("offset:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())?;
        live.push(offset);
    }
    match live.as_slice() {
        [only] => Some(*only),
        _ => None,
    }
}

/// Open `img` (header on `hdr`) with dmkit, read-only or not, and read the served device.
fn read_back(e: &Workspace, img: &str, hdr: Option<&str>, read_only: bool, name: &str) -> Vec<u8> {
    let pass = e.s("pass");
    let mut args = vec!["luks", "open", "--key-file", pass.as_str()];
    if read_only {
        args.push("--read-only");
    }
    if let Some(h) = hdr {
        args.extend(["--header", h]);
    }
    args.extend([img, name]);
    let out = e.run.ok(&args);
    let exported = PathBuf::from(out.lines().next().unwrap());
    let back = fs::read(&exported).unwrap();
    e.run.ok(&["close", name]);
    back
}

fn assert_same(what: &str, back: &[u8], plain: &[u8]) {
    assert!(!back.is_empty(), "{what}: empty device");
    let n = back.len().min(plain.len());
    if let Some(i) = (0..n).find(|&i| back[i] != plain[i]) {
        panic!(
            "{what}: plaintext differs at byte {i} (served {} bytes)",
            back.len()
        );
    }
}

fn env() -> Workspace {
    let e = Workspace::new();
    fs::write(e.path("pass"), PASS).unwrap();
    e
}

#[test]
fn rekey_interrupted_in_every_resilience_mode_opens_with_both_keys() {
    if missing() {
        return;
    }
    let e = env();
    let (base, plain) = plain_luks2(&e, "base.img");
    let img = e.s("work.img");
    for (resilience, signal, want_crash) in [
        ("checksum", libc::SIGKILL, true),
        ("journal", libc::SIGKILL, true),
        ("checksum", libc::SIGKILL, false),
        ("journal", libc::SIGKILL, false),
        ("none", libc::SIGTERM, false),
    ] {
        let what = format!("re-key --resilience {resilience} (crashed hotzone: {want_crash})");
        let accept = |d: &str| in_reencryption(d) && crashed(d) == want_crash;
        let reached = interrupt(
            &e,
            &base,
            &img,
            None,
            &["--resilience", resilience],
            signal,
            &accept,
        );
        if !reached {
            // The window of an interrupted hotzone is a few milliseconds: not reaching it on
            // a busy machine is no failure of dmkit's, but the clean state must be reached.
            assert!(
                want_crash,
                "{what}: cryptsetup never left the header mid-reencryption"
            );
            eprintln!("{what}: no interrupted hotzone caught in 36 tries; skipped");
            continue;
        }
        let back = read_back(&e, &img, None, true, "ro");
        assert_eq!(plain.len(), back.len(), "{what}: size");
        assert_same(&format!("{what}, read-only"), &back, &plain);
        if want_crash && resilience == "journal" {
            // Recovering a journal hotzone needs the metadata moved on first: refused.
            let pass = e.s("pass");
            let r = dmkit(
                e.run.path(),
                &["luks", "open", "--key-file", &pass, &img, "rw"],
            );
            common::run::assert_refused(&r, 1, &[&["hotzone"], &["resume-only"]]);
            continue;
        }
        assert_same(
            &format!("{what}, read-write"),
            &read_back(&e, &img, None, false, "rw"),
            &plain,
        );
        // cryptsetup finishes what it started after dmkit served it read-write (a crashed
        // hotzone is recovered by `repair` first, as cryptsetup asks).
        if want_crash {
            cs_ok(&["repair", "--batch-mode", "--key-file", &e.s("pass"), &img]);
        }
        cs_ok(&[
            "reencrypt",
            "--batch-mode",
            "--resume-only",
            "--force-offline-reencrypt",
            "--key-file",
            &e.s("pass"),
            &img,
        ]);
        assert!(
            !in_reencryption(&dump(&img)),
            "{what}: still in reencryption"
        );
        assert_same(
            &format!("{what}, finished"),
            &read_back(&e, &img, None, true, "done"),
            &plain,
        );
    }
}

#[test]
fn init_only_header_opens_and_refuses_keyslot_and_uuid_changes() {
    if missing() {
        return;
    }
    let e = env();
    let (img, plain) = plain_luks2(&e, "init.img");
    let pass = e.s("pass");
    let head = [
        "reencrypt",
        "--batch-mode",
        "--init-only",
        "--force-offline-reencrypt",
    ];
    cs_ok(&[&head[..], FAST, &["--key-file", &pass, &img]].concat());
    assert!(in_reencryption(&dump(&img)));
    assert_same(
        "--init-only",
        &read_back(&e, &img, None, true, "init"),
        &plain,
    );
    // The dump is cryptsetup's, reencrypt keyslot and backup segments included.
    let ours = e.run.ok(&["luks", "dump", &img]);
    assert_eq!(ours, dump(&img), "luks dump differs from luksDump");
    fs::write(e.path("new"), "another").unwrap();
    let before = fs::read(&img).unwrap();
    let new = e.s("new");
    let uuid = "12345678-1234-1234-1234-123456789abc";
    let add = [FAST, &["--key-file", &pass, &img, &new]].concat();
    for (ours, theirs) in [
        (
            [&["luks", "add-key"][..], &add].concat(),
            [&["luksAddKey", "--batch-mode"][..], &add].concat(),
        ),
        (
            vec!["luks", "uuid", "--uuid", uuid, &img],
            vec!["luksUUID", "--batch-mode", "--uuid", uuid, &img],
        ),
    ] {
        let args = ours;
        let r = dmkit(e.run.path(), &args);
        common::run::assert_refused(
            &r,
            1,
            &[&["Operation incompatible with device marked for LUKS2 reencryption. Aborting."]],
        );
        let c = cs(&theirs);
        assert_eq!(c.status.code(), Some(1), "cryptsetup {theirs:?}");
        assert!(String::from_utf8_lossy(&c.stderr).contains(
            "Operation incompatible with device marked for LUKS2 reencryption. Aborting."
        ));
        assert!(
            fs::read(&img).unwrap() == before,
            "{args:?} changed the image"
        );
    }
}

#[test]
fn decrypt_to_a_new_detached_header_interrupted_opens() {
    if missing() {
        return;
    }
    let e = env();
    let (base, plain) = plain_luks2(&e, "base.img");
    let img = e.s("work.img");
    let hdr = e.s("hdr.img");
    // The first segment moves by the whole data offset (3 MiB hotzones, datashift): nearly
    // every stop lands inside a hotzone, so either state is taken.
    for resilience in ["checksum", "journal"] {
        let what = format!("--decrypt --resilience {resilience}");
        // A stop inside cryptsetup's header export can leave a new header whose keyslot
        // cryptsetup itself cannot unlock yet: only states cryptsetup unlocks are asked of
        // dmkit (a state cryptsetup unlocks and dmkit does not still fails below).
        let pass = e.s("pass");
        let cryptsetup_unlocks = || {
            Command::new("cryptsetup")
                .args(["open", "--test-passphrase", "--key-file", &pass])
                .args(["--header", &hdr, &img])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let accept = |d: &str| in_reencryption(d) && cryptsetup_unlocks();
        let args = [
            "--decrypt",
            "--header",
            hdr.as_str(),
            "--resilience",
            resilience,
        ];
        assert!(
            interrupt(&e, &base, &img, Some(&hdr), &args, libc::SIGKILL, &accept),
            "{what}: never mid-reencryption"
        );
        let what = format!("{what} (crashed hotzone: {})", crashed(&dump(&hdr)));
        let back = read_back(&e, &img, Some(&hdr), true, "dec");
        assert_eq!(back.len(), plain.len(), "{what}: size");
        assert_same(&what, &back, &plain);
    }
}

#[test]
fn encrypt_with_reduced_device_size_interrupted_opens() {
    if missing() {
        return;
    }
    let e = env();
    let base = e.s("plain.img");
    let plain = common::rng::bytes(0xe4c, IMG as usize);
    fs::write(&base, &plain).unwrap();
    let img = e.s("work.img");
    for want_crash in [false, true] {
        let what = format!("--encrypt --reduce-device-size 4M (crashed hotzone: {want_crash})");
        let accept = |d: &str| in_reencryption(d) && crashed(d) == want_crash;
        let args = [
            "--encrypt",
            "--reduce-device-size",
            "4M",
            "--luks2-keyslots-size",
            "1M",
        ];
        if !interrupt(&e, &base, &img, None, &args, libc::SIGKILL, &accept) {
            assert!(want_crash, "{what}: never mid-reencryption");
            eprintln!("{what}: no interrupted hotzone caught; skipped");
            continue;
        }
        let want = match lone_data_segment(&dump(&img)) {
            Some(offset) => IMG - offset,
            None => IMG - (4 << 20),
        };
        let back = read_back(&e, &img, None, true, "enc");
        assert_eq!(back.len() as u64, want, "{what}: size");
        assert_same(&what, &back, &plain);
    }
}
