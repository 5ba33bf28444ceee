//! `dmkit image build --fec` and `image open` with FEC, on images of a few MiB:
//!
//! - the parity after the tree in the verity partition is byte-identical to `veritysetup
//!   format --fec-device` over the same partitions (GPT and `--split`), `veritysetup verify`
//!   takes it in place, the libfec fec_header in the partition's last block describes it, and
//!   the image without `--fec` is the same image without the parity;
//! - systemd-dissect reads a `--fec` image as it reads one without;
//! - blocks corrupted within the bound (data, and the tree's top hash block) read back
//!   identical through `image open`, counted in `status`; past the bound (three bad blocks in
//!   one round with 2 roots) only the file holding them gives EIO;
//! - a damaged fec_header is refused in one line naming the image, the partition and the
//!   field; `--no-fec` opens it, `--fec-offset/--fec-roots` say where the parity is, a damaged
//!   primary header falls back to its backup copy, damaged parity is a warning.
//!
//! Opening needs root, loop devices and FUSE; the interop tests need the tools (each checks
//! with tests/common/env.rs: a failure in CI, a skip otherwise).

mod common;

use common::env::{loop_missing, tool_missing};
use common::image_tree::{
    dissect_missing, dissect_ok, partition, snapshot, snapshot_skipping, tree_workspace, BIG_FILE,
};
use common::run::{assert_refused, ok, Run, Workspace};
use serde_json::Value;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn tools_missing() -> bool {
    tool_missing("mkfs.erofs", "erofs-utils") || tool_missing("mksquashfs", "squashfs-tools")
}

struct Env {
    ws: Workspace,
    tree: PathBuf,
}

impl Env {
    fn new() -> Env {
        let (ws, tree) = tree_workspace();
        Env { ws, tree }
    }

    /// An [`Env`] and what its tree holds, for a test that opens images (None: skipped).
    fn for_open() -> Option<(Env, std::collections::BTreeMap<PathBuf, String>)> {
        if tools_missing() || loop_missing() {
            return None;
        }
        let env = Env::new();
        let want = snapshot(&env.tree);
        Some((env, want))
    }

    fn run(&self, args: &[&str]) -> Run {
        self.ws.run.run(args)
    }

    /// `dmkit image build TREE NAME --fs FS --compress none EXTRA... --json`: the image and
    /// its report.
    fn build(&self, name: &str, fs: &str, extra: &[&str]) -> (PathBuf, Value) {
        let img = self.ws.path(name);
        let mut args = vec!["image", "build", s(&self.tree), s(&img), "--fs", fs];
        args.extend(["--compress", "none", "--timestamp", "1700000000", "--json"]);
        args.extend_from_slice(extra);
        let r = self.run(&args).ok();
        (img, serde_json::from_str(&r.stdout).unwrap())
    }

    fn inspect(&self, img: &Path) -> (Run, Value) {
        let r = self.run(&["image", "inspect", s(img), "--json"]);
        let v = serde_json::from_str(&r.stdout).unwrap_or(Value::Null);
        (r, v)
    }

    /// `image open IMAGE MP EXTRA...`; the run (closed by [`Env::close`]).
    fn open(&self, img: &Path, mp: &str, extra: &[&str]) -> (PathBuf, Run) {
        let mp = self.ws.path(mp);
        std::fs::create_dir_all(&mp).unwrap();
        let mut args = vec!["image", "open", s(img), s(&mp)];
        args.extend_from_slice(extra);
        let r = self.run(&args);
        (mp, r)
    }

    fn status(&self, mp: &Path) -> Value {
        let r = self.run(&["image", "status", s(mp), "--json"]).ok();
        serde_json::from_str(&r.stdout).unwrap()
    }

    fn close(&self, mp: &Path) {
        self.run(&["image", "close", s(mp)]).ok();
    }
}

fn read_at(path: &Path, offset: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    b
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(bytes, offset)
        .unwrap();
}

/// XOR every byte of `range` of the 4096-byte block `block` at `base` of `path` with 0x5a.
fn corrupt_block(path: &Path, base: u64, block: u64, range: std::ops::Range<u64>) {
    let at = base + block * 4096 + range.start;
    let b: Vec<u8> = read_at(path, at, range.end - range.start)
        .iter()
        .map(|x| x ^ 0x5a)
        .collect();
    write_at(path, at, &b);
}

/// `veritysetup dump` field.
fn dump_field(hash: &Path, key: &str) -> String {
    ok("veritysetup", &["dump", s(hash)])
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {key} in veritysetup dump"))
}

