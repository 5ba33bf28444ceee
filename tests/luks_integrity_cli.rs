//! `dmkit luks format --integrity` and `luks open` from the command line: bad options and a
//! damaged integrity superblock are refused with one line naming the field and leave the
//! image untouched; an opened device round-trips data through the export, keeps it across
//! close and open (journal and `--integrity-no-journal`), and answers a sector whose
//! ciphertext was altered on disk with EIO, counted in `status`, while its neighbours read.

mod common;

use common::env::fuse_missing;
use common::run::Workspace;
use common::{status_field, xor_byte};
use std::fs;
use std::os::unix::fs::FileExt;

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn format(e: &Workspace, img: &str, pass: &str, extra: &[&str]) -> common::run::Run {
    let mut args = vec!["luks", "format", "-q", "--key-file", pass];
    args.extend(FAST);
    args.extend(extra);
    args.push(img);
    e.run.run(&args)
}

/// A passphrase file and an image of `size` bytes formatted with `extra` (which must succeed).
fn formatted(e: &Workspace, size: u64, extra: &[&str]) -> (String, String) {
    let pass = e.s("pass");
    fs::write(&pass, "integrity").unwrap();
    let img = e.sparse("disk.img", size);
    let r = format(e, &img, &pass, extra);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    (img, pass)
}

#[test]
fn bad_options_are_refused_and_nothing_is_written() {
    let e = Workspace::new();
    let pass = e.s("pass");
    fs::write(&pass, "integrity").unwrap();
    let img = e.sparse("disk.img", 40 << 20);
    fs::write(&img, vec![0xa5u8; 40 << 20]).unwrap();
    let before = fs::read(&img).unwrap();
    for (args, field) in [
        (&["--integrity", "hmac-sha1"][..], "--integrity"),
        (&["--integrity", "aead"], "aead"),
        (
            &["--cipher", "aes-gcm-random", "--integrity", "hmac-sha256"],
            "aes-gcm-random",
        ),
        (&["--integrity", "hmac-sha256", "--type", "luks1"], "LUKS2"),
        (&["--integrity", "hmac-sha256", "--uuid", "nope"], "--uuid"),
        (
            &["--integrity", "hmac-sha256", "--key-size", "384"],
            "--key-size",
        ),
        (
            &["--integrity", "hmac-sha256", "--integrity-key-size", "12"],
            "--integrity-key-size",
        ),
        (
            &["--integrity", "hmac-sha256", "--sector-size", "1000"],
            "--sector-size",
        ),
        (&["--integrity-no-wipe"], "--integrity"),
    ] {
        let r = format(&e, &img, &pass, args);
        assert_ne!(r.code, Some(0), "{args:?}: {}", r.describe());
        r.assert_no_panic();
        assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.describe());
        assert!(r.stderr.contains(field), "{args:?}: {}", r.describe());
        assert!(
            fs::read(&img).unwrap() == before,
            "{args:?} changed the image"
        );
    }
}

