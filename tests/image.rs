//! `dmkit image`: read-only root images built from a small tree with the real mkfs tools.
//!
//! - Reproducible: the same tree twice, touched in between or copied elsewhere, gives the same
//!   bytes, signed or not, GPT or `--split`.
//! - Real tools accept them: `veritysetup verify` takes the root partition and its tree;
//!   Debian's `systemd-dissect` lists the partitions, takes our root hash and finds the
//!   signature; Debian's `systemd-repart` builds an image of the same tree that dissects the
//!   same way and that `dmkit image open` opens.
//! - Through `image open`: every file reads back identical, writes land in the upper layer
//!   only, the image is unchanged afterwards; a flipped byte fails the file holding it with
//!   EIO while the rest reads.
//! - Bad input is refused in one line, with nothing mounted or left behind.
//!
//! Opening needs root, loop devices and FUSE; the interop tests need the tools (each checks
//! with tests/common/env.rs: a failure in CI, a skip otherwise).

mod common;

use common::env::{is_root, loop_missing, missing, tool_missing};
use common::image_tree::{
    dissect, dissect_missing, dissect_ok, partition, snapshot, snapshot_skipping, tree_workspace,
    BIG_FILE,
};
use common::pki::{make_ident, Ident, RSA};
use common::run::{assert_refused, ok, output, Run, Workspace};
use common::xor_byte;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Every file system `dmkit image build` makes, with the package that builds it.
const FILE_SYSTEMS: [(&str, &str, &str); 3] = [
    ("erofs", "mkfs.erofs", "erofs-utils"),
    ("squashfs", "mksquashfs", "squashfs-tools"),
    ("ext4", "mkfs.ext4", "e2fsprogs"),
];

/// The time every inode of a test image gets.
const TIMESTAMP: &str = "1700000000";

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Whether any mkfs tool is missing (reported through `missing`).
fn mkfs_missing() -> bool {
    FILE_SYSTEMS
        .iter()
        .any(|(_, tool, pkg)| tool_missing(tool, pkg))
}

/// Whether `image open` cannot run here: it needs root, FUSE and loop devices.
fn open_missing() -> bool {
    mkfs_missing() || loop_missing()
}

fn sha256_file(p: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(p).unwrap()))
}

/// A test's workspace, its tree and a signing key.
struct Env {
    ws: Workspace,
    tree: PathBuf,
    signer: Ident,
}

impl Env {
    fn new() -> Env {
        let (ws, tree) = tree_workspace();
        let signer = make_ident(ws.dir(), "signer", "/CN=dmkit image test", RSA);
        Env { ws, tree, signer }
    }

    fn run(&self, args: &[&str]) -> Run {
        self.ws.run.run(args)
    }

    /// `dmkit image build TREE NAME --fs FS [--compress C] EXTRA... --json`, signed; returns
    /// the image path and the report.
    fn build(
        &self,
        name: &str,
        fs: &str,
        compress: Option<&str>,
        extra: &[&str],
    ) -> (PathBuf, Value) {
        self.build_from(&self.tree, name, fs, compress, extra)
    }

