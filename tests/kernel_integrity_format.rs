//! `dmkit integrity format` and `verify` against the real kernel (the Debian kernel under
//! QEMU, tests/kernel/), on a matrix of algorithms (crc32c, crc32, sha1, sha256, hmac-sha256
//! with 16- and 32-byte keys), tag sizes (3..32), sector sizes (512..4096), interleaves
//! (64..32768), journal sizes and modes (J, B, D).
//!
//! Two guest boots:
//! 1. The guest's `integritysetup format` makes one image per case. Back on the host, `dmkit
//!    integrity format` with the same options and the guest's salt pinned (`--salt`) writes a
//!    **byte-identical** image (superblock, journal, every tag and every zeroed sector), `dmkit
//!    integrity dump` prints what the guest's `integritysetup dump` printed, and `dmkit
//!    integrity verify` finds the guest's image clean.
//! 2. The guest opens both the image dmkit formatted (its own random salt) and the one it
//!    formatted itself with `integritysetup open` (algorithm and mode options only, no
//!    re-format), reads every sector back as zeros without an error, writes a payload at the
//!    start and the end, and closes. Back on the host, `dmkit integrity verify` finds every
//!    image clean with a clean journal, and the payload is where the geometry says.
//!
//! Skipped with a message when qemu or the kernel package is missing, except in CI.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::run::ok;
use common::DMKIT;
use dmkit::integrity::{Geometry, GeometryOptions, Superblock};
use harness::{guest, sh_quote, Bundle, Disk};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SIZE: u64 = 4 << 20;
const PAYLOAD: usize = 64 << 10;

/// One case: format options (layout and algorithm), the key size (a key file of that many
/// 'K' bytes), and the mode to open in.
struct Case {
    name: &'static str,
    opts: &'static [&'static str],
    key: Option<usize>,
    /// Extra `integritysetup open` options for the mode.
    mode: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "crc32c",
        opts: &[],
        key: None,
        mode: &[],
    },
    Case {
        name: "crc32",
        opts: &[
            "--integrity",
            "crc32",
            "--tag-size",
            "8",
            "--interleave-sectors",
            "512",
            "--journal-size",
            "65536",
            "--sector-size",
            "1024",
        ],
        key: None,
        mode: &[],
    },
    Case {
        name: "sha1b",
        opts: &["--integrity", "sha1", "--sector-size", "4096", "-B"],
        key: None,
        mode: &["-B"],
    },
    Case {
        name: "sha256",
        opts: &[
            "--integrity",
            "sha256",
            "--tag-size",
            "32",
            "--interleave-sectors",
            "64",
        ],
        key: None,
        mode: &[],
    },
    Case {
        name: "hmac32",
        opts: &[
            "--integrity",
            "hmac-sha256",
            "--integrity-key-size",
            "32",
            "--sector-size",
            "4096",
            "--tag-size",
            "16",
        ],
        key: Some(32),
        mode: &[],
    },
    Case {
        name: "crc32cd",
        opts: &[
            "--tag-size",
            "3",
            "--sector-size",
            "2048",
            "--interleave-sectors",
            "256",
            "-D",
        ],
        key: None,
        mode: &["-D"],
    },
    Case {
        name: "sha256b",
        // (--bitmap-sectors-per-bit is left out: the guest's integritysetup 2.6.1 cannot
        // format with it on its 6.1 kernel, "Invalid argument".)
        opts: &["--integrity", "sha256", "-B", "--sector-size", "2048"],
        key: None,
        mode: &["-B"],
    },
    Case {
        name: "hmac16",
        opts: &[
            "--integrity",
            "hmac-sha256",
            "--integrity-key-size",
            "16",
            "--journal-size",
            "262144",
        ],
        key: Some(16),
        mode: &[],
    },
];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The algorithm options of a case (what `open` and `verify` take), with its key file.
fn alg_opts(c: &Case, key: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut i = 0;
    while i < c.opts.len() {
        if matches!(c.opts[i], "--integrity" | "--integrity-key-size") {
            v.push(c.opts[i].to_string());
            v.push(c.opts[i + 1].to_string());
            i += 2;
        } else if matches!(c.opts[i], "-B" | "-D") {
            i += 1;
        } else {
            i += 2;
        }
    }
    if c.key.is_some() {
        v.push("--integrity-key-file".into());
        v.push(key.into());
    }
    v
}

