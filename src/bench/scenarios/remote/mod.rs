//! `dmkit bench remote` (issue 28): a verity image read from an HTTP server on 127.0.0.1 that
//! holds every request for 0 or 20 ms (the round trip to object storage), by dmkit's remote
//! verity export (every block verified) against the same remote device served raw, nbdkit's
//! curl plugin and QEMU's curl driver (none of them verifies), in the same run.
//!
//! How it is fair: the readers each serve the remote image as an NBD export on a Unix
//! socket and fio's nbd engine (libnbd, one connection, the same queue depth) reads them all
//! ([`clients`]); the server is our own ([`server`]), so every reader meets the same delay per
//! request and the report can count what each asked for. Every reader is started afresh for
//! every measurement (cold: nothing cached from an earlier run) and the readers alternate
//! run by run. Jobs: 4 KiB and 64 KiB random reads at queue depth 8, a 1 MiB sequential read at
//! queue depth 4, and the time from starting a reader to its first 4 KiB read (`qemu-io` over
//! NBD, the same for all).

pub mod clients;
pub mod first_file;
pub mod raw;
pub mod render;
pub mod server;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::verity::{run_format, VerityParams};
use crate::bench::harness::fio::{fio_parsed, parse_totals};
use crate::bench::harness::model::Stats;
use crate::bench::harness::process::{self as harness, run_ok, say, Dmkit, Interrupt, Workspace};
use crate::bench::harness::table::format_size;
use crate::bench::harness::tools::{fio_has_nbd, need, tool_version};
use crate::bench::BenchError;
use clients::{Reader, Remote};
use server::RangeServer;

/// dmkit / nbdkit-curl on the sequential read with 20 ms per request (the issue's target).
pub const SEQ_TARGET: f64 = 3.0;
/// dmkit / nbdkit-curl on 4 KiB random reads with 20 ms per request: no slower.
pub const RAND_TARGET: f64 = 1.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct RemoteBenchOptions {
    /// Bytes of data in the image.
    pub size: u64,
    /// Runs per job, delay and reader.
    pub runs: u32,
    /// Length of one fio run, ms.
    pub runtime_ms: u64,
    /// Delays added to each request, ms.
    pub delays_ms: Vec<u64>,
    /// `--quick`.
    pub quick: bool,
    /// Where the scratch directory is made (RAM by default).
    pub dir: PathBuf,
    /// Progress on stderr.
    pub progress: bool,
}

impl RemoteBenchOptions {
    /// The defaults (or `--quick`'s).
    pub fn defaults(quick: bool) -> RemoteBenchOptions {
        RemoteBenchOptions {
            size: if quick { 32 << 20 } else { 256 << 20 },
            runs: if quick { 1 } else { 2 },
            runtime_ms: if quick { 1500 } else { 5000 },
            delays_ms: vec![0, 20],
            quick,
            dir: PathBuf::from("/dev/shm"),
            progress: false,
        }
    }
}

/// One fio job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteJob {
    /// Row name.
    pub name: String,
    /// fio `--rw`.
    pub rw: String,
    /// Block size, bytes.
    pub bs: u64,
    /// Requests in flight on the NBD connection.
    pub iodepth: u32,
}

/// The jobs, in table order.
pub fn jobs() -> Vec<RemoteJob> {
    let j = |name: &str, rw: &str, bs: u64, iodepth| RemoteJob {
        name: name.into(),
        rw: rw.into(),
        bs,
        iodepth,
    };
    vec![
        j("randread-4k-qd8", "randread", 4096, 8),
        j("randread-64k-qd8", "randread", 64 << 10, 8),
        j("read-1m-qd4", "read", 1 << 20, 4),
    ]
}

/// One fio run through one reader.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RemoteRun {
    /// Bytes per second fio read.
    pub bw: f64,
    /// NBD requests fio completed.
    pub requests: u64,
    /// HTTP requests the server answered during the run.
    pub http_requests: u64,
    /// HTTP body bytes the server sent during the run.
    pub http_bytes: u64,
}

