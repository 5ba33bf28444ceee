//! `dmkit integrity ...`: dm-integrity devices, with integritysetup's options.

use super::CliResult;

/// `dmkit integrity` subcommands.
#[derive(clap::Subcommand)]
pub enum IntegrityCommand {
    /// Serve a dm-integrity DEVICE read-write at $DMKIT_RUN_DIR/NAME (default
    /// /run/dmkit/NAME), like `integritysetup open`, until `dmkit integrity close NAME`.
    Open(super::integrity_open::OpenArgs),
    /// Tear down an open dm-integrity device (cleanly: journal written back, bitmap cleared).
    Close(super::device::CloseArgs),
    /// Show an open dm-integrity device.
    Status(super::device::StatusArgs),
}

/// Run a `dmkit integrity` subcommand.
pub fn run(c: IntegrityCommand) -> CliResult {
    match c {
        IntegrityCommand::Open(a) => super::integrity_open::open(a),
        IntegrityCommand::Close(a) => super::device::close(a),
        IntegrityCommand::Status(a) => super::device::status(a),
    }
}
