//! Helpers shared by the integration tests: every `tests/*.rs` file includes this module with
//! `mod common;`, so each helper is written once.
//!
//! - [`run`]: running `dmkit` and other tools with a time limit, failing a test whose command
//!   hangs or leaves a daemon holding its output; private `DMKIT_RUN_DIR`s that close what was
//!   opened in them; `assert_refused`, the contract of a refused command.
//! - [`env`]: what a test needs from the machine (root, /dev/fuse, loop devices, tools): when
//!   something is missing the test fails loudly if `CI` is set and is skipped with a message
//!   otherwise.
//! - [`rng`]: deterministic pseudo-random test data and replayable seeds.
//! - [`verity_case`]: one veritysetup/`dmkit verity` parameter set and its command-line options.
//! - [`nbd`]: a raw NBD client for tests that misbehave on purpose.
//! - [`sys`]: mounts, processes, loop devices and aligned buffers as tests see them.
//! - [`tty`]: typing answers at a command on a pseudo-terminal (`script(1)`).
//! - [`cryptsetup_material`]: cryptsetup 2.6.1's `tests/` material, fetched and checked once.
//! - [`pki`]: keys and self-signed certificates made with the openssl CLI.
//! - [`nginx`]: nginx serving a directory over HTTP, HTTPS and HTTPS with client certificates.
//! - [`http_faults`]: a scripted HTTP server that misbehaves on request.
//! - [`image_tree`]: a small root tree for the image tests, and what a tree holds.
//! - [`xor_byte`]: corrupting one byte of an image in place.
//! - [`status_field`]: one value of `dmkit status` text.
//! - [`xts`]: AES-XTS over dm-crypt sectors with OpenSSL.
//! - [`volume_key`]: a LUKS volume key from `luksDump --dump-volume-key`.
//! - [`reencrypt`]: reencryption command lines, and a run killed once under way.
//! - [`online`]: an online `luks reencrypt NAME` started, watched mid-way, its device read.
//! - [`s3`]: an S3-compatible server checking signatures (s3s-fs) on 127.0.0.1.

// Not every test file uses every helper.
#![allow(dead_code)]

pub mod cryptsetup_material;
pub mod env;
pub mod gcrypt;
pub mod http_faults;
pub mod image_tree;
pub mod nbd;
pub mod nginx;
pub mod online;
pub mod pki;
pub mod reencrypt;
pub mod remote_case;
pub mod rng;
pub mod run;
pub mod s3;
pub mod sys;
pub mod tty;
pub mod verity_case;
pub mod volume_key;
pub mod xts;

use std::path::Path;

/// The `dmkit` binary under test.
pub const DMKIT: &str = env!("CARGO_BIN_EXE_dmkit");

/// Corrupts one byte of the file at `path` in place: the byte at `offset` is XORed with `mask`.
pub fn xor_byte(path: &Path, offset: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= mask;
    f.write_all_at(&b, offset).unwrap();
}

/// The value of `key` in `dmkit status` text (rows are `  key:   value`, aligned after the
/// longest key, so the spacing is not fixed).
pub fn status_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.trim_start().split_once(':')?;
        (k == key).then(|| v.trim().to_string())
    })
}
