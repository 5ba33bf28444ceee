//! `dmkit bench fsverity-digest`: `fsverity digest` (fsverity-utils) against
//! `dmkit fsverity digest` on the same data in the same run: one large random file, and a tree
//! of many small random files whose sizes are drawn from a seed (uniform from 0 to a maximum,
//! or exponential with a given mean, capped at the maximum). The page cache is warmed first and
//! each tool runs once untimed; then the tools run alternately, each case `runs` times per
//! tool, and every run must print exactly what the first one printed. The small files are
//! passed to both tools the same way: relative names, as many per command line as fit in
//! 1 MiB of arguments (one command for the default 10,000), from the tree's directory.
//!
//! Wall time decides the ratio; each tool's CPU time (user + system, from `wait4`) is shown
//! beside it because it hardly moves when other work shares the machine.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::bench::harness::model::Stats;
use crate::bench::harness::process::{self as harness, Dmkit, Interrupt, Workspace, Xoshiro256};
use crate::bench::harness::table::{format_size, Align, TextTable};
use crate::bench::BenchError;

/// The project's target: dmkit at least this many times as fast as fsverity-utils, in each
/// case.
pub const TARGET: f64 = 3.0;
/// Argument bytes per command line (both tools get the same split).
const ARGS_PER_COMMAND: usize = 1 << 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct FsvDigestOptions {
    /// Size of the large file, bytes.
    pub size: u64,
    /// Number of small files.
    pub files: u32,
    /// Largest small file, bytes.
    pub max_file_size: u64,
    /// With a value, the small files' sizes are exponential with this mean (bytes), capped at
    /// `max_file_size`; without, uniform from 0 to `max_file_size`.
    pub mean_file_size: Option<u64>,
    /// Seed of the small files' sizes.
    pub seed: u64,
    /// Runs per tool and case.
    pub runs: u32,
    /// Hash algorithm given to both tools ("sha256", "sha512").
    pub hash: String,
    /// Where the scratch directory is created.
    pub dir: PathBuf,
    /// Print progress on stderr.
    pub progress: bool,
}

impl FsvDigestOptions {
    /// The defaults (the cases: a 2 GiB file and 10,000 files of 0 to 64 KiB; 5
    /// runs), or small ones for a smoke run with `quick` (64 MiB, 500 files, 1 run).
    pub fn defaults(quick: bool) -> Self {
        FsvDigestOptions {
            size: if quick { 64 << 20 } else { 2 << 30 },
            files: if quick { 500 } else { 10_000 },
            max_file_size: 64 << 10,
            mean_file_size: None,
            seed: 1,
            runs: if quick { 1 } else { 5 },
            hash: "sha256".into(),
            dir: PathBuf::from("/var/tmp"),
            progress: std::io::stderr().is_terminal(),
        }
    }
}

/// One tool's runs on one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DigestTiming {
    /// "fsverity digest" or "dmkit fsverity digest".
    pub tool: String,
    /// Wall time per run, seconds.
    pub seconds: Stats,
    /// CPU time (user + system) per run, seconds.
    pub cpu_seconds: Stats,
}

/// One case (the large file, or the small files): both tools' timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DigestCase {
    /// "2 GiB file", "10000 files".
    pub name: String,
    /// Files digested per run.
    pub files: u64,
    /// Bytes digested per run.
    pub bytes: u64,
    /// Commands per run and tool (the small files may need several command lines).
    pub commands: usize,
    /// fsverity-utils first, then dmkit.
    pub tools: Vec<DigestTiming>,
    /// Median time of fsverity-utils / median time of dmkit.
    pub speedup: f64,
    /// `speedup >= TARGET`.
    pub pass: bool,
}

