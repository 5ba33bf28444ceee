//! LUKS interop with the real tools: every header `dmkit luks format` writes is read by
//! `cryptsetup luksDump`/`open --test-passphrase` and yields the same volume key; every image
//! `cryptsetup luksFormat` (LUKS2 and LUKS1) and `qemu-img create -f luks` make is opened by
//! dmkit with the same volume key and the same dump; data written through `dmkit luks open`
//! decrypts with an independent AES-XTS (OpenSSL) under cryptsetup's volume key.
//!
//! KDF costs are kept tiny (forced iterations, 32 MiB Argon2) so the suite stays fast. Tests
//! needing cryptsetup/qemu-img skip without them (panic under CI); tests needing FUSE check for
//! root and /dev/fuse the same way.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::rng::bytes;
use common::run::{ok as run, Workspace};
use std::fs;
use std::path::PathBuf;
use std::process::Command;

const PASS: &str = "correct horse battery";

/// A workspace with the passphrase file `pass` (holding PASS).
fn env() -> Workspace {
    let e = Workspace::new();
    fs::write(e.path("pass"), PASS).unwrap();
    e
}

fn our_volume_key(e: &Workspace, device: &str, header: Option<&str>) -> Vec<u8> {
    let p = e.s("pass");
    let mut args = vec!["luks", "dump", "--dump-volume-key", "-q", "--key-file", &p];
    if let Some(h) = header {
        args.extend(["--header", h]);
    }
    args.push(device);
    common::volume_key::from_dump(&e.run.ok(&args))
}

/// The dump minus the line naming the device path, which differs only in spelling.
fn comparable(dump: &str) -> String {
    dump.lines()
        .filter(|l| !l.starts_with("LUKS header information for"))
        .collect::<Vec<_>>()
        .join("\n")
}

struct OurFormat<'a> {
    cipher: &'a str,
    key_bits: u32,
    sector: u32,
    pbkdf: &'a str,
    detached: bool,
    metadata: &'a str,
    label: Option<&'a str>,
    luks1: bool,
}

#[test]
fn cryptsetup_reads_what_we_format() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let cases = [
        OurFormat {
            cipher: "aes-xts-plain64",
            key_bits: 512,
            sector: 512,
            pbkdf: "pbkdf2",
            detached: false,
            metadata: "16k",
            label: Some("data"),
            luks1: false,
        },
        OurFormat {
            cipher: "aes-xts-plain64",
            key_bits: 256,
            sector: 4096,
            pbkdf: "argon2id",
            detached: false,
            metadata: "32k",
            label: None,
            luks1: false,
        },
        OurFormat {
            cipher: "aes-cbc-essiv:sha256",
            key_bits: 256,
            sector: 512,
            pbkdf: "argon2i",
            detached: true,
            metadata: "16k",
            label: Some("cbc essiv"),
            luks1: false,
        },
        OurFormat {
            cipher: "aes-xts-plain64",
            key_bits: 512,
            sector: 4096,
            pbkdf: "argon2id",
            detached: true,
            metadata: "64k",
            label: None,
            luks1: false,
        },
        OurFormat {
            cipher: "aes-xts-plain64",
            key_bits: 512,
            sector: 2048,
            pbkdf: "pbkdf2",
            detached: false,
            metadata: "256k",
            label: Some("big metadata"),
            luks1: false,
        },
        OurFormat {
            cipher: "aes-xts-plain64",
            key_bits: 512,
            sector: 512,
            pbkdf: "pbkdf2",
            detached: false,
            metadata: "",
            label: None,
            luks1: true,
        },
        OurFormat {
            cipher: "aes-cbc-essiv:sha256",
            key_bits: 256,
            sector: 512,
            pbkdf: "pbkdf2",
            detached: false,
            metadata: "",
            label: None,
            luks1: true,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let e = env();
        let img = e.sparse("disk.img", 20 << 20);
        let hdr = e.s("hdr.img");
        let pass = e.s("pass");
        let (bits, sector) = (c.key_bits.to_string(), c.sector.to_string());
        let mut args = vec![
            "luks",
            "format",
            "-q",
            "--key-file",
            &pass,
            "--cipher",
            c.cipher,
            "--key-size",
            &bits,
            "--pbkdf",
            c.pbkdf,
        ];
        if c.pbkdf == "pbkdf2" {
            args.extend(["--pbkdf-force-iterations", "1000"]);
        } else {
            args.extend([
                "--pbkdf-force-iterations",
                "1",
                "--pbkdf-memory",
                "32768",
                "--pbkdf-parallel",
                "2",
            ]);
        }
        if c.luks1 {
            args.extend(["--type", "luks1"]);
        } else {
            args.extend([
                "--sector-size",
                &sector,
                "--luks2-metadata-size",
                c.metadata,
            ]);
        }
        if let Some(l) = c.label {
            args.extend(["--label", l]);
        }
        if c.detached {
            args.extend(["--header", &hdr]);
        }
        args.push(&img);
        e.run.ok(&args);
        let header = c.detached.then_some(hdr.as_str());
        let hdr_path = header.unwrap_or(&img);
        let theirs = run("cryptsetup", &["luksDump", hdr_path]);
        let ours = e.run.ok(&["luks", "dump", hdr_path]);
        assert_eq!(
            comparable(&ours),
            comparable(&theirs),
            "case {i}: dumps differ"
        );
        if let Some(l) = c.label {
            assert!(
                theirs.contains(&format!("Label:         \t{l}\n")),
                "case {i}: label"
            );
        }
        let mut t = vec!["open", "--test-passphrase", "--key-file", &pass];
        if let Some(h) = header {
            t.extend(["--header", h]);
        }
        t.push(&img);
        run("cryptsetup", &t);
        let vk = our_volume_key(&e, &img, header);
        assert_eq!(vk.len() * 8, c.key_bits as usize, "case {i}");
        assert_eq!(
            common::volume_key::cryptsetup(&pass, &img, header),
            vk,
            "case {i}: volume keys differ"
        );
    }
}

