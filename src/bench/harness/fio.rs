//! fio: the workloads, the command line that runs one, and the parser of its JSON output.
//!
//! Parsing ([`parse_output`]) is pure and separate from running ([`run`]), so it is unit-tested
//! on a captured fio output.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::process::{self as harness, Interrupt};
use crate::bench::BenchError;

/// fio I/O engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoEngine {
    /// Linux native asynchronous I/O (`--ioengine=libaio`), queue depth from `iodepth`.
    Libaio,
    /// `pread`/`pwrite`, one request at a time (`--ioengine=psync`).
    Psync,
}

impl IoEngine {
    /// The name fio uses.
    pub fn as_str(self) -> &'static str {
        match self {
            IoEngine::Libaio => "libaio",
            IoEngine::Psync => "psync",
        }
    }
}

/// One fio job description: what is measured in one table row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Row name in tables and `--workloads`.
    pub name: String,
    /// fio `--rw` (read, randread, ...).
    pub rw: String,
    /// Block size in bytes.
    pub block_size: u64,
    /// `--direct=1` (bypass the page cache) or buffered I/O.
    pub direct: bool,
    /// I/O engine.
    pub ioengine: IoEngine,
    /// Queue depth (`--iodepth`, meaningful for libaio).
    pub iodepth: u32,
    /// Part of the project's acceptance set (gets a ratio-vs-target line).
    pub acceptance: bool,
}

impl Workload {
    fn new(
        name: &str,
        rw: &str,
        block_size: u64,
        direct: bool,
        ioengine: IoEngine,
        iodepth: u32,
        acceptance: bool,
    ) -> Self {
        Workload {
            name: name.to_string(),
            rw: rw.to_string(),
            block_size,
            direct,
            ioengine,
            iodepth,
            acceptance,
        }
    }

    /// The standard set, in table order: the seed's 4 KiB read/randread (buffered, then
    /// direct), then the acceptance trio `seq-1m`, `rand-4k-qd32`, `rand-4k-qd1`.
    pub fn standard() -> Vec<Workload> {
        use IoEngine::*;
        vec![
            Workload::new("read", "read", 4096, false, Libaio, 1, false),
            Workload::new("randread", "randread", 4096, false, Libaio, 1, false),
            Workload::new("read-direct", "read", 4096, true, Libaio, 1, false),
            Workload::new("randread-direct", "randread", 4096, true, Libaio, 1, false),
            Workload::new("seq-1m", "read", 1 << 20, true, Libaio, 4, true),
            Workload::new("rand-4k-qd32", "randread", 4096, true, Libaio, 32, true),
            Workload::new("rand-4k-qd1", "randread", 4096, true, Psync, 1, true),
        ]
    }

    /// Pick workloads from the standard set by name (a comma-separated list), keeping the
    /// order given.
    pub fn select(names: &[String]) -> Result<Vec<Workload>, BenchError> {
        let all = Workload::standard();
        names
            .iter()
            .map(|n| {
                all.iter().find(|w| w.name == *n).cloned().ok_or_else(|| {
                    let known: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
                    BenchError::Invalid(format!(
                        "unknown workload '{n}' (known: {})",
                        known.join(", ")
                    ))
                })
            })
            .collect()
    }

    /// A short human description: "4k randread, direct, libaio qd32".
    pub fn describe(&self) -> String {
        let bs = if self.block_size.trailing_zeros() >= 20 {
            format!("{}m", self.block_size >> 20)
        } else if self.block_size.trailing_zeros() >= 10 {
            format!("{}k", self.block_size >> 10)
        } else {
            self.block_size.to_string()
        };
        let mode = if self.direct { "direct" } else { "buffered" };
        match self.ioengine {
            IoEngine::Libaio => format!("{bs} {}, {mode}, libaio qd{}", self.rw, self.iodepth),
            IoEngine::Psync => format!("{bs} {}, {mode}, psync", self.rw),
        }
    }
}

/// How long and over how much of the file one fio run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Bytes of the file fio addresses (`--size`).
    pub size: u64,
    /// Time-based run length in milliseconds (`--time_based --runtime`).
    pub runtime_ms: u64,
}