/// The result of `dmkit bench fsverity-digest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsvDigestReport {
    /// The large file, then the small files.
    pub cases: Vec<DigestCase>,
    /// Runs per tool and case.
    pub runs: u32,
    /// Hash algorithm.
    pub hash: String,
    /// Seed of the small files' sizes.
    pub seed: u64,
    /// Largest small file, bytes.
    pub max_file_size: u64,
    /// Mean of the small files' exponential sizes, bytes; `None` for uniform sizes.
    pub mean_file_size: Option<u64>,
    /// Required minimum speed-up in each case.
    pub target: f64,
    /// `fsverity --version`.
    pub fsverity_version: String,
    /// How the measured dmkit was built.
    pub dmkit_build: String,
    /// dmkit's SHA-256 implementation on this CPU.
    pub sha256_backend: String,
    /// CPUs available to the tools.
    pub cpus: usize,
    /// The 1-minute load average before the first and after the last timed run (other
    /// work on the machine stretches wall times, hardly CPU times).
    pub load: [f64; 2],
}

/// The 1-minute load average, or NaN where /proc/loadavg cannot be read.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The small files' sizes, from `seed`: uniform in `0..=max`, or with a `mean`, exponential
/// with that mean and capped at `max`.
pub fn file_sizes(count: u32, max: u64, mean: Option<u64>, seed: u64) -> Vec<u64> {
    let mut rng = Xoshiro256::seeded(seed);
    (0..count)
        .map(|_| match mean {
            None => rng.next() % (max + 1),
            Some(mean) => {
                // A uniform in (0, 1], never 0 so its logarithm is finite.
                let u = ((rng.next() >> 11) + 1) as f64 / (1u64 << 53) as f64;
                ((-(mean as f64) * u.ln()) as u64).min(max)
            }
        })
        .collect()
}