    fn build_from(
        &self,
        tree: &Path,
        name: &str,
        fs: &str,
        compress: Option<&str>,
        extra: &[&str],
    ) -> (PathBuf, Value) {
        let img = self.ws.path(name);
        let mut args = vec!["image", "build", s(tree), s(&img), "--fs", fs];
        if let Some(c) = compress {
            args.extend(["--compress", c]);
        }
        args.extend([
            "--timestamp",
            TIMESTAMP,
            "--key",
            s(&self.signer.key),
            "--cert",
            s(&self.signer.cert),
            "--json",
        ]);
        args.extend_from_slice(extra);
        let r = self.run(&args).ok();
        let report: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("build --json is not JSON ({e}):\n{}", r.describe()));
        (img, report)
    }

    /// `dmkit image open IMAGE MOUNTPOINT EXTRA... --json`, closed again when the guard drops.
    fn open(&self, img: &Path, mp_name: &str, extra: &[&str]) -> Stack<'_> {
        let mp = self.ws.path(mp_name);
        std::fs::create_dir_all(&mp).unwrap();
        let mut args = vec!["image", "open", s(img), s(&mp), "--json"];
        args.extend_from_slice(extra);
        let r = self.run(&args).ok();
        let opened: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("open --json is not JSON ({e}):\n{}", r.describe()));
        let st = self.run(&["image", "status", s(&mp), "--json"]).ok();
        let status: Value = serde_json::from_str(&st.stdout).unwrap();
        Stack {
            env: self,
            mp,
            opened,
            status,
            open: true,
        }
    }

    /// Nothing of an image stack is left: no mount under the workspace or the run directory,
    /// no loop device over a file in the run directory, no open export or stack, no private
    /// directory.
    fn assert_nothing_left(&self, after: &str) {
        let run = self.ws.run.path();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for l in mounts.lines() {
            let mp = l.split(' ').nth(4).unwrap_or("");
            assert!(
                !mp.starts_with(s(self.ws.dir())) && !mp.starts_with(s(run)),
                "{after}: still mounted: {l}"
            );
        }
        for e in std::fs::read_dir("/sys/block").unwrap() {
            let e = e.unwrap();
            let back = e.path().join("loop/backing_file");
            if let Ok(b) = std::fs::read_to_string(&back) {
                assert!(
                    !b.trim().starts_with(s(run)),
                    "{after}: loop device {} still backs {}",
                    e.file_name().to_string_lossy(),
                    b.trim()
                );
            }
        }
        let st = self.run(&["status", "--json"]).ok();
        assert_eq!(st.stdout.trim(), "[]", "{after}: exports left open");
        let ist = self.run(&["image", "status", "--json"]).ok();
        assert_eq!(ist.stdout.trim(), "[]", "{after}: image stacks left open");
        let private = run.join(".image");
        if let Ok(rd) = std::fs::read_dir(&private) {
            let left: Vec<_> = rd.map(|e| e.unwrap().path()).collect();
            assert!(left.is_empty(), "{after}: left behind: {left:?}");
        }
    }
}

/// An open image stack; `dmkit image close` when dropped (a failing close fails the test
/// unless it is failing already).
struct Stack<'a> {
    env: &'a Env,
    mp: PathBuf,
    opened: Value,
    status: Value,
    open: bool,
}

impl Stack<'_> {
    fn detail(&self, k: &str) -> PathBuf {
        PathBuf::from(
            self.status["details"][k]
                .as_str()
                .unwrap_or_else(|| panic!("no details.{k} in {}", self.status)),
        )
    }

    fn close(mut self) {
        self.open = false;
        self.env.run(&["image", "close", s(&self.mp)]).ok();
    }
}

impl Drop for Stack<'_> {
    fn drop(&mut self) {
        if self.open {
            let r = self.env.run(&["image", "close", s(&self.mp)]);
            if r.code != Some(0) && !std::thread::panicking() {
                panic!("image close failed:\n{}", r.describe());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reproducible builds

#[test]
fn the_same_tree_gives_the_same_bytes() {
    if mkfs_missing() {
        return;
    }
    let env = Env::new();
    let copy = env.ws.path("copy");
    ok("cp", &["-a", s(&env.tree), s(&copy)]);
    for (fs, compress) in [("erofs", Some("lz4hc")), ("squashfs", None), ("ext4", None)] {
        let (a, ra) = env.build(&format!("{fs}-a.img"), fs, compress, &[]);
        // Every inode's time changes between the builds: the image must not.
        ok("find", &[s(&env.tree), "-exec", "touch", "-h", "{}", "+"]);
        let (b, rb) = env.build(&format!("{fs}-b.img"), fs, compress, &[]);
        let (c, _) = env.build_from(&copy, &format!("{fs}-c.img"), fs, compress, &[]);
        assert_eq!(ra["root_hash"], rb["root_hash"], "{fs}");
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "{fs}: two builds of the same tree differ"
        );
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&c).unwrap(),
            "{fs}: a copy of the tree gives another image"
        );
        // The split files too.
        env.build(&format!("{fs}-a.raw"), fs, compress, &["--split"]);
        env.build_from(&copy, &format!("{fs}-b.raw"), fs, compress, &["--split"]);
        for suffix in [".raw", ".verity", ".roothash", ".roothash.p7s"] {
            let x = std::fs::read(env.ws.path(&format!("{fs}-a{suffix}"))).unwrap();
            let y = std::fs::read(env.ws.path(&format!("{fs}-b{suffix}"))).unwrap();
            assert!(x == y, "{fs}: split file {suffix} differs");
        }
        // The report and inspect agree on the layout.
        let i = env.run(&["image", "inspect", s(&a), "--json"]).ok();
        let i: Value = serde_json::from_str(&i.stdout).unwrap();
        assert_eq!(i["fs"], fs);
        assert_eq!(i["root_hash"], ra["root_hash"]);
        assert_eq!(i["root_hash_source"], "signature-partition");
        assert_eq!(i["uuids_match_root_hash"], true);
        assert_eq!(i["problems"], serde_json::json!([]));
        let types: Vec<&str> = i["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "root-x86-64",
                "root-x86-64-verity",
                "root-x86-64-verity-sig"
            ]
        );
    }
    // Another seed: other identifiers, so another image of the same tree.
    let (x, _) = env.build(
        "seeded.img",
        "erofs",
        Some("lz4hc"),
        &["--seed", "3f2504e0-4f89-41d3-9a0c-0305e82c3301"],
    );
    assert!(std::fs::read(&x).unwrap() != std::fs::read(env.ws.path("erofs-a.img")).unwrap());
}

