//! `dmkit bench export`: the export as a dimension (issue 12). One file in RAM served every
//! way at once, measured in the same run with runs rotated between the sides:
//!
//! - the kernel's loop device on the raw file (the ceiling);
//! - qemu-storage-daemon's FUSE export (a loop device on top) and its NBD export;
//! - dmkit linear through FUSE on the `/dev/fuse` threads, through FUSE over io_uring (each
//!   with a loop device on top), and over NBD.
//!
//! Loop devices run with direct I/O; fio runs libaio with `--direct=1` on them, and its `nbd`
//! engine (libnbd) on the NBD exports, one connection per job. Reported per job: each side's
//! throughput (median), its ratio to the kernel loop, and each server's CPU time per request
//! (user + system of the serving process over the run / requests fio completed). Targets (the
//! issue's): FUSE over io_uring at least 80% of the kernel loop at 4 KiB (random read qd1 and
//! qd32, random write qd32) and 90% at 1 MiB; dmkit's NBD at least 1.5x qemu-storage-daemon's
//! at 4 KiB random read qd32 and 1 MiB read.
//!
//! dmkit's `/dev/fuse` side serves a copy of the file: a second read-write server of the same
//! file would be refused (its claim); qemu-storage-daemon runs with `locking=off` beside dmkit.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::nbd::NbdJob;
use crate::bench::harness::fio::{fio_parsed, parse_totals, Job};
use crate::bench::harness::model::median;

use crate::bench::harness::process::say;
use crate::bench::harness::process::{
    self as harness, command_line, Dmkit, Export, Interrupt, Workspace,
};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::{format_size, Align, TextTable};
use crate::bench::harness::tools::{
    fio_has_nbd, first_mib, need, tool_version, wait_for_size, wait_for_socket, Daemon, Loop,
};
use crate::bench::BenchError;
use crate::export::fuse::{uring_switch, ENABLE_URING, TRANSPORT_ENV};

/// FUSE over io_uring / kernel loop at 4 KiB.
pub const TARGET_4K: f64 = 0.80;
/// FUSE over io_uring / kernel loop at 1 MiB.
pub const TARGET_1M: f64 = 0.90;

/// The export name both NBD servers use.
const NBD_EXPORT: &str = "bench";

/// One way of serving the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// The kernel's loop device on the raw file.
    KernelLoop,
    /// qemu-storage-daemon's FUSE export, a loop device on top.
    QsdFuse,
    /// qemu-storage-daemon's NBD export.
    QsdNbd,
    /// dmkit linear, FUSE on the `/dev/fuse` threads, a loop device on top.
    Fuse,
    /// dmkit linear, FUSE over io_uring, a loop device on top.
    FuseUring,
    /// dmkit linear over NBD.
    Nbd,
}

impl Side {
    /// Every side, in table order.
    pub const ALL: [Side; 6] = [
        Side::KernelLoop,
        Side::QsdFuse,
        Side::QsdNbd,
        Side::Fuse,
        Side::FuseUring,
        Side::Nbd,
    ];

    /// The column heading.
    pub fn label(self) -> &'static str {
        match self {
            Side::KernelLoop => "kernel loop",
            Side::QsdFuse => "qsd FUSE",
            Side::QsdNbd => "qsd NBD",
            Side::Fuse => "dmkit fuse",
            Side::FuseUring => "dmkit fuse-uring",
            Side::Nbd => "dmkit nbd",
        }
    }

    fn is_nbd(self) -> bool {
        matches!(self, Side::QsdNbd | Side::Nbd)
    }
}

/// One fio job of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportJob {
    /// Row name.
    pub name: String,
    /// fio `--rw`.
    pub rw: String,
    /// Block size, bytes.
    pub bs: u64,
    /// libaio queue depth (requests in flight on the NBD connection).
    pub iodepth: u32,
    /// Whether dmkit NBD / qsd NBD has the 1.5x target on this row.
    pub nbd_target: bool,
}

impl ExportJob {
    fn new(name: &str, rw: &str, bs: u64, iodepth: u32, nbd_target: bool) -> ExportJob {
        ExportJob {
            name: name.into(),
            rw: rw.into(),
            bs,
            iodepth,
            nbd_target,
        }
    }

    /// FUSE over io_uring's target against the kernel loop: 90% at 1 MiB, 80% at 4 KiB.
    pub fn uring_target(&self) -> f64 {
        if self.bs >= 1 << 20 {
            TARGET_1M
        } else {
            TARGET_4K
        }
    }

