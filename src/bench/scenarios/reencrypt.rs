//! `dmkit bench reencrypt`: offline LUKS2 re-keying, `cryptsetup reencrypt
//! --force-offline-reencrypt` against `dmkit luks reencrypt`, per resilience mode, on the same
//! image in RAM (/dev/shm) and on disk, runs alternated, beside the AES-XTS bound (decrypting
//! and encrypting the data once on all cores, `openssl speed -multi` measured in the same run).
//!
//! One LUKS2 image per directory is formatted by cryptsetup over random data (pbkdf2 keyslots
//! with 1000 iterations: the KDF must not count) and copied fresh before every run, so both
//! tools start from the same bytes. On a disk directory the copy is written back and dropped
//! from the page cache first: both tools read the data from the disk. Each run must leave a
//! header that `cryptsetup luksDump` reads with no reencryption requirement left.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cipher::parse_openssl_speed;
#[path = "reencrypt_bound.rs"]
mod bound;
use crate::bench::harness::model::ToolTiming;
use crate::bench::harness::process::{self as harness, Dmkit, Interrupt, Workspace};
use crate::bench::harness::table::{format_size, Align, TextTable};
use crate::bench::BenchError;
pub use bound::{Bound, Storage};

/// The target: dmkit at least this many times as fast as cryptsetup, per mode.
pub const TARGET: f64 = 3.0;
/// Where LUKS2 data starts on the image (cryptsetup's default 16 MiB), in 512-byte sectors.
const DATA_OFFSET_SECTORS: u64 = 32768;
/// The passphrase of the bench image (scratch data only).
const PASSPHRASE: &str = "dmkit-bench-reencrypt";
/// Longest a single reencryption may take before it counts as hung.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);

/// What to run.
#[derive(Debug, Clone)]
pub struct ReencryptOptions {
    /// Bytes of data (after the 16 MiB header), a multiple of 4096.
    pub size: u64,
    /// Directories to run in (a scratch directory is made in each).
    pub dirs: Vec<PathBuf>,
    /// Runs per tool, mode and directory.
    pub runs: u32,
    /// Resilience modes: checksum, journal, none.
    pub resilience: Vec<String>,
    /// Print progress on stderr.
    pub progress: bool,
}

/// One resilience mode in one directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeResult {
    /// `checksum`, `journal` or `none`.
    pub resilience: String,
    /// cryptsetup's runs, then dmkit's.
    pub tools: Vec<ToolTiming>,
    /// Median seconds of cryptsetup / median seconds of dmkit.
    pub ratio: f64,
    /// `ratio >= TARGET`.
    pub pass: bool,
    /// What the storage allows any tool, measured in the same run.
    #[serde(default)]
    pub bound: Option<Bound>,
}

/// Every mode in one directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirResult {
    /// The directory given.
    pub dir: PathBuf,
    /// Whether it is a tmpfs (RAM).
    pub in_ram: bool,
    /// One entry per resilience mode.
    pub modes: Vec<ModeResult>,
    /// Its bandwidth and flush latency, measured before the runs.
    #[serde(default)]
    pub storage: Option<Storage>,
}

/// The AES-XTS bound of the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XtsBound {
    /// The command measured.
    pub command: String,
    /// Its aggregate rate over all cores, bytes per second.
    pub bytes_per_s: f64,
    /// Seconds to decrypt and encrypt the data once at that rate.
    pub seconds: f64,
}

/// The result of `dmkit bench reencrypt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReencryptReport {
    /// Bytes of data.
    pub size: u64,
    /// Runs per tool, mode and directory.
    pub runs: u32,
    /// Cores used by the bound.
    pub cores: usize,
    /// The cipher bound, if openssl ran.
    pub bound: Option<XtsBound>,
    /// Per directory.
    pub dirs: Vec<DirResult>,
    /// Required minimum ratio.
    pub target: f64,
    /// `cryptsetup --version`.
    pub cryptsetup_version: String,
    /// How the dmkit executable was built.
    pub dmkit_build: String,
}

