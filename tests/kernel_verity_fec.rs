//! dm-verity FEC against the real kernel (tests/kernel/): images dmkit formatted with
//! `verity format --fec-device` and then damaged on the host are opened in the Debian guest
//! with `veritysetup open --fec-device`.
//!
//! - Within the code's bound (roots 2: one damaged block per round, two data blocks of one
//!   round through the erasure pass, a damaged hash block; roots 24: 13 data blocks of one
//!   round, more than errors alone correct) the kernel reads the whole device back identical
//!   and logs its corrections.
//! - Beyond it (roots 2: three data blocks of one round, and a hash block sharing its round
//!   with a damaged data block, which no erasure can help since the kernel never marks hash
//!   blocks) the guest reads every 4 KiB block with `dd iflag=direct conv=noerror,sync` onto
//!   a disk the host reads back: the blocks that gave EIO are zeros there, every other block
//!   must be the original.
//!
//! `dmkit verity open --fec-device` on the host reads every image too, block by block: it
//! must give EIO on exactly the kernel's blocks (none within the bound) and serve every other
//! block as written.
//!
//! One guest boot, three images of 4 MiB, about 45 s (roots 24 beyond the bound, 25 blocks of
//! one round, is left to the unit tests in src/verity/fec/correct.rs: under TCG it took as
//! long as the rest of the run). Skipped (with a message) without the guest's prerequisites,
//! root or FUSE unless `CI` is set.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::run::{output as run, Workspace};
use common::DMKIT;
use harness::{guest, Bundle, Disk};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

const BS: u64 = 4096;
/// 4 MiB of data: with SHA-256, 8 + 1 hash blocks after the superblock, 1033 covered
/// blocks, five rounds for both roots 2 (253 per round) and 24 (231).
const DATA_BLOCKS: u64 = 1024;
const ROUNDS: u64 = 5;
/// The hash block (absolute, superblock at 0) holding the digests of data blocks 256..383:
/// the top level is block 1, level 0 starts at block 2. Covered index 1024 + 3 = 1027,
/// round 2.
const HASH_BLOCK: u64 = 4;

/// One image: its FEC strength, the blocks to damage, and whether the guest reads it whole
/// (`sum`) or block by block (`blocks`, for images with blocks beyond repair).
struct Case {
    name: &'static str,
    roots: u32,
    data: Vec<u64>,
    hash: Vec<u64>,
    blocks: bool,
}

fn cases() -> Vec<Case> {
    let round = |r: u64, n: u64| (0..n).map(move |k| r + k * ROUNDS);
    vec![
        Case {
            name: "r2ok",
            roots: 2,
            // Round 0: one block; round 1: two (the erasure pass); round 2: the hash block;
            // round 3: one.
            data: vec![100, 101, 506, 3],
            hash: vec![HASH_BLOCK],
            blocks: false,
        },
        Case {
            name: "r2bad",
            roots: 2,
            // Round 0: three blocks (beyond two roots); round 1: one (corrected); round 2:
            // block 12 and the hash block (one erasure + one unmarked error > two roots).
            data: vec![10, 15, 20, 11, 12],
            hash: vec![HASH_BLOCK],
            blocks: true,
        },
        Case {
            name: "r24ok",
            roots: 24,
            // Thirteen blocks of round 0: more than errors alone correct (12), so through the
            // erasure pass; one block of round 3.
            data: round(0, 13).chain([3]).collect(),
            hash: vec![],
            blocks: false,
        },
    ]
}

/// The guest's side, after the bundle's prelude: for each `NAME ROOTS ROOTHASH MODE`, open
/// with FEC and either hash the whole device or read it block by block.
const SCRIPT: &str = r#"
set -u
export LC_ALL=C
modprobe dm-verity 2>/dev/null
if grep -qw verity_fec_decode /proc/kallsyms; then echo "FECSYM yes"; else echo "FECSYM no"; fi
check() {
    local name=$1 roots=$2 rh=$3 mode=$4 d h f t0=$EPOCHREALTIME
    d=$(attach "$name.data") && h=$(attach "$name.hash") && f=$(attach "$name.fec") || return 1
    veritysetup open "$d" "v_$name" "$h" "$rh" --fec-device "$f" --fec-roots "$roots" >&2 \
        || { echo "OPENFAIL $name"; return 1; }
    echo "TABLE $name $(dmsetup table "v_$name")"
    if [ "$mode" = sum ]; then
        echo "SUM $name $(sha256sum </dev/mapper/v_$name | cut -d' ' -f1)"
    else
        # Every 4 KiB block with O_DIRECT; a block that fails is skipped and written as
        # zeros, so the host finds the EIO blocks on the out disk. busybox's dd: GNU dd's
        # noerror,sync writes what the failed read left in its buffer (dm-verity fills it
        # before it checks the block).
        busybox dd if=/dev/mapper/v_$name of=/dev/disk/out bs=4096 seek=$mode iflag=direct \
            conv=noerror,sync,notrunc 2>"/tmp/$name.err"
        echo "ERRS $name $(grep -ci 'error' "/tmp/$name.err")"
    fi
    veritysetup close "v_$name"
    echo "TIME $name $t0 $EPOCHREALTIME"
}
rc=0
"#;

