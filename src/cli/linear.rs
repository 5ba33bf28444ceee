//! `dmkit linear`: a pass-through export of a file, like dm-linear over the whole file. It is
//! the baseline the benchmarks compare every layer against.
use super::device::open_export;
use super::CliResult;
use crate::block::linear::{self, LinearOptions};
use crate::export::{ExportSpec, ServeOptions};
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
    /// Also attach a loop device (/dev/loopN) to the exported file.
    #[arg(long = "loop")]
    pub loop_device: bool,
    #[command(flatten)]
    pub nbd: super::nbd::NbdArgs,
    /// Bypass the page cache: open FILE with O_DIRECT, and use direct I/O on the loop device.
    #[arg(long)]
    pub direct: bool,
    /// Serving threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// Pass discards (fallocate PUNCH_HOLE) down to FILE.
    #[arg(long)]
    pub allow_discards: bool,
    /// Serve in this process until closed or interrupted, instead of in the background.
    #[arg(long)]
    pub foreground: bool,
}

/// Run a `dmkit linear` subcommand.
pub fn run(c: LinearCommand) -> CliResult {
    match c {
        LinearCommand::Open(a) => open(a),
    }
}

fn open(a: OpenArgs) -> CliResult {
    super::device::prepare_open(&a.name, a.loop_device)?;
    let nbd = a.nbd.config(a.loop_device)?;
    let opts = LinearOptions {
        name: a.name,
        read_only: a.read_only,
        direct: a.direct,
        allow_discards: a.allow_discards,
    };
    let activated = linear::activate(&a.file, &opts).map_err(super::files::volume_error)?;
    let how = ServeOptions {
        fuse: a.nbd.fuse(),
        nbd,
        loop_device: a.loop_device,
        direct_io_loop: a.direct,
        threads: a.threads as usize,
    };
    open_export(ExportSpec::new(activated, how), a.foreground)
}
