//! Online decryption: `luks reencrypt --decrypt NAME` on a device dmkit has open with a
//! detached header decrypts it inside its server (backward, as cryptsetup 2.6 does) while it
//! keeps serving. fio verify runs on the loop device during the whole decryption; a kill -9
//! of the server mid-way loses no fsync'd write and is finished by the next open plus
//! `--resume-only NAME`, or offline by `cryptsetup reencrypt --resume-only`; a close mid-way
//! is finished by dmkit offline. The end is always the plaintext in the data file from byte
//! 0 and a header file with one linear segment and no keyslot, as cryptsetup leaves it. A
//! device whose header is at its start is decrypted online too with `--header NEWFILE` (the
//! header exported, the data moving down while it is served): written and read back during
//! the whole decryption, killed mid-way and finished by the next open or by cryptsetup.

mod common;

use common::env::{fuse_missing, loop_missing, tool_missing};
use common::online::{
    pattern, read, resume_served, start_reencrypt, status, wait_mid_way, write_synced, FAST,
};
use common::run::Workspace;
use common::sys::{kill, pid_gone, wait_until};
use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PASS: &str = "online decryption";
const DATA: u64 = 64 << 20;

/// A 64 MiB data file and its detached LUKS2 header, made by cryptsetup (data at offset 0).
fn image(e: &Workspace) -> (String, String, String) {
    let pass = e.s("pass");
    fs::write(&pass, PASS).unwrap();
    let img = e.sparse("img", DATA);
    let hdr = e.s("hdr");
    let mut args = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
    args.extend(FAST);
    args.extend(["--header", &hdr, "--key-file", &pass, &img]);
    common::run::ok("cryptsetup", &args);
    (img, hdr, pass)
}

/// Open `img` with header `hdr` as `name` (tracked) with `extra` options; the lines printed.
fn open(
    e: &Workspace,
    img: &str,
    hdr: &str,
    pass: &str,
    name: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args = vec![
        "luks",
        "open",
        img,
        name,
        "--header",
        hdr,
        "--key-file",
        pass,
    ];
    args.extend(extra);
    let out = e.run.ok(&args);
    e.run.track(name);
    out.lines().map(str::to_string).collect()
}

/// The header file's JSON metadata, as cryptsetup reads it.
fn meta(hdr: &str) -> serde_json::Value {
    let out = common::run::ok("cryptsetup", &["luksDump", "--dump-json-metadata", hdr]);
    serde_json::from_str(&out).unwrap()
}

fn in_decryption(hdr: &str) -> bool {
    decrypting(&meta(hdr))
}

/// Whether the LUKS2 metadata `m` has a reencrypt keyslot decrypting.
fn decrypting(m: &serde_json::Value) -> bool {
    m["keyslots"].as_object().is_some_and(|k| {
        k.values()
            .any(|k| k["type"] == "reencrypt" && k["mode"] == "decrypt")
    })
}

/// Decrypted to the end: the header as cryptsetup leaves it (one linear segment, no keyslot,
/// no digest, no requirement) and, when `want` is given, the data file holds it from byte 0.
fn assert_decrypted(hdr: &str, img: &str, want: Option<&[u8]>) {
    let m = meta(hdr);
    assert!(m["config"].get("requirements").is_none(), "{m}");
    assert_eq!(m["segments"].as_object().unwrap().len(), 1, "{m}");
    assert_eq!(m["segments"]["0"]["type"], "linear", "{m}");
    assert_eq!(m["segments"]["0"]["offset"], "0", "{m}");
    assert!(m["keyslots"].as_object().unwrap().is_empty(), "{m}");
    assert!(m["digests"].as_object().unwrap().is_empty(), "{m}");
    if let Some(want) = want {
        assert!(
            fs::read(img).unwrap() == want,
            "the data file is not the plaintext"
        );
    }
}

fn missing_tools(with_loop: bool) -> bool {
    fuse_missing()
        || (with_loop && loop_missing())
        || tool_missing("cryptsetup", "cryptsetup-bin")
        || (with_loop && tool_missing("fio", "fio"))
}

