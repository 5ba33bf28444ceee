//! The ciphers and hashes beyond AES-XTS/SHA-256 that users have on disk: serpent, twofish,
//! LRW, ESSIV with Whirlpool, PBKDF2-Whirlpool.
//!
//! - cryptsetup's own LUKS1 test images (made with the kernel's dm-crypt: serpent and twofish
//!   XTS, aes-lrw-plain64, aes-xts-essiv:wp256, Whirlpool, SHA-1, SHA-256) unlock with their
//!   key file, give cryptsetup's volume key where cryptsetup can open them here, and decrypt to
//!   the vfat filesystem with UUID DEAD-BABE through `luks open`, `plain open` and the library.
//! - Volumes `dmkit luks format` makes with these ciphers are read by `cryptsetup luksDump`
//!   (the same dump as ours), and the data written through `luks open` decrypts with libgcrypt
//!   (an independent serpent/twofish/AES XTS and CBC) under the volume key.
//! - Whirlpool both ways with cryptsetup: it formats, we open; we format, it opens.
//!
//! This machine's kernel has no serpent, twofish or LRW (and no device-mapper), so cryptsetup
//! can neither format nor unlock keyslots with them here; the LUKS1 images stand in for it.

mod common;

use common::env::{fuse_missing, missing, tool_missing};
use common::rng::bytes;
use common::run::{ok as run, Workspace};
use dmkit::crypt::cipher::{new_sector_cipher, CipherSpec};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// cryptsetup 2.6.1's release tarball, which holds tests/luks1-images.tar.xz.
const CRYPTSETUP_URL: &str =
    "http://deb.debian.org/debian/pool/main/c/cryptsetup/cryptsetup_2.6.1.orig.tar.gz";
const CRYPTSETUP_SHA256: &str = "b8adeb071bb396a1a8515f1d54b4cc8901a536d0da3f5970971beb2ec8427c17";
/// Where the tarball is kept between runs.
const CACHE: &str = "/var/tmp/cs/cryptsetup_2.6.1.orig.tar.gz";

/// cryptsetup's LUKS1 test images, extracted into `dir` (the directory holding them and their
/// passphrase file `keyfile1`); `None` when the tarball cannot be had (reported by `missing`).
/// The tarball is downloaded once into [`CACHE`] and checked against its SHA-256 every time.
fn luks1_images(dir: &Path) -> Option<PathBuf> {
    use sha2::Digest;
    let cache = Path::new(CACHE);
    if !cache.exists() {
        fs::create_dir_all(cache.parent().unwrap()).unwrap();
        let tmp = cache.with_extension("part");
        let got = Command::new("curl")
            .args(["-fsSL", "--max-time", "120", "-o"])
            .arg(&tmp)
            .arg(CRYPTSETUP_URL)
            .status()
            .is_ok_and(|s| s.success());
        if !got {
            missing(&format!("cannot download {CRYPTSETUP_URL} (curl)"));
            return None;
        }
        fs::rename(&tmp, cache).unwrap();
    }
    let sum = hex::encode(sha2::Sha256::digest(fs::read(cache).unwrap()));
    assert_eq!(sum, CRYPTSETUP_SHA256, "{CACHE}: SHA-256 mismatch");
    let inner = "cryptsetup-2.6.1/tests/luks1-images.tar.xz";
    run("tar", &["-xzf", CACHE, "-C", dir.to_str().unwrap(), inner]);
    let xz = dir.join(inner);
    run(
        "tar",
        &["-xJf", xz.to_str().unwrap(), "-C", dir.to_str().unwrap()],
    );
    Some(dir.join("luks1-images"))
}

fn blkid_uuid(path: &Path) -> String {
    run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", path.to_str().unwrap()],
    )
    .trim()
    .to_string()
}

