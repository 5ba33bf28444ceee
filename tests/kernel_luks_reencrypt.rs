//! LUKS2 reencryption and `convert` against the real kernel (tests/kernel/), in one guest boot:
//!
//! - dmkit formats two LUKS2 volumes and writes random plaintext; in the guest, cryptsetup
//!   2.6.1 re-keys each ONLINE (`cryptsetup reencrypt` on the active dm-crypt mapping), one with
//!   the `checksum` resilience, one with `journal`; the plaintext the kernel serves is the
//!   original before and after, and back on the host dmkit reads the original under the new key;
//! - cryptsetup formats a volume on the host, dmkit writes plaintext and re-keys it offline
//!   (`dmkit luks reencrypt`); the guest's dm-crypt opens it and serves the original;
//! - dmkit formats a volume and stops its own reencryption halfway (`--init-only`, then the
//!   library's run stopped by its progress callback at a hotzone boundary); the guest's
//!   cryptsetup activates the two-segment table (two crypt targets, two keys), serves the
//!   original, and finishes the reencryption online (`--resume-only`); dmkit then reads the
//!   original;
//! - `dmkit luks convert` LUKS1 → LUKS2 → LUKS1: the guest kernel opens every stage and serves
//!   the original.
//!
//! The guest compares SHA-256 sums of the whole mapped device with the host's. Images of 24 MiB (8 MiB of data)
//! (sparse), PBKDF2 with 1000 iterations. Skipped (with a message) without the guest's
//! prerequisites or the host's cryptsetup, unless `CI` is set.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::env::tool_missing;
use common::run::ok;
use common::DMKIT;
use dmkit::crypt::luks::{ActivateParams, LuksVolume};
use dmkit::crypt::luks2::reencrypt::{RunOptions, RunOutcome};
use harness::{guest, Disk};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

const PASS: &str = "kernel reencrypt";
const IMG: u64 = 24 << 20;
const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// The plaintext dmkit serves for `img` (read-only open, every segment with its key).
fn read_plain(img: &Path) -> Vec<u8> {
    let v = LuksVolume::open(img, None, false, None).unwrap();
    let data = v.data(true).unwrap();
    let params = ActivateParams {
        name: "krr-read".into(),
        read_only: true,
        ..Default::default()
    };
    let a = v.activate(data, PASS.as_bytes(), None, &params).unwrap();
    let mut buf = vec![0u8; a.device.size() as usize];
    a.device.read_at(&mut buf, 0).unwrap();
    buf
}