/// One cell: a job at a delay through a reader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteCell {
    /// Delay per request, ms.
    pub delay_ms: u64,
    /// Index into the report's jobs.
    pub job: usize,
    /// The reader.
    pub reader: Reader,
    /// The runs.
    pub runs: Vec<RemoteRun>,
    /// Seconds from starting the reader to its first 4 KiB read, per run.
    pub first_read_s: Vec<f64>,
}

impl RemoteCell {
    /// Median bandwidth.
    pub fn bw(&self) -> Option<Stats> {
        Stats::of(&self.runs.iter().map(|r| r.bw).collect::<Vec<_>>())
    }
}

/// The result of `dmkit bench remote`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteReport {
    /// Data bytes in the image.
    pub size: u64,
    /// Hash tree bytes (fetched by dmkit only).
    pub hash_size: u64,
    /// Runs per cell.
    pub runs: u32,
    /// fio run length, ms.
    pub runtime_ms: u64,
    /// `--quick`.
    pub quick: bool,
    /// Delays, ms.
    pub delays_ms: Vec<u64>,
    /// Jobs.
    pub jobs: Vec<RemoteJob>,
    /// Readers, in column order.
    pub readers: Vec<Reader>,
    /// Every cell.
    pub cells: Vec<RemoteCell>,
    /// Command line of each reader (first run).
    pub commands: Vec<String>,
    /// Versions: fio, nbdkit, qemu-storage-daemon.
    pub versions: Vec<String>,
    /// How the measured dmkit was built.
    pub dmkit_build: String,
    /// Time to first file of `image cat`, remote against local ([`first_file`]).
    #[serde(default)]
    pub first_file: Vec<first_file::FirstFileCell>,
}

impl RemoteReport {
    /// The cell of `job` at `delay` through `reader`.
    pub fn cell(&self, delay_ms: u64, job: usize, reader: Reader) -> Option<&RemoteCell> {
        self.cells
            .iter()
            .find(|c| c.delay_ms == delay_ms && c.job == job && c.reader == reader)
    }
}

