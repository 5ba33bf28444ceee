//! The Rust side of the kernel test harness (tests/kernel/run-guest.sh): boot the Debian kernel
//! under QEMU, run a bash script as root in it with host image files as disks, get its
//! stdout, stderr and exit status back. Shared by the `tests/kernel*.rs` test files through
//! `#[path = "kernel/harness.rs"] mod harness;`.
//!
//! A test calls [`guest`] first: it builds (or finds in target/kernel-cache/) the guest, and
//! returns `None` after printing why when qemu or the kernel package is missing — unless `CI`
//! is set, where a missing prerequisite is a failure. In CI, as root, missing packages are
//! installed first with scripts/deps.sh.
//!
//! Scripts run with bash (busybox sh would prefer its applets to the real tools), in /tmp (a
//! tmpfs), with the disks at /dev/disk/NAME. Many files can share one disk through a
//! [`Bundle`]: the script's prelude then attaches each one as a loop device.
//!
//! Reverse direction: [`format_in_guest`] formats dm-integrity and LUKS2 (with and without
//! authenticated encryption) images with the guest's integritysetup and cryptsetup, writes a
//! known payload through the kernel's mapping, and hands the images back to host-side tests.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run_guest_sh() -> PathBuf {
    repo().join("tests/kernel/run-guest.sh")
}

/// A prepared guest (kernel + initramfs built and cached).
#[derive(Debug, Clone)]
pub struct Guest {
    /// The cache directory holding vmlinux and initramfs.cpio.
    pub dir: PathBuf,
    /// The kernel meta packages it was built from (`DMKIT_GUEST_KERNEL_PKG`), if not the
    /// default.
    pub kernel_pkg: Option<String>,
}

/// Exit status of run-guest.sh when a prerequisite is missing.
const MISSING: i32 = 77;

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// `run-guest.sh`, with the kernel package of `kernel_pkg` if given.
fn run_guest_cmd(kernel_pkg: Option<&str>) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(run_guest_sh());
    if let Some(pkg) = kernel_pkg {
        cmd.env("DMKIT_GUEST_KERNEL_PKG", pkg);
    }
    cmd
}

fn prepare(kernel_pkg: Option<&str>) -> Result<Guest, String> {
    let attempt = || {
        run_guest_cmd(kernel_pkg)
            .arg("--prepare")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", run_guest_sh().display()))
    };
    let mut out = attempt()?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if out.status.code() == Some(MISSING) && in_ci() && root {
        eprintln!(
            "kernel tests: installing prerequisites with scripts/deps.sh ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let st = Command::new("bash")
            .arg(repo().join("scripts/deps.sh"))
            .status()
            .map_err(|e| format!("cannot run scripts/deps.sh: {e}"))?;
        if !st.success() {
            return Err(format!("scripts/deps.sh failed ({st})"));
        }
        out = attempt()?;
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(0) => {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !stderr.is_empty() {
                eprintln!("{stderr}");
            }
            Ok(Guest {
                dir: PathBuf::from(dir),
                kernel_pkg: kernel_pkg.map(str::to_string),
            })
        }
        Some(MISSING) => Err(format!(
            "{stderr} (scripts/deps.sh installs what the kernel tests need)"
        )),
        _ => panic!("run-guest.sh --prepare failed ({}): {stderr}", out.status),
    }
}

/// The guest, or `None` (after printing why) when it cannot be built here. In CI a missing
/// prerequisite panics instead.
pub fn guest(test: &str) -> Option<Guest> {
    static GUEST: OnceLock<Result<Guest, String>> = OnceLock::new();
    found(test, GUEST.get_or_init(|| prepare(None)))
}

/// [`guest`] booting another kernel: the first of the meta packages `kernel_pkg` (space
/// separated, e.g. `linux-image-6.12-cloud-amd64`) that apt knows. Built and cached once per
/// package list.
pub fn guest_with_kernel(test: &str, kernel_pkg: &str) -> Option<Guest> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static GUESTS: OnceLock<Mutex<HashMap<String, Result<Guest, String>>>> = OnceLock::new();
    let mut guests = GUESTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let prepared = guests
        .entry(kernel_pkg.to_string())
        .or_insert_with(|| prepare(Some(kernel_pkg)));
    found(test, prepared)
}

