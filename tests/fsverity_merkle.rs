//! fs-verity Merkle trees and descriptors against fsverity-utils on the host: `dmkit fsverity
//! digest --out-merkle-tree T --out-descriptor D` prints the same lines and writes the same
//! bytes to T and D as `fsverity digest` with the same options
//!
//! - for file sizes 0, 1, block - 1, block, block + 1 and 3 MiB, with every block size from
//!   1024 to 65536, SHA-256 and SHA-512, and salts of 0, 1, 7, 16 and 32 bytes (the full cross
//!   product);
//! - for one large file (192 MiB + 1 byte: hashed on all cores, its tree built in segments);
//! - for many files in one command, where fsverity-utils lays the trees over one another in T
//!   and appends the descriptors to D.
//!
//! Bad input (a missing, unreadable or non-regular file, a bad block size, a salt too long)
//! gives a one-line error, exit code 1, no panic, and leaves T and D as they were (or absent).
//!
//! Needs `fsverity` (package fsverity); without it the comparisons fail when `CI` is set and
//! are skipped with a message otherwise.

mod common;

use common::env::{is_root, tools_missing};
use common::rng::{SplitMix64, XorShift64Star};
use common::run::{ok, output};
use common::DMKIT;
use std::path::{Path, PathBuf};

const BLOCK_SIZES: [u32; 7] = [1024, 2048, 4096, 8192, 16384, 32768, 65536];
const HASHES: [&str; 2] = ["sha256", "sha512"];
const SALT_LENGTHS: [usize; 5] = [0, 1, 7, 16, 32];

fn fsverity_missing() -> bool {
    tools_missing(&[("fsverity", "fsverity")])
}

/// Merkle tree parameters, given to both tools alike.
struct Params {
    block_size: u32,
    hash: &'static str,
    salt: Vec<u8>,
}

impl Params {
    fn new(block_size: u32, hash: &'static str, salt_len: usize) -> Params {
        Params {
            block_size,
            hash,
            salt: SplitMix64(salt_len as u64).bytes(salt_len),
        }
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--block-size={}", self.block_size),
            format!("--hash-alg={}", self.hash),
        ];
        if !self.salt.is_empty() {
            a.push(format!("--salt={}", hex::encode(&self.salt)));
        }
        a
    }

    fn describe(&self) -> String {
        format!(
            "{}, block size {}, salt of {} bytes",
            self.hash,
            self.block_size,
            self.salt.len()
        )
    }
}

/// What one `digest` command produced.
struct Outputs {
    stdout: String,
    tree: Vec<u8>,
    descriptor: Vec<u8>,
}

/// `fsverity digest` (`program` "fsverity") or `dmkit fsverity digest` (`program` DMKIT) of
/// `files`, writing `dir/TAG.tree` and `dir/TAG.desc`.
fn digest(program: &str, files: &[PathBuf], params: &Params, dir: &Path, tag: &str) -> Outputs {
    let tree = dir.join(format!("{tag}.tree"));
    let descriptor = dir.join(format!("{tag}.desc"));
    let mut args: Vec<String> = Vec::new();
    if program == DMKIT {
        args.push("fsverity".into());
    }
    args.push("digest".into());
    args.extend(files.iter().map(|f| f.to_str().unwrap().to_string()));
    args.extend(params.args());
    args.push(format!("--out-merkle-tree={}", tree.display()));
    args.push(format!("--out-descriptor={}", descriptor.display()));
    let stdout = ok(program, &args);
    Outputs {
        stdout,
        tree: std::fs::read(&tree).unwrap(),
        descriptor: std::fs::read(&descriptor).unwrap(),
    }
}

