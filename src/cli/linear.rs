//! `dmkit linear`: a pass-through export of a file.
use super::CliResult;

/// `dmkit linear` subcommands.
#[derive(clap::Subcommand)]
pub enum LinearCommand {}

/// Run a `dmkit linear` subcommand.
pub fn run(c: LinearCommand) -> CliResult {
    match c {}
}
