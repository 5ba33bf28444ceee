//! `dmkit plain open` against an independent implementation: what we write through the
//! export equals OpenSSL's encryption (the `openssl` crate, one call per sector with dm-crypt's
//! IVs) of the same plaintext, and data OpenSSL encrypted reads back decrypted through the
//! export, over sector sizes, IV modes, key sizes, `--offset`, `--skip` and
//! `--iv-large-sectors`. Plus the command's bad-input errors.
//!
//! Tests that need /dev/fuse (and root) check first: when missing they panic under CI (env
//! `CI` set) and otherwise print why and pass.

mod common;

use common::env::fuse_missing;
use common::rng::bytes;
use common::run::RunDir;
use openssl::symm::{Cipher, Crypter, Mode};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A work directory and a run directory that closes what is still open when dropped.
struct Env {
    // First, so devices are closed before their backing files go.
    run: RunDir,
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

impl Env {
    fn new() -> Env {
        let d = tempfile::tempdir().unwrap();
        let dir = fs::canonicalize(d.path()).unwrap();
        Env {
            dir,
            _dir: d,
            run: RunDir::new(),
        }
    }

    fn dmkit(&self, args: &[&str]) -> Output {
        self.run.output(args)
    }

    fn open(&self, args: &[&str]) -> PathBuf {
        let out = self.dmkit(args);
        assert!(
            out.status.success(),
            "dmkit {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = args[3].to_string();
        self.run.track(&name);
        let path = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap()
            .to_string();
        assert_eq!(PathBuf::from(&path), self.run.path().join(&name));
        PathBuf::from(path)
    }

    fn close(&self, name: &str) {
        self.run.close(name);
    }
}

/// One plain-mode configuration.
struct Case {
    cipher: &'static str,
    key_bits: usize,
    sector_size: usize,
    iv_large: bool,
    offset_sectors: u64,
    skip_sectors: u64,
}

impl Case {
    /// dm-crypt's IV sector of sector `i` (in sector_size units) of the device.
    fn iv_sector(&self, i: u64) -> u64 {
        let s512 = i * (self.sector_size as u64 / 512) + self.skip_sectors;
        if self.iv_large {
            s512 / (self.sector_size as u64 / 512)
        } else {
            s512
        }
    }

    fn iv(&self, key: &[u8], sector: u64) -> [u8; 16] {
        let ivmode = self.cipher.splitn(3, '-').nth(2).unwrap();
        let mut iv = [0u8; 16];
        match ivmode {
            "plain64" => iv[..8].copy_from_slice(&sector.to_le_bytes()),
            "plain" => iv[..4].copy_from_slice(&(sector as u32).to_le_bytes()),
            "essiv:sha256" => {
                let salt = openssl::sha::sha256(key);
                iv[..8].copy_from_slice(&sector.to_le_bytes());
                let mut c =
                    Crypter::new(Cipher::aes_256_ecb(), Mode::Encrypt, &salt, None).unwrap();
                c.pad(false);
                let mut out = [0u8; 32];
                c.update(&iv, &mut out).unwrap();
                iv.copy_from_slice(&out[..16]);
            }
            m => panic!("no reference IV for {m}"),
        }
        iv
    }

    fn openssl_cipher(&self) -> Cipher {
        match (self.cipher.starts_with("aes-xts"), self.key_bits) {
            (true, 256) => Cipher::aes_128_xts(),
            (true, 512) => Cipher::aes_256_xts(),
            (false, 256) => Cipher::aes_256_cbc(),
            (false, 128) => Cipher::aes_128_cbc(),
            _ => unreachable!(),
        }
    }

    /// OpenSSL, sector by sector.
    fn reference(&self, key: &[u8], data: &[u8], mode: Mode) -> Vec<u8> {
        let ss = self.sector_size;
        let mut out = Vec::with_capacity(data.len());
        for (i, s) in data.chunks(ss).enumerate() {
            let iv = self.iv(key, self.iv_sector(i as u64));
            let mut c = Crypter::new(self.openssl_cipher(), mode, key, Some(&iv)).unwrap();
            c.pad(false);
            let mut o = vec![0u8; ss + 32];
            let n = c.update(s, &mut o).unwrap();
            assert_eq!(n + c.finalize(&mut o[n..]).unwrap(), ss);
            out.extend_from_slice(&o[..ss]);
        }
        out
    }

    fn args(&self, backing: &Path, name: &str, keyfile: &Path) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "plain".into(),
            "open".into(),
            backing.display().to_string(),
            name.into(),
            "--cipher".into(),
            self.cipher.into(),
            "--key-size".into(),
            self.key_bits.to_string(),
            "--key-file".into(),
            keyfile.display().to_string(),
            "--keyfile-offset".into(),
            "7".into(),
            "--sector-size".into(),
            self.sector_size.to_string(),
            "--offset".into(),
            self.offset_sectors.to_string(),
            "--skip".into(),
            self.skip_sectors.to_string(),
        ];
        if self.iv_large {
            v.push("--iv-large-sectors".into());
        }
        v
    }
}

