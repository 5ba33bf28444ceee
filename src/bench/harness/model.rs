//! The result model: raw runs, their statistics (median and spread) and the comparisons
//! against the baseline. Pure data and arithmetic; serialised whole by `--json`.

use serde::{Deserialize, Serialize};

use super::fio::{FioResult, Workload};

/// Summary statistics of a series of measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of values.
    pub n: usize,
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n - 1); 0 for a single value.
    pub stddev: f64,
}

impl Stats {
    /// Statistics of `values`; `None` when empty or when a value is not finite.
    pub fn of(values: &[f64]) -> Option<Stats> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n & 1 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let stddev = if n > 1 {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Stats {
            n,
            median,
            min: v[0],
            max: v[n - 1],
            mean,
            stddev,
        })
    }

    /// The same statistics with every value multiplied by `k` (> 0), e.g. for a unit change.
    pub fn scaled(&self, k: f64) -> Stats {
        Stats {
            n: self.n,
            median: self.median * k,
            min: self.min * k,
            max: self.max * k,
            mean: self.mean * k,
            stddev: self.stddev * k,
        }
    }
}

/// The median of `values` (the mean of the two middle values for an even count); `None` when
/// there are none or one is not finite. The one median of every benchmark.
pub fn median(values: &[f64]) -> Option<f64> {
    Stats::of(values).map(|s| s.median)
}

/// A document's rule for dropping runs before its figure is taken (seed 000: "runs more than
/// 100% off the mean are outliers"). Applied by the one harness to every figure of the
/// document's rows, so each document's figures are summarised as it said it summarised its
/// own.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OutlierRule {
    /// A run at least this fraction of the mean of all runs away from that mean is dropped
    /// (1.0 = 100%: for a throughput, a run of 0 or of twice the mean or more).
    pub max_off_mean: f64,
}

impl OutlierRule {
    /// `runs` split into (kept, dropped), each in run order. The mean is that of every run;
    /// when it is not positive (no run moved any data) every run is dropped.
    pub fn split(&self, runs: &[f64]) -> (Vec<f64>, Vec<f64>) {
        if runs.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let mean = runs.iter().sum::<f64>() / runs.len() as f64;
        runs.iter()
            .partition(|&&x| mean > 0.0 && (x - mean).abs() < self.max_off_mean * mean)
    }
}

/// Change of `value` against `baseline` in percent: negative = lower (slower for a
/// throughput). `-33.0` means a third less.
pub fn change_pct(baseline: f64, value: f64) -> f64 {
    (value / baseline - 1.0) * 100.0
}

/// `value / baseline`.
pub fn ratio(baseline: f64, value: f64) -> f64 {
    value / baseline
}

/// All runs of one workload on one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Configuration name ("plain", "verity", ...).
    pub config: String,
    /// Each run's fio result, in run order.
    pub runs: Vec<FioResult>,
    /// Bandwidth, bytes/s.
    pub bw_bytes: Stats,
    /// IOPS.
    pub iops: Stats,
    /// Mean latency, ns.
    pub lat_mean_ns: Stats,
}

impl Measurement {
    /// Summarise the runs (at least one).
    pub fn new(config: &str, runs: Vec<FioResult>) -> Option<Measurement> {
        let col = |f: fn(&FioResult) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        Some(Measurement {
            config: config.to_string(),
            bw_bytes: Stats::of(&col(|r| r.bw_bytes))?,
            iops: Stats::of(&col(|r| r.iops))?,
            lat_mean_ns: Stats::of(&col(|r| r.lat.mean_ns))?,
            runs,
        })
    }
}

/// One configuration against the baseline on one workload, by bandwidth.
///
/// Runs alternate between configurations, so run `i` of the configuration and run `i` of the
/// baseline saw the same conditions; `ratio` summarises those per-run pairs, and the headline
/// figures are its median.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The configuration.
    pub config: String,
    /// The baseline it is compared with.
    pub baseline: String,
    /// Per-run-pair bandwidth ratios config/baseline.
    pub ratio: Stats,
    /// Median ratio as a change in percent (negative = slower).
    pub change_pct: f64,
}

