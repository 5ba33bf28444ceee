//! `dmkit bench crypt`: Cloudflare's dm-crypt study ("Speeding up Linux disk encryption", 2020)
//! reproduced on our layers, and `--peer qemu-storage-daemon`: our crypt export against
//! QEMU's LUKS driver served through its own FUSE export, both under a loop device.
//!
//! The study's method: the backing store in RAM (a file in /dev/shm here, a `brd` RAM disk
//! there), no filesystem, `fio --readwrite=readwrite --bs=4k --direct=1`, plain against
//! crypt (aes-xts-plain64, 512-bit key), and the bound `(plain x cipher) / (plain + cipher)`
//! for doing the I/O and then the crypto in series, from the plain speed and the cipher speed
//! measured in the same run (our in-process aes-xts throughput, as `cryptsetup benchmark`
//! was there). Target: crypt at least 0.80 of that bound.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cipher::{self as cipher_bench, CipherSpeed};
use super::config::Config;
use crate::bench::harness::fio::{fio_rw, Job, RwResult};
use crate::bench::harness::model::median;
use crate::bench::harness::process::say;
use crate::bench::harness::process::{
    self as harness, command_line, Dmkit, Export, Interrupt, Workspace,
};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::{format_size, Align, TextTable};
use crate::bench::harness::tools::{first_mib, need, tool_version, wait_for_size, Daemon, Loop};
use crate::bench::BenchError;

/// The study's acceptance: crypt bandwidth / bound.
pub const BOUND_TARGET: f64 = 0.80;
/// Peer targets: ours / qemu-storage-daemon, 1 MiB sequential read and write.
pub const PEER_SEQ_TARGET: f64 = 2.5;
/// Peer target: ours / qemu-storage-daemon, 4 KiB random read qd32.
pub const PEER_RAND_TARGET: f64 = 1.3;

/// Options of both scenarios.
pub type CryptBenchOptions = RwBenchOptions;

/// Seconds of the cipher measurement (per direction).
fn cipher_seconds(o: &CryptBenchOptions) -> f64 {
    if o.quick {
        0.5
    } else {
        2.0
    }
}

fn run_fio(
    job: &Job,
    file: &Path,
    size: u64,
    runtime_ms: u64,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<RwResult, BenchError> {
    fio_rw(
        &job.name,
        &job.args(file, size, runtime_ms),
        file,
        runtime_ms,
        scratch,
        interrupt,
    )
}

/// The bound of doing I/O at `io` and crypto at `cipher` in series (bytes/s).
pub fn serial_bound(io: f64, cipher: f64) -> f64 {
    if io <= 0.0 || cipher <= 0.0 {
        return 0.0;
    }
    io * cipher / (io + cipher)
}

/// Result of the seed-003 scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedReport {
    /// Data size, bytes.
    pub size: u64,
    /// Runs per side.
    pub runs: u32,
    /// fio run length, ms.
    pub runtime_ms: u64,
    /// Where the backing file was.
    pub dir: PathBuf,
    /// The fio command (on the plain export).
    pub fio_command: String,
    /// plain (linear export, read-write) per run.
    pub plain: Vec<RwResult>,
    /// crypt (plain-mode aes-xts-plain64 512-bit, 4096-byte sectors) per run.
    pub crypt: Vec<RwResult>,
    /// Our in-process cipher speed, measured in this run.
    pub cipher: CipherSpeed,
}

