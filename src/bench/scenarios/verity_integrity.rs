//! `dmkit bench verity-integrity`: SEEDS.md seed 004, the Mitsubishi Electric comparison of
//! dm-verity and dm-integrity as read paths, on our layers: the same random data behind
//! dm-verity (SHA-256, 4 KiB blocks, every read verified), dm-integrity with an SHA-256 internal hash and
//! dm-integrity with HMAC-SHA-256 (both journal mode), read with fio. The paper does not give
//! its sector size: integrity runs with 512-byte sectors (integritysetup's default) and with
//! 4096-byte sectors, since the sector size decides how much integrity hashes (see
//! [`hash_blocks_per_4k`]).
//!
//! Reported per side and read job: throughput (median of the runs), and the CPU time the
//! serving process spent per GB read (its user + system time from `/proc/PID/stat`, which
//! includes the kernel's work on its threads, over the bytes fio read); then integrity over
//! verity for both, beside the paper's ratios (`data/seeds.json`). The paper's CPU figure is
//! the share of CPU during the run; ours is CPU per GB, which is that share divided by the
//! throughput: the paper's "normalised to equal throughput" ratio is the one ours compares
//! with directly. The text is seed 004's section of `bench seeds`
//! ([`s004::render_command`](crate::bench::seeds::sections::s004::render_command)).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::integrity::Job;
use super::verity::{self as vb, VerityParams};
use crate::bench::harness::fio::fio_rw;
use crate::bench::harness::process::say;
use crate::bench::harness::process::{
    self as harness, run_ok, Dmkit, Export, Interrupt, Workspace,
};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::format_size;
use crate::bench::BenchError;

/// The sides, in table order.
pub const SIDES: [&str; 5] = [
    "verity sha256",
    "integrity sha256",
    "integrity hmac-sha256",
    "integrity sha256, 4 KiB sectors",
    "integrity hmac-sha256, 4 KiB sectors",
];

/// An integrity side: its tag algorithm and sector size, in [`SIDES`] order after verity.
const INTEGRITY_SIDES: [(bool, u32); 4] = [(false, 512), (true, 512), (false, 4096), (true, 4096)];

/// The paper's configuration a side is compared with: the paper does not give its sector
/// size, so both sector sizes stand beside its figure for the same tag.
pub fn paper_config(side: &str) -> &str {
    side.split(',').next().unwrap_or(side)
}

/// SHA-256 compressions of a message of `len` bytes (64-byte blocks, with the padding's 0x80
/// byte and 8-byte length).
const fn sha256_blocks(len: u64) -> u64 {
    (len + 9).div_ceil(64)
}

/// SHA-256 compressions a side spends to check 4 KiB of data: the floor of its CPU where
/// hashing is most of the work (1 MiB reads). verity hashes its 32-byte salt and the 4 KiB
/// block (its hash blocks are verified once and stay cached); integrity hashes each sector
/// with its 8-byte sector number, and HMAC adds the outer block (both pads are precomputed).
pub fn hash_blocks_per_4k(side: usize) -> u64 {
    if side == 0 {
        return sha256_blocks(32 + 4096);
    }
    let (hmac, sector) = INTEGRITY_SIDES[side - 1];
    let sector = u64::from(sector);
    let inner = sha256_blocks(64 + 8 + sector) - 1;
    let outer = if hmac { sha256_blocks(64 + 32) - 1 } else { 0 };
    let per_sector = if hmac {
        inner + outer
    } else {
        sha256_blocks(8 + sector)
    };
    per_sector * (4096 / sector)
}

/// The read jobs: iozone's reader at its 4 KiB record (buffered, the page cache dropped
/// first, with readahead), the same with O_DIRECT, a random read, and 1 MiB direct reads;
/// each is [`integrity::Job`](Job)'s fio line (libaio, queue depth 1).
pub fn read_jobs() -> Vec<Job> {
    let j = |rw: &str, bs: u64, direct: bool| Job {
        rw: rw.into(),
        bs,
        direct,
    };
    vec![
        j("read", 4096, false),
        j("read", 4096, true),
        j("randread", 4096, true),
        j("read", 1 << 20, true),
    ]
}

