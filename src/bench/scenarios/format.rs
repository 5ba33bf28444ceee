//! `dmkit bench format`: `veritysetup format` against `dmkit verity format` on the same
//! freshly written random file (page cache warm for both), same parameters, fixed salt and
//! UUID, runs alternated; both must print the same root hash. Then the same with a FEC area
//! (`--fec-device --fec-roots N`) for each roots count asked: both must write the same FEC
//! area, byte for byte, in every run.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;

use super::verity::{run_format, VerityParams};
use crate::bench::harness::model::{FecFormatRow, FormatReport, ToolTiming};
use crate::bench::harness::process::{self as harness, Dmkit, Interrupt, Workspace};
use crate::bench::BenchError;

/// The fixed salt (32 bytes, veritysetup's default salt size).
pub const SALT: &str = "5eed002d1b0f0ca11ed0dbe4c40000000000000000000000000000000000f00d";
/// The fixed UUID given to veritysetup.
pub const UUID: &str = "d1a7e5e7-0000-4000-8000-000000000002";
/// The project's target: dmkit at least this many times veritysetup's throughput.
pub const TARGET: f64 = 5.0;
/// The target with FEC: dmkit at least this many times veritysetup's throughput.
pub const FEC_TARGET: f64 = 10.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Size of the data file, bytes (a multiple of the data block size).
    pub size: u64,
    /// Runs per tool.
    pub runs: u32,
    /// Where the scratch directory is created.
    pub dir: PathBuf,
    /// Format parameters (the salt is always set).
    pub params: VerityParams,
    /// Print progress on stderr.
    pub progress: bool,
    /// `--fec-roots` of each verity+FEC row (none: no FEC rows).
    pub fec_roots: Vec<u8>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            size: 2 << 30,
            runs: 3,
            dir: PathBuf::from("/var/tmp"),
            params: VerityParams {
                salt: Some(SALT.into()),
                ..VerityParams::default()
            },
            progress: std::io::stderr().is_terminal(),
            fec_roots: vec![crate::verity::fec::DEFAULT_ROOTS],
        }
    }
}

/// Run the comparison.
pub fn run(opts: &FormatOptions, interrupt: &Interrupt) -> Result<FormatReport, BenchError> {
    let bs = u64::from(opts.params.data_block_size);
    if opts.size == 0 || opts.size.checked_rem(bs) != Some(0) {
        return Err(BenchError::Invalid(format!(
            "--size must be a non-zero multiple of the data block size {bs}, not {}",
            opts.size
        )));
    }
    if opts.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    if let Some(r) = opts
        .fec_roots
        .iter()
        .find(|&&r| crate::verity::fec::rs::Rs::new(r).is_none())
    {
        return Err(BenchError::Invalid(format!(
            "--fec-roots {r}: 2 to 24 parity bytes per codeword"
        )));
    }
    let mut params = opts.params.clone();
    let salt = params.salt.get_or_insert_with(|| SALT.into()).clone();
    let version =
        crate::bench::harness::process::required_version("veritysetup", "cryptsetup-bin")?;
    let dmkit = Dmkit::from_env()?;
    let say = |msg: String| {
        if opts.progress {
            eprintln!("{msg}");
        }
    };

    let ws = Workspace::create(&opts.dir)?;
    let data = ws.path("data.img");
    let hash = ws.path("hash.img");
    harness::write_random_data(opts.progress, &data, opts.size, interrupt)?;
    // Same page-cache state for both tools: everything cached.
    harness::read_through(&data)?;

    const TOOLS: [&str; 2] = ["veritysetup format", "dmkit verity format"];
    let mut seconds: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut root: Option<(String, &str)> = None;
    for run in 0..opts.runs as usize {
        for k in 0..2 {
            let t = (k + run) % 2;
            let mut cmd = if t == 0 {
                let mut c = Command::new("veritysetup");
                c.args(params.veritysetup_format_args(&data, &hash, UUID));
                c
            } else {
                dmkit.command(params.dmkit_format_args(&data, &hash))
            };
            let f = run_format(&mut cmd, &hash, ws.dir(), interrupt)?;
            say(format!(
                "run {}/{} {:<20} {:.3} s  {}",
                run + 1,
                opts.runs,
                TOOLS[t],
                f.elapsed.as_secs_f64(),
                f.root_hash
            ));
            match &root {
                None => root = Some((f.root_hash, TOOLS[t])),
                Some((r, by)) if *r != f.root_hash => {
                    return Err(BenchError::Mismatch(format!(
                        "root hash mismatch on the same data and salt {salt}: {} printed {} \
                         but {by} printed {r}",
                        TOOLS[t], f.root_hash
                    )))
                }
                Some(_) => {}
            }
            seconds[t].push(f.elapsed.as_secs_f64());
        }
    }

    let mut fec = Vec::new();
    for &roots in &opts.fec_roots {
        fec.push(run_fec(
            opts,
            &params,
            roots,
            [&data, &hash],
            &dmkit,
            &ws,
            interrupt,
        )?);
    }

    let dmkit_build = dmkit.build_label();
    let tools = tool_timings(TOOLS, opts.size, &seconds, "a format run")?;
    let ratio = tools[1].mib_s.median / tools[0].mib_s.median;
    Ok(FormatReport {
        size: opts.size,
        runs: opts.runs,
        hash: params.hash.clone(),
        data_block_size: params.data_block_size,
        hash_block_size: params.hash_block_size,
        salt,
        root_hash: root.map(|r| r.0).unwrap_or_default(),
        tools,
        ratio,
        target: TARGET,
        pass: ratio >= TARGET,
        veritysetup_version: version,
        dmkit_build,
        fec,
    })
}