/// Run the benchmark. Readers are stopped and scratch files removed on every path out.
pub fn run(o: &RemoteBenchOptions, interrupt: &Interrupt) -> Result<RemoteReport, BenchError> {
    if o.size == 0 || !o.size.is_multiple_of(1 << 20) {
        return Err(BenchError::Invalid(format!(
            "--size must be a non-zero multiple of 1 MiB, not {}",
            o.size
        )));
    }
    if o.runs == 0 || o.delays_ms.is_empty() {
        return Err(BenchError::Invalid(
            "--runs and --delays need at least one value".into(),
        ));
    }
    let fio_version = crate::bench::harness::fio::check_installed()?;
    if !fio_has_nbd() {
        return Err(BenchError::Missing(
            "this fio has no nbd engine (fio --enghelp): Debian's fio package has it".into(),
        ));
    }
    need("nbdkit", "nbdkit")?;
    need("qemu-storage-daemon", "qemu-system-common")?;
    need("qemu-io", "qemu-utils")?;
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.dir)?;
    let (data, hash) = (ws.path("data.img"), ws.path("hash.img"));
    harness::write_random_data(o.progress, &data, o.size, interrupt)?;
    let params = VerityParams {
        salt: Some(super::format::SALT.into()),
        ..VerityParams::default()
    };
    let root = run_format(
        &mut dmkit.command(params.dmkit_format_args(&data, &hash)),
        &hash,
        ws.dir(),
        interrupt,
    )?
    .root_hash;
    let hash_size = std::fs::metadata(&hash).map(|m| m.len()).unwrap_or(0);
    let srv = RangeServer::start(
        &[
            ("/data.img".into(), data.clone()),
            ("/hash.img".into(), hash.clone()),
        ],
        Duration::ZERO,
    )
    .map_err(|source| BenchError::Io {
        what: "start the HTTP server".into(),
        source,
    })?;
    let remote = Remote {
        data_url: format!("{}/data.img", srv.base_url()),
        hash_url: format!("{}/hash.img", srv.base_url()),
        root_hash: root,
        dmkit: &dmkit,
        scratch: ws.dir(),
    };
    say(
        o.progress,
        format!(
            "serving {} of data and {} of hash tree at {}",
            format_size(o.size),
            format_size(hash_size),
            srv.base_url()
        ),
    );

    let jobs = jobs();
    let readers = Reader::ALL.to_vec();
    let mut cells = Vec::new();
    let mut commands = vec![String::new(); readers.len()];
    let mut seq = 0u32;
    for &delay in &o.delays_ms {
        srv.set_delay(Duration::from_millis(delay));
        for (ji, job) in jobs.iter().enumerate() {
            let mut these: Vec<RemoteCell> = readers
                .iter()
                .map(|&reader| RemoteCell {
                    delay_ms: delay,
                    job: ji,
                    reader,
                    runs: Vec::new(),
                    first_read_s: Vec::new(),
                })
                .collect();
            for run in 0..o.runs as usize {
                for k in 0..readers.len() {
                    let side = (k + run) % readers.len();
                    if readers[side].skip_reason(delay).is_some() {
                        continue;
                    }
                    interrupt.check()?;
                    seq += 1;
                    let t = Instant::now();
                    let started =
                        clients::start(readers[side], &remote, &format!("r{seq}"), interrupt)?;
                    first_read(&started.uri, ws.dir(), interrupt)?;
                    let first = t.elapsed().as_secs_f64();
                    if commands[side].is_empty() {
                        commands[side] = started.command.clone();
                    }
                    let before = srv.counters();
                    let args = fio_args(job, &started.uri, o.size, o.runtime_ms);
                    let (bw, requests) = fio_parsed(
                        &job.name,
                        &args,
                        &started.uri,
                        o.runtime_ms,
                        ws.dir(),
                        interrupt,
                        parse_totals,
                    )?;
                    let after = srv.counters();
                    drop(started);
                    let r = RemoteRun {
                        bw,
                        requests,
                        http_requests: after.0 - before.0,
                        http_bytes: after.1 - before.1,
                    };
                    say(
                        o.progress,
                        format!(
                            "{delay} ms run {}/{} {:<17} {:<12} {:>8.2} MB/s, {} HTTP requests, \
                             first read {:.3} s",
                            run + 1,
                            o.runs,
                            job.name,
                            readers[side].title(),
                            bw / 1e6,
                            r.http_requests,
                            first
                        ),
                    );
                    these[side].runs.push(r);
                    these[side].first_read_s.push(first);
                }
            }
            cells.extend(these);
        }
    }
    drop(srv);
    let first_file = first_file::run(&dmkit, ws.dir(), &o.delays_ms, o.runs, interrupt)?;
    Ok(RemoteReport {
        size: o.size,
        hash_size,
        runs: o.runs,
        runtime_ms: o.runtime_ms,
        quick: o.quick,
        delays_ms: o.delays_ms.clone(),
        jobs,
        readers,
        cells,
        commands,
        versions: vec![
            fio_version,
            tool_version("nbdkit"),
            tool_version("qemu-storage-daemon"),
        ],
        dmkit_build: dmkit.build_label(),
        first_file,
    })
}

/// fio's arguments for `job` on the NBD export at `uri`.
pub fn fio_args(job: &RemoteJob, uri: &str, size: u64, runtime_ms: u64) -> Vec<String> {
    vec![
        format!("--name={}", job.name),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        format!("--rw={}", job.rw),
        format!("--bs={}", job.bs),
        format!("--iodepth={}", job.iodepth),
        format!("--size={size}"),
        "--time_based".into(),
        format!("--runtime={runtime_ms}ms"),
        "--numjobs=1".into(),
        // The same offsets for every reader.
        "--randseed=28".into(),
        "--output-format=json".into(),
    ]
}

/// One 4 KiB read at offset 0 through the export (`qemu-io`, a client none of the readers is).
fn first_read(
    uri: &str,
    scratch: &std::path::Path,
    interrupt: &Interrupt,
) -> Result<(), BenchError> {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-r", "-f", "raw", "-c", "read 0 4k", uri]);
    run_ok(&mut cmd, scratch, interrupt, Some(Duration::from_secs(120))).map(|_| ())
}

crate::bench::harness::report::impl_report!(RemoteReport => render::render);