/// A fresh image decrypting mid-way under server `name` (pattern `seed`), its server killed
/// with SIGKILL and the header checked to be left in decryption: the image, header,
/// passphrase and what the device held.
fn killed_mid_decryption(e: &Workspace, name: &str, seed: u8) -> (String, String, String, Vec<u8>) {
    let (img, hdr, pass) = image(e);
    let (_, want, child) = decrypting_mid_way(e, (&img, &hdr, &pass), name, seed);
    kill_server(e, name);
    drop(child);
    assert!(in_decryption(&hdr), "not left in decryption");
    (img, hdr, pass, want)
}

/// Open with the header detached, fill all of it with pattern `seed`, synced, start the
/// online decryption in small hotzones and wait until it is mid-way; the served file, what
/// it holds (with writes on both sides of the boundary, fsync'd while the decryption runs)
/// and the reencrypt command.
fn decrypting_mid_way(
    e: &Workspace,
    (img, hdr, pass): (&str, &str, &str),
    name: &str,
    seed: u8,
) -> (String, Vec<u8>, std::process::Child) {
    let dev = open(e, img, hdr, pass, name, &[]).remove(0);
    let mut want = pattern(DATA as usize, seed);
    write_synced(&dev, 0, &want);
    let child = start_reencrypt(e, name, pass, &["--decrypt", "--hotzone-size", "256K"]);
    wait_mid_way(e, name);
    for (i, at) in [0u64, 20 << 20, 40 << 20, 63 << 20].into_iter().enumerate() {
        let data = pattern(1 << 20, 100 + i as u8);
        write_synced(&dev, at, &data);
        want[at as usize..at as usize + data.len()].copy_from_slice(&data);
    }
    (dev, want, child)
}

/// After a killed server: the next open (with header `hdr`) serves `want` and `resume`
/// finishes online ([`resume_served`]).
fn resume_in_the_next_open(
    e: &Workspace,
    (img, hdr, pass): (&str, &str, &str),
    name: &str,
    want: &[u8],
    resume: &[&str],
) {
    let dev = open(e, img, hdr, pass, name, &[]).remove(0);
    resume_served(e, &dev, name, pass, want, resume);
}

/// Finish a decryption left by a killed server with cryptsetup offline: `repair` first when
/// the crash left a hotzone in reencryption (cryptsetup wants that), then `reencrypt
/// --resume-only --force-offline-reencrypt` unless the repair finished it (cryptsetup 2.6.1's
/// repair of the last hotzone of a decryption moving the data down does).
fn finish_with_cryptsetup(img: &str, hdr: &str, pass: &str) {
    let with_keys = |verb: &[&str]| {
        let mut args = verb.to_vec();
        args.extend(["--batch-mode", "--key-file", pass, "--header", hdr, img]);
        common::run::ok("cryptsetup", &args);
    };
    if meta(hdr).to_string().contains("in-reencryption") {
        with_keys(&["repair"]);
        if !in_decryption(hdr) {
            return;
        }
    }
    with_keys(&["reencrypt", "--resume-only", "--force-offline-reencrypt"]);
}

/// SIGKILL the server of `name` and clear what it left.
fn kill_server(e: &Workspace, name: &str) {
    let pid = status(e, name)["pid"].as_u64().unwrap() as u32;
    kill(pid, libc::SIGKILL);
    wait_until("the server's death", || pid_gone(pid));
    e.run.ok(&["close", name]);
}

#[test]
fn fio_verify_passes_during_the_whole_online_decryption() {
    if missing_tools(true) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass) = image(&e);
    let lines = open(&e, &img, &hdr, &pass, "dfio", &["--loop"]);
    let (dev, loopdev) = (lines[0].clone(), lines[1].clone());
    let mut fio = Command::new("fio")
        .args([
            "--name=online-decrypt",
            &format!("--filename={loopdev}"),
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=32",
            "--ioengine=libaio",
            "--direct=1",
            "--size=64M",
            "--time_based",
            "--runtime=15",
            "--verify=crc32c",
            "--verify_backlog=1024",
            "--verify_fatal=1",
            "--do_verify=1",
            // fio leaves a verify state file in its working directory otherwise.
            "--verify_state_save=0",
        ])
        .current_dir(e.dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let r = start_reencrypt(&e, "dfio", &pass, &["--decrypt", "--header", &hdr])
        .wait_with_output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        r.status.success(),
        "online decryption failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let progress = String::from_utf8_lossy(&r.stdout);
    let last = progress.lines().last().unwrap_or_default();
    assert!(last.contains(r#""device_bytes":"67108864""#), "{last}");
    let st = status(&e, "dfio");
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio ended before the decryption did ({took:?})"
    );
    let f = fio.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&f.stdout);
    assert!(
        f.status.success() && report.contains("err= 0"),
        "fio verify failed during online decryption:\n{report}\n{}",
        String::from_utf8_lossy(&f.stderr)
    );
    eprintln!("online decryption of 64 MiB under fio randrw qd32: {took:?}");
    // What fio left, served once decrypted, is the data file's plaintext byte for byte.
    let served = read(&dev, 0, DATA as usize);
    e.run.close("dfio");
    assert_decrypted(&hdr, &img, Some(&served));
}