/// Writes the small files as `DIR/NN/fNNNNNN` (100 subdirectories) with random contents;
/// returns their names relative to `dir`, sorted.
fn write_small_files(
    dir: &Path,
    sizes: &[u64],
    interrupt: &Interrupt,
) -> Result<Vec<String>, BenchError> {
    let io = |what: String| move |source| BenchError::Io { what, source };
    let mut rng = Xoshiro256::from_os()?;
    let mut buf = Vec::new();
    let mut names = Vec::with_capacity(sizes.len());
    for (i, &size) in sizes.iter().enumerate() {
        if i % 1000 == 0 {
            interrupt.check()?;
        }
        let sub = dir.join(format!("{:02}", i % 100));
        if i < 100 {
            std::fs::create_dir_all(&sub).map_err(io(format!("create {}", sub.display())))?;
        }
        let name = format!("{:02}/f{i:06}", i % 100);
        buf.resize((size as usize).next_multiple_of(8), 0);
        rng.fill(&mut buf);
        let path = dir.join(&name);
        std::fs::write(&path, &buf[..size as usize])
            .map_err(io(format!("write {}", path.display())))?;
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// Splits `names` into command lines of at most [`ARGS_PER_COMMAND`] argument bytes.
fn command_groups(names: &[String]) -> Vec<&[String]> {
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, n) in names.iter().enumerate() {
        if bytes + n.len() + 1 > ARGS_PER_COMMAND && i > start {
            groups.push(&names[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n.len() + 1;
    }
    if start < names.len() {
        groups.push(&names[start..]);
    }
    groups
}

/// One case to time: the file arguments per command, run in `cwd`.
struct Case<'a> {
    name: String,
    cwd: &'a Path,
    groups: Vec<&'a [String]>,
    files: u64,
    bytes: u64,
}

/// Run the comparison.
pub fn run(opts: &FsvDigestOptions, interrupt: &Interrupt) -> Result<FsvDigestReport, BenchError> {
    if opts.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    if opts.size == 0 && opts.files == 0 {
        return Err(BenchError::Invalid(
            "nothing to measure: --size and --files are both 0".into(),
        ));
    }
    if opts
        .mean_file_size
        .is_some_and(|m| m == 0 || m > opts.max_file_size)
    {
        return Err(BenchError::Invalid(
            "--mean-file-size must be from 1 to --max-file-size".into(),
        ));
    }
    if !matches!(opts.hash.as_str(), "sha256" | "sha512") {
        return Err(BenchError::Invalid(format!(
            "--hash-alg {}: not sha256 or sha512",
            opts.hash
        )));
    }
    let version = crate::bench::harness::process::required_version("fsverity", "fsverity")?;
    let dmkit = Dmkit::from_env()?;
    let say = |msg: String| {
        if opts.progress {
            eprintln!("{msg}");
        }
    };
    let ws = Workspace::create(&opts.dir)?;
    let mut cases = Vec::new();
    let big_name = ["large.bin".to_string()];
    if opts.size > 0 {
        let big = ws.path(&big_name[0]);
        say(format!(
            "writing {} of random data to {}",
            format_size(opts.size),
            big.display()
        ));
        // write_random_file fills whole 8-byte words: write a multiple of 8, then trim.
        harness::write_random_file(&big, opts.size.next_multiple_of(8), interrupt)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&big)
            .and_then(|f| f.set_len(opts.size))
            .map_err(|source| BenchError::Io {
                what: format!("truncate {}", big.display()),
                source,
            })?;
        harness::read_through(&big)?;
        cases.push(Case {
            name: format!("{} file", format_size(opts.size)),
            cwd: ws.dir(),
            groups: vec![&big_name[..]],
            files: 1,
            bytes: opts.size,
        });
    }
    let small_dir = ws.path("small");
    let names;
    if opts.files > 0 {
        let sizes = file_sizes(
            opts.files,
            opts.max_file_size,
            opts.mean_file_size,
            opts.seed,
        );
        let total: u64 = sizes.iter().sum();
        say(format!(
            "writing {} files ({} in all, {}, seed {}) under {}",
            opts.files,
            format_mib(total),
            size_distribution(opts.max_file_size, opts.mean_file_size),
            opts.seed,
            small_dir.display()
        ));
        names = write_small_files(&small_dir, &sizes, interrupt)?;
        for n in &names {
            harness::read_through(&small_dir.join(n))?;
        }
        cases.push(Case {
            name: format!("{} small files", opts.files),
            cwd: &small_dir,
            groups: command_groups(&names),
            files: u64::from(opts.files),
            bytes: total,
        });
    }

    let mut report_cases = Vec::new();
    let load_before = load_average();
    for case in &cases {
        report_cases.push(run_case(opts, case, &dmkit, ws.dir(), interrupt, &say)?);
    }
    let dmkit_build = dmkit.build_label();
    Ok(FsvDigestReport {
        cases: report_cases,
        runs: opts.runs,
        hash: opts.hash.clone(),
        seed: opts.seed,
        max_file_size: opts.max_file_size,
        mean_file_size: opts.mean_file_size,
        target: TARGET,
        fsverity_version: version,
        dmkit_build,
        sha256_backend: crate::hash::sha256_backend().to_string(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load: [load_before, load_average()],
    })
}

const TOOLS: [&str; 2] = ["fsverity digest", "dmkit fsverity digest"];

/// One run of tool `t` over every command line of `case`: wall and CPU seconds, and what it
/// printed.
fn run_tool(
    t: usize,
    alg: &str,
    case: &Case<'_>,
    dmkit: &Dmkit,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<(f64, f64, String), BenchError> {
    let (mut wall, mut cpu) = (0.0, 0.0);
    let mut printed = String::new();
    for group in &case.groups {
        let mut cmd = if t == 0 {
            Command::new("fsverity")
        } else {
            dmkit.command(["fsverity"])
        };
        cmd.arg("digest")
            .arg(alg)
            .args(group.iter())
            .current_dir(case.cwd);
        let c = harness::run_ok(&mut cmd, scratch, interrupt, None)?;
        wall += c.elapsed.as_secs_f64();
        cpu += c.cpu.as_secs_f64();
        printed.push_str(&c.stdout);
    }
    let lines = printed.lines().count() as u64;
    if lines != case.files {
        return Err(BenchError::Tool(format!(
            "{}: {} printed {lines} digests for {} files",
            case.name, TOOLS[t], case.files
        )));
    }
    Ok((wall, cpu, printed))
}

/// Times both tools on one case, alternately, after one untimed run each, and checks that
/// every run prints the same.
fn run_case(
    opts: &FsvDigestOptions,
    case: &Case<'_>,
    dmkit: &Dmkit,
    scratch: &Path,
    interrupt: &Interrupt,
    say: &dyn Fn(String),
) -> Result<DigestCase, BenchError> {
    let alg = format!("--hash-alg={}", opts.hash);
    let mut wall: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut cpu: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut first: Option<(String, &str)> = None;
    // Run 0 is the warm-up.
    for run in 0..=opts.runs as usize {
        for k in 0..2 {
            let t = (k + run) % 2;
            let (w, c, printed) = run_tool(t, &alg, case, dmkit, scratch, interrupt)?;
            say(format!(
                "{:<16} {} {:<22} {:.3} s, CPU {:.3} s",
                case.name,
                if run == 0 {
                    "warm-up".to_string()
                } else {
                    format!("run {run}/{}", opts.runs)
                },
                TOOLS[t],
                w,
                c
            ));
            match &first {
                None => first = Some((printed, TOOLS[t])),
                Some((p, by)) if *p != printed => {
                    let diff = p
                        .lines()
                        .zip(printed.lines())
                        .find(|(a, b)| a != b)
                        .map(|(a, b)| format!("{by} printed {a:?}, {} printed {b:?}", TOOLS[t]))
                        .unwrap_or_default();
                    return Err(BenchError::Mismatch(format!(
                        "{}: the digests differ: {diff}",
                        case.name
                    )));
                }
                Some(_) => {}
            }
            if run > 0 {
                wall[t].push(w);
                cpu[t].push(c);
            }
        }
    }
    let mut tools = Vec::new();
    for t in 0..2 {
        let (Some(seconds), Some(cpu_seconds)) = (Stats::of(&wall[t]), Stats::of(&cpu[t])) else {
            return Err(BenchError::Tool(format!("{}: no runs", case.name)));
        };
        tools.push(DigestTiming {
            tool: TOOLS[t].to_string(),
            seconds,
            cpu_seconds,
        });
    }
    if tools[1].seconds.median <= 0.0 {
        return Err(BenchError::Tool(format!(
            "{}: a run took no measurable time",
            case.name
        )));
    }
    let speedup = tools[0].seconds.median / tools[1].seconds.median;
    Ok(DigestCase {
        name: case.name.clone(),
        files: case.files,
        bytes: case.bytes,
        commands: case.groups.len(),
        tools,
        speedup,
        pass: speedup >= TARGET,
    })
}

/// How the small files' sizes are drawn, for messages and the report.
fn size_distribution(max: u64, mean: Option<u64>) -> String {
    match mean {
        None => format!("sizes uniform from 0 to {} B", max),
        Some(m) => format!("sizes exponential with mean {m} B, at most {max} B"),
    }
}

/// The report as text: one table row per case and tool, then the ratios against the target.
pub fn render(r: &FsvDigestReport) -> String {
    let mut out = format!(
        "fs-verity digests, page cache warm: {}, 4096-byte blocks, no salt; {} timed run{} per \
         tool and case after one untimed, alternated; {}; dmkit {}sha256 backend {}; {} CPUs, \
         load average {:.2} before, {:.2} after\n\n",
        r.hash,
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        r.fsverity_version,
        if r.dmkit_build == "release" {
            String::new()
        } else {
            format!("build: {}, ", r.dmkit_build)
        },
        r.sha256_backend,
        r.cpus,
        r.load[0],
        r.load[1],
    );
    let spread = r.runs > 1;
    let seconds = |s: &Stats| {
        if spread {
            format!("{:.3} s ({:.3}..{:.3})", s.median, s.min, s.max)
        } else {
            format!("{:.3} s", s.median)
        }
    };
    let mut t = TextTable::new(vec![
        ("case".into(), Align::Left),
        ("tool".into(), Align::Left),
        ("wall time".into(), Align::Right),
        ("GB/s".into(), Align::Right),
        ("CPU time".into(), Align::Right),
        ("ratio".into(), Align::Right),
    ]);
    for c in &r.cases {
        for (i, tool) in c.tools.iter().enumerate() {
            t.push(vec![
                if i == 0 {
                    format!("{} ({})", c.name, format_mib(c.bytes))
                } else {
                    String::new()
                },
                tool.tool.clone(),
                seconds(&tool.seconds),
                format!("{:.2}", c.bytes as f64 / 1e9 / tool.seconds.median),
                seconds(&tool.cpu_seconds),
                if i == 0 {
                    String::new()
                } else {
                    format!("{:.2}x", c.speedup)
                },
            ]);
        }
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n{}GB/s: data bytes / median wall time; ratio: fsverity median wall time / dmkit's\n\n",
        if spread {
            "times: median (min..max) over runs; "
        } else {
            ""
        }
    ));
    for c in &r.cases {
        out.push_str(&format!(
            "{}: dmkit {:.2}x fsverity-utils (target >= {:.0}x){}; identical digests in every run\n",
            c.name,
            c.speedup,
            r.target,
            if c.pass { "" } else { "  BELOW TARGET" },
        ));
    }
    if let Some(c) = r.cases.iter().find(|c| c.files > 1) {
        out.push_str(&format!(
            "small files: {}, seed {}; {} command line{} per run\n",
            size_distribution(r.max_file_size, r.mean_file_size),
            r.seed,
            c.commands,
            if c.commands == 1 { "" } else { "s" }
        ));
    }
    out
}

fn format_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

crate::bench::harness::report::impl_report!(FsvDigestReport => render);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_seeded_and_exponential() {
        let a = file_sizes(20_000, u64::MAX, Some(8192), 7);
        assert_eq!(a, file_sizes(20_000, u64::MAX, Some(8192), 7));
        assert_ne!(a, file_sizes(20_000, u64::MAX, Some(8192), 8));
        let mean = a.iter().sum::<u64>() as f64 / a.len() as f64;
        assert!((mean - 8192.0).abs() < 8192.0 * 0.05, "mean {mean}");
        // About 1 - 1/e of an exponential lies below its mean.
        let below = a.iter().filter(|&&s| s < 8192).count() as f64 / a.len() as f64;
        assert!((below - 0.632).abs() < 0.02, "{below}");
        // Capped: e^-2 of them would be above twice the mean.
        let capped = file_sizes(20_000, 16384, Some(8192), 7);
        assert_eq!(*capped.iter().max().unwrap(), 16384);
        let at_cap = capped.iter().filter(|&&s| s == 16384).count() as f64 / 20_000.0;
        assert!((at_cap - 0.135).abs() < 0.02, "{at_cap}");
    }

    #[test]
    fn sizes_are_seeded_and_uniform() {
        let a = file_sizes(20_000, 65536, None, 1);
        assert_eq!(a, file_sizes(20_000, 65536, None, 1));
        assert!(a.iter().all(|&s| s <= 65536));
        let mean = a.iter().sum::<u64>() as f64 / a.len() as f64;
        assert!((mean - 32768.0).abs() < 32768.0 * 0.02, "mean {mean}");
        let small = a.iter().filter(|&&s| s <= 4096).count() as f64 / a.len() as f64;
        assert!((small - 0.0625).abs() < 0.01, "{small}");
        assert_eq!(file_sizes(3, 0, None, 1), [0, 0, 0]);
    }

    #[test]
    fn command_lines_are_split_by_bytes() {
        let names: Vec<String> = (0..100_000)
            .map(|i| format!("{:02}/f{i:06}", i % 100))
            .collect();
        let groups = command_groups(&names);
        assert_eq!(groups.iter().map(|g| g.len()).sum::<usize>(), names.len());
        assert!(groups.len() > 1);
        for g in &groups {
            assert!(g.iter().map(|n| n.len() + 1).sum::<usize>() <= ARGS_PER_COMMAND);
        }
        assert_eq!(command_groups(&names[..10_000]).len(), 1);
    }
}
