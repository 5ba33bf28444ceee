//! `dmkit verity` and `dmkit close` refuse bad input the way the CLI contract says:
//! the documented exit code, exactly one stderr line `dmkit: ...` naming the file and the
//! field at fault, no panic, and no input file modified.
//!
//! Exit codes: 1 bad parameters/input, 2 verification failure, 4 no such device/file,
//! 5 NAME already open.
//!
//! Tests that `open` a device need FUSE (/dev/fuse): without it they fail loudly when `CI` is
//! set and are skipped with a message otherwise.

mod common;

use common::env::fuse_device_missing;
use common::pki;
use common::rng::{time_seed, SplitMix64};
use common::run::{assert_refused, Opened, Run, RunDir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// 256 data blocks of 4 KiB: two levels of sha256 hash blocks (2 + 1) after the superblock.
const DATA_BLOCKS: usize = 256;
const BS: usize = 4096;
const SALT_A: &str = "00112233445566778899aabbccddeeff";
const SALT_B: &str = "ffeeddccbbaa99887766554433221100";

// The runs themselves (120 s limit, no daemon holding the pipes) and the refusal contract
// (`assert_refused`): common::run.

// ---------------------------------------------------------------------------------------------
// Fixtures

/// A work directory (inputs) and a separate run directory for DMKIT_RUN_DIR.
struct Env {
    _work: tempfile::TempDir,
    dir: PathBuf,
    run_dir: RunDir,
    rng: SplitMix64,
}

impl Env {
    fn new() -> Env {
        let work = tempfile::tempdir().expect("temp dir");
        Env {
            dir: work.path().to_path_buf(),
            _work: work,
            run_dir: RunDir::new(),
            rng: SplitMix64(time_seed() | 1),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn p(&self, name: &str) -> String {
        self.path(name)
            .to_str()
            .expect("utf-8 temp path")
            .to_string()
    }

    fn random(&mut self, len: usize) -> Vec<u8> {
        self.rng.bytes(len)
    }

    /// Write `blocks` random 4 KiB blocks to `name`.
    fn data(&mut self, name: &str, blocks: usize) {
        let bytes = self.random(blocks * BS);
        std::fs::write(self.path(name), bytes).expect("write data image");
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_dir.run(args)
    }

    /// `dmkit verity format --json DATA HASH EXTRA...`; returns the root hash.
    fn format(&self, data: &str, hash: &str, extra: &[&str]) -> String {
        let (d, h) = (self.p(data), self.p(hash));
        let mut args = vec!["verity", "format", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&d, &h]);
        let r = self.run(&args);
        r.assert_ok();
        let j: serde_json::Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("format --json is not JSON ({e}):\n{}", r.describe()));
        let root = j["root_hash"]
            .as_str()
            .unwrap_or_else(|| panic!("no root_hash in format --json:\n{}", r.describe()))
            .to_string();
        assert_eq!(root.len(), 64, "sha256 root hash: {root}");
        root
    }

    /// The bytes of every file in the work directory.
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut m = BTreeMap::new();
        for e in std::fs::read_dir(&self.dir).expect("list work dir") {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                m.insert(e.path(), std::fs::read(e.path()).unwrap());
            }
        }
        m
    }

    /// Run a command that must be refused with `code` naming `names`, and leave every input
    /// file exactly as it was.
    fn refused(&self, args: &[&str], code: i32, names: &[&[&str]]) -> Run {
        let before = self.snapshot();
        let r = self.run(args);
        assert_refused(&r, code, names);
        let after = self.snapshot();
        for (path, bytes) in &before {
            match after.get(path) {
                None => panic!("{} disappeared:\n{}", path.display(), r.describe()),
                Some(b) => assert!(
                    b == bytes,
                    "{} was modified by a refused command:\n{}",
                    path.display(),
                    r.describe()
                ),
            }
        }
        r
    }

    /// Patch bytes of a file in place.
    fn patch(&self, name: &str, offset: usize, bytes: &[u8]) {
        let mut v = std::fs::read(self.path(name)).unwrap();
        v[offset..offset + bytes.len()].copy_from_slice(bytes);
        std::fs::write(self.path(name), v).unwrap();
    }

    fn truncate(&self, name: &str, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(name))
            .unwrap()
            .set_len(len)
            .unwrap();
    }
}