/// The verity+FEC row for `roots`: both tools alternated on the same data, each run's FEC area
/// compared byte for byte with the first run's (and the root hashes too).
fn run_fec(
    opts: &FormatOptions,
    params: &VerityParams,
    roots: u8,
    [data, hash]: [&std::path::Path; 2],
    dmkit: &Dmkit,
    ws: &Workspace,
    interrupt: &Interrupt,
) -> Result<FecFormatRow, BenchError> {
    let fec = ws.path("fec.img");
    let fec_args = [
        format!("--fec-device={}", fec.display()),
        format!("--fec-roots={roots}"),
    ];
    const TOOLS: [&str; 2] = ["veritysetup format", "dmkit verity format"];
    let mut seconds: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut first: Option<(String, Vec<u8>, &str)> = None;
    for run in 0..opts.runs as usize {
        for k in 0..2 {
            let t = (k + run) % 2;
            let mut args = if t == 0 {
                params.veritysetup_format_args(data, hash, UUID)
            } else {
                params.dmkit_format_args(data, hash)
            };
            // Options before the two positional files.
            let at = args.len() - 2;
            args.splice(at..at, fec_args.iter().cloned());
            let mut cmd = if t == 0 {
                let mut c = Command::new("veritysetup");
                c.args(args);
                c
            } else {
                dmkit.command(args)
            };
            harness::remove_file(&fec)?;
            let f = run_format(&mut cmd, hash, ws.dir(), interrupt)?;
            let area = std::fs::read(&fec).map_err(|source| BenchError::Io {
                what: format!("read {}", fec.display()),
                source,
            })?;
            if opts.progress {
                eprintln!(
                    "run {}/{} roots {roots} {:<20} {:.3} s  {}",
                    run + 1,
                    opts.runs,
                    TOOLS[t],
                    f.elapsed.as_secs_f64(),
                    f.root_hash
                );
            }
            match &first {
                None => first = Some((f.root_hash, area, TOOLS[t])),
                Some((r, a, by)) if *r != f.root_hash || *a != area => {
                    return Err(BenchError::Mismatch(format!(
                        "--fec-roots {roots}: {} wrote a different {} than {by} on the same data",
                        TOOLS[t],
                        if *r != f.root_hash {
                            "root hash"
                        } else {
                            "FEC area"
                        }
                    )))
                }
                Some(_) => {}
            }
            seconds[t].push(f.elapsed.as_secs_f64());
        }
    }
    let fec_bytes = first.map_or(0, |f| f.1.len() as u64);
    harness::remove_file(&fec)?;
    let tools = tool_timings(TOOLS, opts.size, &seconds, "a format run")?;
    let ratio = tools[1].mib_s.median / tools[0].mib_s.median;
    Ok(FecFormatRow {
        roots,
        fec_bytes,
        tools,
        ratio,
        target: FEC_TARGET,
        pass: ratio >= FEC_TARGET,
    })
}

/// Both tools' timings of `size` bytes from their seconds per run; `what` names one run in
/// the error when one took no measurable time.
pub fn tool_timings(
    names: [&str; 2],
    size: u64,
    seconds: &[Vec<f64>; 2],
    what: &str,
) -> Result<Vec<ToolTiming>, BenchError> {
    names
        .iter()
        .zip(seconds)
        .map(|(name, s)| {
            ToolTiming::new(name, size, s)
                .ok_or_else(|| BenchError::Tool(format!("{what} took no measurable time")))
        })
        .collect()
}

crate::bench::harness::report::impl_report!(crate::bench::harness::model::FormatReport => crate::bench::harness::table::render_format);