const CASES: &[Case] = &[
    Case {
        cipher: "aes-xts-plain64",
        key_bits: 512,
        sector_size: 512,
        iv_large: false,
        offset_sectors: 0,
        skip_sectors: 0,
    },
    Case {
        cipher: "aes-xts-plain64",
        key_bits: 256,
        sector_size: 4096,
        iv_large: true,
        offset_sectors: 8,
        skip_sectors: 16,
    },
    Case {
        cipher: "aes-xts-plain64",
        key_bits: 512,
        sector_size: 4096,
        iv_large: false,
        offset_sectors: 16,
        skip_sectors: 3,
    },
    Case {
        cipher: "aes-xts-plain64",
        key_bits: 512,
        sector_size: 2048,
        iv_large: true,
        offset_sectors: 0,
        skip_sectors: 0,
    },
    Case {
        cipher: "aes-xts-plain",
        key_bits: 512,
        sector_size: 1024,
        iv_large: false,
        offset_sectors: 2,
        skip_sectors: 0,
    },
    Case {
        cipher: "aes-cbc-essiv:sha256",
        key_bits: 256,
        sector_size: 512,
        iv_large: false,
        offset_sectors: 1,
        skip_sectors: 5,
    },
    Case {
        cipher: "aes-cbc-essiv:sha256",
        key_bits: 128,
        sector_size: 4096,
        iv_large: true,
        offset_sectors: 0,
        skip_sectors: 8,
    },
];

const DEV_SIZE: usize = 1 << 20;

#[test]
fn writes_equal_openssl_and_openssl_data_reads_back() {
    if fuse_missing() {
        return;
    }
    let env = Env::new();
    for (n, case) in CASES.iter().enumerate() {
        let keyfile = env.dir.join(format!("key{n}"));
        let keybytes = bytes(100 + n as u64, 7 + case.key_bits / 8 + 5);
        fs::write(&keyfile, &keybytes).unwrap();
        let key = &keybytes[7..7 + case.key_bits / 8];
        let off = case.offset_sectors as usize * 512;
        let backing = env.dir.join(format!("backing{n}.img"));
        let head = bytes(7, off);
        let mut initial = head.clone();
        initial.resize(off + DEV_SIZE, 0);
        fs::write(&backing, &initial).unwrap();

        // 1. Write plaintext through the export; the backing file must hold OpenSSL's
        //    ciphertext of it, and the bytes before --offset must be untouched.
        let name = format!("p{n}");
        let args = case.args(&backing, &name, &keyfile);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let path = env.open(&argv);
        assert_eq!(fs::metadata(&path).unwrap().len(), DEV_SIZE as u64);
        let plain = bytes(1000 + n as u64, DEV_SIZE);
        {
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&plain, 0).unwrap();
            f.sync_all().unwrap();
        }
        env.close(&name);
        let raw = fs::read(&backing).unwrap();
        assert_eq!(
            &raw[..off],
            &head[..],
            "case {n}: bytes before --offset changed"
        );
        let want = case.reference(key, &plain, Mode::Encrypt);
        assert!(
            raw[off..] == want[..],
            "case {n} ({} {}-bit ss {}): ciphertext differs from OpenSSL's",
            case.cipher,
            case.key_bits,
            case.sector_size
        );

        // 2. Data encrypted by OpenSSL reads back as its plaintext through the export.
        let plain2 = bytes(2000 + n as u64, DEV_SIZE);
        let mut img = head.clone();
        img.extend_from_slice(&case.reference(key, &plain2, Mode::Encrypt));
        fs::write(&backing, &img).unwrap();
        let path = env.open(&argv);
        let got = fs::read(&path).unwrap();
        assert!(
            got == plain2,
            "case {n}: decryption of OpenSSL data differs"
        );
        // A partial-sector-aligned read in the middle.
        let f = fs::File::open(&path).unwrap();
        let mut b = vec![0u8; case.sector_size * 3];
        f.read_exact_at(&mut b, case.sector_size as u64 * 5)
            .unwrap();
        assert_eq!(b, plain2[case.sector_size * 5..case.sector_size * 8]);
        drop(f);
        env.close(&name);
    }
}

#[test]
fn read_only_and_status() {
    if fuse_missing() {
        return;
    }
    let env = Env::new();
    let keyfile = env.dir.join("key");
    fs::write(&keyfile, bytes(1, 64)).unwrap();
    let backing = env.dir.join("b.img");
    fs::write(&backing, bytes(2, 256 << 10)).unwrap();
    let args = [
        "plain",
        "open",
        backing.to_str().unwrap(),
        "ro",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--key-file",
        keyfile.to_str().unwrap(),
        "--read-only",
        "--sector-size",
        "4096",
    ];
    let path = env.open(&args);
    assert!(OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.write_all_at(&[0u8; 4096], 0).and_then(|_| f.sync_all()))
        .is_err());
    let out = env.dmkit(&["status", "ro", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "crypt");
    assert_eq!(v["details"]["cipher"], "aes-xts-plain64");
    let text = String::from_utf8_lossy(&out.stdout);
    // The key never appears in status output.
    assert!(!text.contains(&hex::encode(bytes(1, 64))));
    env.close("ro");
}

