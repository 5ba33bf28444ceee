//! `dmkit bench`: the fio matrix. One random data file, every configuration opened over it
//! at once, every workload run N times per configuration with the configurations alternated
//! run by run (and their order rotated) so drift hits all of them equally.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use super::config::Config;
use crate::bench::harness::fio::{self, FioResult, RunSpec, Workload};
use crate::bench::harness::model::{OverheadReport, Params};
use crate::bench::harness::process::{self as harness, Dmkit, Export, Interrupt, Workspace};
use crate::bench::harness::table::BwUnit;
use crate::bench::BenchError;

/// What to run.
#[derive(Debug, Clone)]
pub struct OverheadOptions {
    /// Size of the data file, bytes (a multiple of 4096).
    pub size: u64,
    /// Runs per workload and configuration.
    pub runs: u32,
    /// Length of one fio run, ms.
    pub runtime_ms: u64,
    /// `--quick` (recorded in the report).
    pub quick: bool,
    /// Where the scratch directory is created.
    pub dir: PathBuf,
    /// Configurations, baseline first.
    pub configs: Vec<Config>,
    /// Workloads, in table order.
    pub workloads: Vec<Workload>,
    /// Print progress on stderr.
    pub progress: bool,
}

impl OverheadOptions {
    /// The defaults of `dmkit bench` (or of `dmkit bench --quick`).
    pub fn defaults(quick: bool) -> OverheadOptions {
        OverheadOptions {
            size: if quick { 64 << 20 } else { 256 << 20 },
            runs: if quick { 1 } else { 5 },
            runtime_ms: if quick { 1500 } else { 4000 },
            quick,
            dir: PathBuf::from("/var/tmp"),
            configs: Config::ALL.to_vec(),
            workloads: Workload::standard(),
            progress: std::io::stderr().is_terminal(),
        }
    }
}

/// Kernel release, for the report.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Run the matrix and build the report. Exports are closed and scratch files removed on every
/// path out, including errors and Ctrl-C.
pub fn run(opts: &OverheadOptions, interrupt: &Interrupt) -> Result<OverheadReport, BenchError> {
    if opts.size == 0 || opts.size & 4095 != 0 {
        return Err(BenchError::Invalid(format!(
            "--size must be a non-zero multiple of 4096 bytes, not {}",
            opts.size
        )));
    }
    if opts.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    if opts.workloads.is_empty() {
        return Err(BenchError::Invalid("no workload given".into()));
    }
    let fio_version = fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    if dmkit.build == "debug" {
        eprintln!("dmkit: warning: benchmarking a debug build; use `cargo build --release`");
    }
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let say = |msg: String| {
        if opts.progress {
            eprintln!("{msg}");
        }
    };

    // Declared first, dropped last: the exports below close before the files go.
    let ws = Workspace::create(&opts.dir)?;
    let data = ws.path("data.img");
    harness::write_random_data(opts.progress, &data, opts.size, interrupt)?;

    let mut exports: Vec<Export> = Vec::new();
    for c in &opts.configs {
        let name = format!("bench{}-{}", std::process::id(), c.name());
        say(format!("preparing and opening {} as {name}", c.name()));
        let args = c.prepare(&dmkit, &data, &name, ws.dir(), interrupt)?;
        exports.push(dmkit.open(&name, &args, ws.dir(), interrupt)?);
    }

    let spec = RunSpec {
        size: opts.size,
        runtime_ms: opts.runtime_ms,
    };
    let n = opts.configs.len();
    // results[workload][config][run]
    let mut results: Vec<Vec<Vec<FioResult>>> =
        vec![vec![Vec::with_capacity(opts.runs as usize); n]; opts.workloads.len()];
    for run in 0..opts.runs as usize {
        for (wi, w) in opts.workloads.iter().enumerate() {
            for k in 0..n {
                // Rotate the order each run so no configuration always goes first.
                let ci = (k + run) % n;
                interrupt.check()?;
                let r = fio::run(w, exports[ci].path(), spec, ws.dir(), interrupt)?;
                say(format!(
                    "run {}/{} {:<16} {:<8} {}",
                    run + 1,
                    opts.runs,
                    w.name,
                    opts.configs[ci].name(),
                    BwUnit::for_bytes_per_s(r.bw_bytes).format(r.bw_bytes)
                ));
                results[wi][ci].push(r);
            }
        }
    }

    for e in exports.drain(..).rev() {
        e.close()?;
    }

    let params = Params {
        size: opts.size,
        runs: opts.runs,
        runtime_ms: opts.runtime_ms,
        quick: opts.quick,
        fio_version,
        kernel: kernel_release(),
        started_unix,
        build: dmkit.build_label(),
    };
    let names: Vec<String> = opts.configs.iter().map(|c| c.name().to_string()).collect();
    Ok(OverheadReport::build(
        params,
        &names,
        &opts.workloads,
        results,
        |name| {
            Config::from_name(name)
                .ok()
                .and_then(Config::acceptance_target)
        },
    ))
}

crate::bench::harness::report::impl_report!(crate::bench::harness::model::OverheadReport => crate::bench::harness::table::render_overhead);
