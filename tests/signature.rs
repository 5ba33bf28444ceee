//! The signature probe behind the safety prompts (`dmkit::block::signature`), on images made by
//! the real tools, against what `blkid -p` says of the same image: every filesystem, header and
//! partition table a prompt names is named as blkid names it, and a wiped image holds nothing.

mod common;

use common::env::tools_missing;
use common::run::{ok, Workspace};
use dmkit::block::signature::{probe_file, SignatureKind};
use std::fs;

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// What `blkid -p` says `img` holds: its TYPE (superblock) or PTTYPE (partition table), or
/// nothing (blkid exits 2 when it finds nothing).
fn blkid(img: &str) -> Option<(String, SignatureKind)> {
    let out = common::run::output("blkid", &["-p", "-o", "export", img]);
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
    };
    field("TYPE")
        .map(|t| (t, SignatureKind::Superblock))
        .or_else(|| field("PTTYPE").map(|t| (t, SignatureKind::PartitionTable)))
}

/// The probe finds exactly what blkid finds on `img`, and that is `want`.
fn same_as_blkid(img: &str, want: &str) {
    let f = fs::File::open(img).unwrap();
    let ours: Vec<(String, SignatureKind)> = probe_file(&f, 0)
        .unwrap()
        .into_iter()
        .map(|s| (s.name.to_string(), s.kind))
        .collect();
    let theirs = blkid(img);
    assert_eq!(
        theirs.as_ref().map(|(t, _)| t.as_str()),
        Some(want),
        "blkid on {img}"
    );
    assert_eq!(ours, theirs.into_iter().collect::<Vec<_>>(), "{img}");
}

#[test]
fn filesystems_made_by_mkfs() {
    if tools_missing(&[
        ("blkid", "util-linux"),
        ("mkfs.ext4", "e2fsprogs"),
        ("mkswap", "util-linux"),
        ("mkfs.vfat", "dosfstools"),
        ("mksquashfs", "squashfs-tools"),
        ("mkfs.erofs", "erofs-utils"),
    ]) {
        return;
    }
    let w = Workspace::new();
    for (fs_type, tool, args) in [
        ("ext2", "mkfs.ext2", &["-q", "-F"][..]),
        ("ext3", "mkfs.ext3", &["-q", "-F"]),
        ("ext4", "mkfs.ext4", &["-q", "-F"]),
        ("swap", "mkswap", &[]),
    ] {
        let img = w.sparse(&format!("{fs_type}.img"), 8 << 20);
        ok(tool, &[args, &[img.as_str()]].concat());
        same_as_blkid(&img, fs_type);
    }
    for bits in ["12", "16", "32"] {
        let img = w.s(&format!("fat{bits}.img"));
        ok("mkfs.vfat", &["-F", bits, "-C", &img, "40000"]);
        same_as_blkid(&img, "vfat");
    }
    let tree = w.path("tree");
    fs::create_dir(&tree).unwrap();
    fs::write(tree.join("hello"), b"hello\n").unwrap();
    let tree = w.s("tree");
    let sq = w.s("squash.img");
    ok("mksquashfs", &[&tree, &sq, "-quiet", "-noappend"]);
    same_as_blkid(&sq, "squashfs");
    let erofs = w.s("erofs.img");
    ok("mkfs.erofs", &["--quiet", &erofs, &tree]);
    same_as_blkid(&erofs, "erofs");
    // Wiped: nothing for either.
    let zero = w.sparse("zero.img", 8 << 20);
    assert!(blkid(&zero).is_none());
    assert!(probe_file(&fs::File::open(&zero).unwrap(), 0)
        .unwrap()
        .is_empty());
}

#[test]
fn luks_verity_and_integrity_headers() {
    if tools_missing(&[
        ("blkid", "util-linux"),
        ("cryptsetup", "cryptsetup-bin"),
        ("veritysetup", "cryptsetup-bin"),
    ]) {
        return;
    }
    let w = Workspace::new();
    fs::write(w.path("pass"), b"pw").unwrap();
    let pass = w.s("pass");
    for t in ["luks1", "luks2"] {
        let img = w.sparse(&format!("{t}.img"), 16 << 20);
        ok(
            "cryptsetup",
            &[
                &["luksFormat", "-q", "--type", t][..],
                &FAST,
                &[&img, &pass],
            ]
            .concat(),
        );
        same_as_blkid(&img, "crypto_LUKS");
    }
    // Only the secondary LUKS2 header left, 1 MiB in (past the head the probe reads at once).
    let img = w.sparse("secondary.img", 16 << 20);
    ok(
        "cryptsetup",
        &[
            &["luksFormat", "-q", "--luks2-metadata-size", "1m"][..],
            &["--luks2-keyslots-size", "2m"],
            &FAST,
            &[&img, &pass],
        ]
        .concat(),
    );
    let mut bytes = fs::read(&img).unwrap();
    bytes[..4096].fill(0);
    fs::write(&img, &bytes).unwrap();
    same_as_blkid(&img, "crypto_LUKS");
    let data = w.sparse("data.img", 4 << 20);
    let hash = w.s("hash.img");
    ok("veritysetup", &["format", &data, &hash]);
    same_as_blkid(&hash, "DM_verity_hash");
    // integritysetup needs device-mapper to format; dmkit writes the same superblock.
    let img = w.sparse("integrity.img", 16 << 20);
    ok(
        common::DMKIT,
        &["integrity", "format", "-q", "--no-wipe", &img],
    );
    same_as_blkid(&img, "DM_integrity");
}

#[test]
fn partition_tables_made_by_sfdisk() {
    if tools_missing(&[("blkid", "util-linux"), ("sfdisk", "fdisk")]) {
        return;
    }
    let w = Workspace::new();
    for label in ["dos", "gpt"] {
        let img = w.sparse(&format!("{label}.img"), 8 << 20);
        let mut child = std::process::Command::new("sfdisk")
            .args(["-q", &img])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("label: {label}\n,4M,L\n").as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "sfdisk {label}");
        same_as_blkid(&img, label);
    }
}
