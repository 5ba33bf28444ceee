//! LUKS2 authenticated encryption against the real kernel (tests/kernel/): the guest's
//! cryptsetup formats each cipher and integrity pairing cryptsetup offers (with a pinned volume
//! key), the guest's dm-crypt over dm-integrity writes known blocks, and dmkit's
//! [`SectorAead`] opens every one of them from the raw image: the kernel's tag layout
//! (auth tag, then the random IV), AAD (le64 512-byte sector || IV) and key split, in 512- and
//! 4096-byte sectors. A flipped bit of ciphertext, tag or IV, or a block read at another
//! sector, fails to authenticate.
//!
//! One guest boot; images of 48 MiB (sparse). Skipped (with a message) without the guest's
//! prerequisites unless `CI` is set.

#[path = "kernel/harness.rs"]
mod harness;

use dmkit::crypt::aead::{AeadError, AeadKind, SectorAead};
use dmkit::integrity::rw_meta::{Layout, RawSuperblock};
use harness::{guest, Disk};
use std::os::unix::fs::FileExt;
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
    }
}
