//! `dmkit integrity format|dump|verify`, with integritysetup's options.
//!
//! Add further subcommands (`open`, `close`, `status`) as variants of [`IntegrityCommand`] and
//! arms of [`run`]; [`AlgArgs::hasher`] turns the algorithm options into a tagger for a
//! superblock.

use super::integrity_alg::AlgArgs;
use super::{CliError, CliResult};
use crate::integrity::format::{FormatParams, FormatPlan};
use crate::integrity::verify::JournalState;
use crate::integrity::volume::{FormatChecks, IntegrityVolume};
use crate::integrity::{dump, Geometry, GeometryOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

/// `dmkit integrity` subcommands.
#[derive(clap::Subcommand)]
pub enum IntegrityCommand {
    /// Write a dm-integrity superblock and journal, and (unless --no-wipe) zero every sector
    /// with a valid tag, as `integritysetup format` does, in userspace and at disk speed.
    Format(FormatArgs),
    /// Print the superblock (like `integritysetup dump`).
    Dump(DumpArgs),
    /// Check every sector's tag offline and list the bad ones (exit 2 if any).
    Verify(VerifyArgs),
    /// Serve a dm-integrity DEVICE read-write at $DMKIT_RUN_DIR/NAME (default
    /// /run/dmkit/NAME), like `integritysetup open`, until `dmkit integrity close NAME`.
    Open(super::integrity_open::OpenArgs),
    /// Tear down an open dm-integrity device (cleanly: journal written back, bitmap cleared).
    Close(super::device::CloseArgs),
    /// Show an open dm-integrity device.
    Status(super::device::StatusArgs),
}

/// Arguments of `integrity format`.
#[derive(clap::Args)]
pub struct FormatArgs {
    /// Device or image file.
    device: PathBuf,
    #[command(flatten)]
    alg: AlgArgs,
    /// Tag size in bytes (default: the digest size).
    #[arg(short = 't', long)]
    tag_size: Option<u16>,
    /// Sector size: 512, 1024, 2048 or 4096.
    #[arg(short = 's', long, default_value_t = 512)]
    sector_size: u32,
    /// Data sectors between metadata runs (default 32768).
    #[arg(long)]
    interleave_sectors: Option<u32>,
    /// Journal size in bytes, rounded down to sectors (default: 1/128 of the device, at most
    /// 64 MiB).
    #[arg(short = 'j', long)]
    journal_size: Option<u64>,
    /// Journal watermark in percent (an activation option: checked, not stored).
    #[arg(long)]
    journal_watermark: Option<u32>,
    /// Journal commit time in ms (an activation option: checked, not stored).
    #[arg(long)]
    journal_commit_time: Option<u32>,
    /// Metadata buffer size in sectors.
    #[arg(long)]
    buffer_sectors: Option<u32>,
    /// Bitmap mode instead of a journal.
    #[arg(short = 'B', long)]
    integrity_bitmap_mode: bool,
    /// 512-byte sectors per bitmap bit (bitmap mode).
    #[arg(long)]
    bitmap_sectors_per_bit: Option<u64>,
    /// Bitmap flush time in ms (bitmap mode; an activation option: checked, not stored).
    #[arg(long)]
    bitmap_flush_time: Option<u32>,
    /// No journal (direct writes; an activation option: the journal is still laid out).
    #[arg(short = 'D', long)]
    integrity_no_journal: bool,
    /// Do not zero the data and write its tags (reads of unwritten sectors then fail).
    #[arg(long)]
    no_wipe: bool,
    /// Separate data device: DEVICE then holds only the superblock, journal and tags.
    #[arg(long)]
    data_device: Option<PathBuf>,
    /// Do not ask for confirmation (without it, a format asks for YES on a terminal and is
    /// refused without one).
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Pin the 16-byte salt (hex), for tests.
    #[arg(long, hide = true)]
    salt: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `integrity dump`.
#[derive(clap::Args)]
pub struct DumpArgs {
    /// Device or image file.
    device: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `integrity verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Device or image file.
    device: PathBuf,
    #[command(flatten)]
    alg: AlgArgs,
    /// Separate data device (DEVICE holds the superblock, journal and tags).
    #[arg(long)]
    data_device: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Run an `integrity` subcommand.
pub fn run(c: IntegrityCommand) -> CliResult {
    match c {
        IntegrityCommand::Format(a) => format_cmd(a),
        IntegrityCommand::Dump(a) => dump_cmd(a),
        IntegrityCommand::Verify(a) => verify_cmd(a),
        IntegrityCommand::Open(a) => super::integrity_open::open(a),
        IntegrityCommand::Close(a) => super::device::close(a),
        IntegrityCommand::Status(a) => super::device::status(a),
    }
}

/// A progress line on stderr ("Wiping:  42%"), only on a terminal.
pub(super) fn progress_printer(what: &'static str) -> impl FnMut(u64, u64) {
    let tty = std::io::stderr().is_terminal();
    let mut last = u64::MAX;
    move |done, total| {
        if !tty || total == 0 {
            return;
        }
        let pct = done * 100 / total;
        if pct != last {
            last = pct;
            eprint!("\r{what}: {pct:3}%");
            if done >= total {
                eprintln!();
            }
        }
    }
}

fn format_cmd(a: FormatArgs) -> CliResult {
    let checks = FormatChecks {
        bitmap_mode: a.integrity_bitmap_mode,
        no_journal: a.integrity_no_journal,
        bitmap_sectors_per_bit: a.bitmap_sectors_per_bit,
        bitmap_flush_time: a.bitmap_flush_time,
        journal_watermark: a.journal_watermark,
        journal_commit_time: a.journal_commit_time,
        sector_size: a.sector_size,
        journal_size: a.journal_size,
    };
    let journal_sectors = checks.check()?;
    let (alg, key) = a.alg.algorithm_and_key()?;
    let salt = match &a.salt {
        None => None,
        Some(h) => {
            let v = hex::decode(h)
                .ok()
                .filter(|v| v.len() == 16)
                .ok_or_else(|| {
                    CliError::invalid(format!("--salt: {h:?} is not 16 bytes of hex"))
                })?;
            let mut s = [0u8; 16];
            s.copy_from_slice(&v);
            Some(s)
        }
    };
    let params = FormatParams {
        algorithm: alg,
        key,
        tag_size: a.tag_size,
        sector_size: a.sector_size,
        interleave_sectors: a.interleave_sectors.unwrap_or(0),
        journal_sectors,
        buffer_sectors: a.buffer_sectors.unwrap_or(0),
        sectors_per_bit: a.bitmap_sectors_per_bit,
        bitmap_mode: a.integrity_bitmap_mode,
        salt,
        wipe: !a.no_wipe,
        data_device_bytes: None,
        external_tags: false,
    };
    let before_write = |plan: &FormatPlan| -> CliResult {
        // integritysetup asks before every format; what the devices hold is named first.
        let mut warnings = super::confirm::signature_warnings(&a.device, 0)?;
        if let Some(p) = &a.data_device {
            warnings.extend(super::confirm::signature_warnings(p, 0)?);
        }
        super::confirm::Confirm {
            batch: a.batch_mode,
            warnings,
            question: super::confirm::overwrite_question(&a.device),
            action: &format!("format {}", a.device.display()),
            aborted: "Operation aborted.",
            code: 1,
        }
        .ask()?;
        let tag_size = plan.superblock.integrity_tag_size;
        if usize::from(tag_size) != alg.digest_size() && !a.json {
            eprintln!(
                "WARNING: Requested tag size {tag_size} bytes differs from {} size output ({} bytes).",
                alg.kernel_name(),
                alg.digest_size()
            );
        }
        Ok(())
    };
    let mut progress = progress_printer("Wiping");
    let plan = IntegrityVolume::format(
        &a.device,
        a.data_device.as_deref(),
        params,
        before_write,
        &mut progress,
    )?;
    let tag_size = plan.superblock.integrity_tag_size;
    if a.json {
        let mut j = dump::json(
            &plan.superblock,
            &a.device.display().to_string(),
            Some(&plan.geometry),
        );
        j["integrity"] = alg.name().into();
        j["wiped"] = plan.wipe.into();
        println!("{j:#}");
    } else {
        println!(
            "Formatted with tag size {tag_size}, internal integrity {}.",
            alg.kernel_name()
        );
    }
    Ok(())
}

fn dump_cmd(a: DumpArgs) -> CliResult {
    let (sb, size) = IntegrityVolume::superblock(&a.device)?;
    let name = a.device.display().to_string();
    if a.json {
        let g = Geometry::new(&sb, size / 512, &GeometryOptions::default()).ok();
        println!("{:#}", dump::json(&sb, &name, g.as_ref()));
    } else {
        print!("{}", dump::text(&sb, &name));
    }
    Ok(())
}

fn verify_cmd(a: VerifyArgs) -> CliResult {
    let volume = IntegrityVolume::open(&a.device, a.data_device.as_deref())?;
    let g = volume.geometry()?;
    let h = a.alg.hasher(volume.sb())?;
    let mut progress = progress_printer("Verifying");
    let r = volume.verify(&g, &h, &mut progress)?;
    if a.json {
        let mut j = serde_json::to_value(&r).unwrap_or_default();
        j["device"] = a.device.display().to_string().into();
        j["sector_size"] = g.sector_size().into();
        println!("{j:#}");
    } else {
        let name = a.device.display();
        match &r.journal {
            JournalState::Clean => {}
            JournalState::Pending { entries, sectors } => println!(
                "{name}: the journal holds {entries} entries not yet written in place \
                 ({} in committed sections; the kernel replays them on open)",
                sectors.len()
            ),
            JournalState::DirtyBitmap { dirty_bits } => println!(
                "{name}: bitmap mode, dirty: {dirty_bits} regions may have stale tags \
                 (the kernel recalculates them on open)"
            ),
            JournalState::Unreadable { reason } => println!(
                "{name}: the journal is corrupt ({reason}): the kernel fails the device on open"
            ),
        }
        if let Some(s) = r.unchecked_from {
            println!("{name}: recalculation in progress: sectors from {s} on not checked");
        }
        if !r.stale_sectors.is_empty() {
            println!(
                "{name}: {} blocks with stale tags, explained by the journal or bitmap: \
                 sectors {}",
                r.stale_sectors.len(),
                super::ranges::ranges(&r.stale_sectors, u64::from(g.sectors_per_block()))
            );
        }
        if r.bad_sectors.is_empty() {
            println!(
                "{name}: {} blocks of {} bytes verified, no corruption",
                r.blocks_checked,
                g.sector_size()
            );
        } else {
            println!(
                "{name}: {} of {} blocks corrupt: sectors {}",
                r.bad_sectors.len(),
                r.blocks_checked,
                super::ranges::ranges(&r.bad_sectors, u64::from(g.sectors_per_block()))
            );
        }
    }
    if r.clean() {
        Ok(())
    } else if r.bad_sectors.is_empty() {
        Err(CliError::verification(format!(
            "{}: corrupt journal",
            a.device.display()
        )))
    } else {
        Err(CliError::verification(format!(
            "{}: {} corrupt blocks",
            a.device.display(),
            r.bad_sectors.len()
        )))
    }
}
