//! `dmkit bench fec`: dm-verity forward error correction on a damaged image (issue 24).
//!
//! One random data file is formatted by `dmkit verity format --fec-device`; a copy of it gets
//! scattered corrupted blocks, overwritten with noise, at most as many per round of codewords
//! as the read path corrects (one unknown error per two roots, the block read counting as an
//! erasure). Then, in the same run:
//!
//! - reads: the clean image and the damaged one opened side by side with `dmkit verity open
//!   --fec-device --data-cache 0` (every read verified, so every read of a damaged block is
//!   corrected, the worst case), fio against both with the sides alternated run by run; the
//!   damaged export is first read whole and compared with the clean data;
//! - repair: `dmkit verity repair --fec-device` of the damaged copy, timed; every damaged block
//!   must be reported fixed and the file must then equal the clean data (the damage is written
//!   again before each run).

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::verity::{open_args, run_format, VerityParams};
use crate::bench::harness::fio::{self, RunSpec, Workload};
use crate::bench::harness::model::Stats;
use crate::bench::harness::process::{
    self as harness, say, Dmkit, Interrupt, Workspace, Xoshiro256,
};
use crate::bench::harness::table::{format_size, Align, BwUnit, TextTable};
use crate::bench::BenchError;
use crate::verity::fec::FecGeometry;

/// Block size of the image (data and hash, as FEC needs them equal).
const BLOCK: u64 = 4096;

/// What to run.
#[derive(Debug, Clone)]
pub struct FecBenchOptions {
    /// Size of the data file, bytes (a multiple of 4096).
    pub size: u64,
    /// `--fec-roots`.
    pub roots: u8,
    /// Corrupted data blocks.
    pub damaged: u64,
    /// Runs per side (reads) and of the repair.
    pub runs: u32,
    /// Length of one fio run, ms.
    pub runtime_ms: u64,
    /// `--quick` (recorded in the report).
    pub quick: bool,
    /// Where the scratch directory is created.
    pub dir: PathBuf,
    /// Workloads of the read rows.
    pub workloads: Vec<Workload>,
    /// Print progress on stderr.
    pub progress: bool,
}

impl FecBenchOptions {
    /// The defaults of `dmkit bench fec` (or with `--quick`): 1 GiB with 1,000 damaged blocks
    /// (256 MiB with 64), as the read-write benchmarks size their data.
    pub fn defaults(quick: bool) -> FecBenchOptions {
        let rw = crate::bench::harness::rw::RwBenchOptions::defaults(quick);
        FecBenchOptions {
            size: rw.size,
            roots: crate::verity::fec::DEFAULT_ROOTS,
            damaged: if quick { 64 } else { 1000 },
            runs: rw.runs,
            runtime_ms: rw.runtime_ms,
            quick,
            dir: rw.dir,
            workloads: Workload::select(&["seq-1m".into(), "rand-4k-qd32".into()])
                .expect("standard workloads"),
            progress: false,
        }
    }
}

/// One read workload on the clean and the damaged image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadRow {
    /// The workload.
    pub workload: Workload,
    /// Clean image, bytes/s per run.
    pub clean: Stats,
    /// Damaged image, bytes/s per run.
    pub damaged: Stats,
    /// Median damaged / median clean.
    pub ratio: f64,
}

/// The result of `dmkit bench fec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FecBenchReport {
    /// Data size, bytes.
    pub size: u64,
    /// Parity bytes per codeword.
    pub roots: u8,
    /// Rounds of codewords (each damaged block is in one).
    pub rounds: u64,
    /// Corrupted data blocks.
    pub damaged: u64,
    /// The most corrupted blocks in one round.
    pub per_round: u64,
    /// Runs per side and of the repair.
    pub runs: u32,
    /// fio run length, ms.
    pub runtime_ms: u64,
    /// `--quick`.
    pub quick: bool,
    /// Reads through `dmkit verity open --fec-device`.
    pub reads: Vec<ReadRow>,
    /// Wall time of `dmkit verity repair`, seconds per run.
    pub repair_seconds: Stats,
    /// Data blocks the repair reported fixed (each run).
    pub repaired_blocks: u64,
    /// How the measured dmkit was built.
    pub dmkit_build: String,
}

