//! `dmkit integrity format|dump|verify`, with integritysetup's options.
//!
//! Add further subcommands (`open`, `close`, `status`) as variants of [`IntegrityCommand`] and
//! arms of [`run`]; [`AlgArgs::hasher`] turns the algorithm options into a tagger for a
//! superblock.

use super::{CliError, CliResult};
use crate::block::{BlockDevice, FileDevice};
use crate::integrity::format::{self, FormatParams};
use crate::integrity::verify::{self, JournalState};
use crate::integrity::{
    dump, Geometry, GeometryOptions, IntegrityError, Superblock, TagAlgorithm, TagHasher,
};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// A key read from a key file (wiped on drop).
pub type Key = Zeroizing<Vec<u8>>;

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

/// The internal hash, as integritysetup spells it.
#[derive(clap::Args, Clone)]
pub struct AlgArgs {
    /// Integrity algorithm: crc32c, crc32, sha1, sha256, sha512, hmac-sha1, hmac-sha256,
    /// hmac-sha512.
    #[arg(short = 'I', long = "integrity", default_value = "crc32c")]
    integrity: String,
    /// Read the HMAC key from this file.
    #[arg(long)]
    integrity_key_file: Option<PathBuf>,
    /// Key size in bytes (default: the digest size of the HMAC).
    #[arg(long)]
    integrity_key_size: Option<usize>,
}

impl AlgArgs {
    /// The algorithm and its key, read and checked.
    pub fn algorithm_and_key(&self) -> Result<(TagAlgorithm, Option<Key>), CliError> {
        let alg = TagAlgorithm::from_name(&self.integrity)
            .ok_or_else(|| integrity_err(IntegrityError::Algorithm(self.integrity.clone())))?;
        match (&self.integrity_key_file, alg.keyed()) {
            (None, true) => Err(CliError::invalid(format!(
                "--integrity {alg}: needs --integrity-key-file"
            ))),
            (Some(f), false) => Err(CliError::invalid(format!(
                "--integrity-key-file {}: {alg} takes no key",
                f.display()
            ))),
            (None, false) => {
                if self.integrity_key_size.is_some() {
                    return Err(CliError::invalid(format!(
                        "--integrity-key-size: {alg} takes no key"
                    )));
                }
                Ok((alg, None))
            }
            (Some(f), true) => {
                let size = self.integrity_key_size.unwrap_or(alg.digest_size());
                if size == 0 || size > 4096 {
                    return Err(CliError::invalid(format!(
                        "--integrity-key-size: {size} is not in 1..=4096"
                    )));
                }
                let data = Zeroizing::new(std::fs::read(f).map_err(|e| {
                    CliError::invalid(format!("--integrity-key-file {}: {e}", f.display()))
                })?);
                if data.len() < size {
                    return Err(CliError::invalid(format!(
                        "--integrity-key-file {}: {} bytes, --integrity-key-size is {size}",
                        f.display(),
                        data.len()
                    )));
                }
                Ok((alg, Some(Zeroizing::new(data[..size].to_vec()))))
            }
        }
    }

