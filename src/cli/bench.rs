//! `dmkit bench`.
use super::CliResult;

/// Arguments of `dmkit bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

/// Run `dmkit bench`.
pub fn run(_a: BenchArgs) -> CliResult {
    Err(super::CliError::invalid("bench: not implemented yet"))
}
