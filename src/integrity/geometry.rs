//! Where everything of a dm-integrity device lives, computed as the kernel computes it
//! (`calculate_journal_section_size()`, `calculate_device_limits()`,
//! `get_provided_data_sectors()`, `get_area_and_offset()`, `get_data_sector()`,
//! `get_metadata_sector_and_offset()`).
//!
//! Without a separate metadata device the device is:
//!
//! ```text
//! | superblock (8 sectors) | journal (sections x section sectors) | area 0 | area 1 | ...
//! area n = | metadata run (tags of the area's blocks, padded) | 2^log2_interleave data sectors |
//! ```
//!
//! The last area holds only as many data sectors as remain of `provided_data_sectors`; its
//! metadata run is always whole. With a separate metadata device the data device holds only
//! data (logical sector = physical sector) and the metadata device holds the superblock, the
//! journal and then all tags in one run.
//!
//! All sector numbers here are 512-byte sectors, counted from the start of the device that
//! holds them.

use super::error::{IntegrityError, Result};
use super::superblock::{
    Superblock, SB_FLAG_FIXED_PADDING, SB_FLAG_HAVE_JOURNAL_MAC, SB_FLAG_INLINE, SB_SECTORS,
};

/// Sectors in the block at the start of every journal section that holds its entries.
pub const JOURNAL_BLOCK_SECTORS: u32 = 8;
/// Bytes of a journal sector before its commit id.
pub const JOURNAL_SECTOR_DATA: u32 = 512 - 8;
/// Bytes of MAC per journal sector when the journal has a MAC.
pub const JOURNAL_MAC_PER_SECTOR: u32 = 8;
/// Journal entries are rounded up to this many bytes.
pub const JOURNAL_ENTRY_ROUNDUP: u32 = 8;
/// Sectors the kernel keeps free after the journal (`METADATA_PADDING_SECTORS`).
pub const METADATA_PADDING_SECTORS: u64 = 8;
/// Default interleave (sectors of data between metadata runs).
pub const DEFAULT_INTERLEAVE_SECTORS: u32 = 32768;
/// Default metadata buffer size in sectors.
pub const DEFAULT_BUFFER_SECTORS: u32 = 128;
/// Default sectors per bitmap bit (bitmap mode).
pub const DEFAULT_SECTORS_PER_BITMAP_BIT: u64 = 32768;
/// Size of one bitmap block in the journal area (bitmap mode).
pub const BITMAP_BLOCK_SIZE: u64 = 4096;
/// Largest default journal, in sectors (64-bit kernels).
pub const DEFAULT_MAX_JOURNAL_SECTORS: u64 = 131072;
/// The default journal is the device size shifted right by this.
pub const DEFAULT_JOURNAL_SIZE_FACTOR: u32 = 7;

/// The largest device handled: byte offsets must fit in 64 bits.
pub const MAX_DEVICE_SECTORS: u64 = u64::MAX >> 9;

/// Options of the mapping that shape the layout beyond the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeometryOptions {
    /// `buffer_sectors` (the metadata I/O unit; default 128). Only a metadata device's layout
    /// depends on it; without one it is clamped to the metadata run.
    pub buffer_sectors: u32,
    /// Size of a separate metadata device in sectors (`meta_device`), if there is one.
    pub meta_device_sectors: Option<u64>,
}

impl Default for GeometryOptions {
    fn default() -> Self {
        GeometryOptions {
            buffer_sectors: DEFAULT_BUFFER_SECTORS,
            meta_device_sectors: None,
        }
    }
}

/// One interleave area: a metadata run followed by its data sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    /// Area number.
    pub index: u64,
    /// First logical sector of the area.
    pub first_logical: u64,
    /// First sector of its metadata run (on the metadata device, or the device).
    pub metadata_start: u64,
    /// Sectors of its metadata run (the tags of the area, padded).
    pub metadata_sectors: u64,
    /// First physical data sector of the area (on the data device).
    pub data_start: u64,
    /// Data sectors in use in this area (the last one may be partial).
    pub data_sectors: u64,
}

