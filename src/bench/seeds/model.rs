//! The one result model of `dmkit bench seeds`: every table of every document as rows of the
//! same shape (dmkit's figure, the baseline measured in the same run, their ratio, the
//! document's figure and ratio, or why a cell is empty). Serialised whole as `report.json`.

use serde::{Deserialize, Serialize};

use super::data::{Document, PublishedFigure, RowKey};
use crate::bench::harness::model::{OutlierRule, Stats};

/// A measured figure: every run's value and their median and range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// One value per run, in run order.
    pub runs: Vec<f64>,
    /// Median of `runs`.
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// The runs the document's outlier rule dropped (not in `runs`, nor in the figures).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outliers: Vec<f64>,
}

impl Figure {
    /// The figure of `runs` (`None` when empty or not finite).
    pub fn of(runs: Vec<f64>) -> Option<Figure> {
        let s = Stats::of(&runs)?;
        Some(Figure {
            median: s.median,
            min: s.min,
            max: s.max,
            runs,
            outliers: Vec::new(),
        })
    }

    /// The figure of the runs `rule` keeps; `Err` with every run when it keeps none.
    pub fn with_rule(runs: Vec<f64>, rule: &OutlierRule) -> Result<Option<Figure>, Vec<f64>> {
        let (kept, dropped) = rule.split(&runs);
        if kept.is_empty() && !dropped.is_empty() {
            return Err(dropped);
        }
        Ok(Figure::of(kept).map(|f| Figure {
            outliers: dropped,
            ..f
        }))
    }

    /// Every run, kept or dropped.
    pub fn all_runs(&self) -> Vec<f64> {
        let mut v = self.runs.clone();
        v.extend(&self.outliers);
        v
    }
}

/// The document's side of a row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DocCell {
    /// Its figure for the configuration, in `unit`.
    pub value: Option<f64>,
    /// Its figure for the baseline.
    pub baseline: Option<f64>,
    /// The unit it published.
    pub unit: String,
    /// `value / baseline`, or the ratio it published.
    pub ratio: Option<f64>,
    /// What the figure is.
    pub note: Option<String>,
}

impl DocCell {
    /// From the data file's figure.
    pub fn from_figure(f: &PublishedFigure) -> DocCell {
        DocCell {
            value: f.value,
            baseline: f.baseline_value,
            unit: f.key.unit.clone(),
            ratio: f.doc_ratio(),
            note: f.note.clone(),
        }
    }
}

/// One row of one table: a configuration against its baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedRow {
    /// Which row of which table (in dmkit's words; its unit is that of `dmkit` and `base`:
    /// "MB/s" = 10^6 bytes/s, "s", "MB", "CPU s/GB").
    #[serde(flatten)]
    pub key: RowKey,
    /// Whether a larger figure is better (throughput) or worse (time, size, CPU).
    pub higher_is_better: bool,
    /// dmkit's figure.
    pub dmkit: Option<Figure>,
    /// The baseline's figure, same run.
    pub base: Option<Figure>,
    /// `dmkit.median / base.median`.
    pub ratio: Option<f64>,
    /// The document's figure and ratio.
    pub doc: Option<DocCell>,
    /// Why there is no document figure (when `doc` is `None`).
    pub doc_missing: Option<String>,
    /// Why there is no dmkit figure (when `dmkit` or `base` is `None`), or no ratio (a
    /// baseline of 0).
    pub empty: Option<String>,
    /// The kernel's column: why it was not run (the kernel target it would need).
    pub kernel: String,
}

impl SeedRow {
    /// A row from measured runs; the ratio is computed here, from the medians.
    #[allow(clippy::too_many_arguments)]
    pub fn measured(
        seed: &str,
        table: &str,
        row: &str,
        config: &str,
        baseline: &str,
        unit: &str,
        higher_is_better: bool,
        dmkit: Vec<f64>,
        base: Vec<f64>,
    ) -> SeedRow {
        let dmkit = Figure::of(dmkit);
        let base = Figure::of(base);
        let ratio = ratio_of(dmkit.as_ref(), base.as_ref());
        let empty = match (&dmkit, &base) {
            (Some(_), Some(_)) => zero_baseline(base.as_ref()),
            _ => Some("no runs were measured".to_string()),
        };
        SeedRow {
            key: RowKey {
                seed: seed.into(),
                table: table.into(),
                row: row.into(),
                config: config.into(),
                baseline: baseline.into(),
                unit: unit.into(),
            },
            higher_is_better,
            dmkit,
            base,
            ratio,
            doc: None,
            doc_missing: None,
            empty,
            kernel: String::new(),
        }
    }