impl Comparison {
    /// Compare `m` with `base` run by run (pairs up to the shorter series).
    pub fn new(base: &Measurement, m: &Measurement) -> Option<Comparison> {
        let ratios: Vec<f64> = base
            .runs
            .iter()
            .zip(&m.runs)
            .map(|(b, r)| ratio(b.bw_bytes, r.bw_bytes))
            .collect();
        let ratio = Stats::of(&ratios)?;
        Some(Comparison {
            config: m.config.clone(),
            baseline: base.config.clone(),
            change_pct: change_pct(1.0, ratio.median),
            ratio,
        })
    }

    /// The spread of the per-pair changes in percent: (min, max).
    pub fn change_range(&self) -> (f64, f64) {
        (
            change_pct(1.0, self.ratio.min),
            change_pct(1.0, self.ratio.max),
        )
    }
}

/// One table row: a workload on every configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The workload.
    pub workload: Workload,
    /// One measurement per configuration, baseline first.
    pub results: Vec<Measurement>,
    /// Each non-baseline configuration against the baseline.
    pub comparisons: Vec<Comparison>,
}

impl Row {
    /// Build a row from the baseline's measurement and the others'.
    pub fn new(workload: Workload, results: Vec<Measurement>) -> Row {
        let comparisons = match results.split_first() {
            Some((base, rest)) => rest
                .iter()
                .filter_map(|m| Comparison::new(base, m))
                .collect(),
            None => Vec::new(),
        };
        Row {
            workload,
            results,
            comparisons,
        }
    }
}

/// An acceptance check: configuration/baseline bandwidth ratio on one workload against a
/// target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Acceptance {
    /// Workload name.
    pub workload: String,
    /// Configuration.
    pub config: String,
    /// Baseline.
    pub baseline: String,
    /// Median run-paired ratio.
    pub ratio: f64,
    /// Required minimum ratio.
    pub target: f64,
    /// `ratio >= target`.
    pub pass: bool,
}

/// How a benchmark was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Size of the data file, bytes.
    pub size: u64,
    /// Runs per workload and configuration.
    pub runs: u32,
    /// Length of one fio run, ms.
    pub runtime_ms: u64,
    /// `--quick` was given.
    pub quick: bool,
    /// fio version string.
    pub fio_version: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Unix time the benchmark started.
    pub started_unix: u64,
    /// "release" or "debug": how the measured dmkit was built (a debug build's numbers mean
    /// little).
    pub build: String,
}

/// The whole result of `dmkit bench`: configurations side by side on each workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverheadReport {
    /// Parameters.
    pub params: Params,
    /// Configurations, baseline first.
    pub configs: Vec<String>,
    /// One row per workload.
    pub rows: Vec<Row>,
    /// Acceptance checks.
    pub acceptance: Vec<Acceptance>,
}

impl OverheadReport {
    /// Assemble the report from per-workload, per-configuration runs
    /// (`runs[workload][config]`), adding an acceptance check for every acceptance workload
    /// and every configuration `target` knows a target for.
    pub fn build(
        params: Params,
        configs: &[String],
        workloads: &[Workload],
        runs: Vec<Vec<Vec<FioResult>>>,
        target: impl Fn(&str) -> Option<f64>,
    ) -> OverheadReport {
        let mut rows = Vec::new();
        let mut acceptance = Vec::new();
        for (w, per_config) in workloads.iter().zip(runs) {
            let results: Vec<Measurement> = configs
                .iter()
                .zip(per_config)
                .filter_map(|(c, r)| Measurement::new(c, r))
                .collect();
            let row = Row::new(w.clone(), results);
            if w.acceptance {
                for c in &row.comparisons {
                    if let Some(t) = target(&c.config) {
                        acceptance.push(Acceptance {
                            workload: w.name.clone(),
                            config: c.config.clone(),
                            baseline: c.baseline.clone(),
                            ratio: c.ratio.median,
                            target: t,
                            pass: c.ratio.median >= t,
                        });
                    }
                }
            }
            rows.push(row);
        }
        OverheadReport {
            params,
            configs: configs.to_vec(),
            rows,
            acceptance,
        }
    }
}