#[test]
fn kill_9_mid_way_is_finished_by_the_next_open() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass, want) = killed_mid_decryption(&e, "dkill", 5);
    resume_in_the_next_open(&e, (&img, &hdr, &pass), "dkill", &want, &["--resume-only"]);
    assert_decrypted(&hdr, &img, Some(&want));
}

#[test]
fn kill_9_mid_way_is_finished_by_cryptsetup_offline() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass, want) = killed_mid_decryption(&e, "dcs", 7);
    finish_with_cryptsetup(&img, &hdr, &pass);
    assert_decrypted(&hdr, &img, Some(&want));
}

#[test]
fn init_only_then_resume_online_and_close_mid_way_resumed_offline() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass) = image(&e);
    let dev = open(&e, &img, &hdr, &pass, "dclose", &[]).remove(0);
    let want = pattern(DATA as usize, 9);
    write_synced(&dev, 0, &want);
    let mut init = vec!["luks", "reencrypt", "dclose", "--key-file", &pass];
    init.extend(["--decrypt", "--init-only", "--header", &hdr]);
    e.run.ok(&init);
    assert!(in_decryption(&hdr), "--init-only left no decryption");
    let child = start_reencrypt(
        &e,
        "dclose",
        &pass,
        &["--decrypt", "--resume-only", "--hotzone-size", "256K"],
    );
    wait_mid_way(&e, "dclose");
    let text = e.run.ok(&["status", "dclose"]);
    assert!(text.contains("reencryption:"), "{text}");
    assert!(text.contains("in progress"), "{text}");
    e.run.close("dclose");
    let r = child.wait_with_output().unwrap();
    assert!(
        !r.status.success(),
        "the interrupted decryption reported success"
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("interrupted"), "{err}");
    assert!(in_decryption(&hdr), "close finished it");
    e.run.ok(&[
        "luks",
        "reencrypt",
        &img,
        "--header",
        &hdr,
        "--key-file",
        &pass,
        "--resume-only",
        "--batch-mode",
    ]);
    assert_decrypted(&hdr, &img, Some(&want));
}

/// The data offset of a device with its header at its start: the shift its data moves
/// down by, and each hotzone's length (1 MiB, cryptsetup's smallest with room for the moved
/// segment's checksums).
const SHIFT: u64 = 1 << 20;

/// The data of such a device: 192 hotzones, so that a kill after the first progress and four
/// fsync'd writes still lands mid-way on a loaded machine (64 MiB took 0.2 s here).
const MOVED: u64 = 192 << 20;

/// A device of `MOVED` bytes of data after its LUKS2 header (data offset `SHIFT`), made by
/// cryptsetup: the image and the passphrase file.
fn attached_image(e: &Workspace) -> (String, String) {
    attached_image_of(e, MOVED, SHIFT)
}

/// A device of `data` bytes of data after its LUKS2 header (data offset `shift`), made by
/// cryptsetup: the image and the passphrase file.
fn attached_image_of(e: &Workspace, data: u64, shift: u64) -> (String, String) {
    let pass = e.s("pass");
    fs::write(&pass, PASS).unwrap();
    let img = e.sparse("img", data + shift);
    let mut args = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
    args.extend(FAST);
    let offset = (shift / 512).to_string();
    args.extend(["--offset", &offset, "--key-file", &pass, &img]);
    common::run::ok("cryptsetup", &args);
    (img, pass)
}

/// Open `img` (its header at its start) as `name` and fill it with pattern `seed`, synced:
/// the served file and what it holds.
fn open_attached(e: &Workspace, img: &str, pass: &str, name: &str, seed: u8) -> (String, Vec<u8>) {
    open_attached_of(e, img, pass, name, seed, MOVED)
}

