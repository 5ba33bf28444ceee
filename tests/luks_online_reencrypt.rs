//! Online reencryption: `luks reencrypt NAME` on a device dmkit has open re-keys it inside its
//! server while it keeps serving. fio verify runs on the loop device during the whole
//! reencryption; a kill -9 of the server mid-way loses no fsync'd write and the next open
//! plus `--resume-only NAME` finishes; a close mid-way leaves metadata that the offline
//! `--resume-only` finishes; `status` shows the progress; cryptsetup accepts every result.

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

const PASS: &str = "online reencryption";

/// Open `img` as `name` (tracked, closed with the workspace) and fill all 64 MiB of it with
/// pattern `seed`, synced; the served file's path and what it holds.
fn open_filled(e: &Workspace, img: &str, pass: &str, name: &str, seed: u8) -> (String, Vec<u8>) {
    let out = e.run.ok(&["luks", "open", img, name, "--key-file", pass]);
    e.run.track(name);
    let dev = out.lines().next().unwrap().to_string();
    let want = pattern(64 << 20, seed);
    write_synced(&dev, 0, &want);
    (dev, want)
}

/// A LUKS2 image made by cryptsetup: 16 MiB of header, then `data_mib` MiB of data.
fn image(e: &Workspace, data_mib: u64) -> (String, String) {
    let pass = e.s("pass");
    fs::write(&pass, PASS).unwrap();
    let img = e.sparse("img", (16 + data_mib) << 20);
    let mut args = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
    args.extend(FAST);
    args.extend(["--key-file", &pass, &img]);
    common::run::ok("cryptsetup", &args);
    (img, pass)
}

fn assert_clean_for_cryptsetup(img: &str, pass: &str) {
    let dump = common::run::ok("cryptsetup", &["luksDump", img]);
    assert!(
        !dump.contains("reencrypt"),
        "still in reencryption:\n{dump}"
    );
    assert!(!dump.contains("online-reencrypt"), "{dump}");
    common::run::ok(
        "cryptsetup",
        &["open", "--test-passphrase", "--key-file", pass, img],
    );
}

fn missing_tools(with_loop: bool) -> bool {
    fuse_missing()
        || (with_loop && loop_missing())
        || tool_missing("cryptsetup", "cryptsetup-bin")
        || tool_missing("fio", "fio")
}

#[test]
fn fio_verify_passes_during_the_whole_online_reencryption() {
    if missing_tools(true) {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = image(&e, 64);
    let out = e
        .run
        .ok(&["luks", "open", &img, "ofio", "--key-file", &pass, "--loop"]);
    e.run.track("ofio");
    let loopdev = out.lines().nth(1).unwrap().to_string();
    let mut fio = Command::new("fio")
        .args([
            "--name=online-reencrypt",
            &format!("--filename={loopdev}"),
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=32",
            "--ioengine=libaio",
            "--direct=1",
            "--size=64M",
            "--time_based",
            "--runtime=60",
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
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let r = start_reencrypt(&e, "ofio", &pass, &[])
        .wait_with_output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        r.status.success(),
        "online reencryption failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let progress = String::from_utf8_lossy(&r.stdout);
    let last = progress.lines().last().unwrap_or_default();
    assert!(last.contains(r#""device_bytes":"67108864""#), "{last}");
    let st = status(&e, "ofio");
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio ended before the reencryption did ({took:?})"
    );
    let f = fio.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&f.stdout);
    assert!(
        f.status.success() && report.contains("err= 0"),
        "fio verify failed during online reencryption:\n{report}\n{}",
        String::from_utf8_lossy(&f.stderr)
    );
    eprintln!("online reencryption of 64 MiB under fio randrw qd32: {took:?}");
    e.run.close("ofio");
    assert_clean_for_cryptsetup(&img, &pass);
    // dmkit opens the result offline too.
    e.run
        .ok(&["luks", "open", &img, "ofio", "--key-file", &pass]);
    e.run.track("ofio");
    e.run.close("ofio");
}

#[test]
fn kill_9_mid_way_loses_no_fsynced_write_and_resume_only_finishes() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = image(&e, 64);
    let (dev, mut want) = open_filled(&e, &img, &pass, "okill", 3);
    let child = start_reencrypt(&e, "okill", &pass, &["--hotzone-size", "256K"]);
    wait_mid_way(&e, "okill");
    // Writes on both sides of the boundary, fsync'd while the reencryption runs.
    for (i, at) in [0u64, 20 << 20, 40 << 20, 63 << 20].into_iter().enumerate() {
        let data = pattern(1 << 20, 100 + i as u8);
        write_synced(&dev, at, &data);
        want[at as usize..at as usize + data.len()].copy_from_slice(&data);
    }
    let pid = status(&e, "okill")["pid"].as_u64().unwrap() as u32;
    kill(pid, libc::SIGKILL);
    wait_until("the server's death", || pid_gone(pid));
    drop(child);
    e.run.ok(&["close", "okill"]);
    let dump = common::run::ok("cryptsetup", &["luksDump", &img]);
    assert!(
        dump.contains("reencrypt"),
        "not left in reencryption:\n{dump}"
    );

    let out = e
        .run
        .ok(&["luks", "open", &img, "okill", "--key-file", &pass]);
    let dev = out.lines().next().unwrap().to_string();
    resume_served(&e, &dev, "okill", &pass, &want, &["--resume-only"]);
    assert_clean_for_cryptsetup(&img, &pass);
    e.run
        .ok(&["luks", "open", &img, "okill", "--key-file", &pass]);
    assert!(
        read(&dev, 0, want.len()) == want,
        "read back differs after reopen"
    );
    e.run.close("okill");
}

#[test]
fn status_shows_progress_and_close_mid_way_resumes_offline() {
    if missing_tools(false) {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = image(&e, 64);
    let (_, want) = open_filled(&e, &img, &pass, "oclose", 9);
    // --init-only on the open device, then --resume-only NAME, as cryptsetup does.
    let mut init = vec![
        "luks",
        "reencrypt",
        "oclose",
        "--key-file",
        &pass,
        "--init-only",
    ];
    init.extend(FAST);
    e.run.ok(&init);
    let dump = common::run::ok("cryptsetup", &["luksDump", &img]);
    assert!(dump.contains("reencrypt"), "{dump}");
    let child = start_reencrypt(
        &e,
        "oclose",
        &pass,
        &["--resume-only", "--hotzone-size", "256K"],
    );
    wait_mid_way(&e, "oclose");
    let text = e.run.ok(&["status", "oclose"]);
    assert!(text.contains("reencryption:"), "{text}");
    assert!(text.contains("in progress"), "{text}");
    e.run.close("oclose");
    let r = child.wait_with_output().unwrap();
    assert!(
        !r.status.success(),
        "the interrupted reencryption reported success"
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("interrupted"), "{err}");
    let dump = common::run::ok("cryptsetup", &["luksDump", &img]);
    assert!(dump.contains("reencrypt"), "close finished it:\n{dump}");

    let mut resume = vec![
        "luks",
        "reencrypt",
        img.as_str(),
        "--key-file",
        &pass,
        "--resume-only",
    ];
    resume.push("--batch-mode");
    e.run.ok(&resume);
    assert_clean_for_cryptsetup(&img, &pass);
    let out = e
        .run
        .ok(&["luks", "open", &img, "oclose", "--key-file", &pass]);
    let dev = out.lines().next().unwrap().to_string();
    assert!(read(&dev, 0, want.len()) == want, "plaintext changed");
    e.run.close("oclose");
}