/// Run the benchmark. Exports are closed and scratch files removed on every path out.
pub fn run(opts: &FecBenchOptions, interrupt: &Interrupt) -> Result<FecBenchReport, BenchError> {
    if opts.size == 0 || !opts.size.is_multiple_of(BLOCK) {
        return Err(BenchError::Invalid(format!(
            "--size must be a non-zero multiple of 4096 bytes, not {}",
            opts.size
        )));
    }
    if opts.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    if opts.damaged == 0 {
        return Err(BenchError::Invalid("--damaged must be at least 1".into()));
    }
    if crate::verity::fec::rs::Rs::new(opts.roots).is_none() {
        return Err(BenchError::Invalid(format!(
            "--fec-roots {}: 2 to 24 parity bytes per codeword",
            opts.roots
        )));
    }
    fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    let progress = opts.progress;

    let ws = Workspace::create(&opts.dir)?;
    let (data, hash, fec) = (ws.path("data.img"), ws.path("hash.img"), ws.path("fec.img"));
    harness::write_random_data(progress, &data, opts.size, interrupt)?;
    let params = VerityParams {
        salt: Some(super::format::SALT.into()),
        ..VerityParams::default()
    };
    let mut args = params.dmkit_format_args(&data, &hash);
    let at = args.len() - 2;
    args.splice(
        at..at,
        [
            format!("--fec-device={}", fec.display()),
            format!("--fec-roots={}", opts.roots),
        ],
    );
    say(
        progress,
        format!("formatting with --fec-roots {}", opts.roots),
    );
    let root = run_format(&mut dmkit.command(args), &hash, ws.dir(), interrupt)?.root_hash;

    // The covered area: the data blocks, then the hash file after its superblock block.
    let data_blocks = opts.size / BLOCK;
    let hash_blocks = file_size(&hash)? / BLOCK;
    let g = FecGeometry::new(
        opts.roots,
        BLOCK as u32,
        data_blocks + hash_blocks.saturating_sub(1),
    )
    .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let per_round = opts.damaged.div_ceil(g.rounds);
    // The read path knows only the block it reads as an erasure: 1 + 2·(k − 1) ≤ roots.
    let bound = u64::from(opts.roots).div_ceil(2);
    if per_round > bound {
        return Err(BenchError::Invalid(format!(
            "--damaged {}: {} rounds of codewords with {} roots correct at most {} blocks \
             ({bound} per round) on the read path",
            opts.damaged,
            g.rounds,
            opts.roots,
            g.rounds * bound
        )));
    }
    let blocks = damage_plan(&g, data_blocks, opts.damaged, per_round)?;
    let damaged_path = ws.path("damaged.img");
    fs::copy(&data, &damaged_path).map_err(|source| BenchError::Io {
        what: format!("copy {} to {}", data.display(), damaged_path.display()),
        source,
    })?;
    let junk = damage(&damaged_path, &blocks)?;

    let fec_args = [
        "--fec-device".to_string(),
        fec.to_string_lossy().into_owned(),
        "--fec-roots".to_string(),
        opts.roots.to_string(),
    ];
    let reads = {
        let mut exports = Vec::new();
        for (side, file) in [("clean", &data), ("damaged", &damaged_path)] {
            let name = format!("bench{}-fec-{side}", std::process::id());
            let mut a = open_args(file, &name, &hash, &root);
            a.extend(fec_args.iter().cloned());
            a.extend(["--data-cache".into(), "0".into()]);
            say(progress, format!("opening the {side} image as {name}"));
            exports.push(dmkit.open(&name, &a, ws.dir(), interrupt)?);
        }
        say(progress, "reading the damaged image whole".into());
        same_contents(exports[1].path(), &data, interrupt)?;
        let spec = RunSpec {
            size: opts.size,
            runtime_ms: opts.runtime_ms,
        };
        let mut rows = Vec::new();
        for w in &opts.workloads {
            let mut bw: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            for run in 0..opts.runs as usize {
                for k in 0..2 {
                    let side = (k + run) % 2;
                    let r = fio::run(w, exports[side].path(), spec, ws.dir(), interrupt)?;
                    say(
                        progress,
                        format!(
                            "run {}/{} {:<14} {:<8} {}",
                            run + 1,
                            opts.runs,
                            w.name,
                            ["clean", "damaged"][side],
                            BwUnit::for_bytes_per_s(r.bw_bytes).format(r.bw_bytes)
                        ),
                    );
                    bw[side].push(r.bw_bytes);
                }
            }
            let (Some(clean), Some(damaged)) = (Stats::of(&bw[0]), Stats::of(&bw[1])) else {
                return Err(BenchError::Fio(format!(
                    "{}: no bandwidth measured",
                    w.name
                )));
            };
            rows.push(ReadRow {
                workload: w.clone(),
                ratio: damaged.median / clean.median,
                clean,
                damaged,
            });
        }
        for e in exports.drain(..).rev() {
            e.close()?;
        }
        rows
    };

    let mut seconds = Vec::new();
    let mut repaired = 0;
    for run in 0..opts.runs {
        if run > 0 {
            rewrite(&damaged_path, &blocks, &junk)?;
        }
        let mut a: Vec<String> = vec![
            "verity".into(),
            "repair".into(),
            damaged_path.to_string_lossy().into_owned(),
            hash.to_string_lossy().into_owned(),
            root.clone(),
        ];
        a.extend(fec_args.iter().cloned());
        a.push("--json".into());
        let out = harness::run_ok(&mut dmkit.command(a), ws.dir(), interrupt, None)?;
        repaired = repaired_blocks(&out.stdout)?;
        say(
            progress,
            format!(
                "repair {}/{}: {:.3} s, {repaired} data blocks fixed",
                run + 1,
                opts.runs,
                out.elapsed.as_secs_f64()
            ),
        );
        if repaired != blocks.len() as u64 {
            return Err(BenchError::Mismatch(format!(
                "verity repair fixed {repaired} data blocks of the {} damaged",
                blocks.len()
            )));
        }
        same_contents(&damaged_path, &data, interrupt)?;
        seconds.push(out.elapsed.as_secs_f64());
    }
    Ok(FecBenchReport {
        size: opts.size,
        roots: opts.roots,
        rounds: g.rounds,
        damaged: blocks.len() as u64,
        per_round,
        runs: opts.runs,
        runtime_ms: opts.runtime_ms,
        quick: opts.quick,
        reads,
        repair_seconds: Stats::of(&seconds)
            .ok_or_else(|| BenchError::Tool("verity repair took no measurable time".into()))?,
        repaired_blocks: repaired,
        dmkit_build: dmkit.build_label(),
    })
}