// ---------------------------------------------------------------------------------------------
// The real tools

/// Copy `len` bytes at `offset` of `from` into a new file `to`.
fn extract(from: &Path, offset: u64, len: u64, to: &Path) {
    let data = std::fs::read(from).unwrap();
    std::fs::write(to, &data[offset as usize..(offset + len) as usize]).unwrap();
}

#[test]
fn veritysetup_verifies_the_root_partition_with_its_tree() {
    if mkfs_missing() || tool_missing("veritysetup", "cryptsetup-bin") {
        return;
    }
    let env = Env::new();
    for fs in ["erofs", "squashfs"] {
        let (img, report) = env.build(&format!("{fs}.img"), fs, None, &[]);
        let root = report["root_hash"].as_str().unwrap().to_string();
        let i = env.run(&["image", "inspect", s(&img), "--json"]).ok();
        let i: Value = serde_json::from_str(&i.stdout).unwrap();
        let data = env.ws.path(&format!("{fs}-p1"));
        let hash = env.ws.path(&format!("{fs}-p2"));
        let (o, l) = partition(&i, "root-x86-64");
        extract(&img, o, l, &data);
        let (o, l) = partition(&i, "root-x86-64-verity");
        extract(&img, o, l, &hash);
        let out = ok("veritysetup", &["verify", "-v", s(&data), s(&hash), &root]);
        assert!(out.contains("successful"), "{fs}: {out}");
        // The superblock we wrote is the one veritysetup reads.
        let dump = ok("veritysetup", &["dump", s(&hash)]);
        assert!(
            dump.contains(i["verity"]["salt"].as_str().unwrap()),
            "{dump}"
        );
        assert!(
            dump.contains(i["verity"]["uuid"].as_str().unwrap()),
            "{dump}"
        );
        // And it really checks: a flipped byte of the file system fails it.
        xor_byte(&data, l.min(4096) / 2, 0x01);
        let bad = output("veritysetup", &["verify", s(&data), s(&hash), &root]);
        assert!(
            !bad.status.success(),
            "{fs}: a corrupted partition verified"
        );
        // --split writes the same two pieces as files.
        let (raw, _) = env.build(&format!("{fs}.raw"), fs, None, &["--split"]);
        let rh = std::fs::read_to_string(env.ws.path(&format!("{fs}.roothash"))).unwrap();
        assert_eq!(rh.trim(), root, "{fs}: the .roothash file");
        let tree = env.ws.path(&format!("{fs}.verity"));
        ok("veritysetup", &["verify", s(&raw), s(&tree), rh.trim()]);
    }
}

/// systemd-dissect's rows by designator: "label fstype architecture verity".
fn dissected(img: &Path) -> (BTreeMap<String, String>, Value) {
    let v = dissect_ok(img, None);
    let mut rows = BTreeMap::new();
    for m in v["mounts"].as_array().unwrap() {
        let f = |k: &str| m[k].as_str().unwrap_or("-").to_string();
        let row = ["partition_label", "fstype", "architecture", "verity"].map(f);
        rows.insert(f("designator"), row.join(" "));
    }
    (rows, v)
}

fn uuid_of(v: &Value, designator: &str) -> String {
    v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["designator"] == designator)
        .and_then(|m| m["partition_uuid"].as_str())
        .unwrap_or_else(|| panic!("no {designator} in {v}"))
        .replace('-', "")
}

