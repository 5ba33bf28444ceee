//! The LUKS verbs on an open device, through its server: `luks resize` (cryptsetup `resize`,
//! plain devices too), `luks suspend` / `luks resume` (luksSuspend / luksResume: I/O is held,
//! not failed, while the key is wiped; a wrong passphrase leaves it suspended with exit 2),
//! `luks refresh` (discards on and off), `status` showing "(suspended)", and close of a
//! suspended device. Images are made by cryptsetup and by dmkit.

mod common;

use common::env::{fuse_missing, loop_missing, tool_missing};
use common::run::Workspace;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PASS: &str = "online passphrase";

fn cryptsetup_image(e: &Workspace, name: &str, size: u64) -> (String, String) {
    let pass = e.s("pass");
    fs::write(&pass, PASS).unwrap();
    let img = e.sparse(name, size);
    // A cheap KDF: these tests are about the open device, not the keyslot.
    let mut args: Vec<&str> =
        "luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000"
            .split(' ')
            .collect();
    args.extend(["--key-file", &pass, &img]);
    common::run::ok("cryptsetup", &args);
    (img, pass)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn write_at(path: &str, off: u64, data: &[u8]) {
    let mut f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn read_at(path: &str, off: u64, len: usize) -> Vec<u8> {
    let mut f = fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).unwrap();
    b
}

fn size_of(path: &str) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// A reader of the first 4 KiB of `path` with O_DIRECT (no page cache can answer it), in
/// another process: it blocks in the kernel while the device is suspended.
fn spawn_reader(path: &str) -> std::process::Child {
    Command::new("dd")
        .args([
            &format!("if={path}"),
            "of=/dev/null",
            "bs=4096",
            "count=1",
            "iflag=direct",
            "status=none",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether `child` ends within `limit` (its exit status then).
fn ends_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn resize_round_trip(e: &Workspace, img: &str, pass: &str, name: &str) {
    let out = e
        .run
        .ok(&["luks", "open", img, name, "--key-file", pass, "--loop"]);
    e.run.track(name);
    let mut lines = out.lines();
    let dev = lines.next().unwrap().to_string();
    let loopdev = lines.next().unwrap().to_string();
    let full = size_of(&dev);
    assert_eq!(full, 32 << 20, "LUKS2 with a 16 MiB header on 48 MiB");
    let data = pattern(4 << 20, 7);
    write_at(&dev, 0, &data);

    // Shrink: the file and the loop device follow; what stays is intact.
    e.run.ok(&["luks", "resize", name, "--size", "16384"]);
    assert_eq!(size_of(&dev), 16384 * 512);
    let blk = common::run::ok("blockdev", &["--getsize64", &loopdev]);
    assert_eq!(blk.trim(), (16384u64 * 512).to_string());
    assert_eq!(read_at(&dev, 0, data.len()), data);
    let st = e.run.ok(&["status", name]);
    assert!(st.contains("size:") && st.contains("16384 sectors"), "{st}");

    // Beyond the backing device: refused, nothing changes.
    let r = e.run.run(&["luks", "resize", name, "--size", "1000000"]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("beyond the end"), "{}", r.describe());
    assert_eq!(size_of(&dev), 16384 * 512);

    // Grow back to the end of the device (cryptsetup's default), by cryptsetup's name.
    e.run.ok(&["resize", name]);
    assert_eq!(size_of(&dev), full);
    let blk = common::run::ok("blockdev", &["--getsize64", &loopdev]);
    assert_eq!(blk.trim(), full.to_string());
    assert_eq!(read_at(&dev, 0, data.len()), data);
    write_at(&dev, full - 4096, &pattern(4096, 9));
    assert_eq!(read_at(&dev, full - 4096, 4096), pattern(4096, 9));
    e.run.close(name);
}

#[test]
fn resize_follows_in_file_and_loop_device() {
    if loop_missing() || tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = cryptsetup_image(&e, "cs.img", 48 << 20);
    resize_round_trip(&e, &img, &pass, "online-cs");
    // The data is where cryptsetup reads it.
    let r = common::run::output("cryptsetup", &["luksDump", "--dump-json-metadata", &img]);
    assert!(r.status.success());

    let (img2, pass2) = e.luks2_cheap("dm.img", 48 << 20, PASS);
    resize_round_trip(&e, &img2, &pass2, "online-dm");
}

#[test]
fn plain_devices_resize_but_do_not_suspend() {
    if fuse_missing() {
        return;
    }
    let e = Workspace::new();
    let img = e.sparse("plain.img", 8 << 20);
    let key = e.s("key");
    fs::write(&key, pattern(64, 5)).unwrap();
    let out = e.run.ok(&["plain", "open", &img, "p1", "--key-file", &key]);
    e.run.track("p1");
    let dev = out.lines().next().unwrap().to_string();
    assert_eq!(size_of(&dev), 8 << 20);
    write_at(&dev, 0, &pattern(8192, 1));
    e.run.ok(&["luks", "resize", "p1", "--size", "4096"]);
    assert_eq!(size_of(&dev), 4096 * 512);
    e.run.ok(&["luks", "resize", "p1"]);
    assert_eq!(size_of(&dev), 8 << 20);
    assert_eq!(read_at(&dev, 0, 8192), pattern(8192, 1));
    let r = e.run.run(&["luksSuspend", "p1"]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("only for LUKS"), "{}", r.describe());
    e.run.close("p1");
}

#[test]
fn suspend_holds_io_until_resumed_with_the_right_passphrase() {
    if fuse_missing() || tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = cryptsetup_image(&e, "s.img", 32 << 20);
    let out = e
        .run
        .ok(&["luks", "open", &img, "sus", "--key-file", &pass]);
    e.run.track("sus");
    let dev = out.lines().next().unwrap().to_string();
    let data = pattern(1 << 20, 3);
    write_at(&dev, 0, &data);

    e.run.ok(&["luksSuspend", "sus"]);
    let st = e.run.ok(&["status", "sus"]);
    assert!(st.contains("read/write (suspended)"), "{st}");
    let json = e.run.ok(&["status", "sus", "--json"]);
    assert!(json.contains("\"suspended\": true"), "{json}");
    // Suspending twice is refused.
    let r = e.run.run(&["luks", "suspend", "sus"]);
    assert_eq!(r.code, Some(1), "{}", r.describe());

    let mut reader = spawn_reader(&dev);
    assert!(
        ends_within(&mut reader, Duration::from_millis(1500)).is_none(),
        "a read of a suspended device must wait"
    );

    // A wrong passphrase: exit 2, still suspended, the reader still waits.
    let wrong = e.s("wrong");
    fs::write(&wrong, "not it").unwrap();
    let r = e.run.run(&["luksResume", "sus", "--key-file", &wrong]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("No key available"), "{}", r.describe());
    assert!(e.run.ok(&["status", "sus"]).contains("(suspended)"));
    assert!(reader.try_wait().unwrap().is_none());

    // The passphrase on stdin, as open takes it.
    let mut resume = Command::new(env!("CARGO_BIN_EXE_dmkit"))
        .args(["luks", "resume", "sus", "--key-file", "-"])
        .env("DMKIT_RUN_DIR", e.run.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    resume
        .stdin
        .take()
        .unwrap()
        .write_all(PASS.as_bytes())
        .unwrap();
    let st = ends_within(&mut resume, Duration::from_secs(60)).expect("resume ends");
    assert!(st.success());
    let st = ends_within(&mut reader, Duration::from_secs(30)).expect("the held read goes on");
    assert!(st.success());
    assert_eq!(read_at(&dev, 0, data.len()), data);
    assert!(!e.run.ok(&["status", "sus"]).contains("suspended"));
    let r = e.run.run(&["luks", "resume", "sus", "--key-file", &pass]);
    assert_eq!(r.code, Some(1), "not suspended: {}", r.describe());

    // Close while suspended works (refused while a held reader has the file open, as any
    // close of a device in use is).
    e.run.ok(&["luks", "suspend", "sus"]);
    e.run.close("sus");
    let r = e.run.run(&["status", "sus"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    // The data is intact for cryptsetup.
    let r = common::run::output(
        "cryptsetup",
        &["open", "--test-passphrase", "--key-file", &pass, &img],
    );
    assert!(r.status.success());
}

#[test]
fn refresh_changes_discards_and_needs_the_passphrase() {
    if fuse_missing() {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = e.luks2_cheap("r.img", 24 << 20, PASS);
    e.run.ok(&["luks", "open", &img, "rf", "--key-file", &pass]);
    e.run.track("rf");
    let json = e.run.ok(&["status", "rf", "--json"]);
    assert!(json.contains("\"allow_discards\": false"), "{json}");
    e.run
        .ok(&["refresh", "rf", "--key-file", &pass, "--allow-discards"]);
    let json = e.run.ok(&["status", "rf", "--json"]);
    assert!(json.contains("\"allow_discards\": true"), "{json}");
    // Without the flag, back to the volume's default.
    e.run.ok(&["luks", "refresh", "rf", "--key-file", &pass]);
    let json = e.run.ok(&["status", "rf", "--json"]);
    assert!(json.contains("\"allow_discards\": false"), "{json}");
    let wrong = e.s("wrong");
    fs::write(&wrong, "nope").unwrap();
    let r = e.run.run(&["luks", "refresh", "rf", "--key-file", &wrong]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    let r = e
        .run
        .run(&["luks", "refresh", "rf", "--key-file", &pass, "--readonly"]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    e.run.close("rf");
    // Not open: exit 4.
    let r = e.run.run(&["luks", "resize", "rf"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
}

#[test]
fn a_new_nbd_connection_sees_the_resized_device() {
    // No FUSE, no root: the export is a Unix socket.
    let e = Workspace::new();
    let img = e.sparse("nbd-plain.img", 8 << 20);
    let key = e.s("key");
    fs::write(&key, pattern(64, 5)).unwrap();
    let sock = e.path("p2.sock");
    let addr = format!("unix:{}", sock.display());
    e.run.ok(&[
        "plain",
        "open",
        &img,
        "p2",
        "--key-file",
        &key,
        "--no-fuse",
        "--nbd",
        &addr,
    ]);
    e.run.track("p2");
    let first = common::nbd::Client::connect(&sock).unwrap();
    assert_eq!(first.size, 8 << 20);
    e.run.ok(&["luks", "resize", "p2", "--size", "4096"]);
    let second = common::nbd::Client::connect(&sock).unwrap();
    assert_eq!(
        second.size,
        4096 * 512,
        "the handshake tells the size after resize"
    );
    first.disconnect();
    second.disconnect();
    e.run.close("p2");
}

/// `--persistent` on `refresh` and on `open` stores the flags in the header as cryptsetup
/// does (its luksDump shows them), and a later open uses them without being asked.
#[test]
fn persistent_flags_are_stored_and_used() {
    if fuse_missing() || tool_missing("cryptsetup", "cryptsetup") {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = e.luks2_cheap("p.img", 24 << 20, PASS);
    let flags = || {
        let dump = common::run::ok("cryptsetup", &["luksDump", &img]);
        dump.lines()
            .find(|l| l.starts_with("Flags:"))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert_eq!(flags(), "(no flags)");
    e.run.ok(&["luks", "open", &img, "pf", "--key-file", &pass]);
    e.run.track("pf");
    e.run.ok(&[
        "luks",
        "refresh",
        "pf",
        "--key-file",
        &pass,
        "--allow-discards",
        "--persistent",
    ]);
    assert_eq!(flags(), "allow-discards");
    e.run.close("pf");
    // The next open passes discards down without --allow-discards.
    e.run.ok(&["luks", "open", &img, "pf", "--key-file", &pass]);
    e.run.track("pf");
    let json = e.run.ok(&["status", "pf", "--json"]);
    assert!(json.contains("\"allow_discards\": true"), "{json}");
    e.run.close("pf");
    // open --persistent without the flag clears it, as cryptsetup replaces the stored flags.
    for (extra, want) in [
        (None, "(no flags)"),
        (Some("--allow-discards"), "allow-discards"),
    ] {
        let mut args = vec![
            "luks",
            "open",
            &img,
            "pf",
            "--key-file",
            &pass,
            "--persistent",
        ];
        args.extend(extra);
        e.run.ok(&args);
        e.run.track("pf");
        assert_eq!(flags(), want);
        e.run.close("pf");
    }
}