fn err_of(env: &Env, args: &[&str]) -> (i32, String) {
    let out = env.dmkit(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let e = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(!e.contains("panicked"), "{e}");
    (out.status.code().unwrap_or(-1), e)
}

#[test]
fn bad_input_gives_one_clear_line() {
    let env = Env::new();
    let keyfile = env.dir.join("key");
    fs::write(&keyfile, [1u8; 16]).unwrap();
    let backing = env.dir.join("b.img");
    fs::write(&backing, vec![0u8; 64 << 10]).unwrap();
    let b = backing.to_str().unwrap();
    let k = keyfile.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--cipher",
                "aes-xts-lmk",
                "--key-file",
                k,
            ],
            "IV mode 'lmk'",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--cipher",
                "des-xts-plain64",
                "--key-file",
                k,
            ],
            "block cipher 'des'",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "320",
                "--key-file",
                k,
            ],
            "320-bit",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "512",
                "--key-file",
                k,
            ],
            "key file too short",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--key-size",
                "128",
                "--key-file",
                k,
                "--keyfile-offset",
                "1",
            ],
            "key file too short",
        ),
        (&["plain", "open", b, "x"], "--key-file"),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--key-size",
                "128",
                "--key-file",
                "/nonexistent/k",
            ],
            "/nonexistent/k",
        ),
        (
            &[
                "plain",
                "open",
                "/nonexistent/dev",
                "x",
                "--key-size",
                "128",
                "--key-file",
                k,
            ],
            "/nonexistent/dev",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--key-size",
                "128",
                "--key-file",
                k,
                "--sector-size",
                "1000",
            ],
            "sector_size",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--key-size",
                "128",
                "--key-file",
                k,
                "--offset",
                "1000",
            ],
            "--offset",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--key-size",
                "128",
                "--key-file",
                k,
                "--size",
                "1000",
            ],
            "size",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "x",
                "--key-size",
                "128",
                "--key-file",
                k,
                "--sector-size",
                "4096",
                "--offset",
                "1",
            ],
            "size",
        ),
        (
            &[
                "plain",
                "open",
                b,
                "bad/name",
                "--key-size",
                "128",
                "--key-file",
                k,
            ],
            "name",
        ),
    ];
    for (args, want) in cases {
        let (_, e) = err_of(&env, args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}

#[test]
fn serpent_and_twofish_match_libgcrypt_both_ways() {
    if fuse_missing() {
        return;
    }
    let Some(gcrypt) = common::gcrypt::load() else {
        return;
    };
    let env = Env::new();
    // (cipher, key bits, sector size)
    let cases = [
        ("serpent-xts-plain64", 512, 512),
        ("twofish-xts-plain64", 256, 4096),
        ("serpent-cbc-essiv:sha256", 256, 4096),
        ("twofish-cbc-plain64", 128, 512),
    ];
    for (n, (cipher, bits, ss)) in cases.into_iter().enumerate() {
        let key = bytes(500 + n as u64, bits / 8);
        let keyfile = env.dir.join(format!("k{n}"));
        fs::write(&keyfile, &key).unwrap();
        let backing = env.dir.join(format!("g{n}.img"));
        fs::write(&backing, vec![0u8; DEV_SIZE]).unwrap();
        let name = format!("g{n}");
        let (bits_s, ss_s) = (bits.to_string(), ss.to_string());
        let args = [
            "plain",
            "open",
            backing.to_str().unwrap(),
            &name,
            "--cipher",
            cipher,
            "--key-size",
            &bits_s,
            "--key-file",
            keyfile.to_str().unwrap(),
            "--sector-size",
            &ss_s,
        ];
        // Ours written, libgcrypt decrypts.
        let path = env.open(&args);
        let plain = bytes(600 + n as u64, DEV_SIZE);
        {
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&plain, 0).unwrap();
            f.sync_all().unwrap();
        }
        env.close(&name);
        let mut raw = fs::read(&backing).unwrap();
        assert!(raw != plain);
        gcrypt.sectors(cipher, &key, &mut raw, 0, ss, false);
        assert!(raw == plain, "{cipher}: libgcrypt decrypts something else");
        // libgcrypt written, ours decrypts.
        let mut ct = plain.clone();
        ct.reverse();
        let want = ct.clone();
        gcrypt.sectors(cipher, &key, &mut ct, 0, ss, true);
        fs::write(&backing, &ct).unwrap();
        let path = env.open(&args);
        let back = fs::read(&path).unwrap();
        env.close(&name);
        assert!(back == want, "{cipher}: libgcrypt's data reads back wrong");
    }
}
