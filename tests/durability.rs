//! fsync means durable: an fsync through the export (on the FUSE file, or on a loop device over
//! it) reaches the layer's flush before it returns; and after `kill -9` of a server, every write
//! an fsync acknowledged is on the backing store when the device is opened again.
//!
//! Needs root and /dev/fuse (loop devices for the loop cases): missing ones fail the test when
//! `CI` is set and skip it otherwise.

mod common;

use common::env::{fuse_missing, loop_missing};
use common::rng::SplitMix64;
use common::run::Workspace;
use common::sys::{aligned, kill, pid_gone, wait_until};
use dmkit::block::{BlockDevice, MemoryDevice, Result};
use dmkit::export::{mount_device, FuseOptions, Mounted};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A device with a volatile write cache: writes land in `cache`, and only `flush` makes them
/// durable (copies them to `disk`), like a disk with its write cache on.
struct Cached {
    cache: MemoryDevice,
    disk: Mutex<Vec<u8>>,
}

impl BlockDevice for Cached {
    fn name(&self) -> &str {
        "cached"
    }
    fn size(&self) -> u64 {
        self.cache.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.cache.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.cache.write_at(buf, offset)
    }
    fn flush(&self) -> Result<()> {
        let mut all = vec![0u8; self.size() as usize];
        self.cache.read_at(&mut all, 0)?;
        *self.disk.lock().unwrap() = all;
        Ok(())
    }
}

const SIZE: usize = 8 << 20;

fn mount_cached(dir: &Path) -> (Arc<Cached>, Box<dyn Mounted>, std::path::PathBuf) {
    let mp = fs::canonicalize(dir).unwrap().join("dev");
    fs::write(&mp, b"").unwrap();
    let dev = Arc::new(Cached {
        cache: MemoryDevice::from_vec("cache", vec![0u8; SIZE]),
        disk: Mutex::new(vec![0u8; SIZE]),
    });
    let export = mount_device(&mp, dev.clone(), FuseOptions::default()).expect("mount");
    (dev, export, mp)
}

#[test]
fn fsync_on_the_exported_file_reaches_the_device_flush() {
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (dev, mut export, mp) = mount_cached(dir.path());
    for direct in [false, true] {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let f = o.open(&mp).unwrap();
        let (mut v, off) = aligned(65536);
        let data = &mut v[off..off + 65536];
        data.fill(if direct { 0xd1 } else { 0xb0 });
        let at = if direct { 1 << 20 } else { 0 };
        f.write_all_at(data, at).unwrap();
        f.sync_data().unwrap();
        let disk = dev.disk.lock().unwrap();
        assert_eq!(
            &disk[at as usize..at as usize + 65536],
            &data[..],
            "direct={direct}"
        );
    }
    // O_DSYNC: each write is durable when it returns.
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(&mp)
        .unwrap();
    f.write_all_at(&[0x5a; 4096], 4 << 20).unwrap();
    assert_eq!(dev.disk.lock().unwrap()[4 << 20], 0x5a);
    drop(f);
    export.unmount(Duration::from_secs(5)).unwrap();
}

#[test]
fn fsync_on_a_loop_device_reaches_the_device_flush() {
    if loop_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (dev, mut export, mp) = mount_cached(dir.path());
    let lo = dmkit::export::loopdev::attach(&mp, false, true, 4096).expect("loop");
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&lo.path)
            .unwrap();
        let (mut v, off) = aligned(65536);
        let data = &mut v[off..off + 65536];
        data.fill(0x3c);
        f.write_all_at(data, 2 << 20).unwrap();
        f.sync_all().unwrap();
        assert_eq!(
            &dev.disk.lock().unwrap()[2 << 20..(2 << 20) + 65536],
            &data[..]
        );
    }
    dmkit::export::loopdev::detach(&lo.path).unwrap();
    dmkit::export::loopdev::wait_detached(&lo.path, &mp, Duration::from_secs(5));
    export.unmount(Duration::from_secs(5)).unwrap();
}

/// Random writes through the exported file of `name` (or its loop device), each fsync'd;
/// returns what the device must hold afterwards.
fn write_and_fsync(target: &str, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(target)
        .unwrap();
    let mut rng = SplitMix64(seed);
    let mut written = Vec::new();
    for _ in 0..64 {
        let len = 4096 * (1 + rng.below(16) as usize);
        let at = 4096 * rng.below((SIZE as u64 - len as u64) / 4096);
        let (mut v, off) = aligned(len);
        v[off..off + len].copy_from_slice(&rng.bytes(len));
        f.write_all_at(&v[off..off + len], at).unwrap();
        f.sync_data().unwrap();
        written.push((at, v[off..off + len].to_vec()));
    }
    written
}

fn kill_server(w: &Workspace, name: &str) {
    let v: serde_json::Value =
        serde_json::from_slice(&w.dmkit(&["status", name, "--json"]).stdout).unwrap();
    let pid = v["pid"].as_u64().unwrap() as u32;
    kill(pid, libc::SIGKILL);
    wait_until("the server's death", || pid_gone(pid));
    // The dead server's leftovers go, and nothing is lost.
    w.run.ok(&["close", name]);
}

fn check(w: &Workspace, open: &[&str], name: &str, written: &[(u64, Vec<u8>)]) {
    let out = w.run.ok(open);
    w.run.track(name);
    let file = out.lines().next().unwrap().to_string();
    let f = fs::File::open(&file).unwrap();
    // Later writes win where they overlap: replay them in order.
    let mut want = vec![None; SIZE];
    for (at, data) in written {
        for (i, b) in data.iter().enumerate() {
            want[*at as usize + i] = Some(*b);
        }
    }
    let mut got = vec![0u8; SIZE];
    f.read_exact_at(&mut got, 0).unwrap();
    for (i, w) in want.iter().enumerate() {
        if let Some(b) = w {
            assert_eq!(got[i], *b, "byte {i} of {name}");
        }
    }
    drop(f);
    w.run.close(name);
}

#[test]
fn kill_9_after_fsync_loses_nothing() {
    if loop_missing() {
        return;
    }
    let w = Workspace::new();
    let disk = w.sparse("disk.img", SIZE as u64);
    fs::write(w.path("key"), [9u8; 64]).unwrap();
    let key = w.s("key");
    let linear = ["linear", "open", disk.as_str(), "lin"];
    let plain = [
        "plain",
        "open",
        disk.as_str(),
        "crypt",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--key-file",
        key.as_str(),
    ];
    for (open, name) in [(&linear[..], "lin"), (&plain[..], "crypt")] {
        for with_loop in [false, true] {
            let mut args = open.to_vec();
            if with_loop {
                args.push("--loop");
            }
            let out = w.run.ok(&args);
            w.run.track(name);
            let lines: Vec<&str> = out.lines().collect();
            let target = if with_loop { lines[1] } else { lines[0] };
            let written = write_and_fsync(target, 0xd00d + with_loop as u64);
            kill_server(&w, name);
            check(&w, open, name, &written);
        }
    }
}
