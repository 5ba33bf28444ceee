//! `dmkit bench format`: `veritysetup format` against `dmkit verity format` on the same
//! freshly written random file (page cache warm for both), same parameters, fixed salt and
//! UUID, runs alternated; both must print the same root hash.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;

use super::verity::{run_format, VerityParams};
use crate::bench::harness::model::{FormatReport, ToolTiming};
use crate::bench::harness::process::{self as harness, Dmkit, Interrupt, Workspace};
use crate::bench::BenchError;

/// The fixed salt (32 bytes, veritysetup's default salt size).
pub const SALT: &str = "5eed002d1b0f0ca11ed0dbe4c40000000000000000000000000000000000f00d";
/// The fixed UUID given to veritysetup.
pub const UUID: &str = "d1a7e5e7-0000-4000-8000-000000000002";
/// The project's target: dmkit at least this many times veritysetup's throughput.
pub const TARGET: f64 = 5.0;

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

    let dmkit_build = dmkit.build_label();
    let tools: Vec<ToolTiming> = TOOLS
        .iter()
        .zip(&seconds)
        .filter_map(|(name, s)| ToolTiming::new(name, opts.size, s))
        .collect();
    if tools.len() != 2 {
        return Err(BenchError::Tool(
            "a format run took no measurable time".into(),
        ));
    }
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
    })
}

crate::bench::harness::report::impl_report!(crate::bench::harness::model::FormatReport => crate::bench::harness::table::render_format);
