//! LUKS2 authenticated encryption against the real kernel (tests/kernel/): the guest's
//! cryptsetup formats each cipher and integrity pairing cryptsetup offers (with a pinned volume
//! key), the guest's dm-crypt over dm-integrity writes known blocks, and dmkit's
//! [`SectorAead`] opens every one of them from the raw image: the kernel's tag layout
//! (auth tag, then the random IV), AAD (le64 512-byte sector || IV) and key split, in 512- and
//! 4096-byte sectors. A flipped bit of ciphertext, tag or IV, or a block read at another
//! sector, fails to authenticate.
//!
//! The second test runs the other way and end to end: `dmkit luks format --integrity` formats
//! every pairing (wiped and not), `cryptsetup luksDump` prints each header exactly as
//! `dmkit luks dump` does and as it prints a header of its own with the same parameters
//! (salts and digests aside), dmkit's stacked targets write known blocks, the guest's kernel
//! opens the device, reads them back (and every sector of a wiped device), writes blocks of
//! its own, and dmkit reads those through the stack, journal replay included.
//!
//! One guest boot each; images of 48 MiB (sparse). Skipped (with a message) without the
//! guest's prerequisites unless `CI` is set.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::run::ok;
use common::DMKIT;
use dmkit::block::{BlockDevice, BlockError, FileDevice, OpenOptions};
use dmkit::crypt::aead::{AeadError, AeadKind, SectorAead};
use dmkit::crypt::aead_device::AeadCryptDevice;
use dmkit::crypt::luks2::activate::{data_segment, ActivateOptions};
use dmkit::crypt::luks2::copies as header;
use dmkit::crypt::luks2::integrity::{crypt_device, IntegrityActivation};
use dmkit::integrity::rw_meta::{Layout, RawSuperblock};
use harness::{guest, Disk};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One pairing: cipher, integrity (as cryptsetup takes it and as luksDump prints it),
/// sector size, volume key bytes.
struct Case {
    cipher: &'static str,
    integrity: &'static str,
    dump_integrity: &'static str,
    sector: usize,
    key_bytes: usize,
}

const CASES: &[Case] = &[
    Case {
        cipher: "aes-xts-plain64",
        integrity: "hmac-sha256",
        dump_integrity: "hmac(sha256)",
        sector: 512,
        key_bytes: 96,
    },
    Case {
        cipher: "aes-xts-plain64",
        integrity: "hmac-sha512",
        dump_integrity: "hmac(sha512)",
        sector: 4096,
        key_bytes: 128,
    },
    Case {
        cipher: "aes-xts-random",
        integrity: "hmac-sha256",
        dump_integrity: "hmac(sha256)",
        sector: 4096,
        key_bytes: 96,
    },
    Case {
        cipher: "aes-gcm-random",
        integrity: "aead",
        dump_integrity: "aead",
        sector: 512,
        key_bytes: 32,
    },
    Case {
        cipher: "chacha20-random",
        integrity: "poly1305",
        dump_integrity: "poly1305",
        sector: 4096,
        key_bytes: 32,
    },
    Case {
        cipher: "aes-xts-random",
        integrity: "none",
        dump_integrity: "none",
        sector: 512,
        key_bytes: 64,
    },
];

/// Where the guest writes: 512-byte sectors of the segment (block-aligned for each case).
/// The last one is in the second interleave area (32768 sectors each).
const SECTORS: &[u64] = &[0, 8, 40, 40000];

/// The segment offset cryptsetup chooses for these images (the LUKS2 default, 16 MiB).
const SEGMENT: u64 = 16 << 20;

/// The volume key of case `i`.
fn key(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 31 + i * 7 + 1) as u8).collect()
}