impl SeedReport {
    /// Medians: (plain read, plain write, crypt read, crypt write).
    pub fn medians(&self) -> (f64, f64, f64, f64) {
        let col = |v: &[RwResult], f: fn(&RwResult) -> f64| {
            median(&v.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
        };
        (
            col(&self.plain, |r| r.read),
            col(&self.plain, |r| r.write),
            col(&self.crypt, |r| r.read),
            col(&self.crypt, |r| r.write),
        )
    }

    /// (read bound, write bound): decryption bounds reads, encryption writes.
    pub fn bounds(&self) -> (f64, f64) {
        let (pr, pw, _, _) = self.medians();
        (
            serial_bound(pr, self.cipher.decrypt_bytes_per_s),
            serial_bound(pw, self.cipher.encrypt_bytes_per_s),
        )
    }
}

fn workspace(dir: &Path) -> Result<Workspace, BenchError> {
    Workspace::create(dir)
}

/// Run the study's scenario.
pub fn run_seed(o: &CryptBenchOptions, interrupt: &Interrupt) -> Result<SeedReport, BenchError> {
    o.check()?;
    crate::bench::harness::fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    let ws = workspace(&o.dir)?;
    let mut exports: Vec<Export> = Vec::new();
    for c in [Config::Plain, Config::Crypt] {
        // One file each: both are open read-write at once, and a file has one writer.
        let data = ws.path(&format!("{}.img", c.name()));
        harness::write_random_data(o.progress, &data, o.size, interrupt)?;
        let name = format!("bench{}-seed-{}", std::process::id(), c.name());
        let args = c.prepare_with(&dmkit, &data, &name, ws.dir(), interrupt, true)?;
        say(o.progress, format!("opening {} as {name}", c.name()));
        exports.push(dmkit.open(&name, &args, ws.dir(), interrupt)?);
    }
    // The study's job as `data/seeds.json` gives its method (fio's direct I/O, as it ran).
    let m = crate::bench::seeds::data::setup("003");
    let rw = m
        .jobs
        .first()
        .expect("data/seeds.json gives seed 003's job (checked by its unit test)");
    let job = Job::new(rw, rw, m.bs.unwrap_or_default(), 0);
    let fio_command = format!(
        "fio {}",
        job.args(exports[0].path(), o.size, o.runtime_ms).join(" ")
    );
    let (mut plain, mut crypt) = (Vec::new(), Vec::new());
    for run in 0..o.runs as usize {
        for k in 0..2 {
            let side = (k + run) % 2;
            let r = run_fio(
                &job,
                exports[side].path(),
                o.size,
                o.runtime_ms,
                ws.dir(),
                interrupt,
            )?;
            say(
                o.progress,
                format!(
                    "run {}/{} {:<6} read {:.0} MB/s write {:.0} MB/s",
                    run + 1,
                    o.runs,
                    if side == 0 { "plain" } else { "crypt" },
                    r.read / 1e6,
                    r.write / 1e6
                ),
            );
            if side == 0 {
                plain.push(r);
            } else {
                crypt.push(r);
            }
        }
    }
    for e in exports.drain(..).rev() {
        e.close()?;
    }
    say(
        o.progress,
        "measuring the cipher (aes-xts-plain64, 512-bit, 4 KiB sectors)".into(),
    );
    let cipher = cipher_bench::xts_speed(64, Duration::from_secs_f64(cipher_seconds(o)))?;
    Ok(SeedReport {
        size: o.size,
        runs: o.runs,
        runtime_ms: o.runtime_ms,
        dir: o.dir.clone(),
        fio_command,
        plain,
        crypt,
        cipher,
    })
}

// ---------------------------------------------------------------------------------------------
// --peer qemu-storage-daemon

/// Result of the peer comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// Payload size, bytes.
    pub size: u64,
    /// Runs per job and side.
    pub runs: u32,
    /// fio run length, ms.
    pub runtime_ms: u64,
    /// qemu-storage-daemon's version line.
    pub qsd_version: String,
    /// The qemu-storage-daemon command line (secret passed by file).
    pub qsd_command: String,
    /// Our open command line.
    pub dmkit_command: String,
    /// Whether each loop device runs with direct I/O: (qsd, ours).
    pub loop_direct_io: (bool, bool),
    /// Jobs, in table order.
    pub jobs: Vec<Job>,
    /// Per job: qsd runs (bandwidth of the job's direction, bytes/s).
    pub qsd: Vec<Vec<f64>>,
    /// Per job: our runs.
    pub ours: Vec<Vec<f64>>,
    /// The first MiB read through both loop devices was identical.
    pub same_plaintext: bool,
}