/// The layout of a dm-integrity device. Build it with [`Geometry::new`] from a superblock, or
/// with [`Geometry::for_format`] to find the superblock a format writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    tag_size: u32,
    log2_tag_size: Option<u32>,
    log2_sectors_per_block: u32,
    log2_interleave_sectors: u32,
    journal_sections: u32,
    journal_entry_size: u32,
    journal_entries_per_sector: u32,
    journal_section_entries: u32,
    journal_section_sectors: u32,
    initial_sectors: u64,
    metadata_run: u64,
    log2_buffer_sectors: u32,
    provided_data_sectors: u64,
    max_provided_data_sectors: u64,
    data_device_sectors: u64,
    meta_device_sectors: Option<u64>,
}

/// The parts of the kernel's `dm_integrity_c` the layout functions read.
#[derive(Debug, Clone, Copy)]
struct Params {
    tag_size: u32,
    log2_sectors_per_block: u32,
    log2_interleave_sectors: u32,
    journal_sections: u32,
    fixed_padding: bool,
    journal_mac: bool,
    log2_buffer_sectors: u32,
    data_device_sectors: u64,
    meta_device_sectors: Option<u64>,
}

/// What `calculate_device_limits()` derives.
#[derive(Debug, Clone, Copy)]
struct Limits {
    journal_entry_size: u32,
    journal_entries_per_sector: u32,
    journal_section_entries: u32,
    journal_section_sectors: u32,
    initial_sectors: u64,
    metadata_run: u64,
}

impl Params {
    fn section_size(&self) -> (u32, u32, u32, u32) {
        let spb = 1u32 << self.log2_sectors_per_block;
        let entry =
            (8 + 8 * spb + self.tag_size).div_ceil(JOURNAL_ENTRY_ROUNDUP) * JOURNAL_ENTRY_ROUNDUP;
        let mut space = JOURNAL_SECTOR_DATA;
        if self.journal_mac {
            space -= JOURNAL_MAC_PER_SECTOR;
        }
        let per_sector = space / entry;
        let section_entries = per_sector * JOURNAL_BLOCK_SECTORS;
        let section_sectors =
            (section_entries << self.log2_sectors_per_block) + JOURNAL_BLOCK_SECTORS;
        (entry, per_sector, section_entries, section_sectors)
    }

    /// `calculate_device_limits()` for `provided` data sectors: `None` where the kernel says
    /// -EINVAL.
    fn limits(&self, provided: u64) -> Option<Limits> {
        let (entry, per_sector, section_entries, section_sectors) = self.section_size();
        let meta_sectors = self.meta_device_sectors.unwrap_or(self.data_device_sectors);
        let initial = SB_SECTORS + u64::from(section_sectors) * u64::from(self.journal_sections);
        if initial + METADATA_PADDING_SECTORS >= meta_sectors || initial > u64::from(u32::MAX) {
            return None;
        }
        let metadata_run;
        if self.meta_device_sectors.is_none() {
            let padding: u64 = if self.fixed_padding {
                METADATA_PADDING_SECTORS << 9
            } else {
                1u64 << 9 << METADATA_PADDING_SECTORS
            };
            let run_bytes = u64::from(self.tag_size)
                << (self.log2_interleave_sectors - self.log2_sectors_per_block);
            metadata_run = (run_bytes.div_ceil(padding) * padding) >> 9;
            if provided == 0 {
                return None;
            }
            let (area, offset) = self.area_and_offset(provided - 1);
            let last = self.data_sector(area, offset, initial, metadata_run)?;
            if last >= meta_sectors {
                return None;
            }
        } else {
            let buf_bytes = 1u64 << (self.log2_buffer_sectors + 9);
            let meta_size =
                (provided >> self.log2_sectors_per_block).checked_mul(u64::from(self.tag_size))?;
            let meta_size = meta_size.div_ceil(buf_bytes) << self.log2_buffer_sectors;
            let end = initial.checked_add(meta_size)?;
            if end > meta_sectors {
                return None;
            }
            metadata_run = 1;
        }
        Some(Limits {
            journal_entry_size: entry,
            journal_entries_per_sector: per_sector,
            journal_section_entries: section_entries,
            journal_section_sectors: section_sectors,
            initial_sectors: initial,
            metadata_run,
        })
    }

    fn area_and_offset(&self, logical: u64) -> (u64, u64) {
        if self.meta_device_sectors.is_none() {
            (
                logical >> self.log2_interleave_sectors,
                logical & ((1u64 << self.log2_interleave_sectors) - 1),
            )
        } else {
            (0, logical)
        }
    }

