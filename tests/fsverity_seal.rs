//! Sealed trees end to end through the `dmkit` binary: `fsverity seal` records a tree,
//! `fsverity mount` serves it through FUSE with every read checked, and whatever changed since
//! the seal — a byte of a file, the manifest, the sidecar trees, the tree's shape — is caught.
//!
//! Tests that mount need root and /dev/fuse: without them they fail under CI and are skipped
//! (saying why) elsewhere.

mod common;

use common::env::{fuse_missing, is_root, tool_missing};
use common::pki::{make_ident, Ident, EC_P256, RSA};
use common::rng::bytes;
use common::run::{Run, Workspace};
use common::sys::{aligned, mounted};
use common::{status_field, xor_byte};
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Sizes around the block boundaries, and a few larger files.
const SIZES: &[(&str, usize)] = &[
    ("empty", 0),
    ("one", 1),
    ("block-1", 4095),
    ("block", 4096),
    ("block+1", 4097),
    ("dir/mid", 300_000),
    ("dir/deeper/big", 3 << 20),
];

/// A tree to seal, where its manifest goes, and a mount point; what the test mounted is
/// closed when it is dropped.
struct Env {
    ws: Workspace,
    tree: PathBuf,
    mp: PathBuf,
    mounted: std::cell::Cell<bool>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.mounted.get() {
            let m = self.mp.to_str().unwrap().to_string();
            let _ = self.ws.run.output(&["fsverity", "close", &m]);
        }
    }
}

impl Env {
    /// A tree with files of every size in [`SIZES`], a symlink, an empty directory and a
    /// hard link.
    fn new() -> Env {
        let ws = Workspace::new();
        let tree = ws.dir().join("tree");
        for (i, (name, size)) in SIZES.iter().enumerate() {
            let p = tree.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, bytes(i as u64 + 1, *size)).unwrap();
        }
        fs::create_dir_all(tree.join("empty-dir")).unwrap();
        std::os::unix::fs::symlink("dir/mid", tree.join("link")).unwrap();
        fs::hard_link(tree.join("one"), tree.join("dir/one-again")).unwrap();
        fs::set_permissions(tree.join("one"), fs::Permissions::from_mode(0o600)).unwrap();
        let mp = ws.dir().join("mnt");
        fs::create_dir(&mp).unwrap();
        Env {
            ws,
            tree,
            mp,
            mounted: false.into(),
        }
    }

    /// A new tree, sealed without a key, when FUSE mounts can be made here.
    fn sealed() -> Option<Env> {
        if fuse_missing() {
            return None;
        }
        let env = Env::new();
        env.seal(&[]).assert_ok();
        Some(env)
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    fn manifest(&self) -> PathBuf {
        self.ws.dir().join("tree.manifest")
    }

    fn store(&self) -> PathBuf {
        self.ws.dir().join("tree.manifest.trees")
    }

    fn dmkit(&self, args: &[&str]) -> Run {
        self.ws.run.run(args)
    }

    fn seal(&self, extra: &[&str]) -> Run {
        let mut args = vec!["fsverity", "seal", Self::s(&self.tree)];
        args.extend_from_slice(extra);
        self.dmkit(&args)
    }

    fn mount(&self, extra: &[&str]) -> Run {
        let mut args = vec!["fsverity", "mount", Self::s(&self.tree), Self::s(&self.mp)];
        args.extend_from_slice(extra);
        let r = self.dmkit(&args);
        if r.code == Some(0) {
            self.mounted.set(true);
        }
        r
    }

    fn close(&self) {
        self.dmkit(&["fsverity", "close", Self::s(&self.mp)])
            .assert_ok();
        self.mounted.set(false);
        assert!(!mounted(&self.mp), "still mounted after close");
    }

    /// A mount that must be refused with exit code `code` and a one-line error holding
    /// every one of `words`; nothing is left mounted.
    fn refused(&self, extra: &[&str], code: i32, words: &[&str]) {
        let r = self.mount(extra);
        assert_eq!(r.code, Some(code), "{}", r.describe());
        r.assert_no_panic();
        // Without --cert or --manifest-digest a warning about trust comes first.
        let errors: Vec<&str> = r
            .stderr
            .lines()
            .filter(|l| !l.contains("trusted as found"))
            .collect();
        assert_eq!(errors.len(), 1, "{}", r.describe());
        for w in words {
            assert!(errors[0].contains(w), "no {w:?} in: {}", r.describe());
        }
        assert!(!mounted(&self.mp), "mounted although refused");
    }

    /// Every regular file of the tree (relative paths).
    fn files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut dirs = vec![self.tree.clone()];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let t = e.file_type().unwrap();
                if t.is_dir() {
                    dirs.push(e.path());
                } else if t.is_file() {
                    out.push(e.path().strip_prefix(&self.tree).unwrap().to_path_buf());
                }
            }
        }
        out.sort();
        out
    }
}

