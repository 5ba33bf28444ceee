//! dm-integrity I/O against the real kernel (tests/kernel/): the guest's kernel writes through
//! dm-integrity in modes J, B and D and dmkit reads it; dmkit writes in modes J, B and D and the
//! guest's kernel reads it; and journal replay both ways:
//! (a) the guest writes in mode J with a long commit time, flushes, and is killed
//!     (`echo b > /proc/sysrq-trigger`) before the journal is written in place: dmkit replays
//!     it on open and every flushed write is there;
//! (b) dmkit's server is `kill -9`ed with a flushed journal not yet written in place: the
//!     guest's kernel replays it and every flushed write is there.
//!
//! Two guest boots in all; images of a few MiB. Skipped (with a message) without the guest's
//! prerequisites, or without root and /dev/fuse for the server case, unless `CI` is set.

mod common;
#[path = "kernel/harness.rs"]
mod harness;

use common::rng::SplitMix64;
use common::run::RunDir;
use dmkit::block::{BlockDevice, FileDevice, OpenOptions};
use dmkit::integrity::{IntegrityDevice, IntegrityOptions, Mode, TagAlgorithm};
use harness::{guest, sh_quote, Bundle, Disk};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

const KEY: &str = "0123456789abcdef0123456789abcdef";
const SIZE: u64 = 4 << 20;

/// One image of the matrix.
struct Case {
    name: &'static str,
    /// integritysetup format options.
    format: &'static [&'static str],
    /// Algorithm options for integritysetup open and for dmkit.
    alg: TagAlgorithm,
    /// Mode the guest writes in.
    guest_mode: Mode,
    /// Mode dmkit writes in.
    dmkit_mode: Mode,
}

const CASES: &[Case] = &[
    Case {
        name: "j_crc32c_512",
        format: &["--integrity", "crc32c"],
        alg: TagAlgorithm::Crc32c,
        guest_mode: Mode::Journal,
        dmkit_mode: Mode::Bitmap,
    },
    Case {
        name: "b_sha256_4k",
        format: &["--integrity", "sha256", "--sector-size", "4096"],
        alg: TagAlgorithm::Sha256,
        guest_mode: Mode::Bitmap,
        dmkit_mode: Mode::Journal,
    },
    Case {
        name: "j_hmac_4k_il",
        format: &[
            "--integrity",
            "hmac-sha256",
            "--integrity-key-file",
            "/tmp/key",
            "--integrity-key-size",
            "32",
            "--sector-size",
            "4096",
            "--interleave-sectors",
            "2048",
        ],
        alg: TagAlgorithm::HmacSha256,
        guest_mode: Mode::Journal,
        dmkit_mode: Mode::Journal,
    },
    Case {
        name: "b_crc32_1k",
        format: &[
            "--integrity",
            "crc32",
            "--sector-size",
            "1024",
            "--tag-size",
            "8",
        ],
        alg: TagAlgorithm::Crc32,
        guest_mode: Mode::Bitmap,
        dmkit_mode: Mode::Bitmap,
    },
    Case {
        name: "d_sha1_512_il",
        format: &["--integrity", "sha1", "--interleave-sectors", "512"],
        alg: TagAlgorithm::Sha1,
        guest_mode: Mode::Direct,
        dmkit_mode: Mode::Direct,
    },
];

/// The guest writes this case (a), then dies; mode J, long commit time.
const REPLAY_A: &str = "jreplay_a";
/// dmkit's server writes this one (b) and is killed.
const REPLAY_B: &str = "jreplay_b";

fn open_opts(alg: TagAlgorithm, mode: Mode) -> String {
    let mut o = format!("--integrity {}", alg.name());
    if alg == TagAlgorithm::HmacSha256 {
        o.push_str(" --integrity-key-file /tmp/key --integrity-key-size 32");
    }
    match mode {
        Mode::Bitmap => o.push_str(" --integrity-bitmap-mode"),
        Mode::Direct => o.push_str(" --integrity-no-journal"),
        Mode::Recovery => o.push_str(" --integrity-recovery-mode"),
        Mode::Journal => {}
    }
    o
}

