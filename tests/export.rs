//! The FUSE export and the open/close/status lifecycle, end to end through the `dmkit` binary.
//!
//! Each test uses its own runtime directory (`DMKIT_RUN_DIR`), so they run in parallel. Tests
//! that need /dev/fuse or loop devices (and root) check for them first: when missing they
//! panic under CI (env `CI` set) and otherwise print why and pass.

mod common;

use common::env::{fuse_missing, loop_missing};
use common::rng::bytes;
use common::run::RunDir;
use common::status_field;
use common::sys::{aligned, loop_backing, mounted, pid_gone, wait_until};
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// A runtime directory and a backing file; closes what it opened when dropped, so a failing
/// test leaves no mount behind.
struct Env {
    // First, so devices are closed before the backing file goes.
    run_dir: RunDir,
    run: PathBuf,
    _dir: tempfile::TempDir,
    backing: PathBuf,
}

impl Env {
    fn new(size: usize) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = RunDir::new();
        let backing = fs::canonicalize(dir.path()).unwrap().join("backing.img");
        fs::write(&backing, bytes(size as u64, size)).unwrap();
        Env {
            _dir: dir,
            run: run_dir.path().to_path_buf(),
            run_dir,
            backing,
        }
    }

    fn dmkit(&self, args: &[&str]) -> Output {
        self.run_dir.output(args)
    }

    /// `dmkit linear open BACKING NAME extra...`, which must succeed; returns its stdout lines.
    fn open(&self, name: &str, extra: &[&str]) -> Vec<String> {
        let b = self.backing.to_str().unwrap();
        let mut args = vec!["linear", "open", b, name];
        args.extend_from_slice(extra);
        let out = self.dmkit(&args);
        assert!(
            out.status.success(),
            "open failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.run_dir.track(name);
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.run.join(name)
    }

    fn state(&self, name: &str) -> serde_json::Value {
        let text = fs::read_to_string(self.run.join(".dmkit").join(format!("{name}.json")))
            .expect("state file");
        serde_json::from_str(&text).unwrap()
    }
}

