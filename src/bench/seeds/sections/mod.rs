//! The sections of `dmkit bench seeds`, one per document: each runs the scenario of the
//! per-document command (`bench integrity`, `bench image`, ... call the same `run`
//! functions, so nothing is measured twice in the code) and turns its result into
//! [`SeedRow`]s. The per-document commands print their result through the same rows and the
//! same renderer ([`command_text`]): a command's output is its section of the report.

pub mod s000;
pub mod s001;
pub mod s002;
pub mod s003;
pub mod s004;

use std::path::PathBuf;

use super::data::Seeds;
use super::machine;
use super::model::{KernelTarget, SeedRow};
use super::render;
use crate::bench::harness::fio::Workload;
use crate::bench::harness::model::{OverheadReport, Row};
use crate::bench::harness::process::Interrupt;
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::config::Config;
use crate::bench::scenarios::overhead::{self, OverheadOptions};
use crate::bench::BenchError;

/// What a section's rows refer to: the documents' figures and the kernel's targets.
#[derive(Clone, Copy)]
pub struct Refs<'a> {
    /// The documents' figures.
    pub seeds: &'a Seeds,
    /// The kernel's targets (for the kernel column's reason).
    pub kernel: &'a [KernelTarget],
}

/// Apply document `seed`'s outlier rule, if it states one, to `rows`: the one place it is
/// applied, for `bench seeds` and the per-document commands alike.
pub fn finish(seeds: &Seeds, seed: &str, rows: Vec<SeedRow>) -> Vec<SeedRow> {
    let rule = seeds.setup(seed).outliers;
    rows.into_iter()
        .map(|r| r.with_rule(rule.as_ref()))
        .collect()
}

/// What a per-document command prints: its section of the report. `rows` turns the
/// scenario's result into setup lines and rows; `after` adds lines of the command's own from
/// the finished rows (its acceptance targets).
pub fn command_text(
    seed: &str,
    rows: impl FnOnce(Refs) -> (Vec<String>, Vec<SeedRow>),
    after: impl FnOnce(&[SeedRow]) -> Vec<String>,
) -> String {
    let seeds = Seeds::load();
    let kernel = machine::kernel_targets();
    let (setup, rows) = rows(Refs {
        seeds: &seeds,
        kernel: &kernel,
    });
    let rows = finish(&seeds, seed, rows);
    let mut out = render::section_text(seeds.document(seed), &setup, &rows);
    let lines = after(&rows);
    if !lines.is_empty() {
        out.push('\n');
    }
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// What every section gets.
pub struct Ctx<'a> {
    /// The documents' figures.
    pub seeds: &'a Seeds,
    /// The kernel's targets (for the kernel column's reason).
    pub kernel: &'a [KernelTarget],
    /// Sizes, runs, directory.
    pub rw: RwBenchOptions,
    /// `--quick`.
    pub quick: bool,
    /// The tiny smoke sizes.
    pub tiny: bool,
    /// The tree seed 001's images are built from (`None`: the scenario's default).
    pub image_tree: Option<PathBuf>,
    /// Ctrl-C.
    pub interrupt: &'a Interrupt,
}

impl Ctx<'_> {
    /// The figures and kernel targets the rows refer to.
    pub fn refs(&self) -> Refs<'_> {
        Refs {
            seeds: self.seeds,
            kernel: self.kernel,
        }
    }
}

/// What a section hands back: how it was set up (one line each) and its rows.
pub type Output = (Vec<String>, Vec<SeedRow>);

/// The sections, in report order: (seed, what it measures).
pub const ALL: [(&str, &str); 5] = [
    (
        "000",
        "dm-integrity overhead, with crypt+integrity and verity columns",
    ),
    ("001", "read-only root images: size and cold read time"),
    ("002", "fs-verity and dm-verity reads"),
    (
        "003",
        "Cloudflare's plain vs crypt against the cipher bound",
    ),
    (
        "004",
        "dm-verity vs dm-integrity sha256 / hmac-sha256 reads, CPU per MB",
    ),
];

/// Run section `seed`.
pub fn run(seed: &str, ctx: &Ctx) -> Result<Output, BenchError> {
    let (setup, rows) = match seed {
        "000" => s000::run(ctx),
        "001" => s001::run(ctx),
        "002" => s002::run(ctx),
        "003" => s003::run(ctx),
        "004" => s004::run(ctx),
        _ => Err(BenchError::Invalid(format!("no section {seed}"))),
    }?;
    Ok((setup, finish(ctx.seeds, seed, rows)))
}

/// How many runs section `seed` makes (fio runs, or image rows x runs): the progress bar's
/// total.
pub fn expected_runs(seed: &str, ctx: &Ctx) -> u64 {
    let r = u64::from(ctx.rw.runs);
    match seed {
        "000" => s000::expected_runs(r, ctx.seeds),
        "001" => s001::expected_runs(r),
        "002" => s002::expected_runs(r),
        "003" => s003::expected_runs(r),
        "004" => s004::expected_runs(r),
        _ => 0,
    }
}

/// The rows of `seed` a failed section leaves: every figure of the document, empty, with
/// the section's error as the reason.
pub fn failed_rows(ctx: &Ctx, seed: &str, why: &str) -> Vec<SeedRow> {
    ctx.seeds
        .figures
        .iter()
        .filter(|f| f.key.seed == seed)
        .map(|f| {
            SeedRow::empty(
                seed,
                &f.key.table,
                &f.key.row,
                &f.key.config,
                &f.key.baseline,
                &f.key.unit,
                &format!("the section did not run: {why}"),
            )
            .with_doc(Some(f), "")
        })
        .collect()
}

/// Bytes/s to MB/s (10^6 bytes), the unit of every throughput row.
pub fn mb_s(v: &[f64]) -> Vec<f64> {
    v.iter().map(|b| b / 1e6).collect()
}

/// `dmkit bench`'s scenario ([`overhead::run`]) with plain and verity-cold (every read hashed,
/// `--data-cache 0`) on the 4 KiB buffered read and randread: the verity rows of seeds 000 and
/// 002. Returns its setup line and result.
pub fn verity_reads(ctx: &Ctx) -> Result<(String, OverheadReport), BenchError> {
    let mut o = OverheadOptions::defaults(ctx.quick);
    o.size = ctx.rw.size;
    o.runs = ctx.rw.runs;
    o.runtime_ms = ctx.rw.runtime_ms;
    o.dir = ctx.rw.dir.clone();
    o.progress = ctx.rw.progress;
    o.configs = vec![Config::Plain, Config::VerityCold];
    o.workloads = Workload::select(&["read".into(), "randread".into()])?;
    let v = overhead::run(&o, ctx.interrupt)?;
    let line = format!(
        "verity: {} of random data in {}, {} run(s) of {} ms, configurations alternated: plain = dmkit linear open, verity = dmkit verity open --data-cache 0 (sha256, 4 KiB blocks, every read hashed); fio 4 KiB buffered libaio qd1",
        format_size(o.size),
        o.dir.display(),
        o.runs,
        o.runtime_ms
    );
    Ok((line, v))
}

/// One overhead row's (verity, plain) bandwidths in MB/s, one per run.
pub fn bandwidths(row: &Row) -> (Vec<f64>, Vec<f64>) {
    let bw = |k: usize| -> Vec<f64> {
        mb_s(
            &row.results[k]
                .runs
                .iter()
                .map(|f| f.bw_bytes)
                .collect::<Vec<_>>(),
        )
    };
    (bw(1), bw(0))
}