/// Reads `path` block by block with O_DIRECT (so that every read reaches the server, never
/// the page cache): for each 4 KiB block, its bytes or the errno of the failed read.
fn blocks_direct(path: &Path) -> Vec<Result<Vec<u8>, i32>> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let len = f.metadata().unwrap().len();
    let (mut buf, off) = aligned(4096);
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        let b = &mut buf[off..off + 4096];
        out.push(match f.read_at(b, at) {
            Ok(n) => Ok(b[..n].to_vec()),
            Err(e) => Err(e.raw_os_error().unwrap_or(0)),
        });
        at += 4096;
    }
    out
}

#[test]
fn sealed_tree_reads_back_identical_and_matches_fsverity_digest() {
    if fuse_missing() {
        return;
    }
    let env = Env::new();
    let r = env.seal(&[]).ok();
    assert!(r.stdout.contains("Sealed"), "{}", r.describe());
    // Every file's digest in the manifest is the one fsverity-utils computes.
    if !tool_missing("fsverity", "fsverity") {
        let manifest = fs::read_to_string(env.manifest()).unwrap();
        for f in env.files() {
            let out = common::run::ok(
                "fsverity",
                &["digest", "--compact", Env::s(&env.tree.join(&f))],
            );
            let rel = f.to_str().unwrap();
            let line = manifest
                .lines()
                .find(|l| l.contains(&format!("\"path\":\"{rel}\"")))
                .unwrap_or_else(|| panic!("{rel} is not in the manifest"));
            assert!(
                line.contains(&format!("\"digest\":\"{}\"", out.trim())),
                "{rel}: fsverity digest {} vs manifest line {line}",
                out.trim()
            );
        }
    }
    env.mount(&[]).assert_ok();
    assert!(mounted(&env.mp));
    for f in env.files() {
        assert_eq!(
            fs::read(env.mp.join(&f)).unwrap(),
            fs::read(env.tree.join(&f)).unwrap(),
            "{}",
            f.display()
        );
    }
    assert_eq!(
        fs::read_link(env.mp.join("link")).unwrap(),
        Path::new("dir/mid")
    );
    assert!(env.mp.join("empty-dir").is_dir());
    let mode = fs::metadata(env.mp.join("one"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
    let mut names: Vec<_> = fs::read_dir(&env.mp)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "block",
            "block+1",
            "block-1",
            "dir",
            "empty",
            "empty-dir",
            "link",
            "one"
        ]
    );
    // Read-only: nothing can be created or written.
    assert!(fs::write(env.mp.join("new"), b"x").is_err());
    assert!(fs::OpenOptions::new()
        .write(true)
        .open(env.mp.join("one"))
        .is_err());
    let status = env
        .dmkit(&["fsverity", "status", Env::s(&env.mp)])
        .ok()
        .stdout;
    assert_eq!(
        status_field(&status, "corruptions").as_deref(),
        Some("0"),
        "{status}"
    );
    env.close();
}