/// Run an `open` that must be refused; if it wrongly succeeds, close the device before failing.
fn open_refused(env: &Env, args: &[&str], code: i32, names: &[&[&str]]) {
    let name = args[3].to_string();
    let before = env.snapshot();
    let r = env.run(args);
    if r.code == Some(0) {
        let _close = Opened {
            run_dir: env.run_dir.path(),
            name,
        };
        panic!("open should have been refused:\n{}", r.describe());
    }
    assert_refused(&r, code, names);
    assert!(
        env.snapshot() == before,
        "a refused open modified an input file:\n{}",
        r.describe()
    );
    let st = env.run(&["status", &name]);
    assert_ne!(
        st.code,
        Some(0),
        "a refused open left {name} open:\n{}\n{}",
        r.describe(),
        st.describe()
    );
}

/// An env with data.img (256 blocks) formatted into hash.img; returns the root hash.
fn formatted() -> (Env, String) {
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    let root = env.format("data.img", "hash.img", &[]);
    (env, root)
}

fn verify_args(env: &Env, root: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec!["verity".into(), "verify".into()];
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend([env.p("data.img"), env.p("hash.img"), root.to_string()]);
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

fn json_of(r: &Run) -> serde_json::Value {
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", r.describe()))
}

// ---------------------------------------------------------------------------------------------
// Sanity: the fixture itself verifies (otherwise every refusal below proves nothing).

#[test]
fn fixture_verifies() {
    let (env, root) = formatted();
    let r = env.run(&strs(&verify_args(&env, &root, &["--json"])));
    r.assert_ok();
    let j = json_of(&r);
    assert_eq!(j["ok"], true, "{}", r.describe());
}

// ---------------------------------------------------------------------------------------------
// Truncated hash device

#[test]
fn truncated_hash_device() {
    let (env, root) = formatted();
    let full = std::fs::metadata(env.path("hash.img")).unwrap().len();
    assert!(full >= 4 * BS as u64, "hash device of {full} bytes");
    // Lose the last hash block: the tree no longer fits.
    env.truncate("hash.img", full - BS as u64);
    env.refused(
        &strs(&verify_args(&env, &root, &[])),
        1,
        &[&["hash.img"], &["truncated", "too small", "size"]],
    );
    env.refused(
        &strs(&verify_args(&env, &root, &["--json"])),
        1,
        &[&["hash.img"], &["truncated", "too small", "size"]],
    );
    // Shorter than the superblock itself.
    env.truncate("hash.img", 300);
    env.refused(
        &strs(&verify_args(&env, &root, &[])),
        1,
        &[&["hash.img"], &["truncated", "superblock"]],
    );
    env.refused(
        &["verity", "dump", &env.p("hash.img")],
        1,
        &[&["hash.img"], &["truncated", "superblock"]],
    );
    // Empty.
    env.truncate("hash.img", 0);
    env.refused(
        &strs(&verify_args(&env, &root, &[])),
        1,
        &[&["hash.img"], &["truncated", "superblock", "empty"]],
    );
}

#[test]
fn truncated_hash_device_open() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    let full = std::fs::metadata(env.path("hash.img")).unwrap().len();
    env.truncate("hash.img", full - BS as u64);
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    open_refused(
        &env,
        &["verity", "open", &d, "trunc", &h, &root],
        1,
        &[&["hash.img"], &["truncated", "too small", "size"]],
    );
}

// ---------------------------------------------------------------------------------------------
// Wrong root hash

