//! `dmkit close` and `dmkit status`.
use super::CliResult;

/// Arguments of `dmkit close`.
#[derive(clap::Args)]
pub struct CloseArgs {
    /// Name of the open device.
    pub name: String,
}

/// Arguments of `dmkit status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Name of the open device (all if omitted).
    pub name: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run `dmkit close`.
pub fn close(_a: CloseArgs) -> CliResult {
    Err(super::CliError::invalid("close: not implemented yet"))
}

/// Run `dmkit status`.
pub fn status(_a: StatusArgs) -> CliResult {
    Err(super::CliError::invalid("status: not implemented yet"))
}
