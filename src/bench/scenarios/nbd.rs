//! `dmkit bench nbd`: the NBD export as a dimension. dmkit's NBD server (`dmkit linear open
//! FILE --no-fuse --nbd unix:...`) against qemu-storage-daemon's NBD export of the very same
//! file (a file in RAM), in the same run, with the same client: fio's `nbd` engine (libnbd),
//! one connection per job. Runs alternate between the two servers.
//!
//! Reported per job: each server's throughput (median of the runs) and its CPU time per
//! request (user + system time of the serving process over the run, from `/proc/PID/stat`,
//! divided by the requests fio completed). Targets (the issue's): at least 1.5x
//! qemu-storage-daemon at 4 KiB random read qd32 and at 1 MiB read; the write rows are
//! informative.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::harness::fio::{fio_parsed, parse_totals};
use crate::bench::harness::model::median;

use crate::bench::harness::process::say;
use crate::bench::harness::process::{
    self as harness, command_line, run_ok, Dmkit, Interrupt, Workspace,
};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::{format_size, Align, TextTable};
use crate::bench::harness::tools::{fio_has_nbd, need, start_daemon, tool_version, Daemon};
use crate::bench::BenchError;

/// dmkit / qemu-storage-daemon on the rows that have a target.
pub const TARGET: f64 = 1.5;

/// The export name both servers use.
const EXPORT: &str = "bench";

/// One fio job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NbdJob {
    /// Row name.
    pub name: String,
    /// fio `--rw`.
    pub rw: String,
    /// Block size, bytes.
    pub bs: u64,
    /// Requests in flight on the connection.
    pub iodepth: u32,
    /// Whether the row has the 1.5x target.
    pub targeted: bool,
}

impl NbdJob {
    fn new(name: &str, rw: &str, bs: u64, iodepth: u32, targeted: bool) -> NbdJob {
        NbdJob {
            name: name.into(),
            rw: rw.into(),
            bs,
            iodepth,
            targeted,
        }
    }

    /// fio's arguments for this job on the export at `uri`.
    pub fn args(&self, uri: &str, size: u64, runtime_ms: u64) -> Vec<String> {
        vec![
            format!("--name={}", self.name),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--iodepth={}", self.iodepth),
            format!("--size={size}"),
            "--time_based".into(),
            format!("--runtime={runtime_ms}ms"),
            "--numjobs=1".into(),
            "--output-format=json".into(),
        ]
    }
}

/// The jobs: the two with targets, then writes.
pub fn jobs() -> Vec<NbdJob> {
    vec![
        NbdJob::new("randread-4k-qd32", "randread", 4096, 32, true),
        NbdJob::new("read-1m-qd4", "read", 1 << 20, 4, true),
        NbdJob::new("randwrite-4k-qd32", "randwrite", 4096, 32, false),
        NbdJob::new("write-1m-qd4", "write", 1 << 20, 4, false),
    ]
}

/// Bandwidth and completed requests of one fio run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NbdRun {
    /// Bytes per second, both directions.
    pub bw: f64,
    /// Requests completed, both directions.
    pub requests: u64,
    /// CPU time of the serving process per request, microseconds.
    pub cpu_us_per_request: f64,
}

/// The comparison's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NbdReport {
    /// File size, bytes.
    pub size: u64,
    /// Runs per job and server.
    pub runs: u32,
    /// fio run length, ms.
    pub runtime_ms: u64,
    /// fio's version.
    pub fio_version: String,
    /// qemu-storage-daemon's version line.
    pub qsd_version: String,
    /// The qemu-storage-daemon command line.
    pub qsd_command: String,
    /// The dmkit open command line.
    pub dmkit_command: String,
    /// `qemu-img compare` found both exports identical before the runs.
    pub same_data: bool,
    /// Jobs, in table order.
    pub jobs: Vec<NbdJob>,
    /// Per job: qemu-storage-daemon's runs.
    pub qsd: Vec<Vec<NbdRun>>,
    /// Per job: dmkit's runs.
    pub dmkit: Vec<Vec<NbdRun>>,
}

impl NbdReport {
    /// Median bandwidth and CPU per request of `side` (0 qsd, 1 dmkit) on job `i`.
    pub fn medians(&self, side: usize, i: usize) -> (f64, f64) {
        let runs = if side == 0 {
            &self.qsd[i]
        } else {
            &self.dmkit[i]
        };
        let bw: Vec<f64> = runs.iter().map(|r| r.bw).collect();
        let cpu: Vec<f64> = runs.iter().map(|r| r.cpu_us_per_request).collect();
        (median(&bw).unwrap_or(0.0), median(&cpu).unwrap_or(0.0))
    }
}