fn dmkit_open(path: &Path, alg: TagAlgorithm, mode: Mode) -> IntegrityDevice {
    let f = FileDevice::open(
        path,
        OpenOptions {
            read_only: false,
            direct: false,
            exclusive: false,
        },
    )
    .unwrap();
    let mut o = IntegrityOptions::new("t", mode, alg);
    if alg == TagAlgorithm::HmacSha256 {
        o.key = Some(Zeroizing::new(KEY.as_bytes().to_vec()));
    }
    IntegrityDevice::open(Arc::new(f), o).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What the guest writes into case `i` (at 64 KiB), and dmkit then (at 192 KiB, overlapping).
fn payload(i: u64, who: u64) -> Vec<u8> {
    SplitMix64(i * 1000 + who).bytes(256 << 10)
}

fn read_all(d: &IntegrityDevice) -> Vec<u8> {
    let mut all = vec![0u8; d.size() as usize];
    d.read_at(&mut all, 0)
        .unwrap_or_else(|e| panic!("dmkit read: {e}"));
    all
}

#[test]
fn kernel_and_dmkit_read_each_others_writes_and_replay_each_others_journals() {
    let Some(g) = guest("kernel_integrity_io") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut disks = Vec::new();
    let mut bundle = Bundle::default();
    let mut script = String::from("set -u\nexport LC_ALL=C\n");
    writeln!(script, "printf %s {} > /tmp/key", sh_quote(KEY)).unwrap();
    for (i, c) in CASES.iter().enumerate() {
        let p = dir.join(format!("{}.img", c.name));
        std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
        disks.push(Disk::rw(c.name, &p));
        bundle.add_bytes(&format!("{}.p", c.name), &payload(i as u64, 1));
    }
    for name in [REPLAY_A, REPLAY_B] {
        let p = dir.join(format!("{name}.img"));
        std::fs::File::create(&p)
            .unwrap()
            .set_len(2 * SIZE)
            .unwrap();
        disks.push(Disk::rw(name, &p));
    }
    bundle.add_bytes("replay.p", &payload(99, 1));
    disks.push(bundle.write(&dir.join("b1.bundle")));
    script.push_str(&bundle.prelude());
    script.push_str(
        r#"
write_case() { # NAME MODE-OPTS FORMAT-OPTS...
    local name=$1 mopts=$2; shift 2
    integritysetup format -q --batch-mode "$@" /dev/disk/$name >&2 || return 1
    integritysetup open $mopts /dev/disk/$name g_$name >&2 || return 1
    dd if=$(attach $name.p) of=/dev/mapper/g_$name bs=64k seek=1 oflag=direct conv=fsync status=none || return 1
    integritysetup close g_$name || return 1
    echo "WROTE $name"
}
"#,
    );
    for c in CASES {
        let fmt: Vec<String> = c.format.iter().map(|o| sh_quote(o)).collect();
        writeln!(
            script,
            "write_case {} {} {} || echo FAILED {}",
            c.name,
            sh_quote(&open_opts(c.alg, c.guest_mode)),
            fmt.join(" "),
            c.name
        )
        .unwrap();
    }
    // (b)'s image: formatted only (dmkit writes it).
    writeln!(
        script,
        "integritysetup format -q --batch-mode --journal-size 2097152 /dev/disk/{REPLAY_B} >&2 && echo FORMATTED {REPLAY_B}"
    )
    .unwrap();
    // (a): write, flush, die before the commit timer or the watermark writes it in place.
    writeln!(
        script,
        r#"integritysetup format -q --batch-mode --journal-size 2097152 /dev/disk/{REPLAY_A} >&2 || echo FAILED format
integritysetup open --journal-commit-time 600000 --journal-watermark 90 /dev/disk/{REPLAY_A} g_ra >&2 || echo FAILED open
dd if=$(attach replay.p) of=/dev/mapper/g_ra bs=64k seek=1 oflag=direct conv=fsync status=none || echo FAILED dd
blockdev --flushbufs /dev/mapper/g_ra
sync
echo KILLING
echo b > /proc/sysrq-trigger
sleep 30
echo NOT-KILLED"#
    )
    .unwrap();
    let run = g.run(&script, &disks, Duration::from_secs(600));
    let out = run.out();
    assert!(
        out.contains("KILLING") && !out.contains("FAILED") && !out.contains("NOT-KILLED"),
        "guest run 1 (status {}):\n{out}\n{}",
        run.status,
        run.stderr
    );
    for c in CASES {
        assert!(
            out.contains(&format!("WROTE {}", c.name)),
            "{}:\n{out}",
            c.name
        );
    }

    // The kernel's writes, read by dmkit; then dmkit's own writes on top.
    let mut expected = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let p = dir.join(format!("{}.img", c.name));
        let d = dmkit_open(&p, c.alg, c.guest_mode);
        let mut want = vec![0u8; d.size() as usize];
        want[64 << 10..320 << 10].copy_from_slice(&payload(i as u64, 1));
        assert!(
            read_all(&d) == want,
            "{}: dmkit reads the kernel's writes",
            c.name
        );
        drop(d);
        let d = dmkit_open(&p, c.alg, c.dmkit_mode);
        let mine = payload(i as u64, 2);
        d.write_at(&mine, 192 << 10).unwrap();
        d.flush().unwrap();
        want[192 << 10..448 << 10].copy_from_slice(&mine);
        assert!(
            read_all(&d) == want,
            "{}: dmkit reads its own writes",
            c.name
        );
        d.close().unwrap();
        expected.push(want);
    }

    // (a) the kernel's journal, replayed by dmkit.
    let pa = dir.join(format!("{REPLAY_A}.img"));
    {
        let d = dmkit_open(&pa, TagAlgorithm::Crc32c, Mode::Journal);
        let mut want = vec![0u8; d.size() as usize];
        want[64 << 10..320 << 10].copy_from_slice(&payload(99, 1));
        let replayed = d
            .stats()
            .replayed_blocks
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            replayed, 512,
            "(a): dmkit replays the kernel's 512 journalled sectors"
        );
        assert!(
            read_all(&d) == want,
            "(a): the flushed writes are there after replay"
        );
    }

    // (b) dmkit's server killed with its journal pending.
    let pb = dir.join(format!("{REPLAY_B}.img"));
    let mine_b = payload(98, 2);
    let served_b = server_write_and_kill(&pb, &mine_b);

    // The guest reads everything dmkit wrote, and replays (b).
    let mut bundle = Bundle::default();
    let mut disks = Vec::new();
    for (c, want) in CASES.iter().zip(&expected) {
        disks.push(Disk::rw(c.name, dir.join(format!("{}.img", c.name))));
        bundle.add_bytes(&format!("{}.e", c.name), want);
    }
    let mut want_b = vec![0u8; served_b as usize];
    want_b[128 << 10..384 << 10].copy_from_slice(&mine_b);
    bundle.add_bytes(&format!("{REPLAY_B}.e"), &want_b);
    disks.push(Disk::rw(REPLAY_B, &pb));
    disks.push(bundle.write(&dir.join("b2.bundle")));
    let mut script = String::from("set -u\nexport LC_ALL=C\n");
    writeln!(script, "printf %s {} > /tmp/key", sh_quote(KEY)).unwrap();
    script.push_str(&bundle.prelude());
    script.push_str(
        r#"
check() { # NAME OPEN-OPTS
    local name=$1 e
    integritysetup open $2 /dev/disk/$name g_$name >&2 || { echo "OPENFAIL $name"; return 1; }
    e=$(attach $name.e)
    if cmp /dev/mapper/g_$name $e >&2; then echo "SAME $name"; else echo "DIFF $name"; fi
    integritysetup close g_$name
}
"#,
    );
    for c in CASES {
        // Each in the mode dmkit wrote it in, and once more in the other.
        writeln!(
            script,
            "check {} {}",
            c.name,
            sh_quote(&open_opts(c.alg, c.dmkit_mode))
        )
        .unwrap();
    }
    writeln!(script, "check {REPLAY_B} ''").unwrap();
    writeln!(script, "dmesg | grep -i integrity >&2; true").unwrap();
    let run = g.run(&script, &disks, Duration::from_secs(600));
    let out = run.out();
    for name in CASES.iter().map(|c| c.name).chain([REPLAY_B]) {
        assert!(
            out.contains(&format!("SAME {name}")),
            "{name}: the kernel reads what dmkit wrote:\n{out}\n{}",
            run.stderr
        );
    }
}