/// The dump minus the line naming the device path.
fn comparable(dump: &str) -> String {
    dump.lines()
        .filter(|l| !l.starts_with("LUKS header information for"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn cryptsetups_luks1_images_unlock_and_decrypt_to_their_filesystem() {
    if tool_missing("blkid", "util-linux") {
        return;
    }
    let e = Workspace::new();
    let Some(dir) = luks1_images(e.dir()) else {
        return;
    };
    let key = dir.join("keyfile1").to_str().unwrap().to_string();
    let mut images: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "img"))
        .collect();
    images.sort();
    assert_eq!(images.len(), 12, "{images:?}");
    let cs = !tool_missing("cryptsetup", "cryptsetup-bin");
    let fuse = !fuse_missing();
    let mut first_sectors: Option<Vec<u8>> = None;
    for img in &images {
        let name = img.file_name().unwrap().to_str().unwrap();
        let path = img.to_str().unwrap();
        let out = e
            .run
            .ok(&["luks", "test-passphrase", "--key-file", &key, path]);
        assert_eq!(out.trim(), "Key slot 0 unlocked.", "{name}");
        let vk = common::volume_key::from_dump(&e.run.ok(&[
            "luks",
            "dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &key,
            path,
        ]));
        let h: serde_json::Value =
            serde_json::from_str(&e.run.ok(&["luks", "dump", "--json", path])).unwrap();
        let cipher = format!(
            "{}-{}",
            h["cipher_name"].as_str().unwrap(),
            h["cipher_mode"].as_str().unwrap()
        );
        // cryptsetup unlocks here what OpenSSL or the kernel can decrypt: AES XTS and CBC.
        if cs
            && (cipher.starts_with("aes-xts") || cipher.starts_with("aes-cbc"))
            && !cipher.contains("essiv:wp")
        {
            let theirs = common::volume_key::from_dump(&run(
                "cryptsetup",
                &[
                    "luksDump",
                    "--dump-volume-key",
                    "-q",
                    "--key-file",
                    &key,
                    path,
                ],
            ));
            assert_eq!(theirs, vk, "{name}: volume keys differ");
        }
        // The library's sector cipher over the payload, as dm-crypt would map it.
        let offset = h["payload_offset"].as_u64().unwrap() * 512;
        let raw = fs::read(img).unwrap();
        let mut plain = raw[offset as usize..offset as usize + (64 << 9)].to_vec();
        let c = new_sector_cipher(&CipherSpec::parse(&cipher).unwrap(), &vk).unwrap();
        c.decrypt(&mut plain, 0, 512);
        let dec = e.path(&format!("{name}.dec"));
        fs::write(&dec, &plain).unwrap();
        assert_eq!(blkid_uuid(&dec), "DEAD-BABE", "{name} ({cipher})");
        // The images hold the same filesystem: its first four sectors agree across ciphers.
        match &first_sectors {
            None => first_sectors = Some(plain[..2048].to_vec()),
            Some(f) => assert!(f[..] == plain[..2048], "{name}: sectors 0..3 differ"),
        }
        if !fuse
            || !(cipher.contains("lrw") || cipher.contains("wp256") || !cipher.starts_with("aes"))
        {
            continue;
        }
        // Served: `luks open`, then `plain open` of the payload with the volume key.
        let opened = e
            .run
            .ok(&["luks", "open", "--read-only", "--key-file", &key, path, "l"]);
        e.run.track("l");
        let exported = PathBuf::from(opened.lines().next().unwrap());
        assert_eq!(blkid_uuid(&exported), "DEAD-BABE", "luks open {name}");
        e.run.close("l");
        let vk_file = e.path("vk");
        fs::write(&vk_file, &vk).unwrap();
        let bits = (vk.len() * 8).to_string();
        let sectors = (offset / 512).to_string();
        let opened = e.run.ok(&[
            "plain",
            "open",
            path,
            "p",
            "--read-only",
            "--cipher",
            &cipher,
            "--key-size",
            &bits,
            "--key-file",
            vk_file.to_str().unwrap(),
            "--offset",
            &sectors,
        ]);
        e.run.track("p");
        let exported = PathBuf::from(opened.lines().next().unwrap());
        assert_eq!(blkid_uuid(&exported), "DEAD-BABE", "plain open {name}");
        e.run.close("p");
    }
}

#[test]
fn volumes_we_format_with_these_ciphers_read_back_and_match_libgcrypt() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let gcrypt = common::gcrypt::load();
    // (type, cipher, key bits, hash)
    let cases = [
        ("luks2", "serpent-xts-plain64", "512", "sha256"),
        ("luks2", "twofish-cbc-essiv:sha256", "256", "whirlpool"),
        ("luks2", "aes-lrw-benbi", "384", "sha256"),
        ("luks1", "serpent-cbc-essiv:sha256", "256", "sha1"),
        ("luks1", "twofish-xts-plain64", "256", "whirlpool"),
        ("luks1", "aes-xts-plain64", "512", "whirlpool"),
        ("luks2", "aes-xts-plain64", "512", "whirlpool"),
    ];
    for (kind, cipher, bits, hash) in cases {
        let what = format!("{kind} {cipher} {bits} {hash}");
        let e = Workspace::new();
        let img = e.sparse("disk.img", 20 << 20);
        let pass = e.s("pass");
        fs::write(&pass, "a passphrase").unwrap();
        e.run.ok(&[
            "luks",
            "format",
            "-q",
            "--type",
            kind,
            "--cipher",
            cipher,
            "--key-size",
            bits,
            "--hash",
            hash,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pass,
            &img,
        ]);
        let theirs = run("cryptsetup", &["luksDump", &img]);
        let ours = e.run.ok(&["luks", "dump", &img]);
        assert_eq!(
            comparable(&ours),
            comparable(&theirs),
            "{what}: dumps differ"
        );
        let vk = common::volume_key::from_dump(&e.run.ok(&[
            "luks",
            "dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &pass,
            &img,
        ]));
        assert_eq!(vk.len() * 8, bits.parse::<usize>().unwrap(), "{what}");
        if cipher.starts_with("aes-xts") {
            // cryptsetup can decrypt AES keyslots here: PBKDF2-Whirlpool, the AF splitter and
            // the digest agree.
            run(
                "cryptsetup",
                &["open", "--test-passphrase", "--key-file", &pass, &img],
            );
            let cs_vk = common::volume_key::from_dump(&run(
                "cryptsetup",
                &[
                    "luksDump",
                    "--dump-volume-key",
                    "-q",
                    "--key-file",
                    &pass,
                    &img,
                ],
            ));
            assert_eq!(cs_vk, vk, "{what}");
        }
        if fuse_missing() {
            continue;
        }
        let opened = e.run.ok(&["luks", "open", "--key-file", &pass, &img, "c"]);
        e.run.track("c");
        let exported = PathBuf::from(opened.lines().next().unwrap());
        let data = bytes(7, 256 << 10);
        {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(&exported).unwrap();
            f.write_all_at(&data, 64 << 10).unwrap();
            f.sync_all().unwrap();
        }
        e.run.close("c");
        let h: serde_json::Value =
            serde_json::from_str(&e.run.ok(&["luks", "dump", "--json", &img])).unwrap();
        let (offset, sector) = match kind {
            "luks1" => (h["payload_offset"].as_u64().unwrap() * 512, 512usize),
            _ => (
                h["segments"]["0"]["offset"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap(),
                h["segments"]["0"]["sector_size"].as_u64().unwrap() as usize,
            ),
        };
        let raw = fs::read(&img).unwrap();
        let at = (offset + (64 << 10)) as usize;
        let mut ct = raw[at..at + data.len()].to_vec();
        assert!(ct != data, "{what}: stored in the clear");
        match (&gcrypt, cipher.contains("lrw")) {
            (Some(g), false) => {
                g.sectors(cipher, &vk, &mut ct, (64 << 10) / 512, sector, false);
                assert!(ct == data, "{what}: libgcrypt decrypts something else");
            }
            // LRW has no libgcrypt mode (its kernel vectors and the kernel-made image cover
            // it): read it back through a fresh open instead.
            _ => {
                let opened = e.run.ok(&[
                    "luks",
                    "open",
                    "--read-only",
                    "--key-file",
                    &pass,
                    &img,
                    "r",
                ]);
                e.run.track("r");
                let back = fs::read(opened.lines().next().unwrap()).unwrap();
                e.run.close("r");
                assert!(
                    back[64 << 10..(64 << 10) + data.len()] == data[..],
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn whirlpool_volumes_cryptsetup_formats_open_with_its_volume_key() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    for kind in ["luks1", "luks2"] {
        let e = Workspace::new();
        let img = e.sparse("disk.img", 20 << 20);
        let pass = e.s("pass");
        fs::write(&pass, "whirl").unwrap();
        run(
            "cryptsetup",
            &[
                "luksFormat",
                "-q",
                "--type",
                kind,
                "--hash",
                "whirlpool",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                &pass,
                &img,
            ],
        );
        let out = e
            .run
            .ok(&["luks", "test-passphrase", "--key-file", &pass, &img]);
        assert_eq!(out.trim(), "Key slot 0 unlocked.", "{kind}");
        let ours = common::volume_key::from_dump(&e.run.ok(&[
            "luks",
            "dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &pass,
            &img,
        ]));
        let theirs = common::volume_key::from_dump(&run(
            "cryptsetup",
            &[
                "luksDump",
                "--dump-volume-key",
                "-q",
                "--key-file",
                &pass,
                &img,
            ],
        ));
        assert_eq!(ours, theirs, "{kind}");
    }
}