#[test]
fn systemd_dissect_lists_partitions_root_hash_and_signature() {
    if mkfs_missing() || dissect_missing() || loop_missing() {
        return;
    }
    let env = Env::new();
    for fs in ["erofs", "squashfs"] {
        let (img, report) = env.build(&format!("{fs}.img"), fs, None, &[]);
        let root = report["root_hash"].as_str().unwrap();
        let (rows, v) = dissected(&img);
        let row = |d: &str, label: &str, fstype: &str, verity: &str| {
            (d.to_string(), format!("{label} {fstype} x86-64 {verity}"))
        };
        let want: BTreeMap<_, _> = [
            row("root", "root-x86-64", fs, "signed"),
            row("root-verity", "root-x86-64-verity", "DM_verity_hash", "-"),
            row(
                "root-verity-sig",
                "root-x86-64-verity-sig",
                "verity_hash_signature",
                "-",
            ),
        ]
        .into();
        assert_eq!(rows, want, "{fs}: {v}");
        // The root hash: the two verity partitions are its halves, and systemd finds the
        // root partition by it (and no root partition for another one).
        assert_eq!(
            format!("{}{}", uuid_of(&v, "root"), uuid_of(&v, "root-verity")),
            root
        );
        let out = dissect(&img, Some(root));
        assert!(
            out.status.success(),
            "{fs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut other = root.to_string();
        other.replace_range(0..1, if root.starts_with('0') { "1" } else { "0" });
        let out = dissect(&img, Some(&other));
        assert!(
            !out.status.success(),
            "{fs}: systemd-dissect took a wrong root hash"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("No root partition for specified root hash"),
            "{fs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The signature in the partition verifies over the root hash with our certificate.
        let i = env.run(&["image", "inspect", s(&img), "--json"]).ok();
        let i: Value = serde_json::from_str(&i.stdout).unwrap();
        let (o, l) = partition(&i, "root-x86-64-verity-sig");
        let part = std::fs::read(&img).unwrap()[o as usize..(o + l) as usize].to_vec();
        let sig = dmkit::image::sigjson::SigJson::parse(&part).unwrap();
        assert_eq!(hex::encode(&sig.root_hash), root);
        let der = env.ws.path(&format!("{fs}.p7s"));
        let content = env.ws.path(&format!("{fs}.roothash-text"));
        std::fs::write(&der, &sig.signature).unwrap();
        std::fs::write(&content, root).unwrap();
        assert!(common::pki::smime_verifies(
            &der,
            &content,
            &env.signer.cert
        ));
    }
}

#[test]
fn systemd_repart_builds_the_same_shape_and_dmkit_opens_it() {
    if mkfs_missing()
        || tool_missing("systemd-repart", "systemd")
        || dissect_missing()
        || loop_missing()
    {
        return;
    }
    let env = Env::new();
    let seed = "5eedd44b-1e2a-4c3d-9b0f-6a27d13c8801";
    // Debian 12's systemd-repart (252) formats SquashFS and ext4 from a tree, not EROFS.
    let defs = env.ws.path("repart.d");
    std::fs::create_dir_all(&defs).unwrap();
    let conf = |name: &str, body: String| std::fs::write(defs.join(name), body).unwrap();
    conf(
        "10-root.conf",
        format!(
            "[Partition]\nType=root\nFormat=squashfs\nCopyFiles={}:/\nVerity=data\nVerityMatchKey=root\n",
            s(&env.tree)
        ),
    );
    conf(
        "20-verity.conf",
        "[Partition]\nType=root-verity\nVerity=hash\nVerityMatchKey=root\n".into(),
    );
    conf(
        "30-sig.conf",
        "[Partition]\nType=root-verity-sig\nVerity=signature\nVerityMatchKey=root\n".into(),
    );
    let theirs = env.ws.path("repart.img");
    let defs_arg = format!("--definitions={}", s(&defs));
    let key_arg = format!("--private-key={}", s(&env.signer.key));
    let cert_arg = format!("--certificate={}", s(&env.signer.cert));
    let seed_arg = format!("--seed={seed}");
    ok(
        "systemd-repart",
        &[
            defs_arg.as_str(),
            "--empty=create",
            "--size=auto",
            "--dry-run=no",
            &key_arg,
            &cert_arg,
            &seed_arg,
            s(&theirs),
        ],
    );
    let (ours, _) = env.build("ours.img", "squashfs", None, &["--seed", seed]);

    // systemd-dissect sees the same partitions, file system, verity and signature.
    let (their_rows, tv) = dissected(&theirs);
    let (our_rows, ov) = dissected(&ours);
    assert_eq!(their_rows, our_rows, "repart: {tv}\nours: {ov}");
    // The same seed gives the same disk GUID and signature partition UUID.
    let inspect = |p: &Path| -> Value {
        serde_json::from_str(&env.run(&["image", "inspect", s(p), "--json"]).ok().stdout).unwrap()
    };
    let (ti, oi) = (inspect(&theirs), inspect(&ours));
    assert_eq!(ti["disk_guid"], oi["disk_guid"]);
    assert_eq!(
        uuid_of(&tv, "root-verity-sig"),
        uuid_of(&ov, "root-verity-sig")
    );
    assert_eq!(ti["uuids_match_root_hash"], true);
    assert_eq!(ti["root_hash_source"], "signature-partition");
    // What differs, for the record (Debian 12's systemd 252).
    eprintln!(
        "systemd-repart image: verity blocks {}/{} bytes, salt {}, root partition flags {}; \
         ours: {}/{}, salt {}, flags {}",
        ti["verity"]["data_block_size"],
        ti["verity"]["hash_block_size"],
        ti["verity"]["salt"],
        ti["partitions"][0]["flags"],
        oi["verity"]["data_block_size"],
        oi["verity"]["hash_block_size"],
        oi["verity"]["salt"],
        oi["partitions"][0]["flags"],
    );

    // dmkit opens systemd-repart's image, checking its signature, and reads the tree.
    if !is_root() && missing("not running as root (image open mounts)") {
        return;
    }
    let stack = env.open(&theirs, "mnt", &["--cert", s(&env.signer.cert)]);
    assert_eq!(stack.opened["root_hash_source"], "signature-partition");
    let (a, b) = (snapshot(&env.tree), snapshot(&stack.mp));
    assert_eq!(a, b, "the tree through systemd-repart's image");
    stack.close();
    env.assert_nothing_left("close");
}

// ---------------------------------------------------------------------------------------------
// image open

#[test]
fn open_reads_the_tree_writes_go_up_and_the_image_stays() {
    if open_missing() {
        return;
    }
    let env = Env::new();
    let tree = snapshot(&env.tree);
    let cert = s(&env.signer.cert);
    for (fs, compress) in [
        ("erofs", "lz4hc,12"),
        ("squashfs", "zstd"),
        ("ext4", "none"),
    ] {
        let (img, report) = env.build(&format!("{fs}.img"), fs, Some(compress), &[]);
        let before = sha256_file(&img);
        let stack = env.open(&img, &format!("mnt-{fs}"), &["--cert", cert]);
        assert_eq!(stack.opened["root_hash"], report["root_hash"]);
        assert_eq!(stack.opened["signed_by"], "CN=dmkit image test");
        let mp = stack.mp.clone();
        let mut seen = snapshot(&mp);
        if fs == "ext4" {
            // mkfs.ext4 always makes one.
            assert_eq!(
                seen.remove(Path::new("lost+found")).as_deref(),
                Some("dir 700 0:0")
            );
        }
        assert_eq!(seen, tree, "{fs}: the tree through image open");
        let m = std::fs::symlink_metadata(mp.join("etc/hostname")).unwrap();
        assert_eq!(m.mtime().to_string(), TIMESTAMP, "{fs}: inode times");

        // Writes: a new file, a changed one, a removed one, a new directory.
        std::fs::write(mp.join("new.txt"), b"written after boot\n").unwrap();
        let mut host = std::fs::read(mp.join("etc/hostname")).unwrap();
        host.extend_from_slice(b"changed\n");
        std::fs::write(mp.join("etc/hostname"), &host).unwrap();
        std::fs::remove_file(mp.join("usr/share/many/f07")).unwrap();
        std::fs::create_dir(mp.join("var/newdir")).unwrap();
        assert_eq!(std::fs::read(mp.join("etc/hostname")).unwrap(), host);
        assert!(!mp.join("usr/share/many/f07").exists());

        // They are in the upper layer, and only there.
        let upper = stack.detail("upper");
        let lower = stack.detail("lower");
        assert_eq!(
            std::fs::read(upper.join("new.txt")).unwrap(),
            b"written after boot\n"
        );
        assert_eq!(std::fs::read(upper.join("etc/hostname")).unwrap(), host);
        let wh = std::fs::symlink_metadata(upper.join("usr/share/many/f07")).unwrap();
        assert!(
            std::os::unix::fs::FileTypeExt::is_char_device(&wh.file_type()) && wh.rdev() == 0,
            "{fs}: a removed file is a whiteout in the upper layer"
        );
        assert!(upper.join("var/newdir").is_dir());
        let mut below = snapshot(&lower);
        below.remove(Path::new("lost+found"));
        assert_eq!(below, tree, "{fs}: the lower layer changed");

        stack.close();
        env.assert_nothing_left(&format!("{fs}: close"));
        assert_eq!(sha256_file(&img), before, "{fs}: the image changed");
    }

    // A persistent upper layer keeps the writes across close and open; the image stays.
    let (img, _) = env.build("persist.img", "erofs", None, &[]);
    let before = sha256_file(&img);
    let upper_dir = env.ws.path("state");
    let up = ["--upper", s(&upper_dir)];
    let stack = env.open(&img, "mnt-persist", &up);
    std::fs::write(stack.mp.join("etc/hostname"), b"persisted\n").unwrap();
    stack.close();
    let stack = env.open(&img, "mnt-persist", &up);
    assert_eq!(
        std::fs::read(stack.mp.join("etc/hostname")).unwrap(),
        b"persisted\n"
    );
    stack.close();
    // And a tmpfs upper starts from the image again.
    let stack = env.open(&img, "mnt-persist", &[]);
    assert_eq!(
        std::fs::read(stack.mp.join("etc/hostname")).unwrap(),
        b"dmkit-image-test\n"
    );
    stack.close();
    assert_eq!(sha256_file(&img), before);
    env.assert_nothing_left("persistent upper");
}

#[test]
fn a_flipped_byte_fails_its_file_with_eio_and_the_rest_reads() {
    if open_missing() {
        return;
    }
    let env = Env::new();
    let big = std::fs::read(env.tree.join(BIG_FILE)).unwrap();
    let big_path = Path::new(BIG_FILE);
    let tree = snapshot_skipping(&env.tree, Some(big_path));
    // Uncompressed, so the file's bytes can be found in the image.
    for (fs, compress) in [("erofs", "none"), ("squashfs", "none")] {
        let (img, _) = env.build(&format!("{fs}.img"), fs, Some(compress), &[]);
        let data = std::fs::read(&img).unwrap();
        let probe = &big[768 << 10..(768 << 10) + 64];
        let at = data
            .windows(probe.len())
            .position(|w| w == probe)
            .unwrap_or_else(|| panic!("{fs}: big.bin's bytes are not in the image"));
        drop(data);
        xor_byte(&img, at as u64 + 7, 0x20);
        let flipped = sha256_file(&img);

        let stack = env.open(&img, &format!("mnt-{fs}"), &[]);
        let e = std::fs::read(stack.mp.join(BIG_FILE)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{fs}: {e}");
        let seen = snapshot_skipping(&stack.mp, Some(big_path));
        assert_eq!(seen, tree, "{fs}: the other files");
        let st = env.run(&["image", "status", s(&stack.mp), "--json"]).ok();
        let st: Value = serde_json::from_str(&st.stdout).unwrap();
        assert!(
            st["stats"]["corruptions"].as_u64().unwrap_or(0) >= 1,
            "{fs}: no corruption counted: {st}"
        );
        stack.close();
        env.assert_nothing_left(fs);
        assert_eq!(sha256_file(&img), flipped, "{fs}: open changed the image");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// The names in the work directory.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A GPT disk image holding only a root partition with the file system of `from` (which
/// `image inspect` described as `inspect`): an image without verity.
fn root_only(from: &Path, inspect: &Value, to: &Path) {
    use dmkit::image::{dps, gpt};
    let (o, l) = partition(inspect, "root-x86-64");
    let fs = std::fs::read(from).unwrap()[o as usize..(o + l) as usize].to_vec();
    let at = gpt::FIRST_USABLE_LBA * gpt::SECTOR;
    let part = gpt::NewPartition {
        type_guid: dps::ROOT_X86_64.guid,
        guid: [7; 16],
        offset: at,
        size: l,
        flags: 0,
        name: dps::ROOT_X86_64.name.into(),
    };
    let size = gpt::disk_size_for(at + l);
    let enc = gpt::encode(size, &[9; 16], &[part]);
    let mut disk = vec![0u8; size as usize];
    disk[..enc.primary.len()].copy_from_slice(&enc.primary);
    disk[at as usize..(at + l) as usize].copy_from_slice(&fs);
    let b = enc.backup_offset as usize;
    disk[b..b + enc.backup.len()].copy_from_slice(&enc.backup);
    std::fs::write(to, disk).unwrap();
}

#[test]
fn bad_input_is_refused_in_one_line_and_leaves_nothing_behind() {
    if open_missing() {
        return;
    }
    let env = Env::new();
    let tree = s(&env.tree);
    let out = env.ws.s("out.img");

    // build: every refusal leaves the work directory as it was.
    let before = listing(env.ws.dir());
    let build_refused = |args: &[&str], code: i32, names: &[&[&str]]| {
        let r = env.run(args);
        assert_refused(&r, code, names);
        assert_eq!(
            listing(env.ws.dir()),
            before,
            "left behind:\n{}",
            r.describe()
        );
    };
    let nowhere = env.ws.s("no-such-dir");
    build_refused(
        &["image", "build", &nowhere, &out],
        1,
        &[&["no-such-dir"], &["no such file"]],
    );
    build_refused(
        &[
            "image",
            "build",
            tree,
            &out,
            "--fs",
            "squashfs",
            "--compress",
            "brotli",
        ],
        1,
        &[&["--compress"], &["brotli"]],
    );
    build_refused(
        &["image", "build", tree, &out, "--fs", "btrfs"],
        1,
        &[&["--fs"], &["btrfs"]],
    );
    build_refused(
        &[
            "image",
            "build",
            tree,
            &out,
            "--fs",
            "ext4",
            "--compress",
            "gzip",
        ],
        1,
        &[&["--compress"], &["ext4"]],
    );
    // mkfs missing: a PATH without it (dmkit adds only the sbin directories, and erofs-utils
    // installs mkfs.erofs in /usr/bin).
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(common::DMKIT);
    cmd.args(["image", "build", tree, &out, "--fs", "erofs"])
        .env("PATH", empty.path())
        .env("DMKIT_RUN_DIR", env.ws.run.path());
    let r = common::run::Run::new(
        "PATH=(empty) dmkit image build --fs erofs".into(),
        &common::run::output_within(&mut cmd, common::run::DMKIT_LIMIT),
    );
    assert_refused(&r, 1, &[&["mkfs.erofs"], &["erofs-utils"]]);
    assert_eq!(
        listing(env.ws.dir()),
        before,
        "left behind:\n{}",
        r.describe()
    );

    // open
    let (good, _) = env.build("good.img", "erofs", None, &[]);
    let i = env.run(&["image", "inspect", s(&good), "--json"]).ok();
    let inspect: Value = serde_json::from_str(&i.stdout).unwrap();
    let unsigned = env.ws.path("unsigned.img");
    env.run(&["image", "build", tree, s(&unsigned), "--fs", "squashfs"])
        .ok();
    let no_verity = env.ws.path("no-verity.img");
    root_only(&good, &inspect, &no_verity);
    // inspect reports what open would refuse, and fails (exit 2) after the whole report.
    let r = env.run(&["image", "inspect", s(&no_verity)]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        r.stdout.contains("Problem:      no dm-verity hash tree"),
        "{}",
        r.describe()
    );
    assert!(
        r.stderr.contains("no-verity.img: 1 problem found"),
        "{}",
        r.describe()
    );
    let r = env.run(&["image", "inspect", s(&no_verity), "--json"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["problems"].as_array().map(Vec::len), Some(1), "{v}");
    let bare = env.ws.path("bare.raw");
    let (o, l) = partition(&inspect, "root-x86-64");
    extract(&good, o, l, &bare);
    let truncated = env.ws.path("truncated.img");
    let g = std::fs::read(&good).unwrap();
    std::fs::write(&truncated, &g[..g.len() / 2 + 4096]).unwrap();
    let garbage = env.ws.path("garbage.img");
    std::fs::write(&garbage, common::rng::bytes(3, 1 << 20)).unwrap();
    let other = make_ident(env.ws.dir(), "other", "/CN=someone else", RSA);
    let mp = env.ws.path("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let m = s(&mp);
    let cert = s(&env.signer.cert);
    let wrong_root = "00".repeat(32);

    let open_refused = |args: &[&str], code: i32, names: &[&[&str]]| {
        let img = PathBuf::from(args[2]);
        let before = std::fs::read(&img).ok();
        let r = env.run(args);
        if r.code == Some(0) {
            let _ = env.run(&["image", "close", m]);
            panic!("open should have been refused:\n{}", r.describe());
        }
        assert_refused(&r, code, names);
        assert_eq!(std::fs::read(&img).ok(), before, "changed the image");
        assert!(!common::sys::mounted(&mp), "mounted:\n{}", r.describe());
        env.assert_nothing_left(&r.what);
    };
    let no_such = env.ws.s("no-such.img");
    open_refused(&["image", "open", &no_such, m], 1, &[&["no-such.img"]]);
    open_refused(
        &["image", "open", s(&garbage), m],
        1,
        &[&["garbage.img"], &["neither a GPT"]],
    );
    open_refused(
        &["image", "open", s(&no_verity), m],
        1,
        &[&["no-verity.img"], &["without verity"]],
    );
    open_refused(
        &["image", "open", s(&bare), m],
        1,
        &[&["bare.raw"], &["without verity"]],
    );
    open_refused(
        &["image", "open", s(&truncated), m],
        1,
        &[&["truncated.img"]],
    );
    open_refused(
        &["image", "open", s(&good), m, "--cert", s(&other.cert)],
        2,
        &[&["good.img"], &["does not verify"]],
    );
    open_refused(
        &["image", "open", s(&unsigned), m, "--cert", cert],
        2,
        &[&["unsigned.img"], &["not signed"]],
    );
    open_refused(
        &["image", "open", s(&good), m, "--root-hash", &wrong_root],
        2,
        &[&["good.img"], &["--root-hash"]],
    );
    let split = env.ws.path("split.raw");
    env.run(&[
        "image",
        "build",
        tree,
        s(&split),
        "--fs",
        "erofs",
        "--split",
    ])
    .ok();
    std::fs::write(env.ws.path("split.roothash"), format!("{wrong_root}\n")).unwrap();
    open_refused(
        &["image", "open", s(&split), m],
        2,
        &[&["split.raw"], &["does not match the hash tree"]],
    );

    // Open twice at one place: busy, and the first stays as it was; close twice: not open.
    let stack = env.open(&good, "mnt", &[]);
    let r = env.run(&["image", "open", s(&good), m]);
    assert_refused(&r, 5, &[&["mnt"], &["already open"]]);
    assert_eq!(
        std::fs::read(stack.mp.join("etc/hostname")).unwrap(),
        b"dmkit-image-test\n"
    );
    stack.close();
    let r = env.run(&["image", "close", m]);
    assert_refused(&r, 4, &[&["mnt"], &["no image is open"]]);
    env.assert_nothing_left("the end");
}

// ---------------------------------------------------------------------------------------------
// bench image

#[test]
fn bench_image_measures_the_rows_it_is_given() {
    if open_missing() {
        return;
    }
    let env = Env::new();
    let scratch = env.ws.path("bench");
    std::fs::create_dir(&scratch).unwrap();
    let r = env
        .run(&[
            "bench",
            "image",
            "--tree",
            s(&env.tree),
            "--rows",
            "1,4,10",
            "--runs",
            "1",
            "--dir",
            s(&scratch),
            "--json",
        ])
        .ok();
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let files = snapshot(&env.tree)
        .values()
        .filter(|w| w.starts_with("file "))
        .count() as u64;
    let rows = v["rows"].as_array().unwrap();
    // Row 2, the baseline, is always measured.
    let ns: Vec<u64> = rows.iter().map(|r| r["n"].as_u64().unwrap()).collect();
    assert_eq!(ns, [1, 2, 4, 10]);
    for row in rows {
        assert!(row["skipped"].is_null(), "{row}");
        assert_eq!(row["files_read"].as_u64(), Some(files), "{row}");
        assert_eq!(row["read_s"].as_array().unwrap().len(), 1, "{row}");
        assert!(row["fs_size"].as_u64().unwrap() > 0, "{row}");
    }
    // ext4's share is of its blocks in use; gzip makes the text and small files smaller.
    let used = rows[1]["fs_used"].as_u64().unwrap();
    assert!(used < rows[1]["fs_size"].as_u64().unwrap());
    assert!(rows[2]["fs_size"].as_u64().unwrap() < used);
    // Nothing stays: no mount, no export, the scratch directory emptied.
    assert!(listing(&scratch).is_empty(), "{:?}", listing(&scratch));
    env.assert_nothing_left("bench image");
}