/// Open `img` (its header at its start, `data` bytes of data) as `name` and fill it with
/// pattern `seed`, synced: the served file and what it holds.
fn open_attached_of(
    e: &Workspace,
    img: &str,
    pass: &str,
    name: &str,
    seed: u8,
    data: u64,
) -> (String, Vec<u8>) {
    let out = e.run.ok(&["luks", "open", img, name, "--key-file", pass]);
    e.run.track(name);
    let dev = out.lines().next().unwrap().to_string();
    let want = pattern(data as usize, seed);
    write_synced(&dev, 0, &want);
    (dev, want)
}

/// Decrypted to the end with the data moved down: the header file as cryptsetup leaves it
/// and the device's raw bytes the plaintext from byte 0.
fn assert_moved_down(hdr: &str, img: &str, want: &[u8]) {
    assert_moved_down_by(hdr, img, want, SHIFT);
}

/// [`assert_moved_down`] of a device whose data moved down by `shift`.
fn assert_moved_down_by(hdr: &str, img: &str, want: &[u8], shift: u64) {
    assert_decrypted(hdr, img, None);
    let raw = fs::read(img).unwrap();
    assert_eq!(raw.len() as u64, want.len() as u64 + shift);
    assert!(
        &raw[..want.len()] == want,
        "the device's first bytes are not the plaintext"
    );
}

/// A device with its header at its start decrypting online mid-way under server `name`
/// (pattern `seed`, writes fsync'd while it runs), its server killed with SIGKILL and the
/// exported header checked to be left in decryption: the image, exported header, passphrase
/// and what the device held.
fn attached_killed_mid_way(
    e: &Workspace,
    name: &str,
    seed: u8,
) -> (String, String, String, Vec<u8>) {
    let (img, pass) = attached_image(e);
    let (dev, mut want) = open_attached(e, &img, &pass, name, seed);
    let hdr = e.s("exported.hdr");
    let child = start_reencrypt(e, name, &pass, &["--decrypt", "--header", &hdr]);
    wait_mid_way(e, name);
    for (i, at) in [0u64, 20 << 20, 40 << 20, 63 << 20].into_iter().enumerate() {
        let data = pattern(1 << 20, 50 + i as u8);
        write_synced(&dev, at, &data);
        want[at as usize..at as usize + data.len()].copy_from_slice(&data);
    }
    kill_server(e, name);
    drop(child);
    assert!(in_decryption(&hdr), "not left in decryption");
    (img, hdr, pass, want)
}

#[test]
fn attached_header_decrypts_online_while_written_and_read() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = attached_image(&e);
    let (dev, mut want) = open_attached(&e, &img, &pass, "dmoved", 11);
    let hdr = e.s("exported.hdr");
    let started = Instant::now();
    let mut child = start_reencrypt(&e, "dmoved", &pass, &["--decrypt", "--header", &hdr]);
    // Until it ends: writes all over the device (each fsync'd), and reads compared with
    // what was written, on both sides of the moving boundary and inside the moved segment.
    let (mut writes, mut reads, mut x) = (0u32, 0u32, 0x2545_f491u64);
    while child.try_wait().unwrap().is_none() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % (MOVED / 4096 - 64)) * 4096;
        let data = pattern(256 << 10, (x >> 40) as u8);
        write_synced(&dev, at, &data);
        want[at as usize..at as usize + data.len()].copy_from_slice(&data);
        writes += 1;
        let back_at = (x >> 20) % (MOVED / 4096 - 128) * 4096;
        let back = read(&dev, back_at, 512 << 10);
        assert!(
            back[..] == want[back_at as usize..back_at as usize + back.len()],
            "read back at {back_at} differs during the decryption"
        );
        reads += 1;
        assert!(
            started.elapsed() < Duration::from_secs(50),
            "the decryption takes too long"
        );
    }
    let r = child.wait_with_output().unwrap();
    assert!(
        r.status.success(),
        "online decryption failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(writes > 4, "only {writes} writes during the decryption");
    eprintln!(
        "online decryption moving 192 MiB down: {:?}, {writes} writes and {reads} reads during it",
        started.elapsed()
    );
    let st = status(&e, "dmoved");
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    let exported = st["reencryption"]["exported_header"]
        .as_str()
        .unwrap_or_default();
    assert!(exported.ends_with("exported.hdr"), "{st}");
    // The device's start, data now, is claimed by its server as the rest of the data is.
    let key = e.s("plain.key");
    fs::write(&key, [7u8; 64]).unwrap();
    let r = e.run.run(&[
        "plain",
        "open",
        &img,
        "dsecond",
        "--key-file",
        &key,
        "--size",
        "2048",
    ]);
    e.run.track("dsecond");
    assert!(
        r.code != Some(0) && r.stderr.contains("in use"),
        "{}",
        r.describe()
    );
    assert!(
        read(&dev, 0, want.len()) == want,
        "served data differs at the end"
    );
    e.run.close("dmoved");
    assert_moved_down(&hdr, &img, &want);
}