#[test]
fn several_keyslots_and_key_management_stay_readable_by_cryptsetup() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let e = env();
    let img = e.sparse("disk.img", 20 << 20);
    let pass = e.s("pass");
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    e.run.ok(&[
        &[
            "luks",
            "format",
            "-q",
            "--key-file",
            &pass,
            "--label",
            "multi",
        ][..],
        &fast,
        &[&img],
    ]
    .concat());
    let vk = our_volume_key(&e, &img, None);
    for n in 1..=3 {
        let f = e.s(&format!("pass{n}"));
        fs::write(&f, format!("passphrase number {n}")).unwrap();
        let kdf: &[&str] = if n == 2 {
            &[
                "--pbkdf",
                "argon2id",
                "--pbkdf-force-iterations",
                "1",
                "--pbkdf-memory",
                "32768",
            ]
        } else {
            &fast
        };
        e.run.ok(&[
            &["luks", "add-key", "--key-file", &pass, "--new-keyfile", &f][..],
            kdf,
            &[&img],
        ]
        .concat());
        run(
            "cryptsetup",
            &["open", "--test-passphrase", "--key-file", &f, &img],
        );
        assert_eq!(common::volume_key::cryptsetup(&f, &img, None), vk);
    }
    // cryptsetup adds one too, and we open it.
    let f4 = e.s("pass4");
    fs::write(&f4, "from cryptsetup").unwrap();
    run(
        "cryptsetup",
        &[
            "luksAddKey",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pass,
            &img,
            &f4,
        ],
    );
    let out = e
        .run
        .ok(&["luks", "test-passphrase", "--key-file", &f4, &img]);
    assert_eq!(out.trim(), "Key slot 4 unlocked.");
    // Remove, kill, change: cryptsetup agrees on what is left.
    e.run
        .ok(&["luks", "remove-key", "--key-file", &e.s("pass1"), &img]);
    e.run.ok(&["luks", "kill-slot", "-q", &img, "2"]);
    e.run.ok(&[
        &[
            "luks",
            "change-key",
            "--key-file",
            &e.s("pass3"),
            "--new-keyfile",
            &e.s("pass1"),
        ][..],
        &fast,
        &[&img],
    ]
    .concat());
    let dump = run("cryptsetup", &["luksDump", &img]);
    let slots: Vec<&str> = dump.lines().filter(|l| l.ends_with(": luks2")).collect();
    assert_eq!(slots.len(), 3, "{dump}");
    let bad = common::run::output(
        "cryptsetup",
        &[
            "open",
            "--test-passphrase",
            "--key-file",
            &e.s("pass3"),
            &img,
        ],
    );
    assert_eq!(
        bad.status.code(),
        Some(2),
        "the changed passphrase still opens"
    );
    run(
        "cryptsetup",
        &[
            "open",
            "--test-passphrase",
            "--key-file",
            &e.s("pass1"),
            &img,
        ],
    );
    assert_eq!(
        common::volume_key::cryptsetup(&e.s("pass1"), &img, None),
        vk
    );
    // UUID and header backup round trip.
    let uuid = "0c3ed3d5-4b0a-4c52-9b3a-1f1d2d0a0b0c";
    e.run.ok(&["luks", "uuid", "--uuid", uuid, &img]);
    assert_eq!(run("cryptsetup", &["luksUUID", &img]).trim(), uuid);
    let backup = e.s("backup.bin");
    e.run.ok(&[
        "luks",
        "header-backup",
        &img,
        "--header-backup-file",
        &backup,
    ]);
    run("cryptsetup", &["luksDump", &backup]);
    e.run.ok(&["luks", "kill-slot", "-q", &img, "0"]);
    e.run.ok(&[
        "luks",
        "header-restore",
        "-q",
        &img,
        "--header-backup-file",
        &backup,
    ]);
    run(
        "cryptsetup",
        &["open", "--test-passphrase", "--key-file", &pass, &img],
    );
}

