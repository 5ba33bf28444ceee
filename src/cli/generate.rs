//! `dmkit generate`: man pages and shell completions from the command line's own definition, so
//! they never drift from `--help`. `scripts/install-docs.sh` installs what it writes.

use super::{CliError, CliResult};
use clap::CommandFactory;
use std::path::PathBuf;

/// `dmkit generate ...`.
#[derive(clap::Subcommand)]
pub enum GenerateCommand {
    /// Write one man page per command into DIR: dmkit.1, one per command group (dmkit-luks.1,
    /// dmkit-verity.1, ...) and one per command (dmkit-luks-format.1, ...).
    Man {
        /// Directory to write the pages into (created if missing).
        dir: PathBuf,
    },
    /// Print the completion script for SHELL on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// Run `dmkit generate`.
pub fn run(c: GenerateCommand) -> CliResult {
    let cmd = super::Cli::command();
    match c {
        GenerateCommand::Man { dir } => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| CliError::invalid(format!("{}: {e}", dir.display())))?;
            clap_mangen::generate_to(cmd, &dir)
                .map_err(|e| CliError::invalid(format!("{}: {e}", dir.display())))
        }
        GenerateCommand::Completions { shell } => {
            let mut cmd = cmd;
            clap_complete::generate(shell, &mut cmd, "dmkit", &mut std::io::stdout());
            Ok(())
        }
    }
}
