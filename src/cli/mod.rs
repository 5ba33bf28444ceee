//! The command line: one file per command group, this file only dispatches.
//!
//! Exit codes follow cryptsetup: 0 success, 1 wrong parameters or bad input, 2 verification or
//! permission failure, 4 no such device, 5 device busy (already open).

mod bench;
mod confirm;
mod device;
mod files;
mod fsverity;
mod fsverity_args;
mod fsverity_tree;
mod generate;
mod image;
mod image_read;
mod integrity;
mod integrity_alg;
mod integrity_open;
mod linear;
mod luks;
mod luks_admin;
mod luks_compat;
mod luks_decrypt_export;
mod luks_dump;
mod luks_online;
mod luks_reencrypt;
mod luks_reencrypt_online;
mod luks_remote;
mod luks_slots;
mod nbd;
mod open;
mod passphrase;
mod plain;
mod ranges;
mod remote;
mod verity;
mod verity_fec;

use clap::{Parser, Subcommand};

/// An error that ends a command: a one-line message and cryptsetup's exit code.
#[derive(Debug)]
pub struct CliError {
    /// Exit code.
    pub code: i32,
    /// One-line message, printed after "dmkit: ".
    pub message: String,
}

impl CliError {
    /// Wrong parameters or bad input (exit 1).
    pub fn invalid(message: impl Into<String>) -> Self {
        CliError {
            code: 1,
            message: message.into(),
        }
    }
    /// Verification or permission failure (exit 2).
    pub fn verification(message: impl Into<String>) -> Self {
        CliError {
            code: 2,
            message: message.into(),
        }
    }
    /// No such device (exit 4).
    pub fn no_device(message: impl Into<String>) -> Self {
        CliError {
            code: 4,
            message: message.into(),
        }
    }
    /// Device busy (exit 5).
    pub fn busy(message: impl Into<String>) -> Self {
        CliError {
            code: 5,
            message: message.into(),
        }
    }
}

/// Result of a command.
pub type CliResult = Result<(), CliError>;

#[derive(Parser)]
#[command(
    name = "dmkit",
    version,
    about = "dm-verity, dm-integrity, dm-crypt/LUKS2 and fs-verity in userspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per run: the size of the largest variant (open, with its remote options) does
// not matter, and boxing would spread through every match.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// dm-verity: format, verify, dump, open, sign.
    #[command(subcommand)]
    Verity(verity::VerityCommand),
    /// dm-integrity: format, dump, verify, open, close, status (like integritysetup).
    #[command(subcommand)]
    Integrity(integrity::IntegrityCommand),
    /// fs-verity: file digests and built-in signatures (like fsverity-utils), sealed trees.
    #[command(subcommand)]
    Fsverity(fsverity::FsVerityCommand),
    /// Read-only root images: build (EROFS/SquashFS/ext4 + dm-verity + signature), open with
    /// a writable overlay, close, status, inspect.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// A pass-through export of a file (like dm-linear), the baseline for benchmarks.
    #[command(subcommand)]
    Linear(linear::LinearCommand),
    /// LUKS2/LUKS1: format, open, dump and manage keyslots (like cryptsetup).
    #[command(subcommand)]
    Luks(luks::LuksCommand),
    /// dm-crypt plain mode: open a device with a raw key (like `cryptsetup open --type plain`).
    #[command(subcommand)]
    Plain(plain::PlainCommand),
    /// Open a device the way `cryptsetup open --type luks|luks1|luks2|plain` does.
    Open(open::OpenArgs),
    /// Tear down an open device.
    Close(device::CloseArgs),
    /// Show open devices.
    Status(device::StatusArgs),
    /// Measure each layer's overhead with fio.
    Bench(bench::BenchArgs),
    /// Man pages and shell completions (scripts/install-docs.sh installs them).
    #[command(subcommand)]
    Generate(generate::GenerateCommand),
}