/// fio's command-line arguments (without the program name) for one run of `w` on `filename`.
/// Read-only (`--readonly`), page cache of the file invalidated before the run
/// (`--invalidate=1`), JSON on stdout.
pub fn args(w: &Workload, filename: &Path, spec: RunSpec) -> Vec<String> {
    // fio splits --filename on ':'; escape it.
    let filename = filename.to_string_lossy().replace(':', "\\:");
    vec![
        format!("--name={}", w.name),
        format!("--filename={filename}"),
        format!("--rw={}", w.rw),
        format!("--bs={}", w.block_size),
        format!("--direct={}", u8::from(w.direct)),
        format!("--ioengine={}", w.ioengine.as_str()),
        format!("--iodepth={}", w.iodepth),
        format!("--size={}", spec.size),
        "--time_based".to_string(),
        format!("--runtime={}ms", spec.runtime_ms),
        "--invalidate=1".to_string(),
        "--readonly".to_string(),
        "--numjobs=1".to_string(),
        // Jobs as threads, not forked processes (which call setsid): killing fio then stops
        // everything it started.
        "--thread".to_string(),
        "--output-format=json".to_string(),
    ]
}

/// Nanosecond latency figures of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Mean total latency (submission + completion), ns.
    pub mean_ns: f64,
    /// Median completion latency, ns (if fio reported percentiles).
    pub p50_ns: Option<f64>,
    /// 99th percentile completion latency, ns (if fio reported percentiles).
    pub p99_ns: Option<f64>,
}

/// What one fio run measured (the read side; every workload here is a read).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FioResult {
    /// Bandwidth, bytes per second.
    pub bw_bytes: f64,
    /// I/O operations per second.
    pub iops: f64,
    /// Latency.
    pub lat: Latency,
    /// Bytes transferred.
    pub io_bytes: u64,
    /// Measured run time, ms.
    pub runtime_ms: u64,
    /// fio's own user CPU, % of one core.
    pub usr_cpu: f64,
    /// fio's own system CPU, % of one core.
    pub sys_cpu: f64,
}

fn field<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn num(v: &serde_json::Value, path: &[&str]) -> Result<f64, BenchError> {
    field(v, path)
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| BenchError::Fio(format!("fio JSON has no number at {}", path.join("."))))
}

fn opt_num(v: &serde_json::Value, path: &[&str]) -> Option<f64> {
    field(v, path).and_then(serde_json::Value::as_f64)
}

/// The JSON document in fio's `--output-format=json` output, after any warning lines fio
/// prints before it.
pub fn json_document(text: &str) -> Result<serde_json::Value, BenchError> {
    let start = text
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| text.starts_with('{').then_some(0))
        .ok_or_else(|| BenchError::Fio("no JSON object in fio output".into()))?;
    serde_json::from_str(&text[start..]).map_err(|e| BenchError::Fio(format!("fio JSON: {e}")))
}

/// Parse fio's `--output-format=json` output (one job, read side). fio may print warning lines
/// before the JSON object; they are skipped. A job that reports an error, or did no I/O, is an
/// error.
pub fn parse_output(text: &str) -> Result<FioResult, BenchError> {
    let v = json_document(text)?;
    let jobs = v
        .get("jobs")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| BenchError::Fio("fio JSON has no jobs".into()))?;
    let [job] = jobs.as_slice() else {
        return Err(BenchError::Fio(format!(
            "expected one fio job, got {}",
            jobs.len()
        )));
    };
    let error = num(job, &["error"])?;
    if error != 0.0 {
        return Err(BenchError::Fio(format!(
            "fio job failed with error {error} ({})",
            std::io::Error::from_raw_os_error(error as i32)
        )));
    }
    let io_bytes = num(job, &["read", "io_bytes"])? as u64;
    if io_bytes == 0 {
        return Err(BenchError::Fio("fio read nothing".into()));
    }
    Ok(FioResult {
        bw_bytes: num(job, &["read", "bw_bytes"])?,
        iops: num(job, &["read", "iops"])?,
        lat: Latency {
            mean_ns: num(job, &["read", "lat_ns", "mean"])?,
            p50_ns: opt_num(job, &["read", "clat_ns", "percentile", "50.000000"]),
            p99_ns: opt_num(job, &["read", "clat_ns", "percentile", "99.000000"]),
        },
        io_bytes,
        runtime_ms: num(job, &["read", "runtime"])? as u64,
        usr_cpu: opt_num(job, &["usr_cpu"]).unwrap_or(0.0),
        sys_cpu: opt_num(job, &["sys_cpu"]).unwrap_or(0.0),
    })
}