#[test]
fn attached_header_kill_9_mid_way_is_finished_by_the_next_open() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass, want) = attached_killed_mid_way(&e, "dmkill", 13);
    let resume = ["--decrypt", "--resume-only", "--header", &hdr];
    resume_in_the_next_open(&e, (&img, &hdr, &pass), "dmkill", &want, &resume);
    assert_moved_down(&hdr, &img, &want);
}

#[test]
fn attached_header_kill_9_mid_way_is_finished_by_cryptsetup_offline() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass, want) = attached_killed_mid_way(&e, "dmcs", 17);
    finish_with_cryptsetup(&img, &hdr, &pass);
    assert_moved_down(&hdr, &img, &want);
}

#[test]
fn attached_header_journal_resilience_decrypts_online_too() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = attached_image(&e);
    let (dev, want) = open_attached(&e, &img, &pass, "dmjournal", 19);
    let hdr = e.s("exported.hdr");
    let mut args = vec!["--decrypt", "--header", &hdr, "--resilience", "journal"];
    // A 1 MiB moved segment does not fit a 1 MiB header's journal: refused while the device
    // is suspended, which resumes it with nothing written.
    let r = start_reencrypt(&e, "dmjournal", &pass, &args)
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("Moved segment too large."),
        "{err}"
    );
    assert!(!std::path::Path::new(&hdr).exists(), "{hdr} written");
    assert!(
        read(&dev, 0, want.len()) == want,
        "served data differs after the refusal"
    );
    args.extend(["--hotzone-size", "512K"]);
    let r = start_reencrypt(&e, "dmjournal", &pass, &args)
        .wait_with_output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(read(&dev, 0, want.len()) == want, "served data differs");
    e.run.close("dmjournal");
    assert_moved_down(&hdr, &img, &want);
}

#[test]
fn decrypt_of_an_open_device_with_its_header_at_its_start_is_refused_without_a_new_file() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = attached_image(&e);
    e.run
        .ok(&["luks", "open", &img, "dattached", "--key-file", &pass]);
    e.run.track("dattached");
    let before = fs::read(&img).unwrap();
    let refused = |extra: &[&str], words: &str| {
        let mut args = vec!["luks", "reencrypt", "dattached", "--key-file", &pass];
        args.extend(["--decrypt", "--batch-mode"]);
        args.extend(extra);
        let r = e.run.run(&args);
        assert!(r.code != Some(0), "{}", r.describe());
        let err = &r.stderr;
        assert!(err.contains(words), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    };
    refused(&[], "LUKS2 decryption requires --header option.");
    let newfile = e.s("newhdr");
    refused(&["--header", &newfile, "--init-only"], "no --init-only");
    refused(
        &["--header", &newfile, "--resume-only"],
        "Device reencryption not in progress.",
    );
    assert!(
        !std::path::Path::new(&newfile).exists(),
        "{newfile} written"
    );
    let junk = e.s("junk");
    fs::write(&junk, b"not a header").unwrap();
    refused(&["--header", &junk], "junk");
    // What the server would refuse once the data moved is refused before anything is written.
    e.run.ok(&["luks", "resize", "dattached", "--size", "2048"]);
    refused(
        &["--header", &newfile],
        "Active device size and requested reencryption size don't match.",
    );
    assert!(
        !std::path::Path::new(&newfile).exists(),
        "{newfile} written"
    );
    assert!(fs::read(&img).unwrap() == before, "the device changed");
    assert!(!e.run.ok(&["status", "dattached"]).contains("reencryption:"));
    e.run.close("dattached");
}

