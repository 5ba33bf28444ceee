//! `dmkit plain open`: dm-crypt plain mode, with `cryptsetup open --type plain` semantics.
//!
//! The key is read raw from `--key-file` (exactly `--key-size` bits at `--keyfile-offset`; as
//! in cryptsetup, `--keyfile-size` is ignored in plain mode with a key file, and no hash is
//! applied). `--offset` (data start) and `--skip` (IV offset) count 512-byte sectors.
//! Interactive passphrases (hashed with `--hash`) are not supported.

use super::{CliError, CliResult};
use crate::crypt::plain::{PlainParams, PlainVolume};
use std::path::PathBuf;

/// `dmkit plain` subcommands.
#[derive(clap::Subcommand)]
pub enum PlainCommand {
    /// Serve DEVICE decrypted with a raw key at $DMKIT_RUN_DIR/NAME (default /run/dmkit/NAME),
    /// like `cryptsetup open --type plain`, until `dmkit close NAME`.
    Open(OpenArgs),
}

/// Arguments of `dmkit plain open`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// The encrypted file or block device.
    pub device: PathBuf,
    /// Name of the device.
    pub name: String,
    /// Cipher, dm-crypt style (aes-xts-plain64, aes-cbc-essiv:sha256, ...).
    #[arg(short = 'c', long, default_value = "aes-cbc-essiv:sha256")]
    pub cipher: String,
    /// Key size in bits (XTS: 256 or 512; CBC: 128, 192 or 256).
    #[arg(short = 's', long, default_value_t = 256)]
    pub key_size: usize,
    /// File holding the raw key (`-` for standard input).
    #[arg(short = 'd', long)]
    pub key_file: Option<PathBuf>,
    /// Bytes to skip at the start of the key file.
    #[arg(long, default_value_t = 0)]
    pub keyfile_offset: u64,
    /// Ignored in plain mode with a key file, as in cryptsetup (the key size is read).
    #[arg(short = 'l', long)]
    pub keyfile_size: Option<u64>,
    /// Start of the encrypted data on DEVICE, in 512-byte sectors.
    #[arg(short = 'o', long, default_value_t = 0)]
    pub offset: u64,
    /// IV offset: sectors to add to the IV sector number, in 512-byte sectors.
    #[arg(short = 'p', long, default_value_t = 0)]
    pub skip: u64,
    /// Size of the device in 512-byte sectors (default: DEVICE from --offset to the end).
    #[arg(short = 'b', long)]
    pub size: Option<u64>,
    /// Encryption sector size in bytes: 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 512)]
    pub sector_size: u32,
    /// Count IVs in --sector-size units instead of 512-byte sectors.
    #[arg(long)]
    pub iv_large_sectors: bool,
    /// Pass discards down to DEVICE.
    #[arg(long)]
    pub allow_discards: bool,
    /// Refuse writes.
    #[arg(short = 'r', long)]
    pub read_only: bool,
    #[command(flatten)]
    pub serve: super::device::ServeArgs,
}

/// Run a `dmkit plain` subcommand.
pub fn run(c: PlainCommand) -> CliResult {
    match c {
        PlainCommand::Open(a) => open(a),
    }
}

fn open(a: OpenArgs) -> CliResult {
    let how = a.serve.prepare(&a.name)?;
    let volume = PlainVolume::new(PlainParams {
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        offset: a.offset,
        skip: a.skip,
        size: a.size,
        sector_size: a.sector_size,
        iv_large_sectors: a.iv_large_sectors,
        allow_discards: a.allow_discards,
        read_only: a.read_only,
    })?;
    let Some(key_file) = &a.key_file else {
        return Err(CliError::invalid(
            "plain open needs --key-file (interactive passphrases are not supported)",
        ));
    };
    if a.keyfile_size.is_some() {
        eprintln!(
            "dmkit: warning: --keyfile-size is ignored in plain mode with a key file; the read size is the key size ({} bytes)",
            volume.key_len()
        );
    }
    // As cryptsetup: exactly the key size is read at the offset (stdin read from descriptor 0
    // directly, into secret memory).
    let key = super::passphrase::read_passphrase(
        Some(key_file),
        a.keyfile_offset,
        Some(volume.key_len() as u32),
        "",
        false,
    )?;
    let active = volume.activate(&a.name, &a.device, &key)?;
    drop(key);
    a.serve.serve(active, how)
}