#[test]
fn wrong_root_hash() {
    let (env, root) = formatted();
    // Same length, one nibble different.
    let mut wrong: Vec<char> = root.chars().collect();
    wrong[10] = if wrong[10] == '0' { '1' } else { '0' };
    let wrong: String = wrong.into_iter().collect();
    env.refused(
        &strs(&verify_args(&env, &wrong, &[])),
        2,
        &[&["hash.img", "data.img"], &["root hash"]],
    );
    let r = env.refused(
        &strs(&verify_args(&env, &wrong, &["--json"])),
        2,
        &[&["hash.img", "data.img"], &["root hash"]],
    );
    let j = json_of(&r);
    assert_eq!(j["ok"], false, "{}", r.describe());
    assert_eq!(j["root_hash_mismatch"], true, "{}", r.describe());
    assert_eq!(j["computed_root"], root.as_str(), "{}", r.describe());
    assert_eq!(
        j["corrupt_data_blocks"],
        serde_json::json!([]),
        "{}",
        r.describe()
    );
    assert_eq!(
        j["corrupt_hash_blocks"],
        serde_json::json!([]),
        "{}",
        r.describe()
    );
    // The same through --root-hash-file.
    std::fs::write(env.path("root.txt"), format!("{wrong}\n")).unwrap();
    env.refused(
        &[
            "verity",
            "verify",
            "--root-hash-file",
            &env.p("root.txt"),
            &env.p("data.img"),
            &env.p("hash.img"),
        ],
        2,
        &[&["hash.img", "data.img"], &["root hash"]],
    );
}

#[test]
fn wrong_root_hash_open() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    let wrong = format!(
        "{}{}",
        &root[..63],
        if root.ends_with('0') { '1' } else { '0' }
    );
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    open_refused(
        &env,
        &["verity", "open", &d, "wrongroot", &h, &wrong],
        2,
        &[&["hash.img"], &["root hash"]],
    );
}

// ---------------------------------------------------------------------------------------------
// Wrong salt (no superblock: the salt comes from the command line)

#[test]
fn wrong_salt() {
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    let root = env.format(
        "data.img",
        "hash.img",
        &["--no-superblock", "--salt", SALT_A],
    );
    // The right salt verifies.
    env.run(&strs(&verify_args(
        &env,
        &root,
        &["--no-superblock", "--salt", SALT_A],
    )))
    .assert_ok();
    for salt in [SALT_B, "-", "00"] {
        env.refused(
            &strs(&verify_args(
                &env,
                &root,
                &["--no-superblock", "--salt", salt],
            )),
            2,
            &[&["hash.img", "data.img"], &["salt", "corrupt", "root hash"]],
        );
        let r = env.refused(
            &strs(&verify_args(
                &env,
                &root,
                &["--json", "--no-superblock", "--salt", salt],
            )),
            2,
            &[&["hash.img", "data.img"], &["salt", "corrupt", "root hash"]],
        );
        let j = json_of(&r);
        assert_eq!(j["ok"], false, "{}", r.describe());
    }
    // No --salt at all means "no salt" without a superblock.
    env.refused(
        &strs(&verify_args(&env, &root, &["--no-superblock"])),
        2,
        &[&["hash.img", "data.img"], &["salt", "corrupt", "root hash"]],
    );
}

#[test]
fn wrong_salt_open() {
    if fuse_device_missing() {
        return;
    }
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    let root = env.format(
        "data.img",
        "hash.img",
        &["--no-superblock", "--salt", SALT_A],
    );
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    open_refused(
        &env,
        &[
            "verity",
            "open",
            &d,
            "wrongsalt",
            &h,
            &root,
            "--no-superblock",
            "--salt",
            SALT_B,
        ],
        2,
        &[&["hash.img"], &["salt", "root hash"]],
    );
}

// ---------------------------------------------------------------------------------------------
// A hash device built for other data

