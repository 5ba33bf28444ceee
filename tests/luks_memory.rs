//! Keys in the memory of a serving daemon: after `luks open` with the passphrase on stdin, the
//! server process has locked memory (VmLck), the volume key (each XTS half) appears only in
//! mappings marked MADV_DONTDUMP (so never in a core dump), and the passphrase appears
//! nowhere. Checked by reading the server's /proc/PID/mem.
//!
//! Not covered, and so not tested: AES-CBC and AES-XTS on machines without VAES run on OpenSSL,
//! whose cipher contexts keep a key schedule (its first round key is the key) on OpenSSL's heap.

mod common;

use common::env::{fuse_missing, missing};
use common::run::Workspace;
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};

/// One mapping of a process: address range, whether readable, its VmFlags, its name.
struct Mapping {
    lo: u64,
    hi: u64,
    readable: bool,
    flags: String,
    name: String,
}

fn mappings(pid: u32) -> Vec<Mapping> {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        if let Some(f) = line.strip_prefix("VmFlags:") {
            if let Some(m) = out.last_mut() {
                m.flags = f.to_string();
            }
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        out.push(Mapping {
            lo,
            hi,
            readable: perms.starts_with('r'),
            flags: String::new(),
            name: parts.nth(3).unwrap_or("").to_string(),
        });
    }
    out
}

/// Where `needle` occurs in `pid`'s memory: (address, mapping excluded from core dumps).
fn find(pid: u32, needle: &[u8]) -> Vec<(u64, bool)> {
    let mem = fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut hits = Vec::new();
    for m in mappings(pid) {
        if !m.readable || m.name == "[vvar]" || m.name == "[vsyscall]" || m.name == "[vvar_vclock]"
        {
            continue;
        }
        let mut buf = vec![0u8; (m.hi - m.lo) as usize];
        if mem.read_exact_at(&mut buf, m.lo).is_err() {
            continue;
        }
        let mut from = 0;
        while let Some(i) = buf[from..].windows(needle.len()).position(|w| w == needle) {
            hits.push((m.lo + (from + i) as u64, m.flags.contains(" dd")));
            from += i + 1;
        }
    }
    hits
}

fn vm_locked_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_serving_daemon_keeps_keys_locked_undumpable_and_forgets_the_passphrase() {
    if fuse_missing() {
        return;
    }
    if !common::env::is_root() {
        missing("reading another process's memory needs root");
        return;
    }
    let passphrase = b"a passphrase typed on stdin 7c1e";
    for cipher in [
        "aes-xts-plain64",
        "serpent-xts-plain64",
        "twofish-xts-plain64",
    ] {
        let e = Workspace::new();
        let img = e.sparse("disk.img", 20 << 20);
        let pass = e.s("pass");
        fs::write(&pass, passphrase).unwrap();
        e.run.ok(&[
            "luks",
            "format",
            "-q",
            "--cipher",
            cipher,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pass,
            &img,
        ]);
        let dump = e.run.ok(&[
            "luks",
            "dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &pass,
            &img,
        ]);
        let vk = common::volume_key::from_dump(&dump);
        fs::remove_file(&pass).unwrap();
        // Open with the passphrase on stdin (a line), as a person piping it would.
        let mut child = Command::new(common::DMKIT)
            .args(["luks", "open", &img, "m"])
            .env("DMKIT_RUN_DIR", e.run.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&[&passphrase[..], b"\n"].concat()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        e.run.track("m");
        assert!(
            out.status.success(),
            "{cipher}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status: serde_json::Value =
            serde_json::from_str(&e.run.ok(&["status", "m", "--json"])).unwrap();
        let pid = status["pid"].as_u64().unwrap() as u32;
        assert!(
            vm_locked_kib(pid) > 0,
            "{cipher}: the server has no locked memory"
        );
        for (what, needle) in [
            ("first key half", &vk[..32]),
            ("second key half", &vk[32..]),
        ] {
            let hits = find(pid, needle);
            assert!(
                hits.iter().all(|&(_, dd)| dd),
                "{cipher}: the {what} is in dumpable memory at {:x?}",
                hits.iter()
                    .filter(|h| !h.1)
                    .map(|h| h.0)
                    .collect::<Vec<_>>()
            );
        }
        assert!(
            find(pid, &vk).iter().all(|&(_, dd)| dd),
            "{cipher}: volume key"
        );
        assert!(
            find(pid, passphrase).is_empty(),
            "{cipher}: the server still holds the passphrase"
        );
        e.run.close("m");
    }
}

#[test]
fn without_the_right_to_lock_memory_one_warning_and_keep_going() {
    if common::env::tool_missing("setpriv", "util-linux")
        || common::env::tool_missing("prlimit", "util-linux")
    {
        return;
    }
    if !common::env::is_root() {
        missing("dropping CAP_IPC_LOCK from the bounding set needs root");
        return;
    }
    let e = Workspace::new();
    let img = e.sparse("disk.img", 20 << 20);
    let pass = e.s("pass");
    fs::write(&pass, "pw").unwrap();
    e.run.ok(&[
        "luks",
        "format",
        "-q",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &pass,
        &img,
    ]);
    // Root without CAP_IPC_LOCK and with a locked-memory limit of 0: mlock is refused.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-ipc_lock",
            "prlimit",
            "--memlock=0:0",
            common::DMKIT,
        ])
        .args(["luks", "test-passphrase", "--key-file", &pass, &img])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Key slot 0 unlocked."
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot lock key memory") && err.contains("kept out of core dumps"),
        "{err}"
    );
}
