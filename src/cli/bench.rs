//! `dmkit bench`: fio through our exports (`plain` vs `verity`, ...) and `bench format`
//! (`veritysetup format` vs `dmkit verity format`). The logic lives in [`crate::bench`].
use std::path::PathBuf;

use super::{CliError, CliResult};
use crate::bench::config::Config;
use crate::bench::fio::Workload;
use crate::bench::format::FormatOptions;
use crate::bench::harness::Interrupt;
use crate::bench::overhead::OverheadOptions;
use crate::bench::{self, table, BenchError};

/// Arguments of `dmkit bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    overhead: OverheadArgs,
}

/// `dmkit bench` subcommands.
#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Time `veritysetup format` against `dmkit verity format` on the same data.
    Format(FormatArgs),
}

/// fio through the exports of each configuration (the default `dmkit bench`).
#[derive(clap::Args)]
struct OverheadArgs {
    /// Runs per workload and configuration [default: 5, --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Size of the random data file [default: 256M, --quick: 64M].
    #[arg(long)]
    size: Option<String>,
    /// Seconds per fio run [default: 4, --quick: 1.5].
    #[arg(long)]
    runtime: Option<f64>,
    /// Directory for the scratch files (a temporary directory is made inside).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Small and fast: 64M, 1 run, 1.5 s per run; still the full table.
    #[arg(long)]
    quick: bool,
    /// Print the whole result model as JSON.
    #[arg(long)]
    json: bool,
    /// Configurations, the baseline first.
    #[arg(long, value_delimiter = ',', default_value = "plain,verity")]
    config: Vec<String>,
    /// Workloads: read, randread, read-direct, randread-direct, seq-1m, rand-4k-qd32,
    /// rand-4k-qd1 [default: all].
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
}

/// Arguments of `dmkit bench format`.
#[derive(clap::Args)]
struct FormatArgs {
    /// Size of the random data file.
    #[arg(long, default_value = "2G")]
    size: String,
    /// Runs per tool.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Directory for the scratch files (a temporary directory is made inside).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

fn cli_error(e: BenchError) -> CliError {
    match e {
        BenchError::Interrupted => CliError {
            code: 130,
            message: "bench: interrupted (exports closed, scratch files removed)".into(),
        },
        BenchError::Mismatch(m) => CliError::verification(format!("bench: {m}")),
        e => CliError::invalid(format!("bench: {e}")),
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> CliResult {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| CliError::invalid(format!("bench: JSON: {e}")))?;
    println!("{s}");
    Ok(())
}

/// Run `dmkit bench`.
pub fn run(a: BenchArgs) -> CliResult {
    match a.command {
        Some(BenchCommand::Format(f)) => run_format(f),
        None => run_overhead(a.overhead),
    }
}

fn run_overhead(a: OverheadArgs) -> CliResult {
    let mut o = OverheadOptions::defaults(a.quick);
    if let Some(r) = a.runs {
        o.runs = r;
    }
    if let Some(s) = &a.size {
        o.size = bench::parse_size(s).map_err(cli_error)?;
    }
    if let Some(t) = a.runtime {
        if !(t.is_finite() && t > 0.0 && t <= 3600.0) {
            return Err(CliError::invalid(
                "bench: --runtime must be in (0, 3600] seconds",
            ));
        }
        o.runtime_ms = ((t * 1000.0).round() as u64).max(1);
    }
    o.dir = a.dir;
    o.configs = Config::parse_list(&a.config).map_err(cli_error)?;
    if !a.workloads.is_empty() {
        o.workloads = Workload::select(&a.workloads).map_err(cli_error)?;
    }
    let interrupt = Interrupt::install();
    let report = bench::overhead::run(&o, &interrupt).map_err(cli_error)?;
    if a.json {
        print_json(&report)
    } else {
        print!("{}", table::render_overhead(&report));
        Ok(())
    }
}

fn run_format(a: FormatArgs) -> CliResult {
    let o = FormatOptions {
        size: bench::parse_size(&a.size).map_err(cli_error)?,
        runs: a.runs,
        dir: a.dir,
        ..FormatOptions::default()
    };
    let interrupt = Interrupt::install();
    let report = bench::format::run(&o, &interrupt).map_err(cli_error)?;
    if a.json {
        print_json(&report)
    } else {
        print!("{}", table::render_format(&report));
        Ok(())
    }
}