#[test]
fn we_open_what_cryptsetup_formats() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let cases: &[&[&str]] = &[
        &[
            "--type",
            "luks2",
            "--pbkdf",
            "argon2id",
            "--pbkdf-memory",
            "32768",
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-parallel",
            "4",
        ],
        &[
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--sector-size",
            "512",
            "--label",
            "x y",
        ],
        &[
            "--type",
            "luks2",
            "--pbkdf",
            "argon2i",
            "--pbkdf-memory",
            "32768",
            "--pbkdf-force-iterations",
            "4",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key-size",
            "256",
        ],
        &[
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--luks2-metadata-size",
            "64k",
            "--luks2-keyslots-size",
            "2m",
            "--hash",
            "sha512",
        ],
        &[
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
            "--sector-size",
            "4096",
            "DETACHED",
        ],
        &["--type", "luks1", "--pbkdf-force-iterations", "1000"],
        &[
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key-size",
            "256",
            "--hash",
            "sha1",
        ],
    ];
    for (i, case) in cases.iter().enumerate() {
        let e = env();
        let img = e.sparse("disk.img", 20 << 20);
        let hdr = e.s("hdr.img");
        let pass = e.s("pass");
        let detached = case.contains(&"DETACHED");
        let mut args = vec!["luksFormat", "-q", "--key-file", &pass];
        args.extend(case.iter().filter(|a| **a != "DETACHED"));
        if detached {
            args.extend(["--header", &hdr]);
        }
        args.push(&img);
        run("cryptsetup", &args);
        let header = detached.then_some(hdr.as_str());
        let hdr_path = header.unwrap_or(&img);
        let theirs = run("cryptsetup", &["luksDump", hdr_path]);
        let ours = e.run.ok(&["luks", "dump", hdr_path]);
        assert_eq!(
            comparable(&ours),
            comparable(&theirs),
            "case {i}: dumps differ"
        );
        let mut t = vec!["luks", "test-passphrase", "--key-file", &pass];
        if let Some(h) = header {
            t.extend(["--header", h]);
        }
        t.push(&img);
        assert!(e.run.ok(&t).contains("Key slot 0 unlocked."));
        assert_eq!(
            our_volume_key(&e, &img, header),
            common::volume_key::cryptsetup(&pass, &img, header),
            "case {i}"
        );
        // The JSON dump is cryptsetup's metadata, value for value.
        if !case.contains(&"luks1") {
            let theirs: serde_json::Value = serde_json::from_str(&run(
                "cryptsetup",
                &["luksDump", "--dump-json-metadata", hdr_path],
            ))
            .unwrap();
            let ours: serde_json::Value =
                serde_json::from_str(&e.run.ok(&["luks", "dump", "--json", hdr_path])).unwrap();
            assert_eq!(ours, theirs, "case {i}: JSON metadata differs");
        }
    }
}