#[test]
fn hash_device_for_other_data() {
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    env.data("other.img", DATA_BLOCKS);
    let root_other = env.format("other.img", "hash.img", &[]);
    let root_data = {
        let r = env.format("data.img", "hash2.img", &[]);
        std::fs::remove_file(env.path("hash2.img")).unwrap();
        r
    };
    for root in [&root_other, &root_data] {
        env.refused(
            &strs(&verify_args(&env, root, &[])),
            2,
            &[&["data.img", "hash.img"], &["corrupt", "root hash"]],
        );
        let r = env.refused(
            &strs(&verify_args(&env, root, &["--json"])),
            2,
            &[&["data.img", "hash.img"], &["corrupt", "root hash"]],
        );
        let j = json_of(&r);
        assert_eq!(j["ok"], false, "{}", r.describe());
    }
    // With the root of the tree that is there, the tree is trusted and every data block is
    // named as corrupt.
    let r = env.refused(
        &strs(&verify_args(&env, &root_other, &["--json"])),
        2,
        &[&["data.img"], &["corrupt"]],
    );
    let j = json_of(&r);
    let blocks: Vec<u64> = j["corrupt_data_blocks"]
        .as_array()
        .unwrap_or_else(|| panic!("corrupt_data_blocks:\n{}", r.describe()))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        blocks,
        (0..DATA_BLOCKS as u64).collect::<Vec<_>>(),
        "{}",
        r.describe()
    );
    assert_eq!(
        j["corrupt_hash_blocks"],
        serde_json::json!([]),
        "{}",
        r.describe()
    );
    assert_eq!(j["root_hash_mismatch"], false, "{}", r.describe());
}

// ---------------------------------------------------------------------------------------------
// Garbage superblock

/// verify and dump refuse the superblock of hash.img with exit 1, naming hash.img and `field`.
fn superblock_refused(env: &Env, root: &str, field: &[&str]) {
    env.refused(
        &strs(&verify_args(env, root, &[])),
        1,
        &[&["hash.img"], field],
    );
    env.refused(
        &strs(&verify_args(env, root, &["--json"])),
        1,
        &[&["hash.img"], field],
    );
    env.refused(
        &["verity", "dump", &env.p("hash.img")],
        1,
        &[&["hash.img"], field],
    );
    env.refused(
        &["verity", "dump", "--json", &env.p("hash.img")],
        1,
        &[&["hash.img"], field],
    );
}

#[test]
fn garbage_superblock_random_bytes() {
    let (mut env, root) = formatted();
    let junk = env.random(512);
    env.patch("hash.img", 0, &junk);
    superblock_refused(&env, &root, &["signature", "superblock"]);
}

#[test]
fn garbage_superblock_whole_hash_device_random() {
    let (mut env, root) = formatted();
    let len = std::fs::metadata(env.path("hash.img")).unwrap().len() as usize;
    let junk = env.random(len);
    std::fs::write(env.path("hash.img"), junk).unwrap();
    superblock_refused(&env, &root, &["signature", "superblock"]);
}

#[test]
fn superblock_salt_size_300() {
    let (env, root) = formatted();
    env.patch("hash.img", 80, &300u16.to_le_bytes());
    superblock_refused(&env, &root, &["salt_size", "salt size"]);
}

#[test]
fn superblock_bad_block_sizes() {
    for (offset, value, field) in [
        (64usize, 4095u32, "data_block_size"),
        (64, 0, "data_block_size"),
        (64, 256, "data_block_size"),
        (64, 1 << 20, "data_block_size"),
        (68, 4095, "hash_block_size"),
        (68, 0, "hash_block_size"),
        (68, 3 << 12, "hash_block_size"),
    ] {
        let (env, root) = formatted();
        env.patch("hash.img", offset, &value.to_le_bytes());
        superblock_refused(&env, &root, &[field]);
    }
}