/// One tool's timings in the format benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolTiming {
    /// The tool ("veritysetup format", "dmkit verity format").
    pub tool: String,
    /// Wall time per run, seconds.
    pub seconds: Stats,
    /// Throughput per run, MiB/s of data hashed.
    pub mib_s: Stats,
}

impl ToolTiming {
    /// Summarise `seconds` (one per run) for `size` bytes of data.
    pub fn new(tool: &str, size: u64, seconds: &[f64]) -> Option<ToolTiming> {
        let mib = size as f64 / (1u64 << 20) as f64;
        let mib_s: Vec<f64> = seconds.iter().map(|s| mib / s).collect();
        Some(ToolTiming {
            tool: tool.to_string(),
            seconds: Stats::of(seconds)?,
            mib_s: Stats::of(&mib_s)?,
        })
    }
}

/// The result of `dmkit bench format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatReport {
    /// Data size, bytes.
    pub size: u64,
    /// Runs per tool.
    pub runs: u32,
    /// Hash algorithm.
    pub hash: String,
    /// Data block size.
    pub data_block_size: u32,
    /// Hash block size.
    pub hash_block_size: u32,
    /// Salt (hex).
    pub salt: String,
    /// The root hash both tools printed.
    pub root_hash: String,
    /// The reference tool (veritysetup) first, then dmkit.
    pub tools: Vec<ToolTiming>,
    /// Median throughput of dmkit / median throughput of veritysetup.
    pub ratio: f64,
    /// Required minimum ratio.
    pub target: f64,
    /// `ratio >= target`.
    pub pass: bool,
    /// veritysetup version string.
    pub veritysetup_version: String,
    /// How the measured dmkit was built (see [`Params::build`]).
    pub dmkit_build: String,
    /// The same format with a FEC area (`--fec-device`), one row per `--fec-roots`.
    #[serde(default)]
    pub fec: Vec<FecFormatRow>,
}