/// One side's measurements of one job, one value per run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SideRuns {
    /// Read bandwidth, bytes/s.
    pub bw: Vec<f64>,
    /// CPU seconds of the serving process per GB (10^9 bytes) read.
    pub cpu_s_per_gb: Vec<f64>,
}

/// One job's row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// The job.
    pub job: Job,
    /// Per side, in [`SIDES`] order.
    pub sides: Vec<SideRuns>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerityIntegrityReport {
    /// Bytes of data per side.
    pub size: u64,
    /// Runs per job and side.
    pub runs: u32,
    /// One run, ms.
    pub runtime_ms: u64,
    /// Where the files were.
    pub dir: PathBuf,
    /// The commands that prepared and opened each side.
    pub commands: Vec<String>,
    /// One row per job.
    pub rows: Vec<Row>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Format and open one integrity side over a copy of the data (written through it).
fn open_integrity(
    dmkit: &Dmkit,
    (hmac, sector): (bool, u32),
    o: &RwBenchOptions,
    ws: &Workspace,
    interrupt: &Interrupt,
    commands: &mut Vec<String>,
) -> Result<Export, BenchError> {
    let alg_name = if hmac { "hmac-sha256" } else { "sha256" };
    let tag = format!("{alg_name}-{sector}");
    let img = ws.path(&format!("integrity-{tag}.img"));
    let key = ws.path("integrity.key");
    let io = |what: String| move |source| BenchError::Io { what, source };
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(o.size + o.size / 15 + (80 << 20)))
        .map_err(io(format!("creating {}", img.display())))?;
    std::fs::write(&key, [0x5au8; 32]).map_err(io(format!("writing {}", key.display())))?;
    let (img_s, key_s) = (
        img.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    );
    let mut alg = strings(&["--integrity", alg_name]);
    if hmac {
        alg.extend(strings(&["--integrity-key-file", &key_s]));
    }
    let mut format = strings(&["integrity", "format", "-q", "--sector-size"]);
    format.push(sector.to_string());
    format.extend(alg.iter().cloned());
    format.push(img_s.clone());
    commands.push(format!("dmkit {}", format.join(" ")));
    run_ok(&mut dmkit.command(&format), ws.dir(), interrupt, None)?;
    let name = format!("bench{}-integrity-{tag}", std::process::id());
    let mut open = strings(&["integrity", "open"]);
    open.extend(alg);
    open.extend([img_s, name.clone()]);
    commands.push(format!("dmkit {}", open.join(" ")));
    say(o.progress, format!("opening integrity ({tag}) as {name}"));
    dmkit.open(&name, &open, ws.dir(), interrupt)
}