#[test]
fn superblock_other_bad_fields() {
    let cases: Vec<(usize, Vec<u8>, &[&str])> = vec![
        (8, 2u32.to_le_bytes().to_vec(), &["version"]),
        (12, 7u32.to_le_bytes().to_vec(), &["hash_type", "hash type"]),
        (32, b"md5\0\0\0".to_vec(), &["algorithm"]),
        (
            72,
            0u64.to_le_bytes().to_vec(),
            &["data_blocks", "data blocks"],
        ),
    ];
    for (offset, bytes, field) in cases {
        let (env, root) = formatted();
        env.patch("hash.img", offset, &bytes);
        superblock_refused(&env, &root, field);
    }
}

#[test]
fn garbage_superblock_open() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    env.patch("hash.img", 80, &300u16.to_le_bytes());
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    open_refused(
        &env,
        &["verity", "open", &d, "badsb", &h, &root],
        1,
        &[&["hash.img"], &["salt_size", "salt size"]],
    );
}

// ---------------------------------------------------------------------------------------------
// Data shorter than --data-blocks

#[test]
fn format_data_shorter_than_data_blocks() {
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    let more = (DATA_BLOCKS + 1).to_string();
    env.refused(
        &["verity", "format", "--data-blocks", &more, &d, &h],
        1,
        &[&["data.img"], &["data-blocks", "data_blocks", "too small"]],
    );
    env.refused(
        &[
            "verity",
            "format",
            "--json",
            "--data-blocks",
            "18446744073709551615",
            &d,
            &h,
        ],
        1,
        &[&["data.img"], &["data-blocks", "data_blocks", "too small"]],
    );
    // A partial last block does not count as a block.
    let mut v = std::fs::read(env.path("data.img")).unwrap();
    v.truncate(3 * BS + 100);
    std::fs::write(env.path("data.img"), v).unwrap();
    env.refused(
        &["verity", "format", "--data-blocks", "4", &d, &h],
        1,
        &[&["data.img"], &["data-blocks", "data_blocks", "too small"]],
    );
    // Less than one block.
    env.truncate("data.img", 100);
    env.refused(
        &["verity", "format", &d, &h],
        1,
        &[&["data.img"], &["data-blocks", "data_blocks", "block"]],
    );
}

#[test]
fn verify_data_shorter_than_superblock() {
    let (env, root) = formatted();
    env.truncate("data.img", (DATA_BLOCKS as u64 - 1) * BS as u64);
    env.refused(
        &strs(&verify_args(&env, &root, &[])),
        1,
        &[
            &["data.img"],
            &["too small", "data_blocks", "data-blocks", "data blocks"],
        ],
    );
    env.refused(
        &strs(&verify_args(&env, &root, &["--json"])),
        1,
        &[
            &["data.img"],
            &["too small", "data_blocks", "data-blocks", "data blocks"],
        ],
    );
}

#[test]
fn verify_data_shorter_than_data_blocks_option() {
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    let root = env.format("data.img", "hash.img", &["--no-superblock", "--salt", "-"]);
    let more = (DATA_BLOCKS + 1).to_string();
    env.refused(
        &strs(&verify_args(
            &env,
            &root,
            &["--no-superblock", "--data-blocks", &more],
        )),
        1,
        &[&["data.img"], &["data-blocks", "data_blocks", "too small"]],
    );
}