#[test]
fn parity_is_veritysetups_and_the_fec_header_describes_it() {
    if tools_missing() || tool_missing("veritysetup", "cryptsetup-bin") {
        return;
    }
    let env = Env::new();
    for (fs, roots) in [("erofs", "2"), ("squashfs", "5")] {
        let (plain, plain_report) = env.build(&format!("{fs}-plain.img"), fs, &[]);
        let (img, report) = env.build(&format!("{fs}.img"), fs, &["--fec", "--fec-roots", roots]);
        let root = report["root_hash"].as_str().unwrap();
        assert_eq!(
            root, plain_report["root_hash"],
            "{fs}: --fec changed the tree"
        );
        assert!(plain_report.get("fec").is_none(), "{plain_report}");
        let fec = &report["fec"];
        let (_, i) = env.inspect(&img);
        let (d_off, d_len) = partition(&i, "root-x86-64");
        let (h_off, h_len) = partition(&i, "root-x86-64-verity");
        let (offset, size) = (
            fec["offset"].as_u64().unwrap(),
            fec["size"].as_u64().unwrap(),
        );
        assert_eq!(h_len, offset + size + 4096, "{fs}: {fec}");
        // The image without --fec is this one without the parity: same file system, same tree.
        let (_, pi) = env.inspect(&plain);
        let (pd_off, pd_len) = partition(&pi, "root-x86-64");
        let (ph_off, ph_len) = partition(&pi, "root-x86-64-verity");
        assert_eq!(
            ph_len, offset,
            "{fs}: the tree ends where the parity starts"
        );
        assert_eq!(read_at(&img, d_off, d_len), read_at(&plain, pd_off, pd_len));
        assert_eq!(
            read_at(&img, h_off, offset),
            read_at(&plain, ph_off, ph_len)
        );

        // veritysetup over the same data and tree makes the same parity.
        let data = env.ws.path(&format!("{fs}-data"));
        let tree = env.ws.path(&format!("{fs}-tree"));
        let part = env.ws.path(&format!("{fs}-verity"));
        let theirs = env.ws.path(&format!("{fs}-their.fec"));
        std::fs::write(&data, read_at(&img, d_off, d_len)).unwrap();
        std::fs::write(&tree, read_at(&img, h_off, offset)).unwrap();
        std::fs::write(&part, read_at(&img, h_off, h_len)).unwrap();
        let salt = dump_field(&tree, "Salt:");
        let uuid = dump_field(&tree, "UUID:");
        let out = ok(
            "veritysetup",
            &[
                "format",
                s(&data),
                s(&tree),
                "--fec-device",
                s(&theirs),
                "--fec-roots",
                roots,
                "--salt",
                &salt,
                "--uuid",
                &uuid,
            ],
        );
        assert!(out.contains(root), "{fs}: {out}");
        let parity = read_at(&img, h_off + offset, size);
        assert!(
            std::fs::read(&theirs).unwrap() == parity,
            "{fs}: the parity differs from veritysetup's"
        );
        // veritysetup takes it in place: the partition as hash and FEC device.
        ok(
            "veritysetup",
            &[
                "verify",
                s(&data),
                s(&part),
                root,
                "--fec-device",
                s(&part),
                "--fec-offset",
                &offset.to_string(),
                "--fec-roots",
                roots,
            ],
        );

        // The fec_header: libfec's 60 bytes at the start and at the end of the last block.
        let block = read_at(&img, h_off + h_len - 4096, 4096);
        let h = &block[..60];
        assert_eq!(h, &block[4036..], "{fs}: the backup copy");
        assert!(block[60..4036].iter().all(|&b| b == 0));
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
        assert_eq!(u32_at(0), 0xFECF_ECFE);
        assert_eq!((u32_at(4), u32_at(8)), (0, 60));
        assert_eq!(u32_at(12).to_string(), roots);
        assert_eq!(u64::from(u32_at(16)), size);
        let inp = u64::from_le_bytes(h[20..28].try_into().unwrap());
        assert_eq!(inp, fec["blocks_covered"].as_u64().unwrap() * 4096);
        use sha2::Digest;
        assert_eq!(&h[28..60], sha2::Sha256::digest(&parity).as_slice());
        assert_eq!(i["fec"]["roots"].to_string(), roots, "{i}");
        assert_eq!(i["fec"]["parity_intact"], true, "{i}");

        // --split: the .verity file is the partition.
        let (raw, _) = env.build(
            &format!("{fs}.raw"),
            fs,
            &["--split", "--fec", "--fec-roots", roots],
        );
        let verity = env.ws.path(&format!("{fs}.verity"));
        assert_eq!(std::fs::read(&verity).unwrap(), read_at(&img, h_off, h_len));
        ok(
            "veritysetup",
            &[
                "verify",
                s(&raw),
                s(&verity),
                root,
                "--fec-device",
                s(&verity),
                "--fec-offset",
                &offset.to_string(),
                "--fec-roots",
                roots,
            ],
        );
        let (r, si) = env.inspect(&raw);
        r.assert_ok();
        assert_eq!(si["fec"]["offset"], offset, "{si}");
    }
}

