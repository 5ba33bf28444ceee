//! The real kernel as test oracle: a stock Debian kernel booted under QEMU (TCG) reads what
//! dmkit wrote (tests/kernel/run-guest.sh; the Rust side is tests/kernel/harness.rs).
//!
//! - `harness_*`: output comes back binary-clean, exit statuses and read-only/read-write disks
//!   work, and a dead or hung guest is reported with its console tail.
//! - `dm_verity_*`: images formatted by `dmkit verity format` over a parameter matrix open
//!   with the guest's `veritysetup open` and read back identical; corrupted data and hash
//!   blocks give EIO at the same blocks in the guest as through `dmkit verity open` on the
//!   host; a wrong hash byte, a wrong salt and a wrong root hash are refused by the kernel.
//! - `fsverity_*`: the guest's `fsverity measure` after `fsverity enable` equals
//!   `dmkit fsverity digest` (SHA-256 and SHA-512, salts, sizes up to multi-level trees); a
//!   signature by `dmkit fsverity sign` is accepted with `fs.verity.require_signatures=1` and
//!   our certificate in the `.fs-verity` keyring, and refused on other content, from an
//!   untrusted key, or missing.
//! - `guest_formats_*`: dm-integrity and LUKS2 images formatted in the guest come back to
//!   the host with a known payload (scaffolding for the integrity and LUKS2 interop tests).
//!
//! Each group is one guest boot. Skipped with a message when qemu or the kernel package is
//! missing, except in CI (`CI` set), where that is a failure.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::env::{is_root, missing};
use common::pki::{make_ident, RSA};
use common::rng::bytes;
use common::run::{ok, RunDir};
use common::verity_case::VerityCase as VCase;
use common::{xor_byte, DMKIT};
use harness::{format_in_guest, guest, sh_quote, Bundle, Disk, FormatJob, GuestFormat};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(data))
}

// ---------------------------------------------------------------------------------------------
// The harness itself

#[test]
fn harness_output_status_and_disks() {
    let Some(g) = guest("harness_output_status_and_disks") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro.img");
    let rw = dir.path().join("rw.img");
    let ro_data = bytes(1, 1 << 20);
    std::fs::write(&ro, &ro_data).unwrap();
    std::fs::write(&rw, vec![0u8; 1 << 20]).unwrap();
    // Every byte value, a NUL-laden random MiB, then the ro disk: all must come back exact.
    let script = r#"set -e
for i in $(seq 0 255); do printf "\\$(printf %03o $i)"; done
head -c 1048576 /dev/disk/ro
echo "to stderr" >&2
sha256sum /dev/disk/ro >&2
if dd if=/dev/zero of=/dev/disk/ro bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
    echo "read-only disk was writable" >&2; exit 3
fi
printf 'written by the guest' | dd of=/dev/disk/rw bs=512 seek=8 conv=notrunc,fsync status=none
exit 42
"#;
    let run = g.run(
        script,
        &[Disk::ro("ro", &ro), Disk::rw("rw", &rw)],
        Duration::from_secs(120),
    );
    assert_eq!(run.status, 42, "exit status:\n{}", run.stderr);
    let mut want: Vec<u8> = (0..=255u8).collect();
    want.extend_from_slice(&ro_data);
    assert_eq!(run.stdout.len(), want.len(), "stdout length");
    assert!(run.stdout == want, "stdout is not binary-identical");
    assert!(run.stderr.contains("to stderr"), "stderr: {}", run.stderr);
    assert!(
        run.stderr.contains(&sha256_hex(&ro_data)),
        "guest sha256 of the disk: {}",
        run.stderr
    );
    let back = std::fs::read(&rw).unwrap();
    assert_eq!(&back[4096..4096 + 20], b"written by the guest");
    eprintln!("harness: boot and run in {:.1}s", run.elapsed.as_secs_f64());
}

