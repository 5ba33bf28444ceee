//! The real kernel as test oracle: a stock Debian kernel booted under QEMU (TCG) reads what
//! dmkit wrote (tests/kernel/run-guest.sh; the Rust side is tests/kernel/harness.rs).
//!
//! - `harness_*`: output comes back binary-clean, exit statuses and read-only/read-write disks
//!   work, and a dead or hung guest is reported with its console tail.
//! - `dm_verity_*`: images formatted by `dmkit verity format` over a parameter matrix open
//!   with the guest's `veritysetup open` and read back identical; corrupted data and hash
//!   blocks give EIO at the same blocks in the guest as through `dmkit verity open` on the
//!   host; a wrong hash byte, a wrong salt and a wrong root hash are refused by the kernel.
//! - `fsverity_*` (on Debian 12's 6.12 kernel, which has ECDSA): files enabled by the guest's
//!   `fsverity enable` and by `dmkit fsverity enable` (SHA-256 and SHA-512, block sizes, salts,
//!   sizes up to multi-level trees) measure as `dmkit fsverity digest` computes, through both
//!   `fsverity measure` and `dmkit fsverity measure`; `dmkit fsverity dump-metadata` equals
//!   `fsverity dump_metadata`; RSA and ECDSA (P-256, P-384) signatures by
//!   `dmkit fsverity sign` are accepted with `fs.verity.require_signatures=1` and our
//!   certificates in the `.fs-verity` keyring, and refused on other content, from untrusted
//!   keys, or missing, dmkit naming the kernel's errno.
//! - `guest_formats_*`: dm-integrity and LUKS2 images formatted in the guest come back to
//!   the host with a known payload (scaffolding for the integrity and LUKS2 interop tests).
//!
//! Each group is one guest boot. Skipped with a message when qemu or the kernel package is
//! missing, except in CI (`CI` set), where that is a failure.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::env::{is_root, missing};
use common::pki::{make_ident, Ident, EC_P256, EC_P384, RSA};
use common::rng::bytes;
use common::run::{ok, RunDir};
use common::verity_case::VerityCase as VCase;
use common::{xor_byte, DMKIT};
use harness::{
    format_in_guest, guest, guest_with_kernel, sh_quote, Bundle, Disk, FormatJob, GuestFormat,
};
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
// fs-verity: dmkit's digests, signatures, enable and measure against the kernel's

/// The kernel the fs-verity test boots: Debian 12's 6.12 kernel. Debian 12's own 6.1 kernels
/// (cloud and generic) are built without CONFIG_CRYPTO_ECDSA: there `keyctl padd asymmetric`
/// of a P-256 or P-384 certificate fails with "add_key: No such file or directory" and an
/// ECDSA-signed file is refused with ENOKEY ("fs-verity keyring is empty, rejecting signed
/// file!"), so ECDSA signatures can only be checked by a newer kernel.
const FSV_KERNEL: &str = "linux-image-6.12-cloud-amd64 linux-image-6.12-amd64";

/// (hash, block size, salt) variants enabled in the guest by its own `fsverity enable`.
const FSV_VARIANTS: [(&str, u32, &str); 5] = [
    ("sha256", 4096, ""),
    ("sha512", 4096, ""),
    ("sha256", 4096, "5a"),
    (
        "sha512",
        4096,
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    ),
    ("sha256", 1024, "a5a5"),
];

/// (size, hash, block size, salt) of the files `dmkit fsverity enable` enables in the guest.
const DMKIT_ENABLED: [(usize, &str, u32, &str); 7] = [
    (0, "sha256", 4096, ""),
    (1, "sha512", 4096, "01"),
    (4096, "sha256", 1024, "a5a5"),
    (
        4097,
        "sha512",
        2048,
        "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100",
    ),
    (300_000, "sha256", 4096, "5a"),
    (129 * 4096 + 3, "sha512", 1024, ""),
    (
        (2 << 20) + 5,
        "sha256",
        4096,
        "000102030405060708090a0b0c0d0e0f",
    ),
];