    /// `get_data_sector()`; `None` on overflow.
    fn data_sector(&self, area: u64, offset: u64, initial: u64, run: u64) -> Option<u64> {
        if self.meta_device_sectors.is_some() {
            return Some(offset);
        }
        area.checked_shl(self.log2_interleave_sectors)
            .filter(|v| v >> self.log2_interleave_sectors == area)?
            .checked_add((area + 1).checked_mul(run)?)?
            .checked_add(initial)?
            .checked_add(offset)
    }

    /// `get_provided_data_sectors()`: the largest size (a sum of powers of two of at least 8
    /// sectors, found bit by bit from the top) whose layout fits.
    fn max_provided(&self) -> u64 {
        if self.meta_device_sectors.is_some() {
            return self.data_device_sectors & !((1u64 << self.log2_sectors_per_block) - 1);
        }
        let dev = self.data_device_sectors;
        if dev == 0 {
            return 0;
        }
        let top = 63 - dev.leading_zeros();
        let mut provided = 0u64;
        let mut bit = top;
        while bit >= 3 {
            let prev = provided;
            provided |= 1u64 << bit;
            if self.limits(provided).is_none() {
                provided = prev;
            }
            bit -= 1;
        }
        provided
    }
}

fn log2_floor(v: u64) -> u32 {
    63 - v.leading_zeros()
}

/// What a format decides beyond the superblock fields: the kernel's constructor arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatLayout {
    /// Tag size in bytes.
    pub tag_size: u16,
    /// Block size in bytes (512..=4096, a power of two).
    pub sector_size: u32,
    /// `journal_sectors` (0: the kernel's default, 1/128 of the device up to 64 MiB).
    pub journal_sectors: u32,
    /// `interleave_sectors` (0: default 32768).
    pub interleave_sectors: u32,
    /// `fix_padding`.
    pub fixed_padding: bool,
    /// The volume has a journal MAC.
    pub journal_mac: bool,
    /// `buffer_sectors` (0: default 128).
    pub buffer_sectors: u32,
    /// Separate metadata device size in sectors.
    pub meta_device_sectors: Option<u64>,
}

/// The superblock fields a format computes (the kernel's `initialize_superblock()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatFields {
    /// `log2_interleave_sectors`.
    pub log2_interleave_sectors: u8,
    /// `journal_sections`.
    pub journal_sections: u32,
    /// `provided_data_sectors`.
    pub provided_data_sectors: u64,
    /// `log2_sectors_per_block`.
    pub log2_sectors_per_block: u8,
}

