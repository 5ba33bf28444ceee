//! End to end: an ext4 image protected by `dmkit verity`, served through FUSE + a loop device
//! and mounted by the kernel. Every file reads back identical; after one data block of one file
//! is corrupted on disk, exactly that file fails with EIO, the others still read identical,
//! `status --json` counts the corruption and the daemon log names the block.
//!
//! Needs root, /dev/fuse, loop devices, mkfs.ext4 and debugfs. Without them the test fails
//! loudly when `CI` is set and is skipped with a message otherwise.
//! `DMKIT_TEST_SEED=<n>` replays a run (the seed is printed).

mod common;

use common::env::{is_root, missing, on_path};
use common::rng::{env_seed, time_seed, SplitMix64 as Rng};
use common::run::{run_in, Run};
use common::DMKIT;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const BS: u64 = 4096;
const IMAGE_SIZE: &str = "64M";
const FILES: usize = 300;
const MAX_FILE: u64 = 200 * 1024;

// ---------------------------------------------------------------------------------------------
// Prerequisites

/// Why this machine cannot run the test, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if !is_root() {
        return Some("not running as root (mount and losetup need it)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing (modprobe fuse)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (modprobe loop)".into());
    }
    for cmd in ["mkfs.ext4", "debugfs", "mount", "umount", "losetup"] {
        if !on_path(cmd) {
            return Some(format!("{cmd} is not installed (e2fsprogs, util-linux)"));
        }
    }
    None
}

/// Runs a program with DMKIT_RUN_DIR set, within 300 s (see common::run::output_within).
fn run(program: &str, args: &[&str], run_dir: &Path) -> Run {
    run_in(program, args, run_dir, Duration::from_secs(300))
}

// ---------------------------------------------------------------------------------------------
// Random content

/// Populate `root` with `FILES` files of random sizes and content, some in subdirectories;
/// returns relative path -> content.
fn populate(root: &Path, rng: &mut Rng) -> BTreeMap<PathBuf, Vec<u8>> {
    let dirs = [
        "",
        "etc",
        "usr/lib",
        "usr/share/doc",
        "var/a/b/c",
        "deep/1/2/3/4/5",
    ];
    let mut files = BTreeMap::new();
    for i in 0..FILES {
        let dir = dirs[rng.below(dirs.len() as u64) as usize];
        let size = match i % 10 {
            0 => 0,                          // empty
            1 => BS * (1 + rng.below(8)),    // whole blocks
            2 => 3 * BS + 1 + rng.below(BS), // a partial last block
            _ => rng.below(MAX_FILE + 1),
        } as usize;
        let rel = Path::new(dir).join(format!("file-{i:03}.bin"));
        let content = rng.bytes(size);
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(&rel), &content).unwrap();
        files.insert(rel, content);
    }
    files
}

// ---------------------------------------------------------------------------------------------
// The stack under test, torn down on drop even when the test fails

struct Stack {
    run_dir: PathBuf,
    data: PathBuf,
    hash: PathBuf,
    root: String,
    name: String,
    mnt: PathBuf,
    opened: bool,
    mounted: bool,
    loop_dev: Option<String>,
}

impl Stack {
    fn dmkit(&self, args: &[&str]) -> Run {
        run(DMKIT, args, &self.run_dir)
    }

    /// `dmkit verity open DATA NAME HASH ROOT --loop` then `mount -o ro,noload`.
    fn up(&mut self) {
        let (d, h) = (s(&self.data), s(&self.hash));
        let r = self
            .dmkit(&["verity", "open", &d, &self.name, &h, &self.root, "--loop"])
            .ok();
        self.opened = true;
        let lines: Vec<&str> = r
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(
            lines.len(),
            2,
            "open --loop prints the served path, then the loop device:\n{}",
            r.describe()
        );
        let served = Path::new(lines[0]);
        assert!(
            served.exists() && served.ends_with(&self.name),
            "served path {served:?} (should exist and end in NAME):\n{}",
            r.describe()
        );
        let served_len = std::fs::metadata(served).unwrap().len();
        let data_len = std::fs::metadata(&self.data).unwrap().len();
        assert_eq!(served_len, data_len, "served size");
        let loop_dev = lines[1].to_string();
        assert!(
            loop_dev.starts_with("/dev/loop") && Path::new(&loop_dev).exists(),
            "loop device {loop_dev:?}:\n{}",
            r.describe()
        );
        self.loop_dev = Some(loop_dev.clone());
        run(
            "mount",
            &["-t", "ext4", "-o", "ro,noload", &loop_dev, &s(&self.mnt)],
            &self.run_dir,
        )
        .ok();
        self.mounted = true;
    }

