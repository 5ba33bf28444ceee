//! LUKS2 reencryption and `convert` against the real kernel (tests/kernel/), in one guest boot:
//!
//! 1. cryptsetup's ONLINE reencryption in the guest (`cryptsetup reencrypt` on an active
//!    dm-crypt mapping, re-key, default resilience) of a volume dmkit formatted and filled on
//!    the host; dmkit then reads the same plaintext on the host.
//! 2. dmkit's offline reencryption (`dmkit luks reencrypt`) of a volume cryptsetup formatted
//!    on the host; the guest's dm-crypt reads the same plaintext.
//! 3. A volume dmkit left in the middle of a reencryption (`--init-only`, then a run stopped
//!    with SIGTERM after its first hotzones) opens in the guest (cryptsetup loads a table of
//!    several segments, each with its key) and reads back identical; the guest's cryptsetup
//!    finishes it online (`reencrypt --resume-only` on the active mapping) and dmkit reads it
//!    identical on the host.
//! 4. `dmkit luks convert` LUKS1 -> LUKS2 -> LUKS1: the guest opens each stage and reads back
//!    identical.
//!
//! The host reads and writes plaintext through the library (`LuksVolume::activate`); the
//! guest compares sha256 of its mappings. Images are 24 MiB (sparse; 8 MiB of data under
//! LUKS2), keyslots PBKDF2 at 1000 iterations. About 80 s under a loaded 2-core machine (boot
//! 10-17 s, the guest's online reencryption 10 s, its online resume 26 s: TCG's AES-XTS is
//! slow). Skipped (with a message) without the guest's prerequisites unless `CI` is set.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::DMKIT;
use dmkit::crypt::luks::{ActivateParams, LuksVolume};
use harness::{guest, sh_quote, Disk};
use openssl::sha::sha256;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PASS: &str = "kernel reencrypt";
const SIZE: u64 = 24 << 20;
const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dmkit_ok(args: &[&str]) -> String {
    run_ok(DMKIT, args)
}

/// The image's plaintext, read by dmkit's library (both segments, each with its key, when
/// it is in the middle of a reencryption).
fn dmkit_read(img: &Path) -> Vec<u8> {
    let vol = LuksVolume::open(img, None, false, None).unwrap();
    let data = vol.data(true).unwrap();
    let params = ActivateParams {
        name: "kernel-reencrypt-read".into(),
        read_only: true,
        ..Default::default()
    };
    let active = vol
        .activate(data, PASS.as_bytes(), None, &params)
        .unwrap_or_else(|e| panic!("{}: dmkit cannot open it: {e}", img.display()));
    let mut buf = vec![0u8; active.device.size() as usize];
    active.device.read_at(&mut buf, 0).unwrap();
    buf
}

/// Fills the image's whole mapping with pseudo-random plaintext through dmkit's library and
/// returns it.
fn dmkit_fill(img: &Path, seed: u64) -> Vec<u8> {
    let vol = LuksVolume::open(img, None, false, None).unwrap();
    let data = vol.data(false).unwrap();
    let params = ActivateParams {
        name: "kernel-reencrypt-fill".into(),
        ..Default::default()
    };
    let active = vol.activate(data, PASS.as_bytes(), None, &params).unwrap();
    let plain = common::rng::bytes(seed, active.device.size() as usize);
    active.device.write_at(&plain, 0).unwrap();
    active.device.flush().unwrap();
    plain
}