impl Geometry {
    /// The layout of the device `sb` describes, on a data device of `device_sectors`
    /// sectors. Refused (naming the field) when the superblock's `provided_data_sectors` do
    /// not fit the device, as the kernel refuses a table longer than what it computes.
    pub fn new(sb: &Superblock, device_sectors: u64, opts: &GeometryOptions) -> Result<Geometry> {
        sb.validate()?;
        for (what, v) in [
            ("data", Some(device_sectors)),
            ("metadata", opts.meta_device_sectors),
        ] {
            if v.is_some_and(|v| v > MAX_DEVICE_SECTORS) {
                return Err(IntegrityError::Geometry(format!(
                    "{what} device of {} sectors is larger than 2^64 bytes",
                    v.unwrap_or(0)
                )));
            }
        }
        if sb.flags & SB_FLAG_INLINE != 0 {
            return Err(IntegrityError::field(
                "flags",
                "inline mode (tags in the device's integrity profile) is not supported",
            ));
        }
        match (sb.log2_interleave_sectors, opts.meta_device_sectors) {
            (0, None) => {
                return Err(IntegrityError::field(
                    "log2_interleave_sectors",
                    "0 means a separate metadata device, and none was given",
                ))
            }
            (l, Some(_)) if l != 0 => {
                return Err(IntegrityError::field(
                    "log2_interleave_sectors",
                    format!("{l}: a volume with a separate metadata device has 0"),
                ))
            }
            _ => {}
        }
        let mut p = Params {
            tag_size: u32::from(sb.integrity_tag_size),
            log2_sectors_per_block: u32::from(sb.log2_sectors_per_block),
            log2_interleave_sectors: u32::from(sb.log2_interleave_sectors),
            journal_sections: sb.journal_sections,
            fixed_padding: sb.flags & SB_FLAG_FIXED_PADDING != 0,
            journal_mac: sb.flags & SB_FLAG_HAVE_JOURNAL_MAC != 0,
            log2_buffer_sectors: log2_floor(u64::from(opts.buffer_sectors.max(1))).min(31 - 9),
            data_device_sectors: device_sectors,
            meta_device_sectors: opts.meta_device_sectors,
        };
        if p.section_size().1 == 0 {
            return Err(IntegrityError::field(
                "integrity_tag_size",
                format!("{}: no journal entry fits a sector", p.tag_size),
            ));
        }
        let max = p.max_provided();
        if max == 0 {
            return Err(IntegrityError::Geometry(format!(
                "device of {device_sectors} sectors is too small for the superblock's journal \
                 ({} sections)",
                sb.journal_sections
            )));
        }
        let limits = loop {
            match p.limits(max) {
                Some(l) => break l,
                None if p.meta_device_sectors.is_some() && p.log2_buffer_sectors > 3 => {
                    p.log2_buffer_sectors -= 1
                }
                None => {
                    return Err(IntegrityError::Geometry(format!(
                        "device of {device_sectors} sectors is too small"
                    )))
                }
            }
        };
        if sb.provided_data_sectors > max {
            return Err(IntegrityError::field(
                "provided_data_sectors",
                format!(
                    "{} do not fit the device ({device_sectors} sectors hold at most {max}): \
                     truncated device?",
                    sb.provided_data_sectors
                ),
            ));
        }
        if p.meta_device_sectors.is_none() {
            p.log2_buffer_sectors = p
                .log2_buffer_sectors
                .min(limits.metadata_run.trailing_zeros());
        }
        Ok(Geometry {
            tag_size: p.tag_size,
            log2_tag_size: p
                .tag_size
                .is_power_of_two()
                .then(|| p.tag_size.trailing_zeros()),
            log2_sectors_per_block: p.log2_sectors_per_block,
            log2_interleave_sectors: p.log2_interleave_sectors,
            journal_sections: p.journal_sections,
            journal_entry_size: limits.journal_entry_size,
            journal_entries_per_sector: limits.journal_entries_per_sector,
            journal_section_entries: limits.journal_section_entries,
            journal_section_sectors: limits.journal_section_sectors,
            initial_sectors: limits.initial_sectors,
            metadata_run: limits.metadata_run,
            log2_buffer_sectors: p.log2_buffer_sectors,
            provided_data_sectors: sb.provided_data_sectors,
            max_provided_data_sectors: max,
            data_device_sectors: device_sectors,
            meta_device_sectors: p.meta_device_sectors,
        })
    }

