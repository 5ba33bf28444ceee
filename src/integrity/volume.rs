//! [`IntegrityVolume`]: one dm-integrity volume on a file or block device (and an optional
//! separate data device), with its verbs: [`format`](IntegrityVolume::format) (the
//! integritysetup option checks first, [`FormatChecks`]),
//! [`activate`](IntegrityVolume::activate), [`verify`](IntegrityVolume::verify) and
//! [`superblock`](IntegrityVolume::superblock) (what `dump` prints).
//!
//! ```no_run
//! use dmkit::integrity::volume::IntegrityVolume;
//! use dmkit::integrity::{format::FormatParams, IntegrityOptions, Mode, TagAlgorithm};
//! use std::path::Path;
//!
//! let path = Path::new("integrity.img");
//! let params = FormatParams::new(TagAlgorithm::Crc32c);
//! IntegrityVolume::format(path, None, params, |_| Ok::<(), dmkit::integrity::volume::VolumeError>(()), &mut |_, _| {})?;
//! let opts = IntegrityOptions::new("vol", Mode::Journal, TagAlgorithm::Crc32c);
//! let activated = IntegrityVolume::activate(path, opts)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::format::{self, FormatParams, FormatPlan};
use super::verify::VerifyReport;
use super::{
    Geometry, GeometryOptions, IntegrityDevice, IntegrityError, IntegrityOptions, Mode, Superblock,
    TagHasher,
};
use crate::block::{Activated, BlockDevice, Claim, ClaimError, FileDevice, OpenError};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why an integrity volume could not be formatted, opened, verified or activated.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A device could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A device could not be claimed.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// Options that do not go together (the message names the option).
    #[error("{0}")]
    Invalid(String),
    /// The integrity layer refused or failed on the device at `path`; the message names it.
    #[error("{}", named_text(path, source))]
    Integrity {
        /// The device.
        path: PathBuf,
        /// What went wrong.
        source: IntegrityError,
    },
}

/// An integrity error naming the file (I/O errors name it already).
fn named_text(path: &Path, e: &IntegrityError) -> String {
    match e {
        IntegrityError::Io(_) => e.to_string(),
        e => format!("{}: {e}", path.display()),
    }
}

crate::block::open::volume_failure!(VolumeError);