    /// fio's arguments against `side` at `target` (a block device, or an NBD URI).
    fn args(&self, side: Side, target: &str, size: u64, runtime_ms: u64) -> Vec<String> {
        if side.is_nbd() {
            let j = NbdJob {
                name: self.name.clone(),
                rw: self.rw.clone(),
                bs: self.bs,
                iodepth: self.iodepth,
                targeted: self.nbd_target,
            };
            j.args(target, size, runtime_ms)
        } else {
            let j = Job {
                name: self.name.clone(),
                rw: self.rw.clone(),
                bs: self.bs,
                iodepth: self.iodepth,
            };
            j.args(Path::new(target), size, runtime_ms)
        }
    }
}

/// The issue's table: 1 MiB read qd4, 4 KiB random read qd32 and qd1, 1 MiB write qd4, 4 KiB
/// random write qd32.
pub fn jobs() -> Vec<ExportJob> {
    vec![
        ExportJob::new("read-1m-qd4", "read", 1 << 20, 4, true),
        ExportJob::new("randread-4k-qd32", "randread", 4096, 32, true),
        ExportJob::new("randread-4k-qd1", "randread", 4096, 1, false),
        ExportJob::new("write-1m-qd4", "write", 1 << 20, 4, false),
        ExportJob::new("randwrite-4k-qd32", "randwrite", 4096, 32, false),
    ]
}

/// One fio run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExportRun {
    /// Bytes per second, both directions.
    pub bw: f64,
    /// Requests fio completed.
    pub requests: u64,
    /// CPU time of the serving process per request, µs (none for the kernel loop).
    pub cpu_us_per_request: Option<f64>,
}

/// A side that could not be measured, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// The side.
    pub side: Side,
    /// Why.
    pub why: String,
}

/// The comparison's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportReport {
    /// File size, bytes.
    pub size: u64,
    /// Runs per job and side.
    pub runs: u32,
    /// fio run length, ms.
    pub runtime_ms: u64,
    /// fio's version.
    pub fio_version: String,
    /// qemu-storage-daemon's version line (empty when it is not installed).
    pub qsd_version: String,
    /// How each server was started.
    pub commands: Vec<String>,
    /// The kernel's FUSE over io_uring switch (`None`: no such switch).
    pub uring_switch: Option<bool>,
    /// `/proc/loadavg` before and after the runs (the machine may be shared).
    pub load: (String, String),
    /// The sides measured, in table order.
    pub sides: Vec<Side>,
    /// The sides that were not, and why.
    pub unavailable: Vec<Unavailable>,
    /// Jobs, in table order.
    pub jobs: Vec<ExportJob>,
    /// `results[s][j]`: the runs of `sides[s]` on `jobs[j]`.
    pub results: Vec<Vec<Vec<ExportRun>>>,
}

impl ExportReport {
    fn index(&self, side: Side) -> Option<usize> {
        self.sides.iter().position(|&s| s == side)
    }

    /// Median bandwidth of `side` on job `j`.
    pub fn bw(&self, side: Side, j: usize) -> Option<f64> {
        let runs = &self.results[self.index(side)?][j];
        median(&runs.iter().map(|r| r.bw).collect::<Vec<_>>())
    }

    /// Median CPU per request of `side` on job `j`, µs.
    pub fn cpu(&self, side: Side, j: usize) -> Option<f64> {
        let runs = &self.results[self.index(side)?][j];
        median(
            &runs
                .iter()
                .filter_map(|r| r.cpu_us_per_request)
                .collect::<Vec<_>>(),
        )
    }

