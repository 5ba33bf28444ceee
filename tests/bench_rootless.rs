//! `dmkit bench rootless --quick --runs 1` on a small tree: the report has a read row per file
//! system for the kernel mounts and each rootless overlay mode the machine allows, the three
//! hashing rows, and every figure is positive and counts the whole tree.
//!
//! Needs root, loop devices, FUSE, setpriv and the three mkfs tools: skipped with a reason
//! outside CI, a failure in CI.

mod common;

use common::env::{self, is_root, missing};
use common::run::{world_dir, Workspace};
use dmkit::bench::scenarios::rootless::{render, RootlessBenchReport, FILE_SYSTEMS};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

fn prerequisites_missing() -> bool {
    if !is_root() {
        return missing("not running as root (kernel mounts, drop_caches and setpriv need it)");
    }
    env::loop_missing()
        || env::tools_missing(&[
            ("setpriv", "util-linux"),
            ("mksquashfs", "squashfs-tools"),
            ("mkfs.erofs", "erofs-utils"),
            ("mkfs.ext4", "e2fsprogs"),
            ("fusermount3", "fuse3"),
            ("fuse-overlayfs", "fuse-overlayfs"),
        ])
}

#[test]
fn quick_run_has_every_file_system_and_sane_figures() {
    if prerequisites_missing() {
        return;
    }
    let ws = Workspace::new();
    // --quick reads the tree's usr/bin only: everything is there.
    let tree = ws.path("tree");
    let w = |rel: &str, data: Vec<u8>| {
        let p = tree.join("usr/bin").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    };
    w("big.bin", common::rng::bytes(1, 2 << 20));
    for i in 0..30u64 {
        w(
            &format!("etc/small/f{i:02}"),
            common::rng::bytes(10 + i, (i as usize + 1) * 700),
        );
    }
    w("etc/empty", Vec::new());
    w("../../outside", b"not read with --quick".to_vec());
    std::os::unix::fs::symlink("big.bin", tree.join("usr/bin/link")).unwrap();
    let files = 32u64;
    let bytes = (2 << 20) + (1..=30u64).map(|i| i * 700).sum::<u64>();
    let dir = world_dir(&ws, "pub");

    let t = Instant::now();
    let r = common::run::run_in(
        common::DMKIT,
        &[
            "bench",
            "rootless",
            "--quick",
            "--runs",
            "1",
            "--json",
            "--tree",
            tree.to_str().unwrap(),
            "--dir",
            dir.to_str().unwrap(),
        ],
        ws.run.path(),
        Duration::from_secs(300),
    );
    r.assert_ok();
    eprintln!("bench rootless --quick: {:.1} s", t.elapsed().as_secs_f64());
    let rep: RootlessBenchReport = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(rep.runs, 1);
    assert_eq!(
        rep.filesystems
            .iter()
            .map(|f| f.fs.as_str())
            .collect::<Vec<_>>(),
        FILE_SYSTEMS.to_vec()
    );
    for f in &rep.filesystems {
        assert_eq!(f.skipped, None, "{}", f.fs);
        assert!(f.image_size.unwrap() > bytes, "{}", f.fs);
        assert!(!f.compress.is_empty());
        let keys: Vec<&str> = f.reads.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            ["kernel", "kernel-loop", "userns", "fuse-overlayfs"],
            "{}",
            f.fs
        );
        let mut rootless = 0;
        for s in &f.reads {
            if let Some(why) = &s.skipped {
                // Only a rootless mode the machine lacks may be skipped, saying why.
                assert!(
                    s.key != "kernel" && s.key != "kernel-loop",
                    "{}: {why}",
                    f.fs
                );
                assert!(!why.is_empty());
                continue;
            }
            rootless += usize::from(s.key != "kernel" && s.key != "kernel-loop");
            assert_eq!(s.seconds.len(), 1, "{} {}", f.fs, s.key);
            assert!(s.seconds[0] > 0.0 && s.seconds[0] < 60.0, "{} {s:?}", f.fs);
            assert!(s.open_s[0] > 0.0, "{} {s:?}", f.fs);
            assert_eq!((s.files, s.bytes), (files, bytes), "{} {}", f.fs, s.key);
        }
        assert!(rootless >= 1, "{}: no rootless mode measured", f.fs);
        let keys: Vec<&str> = f.hashes.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["mtree", "walk", "sha256sum"]);
        for s in &f.hashes {
            assert_eq!(s.seconds.len(), 1);
            assert!(s.seconds[0] > 0.0, "{} {s:?}", f.fs);
            assert_eq!((s.files, s.bytes), (files, bytes), "{} {}", f.fs, s.key);
        }
    }
    assert!(rep
        .load_before
        .iter()
        .chain(&rep.load_after)
        .all(|l| *l >= 0.0));

    // The text: one read row per file system and measured side, one hashing row per tool.
    let text = render(&rep);
    assert!(text.contains("load average before"), "{text}");
    for f in &rep.filesystems {
        let rows = text
            .lines()
            .filter(|l| l.starts_with(&format!("| {} (", f.fs)))
            .count();
        let measured = f.reads.iter().filter(|s| s.skipped.is_none()).count();
        assert_eq!(rows, measured + 3, "{}: {text}", f.fs);
    }
    // Nothing left: no mount under the directory, the scratch directory removed.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(dir.to_str().unwrap()), "{mounts}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// Without root the command refuses in one line, before building anything.
#[test]
fn refuses_without_root_in_one_line() {
    if !is_root() {
        let out = common::run::output(common::DMKIT, &["bench", "rootless", "--quick"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("needs root"), "{err}");
        return;
    }
    if env::tool_missing("setpriv", "util-linux") {
        return;
    }
    let out = common::run::output(
        "setpriv",
        &[
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            common::DMKIT,
            "bench",
            "rootless",
            "--quick",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root"), "{err}");
}