impl VolumeError {
    /// integritysetup's exit code: 4 for a missing device, 5 for a busy one, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            VolumeError::Open(e) => e.exit_code(),
            VolumeError::Claim(ClaimError::Busy { .. }) => 5,
            _ => 1,
        }
    }

    fn named(path: &Path) -> impl FnOnce(IntegrityError) -> VolumeError + '_ {
        move |source| VolumeError::Integrity {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Result type of [`IntegrityVolume`].
pub type Result<T> = std::result::Result<T, VolumeError>;

/// The format options integritysetup checks before anything is opened: the mode options that
/// exclude each other, and the ranges of the numbers.
#[derive(Debug, Clone, Default)]
pub struct FormatChecks {
    /// `-B`: bitmap mode.
    pub bitmap_mode: bool,
    /// `-D`: no journal.
    pub no_journal: bool,
    /// `--bitmap-sectors-per-bit`.
    pub bitmap_sectors_per_bit: Option<u64>,
    /// `--bitmap-flush-time`.
    pub bitmap_flush_time: Option<u32>,
    /// `--journal-watermark`.
    pub journal_watermark: Option<u32>,
    /// `--journal-commit-time`.
    pub journal_commit_time: Option<u32>,
    /// `--sector-size`.
    pub sector_size: u32,
    /// `--journal-size` in bytes.
    pub journal_size: Option<u64>,
}

impl FormatChecks {
    /// Check the options; returns the journal size in whole 512-byte sectors (rounded down,
    /// as integritysetup passes it; 0: the default).
    pub fn check(&self) -> Result<u32> {
        let invalid = |m: &str| Err(VolumeError::Invalid(m.to_string()));
        if self.bitmap_mode && self.no_journal {
            return invalid(
                "-B/--integrity-bitmap-mode and -D/--integrity-no-journal exclude each other",
            );
        }
        if !self.bitmap_mode
            && (self.bitmap_sectors_per_bit.is_some() || self.bitmap_flush_time.is_some())
        {
            return invalid(
                "--bitmap-sectors-per-bit/--bitmap-flush-time: only with -B/--integrity-bitmap-mode",
            );
        }
        if (self.bitmap_mode || self.no_journal)
            && (self.journal_watermark.is_some() || self.journal_commit_time.is_some())
        {
            return invalid(
                "--journal-watermark/--journal-commit-time: not without a journal (-B or -D)",
            );
        }
        if let Some(w) = self.journal_watermark {
            if w > 100 {
                return invalid(&format!("--journal-watermark: {w} is not a percentage"));
            }
        }
        if let Some(s) = self.bitmap_sectors_per_bit {
            if !s.is_power_of_two() {
                return invalid(&format!(
                    "--bitmap-sectors-per-bit: {s} is not a power of two"
                ));
            }
        }
        if !self.sector_size.is_power_of_two() || !(512..=4096).contains(&self.sector_size) {
            return invalid(&format!(
                "--sector-size: {} is not 512, 1024, 2048 or 4096",
                self.sector_size
            ));
        }
        match self.journal_size {
            None => Ok(0),
            Some(b) => u32::try_from(b / 512).map_err(|_| {
                VolumeError::Invalid(format!("--journal-size: {b} bytes is too large"))
            }),
        }
    }
}

/// Open `path` for a format (claimed exclusively) or a scrub: direct I/O where the file
/// system takes it and the size is whole 4 KiB blocks (the last chunk must be aligned too),
/// else through the page cache.
fn open_direct_or_buffered(path: &Path, write: bool) -> Result<FileDevice> {
    let open = |direct| {
        if write {
            crate::block::open_backing(path, false, direct)
        } else {
            crate::block::open_device(path, true, direct)
        }
    };
    Ok(match open(true) {
        Ok(d) if d.size() % 4096 == 0 => d,
        Ok(d) => {
            drop(d);
            open(false)?
        }
        // tmpfs and a few others refuse O_DIRECT.
        Err(e) if e.exit_code() == 1 => open(false)?,
        Err(e) => return Err(e.into()),
    })
}

/// `path` opened (direct where possible) and claimed: exclusively to write, shared to read.
fn open_claimed(path: &Path, write: bool) -> Result<(FileDevice, Claim)> {
    let dev = open_direct_or_buffered(path, write)?;
    let claim = Claim::take(dev.file(), path, 0, 0, write)?;
    Ok((dev, claim))
}

/// Whether two paths name the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// A dm-integrity volume opened offline (to verify it): the device holding the superblock,
/// the journal and the tags, an optional separate data device, the claims on both and the
/// superblock.
pub struct IntegrityVolume {
    dev: FileDevice,
    path: PathBuf,
    data: Option<FileDevice>,
    superblock: Superblock,
    _claims: Vec<Claim>,
}

impl IntegrityVolume {
    /// Format `path` (with a separate data device `data` if given) as `params` say: plan the
    /// layout, call `before_write(plan)` (a prompt may refuse there), then write, zeroing and
    /// tagging every sector unless `params.wipe` is off; `progress(done, total)` in bytes.
    /// Returns the plan written.
    pub fn format<E: From<VolumeError>>(
        path: &Path,
        data: Option<&Path>,
        mut params: FormatParams,
        before_write: impl FnOnce(&FormatPlan) -> std::result::Result<(), E>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> std::result::Result<FormatPlan, E> {
        let (dev, _claim) = open_claimed(path, true)?;
        let data = match data {
            None => None,
            Some(p) => {
                if same_file(p, path) {
                    return Err(VolumeError::Invalid(format!(
                        "--data-device {}: is the device itself",
                        p.display()
                    ))
                    .into());
                }
                let (d, claim) = open_claimed(p, true)?;
                params.data_device_bytes = Some(d.size());
                Some((d, claim))
            }
        };
        let plan = format::plan(&params, dev.size()).map_err(VolumeError::named(path))?;
        before_write(&plan)?;
        let data_dev = data.as_ref().map(|(d, _)| d as &dyn BlockDevice);
        format::write(&dev, data_dev, &plan, progress).map_err(VolumeError::named(path))?;
        Ok(plan)
    }

    /// Open `path` (and the separate data device `data`) to read them, claimed shared, and
    /// read the superblock, refused as activation refuses it.
    pub fn open(path: &Path, data: Option<&Path>) -> Result<Self> {
        // Direct reads where the filesystem takes them: a scrub reads everything once.
        let (dev, claim) = open_claimed(path, false)?;
        let mut claims = vec![claim];
        let data = match data {
            None => None,
            Some(p) => {
                let (d, claim) = open_claimed(p, false)?;
                claims.push(claim);
                Some(d)
            }
        };
        let superblock = read_checked_superblock(&dev, path)?;
        Ok(IntegrityVolume {
            dev,
            path: path.to_path_buf(),
            data,
            superblock,
            _claims: claims,
        })
    }

    /// The superblock of `path` and the device's size in bytes, read without claiming it
    /// (what `integrity dump` prints).
    pub fn superblock(path: &Path) -> Result<(Superblock, u64)> {
        let dev = crate::block::open_device(path, true, false)?;
        Ok((read_checked_superblock(&dev, path)?, dev.size()))
    }

    /// The volume's superblock.
    pub fn sb(&self) -> &Superblock {
        &self.superblock
    }

    /// The layout of the volume.
    pub fn geometry(&self) -> Result<Geometry> {
        let (data_sectors, opts) = match &self.data {
            None => (self.dev.size() / 512, GeometryOptions::default()),
            Some(d) => (
                d.size() / 512,
                GeometryOptions {
                    meta_device_sectors: Some(self.dev.size() / 512),
                    ..GeometryOptions::default()
                },
            ),
        };
        Geometry::new(&self.superblock, data_sectors, &opts).map_err(VolumeError::named(&self.path))
    }

    /// Check every sector's tag with `hasher` (made for this superblock), on all hashing
    /// threads; `progress(done, total)` in blocks.
    pub fn verify(
        &self,
        g: &Geometry,
        hasher: &TagHasher,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport> {
        let threads = super::tags::hashing_threads();
        let data: &dyn BlockDevice = match &self.data {
            Some(d) => d,
            None => &self.dev,
        };
        super::verify::verify(
            data,
            &self.dev,
            &self.superblock,
            g,
            hasher,
            threads,
            progress,
        )
        .map_err(VolumeError::named(&self.path))
    }

    /// Open `path` read-write (read-only in recovery mode), claimed, as `opts` say (replaying
    /// the journal, recalculating a dirty bitmap) and activate it as `opts.name`: kind
    /// "integrity", details with the mode, algorithm, layout, options and what open found.
    pub fn activate(path: &Path, opts: IntegrityOptions) -> Result<Activated> {
        let mode = opts.mode;
        let read_only = mode == Mode::Recovery;
        let dev = crate::block::open_backing(path, read_only, false)?;
        let claim = Claim::take(dev.file(), path, 0, 0, !read_only)?;
        let name = opts.name.clone();
        let alg = opts.alg;
        let (watermark, commit, flush) = (
            opts.journal_watermark,
            opts.commit_time_ms,
            opts.bitmap_flush_ms,
        );
        let integrity = IntegrityDevice::open(Arc::new(dev), opts).map_err(|e| match e {
            super::OpenError::Invalid(m) => VolumeError::Invalid(m),
            super::OpenError::Io(e) => VolumeError::Invalid(format!("{}: {e}", path.display())),
        })?;
        let l = integrity.layout().clone();
        // What open found: a sentence for the status line, as the kernel's log would say it.
        let replay = integrity
            .replay_report()
            .map(|r| match (r.replayed_sections, r.cleared) {
                (0, false) => "journal clean, nothing to replay".to_string(),
                (0, true) => "journal empty, re-initialised".to_string(),
                (n, _) => format!("{n} journal section(s) replayed at open"),
            });
        let stats = integrity.stats();
        let backing = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let details = json!({
            "backing": backing,
            "integrity_mode": mode.letter().to_string(),
            "integrity": alg.map(|a| a.name()),
            "tag_size": l.tag_size,
            "sector_size": l.block_size(),
            "interleave_sectors": 1u64 << l.log2_interleave,
            "journal_sections": l.journal_sections,
            "provided_data_sectors": l.provided_data_sectors,
            "journal_watermark": watermark,
            "journal_commit_time_ms": commit,
            "bitmap_flush_time_ms": flush,
            "replay": replay,
        });
        Ok(Activated {
            name,
            device: Arc::new(integrity),
            kind: "integrity".to_string(),
            details,
            stats: Some(Arc::new(move || stats.to_json())),
            claims: vec![claim],
            allow_discards: false,
            online: None,
        })
    }
}

/// The superblock of `dev` (at `path`), refused as `open` refuses it
/// ([`Superblock::check_supported`]).
fn read_checked_superblock(dev: &FileDevice, path: &Path) -> Result<Superblock> {
    let sb = super::superblock::read_superblock(dev).map_err(VolumeError::named(path))?;
    sb.check_supported().map_err(VolumeError::named(path))?;
    Ok(sb)
}