    /// A row dmkit could not measure, and why.
    pub fn empty(
        seed: &str,
        table: &str,
        row: &str,
        config: &str,
        baseline: &str,
        unit: &str,
        why: &str,
    ) -> SeedRow {
        let mut r = SeedRow::measured(
            seed,
            table,
            row,
            config,
            baseline,
            unit,
            true,
            Vec::new(),
            Vec::new(),
        );
        r.empty = Some(why.into());
        r
    }

    /// Drop the runs the document's `rule` calls outliers from both figures (before the
    /// ratio is taken): the one place a document's rule is applied.
    pub fn with_rule(mut self, rule: Option<&OutlierRule>) -> SeedRow {
        let Some(rule) = rule else { return self };
        let mut none_kept = Vec::new();
        for (side, f) in [("dmkit", &mut self.dmkit), ("baseline", &mut self.base)] {
            if let Some(fig) = f.take() {
                match Figure::with_rule(fig.all_runs(), rule) {
                    Ok(g) => *f = g,
                    Err(all) => none_kept.push(format!(
                        "every {side} run is an outlier under the document's rule: {all:?}"
                    )),
                }
            }
        }
        self.ratio = ratio_of(self.dmkit.as_ref(), self.base.as_ref());
        if !none_kept.is_empty() {
            self.empty = Some(none_kept.join("; "));
        } else if self.empty.is_none() && self.dmkit.is_some() {
            self.empty = zero_baseline(self.base.as_ref());
        }
        self
    }

    /// Attach the document's figure, or say why there is none.
    pub fn with_doc(mut self, f: Option<&PublishedFigure>, missing: &str) -> SeedRow {
        match f {
            Some(f) => self.doc = Some(DocCell::from_figure(f)),
            None => self.doc_missing = Some(missing.into()),
        }
        self
    }
}

/// `dmkit.median / base.median` (the one ratio rule of the report; a test recomputes it).
pub fn ratio_of(dmkit: Option<&Figure>, base: Option<&Figure>) -> Option<f64> {
    match (dmkit, base) {
        (Some(d), Some(b)) if b.median != 0.0 => Some(d.median / b.median),
        _ => None,
    }
}

/// Why a row with both figures has no ratio: its baseline's median is 0 (a run too short for
/// the CPU clock's ticks, say), which no ratio can be taken against.
fn zero_baseline(base: Option<&Figure>) -> Option<String> {
    base.filter(|b| b.median == 0.0)
        .map(|_| "the baseline's median is 0: no ratio".to_string())
}

/// One section (one document's scenarios) as it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Section {
    /// The document.
    pub seed: String,
    /// What ran, one line each (sizes, runs, sides).
    pub setup: Vec<String>,
    /// Why the section stopped, when it did.
    pub error: Option<String>,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// The kernel's counterpart of a dmkit layer on the running kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelTarget {
    /// "dm-verity", "dm-integrity", "dm-crypt", "fs-verity", "squashfs/erofs".
    pub target: String,
    /// Whether the running kernel has it.
    pub available: bool,
    /// What the report says about its column.
    pub note: String,
}

/// Where the run happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -a`-like line.
    pub uname: String,
    /// Kernel release.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// CPU flags that matter here (aes, avx2, sha_ni, vaes, ...), then the count of all.
    pub cpu_flags: Vec<String>,
    /// Memory, bytes.
    pub memory: u64,
    /// Tool and version lines (fio, cryptsetup, veritysetup, ...).
    pub tools: Vec<(String, String)>,
    /// How dmkit was built ("release"/"debug").
    pub dmkit_build: String,
}

/// How the run was asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// `--quick`.
    pub quick: bool,
    /// The tiny smoke sizes (tests).
    pub tiny: bool,
    /// The sections run.
    pub only: Vec<String>,
    /// Data per side for the fio sections, bytes.
    pub size: u64,
    /// Runs per job and side.
    pub runs: u32,
    /// One fio run, ms.
    pub runtime_ms: u64,
    /// Where the scratch files were.
    pub dir: String,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedsReport {
    /// Parameters.
    pub params: Params,
    /// The machine.
    pub machine: Machine,
    /// Load average (1, 5, 15 min) before the first section.
    pub load_before: [f64; 3],
    /// After the last.
    pub load_after: [f64; 3],
    /// Unix time at the start.
    pub started_unix: u64,
    /// Wall time of the whole run, seconds.
    pub seconds: f64,
    /// The source documents of the sections run.
    pub documents: Vec<Document>,
    /// The kernel's targets.
    pub kernel: Vec<KernelTarget>,
    /// The sections.
    pub sections: Vec<Section>,
    /// Every row of every table.
    pub rows: Vec<SeedRow>,
    /// Every command run, in order.
    pub commands: Vec<String>,
}