/// Fill the device dmkit serves for `img` with random plaintext (seeded by `seed`); returns it.
fn write_plain(img: &Path, seed: u64) -> Vec<u8> {
    let v = LuksVolume::open(img, None, false, None).unwrap();
    let data = v.data(false).unwrap();
    let params = ActivateParams {
        name: "krr-write".into(),
        ..Default::default()
    };
    let a = v.activate(data, PASS.as_bytes(), None, &params).unwrap();
    let plain = common::rng::bytes(seed, a.device.size() as usize);
    a.device.write_at(&plain, 0).unwrap();
    a.device.flush().unwrap();
    plain
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn dmkit(args: &[&str]) -> String {
    ok(DMKIT, args)
}

/// `dmkit luks format` (LUKS1 or LUKS2) with a fast KDF.
fn dmkit_format(img: &str, pass: &str, luks_type: &str) {
    let mut args = vec!["luks", "format", "--batch-mode", "--type", luks_type];
    args.extend(FAST);
    args.extend(["--key-file", pass, img]);
    dmkit(&args);
}

/// The volume key cryptsetup unlocks (hex).
fn volume_key(img: &str, pass: &str) -> String {
    hex::encode(common::volume_key::cryptsetup(pass, img, None))
}

fn in_reencryption(img: &str) -> bool {
    ok("cryptsetup", &["luksDump", img]).contains("online-reencrypt")
}

#[test]
fn kernel_and_dmkit_reencrypt_and_convert_each_others_volumes() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let Some(g) = guest("kernel_luks_reencrypt") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let pass = p("pass");
    std::fs::write(&pass, PASS).unwrap();
    let sparse = |n: &str| {
        let path = p(n);
        std::fs::File::create(&path).unwrap().set_len(IMG).unwrap();
        path
    };
    let prep = Instant::now();

    // Online re-key in the guest of dmkit volumes: checksum and journal.
    let mut plain = std::collections::BTreeMap::new();
    let mut keys = std::collections::BTreeMap::new();
    for (i, name) in ["ck", "jr"].into_iter().enumerate() {
        let img = sparse(name);
        dmkit_format(&img, &pass, "luks2");
        plain.insert(name, write_plain(Path::new(&img), 10 + i as u64));
        keys.insert(name, volume_key(&img, &pass));
    }

    // Offline re-key by dmkit of a cryptsetup volume.
    let cs = sparse("cs");
    let mut args = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
    args.extend(FAST);
    args.extend(["--key-file", &pass, &cs]);
    ok("cryptsetup", &args);
    plain.insert("cs", write_plain(Path::new(&cs), 20));
    let cs_key = volume_key(&cs, &pass);
    let mut args = vec![
        "luks",
        "reencrypt",
        "--batch-mode",
        "--resilience",
        "journal",
    ];
    args.extend(FAST);
    args.extend(["--key-file", &pass, &cs]);
    dmkit(&args);
    assert!(!in_reencryption(&cs), "dmkit left {cs} in reencryption");
    assert_ne!(volume_key(&cs, &pass), cs_key, "dmkit did not re-key");
    assert!(
        read_plain(Path::new(&cs)) == plain["cs"],
        "dmkit's re-key changed the plaintext"
    );

    // A dmkit reencryption stopped halfway.
    let half = sparse("half");
    dmkit_format(&half, &pass, "luks2");
    plain.insert("half", write_plain(Path::new(&half), 30));
    let mut args = vec!["luks", "reencrypt", "--batch-mode", "--init-only"];
    args.extend(FAST);
    args.extend(["--key-file", &pass, &half]);
    dmkit(&args);
    {
        let mut v = LuksVolume::open(Path::new(&half), None, true, None).unwrap();
        let opts = RunOptions {
            max_hotzone: Some(1 << 20),
            io_block: 0,
            device_size: None,
        };
        let outcome = v
            .reencrypt_run(PASS.as_bytes(), None, &opts, &mut |p| p.done < p.size / 2)
            .unwrap();
        assert_eq!(outcome, RunOutcome::Stopped);
    }
    assert!(in_reencryption(&half), "{half}: not left in reencryption");
    assert!(
        read_plain(Path::new(&half)) == plain["half"],
        "dmkit's half reencryption changed the plaintext"
    );

    // LUKS1 -> LUKS2 -> LUKS1.
    let l1 = sparse("l1");
    dmkit_format(&l1, &pass, "luks1");
    let conv = write_plain(Path::new(&l1), 40);
    let l2 = p("l2");
    std::fs::copy(&l1, &l2).unwrap();
    dmkit(&["luks", "convert", "--batch-mode", "--type", "luks2", &l2]);
    let l1b = p("l1b");
    std::fs::copy(&l2, &l1b).unwrap();
    dmkit(&["luks", "convert", "--batch-mode", "--type", "luks1", &l1b]);
    for (name, img, version) in [("l1", &l1, "1"), ("l2", &l2, "2"), ("l1b", &l1b, "1")] {
        let dump = ok("cryptsetup", &["luksDump", img]);
        assert!(
            dump.lines()
                .any(|l| l.starts_with("Version:") && l.trim_end().ends_with(version)),
            "{name}: not LUKS{version}:\n{dump}"
        );
        assert!(
            read_plain(Path::new(img)) == conv,
            "{name}: dmkit reads another plaintext"
        );
        plain.insert(name, conv.clone());
    }
    eprintln!(
        "kernel_luks_reencrypt: host preparation {:?}",
        prep.elapsed()
    );

    // The guest.
    let mut script = String::from(
        "set -e\nprintf %s '{PASS}' > /tmp/pass\n\
         check() { got=$(sha256sum < \"$1\" | cut -d' ' -f1); \
         if [ \"$got\" != \"$2\" ]; then echo \"MISMATCH $1 ($3)\"; exit 1; fi; echo \"same $3\"; }\n\
         fast='--pbkdf pbkdf2 --pbkdf-force-iterations 1000'\n",
    )
    .replace("{PASS}", PASS);
    let mut disks = Vec::new();
    for name in ["ck", "jr", "half"] {
        disks.push(Disk::rw(name, p(name)));
    }
    for name in ["cs", "l1", "l2", "l1b"] {
        disks.push(Disk::ro(name, p(name)));
    }
    for (name, res) in [("ck", "checksum"), ("jr", "journal")] {
        let h = sha(&plain[name]);
        script.push_str(&format!(
            "cryptsetup open --key-file /tmp/pass /dev/disk/{name} {name}\n\
             check /dev/mapper/{name} {h} '{name} before'\n\
             t0=$(date +%s)\n\
             cryptsetup reencrypt --batch-mode --key-file /tmp/pass $fast --resilience {res} \
             --hotzone-size 1M /dev/disk/{name}\n\
             echo \"online {res} reencryption: $(( $(date +%s) - t0 )) s\"\n\
             cryptsetup status {name} | grep -q 'mode:.*read/write'\n\
             check /dev/mapper/{name} {h} '{name} during the mapping, after the online reencryption'\n\
             cryptsetup close {name}\n\
             ! cryptsetup luksDump /dev/disk/{name} | grep -q online-reencrypt\n"
        ));
    }
    // The half-done volume: cryptsetup maps both segments, serves the original, finishes.
    let h = sha(&plain["half"]);
    script.push_str(&format!(
        "cryptsetup luksDump /dev/disk/half | grep -q online-reencrypt\n\
         cryptsetup open --key-file /tmp/pass /dev/disk/half half\n\
         dmsetup table half\n\
         [ \"$(dmsetup table half | grep -c ' crypt ')\" -ge 2 ]\n\
         check /dev/mapper/half {h} 'half: two segments'\n\
         cryptsetup reencrypt --batch-mode --resume-only --key-file /tmp/pass /dev/disk/half\n\
         check /dev/mapper/half {h} 'half: finished by cryptsetup online'\n\
         cryptsetup close half\n\
         ! cryptsetup luksDump /dev/disk/half | grep -q online-reencrypt\n"
    ));
    for name in ["cs", "l1", "l2", "l1b"] {
        let h = sha(&plain[name]);
        script.push_str(&format!(
            "cryptsetup open --readonly --key-file /tmp/pass /dev/disk/{name} {name}\n\
             check /dev/mapper/{name} {h} '{name}'\n\
             cryptsetup close {name}\n"
        ));
    }
    script.push_str("echo all-done\n");
    let run = g.run(&script, &disks, Duration::from_secs(900));
    eprintln!(
        "kernel_luks_reencrypt: guest run {:?}\n{}",
        run.elapsed,
        run.out()
    );
    run.assert_ok("reencrypt and open in the guest");
    assert!(run.out().contains("all-done"));
    let dmsetup = run.out();
    assert!(
        dmsetup.lines().filter(|l| l.contains(" crypt ")).count() >= 2,
        "the half-done volume was not mapped in two crypt segments:\n{dmsetup}"
    );

    // Back on the host: the guest's reencryptions kept the plaintext and changed the keys.
    for name in ["ck", "jr", "half"] {
        let img = p(name);
        assert!(!in_reencryption(&img), "{name}: still in reencryption");
        assert!(
            read_plain(Path::new(&img)) == plain[name],
            "{name}: dmkit reads another plaintext after the guest's reencryption"
        );
        if let Some(old) = keys.get(name) {
            assert_ne!(&volume_key(&img, &pass), old, "{name}: not re-keyed");
        }
    }
}