    /// The tagger for the volume `sb` describes.
    pub fn hasher(&self, sb: &Superblock) -> Result<TagHasher, CliError> {
        let (alg, key) = self.algorithm_and_key()?;
        let salt = sb
            .has(crate::integrity::superblock::SB_FLAG_FIXED_HMAC)
            .then_some(sb.salt);
        TagHasher::new(
            alg,
            key.as_deref().map(|k| &k[..]),
            salt,
            usize::from(sb.integrity_tag_size),
            sb.sector_size() as usize,
        )
        .map_err(integrity_err)
    }
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

/// An integrity error as a one-line CLI error (exit 1).
pub fn integrity_err(e: IntegrityError) -> CliError {
    CliError::invalid(e.to_string())
}

/// An error naming the file (I/O errors name it already).
fn named(path: &Path, e: IntegrityError) -> CliError {
    match e {
        IntegrityError::Io(_) => CliError::invalid(e.to_string()),
        e => CliError::invalid(format!("{}: {e}", path.display())),
    }
}

/// Open `path` for a format (claimed exclusively) or a scrub: direct I/O where the file
/// system takes it and the size is whole 4 KiB blocks (the last chunk must be aligned too),
/// else through the page cache.
fn open_direct_or_buffered(path: &Path, write: bool) -> Result<FileDevice, CliError> {
    let open = |direct| {
        if write {
            super::files::open_backing(path, false, direct)
        } else {
            super::files::open_device(path, true, direct)
        }
    };
    match open(true) {
        Ok(d) if d.size() % 4096 == 0 => Ok(d),
        Ok(d) => {
            drop(d);
            open(false)
        }
        // tmpfs and a few others refuse O_DIRECT.
        Err(e) if e.code == 1 => open(false),
        Err(e) => Err(e),
    }
}

/// Read and parse the superblock of `dev`, with the error naming the file.
/// The superblock of `path`, refused as `open` refuses it ([`Superblock::check_supported`]).
fn read_superblock(dev: &FileDevice, path: &Path) -> Result<Superblock, CliError> {
    let sb = crate::integrity::superblock::read_superblock(dev).map_err(|e| named(path, e))?;
    sb.check_supported().map_err(|e| named(path, e))?;
    Ok(sb)
}

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
    if a.integrity_bitmap_mode && a.integrity_no_journal {
        return Err(CliError::invalid(
            "-B/--integrity-bitmap-mode and -D/--integrity-no-journal exclude each other",
        ));
    }
    if !a.integrity_bitmap_mode
        && (a.bitmap_sectors_per_bit.is_some() || a.bitmap_flush_time.is_some())
    {
        return Err(CliError::invalid(
            "--bitmap-sectors-per-bit/--bitmap-flush-time: only with -B/--integrity-bitmap-mode",
        ));
    }
    if (a.integrity_bitmap_mode || a.integrity_no_journal)
        && (a.journal_watermark.is_some() || a.journal_commit_time.is_some())
    {
        return Err(CliError::invalid(
            "--journal-watermark/--journal-commit-time: not without a journal (-B or -D)",
        ));
    }
    if let Some(w) = a.journal_watermark {
        if w > 100 {
            return Err(CliError::invalid(format!(
                "--journal-watermark: {w} is not a percentage"
            )));
        }
    }
    if let Some(s) = a.bitmap_sectors_per_bit {
        if !s.is_power_of_two() {
            return Err(CliError::invalid(format!(
                "--bitmap-sectors-per-bit: {s} is not a power of two"
            )));
        }
    }
    if !a.sector_size.is_power_of_two() || !(512..=4096).contains(&a.sector_size) {
        return Err(CliError::invalid(format!(
            "--sector-size: {} is not 512, 1024, 2048 or 4096",
            a.sector_size
        )));
    }
    // integritysetup passes the size in whole sectors (rounded down; 0: the default).
    let journal_sectors = match a.journal_size {
        None => 0,
        Some(b) => u32::try_from(b / 512)
            .map_err(|_| CliError::invalid(format!("--journal-size: {b} bytes is too large")))?,
    };
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
    let mut params = FormatParams {
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
    let dev = open_direct_or_buffered(&a.device, true)?;
    let _claim = super::files::claim(dev.file(), &a.device, 0, 0, true)?;
    let data = match &a.data_device {
        None => None,
        Some(p) => {
            if same_file(p, &a.device) {
                return Err(CliError::invalid(format!(
                    "--data-device {}: is the device itself",
                    p.display()
                )));
            }
            let d = open_direct_or_buffered(p, true)?;
            let claim = super::files::claim(d.file(), p, 0, 0, true)?;
            params.data_device_bytes = Some(d.size());
            Some((d, claim))
        }
    };
    let plan = format::plan(&params, dev.size()).map_err(|e| named(&a.device, e))?;
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
    let mut progress = progress_printer("Wiping");
    let data_dev = data.as_ref().map(|(d, _)| d as &dyn BlockDevice);
    format::write(&dev, data_dev, &plan, &mut progress).map_err(|e| named(&a.device, e))?;
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
    let dev = super::files::open_device(&a.device, true, false)?;
    let sb = read_superblock(&dev, &a.device)?;
    let name = a.device.display().to_string();
    if a.json {
        let g = Geometry::new(&sb, dev.size() / 512, &GeometryOptions::default()).ok();
        println!("{:#}", dump::json(&sb, &name, g.as_ref()));
    } else {
        print!("{}", dump::text(&sb, &name));
    }
    Ok(())
}

fn verify_cmd(a: VerifyArgs) -> CliResult {
    // Direct reads where the filesystem takes them: a scrub reads everything once.
    let dev = open_direct_or_buffered(&a.device, false)?;
    let _claim = super::files::claim(dev.file(), &a.device, 0, 0, false)?;
    let data = match &a.data_device {
        None => None,
        Some(p) => {
            let d = open_direct_or_buffered(p, false)?;
            let claim = super::files::claim(d.file(), p, 0, 0, false)?;
            Some((d, claim))
        }
    };
    let sb = read_superblock(&dev, &a.device)?;
    let (data_sectors, opts) = match &data {
        None => (dev.size() / 512, GeometryOptions::default()),
        Some((d, _)) => (
            d.size() / 512,
            GeometryOptions {
                meta_device_sectors: Some(dev.size() / 512),
                ..GeometryOptions::default()
            },
        ),
    };
    let g = Geometry::new(&sb, data_sectors, &opts).map_err(|e| named(&a.device, e))?;
    let h = a.alg.hasher(&sb)?;
    let mut progress = progress_printer("Verifying");
    let threads = crate::integrity::tags::hashing_threads();
    let data_dev: &dyn BlockDevice = match &data {
        Some((d, _)) => d,
        None => &dev,
    };
    let r = verify::verify(data_dev, &dev, &sb, &g, &h, threads, &mut progress)
        .map_err(|e| named(&a.device, e))?;
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
                ranges(&r.stale_sectors, u64::from(g.sectors_per_block()))
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
                ranges(&r.bad_sectors, u64::from(g.sectors_per_block()))
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

/// Whether two paths name the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Sector numbers of blocks as ranges ("0, 8-24" with 8-sector blocks): every block named.
fn ranges(sectors: &[u64], step: u64) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sectors.len() {
        let mut j = i;
        while j + 1 < sectors.len() && sectors[j + 1] == sectors[j] + step {
            j += 1;
        }
        out.push(if i == j {
            sectors[i].to_string()
        } else {
            format!("{}-{}", sectors[i], sectors[j])
        });
        i = j + 1;
    }
    out.join(", ")
}