/// Run the command line; returns the process exit code.
pub fn main() -> i32 {
    // Rust ignores SIGPIPE, which turns `dmkit ... | head -1` into a panic on the closed pipe.
    // Restore the default: like coreutils, a command whose reader went away ends quietly.
    // (Servers ignore it again: a client hanging up must not kill a device.)
    // SAFETY: signal(2) with a plain integer disposition, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match run_argv(std::env::args_os().collect()) {
        Ok(()) => 0,
        Err(e) => {
            // An empty message: the command has said what it had to (isLuks stays quiet).
            if !e.message.is_empty() {
                eprintln!("dmkit: {}", e.message);
            }
            e.code
        }
    }
}

/// Parse `argv` (program name first) and run the command.
fn run_argv(mut argv: Vec<std::ffi::OsString>) -> CliResult {
    if let Some(words) = argv
        .get(1)
        .and_then(|c| cryptsetup_name(&c.to_string_lossy()))
    {
        argv.splice(1..2, words.iter().map(std::ffi::OsString::from));
    }
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            return Err(CliError {
                code: usage_error(e),
                message: String::new(),
            })
        }
    };
    match cli.command {
        Command::Verity(c) => verity::run(c),
        Command::Integrity(c) => integrity::run(c),
        Command::Image(c) => image::run(c),
        Command::Linear(c) => linear::run(c),
        Command::Fsverity(c) => fsverity::run(c),
        Command::Luks(c) => luks::run(c),
        Command::Plain(c) => plain::run(c),
        Command::Open(a) => open::run(a),
        Command::Close(a) => device::close(a),
        Command::Status(a) => device::status(a),
        Command::Bench(a) => bench::run(a),
        Command::Generate(c) => generate::run(c),
    }
}

/// cryptsetup's top-level command names (`dmkit luksFormat ...`, hidden from the help): the
/// dmkit command each stands for. (Inside `dmkit luks` they are clap aliases.)
fn cryptsetup_name(command: &str) -> Option<&'static [&'static str]> {
    const NAMES: &[(&str, &[&str])] = &[
        ("luksFormat", &["luks", "format"]),
        ("luksOpen", &["luks", "open"]),
        ("luksDump", &["luks", "dump"]),
        ("luksAddKey", &["luks", "add-key"]),
        ("luksRemoveKey", &["luks", "remove-key"]),
        ("luksChangeKey", &["luks", "change-key"]),
        ("luksKillSlot", &["luks", "kill-slot"]),
        ("luksUUID", &["luks", "uuid"]),
        ("luksHeaderBackup", &["luks", "header-backup"]),
        ("luksHeaderRestore", &["luks", "header-restore"]),
        ("luksClose", &["close"]),
        ("isLuks", &["luks", "is-luks"]),
        ("convert", &["luks", "convert"]),
        ("luksConvertKey", &["luks", "convert-key"]),
        ("erase", &["luks", "erase"]),
        ("luksErase", &["luks", "erase"]),
        ("config", &["luks", "config"]),
        ("token", &["luks", "token"]),
        ("resize", &["luks", "resize"]),
        ("luksSuspend", &["luks", "suspend"]),
        ("luksResume", &["luks", "resume"]),
        ("refresh", &["luks", "refresh"]),
        ("reencrypt", &["luks", "reencrypt"]),
    ];
    NAMES.iter().find(|(n, _)| *n == command).map(|(_, w)| *w)
}

/// `--help` and `--version` print as usual; a usage error becomes one line and exit 1, like
/// every other error of ours (clap's default would be several lines and exit 2, which here
/// means "verification failed").
fn usage_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return 0;
        }
        // `dmkit` or `dmkit verity` alone: the help, on stderr, and a failure (nothing ran).
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", e.render());
            return 1;
        }
        _ => {}
    }
    let text = e.to_string();
    let message: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| {
            !l.is_empty() && !l.starts_with("tip:") && !l.starts_with("For more information")
        })
        .collect();
    let message = message.join(" ");
    eprintln!(
        "dmkit: {} (see --help)",
        message.trim_start_matches("error: ")
    );
    1
}