    /// The superblock fields the kernel's `initialize_superblock()` computes for a new volume
    /// of `device_sectors` sectors with `layout` (the journal is sized in whole sections, at
    /// least one; with a metadata device the journal shrinks to what fits).
    pub fn for_format(layout: &FormatLayout, device_sectors: u64) -> Result<FormatFields> {
        let ss = layout.sector_size;
        if !ss.is_power_of_two() || !(512..=4096).contains(&ss) {
            return Err(IntegrityError::option(
                "--sector-size",
                format!("{ss} is not a power of two in 512..4096"),
            ));
        }
        if layout.tag_size == 0 || layout.tag_size > super::superblock::MAX_TAG_SIZE {
            return Err(IntegrityError::option(
                "--tag-size",
                format!(
                    "{} is not in 1..={}",
                    layout.tag_size,
                    super::superblock::MAX_TAG_SIZE
                ),
            ));
        }
        let log2_spb = (ss / 512).trailing_zeros();
        if device_sectors > MAX_DEVICE_SECTORS
            || layout
                .meta_device_sectors
                .is_some_and(|v| v > MAX_DEVICE_SECTORS)
        {
            return Err(IntegrityError::Geometry(
                "device is larger than 2^64 bytes".to_string(),
            ));
        }
        let journal_sectors = if layout.journal_sectors == 0 {
            DEFAULT_MAX_JOURNAL_SECTORS.min(device_sectors >> DEFAULT_JOURNAL_SIZE_FACTOR) as u32
        } else {
            layout.journal_sectors
        };
        let buffer_sectors = if layout.buffer_sectors == 0 {
            1
        } else {
            layout.buffer_sectors
        };
        let mut p = Params {
            tag_size: u32::from(layout.tag_size),
            log2_sectors_per_block: log2_spb,
            log2_interleave_sectors: 0,
            journal_sections: 0,
            fixed_padding: layout.fixed_padding,
            journal_mac: layout.journal_mac,
            log2_buffer_sectors: log2_floor(u64::from(buffer_sectors)).min(31 - 9),
            data_device_sectors: device_sectors,
            meta_device_sectors: layout.meta_device_sectors,
        };
        let section_sectors = p.section_size().3;
        let mut sections = (journal_sectors / section_sectors).max(1);
        let too_small = || {
            IntegrityError::Geometry(format!(
                "device of {device_sectors} sectors ({} bytes) is too small for this layout",
                device_sectors * 512
            ))
        };
        if p.meta_device_sectors.is_none() {
            p.journal_sections = sections;
            let interleave = if layout.interleave_sectors == 0 {
                DEFAULT_INTERLEAVE_SECTORS
            } else {
                layout.interleave_sectors
            };
            let l = log2_floor(u64::from(interleave)).clamp(
                u32::from(super::superblock::MIN_LOG2_INTERLEAVE_SECTORS),
                u32::from(super::superblock::MAX_LOG2_INTERLEAVE_SECTORS),
            );
            if l < log2_spb {
                return Err(IntegrityError::option(
                    "--interleave-sectors",
                    format!("{interleave} is smaller than a {ss}-byte sector"),
                ));
            }
            p.log2_interleave_sectors = l;
            let provided = p.max_provided();
            if provided == 0 {
                return Err(too_small());
            }
            Ok(FormatFields {
                log2_interleave_sectors: l as u8,
                journal_sections: sections,
                provided_data_sectors: provided,
                log2_sectors_per_block: log2_spb as u8,
            })
        } else {
            let provided = p.max_provided();
            if provided == 0 {
                return Err(too_small());
            }
            loop {
                // The largest journal up to the requested one whose layout fits, bit by bit.
                let mut js = 0u32;
                let top = 31 - sections.leading_zeros();
                for bit in (0..=top).rev() {
                    let test = js | (1 << bit);
                    if test > sections {
                        continue;
                    }
                    p.journal_sections = test;
                    if p.limits(provided).is_some() {
                        js = test;
                    }
                }
                if js != 0 {
                    sections = js;
                    break;
                }
                if p.log2_buffer_sectors > 3 {
                    p.log2_buffer_sectors -= 1;
                } else {
                    return Err(too_small());
                }
            }
            Ok(FormatFields {
                log2_interleave_sectors: 0,
                journal_sections: sections,
                provided_data_sectors: provided,
                log2_sectors_per_block: log2_spb as u8,
            })
        }
    }

    /// Tag size in bytes.
    pub fn tag_size(&self) -> u32 {
        self.tag_size
    }
    /// Block size in bytes (the mapped device's sector size).
    pub fn sector_size(&self) -> u32 {
        512 << self.log2_sectors_per_block
    }
    /// 512-byte sectors per block.
    pub fn sectors_per_block(&self) -> u32 {
        1 << self.log2_sectors_per_block
    }
    /// log2 of [`sectors_per_block`](Geometry::sectors_per_block).
    pub fn log2_sectors_per_block(&self) -> u32 {
        self.log2_sectors_per_block
    }
    /// The mapped size in 512-byte sectors (the superblock's `provided_data_sectors`).
    pub fn provided_data_sectors(&self) -> u64 {
        self.provided_data_sectors
    }
    /// Number of blocks of the mapped device.
    pub fn provided_blocks(&self) -> u64 {
        self.provided_data_sectors >> self.log2_sectors_per_block
    }
    /// What the device could provide (the kernel's `get_provided_data_sectors()`); more than
    /// [`provided_data_sectors`](Geometry::provided_data_sectors) when the device grew.
    pub fn max_provided_data_sectors(&self) -> u64 {
        self.max_provided_data_sectors
    }
    /// Data sectors per area (0 with a separate metadata device: one area).
    pub fn interleave_sectors(&self) -> u64 {
        if self.meta_device_sectors.is_some() {
            0
        } else {
            1 << self.log2_interleave_sectors
        }
    }
    /// Sectors of one metadata run (one sector with a metadata device).
    pub fn metadata_run_sectors(&self) -> u64 {
        self.metadata_run
    }
    /// The metadata I/O unit the kernel ends up with (`log2_buffer_sectors`).
    pub fn buffer_sectors(&self) -> u32 {
        1 << self.log2_buffer_sectors
    }
    /// Sectors before the first area: the superblock and the journal (`initial_sectors`).
    pub fn initial_sectors(&self) -> u64 {
        self.initial_sectors
    }
    /// Whether the tags live on a separate metadata device.
    pub fn has_meta_device(&self) -> bool {
        self.meta_device_sectors.is_some()
    }
    /// Size of the data device in sectors, as given.
    pub fn data_device_sectors(&self) -> u64 {
        self.data_device_sectors
    }