fn sparse(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The reencryption requirement is on the header (cryptsetup's verdict).
fn in_reencryption(img: &Path) -> bool {
    let json = run_ok("cryptsetup", &["luksDump", "--dump-json-metadata", s(img)]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["config"].get("requirements").is_some()
}

/// `dmkit luks reencrypt --init-only`, then a run with small hotzones stopped by SIGTERM
/// (dmkit stops at the next hotzone boundary) once its progress passed the first hotzones.
fn dmkit_leave_midway(img: &Path, pass: &Path) {
    let base = ["luks", "reencrypt", "--batch-mode", "--key-file", s(pass)];
    let init: Vec<&str> = [&base[..], FAST, &["--init-only", s(img)]].concat();
    dmkit_ok(&init);
    assert!(
        in_reencryption(img),
        "dmkit --init-only left no requirement"
    );
    let resume: Vec<&str> = [
        &base[..],
        &[
            "--resume-only",
            "--hotzone-size",
            "64k",
            "--progress-json",
            s(img),
        ],
    ]
    .concat();
    let mut child = Command::new(DMKIT)
        .args(&resume)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    while let Some(Ok(line)) = lines.next() {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let done: u64 = v["device_bytes"]
            .as_str()
            .map(|s| s.parse().unwrap())
            .or_else(|| v["device_bytes"].as_u64())
            .unwrap_or(0);
        if done > 0 {
            seen += 1;
        }
        if seen == 2 {
            // SAFETY: kill has no memory preconditions; the child is ours and not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            break;
        }
    }
    // Drain so that the child never blocks on a full pipe while it stops.
    for _ in lines {}
    let st = child.wait().unwrap();
    eprintln!("dmkit reencrypt stopped by SIGTERM: {st}");
    assert!(
        in_reencryption(img),
        "dmkit finished before SIGTERM: no mid-way image to test"
    );
}

/// `SUM NAME HEX` lines the guest printed.
fn sums(out: &str) -> std::collections::HashMap<String, String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("SUM "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, h)| (n.to_string(), h.trim().to_string()))
        .collect()
}

#[test]
fn reencryption_and_convert_agree_with_the_kernel() {
    let Some(g) = guest("kernel_luks_reencrypt") else {
        return;
    };
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pass = dir.join("pass");
    std::fs::write(&pass, PASS).unwrap();
    let fmt_dmkit = |img: &Path, ty: &str| {
        let a: Vec<&str> = [
            &["luks", "format", "-q", "--type", ty, "--key-file", s(&pass)][..],
            FAST,
            &[s(img)],
        ]
        .concat();
        dmkit_ok(&a);
    };

    // 1. dmkit formats and fills; the guest reencrypts online.
    let a = sparse(dir, "a.img");
    fmt_dmkit(&a, "luks2");
    let a_plain = dmkit_fill(&a, 1);
    let a_digest = sha256(&a_plain);

    // 2. cryptsetup formats, dmkit fills and reencrypts offline.
    let b = sparse(dir, "b.img");
    let cs_fmt: Vec<&str> = [
        &["luksFormat", "--batch-mode", "--type", "luks2"][..],
        FAST,
        &["--key-file", s(&pass), s(&b)],
    ]
    .concat();
    run_ok("cryptsetup", &cs_fmt);
    let b_plain = dmkit_fill(&b, 2);
    let re: Vec<&str> = [
        &["luks", "reencrypt", "--batch-mode", "--key-file", s(&pass)][..],
        FAST,
        &[s(&b)],
    ]
    .concat();
    let b_key_before = run_ok("cryptsetup", &["luksDump", s(&b)]);
    dmkit_ok(&re);
    assert!(!in_reencryption(&b), "dmkit reencrypt left a requirement");
    assert_ne!(
        b_key_before,
        run_ok("cryptsetup", &["luksDump", s(&b)]),
        "the header did not change"
    );
    assert!(
        dmkit_read(&b) == b_plain,
        "dmkit reads back another plaintext after its reencryption"
    );

    // 3. dmkit leaves a reencryption mid-way.
    let c = sparse(dir, "c.img");
    fmt_dmkit(&c, "luks2");
    let c_plain = dmkit_fill(&c, 3);
    dmkit_leave_midway(&c, &pass);
    assert!(
        dmkit_read(&c) == c_plain,
        "dmkit reads another plaintext mid-way"
    );

    // 4. LUKS1 -> LUKS2 -> LUKS1, each stage kept.
    let d1 = sparse(dir, "d1.img");
    fmt_dmkit(&d1, "luks1");
    let d_plain = dmkit_fill(&d1, 4);
    let d2 = dir.join("d2.img");
    let d3 = dir.join("d3.img");
    std::fs::copy(&d1, &d2).unwrap();
    dmkit_ok(&["luks", "convert", "--batch-mode", "--type", "luks2", s(&d2)]);
    std::fs::copy(&d2, &d3).unwrap();
    dmkit_ok(&["luks", "convert", "--batch-mode", "--type", "luks1", s(&d3)]);
    for (img, version) in [(&d1, "1"), (&d2, "2"), (&d3, "1")] {
        let dump = run_ok("cryptsetup", &["luksDump", s(img)]);
        assert!(
            dump.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Version:", version]),
            "{}: not LUKS{version}:\n{dump}",
            img.display()
        );
        assert!(
            dmkit_read(img) == d_plain,
            "{}: dmkit reads another plaintext",
            img.display()
        );
    }
    let host_prepared = started.elapsed();

    let mut script = String::from("set -u\nexport LC_ALL=C\n");
    script.push_str(&format!("printf %s {} > /tmp/pass\n", sh_quote(PASS)));
    script.push_str(
        r#"FAST="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
sum() { echo "SUM $1 $(sha256sum /dev/mapper/$2 | cut -d' ' -f1)"; }
fail() { echo "FAILED $*"; exit 1; }
open() { cryptsetup open --key-file /tmp/pass "$@"; }
at() { echo "AT $1 $(cut -d' ' -f1 /proc/uptime)" >&2; }
at start

# 1. online reencryption of dmkit's volume.
open /dev/disk/a a || fail open a
sum a-before a
cryptsetup reencrypt --batch-mode --key-file /tmp/pass $FAST /dev/disk/a >&2 || fail reencrypt a
cryptsetup status a >&2
sum a-after a
cryptsetup close a || fail close a

at "2"
# 2. dmkit's offline reencryption.
open --readonly /dev/disk/b b || fail open b
sum b b
cryptsetup close b

at "3"
# 3. dmkit's mid-way image: open, read, finish online, read.
open /dev/disk/c c || fail open c
echo "TABLE-C $(dmsetup table c | wc -l)"
dmsetup table c | sed 's/ [0-9a-f]\{64,\} / KEY /; s/:[0-9a-f]\{64,\}/:KEY/' >&2
sum c-mid c
at c-resume
cryptsetup reencrypt --batch-mode --resume-only --key-file /tmp/pass $FAST /dev/disk/c >&2 \
    || fail resume c
sum c-after c
cryptsetup close c || fail close c
if cryptsetup luksDump /dev/disk/c | grep -q -i 'online-reencrypt'; then fail c still in reencryption; fi

at "4"
# 4. convert stages.
for d in d1 d2 d3; do
    open --readonly /dev/disk/$d $d || fail open $d
    sum $d $d
    cryptsetup close $d
done
at end
echo DONE
"#,
    );
    let disks = [
        Disk::rw("a", &a),
        Disk::ro("b", &b),
        Disk::rw("c", &c),
        Disk::ro("d1", &d1),
        Disk::ro("d2", &d2),
        Disk::ro("d3", &d3),
    ];
    let run = g.run(&script, &disks, Duration::from_secs(600));
    run.assert_ok("reencryption and convert in the guest");
    let out = run.out();
    // Where the guest's time went (uptime at each phase) and the mid-way table.
    for l in run.stderr.lines() {
        if l.starts_with("AT ") || l.contains(" crypt ") || l.contains(" linear ") {
            eprintln!("guest: {l}");
        }
    }
    let sums = sums(&out);
    let want = |name: &str, digest: [u8; 32]| {
        assert_eq!(
            sums.get(name).map(String::as_str),
            Some(hex(&digest).as_str()),
            "{name}: the kernel reads another plaintext\n--- stdout:\n{out}\n--- stderr:\n{}",
            run.stderr
        );
    };

    want("a-before", a_digest);
    want("a-after", a_digest);
    assert!(!in_reencryption(&a), "the guest left a in reencryption");
    assert!(
        dmkit_read(&a) == a_plain,
        "dmkit reads another plaintext after cryptsetup's online reencryption"
    );

    want("b", sha256(&b_plain));

    let segments: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("TABLE-C "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        segments >= 2,
        "the mid-way image mapped as {segments} segment(s), not the reencryption table"
    );
    want("c-mid", sha256(&c_plain));
    want("c-after", sha256(&c_plain));
    assert!(!in_reencryption(&c), "the guest did not finish c");
    assert!(
        dmkit_read(&c) == c_plain,
        "dmkit reads another plaintext after cryptsetup finished its reencryption"
    );

    let d_digest = sha256(&d_plain);
    for d in ["d1", "d2", "d3"] {
        want(d, d_digest);
    }
    eprintln!(
        "kernel_luks_reencrypt: host preparation {:.1}s, guest run {:.1}s, total {:.1}s",
        host_prepared.as_secs_f64(),
        run.elapsed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