/// Bash for the guest: key files of 16 and 32 'K' bytes.
const KEYS: &str = "printf 'KKKKKKKKKKKKKKKK' > /tmp/key16\n\
                    printf 'KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK' > /tmp/key32\n";

fn guest_key(c: &Case) -> String {
    format!("/tmp/key{}", c.key.unwrap_or(0))
}

fn sparse(path: &Path) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
}

/// The payload: byte i = (i * 13 + 5) mod 251.
fn payload() -> Vec<u8> {
    (0..PAYLOAD).map(|i| ((i * 13 + 5) % 251) as u8).collect()
}

/// Reads `len` bytes of the mapped device at logical byte `offset` from an image, through
/// its geometry.
fn read_logical(img: &[u8], offset: u64, len: usize) -> Vec<u8> {
    let sb = Superblock::parse(img).unwrap();
    let g = Geometry::new(&sb, img.len() as u64 / 512, &GeometryOptions::default()).unwrap();
    let mut out = Vec::with_capacity(len);
    for sector in offset / 512..(offset + len as u64) / 512 {
        let p = (g.data_physical_sector(sector) * 512) as usize;
        out.extend_from_slice(&img[p..p + 512]);
    }
    out
}

fn dmkit_format(c: &Case, img: &Path, key: &Path, salt: Option<&str>) {
    let mut args: Vec<String> = vec![
        "integrity".into(),
        "format".into(),
        "-q".into(),
        s(img).into(),
    ];
    args.extend(c.opts.iter().map(|o| o.to_string()));
    if c.key.is_some() {
        args.extend(["--integrity-key-file".into(), s(key).into()]);
    }
    if let Some(salt) = salt {
        args.extend(["--salt".into(), salt.into()]);
    }
    ok(DMKIT, &args);
}

fn dmkit_verify(c: &Case, img: &Path, key: &Path) -> serde_json::Value {
    let mut args: Vec<String> = vec!["integrity".into(), "verify".into(), s(img).into()];
    args.extend(alg_opts(c, s(key)));
    args.push("--json".into());
    serde_json::from_str(&ok(DMKIT, &args)).unwrap()
}