/// `veritysetup format --fec-device` against `dmkit verity format --fec-device` with the
/// same roots, in the format benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FecFormatRow {
    /// Parity bytes per codeword.
    pub roots: u8,
    /// Size of the FEC area, bytes (identical from both tools in every run).
    pub fec_bytes: u64,
    /// veritysetup first, then dmkit (throughput in MiB/s of data).
    pub tools: Vec<ToolTiming>,
    /// Median throughput of dmkit / median throughput of veritysetup.
    pub ratio: f64,
    /// Required minimum ratio.
    pub target: f64,
    /// `ratio >= target`.
    pub pass: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::fio::Latency;

    fn fio(bw: f64) -> FioResult {
        FioResult {
            bw_bytes: bw,
            iops: bw / 4096.0,
            lat: Latency {
                mean_ns: 1e9 / (bw / 4096.0),
                p50_ns: None,
                p99_ns: None,
            },
            io_bytes: bw as u64,
            runtime_ms: 1000,
            usr_cpu: 0.0,
            sys_cpu: 0.0,
        }
    }

    #[test]
    fn median_and_spread() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!(
            (s.n, s.median, s.min, s.max, s.mean),
            (3, 2.0, 1.0, 3.0, 2.0)
        );
        assert!((s.stddev - 1.0).abs() < 1e-12);
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!((s.stddev - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        let s = Stats::of(&[7.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.stddev), (7.0, 7.0, 7.0, 0.0));
        assert!(Stats::of(&[]).is_none());
        assert!(Stats::of(&[1.0, f64::NAN]).is_none());
        let k = Stats::of(&[1.0, 3.0]).unwrap().scaled(2.0);
        assert_eq!((k.median, k.min, k.max), (4.0, 2.0, 6.0));
    }

    #[test]
    fn the_seed_000_outlier_rule() {
        let rule = OutlierRule { max_off_mean: 1.0 };
        // Mean 25.1: 100 is 298% off, dropped; 0.5 is 98% off and stays.
        assert_eq!(
            rule.split(&[10.0, 100.0, 10.0, 5.0, 0.5]),
            (vec![10.0, 10.0, 5.0, 0.5], vec![100.0])
        );
        // A run that moved nothing is 100% off any positive mean.
        assert_eq!(rule.split(&[0.0, 3.0, 3.0]), (vec![3.0, 3.0], vec![0.0]));
        // One run is its own mean.
        assert_eq!(rule.split(&[7.0]), (vec![7.0], vec![]));
        assert_eq!(rule.split(&[0.0]), (vec![], vec![0.0]));
        assert_eq!(rule.split(&[]), (vec![], vec![]));
    }

    #[test]
    fn overhead_percent() {
        // The seed's dm-verity row: 64.9 -> 43.8 MiB/s is -33%.
        assert_eq!(change_pct(64.9, 43.8).round(), -33.0);
        assert_eq!(change_pct(6582.0, 5420.0).round(), -18.0);
        assert_eq!(change_pct(100.0, 100.0), 0.0);
        assert_eq!(change_pct(100.0, 150.0), 50.0);
        assert_eq!(ratio(100.0, 93.0), 0.93);
    }

    #[test]
    fn comparisons_pair_runs() {
        let base = Measurement::new("plain", vec![fio(100.0), fio(200.0), fio(100.0)]).unwrap();
        let m = Measurement::new("verity", vec![fio(90.0), fio(160.0), fio(95.0)]).unwrap();
        assert_eq!(base.bw_bytes.median, 100.0);
        let c = Comparison::new(&base, &m).unwrap();
        assert_eq!(c.ratio.median, 0.9);
        assert!((c.change_pct + 10.0).abs() < 1e-9);
        let (lo, hi) = c.change_range();
        assert!(
            (lo + 20.0).abs() < 1e-9 && (hi + 5.0).abs() < 1e-9,
            "{lo} {hi}"
        );
    }

    #[test]
    fn report_acceptance() {
        let w = crate::bench::harness::fio::Workload::select(&["read".into(), "seq-1m".into()])
            .unwrap();
        let configs = vec!["plain".to_string(), "verity".to_string()];
        let runs = vec![
            vec![vec![fio(100.0)], vec![fio(50.0)]],
            vec![vec![fio(100.0)], vec![fio(93.0)]],
        ];
        let params = Params {
            size: 1 << 20,
            runs: 1,
            runtime_ms: 1000,
            quick: true,
            fio_version: "fio-3.33".into(),
            kernel: "6.1".into(),
            started_unix: 0,
            build: "release".into(),
        };
        let r = OverheadReport::build(params, &configs, &w, runs, |c| {
            (c == "verity").then_some(0.8)
        });
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].comparisons[0].change_pct, -50.0);
        assert_eq!(r.acceptance.len(), 1);
        assert_eq!(r.acceptance[0].workload, "seq-1m");
        assert!(r.acceptance[0].pass);
        assert!((r.acceptance[0].ratio - 0.93).abs() < 1e-12);
        // The whole model round-trips through JSON.
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<OverheadReport>(&j).unwrap(), r);
    }

    #[test]
    fn tool_timing_throughput() {
        let t = ToolTiming::new("x", 2 << 30, &[4.0, 2.0, 8.0]).unwrap();
        assert_eq!(t.seconds.median, 4.0);
        assert_eq!(t.mib_s.median, 512.0);
        assert_eq!((t.mib_s.min, t.mib_s.max), (256.0, 1024.0));
    }
}