    /// First sector of the journal (right after the superblock area), on the device holding
    /// the metadata.
    pub fn journal_start_sector(&self) -> u64 {
        SB_SECTORS
    }
    /// Number of journal sections.
    pub fn journal_sections(&self) -> u32 {
        self.journal_sections
    }
    /// Sectors per journal section: 8 sectors of entries, then the entries' data.
    pub fn journal_section_sectors(&self) -> u32 {
        self.journal_section_sectors
    }
    /// All journal sectors (sections x section sectors).
    pub fn journal_sectors(&self) -> u64 {
        u64::from(self.journal_sections) * u64::from(self.journal_section_sectors)
    }
    /// Bytes of one journal entry (sector number, last bytes of each sector, tag; rounded to 8).
    pub fn journal_entry_size(&self) -> u32 {
        self.journal_entry_size
    }
    /// Journal entries in one journal sector.
    pub fn journal_entries_per_sector(&self) -> u32 {
        self.journal_entries_per_sector
    }
    /// Journal entries per section (entries per sector x 8).
    pub fn journal_section_entries(&self) -> u32 {
        self.journal_section_entries
    }
    /// Journal entries in the whole journal.
    pub fn journal_entries(&self) -> u64 {
        u64::from(self.journal_section_entries) * u64::from(self.journal_sections)
    }
    /// Journal sector (absolute, on the metadata-holding device) and byte offset of entry
    /// `entry` of `section`.
    pub fn journal_entry_position(&self, section: u32, entry: u32) -> (u64, u32) {
        let sector = entry / self.journal_entries_per_sector;
        let off = (entry % self.journal_entries_per_sector) * self.journal_entry_size;
        (self.journal_section_start(section) + u64::from(sector), off)
    }
    /// First sector (absolute) of the data of entry `entry` of `section`: a block's sectors,
    /// one after another.
    pub fn journal_data_sector(&self, section: u32, entry: u32) -> u64 {
        self.journal_section_start(section)
            + u64::from(JOURNAL_BLOCK_SECTORS)
            + (u64::from(entry) << self.log2_sectors_per_block)
    }
    /// First sector (absolute) of a journal section.
    pub fn journal_section_start(&self, section: u32) -> u64 {
        SB_SECTORS + u64::from(section) * u64::from(self.journal_section_sectors)
    }

    /// Number of interleave areas the provided sectors span.
    pub fn areas(&self) -> u64 {
        if self.meta_device_sectors.is_some() {
            1
        } else {
            self.provided_data_sectors
                .div_ceil(1u64 << self.log2_interleave_sectors)
        }
    }

    /// The layout of area `index` (see [`Area`]).
    pub fn area(&self, index: u64) -> Area {
        if self.meta_device_sectors.is_some() {
            let tag_bytes = self.provided_blocks() * u64::from(self.tag_size);
            return Area {
                index: 0,
                first_logical: 0,
                metadata_start: self.initial_sectors,
                metadata_sectors: tag_bytes.div_ceil(512),
                data_start: 0,
                data_sectors: self.provided_data_sectors,
            };
        }
        let il = self.log2_interleave_sectors;
        let first = index << il;
        let metadata_start = self.initial_sectors + (index << il) + index * self.metadata_run;
        Area {
            index,
            first_logical: first,
            metadata_start,
            metadata_sectors: self.metadata_run,
            data_start: metadata_start + self.metadata_run,
            data_sectors: (1u64 << il).min(self.provided_data_sectors.saturating_sub(first)),
        }
    }

