//! fs-verity interop with fsverity-utils on the host (`fsverity digest` and `fsverity sign`
//! need no kernel support): `dmkit fsverity digest` prints the same line for many file sizes
//! (empty, one byte, around block boundaries, trees of one to four levels), both hash
//! algorithms, every block size and salts; `dmkit fsverity sign` writes the same bytes as
//! `fsverity sign` for RSA keys, and a signature OpenSSL verifies over the formatted digest for
//! EC keys. The kernel's own check of these is in tests/kernel.rs.
//!
//! Needs `fsverity` (package fsverity) and `openssl`; without them the test fails when `CI` is
//! set and is skipped with a message otherwise.

mod common;

use common::env::tools_missing;
use common::pki::{self, make_ident};
use common::rng::bytes;
use common::run::{ok, output as run};
use common::DMKIT;
use std::path::{Path, PathBuf};

/// Whether fsverity or openssl is missing (see common::env::tools_missing).
fn prerequisites_missing() -> bool {
    tools_missing(&[("fsverity", "fsverity"), ("openssl", "openssl")])
}

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

#[test]
fn digest_matches_fsverity_utils() {
    if prerequisites_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // (block size, sizes): around block boundaries, and trees of up to four levels (with
    // 1024-byte blocks and SHA-512, 16 hashes per block: 16^3 blocks need four levels).
    let mut cases: Vec<(u32, usize)> = Vec::new();
    for size in [0, 1, 100, 1023, 1024, 1025, 4095, 4096, 4097, 8192, 65537] {
        cases.push((4096, size));
    }
    for size in [1025, 16 * 1024, 16 * 1024 + 1, 256 * 1024 + 1, 4 << 20] {
        cases.push((1024, size));
    }
    for size in [2048 * 64 + 7, 300_000] {
        cases.push((2048, size));
    }
    for size in [1, 65536, 65537, 3 << 20] {
        cases.push((65536, size));
    }
    cases.push((4096, 128 * 4096 + 1)); // two levels with SHA-256
    cases.push((8192, 1 << 20));
    let salts = [
        "",
        "00",
        "a5",
        "0102030405060708090a0b0c0d0e0f10",
        &"ee".repeat(32),
    ];
    let mut checked = 0;
    for (i, &(bs, size)) in cases.iter().enumerate() {
        let file = write(dir.path(), &format!("f{i}"), &bytes(i as u64 + 7, size));
        let f = file.to_str().unwrap();
        for alg in ["sha256", "sha512"] {
            for (j, salt) in salts.iter().enumerate() {
                // Every salt on the small files, two on the rest.
                if size > 70_000 && j % 2 == 1 {
                    continue;
                }
                let bs_arg = format!("--block-size={bs}");
                let alg_arg = format!("--hash-alg={alg}");
                let salt_arg = format!("--salt={salt}");
                let mut args = vec!["digest", f, &bs_arg, &alg_arg];
                if !salt.is_empty() {
                    args.push(&salt_arg);
                }
                let theirs = ok("fsverity", &args);
                let mut ours_args = vec!["fsverity"];
                ours_args.extend(&args);
                let ours = ok(DMKIT, &ours_args);
                assert_eq!(
                    ours, theirs,
                    "size {size}, {alg}, block {bs}, salt {salt:?}"
                );
                checked += 1;
            }
        }
    }
    // --compact and --for-builtin-sig print as fsverity-utils does.
    let file = write(dir.path(), "g", b"hello fs-verity\n");
    let g = file.to_str().unwrap();
    for extra in [
        vec!["--compact"],
        vec!["--for-builtin-sig"],
        vec!["--compact", "--for-builtin-sig", "--hash-alg=sha512"],
    ] {
        let mut args = vec!["digest", g];
        args.extend(&extra);
        let mut ours_args = vec!["fsverity"];
        ours_args.extend(&args);
        assert_eq!(ok(DMKIT, &ours_args), ok("fsverity", &args), "{extra:?}");
    }
    eprintln!("{checked} digests identical to fsverity-utils'");
}