    fn down(&mut self) {
        if self.mounted {
            run("umount", &[&s(&self.mnt)], &self.run_dir).ok();
            self.mounted = false;
        }
        if self.opened {
            self.dmkit(&["close", &self.name]).ok();
            self.opened = false;
            let st = self.dmkit(&["status", &self.name]);
            assert_ne!(
                st.code,
                Some(0),
                "still open after close:\n{}",
                st.describe()
            );
            if let Some(l) = self.loop_dev.take() {
                let r = run("losetup", &["-n", "-O", "BACK-FILE", &l], &self.run_dir);
                assert!(
                    !r.stdout.contains(&self.name),
                    "{l} still attached to the served file after close:\n{}",
                    r.describe()
                );
            }
        }
    }

    fn status_json(&self) -> serde_json::Value {
        let r = self.dmkit(&["status", &self.name, "--json"]).ok();
        serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{}", r.describe()))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.mounted {
            let m = s(&self.mnt);
            let ok = Command::new("umount").arg(&m).status().map(|s| s.success());
            if ok.ok() != Some(true) {
                let _ = Command::new("umount").args(["-l", &m]).status();
            }
        }
        if self.opened {
            let _ = Command::new(DMKIT)
                .args(["close", &self.name])
                .env("DMKIT_RUN_DIR", &self.run_dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn s(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// Every numeric value under a key that mentions data corruption, anywhere in `v`.
fn data_corruption_counters(v: &serde_json::Value, out: &mut Vec<(String, u64)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let key = k.to_lowercase();
                if key.contains("corrupt") && key.contains("data") {
                    if let Some(n) = x.as_u64() {
                        out.push((k.clone(), n));
                    }
                }
                data_corruption_counters(x, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| data_corruption_counters(x, out)),
        _ => {}
    }
}

/// Text of every log the daemon may have written: files under the run directory with "log" in
/// their name, and any existing path ending in ".log" that `status --json` mentions.
fn daemon_logs(run_dir: &Path, status: &serde_json::Value) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() && depth > 0 {
                walk(&p, depth - 1, out);
            } else if ft.is_file() && p.file_name().unwrap().to_string_lossy().contains("log") {
                out.push(p);
            }
        }
    }
    fn strings(v: &serde_json::Value, out: &mut Vec<PathBuf>) {
        match v {
            serde_json::Value::String(t) if t.ends_with(".log") => out.push(PathBuf::from(t)),
            serde_json::Value::Object(m) => m.values().for_each(|x| strings(x, out)),
            serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut paths = Vec::new();
    walk(run_dir, 2, &mut paths);
    strings(status, &mut paths);
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
        .collect()
}

/// Read every file under `mnt`; returns the files that differ or fail, with their error.
fn read_all(
    mnt: &Path,
    files: &BTreeMap<PathBuf, Vec<u8>>,
) -> BTreeMap<PathBuf, Result<(), std::io::Error>> {
    let mut bad = BTreeMap::new();
    for (rel, want) in files {
        match std::fs::read(mnt.join(rel)) {
            Ok(got) if &got == want => {}
            Ok(got) => {
                let first = got.iter().zip(want).position(|(a, b)| a != b);
                bad.insert(
                    rel.clone(),
                    Err(std::io::Error::other(format!(
                        "content differs: {} bytes read, {} expected, first difference at {:?}",
                        got.len(),
                        want.len(),
                        first
                    ))),
                );
            }
            Err(e) => {
                bad.insert(rel.clone(), Err(e));
            }
        }
    }
    bad
}

#[test]
fn ext4_on_verity_reads_back_and_names_corruption() {
    if let Some(why) = missing_prerequisite() {
        missing(&why);
        return;
    }
    let seed = env_seed("DMKIT_TEST_SEED").unwrap_or_else(time_seed);
    eprintln!("DMKIT_TEST_SEED={seed}");
    let mut rng = Rng(seed);

    let work = tempfile::tempdir().unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let files = populate(&src, &mut rng);
    let total: usize = files.values().map(Vec::len).sum();
    eprintln!("{} files, {total} bytes", files.len());
    let data = work.path().join("data.img");
    let hash = work.path().join("hash.img");

    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-d",
            &s(&src),
            &s(&data),
            IMAGE_SIZE,
        ],
        run_dir.path(),
    )
    .ok();
    let r = run(
        DMKIT,
        &["verity", "format", "--json", &s(&data), &s(&hash)],
        run_dir.path(),
    )
    .ok();
    let j: serde_json::Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("format --json ({e}):\n{}", r.describe()));
    let root = j["root_hash"].as_str().expect("root_hash").to_string();

    let name = format!("e2e{}", std::process::id());
    let mut stack = Stack {
        run_dir: run_dir.path().to_path_buf(),
        data: data.clone(),
        hash: hash.clone(),
        root,
        name: name.clone(),
        mnt: mnt.clone(),
        opened: false,
        mounted: false,
        loop_dev: None,
    };

    // 1. Everything reads back identical.
    stack.up();
    let bad = read_all(&mnt, &files);
    assert!(bad.is_empty(), "files that do not read back: {bad:#?}");
    let mut counters = Vec::new();
    data_corruption_counters(&stack.status_json(), &mut counters);
    assert!(
        !counters.is_empty(),
        "status --json has no data corruption counter: {:#}",
        stack.status_json()
    );
    assert!(
        counters.iter().all(|(_, n)| *n == 0),
        "corruption counted on an intact image: {counters:?}"
    );
    stack.down();

    // 2. Corrupt one data block of one file, while closed.
    let (target, content) = files
        .iter()
        .filter(|(p, c)| c.len() as u64 >= 2 * BS && p.components().count() > 2)
        .nth(rng.below(5) as usize)
        .or_else(|| files.iter().find(|(_, c)| c.len() as u64 >= 2 * BS))
        .map(|(p, c)| (p.clone(), c.clone()))
        .expect("a file of at least two blocks");
    let r = run(
        "debugfs",
        &["-R", &format!("bmap /{} 0", target.display()), &s(&data)],
        run_dir.path(),
    )
    .ok();
    let block: u64 = r
        .stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no block number from debugfs:\n{}", r.describe()));
    assert!(block > 0, "debugfs bmap:\n{}", r.describe());
    let mut image = std::fs::read(&data).unwrap();
    let at = (block * BS) as usize;
    assert_eq!(
        &image[at..at + BS as usize],
        &content[..BS as usize],
        "debugfs says block {block} holds the start of /{}, but it does not",
        target.display()
    );
    eprintln!(
        "corrupting /{} ({} bytes): its block 0 is block {block} of the image",
        target.display(),
        content.len()
    );
    image[at + 123] ^= 0x5a;
    std::fs::write(&data, &image).unwrap();
    drop(image);

    // 3. Exactly that file fails with EIO; the others still read identical.
    stack.up();
    let bad = read_all(&mnt, &files);
    let failed: Vec<&PathBuf> = bad.keys().collect();
    assert_eq!(
        failed,
        vec![&target],
        "only /{} (block {block}) should fail: {bad:#?}",
        target.display()
    );
    let err = bad[&target].as_ref().unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EIO),
        "/{} should fail with EIO, got {err:?}",
        target.display()
    );
    // Still EIO on a second try (not a one-off).
    let again = std::fs::read(mnt.join(&target)).expect_err("corrupt file read twice");
    assert_eq!(again.raw_os_error(), Some(libc::EIO), "{again:?}");

    // The served file itself: the corrupt block is EIO, its neighbours read fine.
    {
        use std::os::unix::fs::FileExt;
        let served = stack.run_dir.join(&stack.name);
        let f = std::fs::File::open(&served).expect("open the served file");
        let mut buf = vec![0u8; BS as usize];
        let e = f
            .read_exact_at(&mut buf, block * BS)
            .expect_err("reading the corrupt block of the served file");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e:?}");
        let clean = std::fs::read(&data).unwrap();
        for b in [block - 1, block + 1] {
            f.read_exact_at(&mut buf, b * BS)
                .unwrap_or_else(|e| panic!("block {b} next to the corrupt one: {e}"));
            assert!(buf[..] == clean[(b * BS) as usize..((b + 1) * BS) as usize]);
        }
    }

    let status = stack.status_json();
    let mut counters = Vec::new();
    data_corruption_counters(&status, &mut counters);
    assert!(
        counters.iter().any(|(_, n)| *n > 0),
        "status --json shows no data corruption: {status:#}"
    );
    eprintln!("after corruption: counters {counters:?}");
    let logs = daemon_logs(run_dir.path(), &status);
    let needle = format!("block {block} ");
    let named = logs.iter().any(|(_, t)| {
        t.lines().any(|l| {
            l.contains("data") && (l.contains(&needle) || l.ends_with(&format!("block {block}")))
        })
    });
    assert!(
        named,
        "no daemon log line names data block {block}; logs found: {logs:#?}"
    );
    for (path, text) in &logs {
        eprintln!(
            "{}: {}",
            path.display(),
            text.trim_end().replace('\n', " | ")
        );
    }
    stack.down();
}