#[test]
fn decrypt_of_an_open_device_in_re_key_or_with_another_header_is_refused() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass) = image(&e);
    open(&e, &img, &hdr, &pass, "dother", &[]);
    let refused = |extra: &[&str], words: &str| {
        let mut args = vec!["luks", "reencrypt", "dother", "--key-file", &pass];
        args.extend(["--batch-mode", "--decrypt"]);
        args.extend(FAST);
        args.extend(extra);
        let r = e.run.run(&args);
        assert!(r.code != Some(0), "{}", r.describe());
        assert!(r.stderr.contains(words), "{}", r.stderr);
    };
    let other = e.s("other-hdr");
    fs::copy(&hdr, &other).unwrap();
    refused(&["--header", &other], "served with the header");
    let mut rekey = vec![
        "luks",
        "reencrypt",
        "dother",
        "--key-file",
        &pass,
        "--init-only",
    ];
    rekey.extend(FAST);
    e.run.ok(&rekey);
    refused(
        &["--resume-only"],
        "Device is not in LUKS2 decryption. Conflicting option --decrypt.",
    );
    assert!(!in_decryption(&hdr), "a decryption was started");
    e.run.close("dother");
}

#[test]
fn journal_and_none_resilience_decrypt_online_too() {
    if missing_tools(false) {
        return;
    }
    for (i, mode) in ["journal", "none"].into_iter().enumerate() {
        let e = Workspace::new();
        let (img, hdr, pass) = image(&e);
        let dev = open(&e, &img, &hdr, &pass, "dres", &[]).remove(0);
        let want = pattern(DATA as usize, 20 + i as u8);
        write_synced(&dev, 0, &want);
        let r = start_reencrypt(&e, "dres", &pass, &["--decrypt", "--resilience", mode])
            .wait_with_output()
            .unwrap();
        assert!(
            r.status.success(),
            "--resilience {mode}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(
            read(&dev, 0, want.len()) == want,
            "--resilience {mode}: served"
        );
        e.run.close("dres");
        assert_decrypted(&hdr, &img, Some(&want));
    }
}

/// The data offset of a device whose moved segment, its last hotzone, is big enough (16 MiB
/// decrypted in place, each write fsync'd) for a kill to land in it reliably.
const BIG_SHIFT: u64 = 16 << 20;

/// That device's data: three hotzones before the moved segment.
const BIG_DATA: u64 = 64 << 20;

/// The header file `path`'s JSON metadata (primary copy) as it is on disk now; `None` while
/// it is not there or half written.
fn json_on_disk(path: &str) -> Option<serde_json::Value> {
    use std::os::unix::fs::FileExt;
    // The header alone (its JSON area ends at 16 KiB here), not the whole 16 MiB file.
    let mut b = vec![0u8; 16 << 10];
    let n = fs::File::open(path).ok()?.read_at(&mut b, 0).ok()?;
    let size = u64::from_be_bytes(b.get(8..16)?.try_into().ok()?) as usize;
    let area = b.get(4096..size.min(n))?;
    let end = area.iter().position(|&c| c == 0).unwrap_or(area.len());
    serde_json::from_slice(&area[..end]).ok()
}

/// Whether `meta` says the moved segment (the hotzone at data offset 0) is being rewritten.
fn moved_segment_hot(meta: &serde_json::Value) -> bool {
    meta["segments"].as_object().is_some_and(|segs| {
        segs.values().any(|s| {
            s["offset"] == "0"
                && s["flags"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x == "in-reencryption"))
        })
    })
}

/// A device with its header at its start decrypting online (`extra` options), its server
/// killed with SIGKILL while it rewrites the moved segment in place, its last hotzone: the
/// exported header polled until it says so, and checked to say so after the kill. Writes
/// fsync'd while it runs, inside the moved segment once the header is exported and after it
/// until the kill, are in what the device held.
fn killed_in_the_last_hotzone(
    e: &Workspace,
    name: &str,
    seed: u8,
    extra: &[&str],
) -> (String, String, String, Vec<u8>) {
    // The header is polled, with no hook in the server: a slow poll (a loaded machine) can
    // see the decryption finished before it saw the last hotzone begin. Then it starts over.
    for attempt in 1..=3 {
        if let Some(killed) = try_killing_in_the_last_hotzone(e, name, seed, extra) {
            return killed;
        }
        eprintln!(
            "attempt {attempt}: the decryption ended before its last hotzone was seen or killed; again"
        );
    }
    panic!("the last hotzone was never seen in 3 attempts");
}