/// Which tool enables a signed file in the guest.
#[derive(Clone, Copy)]
enum Enabler {
    /// fsverity-utils' `fsverity enable`.
    Fsverity,
    /// `dmkit fsverity enable`.
    Dmkit,
    /// Each, one after the other (for files the kernel refuses, so both try).
    Both,
}

impl Enabler {
    /// The names the guest script's `sig` function takes.
    fn tools(self) -> &'static [&'static str] {
        match self {
            Enabler::Fsverity => &["fsverity"],
            Enabler::Dmkit => &["dm"],
            Enabler::Both => &["fsverity", "dm"],
        }
    }
}

/// A file the guest enables with `fs.verity.require_signatures=1`.
struct SigCase<'a> {
    /// The file's name in the guest.
    name: &'static str,
    /// Whose key signs it with `dmkit fsverity sign` (`None`: no signature).
    signer: Option<&'a Ident>,
    /// The fs-verity hash algorithm.
    alg: &'static str,
    /// Who enables it.
    enabler: Enabler,
    /// The errno the kernel refuses it with (`None`: accepted).
    refused_with: Option<&'static str>,
}

/// `--hash-alg`, `--block-size` and (if any) `--salt` options.
fn tree_opts(alg: &str, bs: u32, salt: &str) -> Vec<String> {
    let mut v = vec![format!("--hash-alg={alg}"), format!("--block-size={bs}")];
    if !salt.is_empty() {
        v.push(format!("--salt={salt}"));
    }
    v
}

/// `alg:hex`, as `dmkit fsverity digest` computes it on the host.
fn host_digest(path: &Path, opts: &[String]) -> String {
    let mut args = vec!["fsverity", "digest", s(path), "--compact"];
    args.extend(opts.iter().map(String::as_str));
    let alg = opts[0].trim_start_matches("--hash-alg=");
    format!("{alg}:{}", ok(DMKIT, &args).trim())
}

/// strerror text of the errno names dmkit reports for refused signatures.
fn strerror_of(errno: &str) -> &'static str {
    match errno {
        "ENOKEY" => "Required key not available",
        "EKEYREJECTED" => "Key was rejected by service",
        "EPERM" => "Operation not permitted",
        "EEXIST" => "File exists",
        "ENODATA" => "No data available",
        other => panic!("no strerror text for {other}"),
    }
}