#[test]
fn open_data_shorter_than_superblock() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    env.truncate("data.img", (DATA_BLOCKS as u64 - 1) * BS as u64);
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    open_refused(
        &env,
        &["verity", "open", &d, "short", &h, &root],
        1,
        &[
            &["data.img"],
            &["too small", "data_blocks", "data-blocks", "data blocks"],
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Signatures and certificates

/// key.pem + cert.pem (self-signed RSA), and sig.der: dmkit's signature over `signed_root`.
fn signing_fixture(env: &Env, signed_root: &str) {
    pki::self_signed(
        &env.path("key.pem"),
        &env.path("cert.pem"),
        "/CN=dmkit bad input test",
        pki::RSA,
    );
    env.run(&[
        "verity",
        "sign",
        signed_root,
        "--key",
        &env.p("key.pem"),
        "--cert",
        &env.p("cert.pem"),
        "-o",
        &env.p("sig.der"),
    ])
    .assert_ok();
}

fn sig_args(env: &Env, root: &str, sig: &str, cert: &str) -> Vec<String> {
    let (s, c) = (env.p(sig), env.p(cert));
    verify_args(
        env,
        root,
        &["--root-hash-signature", &s, "--root-hash-cert", &c],
    )
}

#[test]
fn good_signature_verifies() {
    let (env, root) = formatted();
    signing_fixture(&env, &root);
    env.run(&strs(&sig_args(&env, &root, "sig.der", "cert.pem")))
        .assert_ok();
}

#[test]
fn signature_over_another_root_hash() {
    let (env, root) = formatted();
    let other = format!(
        "{}{}",
        if root.starts_with('a') { "b" } else { "a" },
        &root[1..]
    );
    signing_fixture(&env, &other);
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "cert.pem")),
        2,
        &[&["sig.der"], &["signature"]],
    );
}

#[test]
fn garbage_signature_file() {
    let (mut env, root) = formatted();
    signing_fixture(&env, &root);
    let junk = env.random(700);
    std::fs::write(env.path("sig.der"), junk).unwrap();
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "cert.pem")),
        2,
        &[&["sig.der"], &["signature"]],
    );
    // A DER SEQUENCE header that promises more than the file holds.
    std::fs::write(
        env.path("sig.der"),
        [0x30, 0x82, 0x10, 0x00, 0x02, 0x01, 0x01],
    )
    .unwrap();
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "cert.pem")),
        2,
        &[&["sig.der"], &["signature"]],
    );
    std::fs::write(env.path("sig.der"), b"").unwrap();
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "cert.pem")),
        2,
        &[&["sig.der"], &["signature"]],
    );
}

#[test]
fn missing_certificate_file() {
    let (env, root) = formatted();
    signing_fixture(&env, &root);
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "missing.pem")),
        4,
        &[&["missing.pem"], &["certificate", "cert"]],
    );
}

#[test]
fn garbage_certificate_file() {
    let (mut env, root) = formatted();
    signing_fixture(&env, &root);
    let junk = env.random(900);
    std::fs::write(env.path("garbage.pem"), junk).unwrap();
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "garbage.pem")),
        1,
        &[&["garbage.pem"], &["certificate"]],
    );
    std::fs::write(
        env.path("garbage.pem"),
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    env.refused(
        &strs(&sig_args(&env, &root, "sig.der", "garbage.pem")),
        1,
        &[&["garbage.pem"], &["certificate"]],
    );
}

#[test]
fn bad_signature_open() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    let other = format!(
        "{}{}",
        if root.starts_with('a') { "b" } else { "a" },
        &root[1..]
    );
    signing_fixture(&env, &other);
    let (d, h, s, c) = (
        env.p("data.img"),
        env.p("hash.img"),
        env.p("sig.der"),
        env.p("cert.pem"),
    );
    open_refused(
        &env,
        &[
            "verity",
            "open",
            &d,
            "badsig",
            &h,
            &root,
            "--root-hash-signature",
            &s,
            "--root-hash-cert",
            &c,
        ],
        2,
        &[&["sig.der"], &["signature"]],
    );
    open_refused(
        &env,
        &[
            "verity",
            "open",
            &d,
            "badcert",
            &h,
            &root,
            "--root-hash-signature",
            &s,
            "--root-hash-cert",
            &env.p("missing.pem"),
        ],
        4,
        &[&["missing.pem"], &["certificate", "cert"]],
    );
}