/// The reencryption options both tools get (they spell them the same).
fn reencrypt_args(resilience: &str, pass: &Path, image: &Path) -> Vec<String> {
    [
        "--force-offline-reencrypt",
        "--batch-mode",
        "--resilience",
        resilience,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([pass, image].map(|p| p.display().to_string()))
    .collect()
}

/// `openssl speed -multi CORES -evp aes-256-xts`: every core at once, as the reencryption runs.
fn xts_bound(cores: usize, size: u64) -> Option<XtsBound> {
    let cores = cores.to_string();
    let args = [
        "speed",
        "-multi",
        &cores,
        "-seconds",
        "2",
        "-evp",
        "aes-256-xts",
        "-bytes",
        "16384",
    ];
    let out = Command::new("openssl").args(args).output().ok()?;
    let rate = parse_openssl_speed(&String::from_utf8_lossy(&out.stdout))?;
    Some(XtsBound {
        command: format!("openssl {}", args.join(" ")),
        bytes_per_s: rate,
        seconds: 2.0 * size as f64 / rate,
    })
}

/// Check the options and the tools.
fn check(opts: &ReencryptOptions) -> Result<(), BenchError> {
    if opts.size == 0 || !opts.size.is_multiple_of(4096) {
        return Err(BenchError::Invalid(format!(
            "--size must be a non-zero multiple of 4096, not {}",
            opts.size
        )));
    }
    if opts.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    if opts.dirs.is_empty() {
        return Err(BenchError::Invalid("give at least one --dir".into()));
    }
    for r in &opts.resilience {
        if !["checksum", "journal", "none"].contains(&r.as_str()) {
            return Err(BenchError::Invalid(format!(
                "--resilience {r}: unknown mode (checksum, journal, none)"
            )));
        }
    }
    if opts.resilience.is_empty() {
        return Err(BenchError::Invalid("give at least one --resilience".into()));
    }
    Ok(())
}

/// Run the comparison.
pub fn run(opts: &ReencryptOptions, interrupt: &Interrupt) -> Result<ReencryptReport, BenchError> {
    check(opts)?;
    let version = harness::required_version("cryptsetup", "cryptsetup-bin")?;
    let dmkit = Dmkit::from_env()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    harness::say(
        opts.progress,
        format!("measuring the AES-XTS bound on {cores} cores"),
    );
    let bound = xts_bound(cores, opts.size);
    let mut dirs = Vec::new();
    for dir in &opts.dirs {
        dirs.push(run_dir(opts, &dmkit, dir, interrupt)?);
    }
    Ok(ReencryptReport {
        size: opts.size,
        runs: opts.runs,
        cores,
        bound,
        dirs,
        target: TARGET,
        cryptsetup_version: version,
        dmkit_build: dmkit.build_label(),
    })
}

/// Every mode in one directory, on one freshly formatted image.
fn run_dir(
    opts: &ReencryptOptions,
    dmkit: &Dmkit,
    dir: &Path,
    interrupt: &Interrupt,
) -> Result<DirResult, BenchError> {
    let in_ram = harness::on_tmpfs(dir);
    let ws = Workspace::create(dir)?;
    let pass = ws.path("passphrase");
    let orig = ws.path("orig.img");
    let work = ws.path("work.img");
    let io_err = |what: String| move |source| BenchError::Io { what, source };
    fs::write(&pass, PASSPHRASE).map_err(io_err(format!("write {}", pass.display())))?;
    harness::write_random_data(
        opts.progress,
        &orig,
        opts.size + (DATA_OFFSET_SECTORS << 9),
        interrupt,
    )?;
    let mut format = Command::new("cryptsetup");
    format
        .args([
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
        ])
        .args(["--pbkdf-force-iterations", "1000", "--offset"])
        .arg(DATA_OFFSET_SECTORS.to_string())
        .arg("--key-file")
        .args([&pass, &orig]);
    harness::run_ok(&mut format, ws.dir(), interrupt, Some(RUN_TIMEOUT))?;
    harness::say(
        opts.progress,
        format!("{}: measuring bandwidth and flush latency", dir.display()),
    );
    let storage = bound::measure(ws.dir(), in_ram)?;

    const TOOLS: [&str; 2] = ["cryptsetup reencrypt", "dmkit luks reencrypt"];
    let mut modes = Vec::new();
    for r in &opts.resilience {
        let mut seconds: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for run in 0..opts.runs as usize {
            for k in 0..2 {
                let t = (k + run) % 2;
                fresh_copy(&orig, &work, in_ram)?;
                let args = reencrypt_args(r, &pass, &work);
                let mut cmd = if t == 0 {
                    let mut c = Command::new("cryptsetup");
                    c.arg("reencrypt").args(&args);
                    c
                } else {
                    dmkit.command(
                        ["luks", "reencrypt"]
                            .iter()
                            .map(|s| s.to_string())
                            .chain(args),
                    )
                };
                let c = harness::run_ok(&mut cmd, ws.dir(), interrupt, Some(RUN_TIMEOUT))?;
                finished(&work, TOOLS[t], ws.dir(), interrupt)?;
                let s = c.elapsed.as_secs_f64();
                harness::say(
                    opts.progress,
                    format!(
                        "{} {r} run {}/{} {:<22} {s:.3} s",
                        dir.display(),
                        run + 1,
                        opts.runs,
                        TOOLS[t]
                    ),
                );
                seconds[t].push(s);
            }
        }
        let tools = super::format::tool_timings(TOOLS, opts.size, &seconds, "a reencryption")?;
        let ratio = tools[0].seconds.median / tools[1].seconds.median;
        let hotzone = bound::hotzone(&orig, r)?;
        modes.push(ModeResult {
            resilience: r.clone(),
            tools,
            ratio,
            pass: ratio >= TARGET,
            bound: Some(bound::bound(r, opts.size, hotzone, &storage, in_ram)),
        });
    }
    Ok(DirResult {
        dir: dir.to_path_buf(),
        in_ram,
        modes,
        storage: Some(storage),
    })
}

/// Copy `orig` over `work`, durable; off RAM also dropped from the page cache so the run
/// reads the disk.
fn fresh_copy(orig: &Path, work: &Path, in_ram: bool) -> Result<(), BenchError> {
    let io_err = |source| BenchError::Io {
        what: format!("copy {} to {}", orig.display(), work.display()),
        source,
    };
    let _ = fs::remove_file(work);
    fs::copy(orig, work).map_err(io_err)?;
    fs::File::open(work)
        .and_then(|f| f.sync_all())
        .map_err(io_err)?;
    if !in_ram {
        harness::evict_from_page_cache(work)?;
    }
    Ok(())
}

/// The image after a run: cryptsetup reads its header and no reencryption is left.
fn finished(
    image: &Path,
    by: &str,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<(), BenchError> {
    let mut dump = Command::new("cryptsetup");
    dump.arg("luksDump").arg(image);
    let c = harness::run_ok(&mut dump, scratch, interrupt, Some(RUN_TIMEOUT))?;
    if c.stdout.contains("reencrypt") {
        return Err(BenchError::Mismatch(format!(
            "after {by}, {} is still marked for reencryption",
            image.display()
        )));
    }
    Ok(())
}

fn mb_s(size: u64, seconds: f64) -> f64 {
    size as f64 / 1e6 / seconds
}

/// The table: one row per directory and mode, each tool's median seconds (min..max) and MB/s,
/// and the ratio; then the bound and the acceptance lines.
pub fn render(r: &ReencryptReport) -> String {
    let mut out = format!(
        "offline LUKS2 reencryption (re-key, aes-xts-plain64 512-bit, pbkdf2 keyslots) of {} \
         of random data, {} run{} per tool and mode, alternated; {}{}\n",
        format_size(r.size),
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        r.cryptsetup_version,
        if r.dmkit_build == "release" {
            String::new()
        } else {
            format!("; dmkit build: {}", r.dmkit_build)
        },
    );
    match &r.bound {
        Some(b) => out.push_str(&format!(
            "AES-XTS bound: decrypt + encrypt of {} on {} cores = {:.3} s ({:.0} MB/s of data; \
             `{}`: {:.0} MB/s)\n\n",
            format_size(r.size),
            r.cores,
            b.seconds,
            mb_s(r.size, b.seconds),
            b.command,
            b.bytes_per_s / 1e6
        )),
        None => out.push_str("AES-XTS bound: openssl speed failed\n\n"),
    }
    let mut t = TextTable::new(vec![
        ("storage".into(), Align::Left),
        ("resilience".into(), Align::Left),
        ("cryptsetup".into(), Align::Right),
        ("MB/s".into(), Align::Right),
        ("dmkit".into(), Align::Right),
        ("MB/s".into(), Align::Right),
        ("cryptsetup/dmkit".into(), Align::Right),
        ("bound".into(), Align::Right),
        ("cryptsetup/bound".into(), Align::Right),
    ]);
    let secs = |s: &crate::bench::harness::model::Stats| {
        if r.runs > 1 {
            format!("{:.3} s ({:.3}..{:.3})", s.median, s.min, s.max)
        } else {
            format!("{:.3} s", s.median)
        }
    };
    for d in &r.dirs {
        let storage = format!(
            "{} ({})",
            d.dir.display(),
            if d.in_ram { "RAM" } else { "disk" }
        );
        for m in &d.modes {
            let (c, k) = (&m.tools[0].seconds, &m.tools[1].seconds);
            t.push(vec![
                storage.clone(),
                m.resilience.clone(),
                secs(c),
                format!("{:.0}", mb_s(r.size, c.median)),
                secs(k),
                format!("{:.0}", mb_s(r.size, k.median)),
                format!("{:.2}x", m.ratio),
                m.bound
                    .as_ref()
                    .filter(|b| b.bytes > 0)
                    .map_or("-".into(), |b| format!("{:.3} s", b.seconds)),
                m.bound
                    .as_ref()
                    .filter(|b| b.bytes > 0)
                    .map_or("-".into(), |b| format!("{:.2}x", c.median / b.seconds)),
            ]);
        }
    }
    out.push_str(&t.render());
    if r.runs > 1 {
        out.push_str("\nmedian (min..max) over runs\n");
    }
    out.push_str(
        "bound: bytes moved / bandwidth + flushes x flush latency, both measured in the \
         directory this run (on a disk: the data read and written, plus the journal; in RAM, \
         where the data is re-keyed in place: the journal); the cipher is the AES-XTS line; \
         cryptsetup/bound is the most any tool could gain\n",
    );

    for d in &r.dirs {
        if let Some(s) = &d.storage {
            out.push_str(&format!(
                "{}: {:.0} MB/s written then read back, flush {:.3} ms\n",
                d.dir.display(),
                s.bytes_per_s / 1e6,
                s.flush_s * 1e3
            ));
        }
    }
    out.push('\n');
    for d in &r.dirs {
        for m in &d.modes {
            out.push_str(&format!(
                "{} {}: cryptsetup/dmkit = {:.2}x (target >= {:.0}x){}\n",
                if d.in_ram { "RAM" } else { "disk" },
                m.resilience,
                m.ratio,
                r.target,
                if m.pass { "" } else { "  BELOW TARGET" }
            ));
            if let (Some(b), Some(s), false) = (&m.bound, &d.storage, m.pass) {
                out.push_str(&arithmetic(m, b, s));
            }
        }
    }
    out
}

/// Why a row below the target is: its bound spelled out.
fn arithmetic(m: &ModeResult, b: &Bound, s: &Storage) -> String {
    let c = m.tools[0].seconds.median;
    if b.bytes == 0 {
        // Re-keyed in place in RAM with no journal: only the cipher (and the hashes) touch
        // the data, and a flush of RAM costs microseconds; a ratio over that would say nothing.
        return "  bound: no bytes moved besides the cipher's (in place, in RAM): the AES-XTS \
                line is the bound\n"
            .into();
    }
    format!(
        "  bound: {} B / {:.0} MB/s + {} hotzone{} x {} flushes x {:.3} ms = {:.3} s; \
         cryptsetup {:.3} s / {:.3} s = at most {:.2}x for any tool\n",
        b.bytes,
        s.bytes_per_s / 1e6,
        b.hotzones,
        if b.hotzones == 1 { "" } else { "s" },
        b.barriers.checked_div(b.hotzones).unwrap_or(0),
        s.flush_s * 1e3,
        b.seconds,
        c,
        b.seconds,
        c / b.seconds
    )
}

crate::bench::harness::report::impl_report!(ReencryptReport => render);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_tools_get_the_same_options() {
        let a = reencrypt_args("journal", Path::new("/p"), Path::new("/i"));
        assert_eq!(
            a[..4],
            [
                "--force-offline-reencrypt",
                "--batch-mode",
                "--resilience",
                "journal"
            ]
        );
        assert_eq!(a[a.len() - 2..], ["/p", "/i"]);
    }

    #[test]
    fn refuses_bad_options() {
        let ok = ReencryptOptions {
            size: 1 << 20,
            dirs: vec!["/tmp".into()],
            runs: 1,
            resilience: vec!["checksum".into()],
            progress: false,
        };
        assert!(check(&ok).is_ok());
        for bad in [
            ReencryptOptions {
                size: 1000,
                ..ok.clone()
            },
            ReencryptOptions {
                runs: 0,
                ..ok.clone()
            },
            ReencryptOptions {
                dirs: vec![],
                ..ok.clone()
            },
            ReencryptOptions {
                resilience: vec!["datashift".into()],
                ..ok.clone()
            },
        ] {
            assert!(check(&bad).is_err());
        }
    }
}