fn file_size(path: &Path) -> Result<u64, BenchError> {
    fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| BenchError::Io {
            what: format!("stat {}", path.display()),
            source,
        })
}

/// `count` distinct data blocks, at most `per_round` in any round of `g`, spread over the
/// rounds (round-robin from a random start) at random places in each (a fixed seed, so runs
/// damage the same blocks). Sorted.
fn damage_plan(
    g: &FecGeometry,
    data_blocks: u64,
    count: u64,
    per_round: u64,
) -> Result<Vec<u64>, BenchError> {
    let mut rng = Xoshiro256::seeded(24);
    let mut chosen = std::collections::BTreeSet::new();
    let start = rng.next() % g.rounds;
    'rounds: for k in 0..g.rounds * per_round {
        if chosen.len() as u64 == count {
            break;
        }
        let round = (start + k) % g.rounds;
        // Data blocks of this round: round, round + rounds, ... below data_blocks.
        let slots = data_blocks.saturating_sub(round).div_ceil(g.rounds);
        if slots == 0 {
            continue;
        }
        for _ in 0..8 {
            let b = (rng.next() % slots) * g.rounds + round;
            if chosen.insert(b) {
                continue 'rounds;
            }
        }
    }
    if (chosen.len() as u64) < count {
        return Err(BenchError::Invalid(format!(
            "--damaged {count}: only {} data blocks could be placed within the bound",
            chosen.len()
        )));
    }
    Ok(chosen.into_iter().collect())
}

/// Overwrite `blocks` of `path` with noise; returns the noise, to write it again.
fn damage(path: &Path, blocks: &[u64]) -> Result<Vec<u8>, BenchError> {
    let mut junk = vec![0u8; blocks.len() * BLOCK as usize];
    Xoshiro256::from_os()?.fill(&mut junk);
    rewrite(path, blocks, &junk)?;
    Ok(junk)
}

/// Write block `i` of `junk` over block `blocks[i]` of `path`.
fn rewrite(path: &Path, blocks: &[u64], junk: &[u8]) -> Result<(), BenchError> {
    let io = |source| BenchError::Io {
        what: format!("damage {}", path.display()),
        source,
    };
    let f = fs::OpenOptions::new().write(true).open(path).map_err(io)?;
    for (&b, bytes) in blocks.iter().zip(junk.chunks_exact(BLOCK as usize)) {
        f.write_all_at(bytes, b * BLOCK).map_err(io)?;
    }
    f.sync_data().map_err(io)
}