/// Run the comparison.
pub fn run(o: &RwBenchOptions, interrupt: &Interrupt) -> Result<VerityIntegrityReport, BenchError> {
    o.check()?;
    crate::bench::harness::fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.dir)?;
    let mut commands = Vec::new();
    let data = ws.path("data.img");
    say(
        o.progress,
        format!("writing {} of random data", format_size(o.size)),
    );
    harness::write_random_file(&data, o.size, interrupt)?;
    let hash = ws.path("data.hash");
    let params = VerityParams::default();
    commands.push(format!(
        "dmkit {}",
        params.dmkit_format_args(&data, &hash).join(" ")
    ));
    let root = vb::format(&dmkit, &params, &data, &hash, ws.dir(), interrupt)?;
    let name = format!("bench{}-verity", std::process::id());
    // Every read verified, as the kernel's dm-verity verifies every block it reads (its
    // hash blocks stay cached, as dm-bufio keeps them); dmkit's verified-data cache would
    // otherwise serve re-reads without hashing.
    let mut open = vb::open_args(&data, &name, &hash, &root);
    open.extend(["--data-cache".to_string(), "0".to_string()]);
    commands.push(format!("dmkit {}", open.join(" ")));
    let mut exports = vec![dmkit.open(&name, &open, ws.dir(), interrupt)?];
    for side in INTEGRITY_SIDES {
        let e = open_integrity(&dmkit, side, o, &ws, interrupt, &mut commands)?;
        say(o.progress, format!("writing the data through {}", e.name()));
        harness::fill_from(&data, e.path(), o.size, interrupt)?;
        exports.push(e);
    }
    let pids: Vec<u32> = exports
        .iter()
        .map(|e| dmkit.server_pid(e.name(), ws.dir(), interrupt))
        .collect::<Result<_, _>>()?;
    let mut rows: Vec<Row> = read_jobs()
        .into_iter()
        .map(|job| Row {
            job,
            sides: vec![SideRuns::default(); SIDES.len()],
        })
        .collect();
    for run in 0..o.runs as usize {
        for row in rows.iter_mut() {
            for k in 0..SIDES.len() {
                let side = (k + run) % SIDES.len();
                interrupt.check()?;
                let file = exports[side].path();
                let args = row.job.args(file, o.size, o.runtime_ms);
                let before = harness::cpu_seconds(pids[side])?;
                let r = fio_rw(
                    &row.job.label(),
                    &args,
                    file,
                    o.runtime_ms,
                    ws.dir(),
                    interrupt,
                )?;
                let cpu = harness::cpu_seconds(pids[side])? - before;
                let gb = r.read * o.runtime_ms as f64 / 1000.0 / 1e9;
                let s = &mut row.sides[side];
                s.bw.push(r.read);
                s.cpu_s_per_gb.push(if gb > 0.0 { cpu / gb } else { 0.0 });
                say(
                    o.progress,
                    format!(
                        "run {}/{} {:<18} {:<22} {:.1} MB/s, {:.2} CPU s/GB",
                        run + 1,
                        o.runs,
                        row.job.label(),
                        SIDES[side],
                        r.read / 1e6,
                        s.cpu_s_per_gb.last().copied().unwrap_or(0.0)
                    ),
                );
            }
        }
    }
    for e in exports.drain(..).rev() {
        e.close()?;
    }
    Ok(VerityIntegrityReport {
        size: o.size,
        runs: o.runs,
        runtime_ms: o.runtime_ms,
        dir: o.dir.clone(),
        commands,
        rows,
    })
}

crate::bench::harness::report::impl_report!(VerityIntegrityReport => crate::bench::seeds::sections::s004::render_command);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_and_their_fio_arguments() {
        let jobs = read_jobs();
        assert_eq!(
            jobs.iter().map(Job::label).collect::<Vec<_>>(),
            [
                "read",
                "read direct",
                "randread direct",
                "read 1 MiB direct"
            ]
        );
        let a = jobs[0].args(std::path::Path::new("/x"), 1 << 20, 1000);
        assert!(a.contains(&"--invalidate=1".to_string()));
        assert!(a.contains(&"--direct=0".to_string()));
    }

    #[test]
    fn hash_blocks_per_4k_of_every_side() {
        // verity: 32-byte salt + 4096 bytes; integrity: 8 sectors of 8 + 512 bytes (9 blocks
        // each, HMAC one more for its outer hash), or one of 8 + 4096 bytes.
        let blocks: Vec<u64> = (0..SIDES.len()).map(hash_blocks_per_4k).collect();
        assert_eq!(blocks, [65, 72, 80, 65, 66]);
        assert_eq!(paper_config(SIDES[4]), "integrity hmac-sha256");
        assert_eq!(paper_config(SIDES[1]), "integrity sha256");
    }

    #[test]
    fn cpu_of_this_process_is_read() {
        assert!(harness::cpu_seconds(std::process::id()).unwrap() >= 0.0);
    }
}
