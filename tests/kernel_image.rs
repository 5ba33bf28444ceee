//! `dmkit image build` against the real kernel (tests/kernel/): the Debian guest finds the GPT
//! partitions of our EROFS and SquashFS images, takes the root hash from the signature
//! partition's JSON, checks the root partition with `veritysetup verify`, opens it with the
//! kernel's dm-verity (`veritysetup open`), mounts it and reads every file identical to the
//! tree. A copy with one flipped byte of a file opens too, and the kernel fails that file
//! with EIO while the rest reads, as `dmkit image open` does on the host (tests/image.rs).
//! A `build --fec` image opens as it is (the parity after the tree does not disturb the
//! kernel), and one with a wiped block of a file opened with the kernel's FEC from its own
//! verity partition (`--fec-device` partition 2 at the offset its fec_header gives, read with
//! od) reads every file identical, the kernel logging its corrections.
//!
//! One guest boot; images of a few MiB. Skipped (with a message) without the guest's
//! prerequisites or mkfs tools unless `CI` is set.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::env::tool_missing;
use common::image_tree::{make_tree, snapshot, BIG_FILE};
use common::pki::{make_ident, RSA};
use common::run::ok;
use common::{xor_byte, DMKIT};
use harness::{guest, Disk};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The guest's side: for each `NAME FS [CORRUPT]`, the disk's partitions, the root hash from
/// partition 3's JSON, verify, open, mount, and every file's SHA-256 (or, for a corrupted
/// image, which files fail).
const SCRIPT: &str = r#"
set -u
export LC_ALL=C
check() {
    local name=$1 fs=$2 corrupt=${3:-} dev rh
    dev=$(readlink -f /dev/disk/$name)
    for p in 1 2 3; do
        [ -b "$dev$p" ] || { echo "NOPART $name $p"; return 1; }
    done
    rh=$(tr -d '\000' <"${dev}3" | sed -n 's/.*"rootHash" *: *"\([0-9a-f]*\)".*/\1/p')
    echo "ROOTHASH $name $rh"
    if [ -z "$corrupt" ]; then
        veritysetup verify "${dev}1" "${dev}2" "$rh" >&2 && echo "VERIFY $name ok"
    fi
    veritysetup open "${dev}1" "v_$name" "${dev}2" "$rh" >&2 || return 1
    echo "TABLE $name $(dmsetup table "v_$name")"
    mkdir -p "/mnt/$name"
    mount -t "$fs" -o ro "/dev/mapper/v_$name" "/mnt/$name" >&2 || return 1
    (
        cd "/mnt/$name" || exit 1
        find . -type f | sort | while read -r f; do
            if sum=$(sha256sum <"$f" 2>/tmp/err); then
                echo "FILE $name ${sum%% *} $f"
            else
                echo "FAIL $name $f $(cat /tmp/err)"
            fi
        done
        find . -type l | sort | while read -r f; do echo "LINK $name $(readlink "$f") $f"; done
    )
    umount "/mnt/$name"
    veritysetup close "v_$name"
}
# The parity's place from the fec_header in the verity partition's last 4096 bytes:
# fec_size at byte 16 of it, the parity right before the header block.
fec_offset() {
    local part=$1 size fec
    size=$(blockdev --getsize64 "$part")
    fec=$(od -An -tu4 -j $((size - 4096 + 16)) -N4 "$part" | tr -d ' ')
    echo $((size - 4096 - fec))
}
checkfec() {
    local name=$1 fs=$2 dev rh off
    dev=$(readlink -f /dev/disk/$name)
    rh=$(tr -d '\000' <"${dev}3" | sed -n 's/.*"rootHash" *: *"\([0-9a-f]*\)".*/\1/p')
    echo "ROOTHASH $name $rh"
    off=$(fec_offset "${dev}2")
    echo "FECOFFSET $name $off"
    veritysetup open "${dev}1" "v_$name" "${dev}2" "$rh" --fec-device "${dev}2" \
        --fec-offset "$off" --fec-roots 2 >&2 || return 1
    echo "TABLE $name $(dmsetup table "v_$name")"
    mkdir -p "/mnt/$name"
    mount -t "$fs" -o ro "/dev/mapper/v_$name" "/mnt/$name" >&2 || return 1
    (cd "/mnt/$name" && find . -type f | sort | while read -r f; do
        if sum=$(sha256sum <"$f" 2>/tmp/err); then
            echo "FILE $name ${sum%% *} $f"
        else
            echo "FAIL $name $f $(cat /tmp/err)"
        fi
    done
    find . -type l | sort | while read -r f; do echo "LINK $name $(readlink "$f") $f"; done)
    # Only this device has FEC in this boot: "verity-fec: MAJ:MIN: FEC N: corrected K errors".
    echo "FECLOG $name $(dmesg | grep -c 'FEC .*corrected')"
    dmesg | grep 'FEC' | tail -3 >&2
    umount "/mnt/$name"
    veritysetup close "v_$name"
}
rc=0
check erofs erofs || rc=1
check squashfs squashfs || rc=1
check corrupt erofs corrupt || rc=1
check fecplain erofs || rc=1
checkfec fecbad erofs || rc=1
exit $rc
"#;