/// Start qemu-storage-daemon exporting `file` over NBD at `sock`.
fn start_qsd(file: &Path, sock: &Path, log: &Path) -> Result<(Daemon, String), BenchError> {
    // locking=off: dmkit holds its claim on the same file (both serve it, one at a time).
    let args = [
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=file0,filename={},cache.direct=off,locking=off",
            file.display()
        ),
        "--nbd-server".into(),
        format!("addr.type=unix,addr.path={}", sock.display()),
        "--export".into(),
        format!("type=nbd,id=exp0,node-name=file0,name={EXPORT},writable=on"),
    ];
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.args(&args);
    let line = command_line(&cmd);
    let d = start_daemon(cmd, "qemu-storage-daemon", sock, log)?;
    Ok((d, line))
}

/// Run the comparison.
pub fn run(o: &RwBenchOptions, interrupt: &Interrupt) -> Result<NbdReport, BenchError> {
    o.check()?;
    let fio_version = crate::bench::harness::fio::check_installed()?;
    if !fio_has_nbd() {
        return Err(BenchError::Missing(
            "this fio has no nbd engine (fio --enghelp): Debian's fio package has it".into(),
        ));
    }
    need("qemu-storage-daemon", "qemu-system-x86")?;
    need("qemu-img", "qemu-utils")?;
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.dir)?;
    let file = ws.path("nbd.img");
    say(
        o.progress,
        format!("writing {} of random data", format_size(o.size)),
    );
    harness::write_random_file(&file, o.size, interrupt)?;

    let name = format!("bench{}-nbd", std::process::id());
    let dsock = ws.path("dmkit.sock");
    let open: Vec<String> = vec![
        "linear".into(),
        "open".into(),
        file.to_string_lossy().into_owned(),
        name.clone(),
        "--no-fuse".into(),
        "--nbd".into(),
        format!("unix:{}", dsock.display()),
    ];
    let dmkit_command = format!("dmkit {}", open.join(" "));
    say(o.progress, format!("opening {dmkit_command}"));
    let (ours, duri) = dmkit.open_nbd(&name, &open, ws.dir(), interrupt)?;
    let qsock = ws.path("qsd.sock");
    let (qsd, qsd_command) = start_qsd(&file, &qsock, &ws.path("qsd.log"))?;
    say(o.progress, format!("started {qsd_command}"));
    let quri = format!("nbd+unix:///{EXPORT}?socket={}", qsock.display());

    // The two exports must serve the same bytes, or the comparison means nothing.
    let mut cmp = Command::new("qemu-img");
    cmp.args(["compare", "-f", "raw", "-F", "raw", &quri, &duri]);
    run_ok(
        &mut cmp,
        ws.dir(),
        interrupt,
        Some(Duration::from_secs(600)),
    )
    .map_err(|e| {
        BenchError::Mismatch(format!(
            "qemu-storage-daemon and dmkit serve different data: {e}"
        ))
    })?;

    let pids = [
        qsd.child.id(),
        dmkit.server_pid(&name, ws.dir(), interrupt)?,
    ];
    let uris = [quri.as_str(), duri.as_str()];
    let jobs = jobs();
    let mut res: [Vec<Vec<NbdRun>>; 2] =
        [vec![Vec::new(); jobs.len()], vec![Vec::new(); jobs.len()]];
    for run in 0..o.runs as usize {
        for (ji, job) in jobs.iter().enumerate() {
            for k in 0..2 {
                let side = (k + run) % 2;
                interrupt.check()?;
                let before = harness::cpu_seconds(pids[side])?;
                let args = job.args(uris[side], o.size, o.runtime_ms);
                let (bw, requests) = fio_parsed(
                    &job.name,
                    &args,
                    uris[side],
                    o.runtime_ms,
                    ws.dir(),
                    interrupt,
                    parse_totals,
                )?;
                let cpu = harness::cpu_seconds(pids[side])? - before;
                let r = NbdRun {
                    bw,
                    requests,
                    cpu_us_per_request: cpu * 1e6 / requests as f64,
                };
                say(
                    o.progress,
                    format!(
                        "run {}/{} {:<18} {:<6} {:.0} MB/s, {:.1} µs CPU/request",
                        run + 1,
                        o.runs,
                        job.name,
                        if side == 0 { "qsd" } else { "dmkit" },
                        bw / 1e6,
                        r.cpu_us_per_request
                    ),
                );
                res[side][ji].push(r);
            }
        }
    }
    if dmkit.replaced() {
        eprintln!("dmkit: warning: the dmkit executable was rebuilt during the benchmark");
    }
    drop(qsd);
    ours.close()?;
    let [q, d] = res;
    Ok(NbdReport {
        size: o.size,
        runs: o.runs,
        runtime_ms: o.runtime_ms,
        fio_version,
        qsd_version: tool_version("qemu-storage-daemon"),
        qsd_command,
        dmkit_command,
        same_data: true,
        jobs,
        qsd: q,
        dmkit: d,
    })
}