/// The first job of fio's JSON output (warning lines before it skipped); an error if fio
/// reported one for it.
pub fn first_job(text: &str) -> Result<serde_json::Value, BenchError> {
    let mut v = json_document(text)?;
    let job = v
        .get_mut("jobs")
        .and_then(|j| j.as_array_mut())
        .and_then(|j| j.first_mut())
        .map(serde_json::Value::take)
        .ok_or_else(|| BenchError::Fio("fio JSON has no job".into()))?;
    let err = job.get("error").and_then(|e| e.as_i64()).unwrap_or(0);
    if err != 0 {
        return Err(BenchError::Fio(format!(
            "fio job failed: {}",
            std::io::Error::from_raw_os_error(err as i32)
        )));
    }
    Ok(job)
}

/// One fio job as both scenarios run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Row name.
    pub name: String,
    /// fio `--rw`.
    pub rw: String,
    /// Block size, bytes.
    pub bs: u64,
    /// `libaio` with this queue depth, or `psync` when 0.
    pub iodepth: u32,
}

impl Job {
    /// A job named `name` doing `rw` in blocks of `bs` at queue depth `iodepth`.
    pub fn new(name: &str, rw: &str, bs: u64, iodepth: u32) -> Job {
        Job {
            name: name.into(),
            rw: rw.into(),
            bs,
            iodepth,
        }
    }

    /// fio arguments on `file` (direct I/O, time based, JSON).
    pub fn args(&self, file: &Path, size: u64, runtime_ms: u64) -> Vec<String> {
        let filename = file.to_string_lossy().replace(':', "\\:");
        let mut v = vec![
            format!("--name={}", self.name),
            format!("--filename={filename}"),
            format!("--readwrite={}", self.rw),
            format!("--bs={}", self.bs),
            "--direct=1".to_string(),
            format!("--size={size}"),
            "--time_based".to_string(),
            format!("--runtime={runtime_ms}ms"),
            "--numjobs=1".to_string(),
            "--thread".to_string(),
            "--output-format=json".to_string(),
        ];
        if self.iodepth == 0 {
            v.push("--ioengine=psync".into());
        } else {
            v.push("--ioengine=libaio".into());
            v.push(format!("--iodepth={}", self.iodepth));
        }
        v
    }
}

/// Read and write bandwidth of one fio run, bytes/s (0 for a direction not exercised).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RwResult {
    /// Read bandwidth.
    pub read: f64,
    /// Write bandwidth.
    pub write: f64,
}

/// Parse fio's JSON (one job): both directions' `bw_bytes`.
pub fn parse_rw(text: &str) -> Result<RwResult, BenchError> {
    let job = first_job(text)?;
    let bw = |dir: &str| {
        job.get(dir)
            .and_then(|d| d.get("bw_bytes"))
            .and_then(|b| b.as_f64())
            .unwrap_or(0.0)
    };
    let r = RwResult {
        read: bw("read"),
        write: bw("write"),
    };
    if r.read == 0.0 && r.write == 0.0 {
        return Err(BenchError::Fio("fio moved no data".into()));
    }
    Ok(r)
}

/// Parse fio's JSON (one job): total bandwidth and completed requests over both directions.
pub fn parse_totals(text: &str) -> Result<(f64, u64), BenchError> {
    let job = first_job(text)?;
    let (mut bw, mut ios) = (0.0, 0);
    for dir in ["read", "write"] {
        bw += job[dir]["bw_bytes"].as_f64().unwrap_or(0.0);
        ios += job[dir]["total_ios"].as_u64().unwrap_or(0);
    }
    if ios == 0 {
        return Err(BenchError::Fio("fio completed no request".into()));
    }
    Ok((bw, ios))
}