#[test]
fn harness_reports_dead_and_hung_guests() {
    let Some(g) = guest("harness_reports_dead_and_hung_guests") else {
        return;
    };
    // A kernel crash: status 125 and the console tail with the panic.
    let run = g.run(
        "echo partial; echo c > /proc/sysrq-trigger; sleep 100\n",
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(run.status, 125, "{}", run.stderr);
    assert!(
        run.stderr.contains("guest died") && run.stderr.contains("console tail"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Kernel panic") || run.stderr.contains("sysrq"),
        "the console tail should show the crash:\n{}",
        run.stderr
    );
    assert_eq!(
        run.out(),
        "partial\n",
        "output before the crash still arrives"
    );
    // A hang: killed at the timeout, reported as such.
    let run = g.run("sleep 1000\n", &[], Duration::from_secs(15));
    assert_eq!(run.status, 125, "{}", run.stderr);
    assert!(run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(40), "{:?}", run.elapsed);
}

// ---------------------------------------------------------------------------------------------
// dm-verity: dmkit formats, the kernel reads

/// The parameter matrix: every hash, block sizes the kernel takes (512..4096), both hash
/// types, with and without superblock, salts of 0, 1, 32 and 256 bytes, hash area in its own
/// file or after the data.
fn verity_matrix() -> Vec<VCase> {
    let mut cases = Vec::new();
    let hashes = ["sha256", "sha1", "sha512"];
    let sizes = [512u64, 1024, 2048, 4096];
    let salts = [0usize, 1, 32, 256, 7];
    for i in 0..14u64 {
        let hash = hashes[(i % 3) as usize];
        let data_block_size = sizes[(i % 4) as usize];
        let hash_block_size = sizes[((i / 2 + 1) % 4) as usize];
        let blocks = 300 + 97 * i;
        let data_size = blocks * data_block_size + (i * 37) % data_block_size;
        let salt_len = salts[(i % 5) as usize];
        let salt = if salt_len == 0 {
            "-".to_string()
        } else {
            hex::encode(bytes(100 + i, salt_len))
        };
        let superblock = i % 3 != 2;
        let hash_offset = (i % 4 == 3).then(|| {
            let align = if superblock { 512 } else { hash_block_size };
            data_size.div_ceil(align) * align + align * (i % 2)
        });
        cases.push(VCase {
            name: format!("m{i}"),
            hash,
            data_block_size,
            hash_block_size,
            data_size,
            salt,
            hash_type: ((i / 3) % 2) as u32,
            superblock,
            hash_offset,
        });
    }
    cases
}

/// Formats a case with dmkit; returns (data file, hash file, root hash hex).
fn verity_format(dir: &Path, c: &VCase) -> (PathBuf, PathBuf, String) {
    let data = dir.join(format!("{}.data", c.name));
    std::fs::write(&data, bytes(c.data_size, c.data_size as usize)).unwrap();
    let hash = if c.hash_offset.is_some() {
        data.clone()
    } else {
        dir.join(format!("{}.hash", c.name))
    };
    let root_file = dir.join(format!("{}.root", c.name));
    let mut args: Vec<String> = vec!["verity".into(), "format".into()];
    args.extend(c.tree_options());
    args.push(format!("--root-hash-file={}", root_file.display()));
    args.push(data.display().to_string());
    args.push(hash.display().to_string());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(DMKIT, &a);
    let root = std::fs::read_to_string(&root_file)
        .unwrap()
        .trim()
        .to_string();
    (data, hash, root)
}

fn flip_byte(path: &Path, offset: u64) {
    xor_byte(path, offset, 0x5a);
}

/// One image for the guest to check.
struct VImage {
    case: VCase,
    data: PathBuf,
    hash: PathBuf,
    /// Root hash given to the guest (may be deliberately wrong).
    root: String,
    /// Open options given to the guest (may be deliberately wrong).
    open_options: Vec<String>,
    /// Scan every block for EIO (small images only).
    scan: bool,
}

/// Reads every data block of an image through `dmkit verity open` on the host; returns the
/// blocks that fail with EIO, or `None` when this host cannot serve FUSE.
fn dmkit_open_eio_blocks(img: &VImage, name: &str) -> Option<BTreeSet<u64>> {
    use std::os::unix::fs::FileExt;
    if !is_root() || !Path::new("/dev/fuse").exists() {
        missing("the host-side check through dmkit verity open needs root and /dev/fuse");
        return None;
    }
    let run_dir = RunDir::new();
    let mut args: Vec<String> = vec![
        "verity".into(),
        "open".into(),
        img.data.display().to_string(),
        name.into(),
        img.hash.display().to_string(),
        img.root.clone(),
    ];
    args.extend(img.open_options.iter().cloned());
    let out = run_dir.ok(&args);
    run_dir.track(name);
    let served = out.lines().next().unwrap().trim().to_string();
    let bs = img.case.data_block_size;
    let mut eio = BTreeSet::new();
    {
        let f = std::fs::File::open(&served).unwrap();
        let mut buf = vec![0u8; bs as usize];
        for b in 0..img.case.data_blocks() {
            match f.read_exact_at(&mut buf, b * bs) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                    eio.insert(b);
                }
                Err(e) => panic!("{served}: block {b}: {e}"),
            }
        }
    }
    run_dir.close(name);
    Some(eio)
}