/// In the guest: every file of the list enabled by the guest's `fsverity enable` or by
/// `dmkit fsverity enable` (the host's release binary, copied in) measures as dmkit computes on
/// the host, with both `fsverity measure` and `dmkit fsverity measure`, which print the same
/// lines; `dmkit fsverity dump-metadata` writes what `fsverity dump_metadata` writes. Then,
/// with `fs.verity.require_signatures=1` and an RSA, a P-256 and a P-384 certificate in the
/// `.fs-verity` keyring, signatures by `dmkit fsverity sign` (RSA and ECDSA, SHA-256 and
/// SHA-512 digests) are accepted whichever tool enables the file; a signature over other
/// content, by an untrusted RSA or ECDSA key, or none at all is refused by both tools, dmkit
/// naming the errno the kernel returned.
#[test]
fn fsverity_digests_and_signatures_in_the_kernel() {
    let Some(g) = guest_with_kernel("fsverity_digests_and_signatures_in_the_kernel", FSV_KERNEL)
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::copy(DMKIT, src.join("bin/dmkit")).unwrap();
    let mut script = String::from(
        "set -u\nmount -t ext4 /dev/disk/fs /mnt || exit 10\ncd /mnt\n\
         dm() { /mnt/bin/dmkit \"$@\"; }\n\
         dm --version >/dev/null || exit 13\n",
    );

    // Files the guest's fsverity enables. Sizes: empty, one byte, block boundaries, two levels
    // (more than 128 SHA-256 / 64 SHA-512 blocks), three levels for SHA-512 (more than 64 * 64
    // blocks).
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
        for (j, &(alg, bs, salt)) in FSV_VARIANTS.iter().enumerate() {
            // The 16 MiB file only once, to keep the image small.
            if size > 1 << 20 && j != 1 {
                continue;
            }
            let name = format!("f{i}_{j}");
            let path = src.join(&name);
            std::fs::write(&path, &data).unwrap();
            let opts = tree_opts(alg, bs, salt).join(" ");
            writeln!(
                script,
                "fsverity enable {opts} {name} || echo \"ENABLE-FAILED {name}\""
            )
            .unwrap();
            expected.push((name.clone(), host_digest(&path, &tree_opts(alg, bs, salt))));
        }
    }
    // Files dmkit enables.
    for (i, &(size, alg, bs, salt)) in DMKIT_ENABLED.iter().enumerate() {
        let name = format!("d{i}");
        let path = src.join(&name);
        std::fs::write(&path, bytes(i as u64 + 2000, size)).unwrap();
        let opts = tree_opts(alg, bs, salt).join(" ");
        writeln!(
            script,
            "dm fsverity enable {opts} {name} 2>/tmp/err || echo \"ENABLE-FAILED {name} $(tr '\\n' ' ' </tmp/err)\""
        )
        .unwrap();
        expected.push((name, host_digest(&path, &tree_opts(alg, bs, salt))));
    }
    std::fs::write(src.join("plain"), b"never a verity file").unwrap();
    let names: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    for name in &names {
        writeln!(
            script,
            "echo \"MEASURE $(fsverity measure {name})\"\n\
             echo \"DMEASURE $(dm fsverity measure {name})\"\n\
             cat {name} >/dev/null || echo \"READ-FAILED {name}\""
        )
        .unwrap();
    }
    writeln!(
        script,
        "ALL=\"{}\"\n\
         fsverity measure $ALL >/tmp/m1; dm fsverity measure $ALL >/tmp/m2\n\
         if cmp -s /tmp/m1 /tmp/m2; then echo \"MEASURE-ALL same $(wc -l </tmp/m1)\"; \
         else echo MEASURE-ALL differs; diff /tmp/m1 /tmp/m2; fi",
        names.join(" ")
    )
    .unwrap();
    script.push_str(
        r#"
dump() { # TYPE NAME [OPTIONS]
    local t=$1 n=$2 a b
    shift 2
    fsverity dump_metadata "$t" "$n" "$@" >/tmp/u 2>/tmp/ue; a=$?
    dm fsverity dump-metadata "$t" "$n" "$@" >/tmp/d 2>/tmp/de; b=$?
    if [ $a -eq 0 ] && [ $b -eq 0 ] && cmp -s /tmp/u /tmp/d; then
        echo "DUMP $t $n $* same $(wc -c </tmp/u)"
    else
        echo "DUMP $t $n $* differs $a $b $(cat /tmp/ue /tmp/de | tr '\n' ' ')"
    fi
}
derr() { # LABEL DMKIT-ARGS...
    local label=$1
    shift
    dm "$@" >/dev/null 2>/tmp/err
    echo "DERR $label $? $(tr '\n' ' ' </tmp/err)"
}
for n in d2 d5 f6_1 f8_1; do
    dump merkle_tree $n
    dump descriptor $n
done
dump merkle_tree d5 --offset=1024 --length=100
derr eexist fsverity enable d0
derr enodata fsverity measure plain
derr enodata-dump fsverity dump-metadata descriptor plain
"#,
    );

    // Signatures: the RSA, P-256 and P-384 certificates go into the .fs-verity keyring; the
    // "other" RSA and "ecother" P-256 keys are not trusted.
    let id = |name: &str, key_options: &[&str]| {
        make_ident(
            dir.path(),
            name,
            &format!("/CN=dmkit test {name}"),
            key_options,
        )
    };
    let (rsa, ec256, ec384) = (id("rsa", RSA), id("ec256", EC_P256), id("ec384", EC_P384));
    let (other, ecother) = (id("other", RSA), id("ecother", EC_P256));
    for trusted in [&rsa, &ec256, &ec384] {
        std::fs::copy(&trusted.cert_der, src.join(format!("{}.der", trusted.name))).unwrap();
    }
    let signed = bytes(1, 50_000);
    let case = |name, signer, alg, enabler, refused_with| SigCase {
        name,
        signer,
        alg,
        enabler,
        refused_with,
    };
    use Enabler::{Both, Dmkit, Fsverity};
    let cases = [
        case("signed256", Some(&rsa), "sha256", Fsverity, None),
        case("signed512", Some(&rsa), "sha512", Dmkit, None),
        case("ec256_256", Some(&ec256), "sha256", Fsverity, None),
        case("ec256_512", Some(&ec256), "sha512", Dmkit, None),
        case("ec384_256", Some(&ec384), "sha256", Dmkit, None),
        case("ec384_512", Some(&ec384), "sha512", Fsverity, None),
        // These two carry the signature of `signed` but hold other bytes.
        case(
            "othercontent",
            Some(&rsa),
            "sha256",
            Both,
            Some("EKEYREJECTED"),
        ),
        case(
            "ecothercontent",
            Some(&ec256),
            "sha256",
            Both,
            Some("EKEYREJECTED"),
        ),
        case("untrusted", Some(&other), "sha256", Both, Some("ENOKEY")),
        case(
            "ecuntrusted",
            Some(&ecother),
            "sha512",
            Both,
            Some("ENOKEY"),
        ),
        case("unsigned", None, "sha256", Both, Some("EPERM")),
    ];
    for (i, c) in cases.iter().enumerate() {
        let path = src.join(c.name);
        let content = if c.name.ends_with("othercontent") {
            bytes(i as u64 + 3000, signed.len())
        } else {
            signed.clone()
        };
        std::fs::write(&path, content).unwrap();
        let Some(signer) = c.signer else {
            continue;
        };
        let signed_file = dir.path().join(format!("{}.signed", c.name));
        std::fs::write(&signed_file, &signed).unwrap();
        ok(
            DMKIT,
            &[
                "fsverity",
                "sign",
                s(&signed_file),
                s(&src.join(format!("{}.sig", c.name))),
                "--key",
                s(&signer.key),
                "--cert",
                s(&signer.cert),
                &format!("--hash-alg={}", c.alg),
            ],
        );
    }
    script.push_str(
        r#"
# From here on, only signed files may be enabled.
for c in rsa ec256 ec384; do
    keyctl padd asymmetric '' %keyring:.fs-verity </mnt/$c.der >/dev/null 2>/tmp/err ||
        echo "KEYRING-FAILED $c $(tr '\n' ' ' </tmp/err)"
done
echo 1 >/proc/sys/fs/verity/require_signatures || exit 12
sig() { # NAME ALG TOOL(fsverity|dm)
    local opt=""
    [ -e "$1.sig" ] && opt="--signature=$1.sig"
    if [ "$3" = dm ]; then
        dm fsverity enable --hash-alg=$2 $opt "$1" 2>/tmp/err
    else
        fsverity enable --hash-alg=$2 $opt "$1" 2>/tmp/err
    fi
    if [ $? -eq 0 ]; then
        echo "SIGN $1 $3 accepted $(fsverity measure "$1")"
        cat "$1" >/dev/null || echo "READ-FAILED $1"
    else
        echo "SIGN $1 $3 refused $(tr '\n' ' ' </tmp/err)"
    fi
}
"#,
    );
    for c in &cases {
        for t in c.enabler.tools() {
            writeln!(script, "sig {} {} {t}", c.name, c.alg).unwrap();
        }
    }
    script.push_str(
        "dump signature signed512\ncmp -s /tmp/d signed512.sig && echo DUMP-SIGNATURE-IS-OURS\n",
    );
    script.push_str("cd /\numount /mnt\n");

    let img = dir.path().join("fs.img");
    // Room for the files, the Merkle trees the guest appends to them (under a tenth of their
    // size), ext4's metadata and slack: sized from the tree, because the dmkit binary copied in
    // grows with every release (a fixed 128 MiB ran out in CI).
    let image_size = (files_size(&src) * 3 / 2 + (64 << 20)).next_multiple_of(1 << 20);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(image_size)
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
    let run = g.run(&script, &[Disk::rw("fs", &img)], Duration::from_secs(400));
    run.assert_ok("fs-verity guest script");
    let out = run.out();
    let ctx = || format!("guest said:\n{out}\n{}", run.stderr);
    for bad in ["FAILED", "differs"] {
        assert!(!out.contains(bad), "{bad} in the guest; {}", ctx());
    }

    // Digests: the kernel's measure of every file, through both tools, is dmkit's digest.
    for (name, digest) in &expected {
        for prefix in ["MEASURE", "DMEASURE"] {
            let want = format!("{prefix} {digest} {name}");
            assert!(
                out.lines().any(|l| l == want),
                "{name}: {prefix} differs from dmkit's digest {digest}; {}",
                ctx()
            );
        }
    }
    let all = format!("MEASURE-ALL same {}", expected.len());
    assert!(out.lines().any(|l| l == all), "{all}; {}", ctx());
    assert_eq!(
        out.lines().filter(|l| l.starts_with("DUMP ")).count(),
        10,
        "dump-metadata comparisons; {}",
        ctx()
    );
    assert!(out.contains("DUMP-SIGNATURE-IS-OURS"), "{}", ctx());

    // dmkit's one-line errors for what the kernel refuses.
    let derr = |label: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("DERR {label} ")))
            .unwrap_or_else(|| panic!("no DERR {label}; {}", ctx()))
            .to_string()
    };
    for (label, file, errno, words) in [
        ("eexist", "d0", "EEXIST", "already enabled"),
        ("enodata", "plain", "ENODATA", "not enabled on this file"),
        (
            "enodata-dump",
            "plain",
            "ENODATA",
            "not enabled on this file",
        ),
    ] {
        let v = derr(label);
        let want = format!("1 dmkit: {file}: ");
        assert!(
            v.starts_with(&want)
                && v.contains(words)
                && v.trim_end().ends_with(&format!("({errno})")),
            "{label}: {v}"
        );
    }

    // Signatures.
    let verdict = |name: &str, tool: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("SIGN {name} {tool} ")))
            .unwrap_or_else(|| panic!("no verdict for {name} by {tool}; {}", ctx()))
            .to_string()
    };
    for c in &cases {
        let name = c.name;
        let Some(errno) = c.refused_with else {
            for tool in c.enabler.tools() {
                let v = verdict(name, tool);
                let digest = host_digest(&src.join(name), &tree_opts(c.alg, 4096, ""));
                assert!(
                    v == format!("accepted {digest} {name}"),
                    "{name}: our {} signature was not accepted by the kernel ({tool} enable): \
                     {v}; {}",
                    c.alg,
                    ctx()
                );
            }
            continue;
        };
        let theirs = verdict(name, "fsverity");
        let ours = verdict(name, "dm");
        assert!(
            theirs.starts_with("refused") && theirs.contains(strerror_of(errno)),
            "{name}: fsverity enable: {theirs}"
        );
        assert!(
            ours.starts_with(&format!("refused dmkit: {name}: cannot enable fs-verity: "))
                && ours.trim_end().ends_with(&format!("({errno})")),
            "{name}: dmkit fsverity enable: {ours}"
        );
    }
    eprintln!(
        "fs-verity: {} digests, 10 metadata dumps and {} signature checks by the kernel in {:.1}s",
        expected.len(),
        cases.iter().map(|c| c.enabler.tools().len()).sum::<usize>(),
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

/// The bytes of every regular file under `dir`, recursively.
fn files_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                files_size(&entry.path())
            } else {
                meta.len()
            }
        })
        .sum()
}