#[test]
fn a_tampered_byte_fails_exactly_its_block() {
    let Some(env) = Env::sealed() else {
        return;
    };
    let original: Vec<Vec<u8>> = ["block+1", "dir/mid", "dir/deeper/big"]
        .iter()
        .map(|f| fs::read(env.tree.join(f)).unwrap())
        .collect();
    // One byte in the last (partial) block, one inside a middle block, one at a block
    // boundary of the large file.
    let tampered = [
        ("block+1", 4096u64),
        ("dir/mid", 123_456),
        ("dir/deeper/big", 2 << 20),
    ];
    for (f, at) in tampered {
        xor_byte(&env.tree.join(f), at, 0x20);
    }
    env.mount(&[]).assert_ok();
    for ((f, at), orig) in tampered.iter().zip(&original) {
        let blocks = blocks_direct(&env.mp.join(f));
        assert_eq!(blocks.len(), orig.len().div_ceil(4096), "{f}");
        for (i, b) in blocks.iter().enumerate() {
            if i as u64 == at / 4096 {
                assert_eq!(b, &Err(libc::EIO), "{f}: block {i} holds the tampered byte");
            } else {
                let want = &orig[i * 4096..((i + 1) * 4096).min(orig.len())];
                assert_eq!(
                    b.as_deref(),
                    Ok(want),
                    "{f}: block {i} is untouched and must read"
                );
            }
        }
    }
    // Through the page cache too: a read-ahead request that holds the bad block fails whole,
    // and the kernel then reads each page of it alone, so only the bad block's page fails.
    let (f, at) = tampered[2];
    let file = fs::File::open(env.mp.join(f)).unwrap();
    let mut buf = vec![0u8; 4096];
    for (i, want) in original[2].chunks(4096).enumerate() {
        match file.read_at(&mut buf, i as u64 * 4096) {
            Ok(n) => {
                assert_ne!(
                    i as u64,
                    at / 4096,
                    "{f}: block {i} read through the page cache"
                );
                assert_eq!(&buf[..n], want, "{f}: block {i} through the page cache");
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{f}: block {i}");
                assert_eq!(
                    i as u64,
                    at / 4096,
                    "{f}: block {i} failed through the page cache"
                );
            }
        }
    }
    drop(file);
    // Untampered files read normally.
    assert_eq!(
        fs::read(env.mp.join("block")).unwrap(),
        fs::read(env.tree.join("block")).unwrap()
    );
    let status = env
        .dmkit(&["fsverity", "status", Env::s(&env.mp)])
        .ok()
        .stdout;
    let corrupt: u64 = status_field(&status, "corrupt data blocks")
        .unwrap()
        .parse()
        .unwrap();
    assert!(corrupt >= 3, "{status}");
    let log = fs::read_to_string(status_field(&status, "log").unwrap()).unwrap();
    for (f, at) in tampered {
        let block = at / 4096;
        assert!(
            log.lines()
                .any(|l| l.contains(f) && l.contains(&format!("block {block}"))),
            "the log names {f} block {block}:\n{log}"
        );
    }
    env.close();
}

#[test]
fn no_verify_serves_tampered_bytes_as_they_are() {
    let Some(env) = Env::sealed() else {
        return;
    };
    xor_byte(&env.tree.join("dir/mid"), 5, 1);
    env.mount(&["--no-verify"]).assert_ok();
    assert_eq!(
        fs::read(env.mp.join("dir/mid")).unwrap(),
        fs::read(env.tree.join("dir/mid")).unwrap()
    );
    env.close();
}