/// Independent AES-XTS decryption of dm-crypt sectors (plain64 IVs in 512-byte units).
fn xts_decrypt(key: &[u8], data: &[u8], sector_size: usize, first_iv: u64) -> Vec<u8> {
    common::xts::xts(key, data, sector_size, first_iv, false)
}

#[test]
fn data_written_through_open_decrypts_with_cryptsetups_volume_key() {
    if tool_missing("cryptsetup", "cryptsetup-bin") || fuse_missing() {
        return;
    }
    for (sector, key_bits) in [(4096usize, "512"), (512, "256")] {
        let e = env();
        let img = e.sparse("disk.img", 20 << 20);
        let pass = e.s("pass");
        let ss = sector.to_string();
        run(
            "cryptsetup",
            &[
                "luksFormat",
                "-q",
                "--type",
                "luks2",
                // Argon2 with 2 lanes: open must still be single-threaded when it forks.
                "--pbkdf",
                "argon2id",
                "--pbkdf-memory",
                "32768",
                "--pbkdf-parallel",
                "2",
                "--pbkdf-force-iterations",
                "4",
                "--key-file",
                &pass,
                "--sector-size",
                &ss,
                "--key-size",
                key_bits,
                &img,
            ],
        );
        let out = e.run.ok(&["luks", "open", "--key-file", &pass, &img, "c0"]);
        let exported = PathBuf::from(out.lines().next().unwrap());
        assert_eq!(
            fs::metadata(&exported).unwrap().len(),
            (20 << 20) - (16 << 20)
        );
        let data = bytes(sector as u64, 1 << 20);
        {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(&exported).unwrap();
            f.write_all_at(&data, 64 << 10).unwrap();
            f.sync_all().unwrap();
        }
        e.run.ok(&["close", "c0"]);
        let raw = fs::read(&img).unwrap();
        let at = (16 << 20) + (64 << 10);
        let cipher_text = &raw[at..at + data.len()];
        assert_ne!(cipher_text, &data[..]);
        let vk = common::volume_key::cryptsetup(&pass, &img, None);
        let plain = xts_decrypt(&vk, cipher_text, sector, ((64 << 10) / 512) as u64);
        assert!(
            plain == data,
            "sector {sector}: data does not decrypt with cryptsetup's volume key"
        );
        // And it reads back through a fresh, read-only open.
        let out = e.run.ok(&[
            "luks",
            "open",
            "--read-only",
            "--key-file",
            &pass,
            &img,
            "c1",
        ]);
        let exported = PathBuf::from(out.lines().next().unwrap());
        let back = fs::read(&exported).unwrap();
        e.run.ok(&["close", "c1"]);
        assert!(back[64 << 10..(64 << 10) + data.len()] == data[..]);
    }
}