#[test]
fn close_of_unknown_name_exits_4() {
    let env = Env::new(4096);
    let out = env.dmkit(&["close", "nosuch"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch"));
    let out = env.dmkit(&["status", "nosuch"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stdout).contains("is inactive."));
}

#[test]
fn invalid_names_exit_1() {
    let env = Env::new(4096);
    let b = env.backing.to_str().unwrap();
    for bad in [".hidden", "a/b", ""] {
        let out = env.dmkit(&["linear", "open", b, bad]);
        assert_eq!(out.status.code(), Some(1), "name {bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("invalid device name"));
    }
    let out = env.dmkit(&["linear", "open", "/nonexistent/file", "x"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/file"));
}

#[test]
fn reads_and_writes_match_the_backing_file() {
    if fuse_missing() {
        return;
    }
    // An odd size: reads across the end must be short, like on a regular file.
    let size = (4 << 20) + 1000;
    let env = Env::new(size);
    let lines = env.open("rw", &[]);
    assert_eq!(lines, vec![env.path("rw").display().to_string()]);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(env.path("rw"))
        .unwrap();
    assert_eq!(f.metadata().unwrap().len(), size as u64);
    let mut want = fs::read(&env.backing).unwrap();
    for &(off, len) in &[
        (0usize, 4096usize),
        (1, 100),
        (4095, 2),
        (12345, 1 << 20),
        (size - 10, 100),
    ] {
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off as u64).unwrap();
        let end = (off + len).min(size);
        assert_eq!(n, end - off, "read length at {off}");
        assert_eq!(&buf[..n], &want[off..end], "data at {off}");
    }
    let mut buf = [0u8; 10];
    assert_eq!(f.read_at(&mut buf, size as u64).unwrap(), 0);
    for &(off, len) in &[
        (0usize, 4096usize),
        (5000, 3),
        (65536, 1 << 20),
        (size - 7, 7),
    ] {
        let data = bytes(off as u64 + 99, len);
        f.write_all_at(&data, off as u64).unwrap();
        want[off..off + len].copy_from_slice(&data);
    }
    f.sync_all().unwrap();
    assert!(
        f.write_at(&[1], size as u64).is_err(),
        "a device cannot grow"
    );
    assert_eq!(fs::read(&env.backing).unwrap(), want);
    // Read back through the export too.
    let mut all = vec![0u8; size];
    f.read_exact_at(&mut all, 0).unwrap();
    assert_eq!(all, want);
    // The size never changes: growing is refused, a truncate in between is ignored (as
    // `ftruncate(2)` failing on a block device is, by dd seek= and cp --sparse; truncate to 0
    // is tests/export_writes.rs's).
    assert!(f.set_len(size as u64 + 1).is_err());
    f.set_len(100).unwrap();
    assert_eq!(f.metadata().unwrap().len(), size as u64);
    assert_eq!(fs::read(&env.backing).unwrap(), want);
}

#[test]
fn direct_reads_and_writes() {
    if fuse_missing() {
        return;
    }
    let size = 8 << 20;
    let env = Env::new(size);
    env.open("dio", &["--direct"]);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(env.path("dio"))
        .unwrap();
    let mut want = fs::read(&env.backing).unwrap();
    let (mut v, o) = aligned(1 << 20);
    let buf = &mut v[o..o + (1 << 20)];
    f.read_exact_at(buf, 3 << 20).unwrap();
    assert_eq!(&buf[..], &want[3 << 20..4 << 20]);
    let data = bytes(7, 1 << 20);
    buf.copy_from_slice(&data);
    f.write_all_at(buf, 1 << 20).unwrap();
    want[1 << 20..2 << 20].copy_from_slice(&data);
    f.sync_all().unwrap();
    assert_eq!(fs::read(&env.backing).unwrap(), want);
}

#[test]
fn concurrent_readers_see_the_right_data() {
    if fuse_missing() {
        return;
    }
    let size = 16 << 20;
    let env = Env::new(size);
    env.open("conc", &["--threads", "4", "--read-only"]);
    let want = std::sync::Arc::new(fs::read(&env.backing).unwrap());
    let path = env.path("conc");
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let want = want.clone();
            let path = path.clone();
            std::thread::spawn(move || {
                let f = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .unwrap();
                let (mut v, o) = aligned(256 << 10);
                let mut x = t + 1;
                for _ in 0..64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let len = 4096 * (1 + (x >> 33) as usize % 64);
                    let off = 4096 * ((x >> 20) as usize % (size / 4096 - 64));
                    let buf = &mut v[o..o + len];
                    f.read_exact_at(buf, off as u64).unwrap();
                    assert_eq!(&buf[..], &want[off..off + len], "thread {t} at {off}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Read-only: opening for writing is refused.
    let err = OpenOptions::new().write(true).open(&path).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
}

#[test]
fn loop_device_serves_the_same_bytes() {
    if loop_missing() {
        return;
    }
    let size = 8 << 20;
    let env = Env::new(size);
    let lines = env.open("lp", &["--loop", "--read-only"]);
    assert_eq!(lines.len(), 2, "path and loop device: {lines:?}");
    let dev = lines[1].clone();
    assert!(dev.starts_with("/dev/loop"), "{dev}");
    assert_eq!(
        loop_backing(&dev).as_deref(),
        Some(env.path("lp").to_str().unwrap())
    );
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut File::open(&dev).unwrap(), &mut got).unwrap();
    assert_eq!(got, fs::read(&env.backing).unwrap());
    let out = env.dmkit(&["status", "lp"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        status_field(&text, "loop").as_deref(),
        Some(dev.as_str()),
        "{text}"
    );
    let out = env.dmkit(&["close", "lp"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("loop detach", || {
        loop_backing(&dev).as_deref() != Some(env.path("lp").to_str().unwrap())
    });
    assert!(!mounted(&env.path("lp")));
}

#[test]
fn status_busy_and_close() {
    if fuse_missing() {
        return;
    }
    let env = Env::new(1 << 20);
    env.open("st", &[]);
    let path = env.path("st");
    let pid = env.state("st")["pid"].as_u64().unwrap() as u32;
    assert!(mounted(&path));

    // Read something so the counters move.
    let mut buf = vec![0u8; 65536];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut buf, 0)
        .unwrap();

    let out = env.dmkit(&["status", "st"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("{} is active.", path.display())),
        "{text}"
    );
    assert_eq!(
        status_field(&text, "target").as_deref(),
        Some("linear"),
        "{text}"
    );

    let out = env.dmkit(&["status", "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1);
    let out = env.dmkit(&["status", "st", "--json"]);
    let one: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(one["state"], "active");
    assert_eq!(one["kind"], "linear");
    assert_eq!(one["pid"].as_u64(), Some(pid as u64));
    assert!(one["export"]["bytes_read"].as_u64().unwrap() >= 65536);

    // The same name twice: busy, exit 5, and the first one keeps serving.
    let b = env.backing.to_str().unwrap();
    let out = env.dmkit(&["linear", "open", b, "st"]);
    assert_eq!(out.status.code(), Some(5));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("st") && err.contains("busy"), "{err}");
    assert!(mounted(&path));

    let out = env.dmkit(&["close", "st"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!mounted(&path));
    assert!(pid_gone(pid));
    assert!(!path.exists());
    for ext in ["json", "sock", "lock"] {
        assert!(!env.run.join(".dmkit").join(format!("st.{ext}")).exists());
    }
    let out = env.dmkit(&["close", "st"]);
    assert_eq!(out.status.code(), Some(4));
    let out = env.dmkit(&["status", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn killed_server_is_cleaned_by_close() {
    if fuse_missing() {
        return;
    }
    let with_loop = Path::new("/dev/loop-control").exists();
    let env = Env::new(1 << 20);
    let lines = env.open("kl", if with_loop { &["--loop"] } else { &[] });
    let path = env.path("kl");
    let pid = env.state("kl")["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) on the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_until("server death", || pid_gone(pid as u32));
    let out = env.dmkit(&["status", "kl", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "dead");
    assert!(mounted(&path), "a killed server leaves its mount");
    let out = env.dmkit(&["close", "kl"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!mounted(&path));
    assert!(!path.exists());
    if with_loop {
        let dev = &lines[1];
        wait_until("loop detach", || {
            loop_backing(dev).as_deref() != Some(path.to_str().unwrap())
        });
    }
    let out = env.dmkit(&["close", "kl"]);
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn sigterm_shuts_the_server_down_cleanly() {
    if fuse_missing() {
        return;
    }
    let env = Env::new(1 << 20);
    env.open("tm", &[]);
    let path = env.path("tm");
    let pid = env.state("tm")["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) on the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_until("server exit", || pid_gone(pid as u32));
    assert!(!mounted(&path));
    assert!(!path.exists());
    let log = fs::read_to_string(env.run.join(".dmkit/tm.log")).unwrap();
    assert!(log.contains("closed"), "{log}");
}

/// A punched hole reads back as zeros with or without `--allow-discards` (without, zeros are
/// written: `cp --sparse=always` punches where it skips and trusts the hole to read zeros);
/// tests/export_writes.rs checks that only `--allow-discards` frees the backing file's blocks.
#[test]
fn punch_hole_zeroes_with_or_without_discards() {
    if fuse_missing() {
        return;
    }
    let env = Env::new(1 << 20);
    // One read-write mapping of the file at a time: the first is closed before the second.
    env.open("nd", &[]);
    let punch = |name: &str| {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(env.path(name))
            .unwrap();
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate(2) on a descriptor we own.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, 8192, 65536) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error())
        }
    };
    assert_eq!(punch("nd"), Ok(()));
    env.run_dir.close("nd");
    let data = fs::read(&env.backing).unwrap();
    assert!(data[8192..8192 + 65536].iter().all(|&b| b == 0));
    fs::write(&env.backing, bytes(3, 1 << 20)).unwrap();
    env.open("dc", &["--allow-discards"]);
    assert_eq!(punch("dc"), Ok(()));
    let data = fs::read(&env.backing).unwrap();
    assert!(data[8192..8192 + 65536].iter().all(|&b| b == 0));
}

/// Reads of block 3 fail as corrupted, like a dm-verity hash mismatch.
struct CorruptAt3(dmkit::block::MemoryDevice);

impl dmkit::block::BlockDevice for CorruptAt3 {
    fn name(&self) -> &str {
        "corrupt-at-3"
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> dmkit::block::Result<()> {
        let end = offset + buf.len() as u64;
        if offset < 4 * 4096 && end > 3 * 4096 {
            return Err(dmkit::block::BlockError::Corrupt {
                device: self.name().to_string(),
                what: "data",
                block: 3,
            });
        }
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> dmkit::block::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> dmkit::block::Result<()> {
        Ok(())
    }
}

#[test]
fn corrupt_blocks_read_as_eio_and_are_counted() {
    use dmkit::export::{mount_device, FuseOptions};
    if fuse_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = fs::canonicalize(dir.path()).unwrap().join("dev");
    fs::write(&mp, b"").unwrap();
    let data = bytes(3, 64 * 4096);
    let dev = CorruptAt3(dmkit::block::MemoryDevice::from_vec("mem", data.clone()));
    let mut export =
        mount_device(&mp, std::sync::Arc::new(dev), FuseOptions::default()).expect("mount");
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&mp)
        .unwrap();
    let (mut v, o) = aligned(8192);
    let buf = &mut v[o..o + 8192];
    f.read_exact_at(buf, 0).unwrap();
    assert_eq!(&buf[..], &data[..8192]);
    let err = f.read_exact_at(buf, 2 * 4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    let s = export.stats();
    // The reader saw an I/O error, and it was a corruption.
    assert!(s.corruptions >= 1, "{s:?}");
    assert_eq!(s.io_errors, s.corruptions, "{s:?}");
    drop(f);
    export.unmount(Duration::from_secs(5)).unwrap();
    assert!(!mounted(&mp));
}
