//! `dmkit linear`: a pass-through export of a file, like dm-linear over the whole file. It is
//! the baseline the benchmarks compare every layer against.
use super::device::open_export;
use super::{CliError, CliResult};
use crate::block::BlockDevice;
use crate::export::ExportSpec;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

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
    let dev = super::files::open_backing(&a.file, a.read_only, a.direct)?;
    let claim = super::files::claim(dev.file(), &a.file, 0, 0, !a.read_only)?;
    let size = dev.size();
    if size == 0 {
        return Err(CliError::invalid(format!("{}: is empty", a.file.display())));
    }
    if a.direct && size % 512 != 0 {
        return Err(CliError::invalid(format!(
            "{}: size {size} is not a multiple of 512 bytes, which --direct needs",
            a.file.display()
        )));
    }
    let backing = std::fs::canonicalize(&a.file).unwrap_or_else(|_| a.file.clone());
    let spec = ExportSpec {
        fuse: a.nbd.fuse(),
        nbd,
        name: a.name,
        device: Arc::new(dev),
        kind: "linear".to_string(),
        loop_device: a.loop_device,
        direct_io_loop: a.direct,
        allow_discards: a.allow_discards,
        threads: a.threads as usize,
        details: json!({ "backing": backing, "direct": a.direct }),
        stats: None,
        claims: vec![claim],
    };
    open_export(spec, a.foreground)
}