#[test]
fn kernel_and_dmkit_formats_are_interchangeable() {
    let Some(g) = guest("kernel_and_dmkit_formats_are_interchangeable") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let host_key = |c: &Case| -> PathBuf {
        let p = d.join(format!("key{}", c.key.unwrap_or(0)));
        std::fs::write(&p, vec![b'K'; c.key.unwrap_or(0)]).unwrap();
        p
    };

    // Boot 1: the guest formats.
    let mut disks = Vec::new();
    let mut script = format!("set -u\nexport LC_ALL=C\n{KEYS}");
    for c in CASES {
        let img = d.join(format!("g-{}.img", c.name));
        sparse(&img);
        disks.push(Disk::rw(&format!("g-{}", c.name), &img));
        let mut opts: Vec<String> = c.opts.iter().map(|o| sh_quote(o)).collect();
        if c.key.is_some() {
            opts.push(format!("--integrity-key-file {}", guest_key(c)));
        }
        writeln!(
            script,
            "integritysetup format -q --batch-mode {} /dev/disk/g-{n} >&2 || echo 'FAILED {n}'\n\
             echo 'DUMP-BEGIN {n}'; integritysetup dump /dev/disk/g-{n}; echo 'DUMP-END {n}'",
            opts.join(" "),
            n = c.name
        )
        .unwrap();
    }
    let run = g.run(&script, &disks, Duration::from_secs(600));
    run.assert_ok("guest format");
    let out = run.out();
    assert!(!out.contains("FAILED"), "{out}\n{}", run.stderr);
    for c in CASES {
        let gimg = d.join(format!("g-{}.img", c.name));
        let key = host_key(c);
        let guest_bytes = std::fs::read(&gimg).unwrap();
        let salt = hex::encode(&guest_bytes[48..64]);
        // dmkit's format with the guest's salt is the same image, byte for byte.
        let ours = d.join(format!("pinned-{}.img", c.name));
        sparse(&ours);
        dmkit_format(c, &ours, &key, Some(&salt));
        let our_bytes = std::fs::read(&ours).unwrap();
        if our_bytes != guest_bytes {
            let first = our_bytes
                .iter()
                .zip(&guest_bytes)
                .position(|(a, b)| a != b)
                .unwrap();
            panic!(
                "{}: dmkit's image differs from the kernel's at byte {first} (sector {})",
                c.name,
                first / 512
            );
        }
        std::fs::remove_file(&ours).unwrap();
        // The dump matches the guest's but for the device line.
        let begin = format!("DUMP-BEGIN {}\n", c.name);
        let end = format!("DUMP-END {}\n", c.name);
        let guest_dump = out
            .split_once(&begin)
            .and_then(|(_, r)| r.split_once(&end))
            .map(|(x, _)| x.to_string())
            .unwrap_or_else(|| panic!("no dump of {}:\n{out}", c.name));
        let ours = ok(DMKIT, &["integrity", "dump", s(&gimg)]);
        let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
        assert_eq!(body(&ours), body(&guest_dump), "{}", c.name);
        // And the guest's image verifies.
        let v = dmkit_verify(c, &gimg, &key);
        assert_eq!(v["bad_sectors"], serde_json::json!([]), "{}", c.name);
    }

    // Boot 2: the guest opens dmkit's and its own images, reads zeros, writes the payload.
    let mut disks = Vec::new();
    let mut bundle = Bundle::default();
    bundle.add_bytes("payload", &payload());
    let bundle_path = d.join("payload.bundle");
    let mut script = format!("set -u\nexport LC_ALL=C\n{KEYS}{}", bundle.prelude());
    script.push_str(
        r#"P=$(attach payload)
# one NAME OPEN-OPTIONS...: open, read all zeros, write the payload at both ends, close.
one() {
    local n=$1; shift
    integritysetup open "$@" /dev/disk/$n m >&2 || { echo "FAILED open $n"; return; }
    local size=$(blockdev --getsize64 /dev/mapper/m)
    echo "SIZE $n $size"
    if cmp -n "$size" /dev/mapper/m /dev/zero >&2; then echo "ZEROS $n ok"; else echo "ZEROS $n bad"; fi
    dd if=$P of=/dev/mapper/m bs=64k count=1 oflag=direct conv=fsync status=none || echo "FAILED write $n"
    dd if=$P of=/dev/mapper/m bs=64k count=1 seek=$((size / 65536 - 1)) oflag=direct conv=fsync status=none || echo "FAILED write-end $n"
    integritysetup close m || echo "FAILED close $n"
}
"#,
    );
    for c in CASES {
        let key = host_key(c);
        let dimg = d.join(format!("d-{}.img", c.name));
        sparse(&dimg);
        dmkit_format(c, &dimg, &key, None);
        disks.push(Disk::rw(&format!("d-{}", c.name), &dimg));
        disks.push(Disk::rw(
            &format!("g-{}", c.name),
            d.join(format!("g-{}.img", c.name)),
        ));
        let mut opts: Vec<String> = alg_opts(c, &guest_key(c))
            .iter()
            .map(|o| sh_quote(o))
            .collect();
        opts.extend(c.mode.iter().map(|m| m.to_string()));
        for who in ["d", "g"] {
            writeln!(script, "one {who}-{} {}", c.name, opts.join(" ")).unwrap();
        }
    }
    disks.push(bundle.write(&bundle_path));
    let run = g.run(&script, &disks, Duration::from_secs(900));
    run.assert_ok("guest open");
    let out = run.out();
    assert!(!out.contains("FAILED"), "{out}\n{}", run.stderr);
    let p = payload();
    for c in CASES {
        let key = host_key(c);
        for who in ["d", "g"] {
            let n = format!("{who}-{}", c.name);
            assert!(
                out.lines().any(|l| l == format!("ZEROS {n} ok")),
                "{n}: the kernel did not read zeros:\n{out}\n{}",
                run.stderr
            );
            let size: u64 = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("SIZE {n} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no size for {n}:\n{out}"));
            let img = d.join(format!("{n}.img"));
            let sb = Superblock::parse(&std::fs::read(&img).unwrap()).unwrap();
            assert_eq!(size, sb.provided_data_sectors * 512, "{n}");
            let v = dmkit_verify(c, &img, &key);
            assert_eq!(v["bad_sectors"], serde_json::json!([]), "{n}: {v}");
            assert_eq!(v["stale_sectors"], serde_json::json!([]), "{n}: {v}");
            assert_eq!(v["journal"]["state"], "clean", "{n}: {v}");
            let bytes = std::fs::read(&img).unwrap();
            assert!(read_logical(&bytes, 0, PAYLOAD) == p, "{n}: payload at 0");
            let end = (size / 65536 - 1) * 65536;
            assert!(
                read_logical(&bytes, end, PAYLOAD) == p,
                "{n}: payload at {end}"
            );
        }
    }
}