#[test]
fn systemd_dissect_reads_a_fec_image_as_one_without() {
    if tools_missing() || dissect_missing() || loop_missing() {
        return;
    }
    let env = Env::new();
    let rows = |img: &Path, root: &str| -> Vec<String> {
        let v = dissect_ok(img, Some(root));
        v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                [
                    "designator",
                    "partition_uuid",
                    "partition_label",
                    "fstype",
                    "verity",
                ]
                .map(|k| m[k].to_string())
                .join(" ")
            })
            .collect()
    };
    for fs in ["erofs", "squashfs"] {
        let (plain, r) = env.build(&format!("{fs}-plain.img"), fs, &[]);
        let (img, _) = env.build(&format!("{fs}.img"), fs, &["--fec"]);
        let root = r["root_hash"].as_str().unwrap();
        let with = rows(&img, root);
        assert_eq!(with, rows(&plain, root), "{fs}");
        assert!(
            with.iter()
                .any(|r| r.starts_with("\"root\"") && r.ends_with("\"yes\"")),
            "{fs}: systemd does not take the root partition as verity-protected: {with:?}"
        );
        assert!(
            with.iter().any(|r| r.contains("DM_verity_hash")),
            "{fs}: {with:?}"
        );
    }
}

/// The block of `img`'s root partition where the bytes of `needle` begin.
fn block_of(img: &Path, data_offset: u64, needle: &[u8]) -> u64 {
    let all = std::fs::read(img).unwrap();
    let at = all
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the file's bytes are in the image") as u64;
    (at - data_offset) / 4096
}

#[test]
fn corrupted_blocks_read_back_within_the_bound_and_only_their_file_fails_past_it() {
    let Some((env, want)) = Env::for_open() else {
        return;
    };
    let big = std::fs::read(env.tree.join(BIG_FILE)).unwrap();
    for fs in ["erofs", "squashfs"] {
        let (img, report) = env.build(&format!("{fs}.img"), fs, &["--fec"]);
        let fec = &report["fec"];
        let rounds = fec["rs_blocks"].as_u64().unwrap() / 2;
        assert!(rounds >= 3, "{fec}");
        let (_, i) = env.inspect(&img);
        let (d_off, _) = partition(&i, "root-x86-64");
        let (h_off, _) = partition(&i, "root-x86-64-verity");
        let data_blocks = i["verity"]["data_blocks"].as_u64().unwrap();
        // Block-aligned pieces of big.bin: its first whole block in the image.
        let b0 = block_of(&img, d_off, &big[8192..8192 + 4096]);
        let pristine = env.ws.path(&format!("{fs}-pristine.img"));
        std::fs::copy(&img, &pristine).unwrap();

        // Within the bound (2 roots: one bad byte per codeword): blocks in distinct rounds
        // (round = covered index mod rounds), the tree's top block (hash block 1, covered
        // index data_blocks) in another.
        let top_round = data_blocks % rounds;
        let mut picks: Vec<u64> = Vec::new();
        for b in b0..b0 + 2 * rounds {
            let round = b % rounds;
            if round != top_round && picks.iter().all(|p| p % rounds != round) {
                picks.push(b);
            }
        }
        picks.truncate(2);
        assert_eq!(picks.len(), 2);
        for &b in &picks {
            corrupt_block(&img, d_off, b, 0..4096);
        }
        corrupt_block(&img, h_off, 1, 0..64);
        let (mp, r) = env.open(&img, &format!("mnt-{fs}"), &[]);
        r.assert_ok();
        assert!(r.stderr.is_empty(), "{}", r.describe());
        let seen = snapshot(&mp);
        let st = env.status(&mp);
        env.close(&mp);
        assert_eq!(seen, want, "{fs}: the tree through FEC");
        let stats = &st["stats"];
        assert!(stats["fec_corrected"].as_u64().unwrap() >= 3, "{fs}: {st}");
        assert_eq!(stats["fec_uncorrectable"], 0, "{fs}: {st}");
        assert_eq!(st["details"]["fec"]["from"], "fec_header", "{st}");

        // Past the bound: three blocks of big.bin in one round, the same bytes of each (as
        // the kernel, every bad data block of the round is an erasure: 2 roots rebuild two).
        std::fs::copy(&pristine, &img).unwrap();
        for k in 0..3 {
            corrupt_block(&img, d_off, b0 + k * rounds, 100..200);
        }
        let (mp, r) = env.open(&img, &format!("mnt-{fs}"), &[]);
        r.assert_ok();
        let e = std::fs::read(mp.join(BIG_FILE)).err();
        assert_eq!(
            e.as_ref().and_then(|e| e.raw_os_error()),
            Some(libc::EIO),
            "{fs}: {e:?}"
        );
        let seen = snapshot_skipping(&mp, Some(Path::new(BIG_FILE)));
        let text = env.run(&["image", "status", s(&mp)]).ok();
        let st = env.status(&mp);
        env.close(&mp);
        assert_eq!(
            seen,
            snapshot_skipping(&env.tree, Some(Path::new(BIG_FILE))),
            "{fs}: the other files"
        );
        assert!(
            st["stats"]["fec_uncorrectable"].as_u64().unwrap() >= 1,
            "{fs}: {st}"
        );
        assert!(text.stdout.contains("fec fixed:"), "{}", text.describe());
    }
}