#[test]
fn a_changed_tree_refuses_to_mount() {
    if fuse_missing() {
        return;
    }
    type Change = fn(&Path);
    let changes: [(&str, Change, &str); 5] = [
        (
            "added",
            |t| fs::write(t.join("dir/new"), b"x").unwrap(),
            "dir/new",
        ),
        (
            "removed",
            |t| fs::remove_file(t.join("block")).unwrap(),
            "block",
        ),
        (
            "renamed",
            |t| fs::rename(t.join("dir/mid"), t.join("dir/mid2")).unwrap(),
            "dir/mid",
        ),
        (
            "resized",
            |t| {
                File::options()
                    .write(true)
                    .open(t.join("block-1"))
                    .unwrap()
                    .set_len(4096)
                    .unwrap()
            },
            "block-1",
        ),
        (
            "dir replaced by a symlink out of the tree",
            |t| {
                fs::remove_dir(t.join("empty-dir")).unwrap();
                std::os::unix::fs::symlink("/etc", t.join("empty-dir")).unwrap();
            },
            "empty-dir",
        ),
    ];
    for (what, change, path) in changes {
        let env = Env::new();
        env.seal(&[]).assert_ok();
        change(&env.tree);
        eprintln!("change: {what}");
        env.refused(&[], 2, &["changed since it was sealed", path]);
    }
}

#[test]
fn tampered_manifest_or_store_refuses_to_mount() {
    if fuse_missing() {
        return;
    }
    let env = Env::new();
    let sealed = env.seal(&[]).ok();
    let pin = sealed
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Manifest SHA-256: "))
        .unwrap()
        .trim()
        .to_string();
    let m = env.manifest();
    let text = fs::read_to_string(&m).unwrap();

    // A pinned manifest that was edited (a mode loosened) is refused.
    fs::write(
        &m,
        text.replacen("\"mode\":\"0600\"", "\"mode\":\"0666\"", 1),
    )
    .unwrap();
    env.refused(
        &["--manifest-digest", &pin],
        2,
        &["tree.manifest", "SHA-256"],
    );

    // A digest changed in the manifest no longer has its tree in the store.
    let digest = text
        .lines()
        .find(|l| l.contains("\"path\":\"dir/mid\""))
        .and_then(|l| l.split("\"digest\":\"").nth(1))
        .map(|d| d[..64].to_string())
        .unwrap();
    let flipped = format!(
        "{}{}",
        if &digest[..1] == "0" { "1" } else { "0" },
        &digest[1..]
    );
    fs::write(&m, text.replace(&digest, &flipped)).unwrap();
    env.refused(&[], 2, &[&flipped]);

    // A truncated manifest names where it ends.
    fs::write(&m, &text[..text.len() / 2]).unwrap();
    env.refused(&[], 1, &["tree.manifest"]);

    // One byte of a tree in the store (any level, or the descriptor before it).
    fs::write(&m, &text).unwrap();
    let tree_file = env.store().join(&digest);
    let len = fs::metadata(&tree_file).unwrap().len();
    for at in [0, 100, 256, len - 1] {
        xor_byte(&tree_file, at, 0x80);
        env.refused(&[], 2, &[&digest]);
        xor_byte(&tree_file, at, 0x80);
    }
    // A store file missing.
    fs::rename(&tree_file, env.ws.dir().join("aside")).unwrap();
    env.refused(&[], 2, &[&digest]);
    fs::rename(env.ws.dir().join("aside"), &tree_file).unwrap();

    // Restored, it mounts again.
    env.mount(&["--manifest-digest", &pin]).assert_ok();
    env.close();
}

#[test]
fn a_manifest_for_another_tree_refuses_to_mount() {
    let Some(env) = Env::sealed() else {
        return;
    };
    let other = env.ws.dir().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("x"), b"another tree").unwrap();
    let r = env.dmkit(&[
        "fsverity",
        "mount",
        Env::s(&other),
        Env::s(&env.mp),
        "--manifest",
        Env::s(&env.manifest()),
    ]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        r.stderr.contains("changed since it was sealed"),
        "{}",
        r.describe()
    );
    assert!(!mounted(&env.mp));
}