/// The guest's verdict on one image.
#[derive(Debug, Default)]
struct Verdict {
    open: String,
    read: String,
    verify: String,
    eio: BTreeSet<u64>,
}

fn parse_verdicts(out: &str) -> std::collections::BTreeMap<String, Verdict> {
    let mut m = std::collections::BTreeMap::new();
    for line in out.lines() {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("RESULT") => {
                let name = w.next().unwrap().to_string();
                let v: &mut Verdict = m.entry(name).or_default();
                for kv in w {
                    let (k, val) = kv.split_once('=').unwrap();
                    match k {
                        "open" => v.open = val.into(),
                        "read" => v.read = val.into(),
                        "verify" => v.verify = val.into(),
                        _ => {}
                    }
                }
            }
            Some("EIO") => {
                let name = w.next().unwrap().to_string();
                let v: &mut Verdict = m.entry(name).or_default();
                v.eio.extend(w.map(|b| b.parse::<u64>().unwrap()));
            }
            _ => {}
        }
    }
    m
}

const VERITY_GUEST_FUNCS: &str = r#"
# check NAME DATA HASH ROOT BYTES BS SCAN OPTIONS...: open with veritysetup, compare with the
# data, verify offline, and (SCAN=1) read every block alone to list those giving EIO.
check() {
    local name=$1 data=$2 hash=$3 root=$4 bytes=$5 bs=$6 scan=$7
    shift 7
    local d h open=ok read=ok verify=ok
    d=$(attach "$data")
    if [ "$hash" = "$data" ]; then h=$d; else h=$(attach "$hash"); fi
    if veritysetup verify "$d" "$h" "$root" "$@" >/dev/null 2>&1; then verify=ok; else verify=fail; fi
    if ! veritysetup open "$d" "v_$name" "$h" "$root" "$@" 2>/tmp/err.$name; then
        open=fail; read=none
        sed "s/^/$name: /" /tmp/err.$name >&2
    else
        local size
        size=$(blockdev --getsize64 /dev/mapper/v_$name)
        if [ "$size" != "$bytes" ]; then read=size-$size
        elif cmp -n "$bytes" /dev/mapper/v_$name "$d" >/dev/null 2>/tmp/cmp.$name; then read=ok
        elif grep -q 'Input/output error' /tmp/cmp.$name; then read=eio
        else read=diff; fi
        if [ "$scan" = 1 ]; then
            local n=$((bytes / bs)) i list=""
            for ((i = 0; i < n; i++)); do
                dd if=/dev/mapper/v_$name of=/dev/null bs=$bs skip=$i count=1 iflag=direct \
                    status=none 2>/dev/null || list="$list $i"
            done
            echo "EIO $name$list"
        fi
        veritysetup close "v_$name"
    fi
    echo "RESULT $name open=$open read=$read verify=$verify"
    [ "$hash" = "$data" ] || losetup -d "$h"
    losetup -d "$d"
}
"#;