/// What the guest writes at `sector`: `seq SECTOR 1000000` as text, cut to one block (the
/// same command in the guest).
fn pattern(sector: u64, len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut n = sector;
    while s.len() < len {
        s.push_str(&format!("{n}\n"));
        n += 1;
    }
    s.into_bytes()[..len].to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn dmkit_opens_every_block_the_kernel_sealed_in_every_pairing() {
    let Some(g) = guest("kernel_luks_integrity") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut disks = Vec::new();
    let mut script = String::from("set -e\nprintf pass > /tmp/pass\n");
    for (i, c) in CASES.iter().enumerate() {
        let img = dir.path().join(format!("c{i}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(48 << 20)
            .unwrap();
        disks.push(Disk::rw(&format!("c{i}"), &img));
        script.push_str(&format!(
            "echo {key} | xxd -r -p > /tmp/vk{i}\n\
             cryptsetup luksFormat -q --type luks2 --cipher {cipher} --integrity {integrity} \
             --integrity-no-wipe --sector-size {ss} --volume-key-file /tmp/vk{i} \
             --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file /tmp/pass /dev/disk/c{i}\n\
             cryptsetup open --key-file /tmp/pass /dev/disk/c{i} t{i}\n\
             cryptsetup luksDump /dev/disk/c{i} | grep -E '^\\s+(cipher|integrity|offset):'\n",
            key = hex(&key(i, c.key_bytes)),
            cipher = c.cipher,
            integrity = c.integrity,
            ss = c.sector,
        ));
        for &s in SECTORS {
            script.push_str(&format!(
                "seq {s} 1000000 | head -c {ss} > /tmp/p\n\
                 dd if=/tmp/p of=/dev/mapper/t{i} bs={ss} seek={blk} count=1 oflag=direct status=none\n",
                ss = c.sector,
                blk = s * 512 / c.sector as u64,
            ));
        }
        script.push_str(&format!("cryptsetup close t{i}\n"));
    }
    let run = g.run(&script, &disks, Duration::from_secs(600));
    run.assert_ok("format and write in the guest");
    let dump = run.out();

    for (i, c) in CASES.iter().enumerate() {
        let kind = AeadKind::from_luks2(c.cipher, c.dump_integrity).unwrap();
        assert!(
            dump.contains(&format!("integrity: {}", c.dump_integrity)),
            "luksDump of case {i}:\n{dump}"
        );
        let f = std::fs::File::open(dir.path().join(format!("c{i}.img"))).unwrap();
        let size = f.metadata().unwrap().len();
        let mut sb = vec![0u8; 4096];
        f.read_exact_at(&mut sb, SEGMENT).unwrap();
        let raw = RawSuperblock(sb);
        assert!(
            raw.has_magic(),
            "case {i}: no dm-integrity superblock at 16 MiB"
        );
        assert_eq!(
            usize::from(raw.tag_size()),
            kind.metadata_size(),
            "case {i}"
        );
        let layout = Layout::from_superblock(&raw, (size - SEGMENT) / 512).unwrap();
        let aead = SectorAead::new(kind, &key(i, c.key_bytes), c.sector).unwrap();
        let ts = kind.metadata_size();
        for &s in SECTORS {
            let mut data = vec![0u8; c.sector];
            f.read_exact_at(&mut data, SEGMENT + layout.data_sector(s) * 512)
                .unwrap();
            let mut meta = vec![0u8; ts];
            f.read_exact_at(&mut meta, SEGMENT + layout.tag_offset(s))
                .unwrap();
            let sealed = data.clone();
            aead.open(s, &mut data, &meta).unwrap_or_else(|e| {
                panic!("case {i} ({} {}) sector {s}: {e}", c.cipher, c.integrity)
            });
            assert_eq!(data, pattern(s, c.sector), "case {i} sector {s}");
            if kind == AeadKind::XtsRandom {
                continue;
            }
            // Tampering: a bit of ciphertext, of the tag, of the stored IV; another position.
            let mut d = sealed.clone();
            d[c.sector - 1] ^= 1;
            assert_eq!(aead.open(s, &mut d, &meta), Err(AeadError::Auth));
            for k in [0, ts - 1] {
                let mut m = meta.clone();
                m[k] ^= 0x10;
                assert_eq!(
                    aead.open(s, &mut sealed.clone(), &m),
                    Err(AeadError::Auth),
                    "case {i} metadata byte {k}"
                );
            }
            let other = s + (c.sector / 512) as u64;
            assert_eq!(
                aead.open(other, &mut sealed.clone(), &meta),
                Err(AeadError::Auth),
                "case {i}: sector {s} replayed at {other}"
            );
        }
        // And through dmkit's whole stack (the kernel's header, integrity superblock and
        // journal), as `luks open` serves it.
        drop(f);
        let dev = open_stack(&dir.path().join(format!("c{i}.img")), &key(i, c.key_bytes));
        for &s in SECTORS {
            let mut buf = vec![0u8; c.sector];
            dev.read_at(&mut buf, s * 512)
                .unwrap_or_else(|e| panic!("case {i} sector {s} through the stack: {e}"));
            assert_eq!(
                buf,
                pattern(s, c.sector),
                "case {i} sector {s} through the stack"
            );
        }
    }
}

/// Blocks dmkit writes (512-byte sectors of the segment) and blocks the kernel writes.
const DMKIT_SECTORS: &[u64] = &[0, 8, 40, 40000];
const KERNEL_SECTORS: &[u64] = &[16, 4096, 33000];

/// A pinned UUID for case `i` (its header and the guest's twin share it).
fn uuid(i: usize) -> String {
    format!("0c3ed3d5-4b0a-4c52-9b3a-1f1d2d0a0b{i:02x}")
}

/// dmkit's stack (dm-integrity without internal hash, then dm-crypt in the authenticated
/// mode) over the image at `img`, keyed with the volume key `vk`, as `luks open` builds it.
fn open_stack(img: &Path, vk: &[u8]) -> AeadCryptDevice {
    let f = FileDevice::open(img, OpenOptions::default()).unwrap();
    let h = header::read(&f).unwrap().header;
    let seg = data_segment(&h, "img", f.size(), false).unwrap();
    let itype = seg.integrity.clone().expect("a segment with integrity");
    let opts = ActivateOptions {
        name: "t".into(),
        ..Default::default()
    };
    crypt_device(
        &seg,
        &itype,
        Arc::new(f),
        vk,
        &opts,
        &IntegrityActivation::default(),
    )
    .unwrap()
}

/// `luksDump` text without what differs per format run (salts, digests, iteration counts,
/// the header write counter).
fn masked(dump: &str) -> String {
    let mut out = Vec::new();
    let mut skip_cont = false;
    for line in dump.lines() {
        let t = line.trim_start();
        if skip_cont && line.starts_with("\t            ") {
            continue;
        }
        skip_cont = false;
        // Epoch counts header writes: cryptsetup's format writes its header three times,
        // dmkit's once.
        if ["Salt:", "Digest:", "Iterations:", "Epoch:"]
            .iter()
            .any(|k| t.starts_with(k))
        {
            skip_cont = true;
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

#[test]
fn kernel_and_dmkit_open_each_others_luks2_integrity_devices() {
    let Some(g) = guest("kernel_luks_integrity") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, "pass").unwrap();
    let mut disks = Vec::new();
    let mut script = String::from("set -e\nprintf pass > /tmp/pass\n");
    for (i, c) in CASES.iter().enumerate() {
        let wipe = i % 2 == 0;
        let img = dir.path().join(format!("d{i}.img"));
        let twin = dir.path().join(format!("k{i}.img"));
        for f in [&img, &twin] {
            std::fs::File::create(f).unwrap().set_len(48 << 20).unwrap();
        }
        let vk = key(i, c.key_bytes);
        let vk_file = dir.path().join(format!("vk{i}"));
        std::fs::write(&vk_file, &vk).unwrap();
        let ss = c.sector.to_string();
        let u = uuid(i);
        let mut args = vec![
            "luks",
            "format",
            "-q",
            "--type",
            "luks2",
            "--cipher",
            c.cipher,
            "--integrity",
            c.integrity,
            "--sector-size",
            &ss,
            "--uuid",
            &u,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ];
        if !wipe {
            args.push("--integrity-no-wipe");
        }
        let (img_s, vk_s, pass_s) = (
            img.to_str().unwrap(),
            vk_file.to_str().unwrap(),
            pass.to_str().unwrap(),
        );
        args.extend(["--volume-key-file", vk_s, "--key-file", pass_s, img_s]);
        ok(DMKIT, &args);
        // cryptsetup reads our header exactly as we print it.
        let theirs = ok("cryptsetup", &["luksDump", img_s]);
        let ours = ok(DMKIT, &["luks", "dump", img_s]);
        assert_eq!(
            theirs, ours,
            "case {i}: luksDump differs from dmkit luks dump"
        );
        {
            let dev = open_stack(&img, &vk);
            for &s in DMKIT_SECTORS {
                dev.write_at(&pattern(s, c.sector), s * 512).unwrap();
            }
            dev.flush().unwrap();
        }
        disks.push(Disk::rw(&format!("d{i}"), &img));
        disks.push(Disk::rw(&format!("k{i}"), &twin));
        let blk = |s: u64| s * 512 / c.sector as u64;
        // The kernel: its own twin header for the dump comparison, then our device.
        script.push_str(&format!(
            "cryptsetup luksFormat -q --type luks2 --cipher {cipher} --integrity {integrity} \
             --integrity-no-wipe --sector-size {ss} --uuid {u} --pbkdf pbkdf2 \
             --pbkdf-force-iterations 1000 --key-file /tmp/pass /dev/disk/k{i}\n\
             echo '=== dump {i}'\ncryptsetup luksDump /dev/disk/k{i}\necho '=== end'\n\
             cryptsetup open --key-file /tmp/pass /dev/disk/d{i} t{i}\n",
            cipher = c.cipher,
            integrity = c.integrity,
        ));
        for &s in DMKIT_SECTORS {
            script.push_str(&format!(
                "seq {s} 1000000 | head -c {ss} > /tmp/p\n\
                 dd if=/dev/mapper/t{i} bs={ss} skip={b} count=1 iflag=direct status=none | cmp - /tmp/p\n\
                 echo read-ok d{i} {s}\n",
                b = blk(s),
            ));
        }
        if wipe {
            script.push_str(&format!(
                "dd if=/dev/mapper/t{i} of=/dev/null bs=1M iflag=direct status=none && echo whole-ok d{i}\n"
            ));
        } else {
            // Never written, never wiped: no valid tag, so the kernel refuses the read.
            script.push_str(&format!(
                "if dd if=/dev/mapper/t{i} of=/dev/null bs={ss} skip={b} count=1 iflag=direct status=none 2>/dev/null; \
                 then echo unwiped-read-succeeded d{i}; else echo unwiped-eio d{i}; fi\n",
                b = blk(20000),
            ));
        }
        for &s in KERNEL_SECTORS {
            script.push_str(&format!(
                "seq {s} 1000000 | head -c {ss} > /tmp/p\n\
                 dd if=/tmp/p of=/dev/mapper/t{i} bs={ss} seek={b} count=1 oflag=direct status=none\n",
                b = blk(s),
            ));
        }
        script.push_str(&format!("cryptsetup close t{i}\n"));
    }
    let run = g.run(&script, &disks, Duration::from_secs(900));
    run.assert_ok("open dmkit's devices in the guest");
    let out = run.out();
    for (i, c) in CASES.iter().enumerate() {
        for &s in DMKIT_SECTORS {
            assert!(
                out.contains(&format!("read-ok d{i} {s}\n")),
                "case {i} sector {s}:\n{out}"
            );
        }
        // Integrity "none" authenticates nothing: an unwritten sector reads as garbage.
        let authenticated = c.integrity != "none";
        let expect = match (i % 2 == 0, authenticated) {
            (true, _) => "whole-ok",
            (false, true) => "unwiped-eio",
            (false, false) => "unwiped-read-succeeded",
        };
        assert!(
            out.contains(&format!("{expect} d{i}\n")),
            "case {i}: {expect}:\n{out}"
        );
        // Structure: the kernel's own header with the same parameters dumps the same, salts
        // and digests aside.
        let start =
            out.find(&format!("=== dump {i}\n")).expect("guest dump") + 9 + i.to_string().len();
        let end = start + out[start..].find("=== end").expect("end of dump");
        let img = dir.path().join(format!("d{i}.img"));
        let ours = ok(DMKIT, &["luks", "dump", img.to_str().unwrap()]);
        assert_eq!(
            masked(out[start..end].trim_start()),
            masked(&ours),
            "case {i} ({} {}): header structure differs from cryptsetup's",
            c.cipher,
            c.integrity
        );
        // dmkit reads what the kernel wrote, and what it wrote itself is still there.
        let dev = open_stack(&img, &key(i, c.key_bytes));
        for &s in KERNEL_SECTORS.iter().chain(DMKIT_SECTORS) {
            let mut buf = vec![0u8; c.sector];
            dev.read_at(&mut buf, s * 512)
                .unwrap_or_else(|e| panic!("case {i} sector {s}: {e}"));
            assert_eq!(buf, pattern(s, c.sector), "case {i} sector {s}");
        }
        if i % 2 == 1 && authenticated {
            let mut buf = vec![0u8; c.sector];
            assert!(
                matches!(
                    dev.read_at(&mut buf, 20000 * 512),
                    Err(BlockError::Corrupt { .. })
                ),
                "case {i}: an unwiped sector must fail for dmkit too"
            );
        }
    }
}