/// One attempt of [`killed_in_the_last_hotzone`]: `None` (the device closed, the exported
/// header removed) when the decryption ended before the poll saw its last hotzone, or before
/// the kill that followed landed.
fn try_killing_in_the_last_hotzone(
    e: &Workspace,
    name: &str,
    seed: u8,
    extra: &[&str],
) -> Option<(String, String, String, Vec<u8>)> {
    let (img, pass) = attached_image_of(e, BIG_DATA, BIG_SHIFT);
    let (dev, mut want) = open_attached_of(e, &img, &pass, name, seed, BIG_DATA);
    let pid = status(e, name)["pid"].as_u64().unwrap() as u32;
    let hdr = e.s("exported.hdr");
    let mut args = vec!["--decrypt", "--header", &hdr];
    args.extend(extra);
    let child = start_reencrypt(e, name, &pass, &args);
    let mut write = |at: u64, n: u8| {
        let data = pattern(256 << 10, 70 + n);
        write_synced(&dev, at, &data);
        want[at as usize..at as usize + data.len()].copy_from_slice(&data);
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let poll = |what: &str, done: &dyn Fn(&serde_json::Value) -> bool| loop {
        if let Some(m) = json_on_disk(&hdr) {
            if done(&m) {
                return m;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}",
            json_on_disk(&hdr)
        );
        std::thread::sleep(Duration::from_micros(100));
    };
    // Once exported: served by the moved segment (at the device's start, the old key).
    poll("never exported", &|m| {
        m["keyslots"].to_string().contains("decrypt")
    });
    write(0, 0);
    write(9 << 20, 1);
    // Then, until the moved segment is being rewritten, on the plaintext or old side.
    let mut n = 2;
    let mut at = BIG_SHIFT;
    loop {
        if json_on_disk(&hdr).is_some_and(|m| moved_segment_hot(&m)) {
            break;
        }
        if n < 10 {
            write(at, n);
            at += 5 << 20;
            n += 1;
        } else {
            let m = poll("the last hotzone never started", &|m| {
                moved_segment_hot(m) || !decrypting(m)
            });
            if !decrypting(&m) {
                let out = child.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                e.run.ok(&["close", name]);
                fs::remove_file(&hdr).unwrap();
                return None;
            }
            break;
        }
    }
    kill(pid, libc::SIGKILL);
    wait_until("the server's death", || pid_gone(pid));
    drop(child);
    e.run.ok(&["close", name]);
    let m = meta(&hdr);
    if !decrypting(&m) {
        // The poll saw the last hotzone, but it was done and the decryption over before the
        // kill landed: nothing was cut short.
        fs::remove_file(&hdr).unwrap();
        return None;
    }
    assert!(
        moved_segment_hot(&m),
        "the kill landed in the decryption but not in its last hotzone: {m}"
    );
    eprintln!("killed in the last hotzone after {n} writes");
    Some((img, hdr, pass, want))
}

#[test]
fn attached_header_kill_9_in_the_last_hotzone_is_finished_by_the_next_open() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass, want) = killed_in_the_last_hotzone(&e, "dmlast", 23, &[]);
    finished_by_the_next_open(&e, (&img, &hdr, &pass), "dmlast", want);
}

/// After a kill in the last hotzone: the next open (as `name`) recovers the moved segment,
/// which finishes the decryption (as cryptsetup's repair does there): it serves `want` and
/// takes writes, there is nothing left to resume, and the device's bytes are the plaintext.
fn finished_by_the_next_open(
    e: &Workspace,
    (img, hdr, pass): (&str, &str, &str),
    name: &str,
    mut want: Vec<u8>,
) {
    let dev = open(e, img, hdr, pass, name, &[]).remove(0);
    assert!(
        read(&dev, 0, want.len()) == want,
        "read back differs after the crash"
    );
    assert_moved_down_by(hdr, img, &want, BIG_SHIFT);
    let st = status(e, name);
    assert_eq!(st["details"]["reencryption"]["status"], "finished", "{st}");
    let mut args = vec!["luks", "reencrypt", name, "--key-file", pass];
    args.extend([
        "--batch-mode",
        "--decrypt",
        "--resume-only",
        "--header",
        hdr,
    ]);
    let r = e.run.run(&args);
    assert!(
        r.code != Some(0) && r.stderr.contains("Device reencryption not in progress."),
        "{}",
        r.describe()
    );
    let data = pattern(1 << 20, 99);
    write_synced(&dev, 5 << 20, &data);
    want[5 << 20..6 << 20].copy_from_slice(&data);
    assert!(read(&dev, 0, want.len()) == want, "served data differs");
    e.run.close(name);
    assert_moved_down_by(hdr, img, &want, BIG_SHIFT);
}

