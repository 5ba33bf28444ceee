//! `dmkit verity`.
use super::CliResult;

/// `dmkit verity` subcommands.
#[derive(clap::Subcommand)]
pub enum VerityCommand {}

/// Run a `dmkit verity` subcommand.
pub fn run(c: VerityCommand) -> CliResult {
    match c {}
}