fn found(test: &str, prepared: &Result<Guest, String>) -> Option<Guest> {
    match prepared {
        Ok(g) => Some(g.clone()),
        Err(why) if in_ci() => panic!("{test}: the kernel tests cannot run in CI: {why}"),
        Err(why) => {
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}

/// A host image file attached to the guest as /dev/disk/NAME.
#[derive(Debug, Clone)]
pub struct Disk {
    /// Name in the guest (up to 20 of `A-Za-z0-9_.-`).
    pub name: String,
    /// The image file.
    pub path: PathBuf,
    /// Attached read-write (else read-only).
    pub rw: bool,
}

impl Disk {
    /// A read-only disk.
    pub fn ro(name: &str, path: impl Into<PathBuf>) -> Disk {
        Disk {
            name: name.into(),
            path: path.into(),
            rw: false,
        }
    }
    /// A read-write disk.
    pub fn rw(name: &str, path: impl Into<PathBuf>) -> Disk {
        Disk {
            name: name.into(),
            path: path.into(),
            rw: true,
        }
    }
}

/// What a guest run gave back.
#[derive(Debug)]
pub struct GuestRun {
    /// The script's exit status (125: the guest died or timed out; see `stderr`).
    pub status: i32,
    /// The script's stdout, byte for byte.
    pub stdout: Vec<u8>,
    /// The script's stderr (and the harness's messages).
    pub stderr: String,
    /// Wall time of the whole run, boot included.
    pub elapsed: Duration,
}

impl GuestRun {
    /// stdout as text.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The stdout lines starting with `prefix`, without it.
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        self.out()
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
            .collect()
    }

    /// Panics with everything the guest said unless the script exited 0.
    pub fn assert_ok(&self, what: &str) {
        assert_eq!(
            self.status,
            0,
            "{what}: guest script failed (status {})\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status,
            self.out(),
            self.stderr
        );
    }
}

impl Guest {
    /// Runs `script` (bash) as root in a fresh guest with `disks`, killing it after
    /// `timeout`.
    pub fn run(&self, script: &str, disks: &[Disk], timeout: Duration) -> GuestRun {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script.sh");
        std::fs::write(&path, script).unwrap();
        let mut cmd = run_guest_cmd(self.kernel_pkg.as_deref());
        cmd.arg("--timeout")
            .arg(timeout.as_secs().max(1).to_string());
        for d in disks {
            let mode = if d.rw { "rw" } else { "ro" };
            cmd.arg("--disk")
                .arg(format!("{}={}:{mode}", d.name, d.path.display()));
        }
        cmd.arg(&path).stdin(Stdio::null());
        let start = Instant::now();
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run run-guest.sh: {e}"));
        let run = GuestRun {
            status: out.status.code().unwrap_or(-1),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: start.elapsed(),
        };
        eprintln!(
            "guest run: status {} in {:.1}s",
            run.status,
            run.elapsed.as_secs_f64()
        );
        run
    }
}

/// Quotes a string for bash.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Many host files on one guest disk: each starts at a 64 KiB-aligned offset of one image, and
/// [`Bundle::prelude`] defines `attach NAME` in the script, which prints a loop device over
/// that file (read-only; the loop device's size is the file's).
#[derive(Debug, Default)]
pub struct Bundle {
    entries: Vec<(String, u64, u64)>,
    image: Vec<u8>,
}

impl Bundle {
    /// Adds a file's contents under `name` (`[A-Za-z0-9_.-]+`).
    pub fn add(&mut self, name: &str, path: &Path) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        self.add_bytes(name, &data);
    }

    /// Adds bytes under `name`.
    pub fn add_bytes(&mut self, name: &str, data: &[u8]) {
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
            "bundle entry name {name:?}"
        );
        // losetup takes a size limit of 0 as "no limit".
        assert!(!data.is_empty(), "bundle entry {name:?} is empty");
        let off = self.image.len() as u64;
        self.image.extend_from_slice(data);
        let aligned = self.image.len().div_ceil(65536) * 65536;
        self.image.resize(aligned, 0);
        self.entries
            .push((name.to_string(), off, data.len() as u64));
    }

    /// Writes the image to `path` and returns the disk (named `bundle`).
    pub fn write(&self, path: &Path) -> Disk {
        std::fs::write(path, &self.image).unwrap();
        Disk::ro("bundle", path)
    }

    /// Bash defining `attach NAME` (prints /dev/loopN for the entry) for the script.
    pub fn prelude(&self) -> String {
        let mut s = String::from("declare -A BUNDLE_OFF BUNDLE_LEN\n");
        for (name, off, len) in &self.entries {
            writeln!(s, "BUNDLE_OFF[{name}]={off}; BUNDLE_LEN[{name}]={len}").unwrap();
        }
        s.push_str(
            r#"attach() {
    losetup -f --show -r -o "${BUNDLE_OFF[$1]}" --sizelimit "${BUNDLE_LEN[$1]}" /dev/disk/bundle
}
"#,
        );
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Reverse direction: images formatted by the kernel's own tools, handed back to the host.

