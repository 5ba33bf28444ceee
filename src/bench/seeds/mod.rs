//! `dmkit bench seeds`: every table of the source documents (SEEDS 000 to 004) in one run and
//! one report. Each document is a section ([`sections`]) running the scenario of its
//! per-document command (the same `run` function, so nothing is measured twice in the code)
//! and turning the result into rows of one model ([`model`]): dmkit's figure, the baseline
//! measured in the same run, their ratio, the document's figure ([`data`], from
//! `data/seeds.json`) and its ratio, or why a cell is empty. One renderer ([`render`]) prints
//! the tables; `--out DIR` adds `report.md`, `report.json` and the plots ([`plot`]).

pub mod data;
pub mod machine;
pub mod model;
pub mod plot;
pub mod progress;
pub mod render;
pub mod sections;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use self::data::Seeds;
use self::model::{Params, Section, SeedsReport};
use self::progress::Progress;
use crate::bench::harness::process::{set_observer, Interrupt};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::BenchError;

/// The environment variable that turns on the tiny smoke sizes (tests, CI).
pub const TINY_ENV: &str = "DMKIT_BENCH_SEEDS_TINY";

/// What to run.
#[derive(Debug, Clone)]
pub struct SeedsOptions {
    /// `--quick`: smaller and shorter.
    pub quick: bool,
    /// Tiny sizes: a smoke run of seconds.
    pub tiny: bool,
    /// The sections ("000".."004"); all when empty.
    pub only: Vec<String>,
    /// Where the scratch files go (RAM by default).
    pub dir: PathBuf,
    /// Runs per job and side (`None`: the default of the size class).
    pub runs: Option<u32>,
    /// The tree seed 001's images are built from.
    pub image_tree: Option<PathBuf>,
    /// A progress bar on a terminal (plain lines otherwise).
    pub progress: bool,
}

impl SeedsOptions {
    /// Defaults.
    pub fn defaults(quick: bool) -> SeedsOptions {
        SeedsOptions {
            quick,
            tiny: std::env::var_os(TINY_ENV).is_some_and(|v| v == "1"),
            only: Vec::new(),
            dir: PathBuf::from("/dev/shm"),
            runs: None,
            image_tree: None,
            progress: true,
        }
    }

    /// The read-write options every fio section uses.
    fn rw(&self) -> RwBenchOptions {
        let mut o = RwBenchOptions::defaults(self.quick || self.tiny);
        if self.tiny {
            o.size = 8 << 20;
            o.runtime_ms = 300;
        }
        if let Some(r) = self.runs {
            o.runs = r;
        }
        o.dir = self.dir.clone();
        o.progress = true;
        o
    }

    /// The sections to run, checked.
    pub fn sections(&self) -> Result<Vec<&'static str>, BenchError> {
        let all: Vec<&'static str> = sections::ALL.iter().map(|(s, _)| *s).collect();
        if self.only.is_empty() {
            return Ok(all);
        }
        let mut v = Vec::new();
        for s in &self.only {
            let s = s.trim();
            let want = format!("{:0>3}", s);
            match all.iter().find(|a| **a == want) {
                Some(a) if !v.contains(a) => v.push(*a),
                Some(_) => {}
                None => {
                    return Err(BenchError::Invalid(format!(
                        "--only: no section '{s}' (the documents are 000 to 004)"
                    )))
                }
            }
        }
        v.sort();
        Ok(v)
    }
}

/// Run the sections and assemble the report. A section that fails leaves its rows empty
/// with the error as the reason; Ctrl-C stops the whole run.
pub fn run(o: &SeedsOptions, interrupt: &Interrupt) -> Result<SeedsReport, BenchError> {
    let which = o.sections()?;
    let seeds = Seeds::load();
    let kernel = machine::kernel_targets();
    let rw = o.rw();
    let ctx = sections::Ctx {
        seeds: &seeds,
        kernel: &kernel,
        rw: rw.clone(),
        quick: o.quick,
        tiny: o.tiny,
        image_tree: o.image_tree.clone(),
        interrupt,
    };
    let total: u64 = which.iter().map(|s| sections::expected_runs(s, &ctx)).sum();
    let progress = Arc::new(Progress::new(total, o.progress));
    set_observer(Some(progress.clone()));
    let started = Instant::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let load_before = machine::load_average();
    let mut out_sections = Vec::new();
    let mut rows = Vec::new();
    let mut end = 0;
    let result = (|| {
        for seed in &which {
            let what = sections::ALL
                .iter()
                .find(|(s, _)| s == seed)
                .map_or("", |(_, w)| *w);
            progress.section(seed, what);
            end += sections::expected_runs(seed, &ctx);
            let t = Instant::now();
            let (setup, r, error) = match sections::run(seed, &ctx) {
                Ok((setup, r)) => (setup, r, None),
                Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                Err(e) => {
                    let why = e.to_string();
                    (
                        Vec::new(),
                        sections::failed_rows(&ctx, seed, &why),
                        Some(why),
                    )
                }
            };
            progress.settle(end);
            rows.extend(r);
            out_sections.push(Section {
                seed: seed.to_string(),
                setup,
                error,
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        Ok(())
    })();
    progress.finish();
    set_observer(None);
    result?;
    Ok(SeedsReport {
        params: Params {
            quick: o.quick,
            tiny: o.tiny,
            only: which.iter().map(|s| s.to_string()).collect(),
            size: rw.size,
            runs: rw.runs,
            runtime_ms: rw.runtime_ms,
            dir: rw.dir.display().to_string(),
        },
        machine: machine::machine(),
        load_before,
        load_after: machine::load_average(),
        started_unix,
        seconds: started.elapsed().as_secs_f64(),
        documents: seeds
            .documents
            .iter()
            .filter(|d| which.contains(&d.seed.as_str()))
            .cloned()
            .collect(),
        kernel,
        sections: out_sections,
        rows,
        commands: progress.commands(),
    })
}

/// Write `report.json`, the plots and `report.md` into `dir` (created if missing); the files
/// written. Plots that cannot be drawn (no font) are named in `report.md` with the reason.
pub fn write_out(r: &SeedsReport, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let io = |what: String| move |source| BenchError::Io { what, source };
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    let json = serde_json::to_string_pretty(r)
        .map_err(|e| BenchError::Invalid(format!("report.json: {e}")))?;
    let mut files = vec![dir.join("report.json")];
    std::fs::write(&files[0], json + "\n").map_err(io(format!("write {}", files[0].display())))?;
    let (plots, plot_error) = match plot::write_all(dir, &plot::specs(r)) {
        Ok(p) => (p, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    files.extend(plots.iter().map(|p| dir.join(p)));
    let mut md = render::report_md(r, &plots);
    if let Some(e) = plot_error {
        md.push_str(&format!("\nThe plots were not drawn: {e}\n"));
    }
    let p = dir.join("report.md");
    std::fs::write(&p, md).map_err(io(format!("write {}", p.display())))?;
    files.push(p);
    Ok(files)
}

crate::bench::harness::report::impl_report!(SeedsReport => render::tables_text);