/// Both tools on `files`: the same lines, tree bytes and descriptor bytes. Returns dmkit's.
fn assert_same(files: &[PathBuf], params: &Params, dir: &Path, what: &str) -> Outputs {
    let theirs = digest("fsverity", files, params, dir, "theirs");
    let ours = digest(DMKIT, files, params, dir, "ours");
    let what = format!("{what}, {}", params.describe());
    assert_eq!(ours.stdout, theirs.stdout, "{what}: printed digests");
    assert!(
        ours.descriptor == theirs.descriptor,
        "{what}: descriptors differ ({} and {} bytes, first difference at {:?})",
        ours.descriptor.len(),
        theirs.descriptor.len(),
        first_difference(&ours.descriptor, &theirs.descriptor)
    );
    assert!(
        ours.tree == theirs.tree,
        "{what}: Merkle trees differ ({} and {} bytes, first difference at {:?})",
        ours.tree.len(),
        theirs.tree.len(),
        first_difference(&ours.tree, &theirs.tree)
    );
    assert_eq!(ours.descriptor.len(), 256 * files.len(), "{what}");
    ours
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

fn write_random(path: &Path, seed: u64, len: usize) -> PathBuf {
    std::fs::write(path, SplitMix64(seed).bytes(len)).unwrap();
    path.to_path_buf()
}

#[test]
fn trees_and_descriptors_match_fsverity_utils() {
    if fsverity_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for &bs in &BLOCK_SIZES {
        let b = bs as usize;
        for size in [0, 1, b - 1, b, b + 1, (3 << 20) + 12345] {
            let file = write_random(
                &dir.path().join(format!("f{bs}-{size}")),
                (bs as u64) << 32 | size as u64,
                size,
            );
            for hash in HASHES {
                for salt_len in SALT_LENGTHS {
                    let params = Params::new(bs, hash, salt_len);
                    let what = format!("size {size}");
                    let ours = assert_same(std::slice::from_ref(&file), &params, dir.path(), &what);
                    // A file of at most one block has no tree; any larger one has one.
                    assert_eq!(ours.tree.is_empty(), size <= b, "{what}");
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} trees and descriptors identical to fsverity-utils'");
}

#[test]
fn large_file_matches_fsverity_utils() {
    if fsverity_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // With 4096-byte SHA-256 blocks a segment is 128^3 blocks (64 MiB): three whole ones and
    // one byte more. With 1024-byte SHA-512 blocks the tree has five levels.
    let size = (192 << 20) + 1;
    let file = write_random(&dir.path().join("large"), 192, size);
    for params in [
        Params::new(4096, "sha256", 16),
        Params::new(1024, "sha512", 32),
    ] {
        let ours = assert_same(
            std::slice::from_ref(&file),
            &params,
            dir.path(),
            "192 MiB + 1 byte",
        );
        assert!(ours.tree.len() > size / 256, "{}", ours.tree.len());
    }
}

#[test]
fn many_files_in_one_command() {
    if fsverity_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = XorShift64Star(0x5eed);
    // Sizes at the edges, many small files (read into shared batches), a few larger than a
    // batch takes (hashed on their own, across cores), in a shuffled order: the trees overlay
    // one another in different orders of size.
    let mut sizes: Vec<usize> = vec![0, 1, 1023, 1024, 1025, 4096, 65536, 65537];
    sizes.extend((0..250).map(|_| rng.below(70_000) as usize));
    sizes.extend((0..20).map(|_| rng.below(1 << 20) as usize));
    sizes.extend([5 << 20, (5 << 20) + 3, 300_000]);
    for i in (1..sizes.len()).rev() {
        sizes.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let files: Vec<PathBuf> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| write_random(&dir.path().join(format!("m{i:03}")), i as u64, len))
        .collect();
    for params in [
        Params::new(4096, "sha256", 0),
        Params::new(1024, "sha512", 7),
        Params::new(65536, "sha256", 32),
    ] {
        let ours = assert_same(&files, &params, dir.path(), "many files");
        assert_eq!(ours.stdout.lines().count(), files.len());
    }
    // The same file named twice, and a file both before and after a larger one.
    let again = [
        files[0].clone(),
        files[1].clone(),
        files[0].clone(),
        files[1].clone(),
    ];
    assert_same(
        &again,
        &Params::new(4096, "sha256", 1),
        dir.path(),
        "repeats",
    );
}

/// Runs `dmkit fsverity digest ARGS --out-merkle-tree T --out-descriptor D` (under `setpriv`
/// with `prefix`, if any): it must fail with exit code 1 and a one-line error containing
/// `expect`, without a panic, and leave T and D as `before` (`None`: absent).
fn assert_refused(
    dir: &Path,
    prefix: &[&str],
    args: &[String],
    expect: &str,
    before: Option<(&[u8], &[u8])>,
) {
    let tree = dir.join("out.tree");
    let desc = dir.join("out.desc");
    let _ = std::fs::remove_file(&tree);
    let _ = std::fs::remove_file(&desc);
    if let Some((t, d)) = before {
        std::fs::write(&tree, t).unwrap();
        std::fs::write(&desc, d).unwrap();
    }
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let files_before = listing();
    let mut all: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    all.extend(["fsverity".into(), "digest".into()]);
    all.extend(args.iter().cloned());
    all.push(format!("--out-merkle-tree={}", tree.display()));
    all.push(format!("--out-descriptor={}", desc.display()));
    let (program, rest) = if prefix.is_empty() {
        (DMKIT, &all[..])
    } else {
        (prefix[0], &all[1..])
    };
    let out = output(program, rest);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("{args:?}");
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{what}: {stderr}");
    assert!(
        stderr.contains(expect),
        "{what}: {stderr:?} lacks {expect:?}"
    );
    match before {
        Some((t, d)) => {
            assert_eq!(
                std::fs::read(&tree).unwrap(),
                t,
                "{what}: tree file changed"
            );
            assert_eq!(
                std::fs::read(&desc).unwrap(),
                d,
                "{what}: descriptor changed"
            );
        }
        None => {
            assert!(!tree.exists() && !desc.exists(), "{what}: outputs created");
        }
    }
    assert_eq!(listing(), files_before, "{what}: files left behind");
}

#[test]
fn bad_input_leaves_outputs_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let good = s(&write_random(&d.join("good"), 1, 100_000));
    let big = s(&write_random(&d.join("big"), 2, 6 << 20));
    let missing = s(&d.join("missing"));
    let subdir = d.join("subdir");
    std::fs::create_dir(&subdir).unwrap();
    let unreadable = d.join("unreadable");
    write_random(&unreadable, 3, 5000);
    std::fs::set_permissions(
        &unreadable,
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    let old: (&[u8], &[u8]) = (b"an old tree", b"an old descriptor");
    let a = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    for before in [None, Some(old)] {
        // A bad file after good ones, small and large: nothing is written.
        assert_refused(d, &[], &a(&[&good, &big, &missing]), &missing, before);
        assert_refused(
            d,
            &[],
            &a(&[&good, &s(&subdir)]),
            &format!("{}: not a regular file", s(&subdir)),
            before,
        );
        // Root reads any file: drop the capabilities that let it.
        let setpriv: &[&str] = if is_root() {
            &[
                "setpriv",
                "--bounding-set=-dac_override,-dac_read_search",
                DMKIT,
            ]
        } else {
            &[]
        };
        assert_refused(
            d,
            setpriv,
            &a(&[&good, &s(&unreadable)]),
            &format!("{}: Permission denied", s(&unreadable)),
            before,
        );
        for bs in ["512", "3000", "131072", "0", "x"] {
            let expect = if bs == "x" { "block-size" } else { bs };
            assert_refused(
                d,
                &[],
                &a(&[&good, &format!("--block-size={bs}")]),
                expect,
                before,
            );
        }
        let long_salt = format!("--salt={}", "ab".repeat(33));
        assert_refused(d, &[], &a(&[&good, &long_salt]), "salt of 33 bytes", before);
        assert_refused(
            d,
            &[],
            &a(&[&good, "--hash-alg=sha1"]),
            "hash algorithm",
            before,
        );
    }
}