/// What to format in the guest.
#[derive(Debug, Clone)]
pub enum GuestFormat {
    /// `integritysetup format` (standalone dm-integrity) with these options, e.g.
    /// `["--integrity", "sha256", "--sector-size", "4096"]`.
    Integrity(Vec<String>),
    /// `cryptsetup luksFormat --type luks2` with PBKDF2 at the minimum iteration count and
    /// these extra options, e.g. `["--integrity", "hmac-sha256"]`.
    Luks2(Vec<String>),
}

/// One image to format in the guest.
#[derive(Debug, Clone)]
pub struct FormatJob {
    /// Name (also the image's file name and the guest disk name; up to 20 characters).
    pub name: String,
    /// What to format.
    pub format: GuestFormat,
    /// Image size in bytes.
    pub size: u64,
    /// Bytes written through the opened mapping from offset 0 after formatting (at most the
    /// mapping's size).
    pub payload: Vec<u8>,
}

/// An image the guest formatted and wrote.
#[derive(Debug, Clone)]
pub struct FormattedImage {
    /// The job.
    pub job: FormatJob,
    /// The image file on the host.
    pub path: PathBuf,
    /// The passphrase of LUKS2 images.
    pub passphrase: Option<String>,
    /// The guest tool's dump of the image (`integritysetup dump`, `cryptsetup luksDump`).
    pub guest_dump: String,
    /// Size of the opened mapping in bytes, as the kernel reported it.
    pub mapped_size: u64,
    /// The guest read the payload back identical after closing and reopening the device.
    pub read_back_ok: bool,
}

/// The passphrase of the LUKS2 images [`format_in_guest`] makes.
pub const GUEST_PASSPHRASE: &str = "dmkit kernel oracle";