#[test]
fn library_digest_matches_cli() {
    use dmkit::fsverity::{digest_bytes, FsVerityParams};
    use dmkit::hash::HashAlgorithm;
    if prerequisites_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(99, 200_000);
    let file = write(dir.path(), "f", &data);
    let params = FsVerityParams {
        hash: HashAlgorithm::Sha512,
        block_size: 1024,
        salt: vec![1, 2, 3],
    };
    let d = digest_bytes(&data, &params).unwrap();
    let line = ok(
        "fsverity",
        &[
            "digest",
            file.to_str().unwrap(),
            "--hash-alg=sha512",
            "--block-size=1024",
            "--salt=010203",
            "--compact",
        ],
    );
    assert_eq!(hex::encode(&d.digest), line.trim());
}

#[test]
fn bad_parameters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "f", b"x");
    let f = file.to_str().unwrap();
    for (args, what) in [
        (vec!["--hash-alg=sha1"], "hash algorithm"),
        (vec!["--block-size=512"], "block size 512"),
        (vec!["--block-size=5000"], "block size 5000"),
        (vec!["--salt=zz"], "not a hex string"),
        (
            vec![&*format!("--salt={}", "00".repeat(33))],
            "salt of 33 bytes",
        ),
    ] {
        let mut a = vec!["fsverity", "digest", f];
        a.extend(&args);
        let out = run(DMKIT, &a);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(what), "{args:?}: {err}");
    }
    let out = run(DMKIT, &["fsverity", "digest", "/nonexistent/file"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/file"));
}

/// A key and its self-signed certificate, `dir/NAME.key` and `dir/NAME.crt`.
fn make_cert(dir: &Path, name: &str, newkey: &[&str]) -> (PathBuf, PathBuf) {
    let id = make_ident(dir, name, &format!("/CN={name}"), newkey);
    (id.key, id.cert)
}

#[test]
fn signatures_match_fsverity_sign() {
    if prerequisites_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = make_cert(dir.path(), "rsa", pki::RSA);
    let (k, c) = (key.to_str().unwrap(), cert.to_str().unwrap());
    for (i, size) in [0usize, 1, 5000, 100_000].into_iter().enumerate() {
        let file = write(dir.path(), &format!("f{i}"), &bytes(i as u64, size));
        let f = file.to_str().unwrap();
        for alg in ["sha256", "sha512"] {
            let alg_arg = format!("--hash-alg={alg}");
            let theirs = dir.path().join("theirs.sig");
            let ours = dir.path().join("ours.sig");
            let (t, o) = (theirs.to_str().unwrap(), ours.to_str().unwrap());
            let out_t = ok(
                "fsverity",
                &["sign", f, t, "--key", k, "--cert", c, &alg_arg],
            );
            let out_o = ok(
                DMKIT,
                &["fsverity", "sign", f, o, "--key", k, "--cert", c, &alg_arg],
            );
            assert_eq!(out_o, out_t, "size {size} {alg}");
            assert_eq!(
                std::fs::read(&ours).unwrap(),
                std::fs::read(&theirs).unwrap(),
                "signature bytes, size {size} {alg}"
            );
        }
    }
}

#[test]
fn ec_signature_verifies_with_openssl() {
    if prerequisites_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = make_cert(dir.path(), "ec", pki::EC_P256);
    let (k, c) = (key.to_str().unwrap(), cert.to_str().unwrap());
    let file = write(dir.path(), "f", &bytes(5, 12345));
    let f = file.to_str().unwrap();
    let sig = dir.path().join("f.sig");
    let s = sig.to_str().unwrap();
    ok(DMKIT, &["fsverity", "sign", f, s, "--key", k, "--cert", c]);
    // The signed content: the formatted digest, as `--for-builtin-sig --compact` prints it.
    let hexd = ok("fsverity", &["digest", f, "--for-builtin-sig", "--compact"]);
    let content = write(dir.path(), "content", &hex::decode(hexd.trim()).unwrap());
    assert!(
        pki::smime_verifies(&sig, &content, &cert),
        "openssl smime -verify refuses our EC signature"
    );
    // A key that is not the certificate's is refused with a clear message.
    let (other, _) = make_cert(dir.path(), "other", pki::RSA);
    let out = run(
        DMKIT,
        &[
            "fsverity",
            "sign",
            f,
            s,
            "--key",
            other.to_str().unwrap(),
            "--cert",
            c,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no certificate matches"));
}