/// Seals with `signer`, then checks that its certificate mounts and another's does not.
fn signed_manifest_case(signer: &Ident, other: &Ident) {
    let env = Env::new();
    let r = env
        .seal(&["--key", Env::s(&signer.key), "--cert", Env::s(&signer.cert)])
        .ok();
    let sig = env.ws.dir().join("tree.manifest.sig");
    assert!(r.stdout.contains("Signature:"), "{}", r.describe());
    // The signature is a plain detached PKCS#7 over the manifest: openssl agrees.
    assert!(common::pki::smime_verifies(
        &sig,
        &env.manifest(),
        &signer.cert
    ));
    env.mount(&["--cert", Env::s(&signer.cert)]).assert_ok();
    env.close();
    // Any one of several certificates will do, DER as well as PEM.
    env.mount(&[
        "--cert",
        Env::s(&other.cert),
        "--cert",
        Env::s(&signer.cert_der),
    ])
    .assert_ok();
    env.close();
    env.refused(&["--cert", Env::s(&other.cert)], 2, &["does not verify"]);
    // A manifest edited after signing.
    let text = fs::read_to_string(env.manifest()).unwrap();
    fs::write(
        env.manifest(),
        text.replacen("\"mode\":\"0600\"", "\"mode\":\"0644\"", 1),
    )
    .unwrap();
    env.refused(&["--cert", Env::s(&signer.cert)], 2, &["does not verify"]);
    fs::write(env.manifest(), &text).unwrap();
    // A missing signature, when one is required.
    fs::remove_file(&sig).unwrap();
    env.refused(&["--cert", Env::s(&signer.cert)], 2, &["no signature"]);
    // Resealing without a key removes the stale signature.
    fs::write(&sig, b"stale").unwrap();
    env.seal(&[]).assert_ok();
    assert!(
        !sig.exists(),
        "a stale signature was left beside a new manifest"
    );
}