#[test]
fn open_round_trips_and_reports_tampered_sectors() {
    if fuse_missing() {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = formatted(
        &e,
        48 << 20,
        &["--integrity", "hmac-sha256", "--sector-size", "4096"],
    );
    let data: Vec<u8> = (0..256u32 << 10).map(|i| (i * 7 % 251) as u8).collect();
    // `luks open IMG NAME --key-file PASS EXTRA...`: the path it serves at.
    let open = |name: &str, extra: &[&str]| -> String {
        e.run.track(name);
        let mut args = vec![
            "luks",
            "open",
            img.as_str(),
            name,
            "--key-file",
            pass.as_str(),
        ];
        args.extend(extra);
        e.run.ok(&args).lines().next().unwrap().to_string()
    };
    for (name, extra) in [("li1", &[][..]), ("li2", &["--integrity-no-journal"][..])] {
        let path = open(name, extra);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.write_all_at(&data, 1 << 20).unwrap();
        f.sync_all().unwrap();
        let mut back = vec![0u8; data.len()];
        f.read_exact_at(&mut back, 1 << 20).unwrap();
        assert!(back == data, "{name}: read back differs");
        drop(f);
        let st = e.run.ok(&["status", name]);
        let mode = if extra.is_empty() { "J" } else { "D" };
        assert_eq!(
            status_field(&st, "integrity mode").as_deref(),
            Some(mode),
            "{st}"
        );
        e.run.close(name);
    }
    // Reopened: the data is still there. Then one ciphertext byte of the sector holding
    // byte 1 MiB + 8192 of the device is altered on disk.
    let read = |name: &str, off: u64, len: usize| -> std::io::Result<Vec<u8>> {
        let path = open(name, &["-r"]);
        let f = fs::File::open(&path).unwrap();
        let mut b = vec![0u8; len];
        let r = f.read_exact_at(&mut b, off).map(|_| b);
        drop(f);
        r
    };
    assert!(read("li3", 1 << 20, data.len()).unwrap() == data);
    let st = e.run.ok(&["status", "li3"]);
    assert_eq!(status_field(&st, "integrity errors").as_deref(), Some("0"));
    e.run.close("li3");
    // Offset of that sector's data on disk: the integrity layout at the segment (16 MiB).
    let dev = dmkit::block::FileDevice::open(
        std::path::Path::new(&img),
        dmkit::block::OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let win = dmkit::block::Window::new(&dev, 16 << 20, (48 - 16) << 20).unwrap();
    let mut sb = vec![0u8; 4096];
    dmkit::block::BlockDevice::read_at(&win, &mut sb, 0).unwrap();
    let layout = dmkit::integrity::Layout::from_superblock(
        &dmkit::integrity::rw_meta::RawSuperblock(sb),
        (32 << 20) / 512,
    )
    .unwrap();
    drop(dev);
    let sector = ((1 << 20) + 8192) / 512;
    xor_byte(
        std::path::Path::new(&img),
        (16 << 20) + layout.data_sector(sector) * 512 + 100,
        0x01,
    );
    let err = read("li4", 1 << 20, data.len()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The neighbours still read; the bad sector alone fails.
    assert!(read("li5", 1 << 20, 8192).unwrap() == data[..8192]);
    assert!(read("li6", (1 << 20) + 12288, 4096).unwrap() == data[12288..16384]);
    assert!(read("li7", (1 << 20) + 8192, 4096).is_err());
    // Counted per failed read of the sector (the page cache retries a failed readahead).
    let st = e.run.ok(&["status", "li7"]);
    let n: u64 = status_field(&st, "integrity errors")
        .unwrap()
        .parse()
        .unwrap();
    assert!(n >= 1, "{st}");
    let st = e.run.ok(&["status", "li6"]);
    assert_eq!(
        status_field(&st, "integrity errors").as_deref(),
        Some("0"),
        "{st}"
    );
    for n in ["li4", "li5", "li6", "li7"] {
        e.run.close(n);
    }
}

#[test]
fn a_damaged_integrity_superblock_or_wrong_passphrase_is_refused() {
    let e = Workspace::new();
    let (img, pass) = formatted(
        &e,
        40 << 20,
        &["--integrity", "hmac-sha256", "--integrity-no-wipe"],
    );
    let wrong = e.s("wrong");
    fs::write(&wrong, "not it").unwrap();
    let r = e
        .run
        .run(&["luks", "open", &img, "x1", "--key-file", &wrong]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    // The integrity superblock's tag size (byte 10) no longer matches the cipher's 32 bytes.
    xor_byte(std::path::Path::new(&img), (16 << 20) + 10, 0x04);
    let before = fs::read(&img).unwrap();
    let r = e
        .run
        .run(&["luks", "open", &img, "x2", "--key-file", &pass]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    r.assert_no_panic();
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.describe());
    assert!(r.stderr.contains("tag_size"), "{}", r.describe());
    assert!(
        fs::read(&img).unwrap() == before,
        "a refused open changed the image"
    );
    // No superblock at all.
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .write_all_at(&[0u8; 4096], 16 << 20)
        .unwrap();
    let r = e
        .run
        .run(&["luks", "open", &img, "x3", "--key-file", &pass]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("superblock"), "{}", r.describe());
}