// ---------------------------------------------------------------------------------------------
// Device names

#[test]
fn name_already_open() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    let r = env.run(&["verity", "open", &d, "busy0", &h, &root]);
    r.assert_ok();
    let _guard = Opened {
        run_dir: env.run_dir.path(),
        name: "busy0".into(),
    };
    let served = r.stdout.lines().next().unwrap_or("").trim().to_string();
    assert!(
        served.ends_with("busy0") && Path::new(&served).exists(),
        "open should print the served path:\n{}",
        r.describe()
    );
    let before = std::fs::read(&served).expect("read the served device");
    assert_eq!(before.len(), DATA_BLOCKS * BS);
    assert!(before == std::fs::read(env.path("data.img")).unwrap());
    // Again, the same and with other inputs: busy.
    env.refused(
        &["verity", "open", &d, "busy0", &h, &root],
        5,
        &[&["busy0"]],
    );
    env.refused(
        &["verity", "open", &d, "busy0", &h, &root, "--loop"],
        5,
        &[&["busy0"]],
    );
    // The first device still serves.
    assert!(std::fs::read(&served).unwrap() == before);
    let st = env.run(&["status", "busy0"]);
    st.assert_ok();
}

#[test]
fn close_unknown_name() {
    let env = Env::new();
    env.refused(&["close", "nosuchdevice"], 4, &[&["nosuchdevice"]]);
    env.refused(&["status", "nosuchdevice"], 4, &[&["nosuchdevice"]]);
}

// ---------------------------------------------------------------------------------------------
// Root hash syntax

#[test]
fn root_hash_not_hex() {
    let (env, root) = formatted();
    let bad = format!("zz{}", &root[2..]);
    for r in [bad.as_str(), "not-a-hash", " ", "0x1234"] {
        env.refused(&strs(&verify_args(&env, r, &[])), 1, &[&["root hash"]]);
    }
    // Odd number of digits.
    env.refused(
        &strs(&verify_args(&env, &root[1..], &[])),
        1,
        &[&["root hash"]],
    );
}

#[test]
fn root_hash_wrong_length() {
    let (env, root) = formatted();
    for r in [
        root[..62].to_string(),
        format!("{root}00"),
        "00".to_string(),
        root[..40].to_string(), // a sha1 root for a sha256 tree
    ] {
        env.refused(&strs(&verify_args(&env, &r, &[])), 1, &[&["root hash"]]);
        env.refused(
            &strs(&verify_args(&env, &r, &["--json"])),
            1,
            &[&["root hash"]],
        );
    }
}

#[test]
fn root_hash_syntax_open() {
    if fuse_device_missing() {
        return;
    }
    let (env, root) = formatted();
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    let nonhex = format!("zz{}", &root[2..]);
    open_refused(
        &env,
        &["verity", "open", &d, "nonhex", &h, &nonhex],
        1,
        &[&["root hash"]],
    );
    open_refused(
        &env,
        &["verity", "open", &d, "short", &h, &root[..62]],
        1,
        &[&["root hash"]],
    );
}

// ---------------------------------------------------------------------------------------------
// Hash offset at the end of the 64-bit range (found by fuzzing: an overflow panic in
// TreeLayout::new)

#[test]
fn hash_offset_too_large() {
    let mut env = Env::new();
    env.data("data.img", DATA_BLOCKS);
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    let huge = (!511u64).to_string();
    env.refused(
        &["verity", "format", "--hash-offset", &huge, &d, &h],
        1,
        &[&["--hash-offset", "hash_offset"]],
    );
    env.refused(
        &[
            "verity",
            "format",
            "--no-superblock",
            "--hash-offset",
            &huge,
            &d,
            &h,
        ],
        1,
        &[&["--hash-offset", "hash_offset"]],
    );
    let root = "00".repeat(32);
    std::fs::write(env.path("hash.img"), vec![0u8; 3 * BS]).unwrap();
    env.refused(
        &[
            "verity",
            "verify",
            "--no-superblock",
            "--hash-offset",
            &huge,
            &d,
            &h,
            &root,
        ],
        1,
        &[&["--hash-offset", "hash_offset"]],
    );
}