    /// `side` / `base` on job `j`.
    pub fn ratio(&self, side: Side, base: Side, j: usize) -> Option<f64> {
        match (self.bw(side, j), self.bw(base, j)) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// What one side is measured on: fio's target and the serving process.
struct Target {
    side: Side,
    target: String,
    pid: Option<u32>,
}

/// Start qemu-storage-daemon serving `file` as a FUSE export at `mnt` and over NBD at `sock`.
fn start_qsd(
    file: &Path,
    mnt: &Path,
    sock: &Path,
    log: &Path,
    size: u64,
) -> Result<(Daemon, String), BenchError> {
    let io = |what: String| move |source| BenchError::Io { what, source };
    fs::write(mnt, b"").map_err(io(format!("create {}", mnt.display())))?;
    // locking=off: dmkit serves the same file beside it.
    let args = [
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=file0,filename={},cache.direct=off,locking=off",
            file.display()
        ),
        // A node per export: a writable FUSE export and an NBD export of one node conflict
        // on the permission to resize.
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=file1,filename={},cache.direct=off,locking=off",
            file.display()
        ),
        "--export".into(),
        format!(
            "type=fuse,id=fuse0,node-name=file0,mountpoint={},writable=on",
            mnt.display()
        ),
        "--nbd-server".into(),
        format!("addr.type=unix,addr.path={}", sock.display()),
        "--export".into(),
        format!("type=nbd,id=nbd0,node-name=file1,name={NBD_EXPORT},writable=on"),
    ];
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.args(&args);
    let line = command_line(&cmd);
    let out = fs::File::create(log).map_err(io(format!("create {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io(format!("create {}", log.display())))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let child = cmd.spawn().map_err(io("run qemu-storage-daemon".into()))?;
    let mut d = Daemon {
        child,
        what: "qemu-storage-daemon".into(),
    };
    let ready = wait_for_size(mnt, size, &mut d.child, "qemu-storage-daemon")
        .and_then(|()| wait_for_socket(sock, &mut d));
    if let Err(e) = ready {
        drop(d);
        // A daemon that died after mounting leaves its mount behind.
        let _ = crate::export::fuse::unmount_path(mnt, 0);
        let text = fs::read_to_string(log).unwrap_or_default();
        return Err(BenchError::Tool(format!("{e}: {}", text.trim())));
    }
    Ok((d, line))
}

/// A loop device with direct I/O on `file`.
fn direct_loop(file: &Path) -> Result<Loop, BenchError> {
    let l = crate::export::loopdev::attach(file, false, true, 512).map_err(|source| {
        BenchError::Io {
            what: format!("loop device on {}", file.display()),
            source,
        }
    })?;
    if !l.direct_io {
        eprintln!(
            "dmkit: warning: {} on {} runs without direct I/O",
            l.path.display(),
            file.display()
        );
    }
    Ok(Loop(l.path))
}

/// Open dmkit linear on `file` as `name` with `DMKIT_FUSE_TRANSPORT=transport` (and `extra`
/// arguments); returns the export, its NBD URI when it serves one, and the command line.
fn open_dmkit(
    dmkit: &Dmkit,
    file: &Path,
    name: &str,
    transport: &str,
    extra: &[String],
    ws: &Workspace,
    interrupt: &Interrupt,
) -> Result<(Export, Option<String>, String), BenchError> {
    let d = dmkit.with_env(TRANSPORT_ENV, transport);
    let mut args: Vec<String> = vec![
        "linear".into(),
        "open".into(),
        file.to_string_lossy().into_owned(),
        name.into(),
    ];
    args.extend_from_slice(extra);
    let line = format!("{TRANSPORT_ENV}={transport} dmkit {}", args.join(" "));
    if extra.iter().any(|a| a == "--nbd") {
        let (e, uri) = d.open_nbd(name, &args, ws.dir(), interrupt)?;
        Ok((e, Some(uri), line))
    } else {
        Ok((d.open(name, &args, ws.dir(), interrupt)?, None, line))
    }
}

/// Run the comparison.
pub fn run(o: &RwBenchOptions, interrupt: &Interrupt) -> Result<ExportReport, BenchError> {
    o.check()?;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(BenchError::Invalid(
            "bench export needs root: it attaches loop devices".into(),
        ));
    }
    let fio_version = crate::bench::harness::fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    let mut unavailable = Vec::new();
    let mut skip = |side: Side, why: String| unavailable.push(Unavailable { side, why });
    let qsd_ok = need("qemu-storage-daemon", "qemu-system-x86").map_err(|e| e.to_string());
    let nbd_ok = if fio_has_nbd() {
        Ok(())
    } else {
        Err("this fio has no nbd engine (fio --enghelp)".to_string())
    };
    let switch = uring_switch();
    let uring_ok = match switch {
        Some(true) => Ok(()),
        Some(false) => Err(format!("{ENABLE_URING} is off (echo Y > {ENABLE_URING})")),
        None => Err(format!(
            "this kernel has no FUSE over io_uring ({ENABLE_URING})"
        )),
    };

    let ws = Workspace::create(&o.dir)?;
    let file = ws.path("export.img");
    let copy = ws.path("export-copy.img");
    say(
        o.progress,
        format!(
            "writing {} of random data (and a copy)",
            format_size(o.size)
        ),
    );
    harness::write_random_file(&file, o.size, interrupt)?;
    fs::copy(&file, &copy).map_err(|source| BenchError::Io {
        what: format!("copy {} to {}", file.display(), copy.display()),
        source,
    })?;

    let mut commands = Vec::new();
    let mut targets = Vec::new();
    let pid = std::process::id();
    // dmkit: the /dev/fuse side on the copy; FUSE over io_uring and NBD from one server.
    let (d_fuse, _, line) = open_dmkit(
        &dmkit,
        &copy,
        &format!("bench{pid}-fuse"),
        "dev-fuse",
        &[],
        &ws,
        interrupt,
    )?;
    commands.push(line);
    let mut extra = Vec::new();
    if nbd_ok.is_ok() {
        extra = vec![
            "--nbd".into(),
            format!("unix:{}", ws.path("dmkit.sock").display()),
        ];
    }
    let uring_transport = if uring_ok.is_ok() {
        "io-uring"
    } else {
        "dev-fuse"
    };
    let (d_ring, d_uri, line) = open_dmkit(
        &dmkit,
        &file,
        &format!("bench{pid}-uring"),
        uring_transport,
        &extra,
        &ws,
        interrupt,
    )?;
    commands.push(line);
    let fuse_pid = dmkit.server_pid(d_fuse.name(), ws.dir(), interrupt)?;
    let ring_pid = dmkit.server_pid(d_ring.name(), ws.dir(), interrupt)?;

    // qemu-storage-daemon: FUSE and NBD exports of the same node.
    let mut qsd = None;
    let qmnt = ws.path("qsd-export");
    let qsock = ws.path("qsd.sock");
    match &qsd_ok {
        Ok(()) => {
            let (d, line) = start_qsd(&file, &qmnt, &qsock, &ws.path("qsd.log"), o.size)?;
            say(o.progress, format!("started {line}"));
            commands.push(line);
            qsd = Some(d);
        }
        Err(e) => {
            skip(Side::QsdFuse, e.clone());
            skip(Side::QsdNbd, e.clone());
        }
    }
    let qsd_pid = qsd.as_ref().map(|d| d.child.id());

    // Loop devices last, so they are detached before their exports go (drop order).
    let mut loops = Vec::new();
    let mut loop_of = |side: Side, path: &Path, pid: Option<u32>| -> Result<(), BenchError> {
        let l = direct_loop(path)?;
        targets.push(Target {
            side,
            target: l.0.to_string_lossy().into_owned(),
            pid,
        });
        loops.push(l);
        Ok(())
    };
    loop_of(Side::KernelLoop, &file, None)?;
    if qsd.is_some() {
        loop_of(Side::QsdFuse, &qmnt, qsd_pid)?;
    }
    loop_of(Side::Fuse, d_fuse.path(), Some(fuse_pid))?;
    match &uring_ok {
        Ok(()) => loop_of(Side::FuseUring, d_ring.path(), Some(ring_pid))?,
        Err(e) => skip(Side::FuseUring, e.clone()),
    }
    match (&nbd_ok, &qsd_ok) {
        (Ok(()), Ok(())) => targets.push(Target {
            side: Side::QsdNbd,
            target: format!("nbd+unix:///{NBD_EXPORT}?socket={}", qsock.display()),
            pid: qsd_pid,
        }),
        (Err(e), Ok(())) => skip(Side::QsdNbd, e.clone()),
        _ => {}
    }
    match (&nbd_ok, d_uri) {
        (Ok(()), Some(uri)) => targets.push(Target {
            side: Side::Nbd,
            target: uri,
            pid: Some(ring_pid),
        }),
        (Err(e), _) => skip(Side::Nbd, e.clone()),
        (Ok(()), None) => skip(Side::Nbd, "dmkit printed no NBD URI".into()),
    }
    targets.sort_by_key(|t| Side::ALL.iter().position(|&s| s == t.side));

    // Every block device must show the file's data (the dmkit copy is the same bytes).
    let want = first_mib(&file)?;
    for t in targets.iter().filter(|t| !t.side.is_nbd()) {
        if first_mib(Path::new(&t.target))? != want {
            return Err(BenchError::Mismatch(format!(
                "{} ({}) does not read the file's data",
                t.target,
                t.side.label()
            )));
        }
    }

    let jobs = jobs();
    let load_before = loadavg();
    let n = targets.len();
    let mut results: Vec<Vec<Vec<ExportRun>>> = vec![vec![Vec::new(); jobs.len()]; n];
    for run in 0..o.runs as usize {
        for (ji, job) in jobs.iter().enumerate() {
            for k in 0..n {
                let si = (k + run) % n;
                let t = &targets[si];
                interrupt.check()?;
                let before = t.pid.map(harness::cpu_seconds).transpose()?;
                let args = job.args(t.side, &t.target, o.size, o.runtime_ms);
                let (bw, requests) = fio_parsed(
                    &job.name,
                    &args,
                    &t.target,
                    o.runtime_ms,
                    ws.dir(),
                    interrupt,
                    parse_totals,
                )?;
                let cpu = match (t.pid, before) {
                    (Some(p), Some(b)) => {
                        Some((harness::cpu_seconds(p)? - b) * 1e6 / requests as f64)
                    }
                    _ => None,
                };
                say(
                    o.progress,
                    format!(
                        "run {}/{} {:<18} {:<17} {:>6.0} MB/s{}",
                        run + 1,
                        o.runs,
                        job.name,
                        t.side.label(),
                        bw / 1e6,
                        cpu.map(|c| format!(", {c:.1} µs CPU/request"))
                            .unwrap_or_default()
                    ),
                );
                results[si][ji].push(ExportRun {
                    bw,
                    requests,
                    cpu_us_per_request: cpu,
                });
            }
        }
    }
    let load_after = loadavg();
    if dmkit.replaced() {
        eprintln!("dmkit: warning: the dmkit executable was rebuilt during the benchmark");
    }
    drop(loops);
    drop(qsd);
    d_ring.close()?;
    d_fuse.close()?;
    Ok(ExportReport {
        size: o.size,
        runs: o.runs,
        runtime_ms: o.runtime_ms,
        fio_version,
        qsd_version: if qsd_ok.is_ok() {
            tool_version("qemu-storage-daemon")
        } else {
            String::new()
        },
        commands,
        uring_switch: switch,
        load: (load_before, load_after),
        sides: targets.iter().map(|t| t.side).collect(),
        unavailable,
        jobs,
        results,
    })
}

fn verdict(v: f64, target: f64) -> &'static str {
    if v >= target {
        "met"
    } else {
        "MISSED"
    }
}

/// The tables.
pub fn render(r: &ExportReport) -> String {
    let mut header = vec![("job".to_string(), Align::Left)];
    header.extend(
        r.sides
            .iter()
            .map(|s| (s.label().to_string(), Align::Right)),
    );
    let mut bw = TextTable::new(header.clone());
    let mut cpu = TextTable::new(header);
    for (j, job) in r.jobs.iter().enumerate() {
        let mut row = vec![job.name.clone()];
        let mut crow = vec![job.name.clone()];
        for &s in &r.sides {
            let cell = match (r.bw(s, j), r.ratio(s, Side::KernelLoop, j)) {
                (Some(b), Some(x)) if s != Side::KernelLoop => {
                    format!("{:.0} ({:.0}%)", b / 1e6, x * 100.0)
                }
                (Some(b), _) => format!("{:.0}", b / 1e6),
                _ => "-".into(),
            };
            row.push(cell);
            crow.push(
                r.cpu(s, j)
                    .map(|c| format!("{c:.1} µs"))
                    .unwrap_or_else(|| "-".into()),
            );
        }
        bw.push(row);
        cpu.push(crow);
    }
    let mut out = format!(
        "Exports of one {} file in RAM, side by side in one run (fio {}; MB/s, MB = 10^6 bytes; \
median of {} run(s) of {:.1} s, sides rotated)\n\
loop devices with direct I/O on the raw file and on each FUSE file, fio libaio --direct=1 on \
them; NBD sides: fio's nbd engine, one connection\n\
(N%) = of the kernel loop; load average before {}, after {} (the machine may be shared)\n\
FUSE over io_uring switch ({ENABLE_URING}): {}\n\n",
        format_size(r.size),
        r.fio_version,
        r.runs,
        r.runtime_ms as f64 / 1000.0,
        r.load.0,
        r.load.1,
        match r.uring_switch {
            Some(true) => "on",
            Some(false) => "off",
            None => "absent",
        },
    );
    out.push_str(&bw.render());
    out.push_str("\nServer CPU time per request (user + system of the serving process / requests fio completed):\n\n");
    out.push_str(&cpu.render());
    out.push('\n');
    for (j, job) in r.jobs.iter().enumerate() {
        if let Some(x) = r.ratio(Side::FuseUring, Side::KernelLoop, j) {
            let t = job.uring_target();
            out.push_str(&format!(
                "fuse-uring / kernel loop, {:<18} {:.1}% (target >= {:.0}%: {})\n",
                job.name,
                x * 100.0,
                t * 100.0,
                verdict(x, t)
            ));
        }
    }
    for (j, job) in r.jobs.iter().enumerate().filter(|(_, j)| j.nbd_target) {
        if let Some(x) = r.ratio(Side::Nbd, Side::QsdNbd, j) {
            out.push_str(&format!(
                "dmkit nbd / qsd NBD,      {:<18} {:.2}x (target >= {:.1}x: {})\n",
                job.name,
                x,
                super::nbd::TARGET,
                verdict(x, super::nbd::TARGET)
            ));
        }
    }
    for u in &r.unavailable {
        out.push_str(&format!("not measured: {}: {}\n", u.side.label(), u.why));
    }
    if !r.qsd_version.is_empty() {
        out.push_str(&format!("\n{}\n", r.qsd_version));
    }
    for c in &r.commands {
        out.push_str(&format!("  {c}\n"));
    }
    out
}

crate::bench::harness::report::impl_report!(ExportReport => render);

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ExportReport {
        let run = |bw: f64, cpu: Option<f64>| ExportRun {
            bw,
            requests: 100,
            cpu_us_per_request: cpu,
        };
        let jobs = jobs();
        let sides = vec![Side::KernelLoop, Side::QsdNbd, Side::FuseUring, Side::Nbd];
        let results = sides
            .iter()
            .map(|&s| {
                jobs.iter()
                    .map(|_| match s {
                        Side::KernelLoop => vec![run(1000e6, None)],
                        Side::QsdNbd => vec![run(100e6, Some(20.0))],
                        Side::FuseUring => vec![run(850e6, Some(8.0)), run(870e6, Some(9.0))],
                        _ => vec![run(200e6, Some(5.0))],
                    })
                    .collect()
            })
            .collect();
        ExportReport {
            size: 1 << 30,
            runs: 1,
            runtime_ms: 2000,
            fio_version: "fio-3.33".into(),
            qsd_version: "qemu-storage-daemon 7.2".into(),
            commands: vec!["dmkit linear open ...".into()],
            uring_switch: Some(true),
            load: ("1.00 1.00 1.00".into(), "2.00 2.00 2.00".into()),
            sides,
            unavailable: vec![Unavailable {
                side: Side::QsdFuse,
                why: "not installed".into(),
            }],
            jobs,
            results,
        }
    }