    /// Iterate over all areas in device order.
    pub fn area_iter(&self) -> impl Iterator<Item = Area> + '_ {
        (0..self.areas()).map(move |i| self.area(i))
    }

    /// Physical sector (on the data device) of logical sector `logical`.
    pub fn data_physical_sector(&self, logical: u64) -> u64 {
        if self.meta_device_sectors.is_some() {
            return logical;
        }
        let il = self.log2_interleave_sectors;
        let area = logical >> il;
        let offset = logical & ((1u64 << il) - 1);
        (area << il) + (area + 1) * self.metadata_run + self.initial_sectors + offset
    }

    /// Absolute byte offset (on the metadata-holding device) of the tag of the block holding
    /// logical sector `logical`.
    pub fn tag_byte_offset(&self, logical: u64) -> u64 {
        let (area, offset) = if self.meta_device_sectors.is_some() {
            (0, logical)
        } else {
            let il = self.log2_interleave_sectors;
            (logical >> il, logical & ((1u64 << il) - 1))
        };
        let run_start = if self.meta_device_sectors.is_some() {
            0
        } else {
            (area << self.log2_interleave_sectors) + area * self.metadata_run
        };
        let block = offset >> self.log2_sectors_per_block;
        (self.initial_sectors + run_start) * 512 + block * u64::from(self.tag_size)
    }

    /// Where the tag of logical sector `logical` lives: (sector, byte offset in that 512-byte
    /// sector) on the metadata-holding device. A tag may continue into the next sector.
    pub fn tag_position(&self, logical: u64) -> (u64, u32) {
        let b = self.tag_byte_offset(logical);
        (b / 512, (b % 512) as u32)
    }

    /// The kernel's `get_metadata_sector_and_offset()`: (metadata block in units of
    /// [`buffer_sectors`](Geometry::buffer_sectors) from the end of the journal, byte offset
    /// in it).
    pub fn metadata_block_and_offset(&self, logical: u64) -> (u64, u32) {
        let rel = self.tag_byte_offset(logical) - self.initial_sectors * 512;
        let unit = 512u64 << self.log2_buffer_sectors;
        (rel / unit, (rel % unit) as u32)
    }

    /// `log2_blocks_per_bitmap_bit` the kernel computes for `sectors_per_bit` (bitmap mode
    /// option; `None`: the default 32768), grown until the bitmap fits the journal area.
    pub fn log2_blocks_per_bitmap_bit(&self, sectors_per_bit: Option<u64>) -> u8 {
        let mut l: u32 = match sectors_per_bit {
            None => log2_floor(DEFAULT_SECTORS_PER_BITMAP_BIT),
            Some(0) => 0,
            Some(v) => log2_floor(v),
        };
        if l < self.log2_sectors_per_block {
            l = self.log2_sectors_per_block;
        }
        let bits_in_journal = (self.journal_sectors() << (9 + 3)).min(u64::from(u32::MAX));
        if bits_in_journal != 0 {
            while l < 63 && bits_in_journal < (self.provided_data_sectors + (1u64 << l) - 1) >> l {
                l += 1;
            }
        }
        (l - self.log2_sectors_per_block) as u8
    }

    /// Bitmap blocks (4096 bytes each, at the start of the journal area) for a bitmap with
    /// `log2_blocks_per_bitmap_bit`.
    pub fn bitmap_blocks(&self, log2_blocks_per_bitmap_bit: u8) -> u64 {
        let l = u32::from(log2_blocks_per_bitmap_bit);
        let bits = (self.provided_blocks() + (1u64 << l) - 1) >> l;
        bits.div_ceil(BITMAP_BLOCK_SIZE * 8)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::integrity::superblock::{SB_FLAG_FIXED_HMAC, SB_FLAG_FIXED_PADDING};

    /// The layout integritysetup's defaults give (fixed padding, no journal MAC, buffer 128).
    pub(crate) fn fmt(
        tag: u16,
        ss: u32,
        journal: u32,
        interleave: u32,
        sectors: u64,
    ) -> FormatFields {
        Geometry::for_format(
            &FormatLayout {
                tag_size: tag,
                sector_size: ss,
                journal_sectors: journal,
                interleave_sectors: interleave,
                fixed_padding: true,
                journal_mac: false,
                buffer_sectors: 128,
                meta_device_sectors: None,
            },
            sectors,
        )
        .unwrap()
    }

    /// The superblock a format with `f` writes (v5, fix_padding, fix_hmac, zero salt).
    pub(crate) fn sb(f: FormatFields, tag: u16) -> Superblock {
        Superblock {
            version: 5,
            log2_interleave_sectors: f.log2_interleave_sectors,
            integrity_tag_size: tag,
            journal_sections: f.journal_sections,
            provided_data_sectors: f.provided_data_sectors,
            flags: SB_FLAG_FIXED_PADDING | SB_FLAG_FIXED_HMAC,
            log2_sectors_per_block: f.log2_sectors_per_block,
            log2_blocks_per_bitmap_bit: 0,
            recalc_sector: 0,
            transaction_id: 0,
            salt: [0; 16],
        }
    }

    #[test]
    fn journal_section_of_crc32c_512() {
        // entry: 8 (sector) + 8 (last bytes) + 4 (tag) -> 24; 504 / 24 = 21 per sector.
        let f = fmt(4, 512, 0, 0, 16384);
        let g = Geometry::new(&sb(f, 4), 16384, &GeometryOptions::default()).unwrap();
        assert_eq!(g.journal_entry_size(), 24);
        assert_eq!(g.journal_entries_per_sector(), 21);
        assert_eq!(g.journal_section_entries(), 168);
        assert_eq!(g.journal_section_sectors(), 176);
    }

    #[test]
    fn layout_is_consistent() {
        for (tag, ss, il) in [(4, 512, 0), (32, 4096, 0), (3, 1024, 64), (20, 512, 8)] {
            let sectors = 20000;
            let f = fmt(tag, ss, 0, il, sectors);
            let g = Geometry::new(&sb(f, tag), sectors, &GeometryOptions::default()).unwrap();
            let last = g.provided_data_sectors() - 1;
            assert!(g.data_physical_sector(last) < sectors);
            // Every tag lies inside its area's metadata run, before the area's data.
            for a in g.area_iter() {
                let l = a.first_logical + a.data_sectors - 1;
                let t = g.tag_byte_offset(l) + u64::from(g.tag_size());
                assert!(t <= a.data_start * 512, "area {a:?}");
                assert_eq!(g.data_physical_sector(a.first_logical), a.data_start);
            }
            // One more area's worth would not fit.
            assert!(g.max_provided_data_sectors() == g.provided_data_sectors());
        }
    }

    /// `provided_data_sectors` (and the bitmap granularity) of 8 MiB images the Debian 6.1
    /// kernel formatted with integritysetup 2.6.1 (read off `integritysetup dump`).
    #[test]
    fn provided_sectors_match_the_kernel() {
        // (tag, sector size, journal sectors, interleave, provided, log2 interleave,
        //  log2 blocks per bitmap bit)
        let cases = [
            (4, 512, 0, 0, 15944, 15, 15),
            (32, 4096, 0, 0, 15856, 15, 12),
            (8, 512, 128, 512, 15944, 9, 15),
            (32, 512, 0, 0, 14240, 15, 15),
            (20, 1024, 0, 0, 15568, 15, 14),
            (2, 2048, 39, 0, 16016, 15, 13),
            (20, 512, 0, 64, 14464, 6, 15),
            (3, 512, 0, 1000, 15944, 9, 15),
            (16, 4096, 0, 0, 15920, 15, 12),
            (8, 1024, 0, 0, 15872, 15, 14),
        ];
        for (tag, ss, js, il, provided, l2il, lbpb) in cases {
            let f = fmt(tag, ss, js, il, 16384);
            assert_eq!(
                f.provided_data_sectors, provided,
                "tag {tag} ss {ss} il {il}"
            );
            assert_eq!(f.log2_interleave_sectors, l2il);
            assert_eq!(f.journal_sections, 1);
            let g = Geometry::new(&sb(f, tag), 16384, &GeometryOptions::default()).unwrap();
            assert_eq!(g.log2_blocks_per_bitmap_bit(None), lbpb);
        }
    }

    #[test]
    fn truncated_device_is_refused() {
        let f = fmt(4, 512, 0, 0, 16384);
        let e = Geometry::new(&sb(f, 4), 8192, &GeometryOptions::default()).unwrap_err();
        assert!(e.to_string().starts_with("provided_data_sectors"), "{e}");
    }
}