fn mbs(bw: f64) -> String {
    format!("{:.0} MB/s", bw / 1e6)
}

/// The table.
pub fn render(r: &NbdReport) -> String {
    let mut t = TextTable::new(vec![
        ("job (fio nbd engine)".into(), Align::Left),
        ("qemu-storage-daemon".into(), Align::Right),
        ("dmkit".into(), Align::Right),
        ("dmkit/qsd".into(), Align::Right),
        ("target".into(), Align::Right),
        ("qsd CPU/req".into(), Align::Right),
        ("dmkit CPU/req".into(), Align::Right),
    ]);
    for (i, j) in r.jobs.iter().enumerate() {
        let (q, qc) = r.medians(0, i);
        let (d, dc) = r.medians(1, i);
        let ratio = if q > 0.0 { d / q } else { 0.0 };
        let target = if j.targeted {
            format!(
                ">= {TARGET:.1}x {}",
                if ratio >= TARGET { "met" } else { "MISSED" }
            )
        } else {
            "-".into()
        };
        t.push(vec![
            j.name.clone(),
            mbs(q),
            mbs(d),
            format!("{ratio:.2}x"),
            target,
            format!("{qc:.1} µs"),
            format!("{dc:.1} µs"),
        ]);
    }
    let mut out = format!(
        "NBD exports of one {} file (RAM): qemu-storage-daemon's NBD export vs dmkit linear --nbd, \
both over Unix sockets\n\
client: {} nbd engine (libnbd), one connection per job; median of {} run(s) of {:.1} s, \
alternated; MB = 10^6 bytes\n\
CPU/req: the serving process's user + system time over the run / requests completed\n\
same data through both (qemu-img compare): {}\n\n",
        format_size(r.size),
        r.fio_version,
        r.runs,
        r.runtime_ms as f64 / 1000.0,
        if r.same_data { "yes" } else { "NO" },
    );
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n{}\n  {}\ndmkit:\n  {}\n",
        r.qsd_version, r.qsd_command, r.dmkit_command
    ));
    out
}

crate::bench::harness::report::impl_report!(NbdReport => render);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::fio::parse_totals as parse_fio;

    #[test]
    fn fio_output_and_arguments() {
        let j = r#"{"jobs":[{"error":0,"read":{"bw_bytes":100,"total_ios":7},"write":{"bw_bytes":50,"total_ios":3}}]}"#;
        assert_eq!(parse_fio(j).unwrap(), (150.0, 10));
        let none = r#"{"jobs":[{"error":0,"read":{"bw_bytes":0,"total_ios":0},"write":{"bw_bytes":0,"total_ios":0}}]}"#;
        assert!(parse_fio(none).is_err());
        let a = jobs()[0].args("nbd+unix:///x?socket=/s", 1 << 20, 1500);
        assert!(a.contains(&"--ioengine=nbd".to_string()));
        assert!(a.contains(&"--uri=nbd+unix:///x?socket=/s".to_string()));
        assert!(a.contains(&"--iodepth=32".to_string()));
        assert!(a.contains(&"--runtime=1500ms".to_string()));
        assert!(jobs()
            .iter()
            .filter(|j| j.targeted)
            .all(|j| !j.rw.contains("write")));
    }

    #[test]
    fn renders_ratios_targets_and_cpu() {
        let run = |bw: f64, cpu: f64| NbdRun {
            bw,
            requests: 10,
            cpu_us_per_request: cpu,
        };
        let jobs = jobs();
        let r = NbdReport {
            size: 1 << 30,
            runs: 1,
            runtime_ms: 2000,
            fio_version: "fio-3.33".into(),
            qsd_version: "qemu-storage-daemon 7.2".into(),
            qsd_command: "qemu-storage-daemon ...".into(),
            dmkit_command: "dmkit linear open ...".into(),
            same_data: true,
            qsd: jobs.iter().map(|_| vec![run(100e6, 20.0)]).collect(),
            dmkit: jobs.iter().map(|_| vec![run(200e6, 5.0)]).collect(),
            jobs,
        };
        let t = render(&r);
        assert!(t.contains("2.00x"), "{t}");
        assert!(t.contains(">= 1.5x met"), "{t}");
        assert!(t.contains("20.0 µs") && t.contains("5.0 µs"), "{t}");
    }
}