/// SHA-256 in hex.
fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Overwrite block `block` of `path` with noise.
fn damage(path: &std::path::Path, block: u64, seed: u64) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&common::rng::bytes(seed, BS as usize), block * BS)
        .unwrap();
}

#[test]
fn kernel_and_dmkit_correct_and_fail_the_same_fec_blocks() {
    let test = "kernel_and_dmkit_correct_and_fail_the_same_fec_blocks";
    if common::env::fuse_missing() {
        return;
    }
    let Some(g) = guest(test) else {
        return;
    };
    let start = Instant::now();
    let e = Workspace::new();
    let mut bundle = Bundle::default();
    let mut script = String::from(SCRIPT);
    let mut originals = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        let (data, hash, fec) = (
            e.path(&format!("{}.data", c.name)),
            e.path(&format!("{}.hash", c.name)),
            e.path(&format!("{}.fec", c.name)),
        );
        let original = common::rng::bytes(40 + i as u64, (DATA_BLOCKS * BS) as usize);
        fs::write(&data, &original).unwrap();
        let out = run(
            DMKIT,
            &[
                "verity",
                "format",
                "-q",
                data.to_str().unwrap(),
                hash.to_str().unwrap(),
                "--fec-device",
                fec.to_str().unwrap(),
                "--fec-roots",
                &c.roots.to_string(),
                "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{}: format: {}",
            c.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let root = j["root_hash"].as_str().unwrap().to_string();
        let rounds = j["fec"]["rs_blocks"].as_u64().unwrap() / u64::from(c.roots);
        assert_eq!(
            rounds, ROUNDS,
            "{}: the damage plan assumes five rounds",
            c.name
        );
        assert_eq!(
            fs::metadata(&hash).unwrap().len(),
            10 * BS,
            "{}: hash",
            c.name
        );
        for (k, &b) in c.data.iter().enumerate() {
            damage(&data, b, 1000 * i as u64 + k as u64);
        }
        for &b in &c.hash {
            damage(&hash, b, 7777 + i as u64);
        }
        for (part, path) in [("data", &data), ("hash", &hash), ("fec", &fec)] {
            bundle.add(&format!("{}.{part}", c.name), path);
        }
        // The blocks cases go to the out disk one after the other.
        let mode = match c.blocks {
            true => (out_blocks(&cases()[..i]) * DATA_BLOCKS).to_string(),
            false => "sum".to_string(),
        };
        script.push_str(&format!(
            "check {} {} {root} {mode} || rc=1\n",
            c.name, c.roots
        ));
        originals.push((root, original));
    }
    script.push_str("dmesg | grep 'verity' | sed 's/^/KLOG /'\nexit $rc\n");
    let script = format!("{}{}", bundle.prelude(), script);
    let disk = bundle.write(&e.path("bundle.img"));
    let out_disk = e.path("out.img");
    fs::File::create(&out_disk)
        .unwrap()
        .set_len(out_blocks(&cases()) * DATA_BLOCKS * BS)
        .unwrap();
    let guest_run = g.run(
        &script,
        &[disk, Disk::rw("out", &out_disk)],
        Duration::from_secs(600),
    );
    guest_run.assert_ok("veritysetup open --fec-device in the guest");
    let out = guest_run.out();
    let lines = |prefix: &str| guest_run.lines(prefix);
    assert!(
        lines("FECSYM ").contains(&"yes".to_string()),
        "the guest kernel has no dm-verity FEC (CONFIG_DM_VERITY_FEC): no verity_fec_decode in \
         /proc/kallsyms:\n{out}"
    );
    let klog = lines("KLOG ");
    let corrected: Vec<&String> = klog.iter().filter(|l| l.contains("corrected")).collect();
    assert!(
        !corrected.is_empty(),
        "the kernel logged no FEC correction:\n{}",
        klog.join("\n")
    );
    for l in corrected.iter().take(4) {
        eprintln!("guest: {l}");
    }

    for l in lines("TIME ") {
        let t: Vec<&str> = l.split(' ').collect();
        let secs = t[2].parse::<f64>().unwrap() - t[1].parse::<f64>().unwrap();
        eprintln!("guest: {} took {secs:.1}s", t[0]);
    }
    let read_back = fs::read(&out_disk).unwrap();
    for (i, (c, (root, original))) in cases().iter().zip(&originals).enumerate() {
        let table = lines(&format!("TABLE {} ", c.name));
        assert!(
            table.iter().any(|t| t.contains("use_fec_from_device")
                && t.contains(&format!("fec_roots {}", c.roots))),
            "{}: no FEC in the dm table: {table:?}",
            c.name
        );
        let mut kernel_eio = BTreeSet::new();
        if c.blocks {
            // What the kernel read: the original, but zeros where it gave EIO (the data is
            // noise, so no block of it is zeros).
            let at = (out_blocks(&cases()[..i]) * DATA_BLOCKS * BS) as usize;
            let got = &read_back[at..at + original.len()];
            for (b, (g, o)) in got
                .chunks(BS as usize)
                .zip(original.chunks(BS as usize))
                .enumerate()
            {
                if g.iter().all(|&x| x == 0) {
                    kernel_eio.insert(b as u64);
                } else {
                    assert!(g == o, "{}: the kernel served block {b} wrong", c.name);
                }
            }
            assert_eq!(
                lines(&format!("ERRS {} ", c.name)),
                vec![kernel_eio.len().to_string()],
                "{}: dd's read errors against the zero blocks",
                c.name
            );
            assert!(
                !kernel_eio.is_empty(),
                "{}: the kernel failed no block",
                c.name
            );
        } else {
            assert_eq!(
                lines(&format!("SUM {} ", c.name)),
                vec![sha(original)],
                "{}: the kernel did not read the damaged image back identical",
                c.name
            );
        }
        // dmkit on the host, the same image and FEC.
        let path = |part: &str| e.s(&format!("{}.{part}", c.name));
        let dev = e.run.ok(&[
            "verity",
            "open",
            &path("data"),
            c.name,
            &path("hash"),
            root,
            "--fec-device",
            &path("fec"),
            "--fec-roots",
            &c.roots.to_string(),
        ]);
        e.run.track(c.name);
        let f = fs::File::open(dev.trim()).unwrap();
        let mut dmkit_eio = BTreeSet::new();
        let mut block = vec![0u8; BS as usize];
        for b in 0..DATA_BLOCKS {
            let range = (b * BS) as usize..((b + 1) * BS) as usize;
            match f.read_exact_at(&mut block, b * BS) {
                Ok(()) => assert!(
                    block[..] == original[range],
                    "{}: dmkit served block {b} wrong",
                    c.name
                ),
                Err(err) => {
                    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{}: block {b}", c.name);
                    dmkit_eio.insert(b);
                }
            }
        }
        drop(f);
        e.run.close(c.name);
        eprintln!(
            "{}: kernel EIO {} blocks, dmkit EIO {} blocks: {:?}",
            c.name,
            kernel_eio.len(),
            dmkit_eio.len(),
            summarize(&kernel_eio)
        );
        assert_eq!(
            dmkit_eio, kernel_eio,
            "{}: dmkit and the kernel give EIO on different blocks",
            c.name
        );
    }
    eprintln!(
        "kernel_verity_fec: guest run {:.1}s, whole test {:.1}s",
        guest_run.elapsed.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
}

/// How many of `cases` are read block by block (each takes DATA_BLOCKS of the out disk).
fn out_blocks(cases: &[Case]) -> u64 {
    cases.iter().filter(|c| c.blocks).count() as u64
}

/// Runs of consecutive blocks, for the log.
fn summarize(set: &BTreeSet<u64>) -> Vec<String> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in set {
        match out.last_mut() {
            Some((_, end)) if *end + 1 == b => *end = b,
            _ => out.push((b, b)),
        }
    }
    out.iter()
        .map(|&(a, z)| {
            if a == z {
                a.to_string()
            } else {
                format!("{a}-{z}")
            }
        })
        .collect()
}