/// A separate data device (`--data-device`): the metadata device holds the superblock, the
/// journal and all tags, the data device only data.
struct MetaCase {
    name: &'static str,
    opts: &'static [&'static str],
    key: Option<usize>,
}

const META_CASES: &[MetaCase] = &[
    MetaCase {
        name: "m-crc32c",
        opts: &[],
        key: None,
    },
    MetaCase {
        name: "m-sha256",
        opts: &[
            "--integrity",
            "sha256",
            "--sector-size",
            "4096",
            "--journal-size",
            "131072",
        ],
        key: None,
    },
    MetaCase {
        name: "m-hmac",
        opts: &[
            "--integrity",
            "hmac-sha256",
            "--integrity-key-size",
            "32",
            "--tag-size",
            "16",
            "--buffer-sectors",
            "8",
        ],
        key: Some(32),
    },
];

const META_SIZE: u64 = 1 << 20;

impl MetaCase {
    fn as_case(&self) -> Case {
        Case {
            name: self.name,
            opts: self.opts,
            key: self.key,
            mode: &[],
        }
    }
}

fn sized(path: &Path, size: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
}

#[test]
fn separate_data_device_matches_the_kernel() {
    let Some(g) = guest("separate_data_device_matches_the_kernel") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let host_key = |c: &MetaCase| -> PathBuf {
        let p = d.join(format!("key{}", c.key.unwrap_or(0)));
        std::fs::write(&p, vec![b'K'; c.key.unwrap_or(0)]).unwrap();
        p
    };
    let meta = |who: &str, c: &MetaCase| d.join(format!("{who}-{}-meta.img", c.name));
    let data = |who: &str, c: &MetaCase| d.join(format!("{who}-{}-data.img", c.name));
    let dmkit_args = |c: &MetaCase, m: &Path, dd: &Path, key: &Path| -> Vec<String> {
        let mut v: Vec<String> = vec![
            "integrity".into(),
            "format".into(),
            "-q".into(),
            s(m).into(),
        ];
        v.extend(["--data-device".into(), s(dd).into()]);
        v.extend(c.opts.iter().map(|o| o.to_string()));
        if c.key.is_some() {
            v.extend(["--integrity-key-file".into(), s(key).into()]);
        }
        v
    };
    let verify = |c: &MetaCase, m: &Path, dd: &Path, key: &Path| -> serde_json::Value {
        let mut v: Vec<String> = vec!["integrity".into(), "verify".into(), s(m).into()];
        v.extend(["--data-device".into(), s(dd).into()]);
        v.extend(alg_opts(&c.as_case(), s(key)));
        v.push("--json".into());
        serde_json::from_str(&ok(DMKIT, &v)).unwrap()
    };

    // Boot 1: the guest formats metadata and data devices.
    let mut disks = Vec::new();
    let mut script = format!("set -u\nexport LC_ALL=C\n{KEYS}");
    for c in META_CASES {
        sized(&meta("g", c), META_SIZE);
        sized(&data("g", c), SIZE);
        disks.push(Disk::rw(&format!("{}-m", c.name), meta("g", c)));
        disks.push(Disk::rw(&format!("{}-d", c.name), data("g", c)));
        let mut opts: Vec<String> = c.opts.iter().map(|o| sh_quote(o)).collect();
        if c.key.is_some() {
            opts.push(format!(
                "--integrity-key-file /tmp/key{}",
                c.key.unwrap_or(0)
            ));
        }
        writeln!(
            script,
            "integritysetup format -q --batch-mode {} --data-device /dev/disk/{n}-d \
             /dev/disk/{n}-m >&2 || echo 'FAILED {n}'\n\
             echo 'DUMP-BEGIN {n}'; integritysetup dump /dev/disk/{n}-m; echo 'DUMP-END {n}'",
            opts.join(" "),
            n = c.name
        )
        .unwrap();
    }
    let run = g.run(&script, &disks, Duration::from_secs(600));
    run.assert_ok("guest format with --data-device");
    let out = run.out();
    assert!(!out.contains("FAILED"), "{out}\n{}", run.stderr);
    for c in META_CASES {
        let key = host_key(c);
        let gm = std::fs::read(meta("g", c)).unwrap();
        let salt = hex::encode(&gm[48..64]);
        let (pm, pd) = (meta("p", c), data("p", c));
        sized(&pm, META_SIZE);
        sized(&pd, SIZE);
        let mut args = dmkit_args(c, &pm, &pd, &key);
        args.extend(["--salt".into(), salt]);
        ok(DMKIT, &args);
        for (ours, theirs, what) in [(&pm, meta("g", c), "metadata"), (&pd, data("g", c), "data")] {
            let a = std::fs::read(ours).unwrap();
            let b = std::fs::read(&theirs).unwrap();
            if a != b {
                let first = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(0);
                panic!(
                    "{}: {what} device differs from the kernel's at byte {first}",
                    c.name
                );
            }
        }
        let begin = format!("DUMP-BEGIN {}\n", c.name);
        let end = format!("DUMP-END {}\n", c.name);
        let guest_dump = out
            .split_once(&begin)
            .and_then(|(_, r)| r.split_once(&end))
            .map(|(x, _)| x.to_string())
            .unwrap_or_else(|| panic!("no dump of {}:\n{out}", c.name));
        let ours = ok(DMKIT, &["integrity", "dump", s(&meta("g", c))]);
        let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
        assert_eq!(body(&ours), body(&guest_dump), "{}", c.name);
        let v = verify(c, &meta("g", c), &data("g", c), &key);
        assert_eq!(v["bad_sectors"], serde_json::json!([]), "{}: {v}", c.name);
    }

    // Boot 2: the guest opens what dmkit formatted (random salt), reads zeros, writes.
    let mut disks = Vec::new();
    let mut bundle = Bundle::default();
    bundle.add_bytes("payload", &payload());
    let bundle_path = d.join("payload.bundle");
    let mut script = format!("set -u\nexport LC_ALL=C\n{KEYS}{}", bundle.prelude());
    script.push_str("P=$(attach payload)\n");
    for c in META_CASES {
        let key = host_key(c);
        sized(&meta("d", c), META_SIZE);
        sized(&data("d", c), SIZE);
        ok(DMKIT, &dmkit_args(c, &meta("d", c), &data("d", c), &key));
        disks.push(Disk::rw(&format!("{}-m", c.name), meta("d", c)));
        disks.push(Disk::rw(&format!("{}-d", c.name), data("d", c)));
        let opts: Vec<String> = alg_opts(&c.as_case(), &guest_key(&c.as_case()))
            .iter()
            .map(|o| sh_quote(o))
            .collect();
        writeln!(
            script,
            "n={n}\n\
             integritysetup open {} --data-device /dev/disk/$n-d /dev/disk/$n-m m >&2 || echo \"FAILED open $n\"\n\
             size=$(blockdev --getsize64 /dev/mapper/m); echo \"SIZE $n $size\"\n\
             if cmp -n \"$size\" /dev/mapper/m /dev/zero >&2; then echo \"ZEROS $n ok\"; fi\n\
             dd if=$P of=/dev/mapper/m bs=64k count=1 oflag=direct conv=fsync status=none || echo \"FAILED write $n\"\n\
             dd if=$P of=/dev/mapper/m bs=64k count=1 seek=$((size / 65536 - 1)) oflag=direct conv=fsync status=none || echo \"FAILED write-end $n\"\n\
             integritysetup close m || echo \"FAILED close $n\"",
            opts.join(" "),
            n = c.name
        )
        .unwrap();
    }
    disks.push(bundle.write(&bundle_path));
    let run = g.run(&script, &disks, Duration::from_secs(600));
    run.assert_ok("guest open with --data-device");
    let out = run.out();
    assert!(!out.contains("FAILED"), "{out}\n{}", run.stderr);
    let p = payload();
    for c in META_CASES {
        let key = host_key(c);
        assert!(
            out.lines().any(|l| l == format!("ZEROS {} ok", c.name)),
            "{}: the kernel did not read zeros:\n{out}\n{}",
            c.name,
            run.stderr
        );
        let size: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("SIZE {} ", c.name)))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no size for {}:\n{out}", c.name));
        let v = verify(c, &meta("d", c), &data("d", c), &key);
        assert_eq!(v["bad_sectors"], serde_json::json!([]), "{}: {v}", c.name);
        assert_eq!(v["journal"]["state"], "clean", "{}: {v}", c.name);
        // Logical sectors are physical ones on a separate data device.
        let bytes = std::fs::read(data("d", c)).unwrap();
        assert!(bytes[..PAYLOAD] == p[..], "{}: payload at 0", c.name);
        let end = ((size / 65536 - 1) * 65536) as usize;
        assert!(
            bytes[end..end + PAYLOAD] == p[..],
            "{}: payload at the end",
            c.name
        );
    }
}