#[test]
fn attached_header_kill_9_in_the_last_hotzone_is_finished_by_cryptsetup_offline() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, hdr, pass, want) = killed_in_the_last_hotzone(&e, "dmlastcs", 29, &[]);
    finish_with_cryptsetup(&img, &hdr, &pass);
    assert_moved_down_by(&hdr, &img, &want, BIG_SHIFT);
}

#[test]
fn attached_header_kill_9_in_the_last_hotzone_of_journal_resilience_is_finished_by_the_next_open() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    // The journal holds a copy of the moved segment: 8 MiB of it fits the reencrypt area.
    let extra = ["--resilience", "journal", "--hotzone-size", "8M"];
    let (img, hdr, pass, want) = killed_in_the_last_hotzone(&e, "dmlastj", 31, &extra);
    finished_by_the_next_open(&e, (&img, &hdr, &pass), "dmlastj", want);
}

/// `len` bytes at `off` of `path`, read with O_DIRECT (past the page cache, from its server).
fn read_direct(path: &str, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let (mut buf, at) = common::sys::aligned(len);
    f.read_exact_at(&mut buf[at..at + len], off)?;
    Ok(buf[at..at + len].to_vec())
}

#[test]
fn attached_header_server_failure_after_the_data_moved_fails_requests_until_retried() {
    if missing_tools(false)
        || tool_missing("unshare", "util-linux")
        || common::env::private_mounts_missing("unshare --mount")
    {
        return;
    }
    let e = Workspace::new();
    let data = 8 << 20;
    let (img, pass) = attached_image_of(&e, data, SHIFT);
    let (dev, want) = open_attached_of(&e, &img, &pass, "dmfail", 37, data);
    // The server cannot take the exported header once the data moved: the command runs in
    // a mount namespace of its own where NEWFILE's directory is another one, so the path
    // it sends names nothing the server sees (a failure no hook makes: any failure of the
    // server between the move and its new map, which no other request provokes, takes this
    // path).
    let (seen, real) = (e.s("seen"), e.s("real"));
    fs::create_dir(&seen).unwrap();
    fs::create_dir(&real).unwrap();
    let newfile = format!("{seen}/new.hdr");
    let script = format!("mount --bind {real} {seen} && exec \"$0\" \"$@\"");
    let mut args = vec!["--mount", "--propagation", "private", "sh", "-c", &script];
    args.extend([
        common::DMKIT,
        "luks",
        "reencrypt",
        "dmfail",
        "--key-file",
        &pass,
    ]);
    args.extend(["--batch-mode", "--decrypt", "--header", &newfile]);
    args.extend(FAST);
    let r = common::run::command("unshare", &args, Some(e.run.path()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success(), "{err}");
    assert!(
        err.contains("moved its data for the decryption but does not serve it")
            && err.contains(&newfile),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let hdr = format!("{real}/new.hdr");
    assert!(in_decryption(&hdr), "not left in decryption");
    // Requests fail (they would wait for ever on the suspended device otherwise).
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dev.clone();
    std::thread::spawn(move || tx.send(read_direct(&d, 0, 4096).map_err(|e| e.raw_os_error())));
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a read of the device hangs");
    assert_eq!(got.map(|_| ()), Err(Some(libc::EIO)));
    // `status` says so, where it would otherwise show a healthy device.
    let out = e.run.ok(&["status", "dmfail"]);
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("reencryption:")
                && l.contains("failed, serving nothing")
                && l.contains("does not serve it")),
        "{out}"
    );
    // The same command, with the header where the server sees it, decrypts it.
    let r = start_reencrypt(&e, "dmfail", &pass, &["--decrypt", "--header", &hdr])
        .wait_with_output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(read(&dev, 0, want.len()) == want, "served data differs");
    e.run.close("dmfail");
    assert_moved_down_by(&hdr, &img, &want, SHIFT);
}
