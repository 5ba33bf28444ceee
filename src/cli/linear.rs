//! `dmkit linear`: a pass-through export of a file, like dm-linear over the whole file. It is
//! the baseline the benchmarks compare every layer against.
use super::CliResult;
use crate::block::linear::{self, LinearOptions};
use std::path::PathBuf;

/// `dmkit linear` subcommands.
#[derive(clap::Subcommand)]
pub enum LinearCommand {
    /// Serve FILE unchanged at $DMKIT_RUN_DIR/NAME (default /run/dmkit/NAME) until
    /// `dmkit close NAME`.
    Open(OpenArgs),
}

/// Arguments of `dmkit linear open`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// The file (or block device) to export.
    pub file: PathBuf,
    /// Name of the device.
    pub name: String,
    /// Refuse writes.
    #[arg(long)]
    pub read_only: bool,
    #[command(flatten)]
    pub serve: super::device::ServeArgs,
    /// Bypass the page cache: open FILE with O_DIRECT, and use direct I/O on the loop device.
    #[arg(long)]
    pub direct: bool,
    /// Pass discards (fallocate PUNCH_HOLE) down to FILE.
    #[arg(long)]
    pub allow_discards: bool,
}

/// Run a `dmkit linear` subcommand.
pub fn run(c: LinearCommand) -> CliResult {
    match c {
        LinearCommand::Open(a) => open(a),
    }
}

fn open(a: OpenArgs) -> CliResult {
    let mut how = a.serve.prepare(&a.name)?;
    how.direct_io_loop = a.direct;
    let opts = LinearOptions {
        name: a.name,
        read_only: a.read_only,
        direct: a.direct,
        allow_discards: a.allow_discards,
    };
    let activated = linear::activate(&a.file, &opts)?;
    a.serve.serve(activated, how)
}