    #[test]
    fn targets_follow_the_issue() {
        let j = jobs();
        assert_eq!(j.len(), 5);
        assert_eq!(j[0].uring_target(), TARGET_1M);
        assert_eq!(j[1].uring_target(), TARGET_4K);
        assert_eq!(j[3].uring_target(), TARGET_1M);
        // NBD's targets: 4k qd32 random read and 1M read only.
        let nbd: Vec<&str> = j
            .iter()
            .filter(|j| j.nbd_target)
            .map(|j| j.name.as_str())
            .collect();
        assert_eq!(nbd, ["read-1m-qd4", "randread-4k-qd32"]);
        let a = j[2].args(Side::Nbd, "nbd+unix:///x?socket=/s", 1 << 20, 1000);
        assert!(a.contains(&"--ioengine=nbd".to_string()), "{a:?}");
        let a = j[2].args(Side::Fuse, "/dev/loop9", 1 << 20, 1000);
        assert!(a.contains(&"--ioengine=libaio".to_string()), "{a:?}");
        assert!(a.contains(&"--iodepth=1".to_string()), "{a:?}");
        assert!(a.contains(&"--direct=1".to_string()), "{a:?}");
    }

    #[test]
    fn renders_ratios_targets_cpu_and_load() {
        let r = report();
        assert_eq!(r.bw(Side::FuseUring, 0), Some(860e6));
        let t = render(&r);
        assert!(t.contains("860 (86%)"), "{t}");
        assert!(t.contains("86.0% (target >= 90%: MISSED)"), "{t}");
        assert!(t.contains("86.0% (target >= 80%: met)"), "{t}");
        assert!(t.contains("2.00x (target >= 1.5x: met)"), "{t}");
        assert!(t.contains("8.5 µs") && t.contains("20.0 µs"), "{t}");
        assert!(t.contains("load average before 1.00 1.00 1.00, after 2.00 2.00 2.00"));
        assert!(t.contains("not measured: qsd FUSE: not installed"), "{t}");
    }
}