#[test]
fn kernel_opens_our_erofs_and_squashfs_images_with_dm_verity() {
    let test = "kernel_opens_our_erofs_and_squashfs_images_with_dm_verity";
    if tool_missing("mkfs.erofs", "erofs-utils") || tool_missing("mksquashfs", "squashfs-tools") {
        return;
    }
    let Some(g) = guest(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tree = d.join("tree");
    make_tree(&tree);
    let signer = make_ident(d, "signer", "/CN=dmkit kernel image test", RSA);
    let build = |name: &str, fs: &str, compress: &str, extra: &[&str]| {
        let img = d.join(format!("{name}.img"));
        let out = ok(
            DMKIT,
            &[
                &[
                    "image",
                    "build",
                    s(&tree),
                    s(&img),
                    "--fs",
                    fs,
                    "--compress",
                    compress,
                    "--key",
                    s(&signer.key),
                    "--cert",
                    s(&signer.cert),
                    "--json",
                ][..],
                extra,
            ]
            .concat(),
        );
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        (img, report["root_hash"].as_str().unwrap().to_string())
    };
    // Compressed, so the kernel's decompressors run under verity.
    let (erofs, erofs_root) = build("erofs", "erofs", "lz4hc", &[]);
    let (squashfs, squashfs_root) = build("squashfs", "squashfs", "gzip", &[]);
    // Uncompressed, so a byte of the big file can be found and flipped.
    let (corrupt, corrupt_root) = build("corrupt", "erofs", "none", &[]);
    let (fecplain, fecplain_root) = build("fecplain", "erofs", "lz4hc", &["--fec"]);
    let (fecbad, fecbad_root) = build("fecbad", "erofs", "none", &["--fec"]);
    let big = std::fs::read(tree.join(BIG_FILE)).unwrap();
    let probe = &big[512 << 10..(512 << 10) + 64];
    let at = std::fs::read(&corrupt)
        .unwrap()
        .windows(probe.len())
        .position(|w| w == probe)
        .expect("the big file's bytes in the image");
    xor_byte(&corrupt, at as u64 + 3, 0x10);
    // A whole block of the big file wiped: one bad byte in each of its round's codewords,
    // within what 2 roots correct.
    let at = std::fs::read(&fecbad)
        .unwrap()
        .windows(probe.len())
        .position(|w| w == probe)
        .expect("the big file's bytes in the --fec image") as u64;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&fecbad)
            .unwrap();
        f.write_all_at(&[0u8; 4096], at.div_ceil(4096) * 4096)
            .unwrap();
    }

    let run = g.run(
        SCRIPT,
        &[
            Disk::ro("erofs", &erofs),
            Disk::ro("squashfs", &squashfs),
            Disk::ro("corrupt", &corrupt),
            Disk::ro("fecplain", &fecplain),
            Disk::ro("fecbad", &fecbad),
        ],
        Duration::from_secs(300),
    );
    run.assert_ok("image check in the guest");
    let out = run.out();
    let lines = |prefix: &str| -> BTreeSet<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
            .collect()
    };

    // What the host tree holds, as the guest prints it.
    let mut files = BTreeSet::new();
    let mut links = BTreeSet::new();
    for (rel, what) in snapshot(&tree) {
        let mut w = what.split(' ');
        match w.next() {
            Some("file") => files.insert((w.next().unwrap().to_string(), rel)),
            Some("link") => links.insert((w.next().unwrap().to_string(), rel)),
            _ => false,
        };
    }
    let expect = |name: &str, skip: Option<&str>| {
        let f: BTreeSet<String> = files
            .iter()
            .filter(|(_, rel)| Some(s(rel)) != skip)
            .map(|(h, rel)| format!("{name} {h} ./{}", rel.display()))
            .collect();
        let l: BTreeSet<String> = links
            .iter()
            .map(|(t, rel)| format!("{name} {t} ./{}", rel.display()))
            .collect();
        (f, l)
    };
    let got_files = lines("FILE ");
    let got_links = lines("LINK ");
    for (name, root) in [
        ("erofs", &erofs_root),
        ("squashfs", &squashfs_root),
        ("corrupt", &corrupt_root),
        ("fecplain", &fecplain_root),
        ("fecbad", &fecbad_root),
    ] {
        assert!(
            lines("ROOTHASH ").contains(&format!("{name} {root}")),
            "{name}: the guest read another root hash from the signature partition:\n{out}"
        );
        let table = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("TABLE {name} ")))
            .unwrap_or_else(|| panic!("{name}: no dm table:\n{out}"));
        assert!(
            table.contains(" verity 1 ") && table.contains(root.as_str()),
            "{name}: not a dm-verity table over root hash {root}: {table}"
        );
        let skip = (name == "corrupt").then_some(BIG_FILE);
        let (want_files, want_links) = expect(name, skip);
        let mine = |set: &BTreeSet<String>| -> BTreeSet<String> {
            set.iter()
                .filter(|l| l.starts_with(&format!("{name} ")))
                .cloned()
                .collect()
        };
        assert_eq!(mine(&got_files), want_files, "{name}: files in the guest");
        assert_eq!(mine(&got_links), want_links, "{name}: links in the guest");
    }
    let fec_table = out
        .lines()
        .find_map(|l| l.strip_prefix("TABLE fecbad "))
        .unwrap_or_default();
    assert!(
        fec_table.contains("use_fec_from_device") && fec_table.contains("fec_roots 2"),
        "fecbad: the kernel's table has no FEC: {fec_table}"
    );
    let corrected: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("FECLOG fecbad "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        corrected >= 1,
        "fecbad: the kernel logged no FEC correction:\n{out}\n{}",
        run.stderr
    );
    for name in ["erofs", "squashfs", "fecplain"] {
        assert!(
            lines("VERIFY ").contains(&format!("{name} ok")),
            "{name}: veritysetup verify in the guest:\n{out}\n{}",
            run.stderr
        );
    }
    for l in out
        .lines()
        .filter(|l| l.starts_with("TABLE ") || l.starts_with("FAIL "))
    {
        eprintln!("guest: {l}");
    }
    // The flipped byte: the kernel fails exactly the file holding it, with EIO.
    let fails = lines("FAIL ");
    assert_eq!(fails.len(), 1, "failures in the guest: {fails:?}");
    let f = fails.iter().next().unwrap();
    assert!(
        f.starts_with(&format!("corrupt ./{BIG_FILE} ")) && f.contains("Input/output error"),
        "{f}"
    );
}