#[test]
fn qemu_luks_images_open_and_read() {
    if tool_missing("qemu-img", "qemu-utils")
        || tool_missing("qemu-io", "qemu-utils")
        || fuse_missing()
    {
        return;
    }
    let e = env();
    let img = e.s("q.luks");
    let secret = format!("secret,id=sec0,data={PASS}");
    // qemu-img's PBKDF2 benchmark now and then fails on a busy machine ("Unable to get
    // accurate CPU usage"): that is qemu's problem, so try a few times.
    let created = (0..5).any(|_| {
        Command::new("qemu-img")
            .args([
                "create",
                "-q",
                "-f",
                "luks",
                "--object",
                &secret,
                "-o",
                "key-secret=sec0,iter-time=100",
                &img,
                "4M",
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(created, "qemu-img create -f luks failed 5 times");
    let opts = format!("driver=luks,key-secret=sec0,file.filename={img}");
    run(
        "qemu-io",
        &[
            "--object",
            &secret,
            "--image-opts",
            &opts,
            "-c",
            "write -P 0xa5 0 1M",
            "-c",
            "write -P 0x3c 3M 512k",
        ],
    );
    let pass = e.s("pass");
    let dump = e.run.ok(&["luks", "dump", &img]);
    assert!(dump.contains("Version:       \t1"), "{dump}");
    let out = e.run.ok(&[
        "luks",
        "open",
        "--read-only",
        "--key-file",
        &pass,
        &img,
        "q0",
    ]);
    let exported = PathBuf::from(out.lines().next().unwrap());
    let back = fs::read(&exported).unwrap();
    e.run.ok(&["close", "q0"]);
    assert_eq!(back.len(), 4 << 20);
    assert!(back[..1 << 20].iter().all(|&b| b == 0xa5));
    assert!(back[3 << 20..(3 << 20) + (512 << 10)]
        .iter()
        .all(|&b| b == 0x3c));
}

#[test]
fn luks1_from_cryptsetup_opens_and_reads() {
    if tool_missing("cryptsetup", "cryptsetup-bin") || fuse_missing() {
        return;
    }
    let e = env();
    let img = e.sparse("disk.img", 8 << 20);
    let pass = e.s("pass");
    run(
        "cryptsetup",
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pass,
            &img,
        ],
    );
    let out = e.run.ok(&["luks", "open", "--key-file", &pass, &img, "l1"]);
    let exported = PathBuf::from(out.lines().next().unwrap());
    let data = bytes(7, 256 << 10);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&exported).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
    }
    e.run.ok(&["close", "l1"]);
    let raw = fs::read(&img).unwrap();
    let offset = 4096 * 512;
    let vk = common::volume_key::cryptsetup(&pass, &img, None);
    assert!(xts_decrypt(&vk, &raw[offset..offset + data.len()], 512, 0) == data);
}

#[test]
fn argon2_keyslots_open_with_one_lane_many_lanes_and_one_cpu() {
    // `open` forks its server after unlocking and refuses a multithreaded process: the Argon2
    // lanes must leave no thread behind, whether there is one lane (once computed on the
    // calling thread, which started rayon's global pool) or several, and on one CPU.
    if tool_missing("cryptsetup", "cryptsetup-bin")
        || tool_missing("taskset", "util-linux")
        || fuse_missing()
    {
        return;
    }
    for lanes in ["1", "4"] {
        let e = env();
        let img = e.sparse("disk.img", 20 << 20);
        let pass = e.s("pass");
        let kdf = [
            "--pbkdf",
            "argon2id",
            "--pbkdf-memory",
            "32768",
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-parallel",
            lanes,
        ];
        if lanes == "1" {
            run(
                "cryptsetup",
                &[
                    &["luksFormat", "-q", "--key-file", &pass][..],
                    &kdf,
                    &[&img],
                ]
                .concat(),
            );
        } else {
            // cryptsetup caps the lanes at the CPUs online; images from bigger machines have 4.
            e.run.ok(&[
                &["luks", "format", "-q", "--key-file", &pass][..],
                &kdf,
                &[&img],
            ]
            .concat());
            run(
                "cryptsetup",
                &["open", "--test-passphrase", "--key-file", &pass, &img],
            );
        }
        let dump = run("cryptsetup", &["luksDump", &img]);
        assert!(dump.contains(&format!("Threads:    {lanes}\n")), "{dump}");
        for pinned in [false, true] {
            let name = format!("a{lanes}{}", u8::from(pinned));
            let open = [
                common::DMKIT,
                "luks",
                "open",
                "--key-file",
                &pass,
                &img,
                &name,
            ];
            let r = if pinned {
                common::run::run_in(
                    "taskset",
                    &[&["-c", "0"][..], &open].concat(),
                    e.run.path(),
                    common::run::DMKIT_LIMIT,
                )
            } else {
                e.run.run(&open[1..])
            };
            e.run.track(&name);
            r.assert_ok();
            e.run.close(&name);
        }
    }
}
