//! `dmkit integrity open DEVICE NAME`: serve a dm-integrity device read-write, in the kernel's
//! modes J (journal, the default), B (`--integrity-bitmap-mode`), D (`--integrity-no-journal`)
//! or R (`--integrity-recovery-mode`, read-only and unchecked), with integritysetup's options.
//!
//! A read whose tag does not match fails with EIO through the export (the kernel's EILSEQ),
//! is logged with the block number, and counted in `status` as a corruption.

use super::CliResult;
use crate::integrity::volume::IntegrityVolume;
use crate::integrity::{IntegrityOptions, Mode};
use std::path::PathBuf;

/// Arguments of `dmkit integrity open`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// The dm-integrity formatted file or block device.
    pub device: PathBuf,
    /// Name of the device.
    pub name: String,
    #[command(flatten)]
    pub alg: super::integrity_alg::AlgArgs,
    /// Bitmap mode (B): dirty regions recalculated after an unclean stop.
    #[arg(short = 'B', long, conflicts_with_all = ["integrity_no_journal", "integrity_recovery_mode"])]
    pub integrity_bitmap_mode: bool,
    /// Direct mode (D): no journal, no crash consistency.
    #[arg(short = 'D', long, conflicts_with = "integrity_recovery_mode")]
    pub integrity_no_journal: bool,
    /// Recovery mode (R): no tag checks, no replay, read-only.
    #[arg(short = 'R', long)]
    pub integrity_recovery_mode: bool,
    /// Journal watermark in percent: commit and write back when the journal is this full.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub journal_watermark: u32,
    /// Commit the journal this many milliseconds after a write at the latest.
    #[arg(long, default_value_t = 10_000)]
    pub journal_commit_time: u32,
    /// Mode B: clear the dirty bitmap this many milliseconds after it was set.
    #[arg(long, default_value_t = 10_000)]
    pub bitmap_flush_time: u32,
    /// Mode B: sectors per bitmap bit (the kernel's default 32768).
    #[arg(long)]
    pub bitmap_sectors_per_bit: Option<u64>,
    #[command(flatten)]
    pub serve: super::device::ServeArgs,
}

/// Run `dmkit integrity open`.
pub fn open(a: OpenArgs) -> CliResult {
    let how = a.serve.prepare(&a.name)?;
    let (alg, key) = a.alg.algorithm_and_key()?;
    let mode = if a.integrity_recovery_mode {
        Mode::Recovery
    } else if a.integrity_bitmap_mode {
        Mode::Bitmap
    } else if a.integrity_no_journal {
        Mode::Direct
    } else {
        Mode::Journal
    };
    let mut opts = IntegrityOptions::new(&a.name, mode, alg);
    opts.key = key;
    opts.journal_watermark = a.journal_watermark;
    opts.commit_time_ms = a.journal_commit_time;
    opts.bitmap_flush_ms = a.bitmap_flush_time;
    opts.sectors_per_bit = a.bitmap_sectors_per_bit;
    let activated = IntegrityVolume::activate(&a.device, opts)?;
    a.serve.serve(activated, how)
}