/// The peer jobs: 1 MiB sequential read and write (libaio qd4) and 4 KiB random read qd32.
pub fn peer_jobs() -> Vec<Job> {
    vec![
        Job::new("seq-1m-read", "read", 1 << 20, 4),
        Job::new("seq-1m-write", "write", 1 << 20, 4),
        Job::new("rand-4k-qd32", "randread", 4096, 32),
    ]
}

fn peer_target(job: &Job) -> f64 {
    if job.bs >= 1 << 20 {
        PEER_SEQ_TARGET
    } else {
        PEER_RAND_TARGET
    }
}

/// Run the peer comparison.
pub fn run_peer(o: &CryptBenchOptions, interrupt: &Interrupt) -> Result<PeerReport, BenchError> {
    o.check()?;
    crate::bench::harness::fio::check_installed()?;
    need("qemu-img", "qemu-utils")?;
    need("qemu-storage-daemon", "qemu-system-x86")?;
    need("cryptsetup", "cryptsetup-bin")?;
    let dmkit = Dmkit::from_env()?;
    let ws = workspace(&o.dir)?;
    let img = ws.path("luks.img");
    let secret = ws.path("secret");
    {
        let mut pass = [0u8; 24];
        getrandom::getrandom(&mut pass).map_err(|e| BenchError::Io {
            what: "getrandom".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let hexpass = zeroize::Zeroizing::new(hex::encode(pass));
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&secret)
            .and_then(|mut f| f.write_all(hexpass.as_bytes()))
            .map_err(|source| BenchError::Io {
                what: format!("write {}", secret.display()),
                source,
            })?;
    }
    let secret_obj = format!("secret,id=sec0,file={},format=raw", secret.display());
    say(
        o.progress,
        format!("qemu-img create -f luks ({})", format_size(o.size)),
    );
    // qemu-img calibrates PBKDF2 by timing it; on a busy machine that sometimes fails
    // ("Unable to get accurate CPU usage"): try again.
    let mut attempt = 0;
    loop {
        let _ = fs::remove_file(&img);
        let mut create = Command::new("qemu-img");
        create.args([
            "create",
            "-f",
            "luks",
            "--object",
            &secret_obj,
            "-o",
            "key-secret=sec0,cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64,hash-alg=sha256,iter-time=100,preallocation=full",
        ]);
        create.arg(&img).arg(o.size.to_string());
        match harness::run_ok(
            &mut create,
            ws.dir(),
            interrupt,
            Some(Duration::from_secs(600)),
        ) {
            Ok(_) => break,
            Err(BenchError::Tool(m)) if attempt < 3 && m.contains("accurate CPU usage") => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }

    // qemu-storage-daemon: file -> luks -> FUSE export, writable.
    let mnt = ws.path("qsd-export");
    fs::write(&mnt, b"").map_err(|source| BenchError::Io {
        what: format!("create {}", mnt.display()),
        source,
    })?;
    let qsd_args = vec![
        "--object".to_string(),
        secret_obj.clone(),
        "--blockdev".into(),
        format!(
            "driver=file,node-name=file0,filename={},cache.direct=off",
            img.display()
        ),
        "--blockdev".into(),
        "driver=luks,node-name=luks0,file=file0,key-secret=sec0".into(),
        "--export".into(),
        format!(
            "type=fuse,id=exp0,node-name=luks0,mountpoint={},writable=on",
            mnt.display()
        ),
    ];
    let mut qsd_cmd = Command::new("qemu-storage-daemon");
    qsd_cmd.args(&qsd_args);
    let qsd_command = command_line(&qsd_cmd);
    let log = fs::File::create(ws.path("qsd.log")).map_err(|source| BenchError::Io {
        what: "create qsd.log".into(),
        source,
    })?;
    let log2 = log.try_clone().map_err(|source| BenchError::Io {
        what: "qsd.log".into(),
        source,
    })?;
    qsd_cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    say(o.progress, format!("starting {qsd_command}"));
    let child = qsd_cmd.spawn().map_err(|source| BenchError::Io {
        what: "run qemu-storage-daemon".into(),
        source,
    })?;
    let mut qsd = Daemon {
        child,
        what: "qemu-storage-daemon".into(),
    };
    if let Err(e) = wait_for_size(&mnt, o.size, &mut qsd.child, "qemu-storage-daemon") {
        let log = fs::read_to_string(ws.path("qsd.log")).unwrap_or_default();
        return Err(BenchError::Tool(format!("{e}: {}", log.trim())));
    }
    let qloop = crate::export::loopdev::attach(&mnt, false, true, 512).map_err(|source| {
        BenchError::Io {
            what: format!("loop device on {}", mnt.display()),
            source,
        }
    })?;
    let qsd_loop = Loop(qloop.path.clone());

    // Ours: `dmkit luks open` of the very same LUKS1 image, with the same passphrase.
    let name = format!("bench{}-peer", std::process::id());
    let args: Vec<String> = vec![
        "luks".into(),
        "open".into(),
        img.to_string_lossy().into_owned(),
        name.clone(),
        "--key-file".into(),
        secret.to_string_lossy().into_owned(),
        "--loop".into(),
    ];
    let dmkit_command = format!("dmkit {}", args.join(" "));
    say(o.progress, format!("opening {dmkit_command}"));
    let ours = dmkit.open(&name, &args, ws.dir(), interrupt)?;
    let status = harness::run_ok(
        &mut dmkit.command(["status", &name, "--json"]),
        ws.dir(),
        interrupt,
        Some(Duration::from_secs(60)),
    )?;
    let st: serde_json::Value = serde_json::from_str(&status.stdout)
        .map_err(|e| BenchError::Tool(format!("dmkit status --json: {e}")))?;
    let our_loop = st["loop_device"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| BenchError::Tool(format!("dmkit status {name}: no loop device")))?;
    let our_dio = st["loop_direct_io"].as_bool().unwrap_or(false);

    let same_plaintext = first_mib(&qloop.path)? == first_mib(&our_loop)?;
    if !same_plaintext {
        return Err(BenchError::Mismatch(format!(
            "{} (qemu-storage-daemon) and {} (dmkit) read different plaintext from the same LUKS1 image",
            qloop.path.display(),
            our_loop.display()
        )));
    }

    let jobs = peer_jobs();
    let mut q_res = vec![Vec::new(); jobs.len()];
    let mut o_res = vec![Vec::new(); jobs.len()];
    for run in 0..o.runs as usize {
        for (ji, job) in jobs.iter().enumerate() {
            for k in 0..2 {
                let side = (k + run) % 2;
                let dev = if side == 0 { &qloop.path } else { &our_loop };
                let r = run_fio(job, dev, o.size, o.runtime_ms, ws.dir(), interrupt)?;
                let bw = if job.rw.contains("write") {
                    r.write
                } else {
                    r.read
                };
                say(
                    o.progress,
                    format!(
                        "run {}/{} {:<13} {:<6} {:.0} MB/s",
                        run + 1,
                        o.runs,
                        job.name,
                        if side == 0 { "qsd" } else { "dmkit" },
                        bw / 1e6
                    ),
                );
                if side == 0 {
                    q_res[ji].push(bw);
                } else {
                    o_res[ji].push(bw);
                }
            }
        }
    }
    drop(qsd_loop);
    ours.close()?;
    drop(qsd);
    Ok(PeerReport {
        size: o.size,
        runs: o.runs,
        runtime_ms: o.runtime_ms,
        qsd_version: tool_version("qemu-storage-daemon"),
        qsd_command,
        dmkit_command,
        loop_direct_io: (qloop.direct_io, our_dio),
        jobs,
        qsd: q_res,
        ours: o_res,
        same_plaintext,
    })
}

fn mbs(v: f64) -> String {
    format!("{:.0} MB/s", v / 1e6)
}

fn verdict(x: f64, target: f64) -> &'static str {
    if x >= target {
        "met"
    } else {
        "NOT MET"
    }
}

/// The peer table (not a document's table: qemu-storage-daemon against dmkit).
pub fn render_peer(r: &PeerReport) -> String {
    let mut t = TextTable::new(vec![
        ("job (direct I/O, loop device)".into(), Align::Left),
        ("qemu-storage-daemon".into(), Align::Right),
        ("dmkit".into(), Align::Right),
        ("dmkit/qsd".into(), Align::Right),
        ("target".into(), Align::Right),
    ]);
    for (i, j) in r.jobs.iter().enumerate() {
        let q = median(&r.qsd[i]).unwrap_or(0.0);
        let d = median(&r.ours[i]).unwrap_or(0.0);
        let target = peer_target(j);
        let qd = if j.iodepth == 0 {
            "psync".to_string()
        } else {
            format!("qd{}", j.iodepth)
        };
        t.push(vec![
            format!(
                "{} ({} {}, {qd})",
                j.name,
                j.rw,
                if j.bs >= 1 << 20 {
                    "1m".to_string()
                } else {
                    "4k".to_string()
                }
            ),
            mbs(q),
            mbs(d),
            format!("{:.2}x", d / q),
            format!(">= {target:.1}x {}", verdict(d / q, target)),
        ]);
    }
    let mut out = format!(
        "LUKS1 aes-xts-plain64 {}: qemu-storage-daemon (luks driver, FUSE export) vs dmkit (crypt, FUSE export), both under a loop device\n\
median of {} run(s) of {:.1} s, alternated; MB = 10^6 bytes; loop direct I/O: qsd {}, dmkit {}\n\
same plaintext through both (first MiB): {}\n\n",
        format_size(r.size),
        r.runs,
        r.runtime_ms as f64 / 1000.0,
        if r.loop_direct_io.0 { "on" } else { "off (refused)" },
        if r.loop_direct_io.1 { "on" } else { "off (refused)" },
        if r.same_plaintext { "yes" } else { "NO" },
    );
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n{}\n  {}\n{}\n  {}\n",
        r.qsd_version, r.qsd_command, "dmkit:", r.dmkit_command
    ));
    out
}

