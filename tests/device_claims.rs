//! One writer per backing device, as the kernel's exclusive claim: a file or block device mapped
//! read-write by one device cannot be mapped by another (exit 5, naming the holder) — through
//! any path to the same file (a symlink, a hard link) and for a loop device — while read-only
//! verity devices may share their data. Claims die with their server: after `kill -9` the file
//! opens again. LUKS keyslot changes stay possible while the data segment is mapped; a format
//! of a mapped device is refused.
//!
//! Needs root and /dev/fuse (loop devices for the block device case): missing ones fail the
//! test when `CI` is set and skip it otherwise.

mod common;

use common::env::{fuse_missing, loop_missing, tool_missing};
use common::run::{ok, output, Workspace};
use common::sys::{kill, pid_gone, wait_until};
use std::fs;

/// A workspace with a 32 MiB file `disk.img` of zeros (room for a LUKS2 header and data), a
/// 64-byte key `key` and a passphrase `pass`.
fn workspace() -> Workspace {
    let w = Workspace::new();
    w.sparse("disk.img", 32 << 20);
    fs::write(w.path("key"), [7u8; 64]).unwrap();
    fs::write(w.path("pass"), "claims").unwrap();
    w
}

/// Opens `args`, which must succeed, and closes `name` with the workspace.
fn opened(w: &Workspace, name: &str, args: &[&str]) {
    w.run.ok(args);
    w.run.track(name);
}

/// `args` must fail with exit 5 in one line that names `holder`.
fn refused(w: &Workspace, args: &[&str], holder: &str) {
    let r = w.run.run(args);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    assert!(r.stderr.contains("in use by"), "{}", r.describe());
    assert!(
        r.stderr.contains(&format!("device '{holder}'")),
        "{}",
        r.describe()
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.describe());
}

fn plain(disk: &str, name: &str, key: &str) -> Vec<String> {
    [
        "plain",
        "open",
        disk,
        name,
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--key-file",
        key,
    ]
    .map(str::to_string)
    .to_vec()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_file_has_one_read_write_mapping_whatever_its_name() {
    if fuse_missing() {
        return;
    }
    let w = workspace();
    let disk = w.s("disk.img");
    let link = w.path("link.img");
    std::os::unix::fs::symlink(&disk, &link).unwrap();
    let hard = w.path("hard.img");
    fs::hard_link(&disk, &hard).unwrap();
    let (link, hard) = (link.to_str().unwrap(), hard.to_str().unwrap());
    let key = w.s("key");

    opened(&w, "lin", &["linear", "open", &disk, "lin"]);
    for path in [disk.as_str(), link, hard] {
        refused(&w, &["linear", "open", path, "second"], "lin");
        refused(
            &w,
            &["linear", "open", "--read-only", path, "second"],
            "lin",
        );
        refused(&w, &args(&plain(path, "second", &key)), "lin");
    }
    let r = w
        .run
        .run(&["verity", "open", &disk, "v", &disk, &"00".repeat(32)]);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    w.run.close("lin");

    // The claim went with the device: plain mode maps the file now, and holds it.
    opened(&w, "pl", &args(&plain(&disk, "pl", &key)));
    refused(&w, &args(&plain(link, "second", &key)), "pl");
    refused(&w, &["linear", "open", hard, "second"], "pl");
    w.run.close("pl");
}

#[test]
fn luks_maps_its_data_segment_and_leaves_the_header_to_keyslot_changes() {
    if fuse_missing() {
        return;
    }
    let w = workspace();
    let (disk, pass) = (w.s("disk.img"), w.s("pass"));
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let mut format = vec!["luks", "format", "-q", "--key-file", pass.as_str()];
    format.extend(fast);
    format.push(&disk);
    w.run.ok(&format);
    opened(
        &w,
        "sec",
        &["luks", "open", &disk, "sec", "--key-file", &pass],
    );
    refused(
        &w,
        &["luks", "open", &disk, "other", "--key-file", &pass],
        "sec",
    );
    refused(&w, &["linear", "open", &disk, "other"], "sec");
    // (format has -q: refused for the claim, not for want of a YES.)
    refused(&w, &format, "sec");
    // cryptsetup allows keyslot changes on an active device: the header is not mapped.
    fs::write(w.path("pass2"), "second passphrase").unwrap();
    let mut add = vec!["luks", "add-key", "--key-file", pass.as_str()];
    add.extend(fast);
    let pass2 = w.s("pass2");
    add.extend([disk.as_str(), pass2.as_str()]);
    w.run.ok(&add);
    w.run
        .ok(&["luks", "test-passphrase", "--key-file", &pass2, &disk]);
    w.run.close("sec");
}

#[test]
fn verity_devices_share_their_data_and_keep_writers_out() {
    if fuse_missing() {
        return;
    }
    let w = workspace();
    let data = w.path("data.img");
    fs::write(&data, common::rng::bytes(5, 4 << 20)).unwrap();
    let (data, hash) = (w.s("data.img"), w.s("hash.img"));
    let root = w.run.ok(&["verity", "format", "--json", &data, &hash]);
    let root: serde_json::Value = serde_json::from_str(&root).unwrap();
    let root = root["root_hash"].as_str().unwrap().to_string();
    opened(&w, "v1", &["verity", "open", &data, "v1", &hash, &root]);
    opened(&w, "v2", &["verity", "open", &data, "v2", &hash, &root]);
    refused(&w, &["linear", "open", &data, "writer"], "v1");
    // Rewriting the tree of an open device is refused too (and changes nothing).
    let before = fs::read(&hash).unwrap();
    let r = w.run.run(&["verity", "format", &data, &hash]);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    assert_eq!(fs::read(&hash).unwrap(), before);
    w.run.close("v1");
    w.run.close("v2");
    opened(&w, "writer", &["linear", "open", &data, "writer"]);
}

#[test]
fn a_killed_server_leaves_no_claim_behind() {
    if fuse_missing() {
        return;
    }
    let w = workspace();
    let disk = w.s("disk.img");
    opened(&w, "first", &["linear", "open", &disk, "first"]);
    let v: serde_json::Value =
        serde_json::from_slice(&w.dmkit(&["status", "first", "--json"]).stdout).unwrap();
    let pid = v["pid"].as_u64().unwrap() as u32;
    kill(pid, libc::SIGKILL);
    wait_until("the server's death", || pid_gone(pid));
    opened(&w, "second", &["linear", "open", &disk, "second"]);
    w.run.close("second");
}

#[test]
fn a_block_device_is_claimed_exclusively() {
    if loop_missing() || tool_missing("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let w = workspace();
    let dev = ok("losetup", &["--find", "--show", &w.s("disk.img")])
        .trim()
        .to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = output("losetup", &["-d", &self.0]);
        }
    }
    let _detach = Detach(dev.clone());
    ok("mkfs.ext4", &["-q", &dev]);
    opened(&w, "blk", &["linear", "open", &dev, "blk"]);
    refused(&w, &["linear", "open", &dev, "second"], "blk");
    // The kernel sees our claim too: the device cannot be mounted under us.
    let mnt = w.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let r = output("mount", &[dev.as_str(), mnt.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && err.contains("busy"), "mount: {err}");
    w.run.close("blk");
    // Released: now it mounts.
    ok("mount", &[dev.as_str(), mnt.to_str().unwrap()]);
    ok("umount", &[mnt.to_str().unwrap()]);
}