#[test]
fn a_damaged_fec_header_is_refused_and_the_options_open_it() {
    let Some((env, want)) = Env::for_open() else {
        return;
    };
    let (img, report) = env.build("fec.img", "erofs", &["--fec"]);
    let offset = report["fec"]["offset"].as_u64().unwrap();
    let (_, i) = env.inspect(&img);
    let (d_off, _) = partition(&i, "root-x86-64");
    let (h_off, h_len) = partition(&i, "root-x86-64-verity");
    let header = h_off + h_len - 4096;
    let backup = h_off + h_len - 60;
    let pristine = std::fs::read(&img).unwrap();

    // The primary copy damaged: the backup is read, with a warning.
    write_at(&img, header + 12, &[9]);
    let (r, v) = env.inspect(&img);
    r.ok();
    assert_eq!(v["fec"]["backup_header"], true, "{v}");
    assert!(v["warnings"][0].as_str().unwrap().contains("roots"), "{v}");
    // Damaged parity: a warning, the parity still used.
    write_at(&img, h_off + offset + 5, &[0xff]);
    let (_, v) = env.inspect(&img);
    assert_eq!(v["fec"]["parity_intact"], false, "{v}");

    // Both copies damaged, each in its own field: refused in one line, nothing mounted.
    std::fs::write(&img, &pristine).unwrap();
    write_at(&img, header + 12, &[25]);
    write_at(&img, backup + 16, &[1, 2, 3, 4]);
    let (mp, r) = env.open(&img, "mnt", &[]);
    assert_refused(
        &r,
        1,
        &[
            &["fec.img"],
            &["partition 2"],
            &["roots: 25"],
            &["fec_size"],
            &["--no-fec"],
        ],
    );
    assert!(env.run(&["image", "status", "--json"]).ok().stdout.trim() == "[]");
    let (r, v) = env.inspect(&img);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        v["problems"][0].as_str().unwrap().contains("fec_header"),
        "{v}"
    );
    // A corrupted block besides: --no-fec opens it (the block's file fails) ...
    corrupt_block(&img, d_off, 3, 0..4096);
    let r = env
        .run(&["image", "open", s(&img), s(&mp), "--no-fec"])
        .ok();
    assert!(r.stderr.is_empty(), "{}", r.describe());
    let st = env.status(&mp);
    assert!(st["details"]["fec"].is_null(), "{st}");
    assert!(st["stats"].get("fec_corrected").is_none(), "{st}");
    env.close(&mp);
    // ... and --fec-roots says where the parity is (after the tree, by default): corrected.
    let r = env
        .run(&["image", "open", s(&img), s(&mp), "--fec-roots", "2"])
        .ok();
    assert!(r.stderr.is_empty(), "{}", r.describe());
    let seen = snapshot(&mp);
    let st = env.status(&mp);
    env.close(&mp);
    assert_eq!(seen, want);
    assert_eq!(st["details"]["fec"]["from"], "options", "{st}");
    assert!(st["stats"]["fec_corrected"].as_u64().unwrap() >= 1, "{st}");

    // A fec_size that lies is named.
    std::fs::write(&img, &pristine).unwrap();
    for at in [header, backup] {
        write_at(&img, at + 16, &(1u32 << 24).to_le_bytes());
    }
    let (mp, r) = env.open(&img, "mnt", &[]);
    assert_refused(&r, 1, &[&["fec_size: 16777216"]]);
    let _ = mp;
}