#[test]
fn dm_verity_images_open_in_the_kernel() {
    let Some(g) = guest("dm_verity_images_open_in_the_kernel") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<VImage> = Vec::new();
    for c in verity_matrix() {
        let (data, hash, root) = verity_format(dir.path(), &c);
        let open_options = c.open_options();
        images.push(VImage {
            case: c,
            data,
            hash,
            root,
            open_options,
            scan: false,
        });
    }

    // Deliberately wrong images, each of which the kernel must refuse.
    let base = VCase {
        name: "bad".into(),
        hash: "sha256",
        data_block_size: 4096,
        hash_block_size: 4096,
        data_size: 256 * 4096,
        salt: hex::encode(bytes(7, 32)),
        hash_type: 1,
        superblock: true,
        hash_offset: None,
    };
    // One corrupted data block: EIO at that block only.
    let c = VCase {
        name: "data_byte".into(),
        ..base.clone()
    };
    let (data, hash, root) = verity_format(dir.path(), &c);
    flip_byte(&data, 77 * 4096 + 1000);
    images.push(VImage {
        open_options: c.open_options(),
        case: c,
        data,
        hash,
        root,
        scan: true,
    });
    // One wrong hash byte in the last level-0 hash block: EIO for the blocks it covers.
    let c = VCase {
        name: "hash_byte".into(),
        ..base.clone()
    };
    let (data, hash, root) = verity_format(dir.path(), &c);
    let hash_len = std::fs::metadata(&hash).unwrap().len();
    flip_byte(&hash, hash_len - 4096 + 5);
    images.push(VImage {
        open_options: c.open_options(),
        case: c,
        data,
        hash,
        root,
        scan: true,
    });
    // 1024-byte data blocks, one wrong hash byte in the last hash block (guest only: the host
    // page cache reads whole pages through FUSE).
    let c = VCase {
        name: "hash_byte_1k".into(),
        data_block_size: 1024,
        hash_block_size: 1024,
        data_size: 600 * 1024,
        ..base.clone()
    };
    let (data, hash, root) = verity_format(dir.path(), &c);
    let hash_len = std::fs::metadata(&hash).unwrap().len();
    flip_byte(&hash, hash_len - 1024 + 9);
    images.push(VImage {
        open_options: c.open_options(),
        case: c,
        data,
        hash,
        root,
        scan: true,
    });
    // A wrong salt (no superblock: the salt comes from the command line).
    let c = VCase {
        name: "wrong_salt".into(),
        superblock: false,
        ..base.clone()
    };
    let (data, hash, root) = verity_format(dir.path(), &c);
    let wrong = VCase {
        salt: hex::encode(bytes(8, 32)),
        ..c.clone()
    };
    images.push(VImage {
        open_options: wrong.open_options(),
        case: c,
        data,
        hash,
        root,
        scan: false,
    });
    // A wrong root hash (one digit changed).
    let c = VCase {
        name: "wrong_root".into(),
        ..base.clone()
    };
    let (data, hash, mut root) = verity_format(dir.path(), &c);
    let first = if root.starts_with('0') { "1" } else { "0" };
    root.replace_range(0..1, first);
    images.push(VImage {
        open_options: c.open_options(),
        case: c,
        data,
        hash,
        root,
        scan: false,
    });
    // The control: the same parameters, untouched, must pass.
    let c = VCase {
        name: "control".into(),
        ..base.clone()
    };
    let (data, hash, root) = verity_format(dir.path(), &c);
    images.push(VImage {
        open_options: c.open_options(),
        case: c,
        data,
        hash,
        root,
        scan: true,
    });

    let mut bundle = Bundle::default();
    let mut script = String::from("set -u\n");
    for img in &images {
        bundle.add(&format!("{}.d", img.case.name), &img.data);
        if img.hash != img.data {
            bundle.add(&format!("{}.h", img.case.name), &img.hash);
        }
    }
    script.push_str(&bundle.prelude());
    script.push_str(VERITY_GUEST_FUNCS);
    for img in &images {
        let c = &img.case;
        let hash_entry = if img.hash != img.data {
            format!("{}.h", c.name)
        } else {
            format!("{}.d", c.name)
        };
        let opts: Vec<String> = img.open_options.iter().map(|o| sh_quote(o)).collect();
        writeln!(
            script,
            "check {} {}.d {} {} {} {} {} {}",
            c.name,
            c.name,
            hash_entry,
            img.root,
            c.data_blocks() * c.data_block_size,
            c.data_block_size,
            u8::from(img.scan),
            opts.join(" ")
        )
        .unwrap();
    }
    let bundle_disk = bundle.write(&dir.path().join("bundle.img"));
    let run = g.run(&script, &[bundle_disk], Duration::from_secs(400));
    run.assert_ok("dm-verity guest script");
    let out = run.out();
    let verdicts = parse_verdicts(&out);
    let ctx = || format!("guest said:\n{out}\n{}", run.stderr);

    let mut failures = Vec::new();
    for img in &images {
        let name = &img.case.name;
        let Some(v) = verdicts.get(name) else {
            panic!("no verdict for {name}; {}", ctx());
        };
        let good = !matches!(
            name.as_str(),
            "data_byte" | "hash_byte" | "hash_byte_1k" | "wrong_salt" | "wrong_root"
        );
        if good {
            if v.open != "ok" || v.read != "ok" || v.verify != "ok" || !v.eio.is_empty() {
                failures.push(format!("{name} ({:?}): {v:?}", img.case));
            }
            continue;
        }
        // Refused: veritysetup verify fails, and the device cannot be opened or reads EIO.
        let refused = v.verify == "fail" && (v.open == "fail" || v.read == "eio");
        if !refused {
            failures.push(format!("{name}: the kernel did not refuse it: {v:?}"));
        }
    }
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), ctx());

    // EIO exactly where the corruption is, in the guest and through dmkit on the host.
    let expect: [(&str, BTreeSet<u64>); 3] = [
        ("data_byte", [77].into()),
        // 256 blocks, 128 SHA-256 digests per hash block: the last covers 128..256.
        ("hash_byte", (128..256).collect()),
        // 600 blocks, 32 digests per 1 KiB hash block: the last covers 576..600.
        ("hash_byte_1k", (576..600).collect()),
    ];
    for (name, want) in &expect {
        assert_eq!(&verdicts[*name].eio, want, "guest EIO blocks of {name}");
    }
    for name in ["data_byte", "hash_byte", "control"] {
        let img = images.iter().find(|i| i.case.name == name).unwrap();
        if let Some(host) = dmkit_open_eio_blocks(img, &format!("kt-{name}-{}", std::process::id()))
        {
            assert_eq!(
                host, verdicts[name].eio,
                "{name}: EIO blocks through dmkit verity open (left) and in the kernel (right)"
            );
        }
    }
    eprintln!(
        "dm-verity: {} images checked by the kernel in {:.1}s",
        images.len(),
        run.elapsed.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// fs-verity: dmkit's digests and signatures, the kernel's measure and signature check

/// The (hash, salt) variants enabled in the guest.
const FSV_VARIANTS: [(&str, &str); 4] = [
    ("sha256", ""),
    ("sha512", ""),
    ("sha256", "5a"),
    (
        "sha512",
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    ),
];

/// A key, its certificate (PEM) and the certificate in DER, in `dir/NAME.*`.
fn make_cert(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let id = make_ident(dir, name, &format!("/CN=dmkit test {name}"), RSA);
    (id.key, id.cert, id.cert_der)
}

#[test]
fn fsverity_digests_and_signatures_in_the_kernel() {
    let Some(g) = guest("fsverity_digests_and_signatures_in_the_kernel") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Sizes: empty, one byte, block boundaries, two levels (more than 128 SHA-256 / 64 SHA-512
    // blocks), three levels for SHA-512 (more than 64 * 64 blocks).
    let sizes: [usize; 9] = [
        0,
        1,
        4095,
        4096,
        4097,
        65 * 4096,
        129 * 4096 + 3,
        300_000,
        4097 * 4096,
    ];
    let mut expected: Vec<(String, String)> = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let data = bytes(i as u64 + 1000, size);
        for (j, (alg, salt)) in FSV_VARIANTS.iter().enumerate() {
            // The 16 MiB file only once, to keep the image small.
            if size > 1 << 20 && j != 1 {
                continue;
            }
            let name = format!("f{i}_{j}");
            let path = src.join(&name);
            std::fs::write(&path, &data).unwrap();
            let mut args = vec!["fsverity", "digest", s(&path), "--compact"];
            let alg_arg = format!("--hash-alg={alg}");
            let salt_arg = format!("--salt={salt}");
            args.push(&alg_arg);
            if !salt.is_empty() {
                args.push(&salt_arg);
            }
            let ours = ok(DMKIT, &args);
            expected.push((name, format!("{alg}:{}", ours.trim())));
        }
    }
    // Signatures: our certificate goes into the .fs-verity keyring; "other" is not trusted.
    let (key, cert, der) = make_cert(dir.path(), "trusted");
    let (okey, ocert, _) = make_cert(dir.path(), "other");
    std::fs::copy(&der, src.join("cert.der")).unwrap();
    let signed = bytes(1, 50_000);
    for (name, content) in [
        ("signed256", &signed),
        ("signed512", &signed),
        ("othercontent", &bytes(2, 50_000)),
        ("untrusted", &signed),
        ("unsigned", &signed),
    ] {
        std::fs::write(src.join(name), content).unwrap();
    }
    let sign = |file: &str, sig: &str, alg: &str, key: &Path, cert: &Path| {
        ok(
            DMKIT,
            &[
                "fsverity",
                "sign",
                s(&src.join(file)),
                s(&src.join(sig)),
                "--key",
                s(key),
                "--cert",
                s(cert),
                &format!("--hash-alg={alg}"),
            ],
        );
    };
    sign("signed256", "signed256.sig", "sha256", &key, &cert);
    sign("signed512", "signed512.sig", "sha512", &key, &cert);
    sign("untrusted", "untrusted.sig", "sha256", &okey, &ocert);

    let img = dir.path().join("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    ok(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-O",
            "verity",
            "-d",
            s(&src),
            s(&img),
        ],
    );

    let mut script = String::from("set -u\nmount -t ext4 /dev/disk/fs /mnt || exit 10\ncd /mnt\n");
    for (name, _) in &expected {
        let (i, j) = name[1..].split_once('_').unwrap();
        let _ = i;
        let (alg, salt) = FSV_VARIANTS[j.parse::<usize>().unwrap()];
        let salt_opt = if salt.is_empty() {
            String::new()
        } else {
            format!("--salt={salt}")
        };
        writeln!(
            script,
            "fsverity enable --hash-alg={alg} {salt_opt} {name} || echo \"ENABLE-FAILED {name}\"\n\
             echo \"MEASURE $(fsverity measure {name})\"\n\
             cat {name} >/dev/null || echo \"READ-FAILED {name}\""
        )
        .unwrap();
    }
    script.push_str(
        r#"
# From here on, only signed files may be enabled.
keyctl padd asymmetric '' %keyring:.fs-verity </mnt/cert.der >/dev/null || exit 11
echo 1 >/proc/sys/fs/verity/require_signatures || exit 12
sig() { # NAME SIGFILE ALG
    local opt=""
    [ -n "$2" ] && opt="--signature=$2"
    if fsverity enable --hash-alg=$3 $opt "$1" 2>/tmp/err; then
        echo "SIGN $1 accepted $(fsverity measure "$1")"
        cat "$1" >/dev/null || echo "READ-FAILED $1"
    else
        echo "SIGN $1 refused $(tr '\n' ' ' </tmp/err)"
    fi
}
sig signed256 signed256.sig sha256
sig signed512 signed512.sig sha512
sig othercontent signed256.sig sha256
sig untrusted untrusted.sig sha256
sig unsigned "" sha256
cd /
umount /mnt
"#,
    );
    let run = g.run(&script, &[Disk::rw("fs", &img)], Duration::from_secs(400));
    run.assert_ok("fs-verity guest script");
    let out = run.out();
    let ctx = || format!("guest said:\n{out}\n{}", run.stderr);
    assert!(
        !out.contains("FAILED"),
        "enable or read failed in the guest; {}",
        ctx()
    );
    for (name, digest) in &expected {
        let want = format!("MEASURE {digest} {name}");
        assert!(
            out.lines().any(|l| l == want),
            "{name}: the kernel's measure differs from dmkit's digest {digest}; {}",
            ctx()
        );
    }
    let verdict = |name: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("SIGN {name} ")))
            .unwrap_or_else(|| panic!("no verdict for {name}; {}", ctx()))
            .to_string()
    };
    for (name, alg) in [("signed256", "sha256"), ("signed512", "sha512")] {
        let v = verdict(name);
        let ours = ok(
            DMKIT,
            &[
                "fsverity",
                "digest",
                s(&src.join(name)),
                &format!("--hash-alg={alg}"),
            ],
        );
        let digest = ours.split_whitespace().next().unwrap();
        assert!(
            v.starts_with("accepted ") && v.contains(digest),
            "{name}: our signature was not accepted by the kernel: {v}; {}",
            ctx()
        );
    }
    for name in ["othercontent", "untrusted", "unsigned"] {
        let v = verdict(name);
        assert!(
            v.starts_with("refused"),
            "{name}: the kernel should refuse it: {v}"
        );
    }
    eprintln!(
        "fs-verity: {} digests and 5 signature checks by the kernel in {:.1}s",
        expected.len(),
        run.elapsed.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// Reverse direction: the kernel's tools format, the host reads

#[test]
fn guest_formats_integrity_and_luks2_images() {
    let Some(g) = guest("guest_formats_integrity_and_luks2_images") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let jobs = vec![
        FormatJob {
            name: "integ_crc32c".into(),
            format: GuestFormat::Integrity(v(&[])),
            size: 16 << 20,
            payload: bytes(11, 1 << 20),
        },
        FormatJob {
            name: "integ_sha256_4k".into(),
            format: GuestFormat::Integrity(v(&["--integrity", "sha256", "--sector-size", "4096"])),
            size: 16 << 20,
            payload: bytes(12, 1 << 20),
        },
        FormatJob {
            name: "luks2_xts".into(),
            format: GuestFormat::Luks2(v(&["--cipher", "aes-xts-plain64", "--key-size", "512"])),
            size: 24 << 20,
            payload: bytes(13, 1 << 20),
        },
        FormatJob {
            name: "luks2_hmac".into(),
            format: GuestFormat::Luks2(v(&["--integrity", "hmac-sha256"])),
            size: 24 << 20,
            payload: bytes(14, 1 << 20),
        },
    ];
    let images = format_in_guest(&g, dir.path(), &jobs);
    for img in &images {
        assert!(
            img.read_back_ok,
            "{}: payload did not read back",
            img.job.name
        );
        assert!(
            img.mapped_size >= img.job.payload.len() as u64,
            "{}: mapped {} bytes",
            img.job.name,
            img.mapped_size
        );
        // The host's tools parse what the kernel's tools wrote.
        let host_dump = match img.job.format {
            GuestFormat::Integrity(_) => ok("integritysetup", &["dump", s(&img.path)]),
            GuestFormat::Luks2(_) => ok("cryptsetup", &["luksDump", s(&img.path)]),
        };
        // Identical but for the device name integritysetup prints first.
        let body = |d: &str| -> String {
            d.lines()
                .filter(|l| !l.starts_with("Info for integrity device"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            body(&host_dump),
            body(&img.guest_dump),
            "{}: host and guest dumps differ",
            img.job.name
        );
    }
    let dump = |name: &str| images.iter().find(|i| i.job.name == name).unwrap();
    assert!(dump("integ_sha256_4k").guest_dump.contains("sha256"));
    assert!(dump("luks2_hmac").guest_dump.contains("hmac(sha256)"));
    assert!(dump("luks2_xts").guest_dump.contains("aes-xts-plain64"));
}