#[test]
fn a_signed_manifest_mounts_only_with_its_certificate() {
    if fuse_missing() {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let rsa = make_ident(keys.path(), "rsa", "/CN=rsa signer", RSA);
    let ec = make_ident(keys.path(), "ec", "/CN=ec signer", EC_P256);
    signed_manifest_case(&rsa, &ec);
    signed_manifest_case(&ec, &rsa);
}

#[test]
fn bad_input_gives_one_line_errors_and_writes_nothing() {
    let env = Env::new();
    let keys = tempfile::tempdir().unwrap();
    let a = make_ident(keys.path(), "a", "/CN=a", RSA);
    let b = make_ident(keys.path(), "b", "/CN=b", EC_P256);
    let garbage = keys.path().join("garbage");
    fs::write(&garbage, b"not a key").unwrap();
    let fails = |args: &[&str], code: i32, words: &[&str]| {
        let r = env.dmkit(args);
        assert_eq!(r.code, Some(code), "{}", r.describe());
        r.assert_no_panic();
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.describe());
        for w in words {
            assert!(r.stderr.contains(w), "no {w:?} in: {}", r.describe());
        }
        assert!(!env.manifest().exists(), "a manifest was written");
        assert!(!env.store().exists(), "a store was written");
    };
    let t = Env::s(&env.tree);
    fails(
        &["fsverity", "seal", "/nonexistent/tree"],
        1,
        &["/nonexistent/tree"],
    );
    fails(
        &[
            "fsverity",
            "seal",
            t,
            "--key",
            Env::s(&garbage),
            "--cert",
            Env::s(&a.cert),
        ],
        1,
        &["garbage"],
    );
    fails(
        &[
            "fsverity",
            "seal",
            t,
            "--key",
            Env::s(&a.key),
            "--cert",
            Env::s(&b.cert),
        ],
        1,
        &["b.crt", "no certificate matches"],
    );
    fails(
        &[
            "fsverity",
            "seal",
            t,
            "--key",
            Env::s(&a.key),
            "--cert",
            Env::s(&garbage),
        ],
        1,
        &["garbage"],
    );
    fails(
        &["fsverity", "seal", t, "--block-size", "3000"],
        1,
        &["block"],
    );
    let inside = env.tree.join("m");
    fails(
        &["fsverity", "seal", t, "--manifest", Env::s(&inside)],
        1,
        &["inside the tree"],
    );
    // A file that cannot be read: a FIFO is recorded as a node, so use permissions, which
    // bind only without root; as root, drop to nobody for the seal.
    fs::set_permissions(env.tree.join("one"), fs::Permissions::from_mode(0o644)).unwrap();
    let unreadable = env.tree.join("dir/secret");
    fs::write(&unreadable, b"secret").unwrap();
    fs::set_permissions(&unreadable, fs::Permissions::from_mode(0o000)).unwrap();
    let r = if is_root() {
        let out = env.ws.dir().join("nobody");
        fs::create_dir(&out).unwrap();
        for p in [env.ws.dir(), &env.tree, &env.tree.join("dir"), &out] {
            fs::set_permissions(p, fs::Permissions::from_mode(0o777)).unwrap();
        }
        let m = out.join("m");
        let r = common::run::run_in(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                common::DMKIT,
                "fsverity",
                "seal",
                t,
                "--manifest",
                Env::s(&m),
            ],
            env.ws.run.path(),
            std::time::Duration::from_secs(60),
        );
        assert!(!m.exists());
        r
    } else {
        env.seal(&[])
    };
    assert_eq!(r.code, Some(1), "{}", r.describe());
    r.assert_no_panic();
    assert!(r.stderr.contains("dir/secret"), "{}", r.describe());
    assert!(r.stderr.contains("Permission denied"), "{}", r.describe());
    fs::remove_file(&unreadable).unwrap();
    // Mounting what was never sealed, or with a certificate file that is not one.
    fails(
        &["fsverity", "mount", t, Env::s(&env.mp)],
        1,
        &["tree.manifest"],
    );
    env.seal(&[]).assert_ok();
    let r = env.dmkit(&[
        "fsverity",
        "mount",
        t,
        Env::s(&env.mp),
        "--cert",
        Env::s(&garbage),
    ]);
    assert_ne!(r.code, Some(0), "{}", r.describe());
    r.assert_no_panic();
    // A manifest entry whose path leaves the tree is refused by the parser, naming it.
    let text = fs::read_to_string(env.manifest()).unwrap();
    fs::write(
        env.manifest(),
        text.replacen("\"path\":\"block\"", "\"path\":\"../block\"", 1),
    )
    .unwrap();
    let r = env.dmkit(&["fsverity", "mount", t, Env::s(&env.mp)]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("'..' component"), "{}", r.describe());
    assert!(!mounted(&env.mp));
}

/// The mount's read-ahead window, from its backing device's `read_ahead_kb`.
fn read_ahead_kb(mp: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(mp).unwrap().dev();
    let p = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    fs::read_to_string(&p).unwrap().trim().parse().unwrap()
}

#[test]
fn the_mount_sets_its_read_ahead_window() {
    let Some(env) = Env::sealed() else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: read_ahead_kb can only be written by root");
        return;
    }
    env.mount(&[]).assert_ok();
    assert_eq!(
        read_ahead_kb(&env.mp),
        16384,
        "the default window is 16 MiB"
    );
    env.close();
    env.mount(&["--read-ahead", "512K"]).assert_ok();
    assert_eq!(read_ahead_kb(&env.mp), 512);
    // Reads are the same whatever the window.
    assert_eq!(
        fs::read(env.mp.join("dir/deeper/big")).unwrap(),
        fs::read(env.tree.join("dir/deeper/big")).unwrap()
    );
    env.close();
    env.mount(&["--read-ahead", "0"]).assert_ok();
    assert_eq!(read_ahead_kb(&env.mp), 128, "0 keeps the kernel's window");
    env.close();
    env.refused(&["--read-ahead", "lots"], 1, &["--read-ahead"]);
    env.refused(
        &["--read-ahead", "100"],
        1,
        &["--read-ahead", "less than a page"],
    );
}