/// Formats every job's image in one guest boot, writes its payload through the kernel's
/// mapping, closes and reopens it to read the payload back, and returns the images (files in
/// `dir`). Panics if the guest fails.
pub fn format_in_guest(guest: &Guest, dir: &Path, jobs: &[FormatJob]) -> Vec<FormattedImage> {
    let mut disks = Vec::new();
    let mut bundle = Bundle::default();
    let mut script = String::from("set -u\nexport LC_ALL=C\n");
    for job in jobs {
        let path = dir.join(format!("{}.img", job.name));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(job.size).unwrap();
        disks.push(Disk::rw(&job.name, &path));
        assert!(
            !job.payload.is_empty() && job.payload.len() % 4096 == 0,
            "{}: the payload must be a non-empty multiple of 4096 bytes (written with O_DIRECT)",
            job.name
        );
        bundle.add_bytes(&format!("{}.payload", job.name), &job.payload);
    }
    let bundle_path = dir.join("payloads.bundle");
    disks.push(bundle.write(&bundle_path));
    script.push_str(&bundle.prelude());
    writeln!(script, "PASS={}", sh_quote(GUEST_PASSPHRASE)).unwrap();
    script.push_str(
        r#"
# one NAME KIND OPTIONS...: format /dev/disk/NAME, write the payload, reopen, read it back.
one() {
    local name=$1 kind=$2
    shift 2
    local dev=/dev/disk/$name map=g_$name payload size
    payload=$(attach "$name.payload")
    size=${BUNDLE_LEN[$name.payload]}
    # integritysetup open takes the algorithm options, not the layout ones.
    local open_opts=() skip=0 o
    for o in "$@"; do
        if [ $skip = 1 ]; then skip=0; continue; fi
        case $o in
        --sector-size|--tag-size|--interleave-sectors|--journal-size|-s|-t) skip=1 ;;
        --sector-size=*|--tag-size=*|--interleave-sectors=*|--journal-size=*) ;;
        *) open_opts+=("$o") ;;
        esac
    done
    case $kind in
    integrity)
        integritysetup format -q --batch-mode "$@" "$dev" >&2 || return 1
        integritysetup open "${open_opts[@]}" "$dev" "$map" >&2 || return 1 ;;
    luks2)
        printf %s "$PASS" | cryptsetup luksFormat -q --batch-mode --type luks2 \
            --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file - "$@" "$dev" >&2 || return 1
        printf %s "$PASS" | cryptsetup open --key-file - "$dev" "$map" >&2 || return 1 ;;
    esac
    echo "MAPPED $name $(blockdev --getsize64 /dev/mapper/$map)"
    dd if="$payload" of=/dev/mapper/$map bs=64k oflag=direct conv=fsync status=none || return 1
    if [ $kind = integrity ]; then integritysetup close "$map"; else cryptsetup close "$map"; fi
    case $kind in
    integrity) integritysetup open "${open_opts[@]}" "$dev" "$map" >&2 || return 1 ;;
    luks2) printf %s "$PASS" | cryptsetup open --key-file - "$dev" "$map" >&2 || return 1 ;;
    esac
    if cmp -n "$size" "$payload" /dev/mapper/$map >&2; then echo "READBACK $name ok"; else echo "READBACK $name bad"; fi
    if [ $kind = integrity ]; then integritysetup close "$map"; else cryptsetup close "$map"; fi
    echo "DUMP-BEGIN $name"
    if [ $kind = integrity ]; then integritysetup dump "$dev"; else cryptsetup luksDump "$dev"; fi
    echo "DUMP-END $name"
    losetup -d "$payload"
}
"#,
    );
    for job in jobs {
        let (kind, opts) = match &job.format {
            GuestFormat::Integrity(o) => ("integrity", o),
            GuestFormat::Luks2(o) => ("luks2", o),
        };
        let opts: Vec<String> = opts.iter().map(|o| sh_quote(o)).collect();
        writeln!(
            script,
            "one {} {kind} {} || {{ echo \"FAILED {}\"; rc=1; }}",
            job.name,
            opts.join(" "),
            job.name
        )
        .unwrap();
    }
    script.push_str("exit ${rc:-0}\n");

    let run = guest.run(&script, &disks, Duration::from_secs(480));
    run.assert_ok("format_in_guest");
    let out = run.out();
    let mut images = Vec::new();
    for job in jobs {
        let mapped_size = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("MAPPED {} ", job.name)))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no mapped size for {}:\n{out}", job.name));
        let read_back_ok = out
            .lines()
            .any(|l| l == format!("READBACK {} ok", job.name));
        let begin = format!("DUMP-BEGIN {}\n", job.name);
        let end = format!("DUMP-END {}\n", job.name);
        let guest_dump = out
            .split_once(&begin)
            .and_then(|(_, rest)| rest.split_once(&end))
            .map(|(d, _)| d.to_string())
            .unwrap_or_default();
        images.push(FormattedImage {
            job: job.clone(),
            path: dir.join(format!("{}.img", job.name)),
            passphrase: matches!(job.format, GuestFormat::Luks2(_))
                .then(|| GUEST_PASSPHRASE.to_string()),
            guest_dump,
            mapped_size,
            read_back_ok,
        });
    }
    images
}