/// An ext4 made with 1 KiB blocks under a verity export with 4 KiB data blocks: the loop
/// device has 4096-byte logical blocks, so the kernel refuses the mount ("bad block size 1024"
/// in dmesg only). `open --loop` says so on stderr, next to the loop device it prints.
#[test]
fn open_loop_names_a_logical_block_size_the_file_system_cannot_mount_from() {
    if let Some(why) = missing_prerequisite() {
        missing(&why);
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    let (data, hash, mnt) = (
        work.path().join("data.img"),
        work.path().join("hash.img"),
        work.path().join("mnt"),
    );
    std::fs::create_dir(&mnt).unwrap();
    run(
        "mkfs.ext4",
        &["-q", "-F", "-b", "1024", &s(&data), "8M"],
        run_dir.path(),
    )
    .ok();
    let r = run(
        DMKIT,
        &["verity", "format", "--json", &s(&data), &s(&hash)],
        run_dir.path(),
    )
    .ok();
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let root = j["root_hash"].as_str().expect("root_hash").to_string();
    let name = format!("bs{}", std::process::id());
    let mut stack = Stack {
        run_dir: run_dir.path().to_path_buf(),
        data,
        hash,
        root,
        name,
        mnt,
        opened: false,
        mounted: false,
        loop_dev: None,
    };
    let (d, h) = (s(&stack.data), s(&stack.hash));
    let r = stack.dmkit(&["verity", "open", &d, &stack.name, &h, &stack.root, "--loop"]);
    stack.opened = r.code == Some(0);
    let r = r.ok();
    let loop_dev = r
        .stdout
        .lines()
        .nth(1)
        .expect("the loop device line")
        .trim()
        .to_string();
    stack.loop_dev = Some(loop_dev.clone());
    let note = format!("dmkit: {loop_dev}: logical block size 4096 bytes");
    assert!(r.stderr.contains(&note), "no {note:?}:\n{}", r.describe());
    assert!(
        r.stderr.contains("ext4 made with -b 1024"),
        "{}",
        r.describe()
    );
    // The note is true: the kernel refuses the mount.
    let m = run(
        "mount",
        &["-t", "ext4", "-o", "ro,noload", &loop_dev, &s(&stack.mnt)],
        run_dir.path(),
    );
    stack.mounted = m.code == Some(0);
    assert_ne!(
        m.code,
        Some(0),
        "mounted a 1 KiB-block ext4 from 4 KiB blocks:\n{}",
        m.describe()
    );
    stack.down();
}