// The text of `bench crypt` is seed 003's section of `bench seeds`.
crate::bench::harness::report::impl_report!(SeedReport => crate::bench::seeds::sections::s003::render_command);
crate::bench::harness::report::impl_report!(PeerReport => render_peer);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::fio::parse_rw;

    #[test]
    fn bound_is_seed_003s() {
        let b = serial_bound(1126.0, 1823.0);
        assert!((b - 696.0).abs() < 1.0, "{b}");
        assert_eq!(serial_bound(0.0, 5.0), 0.0);
    }

    #[test]
    fn parses_rw_and_builds_args() {
        let j = r#"{"jobs":[{"error":0,"read":{"bw_bytes":100},"write":{"bw_bytes":50}}]}"#;
        assert_eq!(
            parse_rw(j).unwrap(),
            RwResult {
                read: 100.0,
                write: 50.0
            }
        );
        let bad = r#"{"jobs":[{"error":5,"read":{"bw_bytes":0},"write":{"bw_bytes":0}}]}"#;
        assert!(parse_rw(bad).is_err());
        let a = Job::new("readwrite", "readwrite", 4096, 0).args(Path::new("/x:y"), 1 << 20, 1000);
        assert!(a.contains(&"--readwrite=readwrite".to_string()));
        assert!(a.contains(&"--direct=1".to_string()));
        assert!(a.contains(&"--filename=/x\\:y".to_string()));
        assert!(a.contains(&"--ioengine=psync".to_string()));
    }
}