/// Run fio with `args` (one job named `label`, on `file`, for `runtime_ms`) and return both
/// directions' bandwidth; a failure names the job and the file.
pub fn fio_rw(
    label: &str,
    args: &[String],
    file: &Path,
    runtime_ms: u64,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<RwResult, BenchError> {
    fio_parsed(
        label,
        args,
        &file.display().to_string(),
        runtime_ms,
        scratch,
        interrupt,
        parse_rw,
    )
}

/// Run fio with `args` (one job named `label`, on `target`, for `runtime_ms`) and `parse` its
/// JSON; a failure names the job and the target.
pub fn fio_parsed<T>(
    label: &str,
    args: &[String],
    target: &str,
    runtime_ms: u64,
    scratch: &Path,
    interrupt: &Interrupt,
    parse: impl FnOnce(&str) -> Result<T, BenchError>,
) -> Result<T, BenchError> {
    let mut cmd = Command::new("fio");
    cmd.args(args);
    let limit = Duration::from_millis(runtime_ms) + Duration::from_secs(120);
    let out = super::process::run_captured(&mut cmd, scratch, interrupt, Some(limit))?;
    super::process::notify(super::process::Event::RunDone);
    if !out.status.success() {
        return Err(BenchError::Fio(format!(
            "{label} on {target} failed ({}): {}",
            out.status,
            out.stderr.trim()
        )));
    }
    parse(&out.stdout)
        .map_err(|e| BenchError::Fio(format!("{label} on {target}: {e} {}", out.stderr.trim())))
}

/// Fail with one clear message if fio cannot be run; its version otherwise.
pub fn check_installed() -> Result<String, BenchError> {
    super::process::required_version("fio", "fio")
}

/// Run fio once: `w` against `filename`. Honours Ctrl-C through `interrupt` (kills fio).
pub fn run(
    w: &Workload,
    filename: &Path,
    spec: RunSpec,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<FioResult, BenchError> {
    let mut cmd = Command::new("fio");
    cmd.args(args(w, filename, spec));
    // fio normally ends on its own after the runtime; leave generous slack for slow setup.
    let limit = Duration::from_millis(spec.runtime_ms) + Duration::from_secs(120);
    let out = harness::run_captured(&mut cmd, scratch, interrupt, Some(limit))?;
    harness::notify(harness::Event::RunDone);
    if !out.status.success() {
        return Err(BenchError::Fio(format!(
            "fio {} on {} failed ({}): {}",
            w.name,
            filename.display(),
            out.status,
            out.stderr.trim()
        )));
    }
    parse_output(&out.stdout).map_err(|e| match e {
        BenchError::Fio(m) if !out.stderr.trim().is_empty() => BenchError::Fio(format!(
            "{} on {}: {m}; fio said: {}",
            w.name,
            filename.display(),
            out.stderr.trim()
        )),
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `write` and `trim` sides of a read-only job: fio prints them all zero.
    macro_rules! idle_direction {
        () => {
            r#"{
        "io_bytes" : 0,
        "io_kbytes" : 0,
        "bw_bytes" : 0,
        "bw" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "clat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "bw_min" : 0,
        "bw_max" : 0,
        "bw_agg" : 0.000000,
        "bw_mean" : 0.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 0,
        "iops_min" : 0,
        "iops_max" : 0,
        "iops_mean" : 0.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 0
      }"#
        };
    }

    /// A real fio 3.33 output: `fio --name=randread --filename=d --rw=randread --bs=4k
    /// --direct=1 --ioengine=libaio --iodepth=32 --size=64M --time_based --runtime=1 --readonly
    /// --invalidate=1 --output-format=json` on a 64 MiB file.
    const SAMPLE: &str = concat!(
        r#"{
  "fio version" : "fio-3.33",
  "timestamp" : 1795225311,
  "timestamp_ms" : 1795225311179,
  "time" : "Sat Nov 21 01:41:51 2026",
  "jobs" : [
    {
      "jobname" : "randread",
      "groupid" : 0,
      "error" : 0,
      "eta" : 2147483647,
      "elapsed" : 2,
      "job options" : {
        "name" : "randread",
        "filename" : "d",
        "rw" : "randread",
        "bs" : "4k",
        "direct" : "1",
        "ioengine" : "libaio",
        "iodepth" : "32",
        "size" : "64M",
        "runtime" : "1",
        "invalidate" : "1"
      },
      "read" : {
        "io_bytes" : 705916928,
        "io_kbytes" : 689372,
        "bw_bytes" : 705211716,
        "bw" : 688683,
        "iops" : 172170.829171,
        "runtime" : 1001,
        "total_ios" : 172343,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 740,
          "max" : 6810085,
          "mean" : 1081.712614,
          "stddev" : 20970.503249,
          "N" : 172343
        },
        "clat_ns" : {
          "min" : 35730,
          "max" : 6933225,
          "mean" : 180616.483762,
          "stddev" : 140070.860061,
          "N" : 172343,
          "percentile" : {
            "1.000000" : 156672,
            "5.000000" : 158720,
            "10.000000" : 160768,
            "20.000000" : 162816,
            "30.000000" : 166912,
            "40.000000" : 168960,
            "50.000000" : 171008,
            "60.000000" : 173056,
            "70.000000" : 175104,
            "80.000000" : 177152,
            "90.000000" : 183296,
            "95.000000" : 191488,
            "99.000000" : 264192,
            "99.500000" : 552960,
            "99.900000" : 2310144,
            "99.950000" : 4046848,
            "99.990000" : 4145152
          }
        },
        "lat_ns" : {
          "min" : 48570,
          "max" : 9898927,
          "mean" : 181698.196376,
          "stddev" : 142428.755563,
          "N" : 172343
        },
        "bw_min" : 663888,
        "bw_max" : 663888,
        "bw_agg" : 96.399605,
        "bw_mean" : 663888.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 1,
        "iops_min" : 165972,
        "iops_max" : 165972,
        "iops_mean" : 165972.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 1
      },
      "write" : "#,
        idle_direction!(),
        r#",
      "trim" : "#,
        idle_direction!(),
        r#",
      "sync" : {
        "total_ios" : 0,
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        }
      },
      "job_runtime" : 1000,
      "usr_cpu" : 6.200000,
      "sys_cpu" : 20.800000,
      "ctx" : 5407,
      "majf" : 0,
      "minf" : 43,
      "iodepth_level" : {
        "1" : 0.100000,
        "2" : 0.100000,
        "4" : 0.100000,
        "8" : 0.100000,
        "16" : 0.100000,
        "32" : 99.982013,
        ">=64" : 0.000000
      },
      "iodepth_submit" : {
        "0" : 0.000000,
        "4" : 100.000000,
        "8" : 0.000000,
        "16" : 0.000000,
        "32" : 0.000000,
        "64" : 0.000000,
        ">=64" : 0.000000
      },
      "iodepth_complete" : {
        "0" : 0.000000,
        "4" : 99.999420,
        "8" : 0.000000,
        "16" : 0.000000,
        "32" : 0.100000,
        "64" : 0.000000,
        ">=64" : 0.000000
      },
      "latency_ns" : {
        "2" : 0.000000,
        "4" : 0.000000,
        "10" : 0.000000,
        "20" : 0.000000,
        "50" : 0.000000,
        "100" : 0.000000,
        "250" : 0.000000,
        "500" : 0.000000,
        "750" : 0.000000,
        "1000" : 0.000000
      },
      "latency_us" : {
        "2" : 0.000000,
        "4" : 0.000000,
        "10" : 0.000000,
        "20" : 0.000000,
        "50" : 0.010000,
        "100" : 0.010000,
        "250" : 98.681118,
        "500" : 0.788544,
        "750" : 0.092838,
        "1000" : 0.074270
      },
      "latency_ms" : {
        "2" : 0.185676,
        "4" : 0.110826,
        "10" : 0.055703,
        "20" : 0.000000,
        "50" : 0.000000,
        "100" : 0.000000,
        "250" : 0.000000,
        "500" : 0.000000,
        "750" : 0.000000,
        "1000" : 0.000000,
        "2000" : 0.000000,
        ">=2000" : 0.000000
      },
      "latency_depth" : 32,
      "latency_target" : 0,
      "latency_percentile" : 100.000000,
      "latency_window" : 0
    }
  ],
  "disk_util" : [
    {
      "name" : "vda",
      "read_ios" : 155070,
      "write_ios" : 50,
      "read_merges" : 0,
      "write_merges" : 3,
      "read_ticks" : 22868,
      "write_ticks" : 321,
      "in_queue" : 23190,
      "util" : 83.935743
    }
  ]
}
"#
    );

    #[test]
    fn parses_a_real_fio_output() {
        let r = parse_output(SAMPLE).unwrap();
        assert_eq!(r.bw_bytes, 705211716.0);
        assert!((r.iops - 172170.829171).abs() < 1e-6);
        assert!((r.lat.mean_ns - 181698.196376).abs() < 1e-6);
        assert_eq!(r.lat.p50_ns, Some(171008.0));
        assert_eq!(r.lat.p99_ns, Some(264192.0));
        assert_eq!(r.io_bytes, 705916928);
        assert_eq!(r.runtime_ms, 1001);
        assert_eq!(r.usr_cpu, 6.2);
        assert_eq!(r.sys_cpu, 20.8);
    }

    #[test]
    fn skips_warning_lines_before_the_json() {
        let text = format!("fio: some warning\nnote: another one\n{SAMPLE}");
        assert_eq!(parse_output(&text).unwrap(), parse_output(SAMPLE).unwrap());
    }

    #[test]
    fn a_job_error_is_an_error() {
        let text = SAMPLE.replacen("\"error\" : 0,", "\"error\" : 2,", 1);
        let e = parse_output(&text).unwrap_err().to_string();
        assert!(e.contains("error 2"), "{e}");
    }

    #[test]
    fn no_io_is_an_error() {
        let text = SAMPLE.replacen("\"io_bytes\" : 705916928", "\"io_bytes\" : 0", 1);
        assert!(parse_output(&text).is_err());
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_output("").is_err());
        assert!(parse_output("fio: oops\n").is_err());
        assert!(parse_output("{\"jobs\": []}").is_err());
        assert!(parse_output("{ truncated").is_err());
    }

    #[test]
    fn builds_the_command_line() {
        let w = &Workload::select(&["rand-4k-qd32".to_string()]).unwrap()[0];
        let a = args(
            w,
            Path::new("/run/dmkit/a:b"),
            RunSpec {
                size: 64 << 20,
                runtime_ms: 1500,
            },
        );
        for want in [
            "--filename=/run/dmkit/a\\:b",
            "--rw=randread",
            "--bs=4096",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=32",
            "--size=67108864",
            "--time_based",
            "--runtime=1500ms",
            "--invalidate=1",
            "--readonly",
            "--thread",
            "--output-format=json",
        ] {
            assert!(a.iter().any(|x| x == want), "missing {want} in {a:?}");
        }
    }

    #[test]
    fn selects_workloads_by_name() {
        let names = ["seq-1m".to_string(), "read".to_string()];
        let w = Workload::select(&names).unwrap();
        assert_eq!(w[0].name, "seq-1m");
        assert_eq!(w[0].describe(), "1m read, direct, libaio qd4");
        assert_eq!(w[1].describe(), "4k read, buffered, libaio qd1");
        assert!(Workload::select(&["nope".to_string()]).is_err());
        let acceptance: Vec<String> = Workload::standard()
            .into_iter()
            .filter(|w| w.acceptance)
            .map(|w| w.name)
            .collect();
        assert_eq!(acceptance, ["seq-1m", "rand-4k-qd32", "rand-4k-qd1"]);
    }
}
