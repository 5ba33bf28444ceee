//! Writing to an exported file the ways people write to block devices: `dd` without
//! `conv=notrunc`, shell redirection and `tee` (all open with `O_TRUNC`), `O_CREAT` on the
//! existing file, `O_APPEND` (refused), `cp --sparse=always`, `qemu-img convert` and
//! `mkfs.ext4` with `fsck`, on linear, LUKS2 and dm-integrity exports. The size never changes
//! and the bytes a command did not write stay as they were.

mod common;

use common::env::{fuse_missing, tools_missing};
use common::rng::bytes;
use common::run::{output_within, Workspace};
use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Size of every device under test.
const SIZE: u64 = 16 << 20;

/// The layers an export can serve.
#[derive(Clone, Copy, Debug)]
enum Layer {
    Linear,
    Luks,
    Integrity,
}

/// A workspace with one device of [`SIZE`] bytes open on `layer` (with `extra` open options).
struct Dev {
    ws: Workspace,
    path: PathBuf,
}

impl Dev {
    fn open(layer: Layer, extra: &[&str]) -> Dev {
        let ws = Workspace::new();
        let name = "w";
        let mut args: Vec<String> = Vec::new();
        match layer {
            Layer::Linear => {
                let img = ws.path("img");
                fs::write(&img, bytes(7, SIZE as usize)).unwrap();
                args.extend(["linear", "open", &ws.s("img"), name].map(String::from));
            }
            Layer::Luks => {
                let (img, pass) = ws.luks2_cheap("img", SIZE + (16 << 20), "export writes");
                args.extend(["luks", "open", &img, name, "--key-file", &pass].map(String::from));
            }
            Layer::Integrity => {
                // Big enough for SIZE bytes of data, its tags and its journal.
                let img = ws.sparse("img", SIZE + (2 << 20));
                ws.run.ok(&["integrity", "format", "--batch-mode", &img]);
                args.extend(["integrity", "open", &img, name].map(String::from));
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = ws.dmkit(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "dmkit {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ws.run.track(name);
        let path = ws.run.path().join(name);
        let dev = Dev { ws, path };
        if !matches!(layer, Layer::Integrity) {
            assert_eq!(dev.size(), SIZE, "{layer:?}: size of the export");
        }
        dev
    }

    fn size(&self) -> u64 {
        fs::metadata(&self.path).unwrap().len()
    }

    fn read_all(&self) -> Vec<u8> {
        fs::read(&self.path).unwrap()
    }

    /// Fills the device with `data` without `O_TRUNC`.
    fn fill(&self, data: &[u8]) {
        let f = OpenOptions::new().write(true).open(&self.path).unwrap();
        f.write_all_at(data, 0).unwrap();
        f.sync_all().unwrap();
    }
}

/// Runs `sh -c script` (with `$F` the export, `$W` the work directory), which must succeed.
fn sh(dev: &Dev, script: &str) {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .env("F", &dev.path)
        .env("W", dev.ws.dir());
    let out = output_within(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "sh -c {script:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `O_TRUNC` through dd, `>` and `tee`, `O_CREAT` on the existing file and `O_APPEND` on
/// one layer: every write lands where it was aimed, nothing else changes, the size stays.
fn truncating_writes(layer: Layer) {
    if fuse_missing() {
        return;
    }
    let dev = Dev::open(layer, &[]);
    let size = dev.size();
    let mut want = bytes(11, size as usize);
    dev.fill(&want);

    let src = bytes(13, 3 << 20);
    fs::write(dev.ws.path("src"), &src).unwrap();
    // dd without conv=notrunc: O_TRUNC at open, then (with seek=) a truncate at the seek.
    sh(&dev, "dd if=\"$W/src\" of=\"$F\" bs=1M count=1 status=none");
    want[..1 << 20].copy_from_slice(&src[..1 << 20]);
    sh(&dev, "echo redirected > \"$F\"");
    want[..11].copy_from_slice(b"redirected\n");
    sh(&dev, "printf teed | tee \"$F\" > /dev/null");
    want[..4].copy_from_slice(b"teed");
    sh(&dev, "dd if=\"$W/src\" of=\"$F\" bs=1M seek=2 status=none");
    want[2 << 20..5 << 20].copy_from_slice(&src);
    assert_eq!(dev.size(), size, "{layer:?}: size after O_TRUNC writes");
    let back = dev.read_all();
    assert_eq!(back.len(), want.len(), "{layer:?}: bytes read back");
    assert!(back == want, "{layer:?}: data after dd, > and tee");

    // O_CREAT on the existing file opens it; O_APPEND is refused at open with EINVAL.
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&dev.path)
        .unwrap();
    f.write_all_at(b"created", 100).unwrap();
    drop(f);
    want[100..107].copy_from_slice(b"created");
    let e = OpenOptions::new()
        .append(true)
        .open(&dev.path)
        .expect_err("O_APPEND must be refused");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{layer:?}: O_APPEND");
    assert!(dev.read_all() == want, "{layer:?}: data after O_CREAT");
    assert_eq!(dev.size(), size);
}

#[test]
fn o_trunc_writes_on_linear() {
    truncating_writes(Layer::Linear);
}

#[test]
fn o_trunc_writes_on_luks() {
    truncating_writes(Layer::Luks);
}

#[test]
fn o_trunc_writes_on_integrity() {
    truncating_writes(Layer::Integrity);
}

/// `truncate(2)` keeps the size: to 0 the device reads back as zeros (an emptied file), to a
/// size in between nothing changes (as `dd seek=` and `cp --sparse` expect of a block device),
/// past the end it is EINVAL.
#[test]
fn truncate_keeps_the_size() {
    if fuse_missing() {
        return;
    }
    let dev = Dev::open(Layer::Luks, &[]);
    let want = bytes(17, SIZE as usize);
    dev.fill(&want);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev.path)
        .unwrap();
    f.set_len(SIZE - 10_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), SIZE);
    assert!(
        dev.read_all() == want,
        "a truncate in between changes nothing"
    );
    let e = f.set_len(SIZE + 1).expect_err("growing must fail");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    // Read the tail first: its cached pages must not survive the truncate to 0.
    let mut tail = vec![0u8; 4096];
    f.read_exact_at(&mut tail, SIZE - 4096).unwrap();
    assert_eq!(tail[..], want[SIZE as usize - 4096..]);
    f.set_len(0).unwrap();
    f.read_exact_at(&mut tail, SIZE - 4096).unwrap();
    assert!(
        tail.iter().all(|&b| b == 0),
        "cached tail after truncate to 0"
    );
    assert_eq!(f.metadata().unwrap().len(), SIZE);
    drop(f);
    assert!(dev.read_all().iter().all(|&b| b == 0));
}

/// Punched holes and zeroed ranges read back as zeros on every export; with
/// `--allow-discards` on a linear export a punched hole reaches the backing file as a hole.
#[test]
fn fallocate_punch_and_zero_read_back_as_zeros() {
    if fuse_missing() {
        return;
    }
    let falloc = |path: &Path, mode: i32, off: i64, len: i64| {
        let f = OpenOptions::new().write(true).open(path).unwrap();
        // SAFETY: fallocate(2) on a descriptor we own.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) };
        assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    };
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    for (layer, extra) in [
        (Layer::Luks, &["--allow-discards"][..]),
        (Layer::Integrity, &[][..]),
    ] {
        let dev = Dev::open(layer, extra);
        let mut want = bytes(19, dev.size() as usize);
        dev.fill(&want);
        falloc(&dev.path, punch, 1000, 300_000);
        want[1000..301_000].fill(0);
        falloc(&dev.path, libc::FALLOC_FL_ZERO_RANGE, 1 << 20, 70_000);
        want[1 << 20..(1 << 20) + 70_000].fill(0);
        assert!(dev.read_all() == want, "{layer:?}: data after fallocate");
    }
    // Linear: without --allow-discards the backing file keeps its blocks, with it they go.
    for (extra, freed) in [(&[][..], false), (&["--allow-discards"][..], true)] {
        let dev = Dev::open(Layer::Linear, extra);
        let img = dev.ws.path("img");
        let blocks = || std::os::unix::fs::MetadataExt::blocks(&fs::metadata(&img).unwrap());
        let before = blocks();
        falloc(&dev.path, punch, 0, 8 << 20);
        assert!(dev.read_all()[..8 << 20].iter().all(|&b| b == 0));
        assert_eq!(
            blocks() < before,
            freed,
            "{extra:?}: {before} -> {}",
            blocks()
        );
    }
}

/// `cp --sparse=always` of a sparse file smaller than the device, `qemu-img convert` (with
/// and without `-n`) and `mkfs.ext4` + `fsck`: what was copied reads back exactly.
fn tools_write(layer: Layer) {
    if fuse_missing()
        || tools_missing(&[
            ("qemu-img", "qemu-utils"),
            ("mkfs.ext4", "e2fsprogs"),
            ("fsck.ext4", "e2fsprogs"),
        ])
    {
        return;
    }
    let discards: &[&str] = match layer {
        Layer::Integrity => &[],
        _ => &["--allow-discards"],
    };
    let dev = Dev::open(layer, discards);
    let size = dev.size() as usize;
    let noise = bytes(23, size);
    // A sparse source of half the device: data, a hole, data, and a hole at its end.
    let src = dev.ws.path("sparse");
    let half = size / 2;
    {
        let f = fs::File::create(&src).unwrap();
        f.set_len(half as u64).unwrap();
        f.write_all_at(&bytes(29, 5000), 3).unwrap();
        f.write_all_at(&bytes(31, 70_000), 2 << 20).unwrap();
    }
    let src_data = fs::read(&src).unwrap();

    dev.fill(&noise);
    sh(&dev, "cp --sparse=always \"$W/sparse\" \"$F\"");
    let back = dev.read_all();
    assert!(
        back[..half] == src_data[..],
        "{layer:?}: cp --sparse=always"
    );
    assert_eq!(back.len(), size);

    for (args, what) in [("", "qemu-img convert"), ("-n", "qemu-img convert -n")] {
        dev.fill(&noise);
        sh(
            &dev,
            &format!("qemu-img convert {args} -f raw -O raw \"$W/sparse\" \"$F\""),
        );
        let back = dev.read_all();
        assert!(back[..half] == src_data[..], "{layer:?}: {what}");
        assert_eq!(back.len(), size, "{layer:?}: {what}: size");
    }

    dev.fill(&noise);
    sh(&dev, "mkfs.ext4 -q -F \"$F\" && fsck.ext4 -fn \"$F\"");
    assert_eq!(dev.size() as usize, size);
}

#[test]
fn tools_write_on_linear() {
    tools_write(Layer::Linear);
}

#[test]
fn tools_write_on_luks() {
    tools_write(Layer::Luks);
}

#[test]
fn tools_write_on_integrity() {
    tools_write(Layer::Integrity);
}