// ---------------------------------------------------------------------------------------------
// Command-line usage errors are bad parameters too: exit 1, one `dmkit: ` line naming the
// argument (not clap's multi-line usage text with its exit code 2, which means "verification
// failure" here).

#[test]
fn usage_errors() {
    let (env, root) = formatted();
    let (d, h) = (env.p("data.img"), env.p("hash.img"));
    env.refused(&["verity", "verify", &d], 1, &[&["HASH_DEVICE", "hash"]]);
    env.refused(
        &["verity", "format", "--data-block-size", "abc", &d, &h],
        1,
        &[&["--data-block-size"]],
    );
    env.refused(
        &["verity", "verify", "--no-such-option", &d, &h, &root],
        1,
        &[&["--no-such-option"]],
    );
    env.refused(
        &[
            "verity",
            "verify",
            &d,
            &h,
            &root,
            "--root-hash-signature",
            &env.p("sig.der"),
        ],
        1,
        &[&["--root-hash-cert"]],
    );
}

// ---------------------------------------------------------------------------------------------
// A superblock that covers less data than its tree: veritysetup refuses ("Spare area is not
// zeroed"), because the extra digest in the last hash block would otherwise go unchecked.

#[test]
fn superblock_one_data_block_short_of_its_tree() {
    let (env, root) = formatted();
    // data_blocks is the little-endian u64 at byte 72 of the superblock.
    env.patch("hash.img", 72, &(DATA_BLOCKS as u64 - 1).to_le_bytes());
    // The block the superblock no longer covers, changed: nothing may call this verified.
    env.patch("data.img", (DATA_BLOCKS - 1) * BS, b"tampered");
    let r = env.refused(
        &strs(&verify_args(&env, &root, &[])),
        2,
        &[
            &["hash.img"],
            &["spare area is not zeroed"],
            &["255 data blocks"],
        ],
    );
    let j = json_of(&env.run(&strs(&verify_args(&env, &root, &["--json"]))));
    assert_eq!(j["ok"], false);
    // Hash blocks count from the device start: superblock 0, top level 1, level 0 at 2 and 3;
    // the last digest of block 3 is the one past the superblock's data blocks.
    assert_eq!(j["spare_not_zeroed"], serde_json::json!([3]), "{j}");
    // The real tool agrees.
    if !common::env::tool_missing("veritysetup", "cryptsetup-bin") {
        let out = common::run::output(
            "veritysetup",
            &["verify", &env.p("data.img"), &env.p("hash.img"), &root],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "veritysetup accepted it: {err}");
        assert!(
            err.contains("Spare area is not zeroed"),
            "{err}\n{}",
            r.describe()
        );
    }
}

#[test]
fn verify_says_how_much_of_the_data_device_the_root_hash_covers() {
    let (env, root) = formatted();
    let r = env.run(&strs(&verify_args(&env, &root, &[])));
    r.assert_ok();
    let all = format!(
        "256 data blocks of 4096 bytes, all {} bytes",
        DATA_BLOCKS * BS
    );
    assert!(r.stdout.contains(&all), "{}", r.describe());
    // A data device longer than the tree: the tail is named as unchecked.
    let mut env = env;
    let tail = env.random(BS);
    let mut data = std::fs::read(env.path("data.img")).unwrap();
    data.extend_from_slice(&tail);
    std::fs::write(env.path("data.img"), data).unwrap();
    let r = env.run(&strs(&verify_args(&env, &root, &[])));
    r.assert_ok();
    assert!(
        r.stdout.contains("the last 4096 bytes are not covered"),
        "{}",
        r.describe()
    );
}