/// Fail unless `a` and `b` hold the same bytes (read in 1 MiB pieces).
fn same_contents(a: &Path, b: &Path, interrupt: &Interrupt) -> Result<(), BenchError> {
    let open = |p: &Path| {
        File::open(p).map_err(|source| BenchError::Io {
            what: format!("open {}", p.display()),
            source,
        })
    };
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    loop {
        interrupt.check()?;
        let n = read_full(&mut fa, &mut ba, a)?;
        let m = read_full(&mut fb, &mut bb, b)?;
        if n != m || ba[..n] != bb[..m] {
            return Err(BenchError::Mismatch(format!(
                "{} differs from {} in the MiB at byte {at}",
                a.display(),
                b.display()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        at += n as u64;
    }
}

fn read_full(f: &mut File, buf: &mut [u8], path: &Path) -> Result<usize, BenchError> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(BenchError::Io {
                    what: format!("read {}", path.display()),
                    source,
                })
            }
        }
    }
    Ok(n)
}

/// The data blocks `verity repair --json` reports fixed.
fn repaired_blocks(json: &str) -> Result<u64, BenchError> {
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| BenchError::Tool(format!("verity repair --json: {e}")))?;
    v["fec"]["corrected_data_blocks"]
        .as_array()
        .map(|a| a.len() as u64)
        .ok_or_else(|| {
            BenchError::Tool(format!(
                "verity repair --json: no fec.corrected_data_blocks in {json}"
            ))
        })
}

/// The report as tables.
pub fn render(r: &FecBenchReport) -> String {
    let mut out = format!(
        "dm-verity FEC on {} of random data, --fec-roots {} ({} rounds of codewords): \
         {} scattered data blocks overwritten with noise (at most {} per round, within what the \
         read path corrects); {} run{} per side, alternated{}{}\n\n",
        format_size(r.size),
        r.roots,
        r.rounds,
        r.damaged,
        r.per_round,
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        if r.quick { ", --quick" } else { "" },
        if r.dmkit_build == "release" {
            String::new()
        } else {
            format!("; dmkit build: {}", r.dmkit_build)
        },
    );
    out.push_str(&format!(
        "reads through dmkit verity open --fec-device --data-cache 0 (every read verified), \
         fio {:.1} s per run; the damaged image read back whole equals the clean data\n\n",
        r.runtime_ms as f64 / 1000.0
    ));
    let spread = r.runs > 1;
    let cell = |s: &Stats| BwUnit::for_bytes_per_s(s.median).format_stats(s);
    let mut t = TextTable::new(vec![
        ("workload".into(), Align::Left),
        ("clean".into(), Align::Right),
        ("damaged".into(), Align::Right),
        ("damaged/clean".into(), Align::Right),
    ]);
    for row in &r.reads {
        t.push(vec![
            format!("{} ({})", row.workload.name, row.workload.describe()),
            cell(&row.clean),
            cell(&row.damaged),
            format!("{:.2}", row.ratio),
        ]);
    }
    out.push_str(&t.render());
    let s = &r.repair_seconds;
    out.push_str(&format!(
        "\ndmkit verity repair: {} s{}, {} damaged data blocks fixed in every run (the file then \
         equals the clean data)\n",
        if spread {
            format!("{:.3} ({:.3}..{:.3})", s.median, s.min, s.max)
        } else {
            format!("{:.3}", s.median)
        },
        if spread { " median (min..max)" } else { "" },
        r.repaired_blocks
    ));
    if spread {
        out.push_str("\nmedian (min..max) over runs\n");
    }
    out
}

crate::bench::harness::report::impl_report!(FecBenchReport => render);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_damage_stays_within_the_bound() {
        let g = FecGeometry::new(2, 4096, 262_144 + 2_065).unwrap();
        let blocks = damage_plan(&g, 262_144, 1000, 1).unwrap();
        assert_eq!(blocks.len(), 1000);
        let rounds: std::collections::BTreeSet<u64> = blocks.iter().map(|b| b % g.rounds).collect();
        assert_eq!(rounds.len(), 1000, "one block per round");
        assert!(blocks.iter().all(|&b| b < 262_144), "data blocks only");
        let g = FecGeometry::new(4, 4096, 1000).unwrap();
        let blocks = damage_plan(&g, 900, 8, 2).unwrap();
        for r in 0..g.rounds {
            assert!(blocks.iter().filter(|&&b| b % g.rounds == r).count() <= 2);
        }
        assert!(damage_plan(&g, 900, 1000, 2).is_err());
    }

    #[test]
    fn reads_the_repair_json() {
        let j = r#"{"ok":true,"fec":{"corrected_data_blocks":[1,5,9],"corrected_hash_blocks":[]}}"#;
        assert_eq!(repaired_blocks(j).unwrap(), 3);
        assert!(repaired_blocks("{}").is_err());
    }
}