/// Serve `img` with `dmkit integrity open` (mode J, commit time 10 min), write `data` at
/// 128 KiB through the served file, fsync (the journal commit), check that nothing reached its
/// place yet, `kill -9` the server. Returns the device size.
fn server_write_and_kill(img: &Path, data: &[u8]) -> u64 {
    use std::os::unix::fs::FileExt;
    let run = RunDir::new();
    let name = "kio_b";
    let out = run.output(&[
        "integrity",
        "open",
        img.to_str().unwrap(),
        name,
        "--journal-commit-time",
        "600000",
    ]);
    assert!(
        out.status.success(),
        "dmkit integrity open: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run.track(name);
    let served = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&served)
        .unwrap();
    let size = f.metadata().unwrap().len();
    f.write_all_at(data, 128 << 10).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 128 << 10).unwrap();
    assert!(back == data, "(b): read back through the export");
    drop(f);
    let status = run.ok(&["status", name, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["kind"], "integrity", "{status}");
    let pid = v["pid"].as_u64().expect("pid") as i32;
    // SAFETY: kill(2) on the server's pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    common::sys::wait_until("the killed server to go", || {
        common::sys::pid_gone(pid as u32)
    });
    // Its leftovers (the FUSE mount) go with close.
    let _ = run.output(&["close", name]);
    // The journal holds the data; its place does not yet.
    let raw = std::fs::read(img).unwrap();
    let hit = raw.windows(64).any(|w| w == &data[..64]);
    assert!(hit, "(b): the data is in the journal");
    size
}
