//! What the read-write device needs of the on-disk format: the superblock kept raw, with the
//! fields it reads and updates (flags, `recalc_sector`, `log2_blocks_per_bitmap_bit`, the
//! version `sb_set_version` derives), and [`Layout`], the numbers of [`Geometry`] the hot path
//! uses, copied out once at open. Fields are validated by [`Superblock::parse`], the layout
//! is [`Geometry`]'s; tags are [`super::tags::TagHasher`]'s.
//!
//! The superblock is kept as its raw 4096 bytes and only the fields the device changes are
//! rewritten, so every other byte stays as the formatter (ours or the kernel's) left it.

use std::fmt;

use super::geometry::BITMAP_BLOCK_SIZE as BITMAP_BLOCK_BYTES;
use super::geometry::{Geometry, GeometryOptions};
use super::superblock::{offset, Superblock};
pub use super::superblock::{
    MAGIC as SB_MAGIC, SB_FLAG_DIRTY_BITMAP, SB_FLAG_FIXED_HMAC, SB_FLAG_FIXED_PADDING,
    SB_FLAG_HAVE_JOURNAL_MAC, SB_FLAG_INLINE, SB_FLAG_RECALCULATING, SB_SECTORS,
};
/// Sectors at the start of each journal section holding its entries.
pub const JOURNAL_BLOCK_SECTORS: u64 = super::geometry::JOURNAL_BLOCK_SECTORS as u64;
/// Bytes of a journal sector before its commit id.
pub const JOURNAL_SECTOR_DATA: usize = super::geometry::JOURNAL_SECTOR_DATA as usize;
/// Largest journal a device may have here, in sectors (1 GiB; the kernel's own default
/// maximum is 64 MiB).
pub const MAX_JOURNAL_SECTORS: u64 = 1 << 21;
/// `BITMAP_BLOCK_SIZE`, in bytes.
pub const BITMAP_BLOCK_SIZE: usize = BITMAP_BLOCK_BYTES as usize;

/// The superblock, raw, with accessors for the fields the device uses.
#[derive(Clone)]
pub struct RawSuperblock(pub Vec<u8>);

impl RawSuperblock {
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }
    fn u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[at..at + 4]);
        u32::from_le_bytes(b)
    }
    fn u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_le_bytes(b)
    }
    /// Whether the magic is there.
    pub fn has_magic(&self) -> bool {
        &self.0[..8] == SB_MAGIC
    }
    /// `version`.
    pub fn version(&self) -> u8 {
        self.0[offset::VERSION]
    }
    /// `log2_interleave_sectors`.
    pub fn log2_interleave_sectors(&self) -> u8 {
        self.0[offset::LOG2_INTERLEAVE_SECTORS]
    }
    /// `integrity_tag_size`.
    pub fn tag_size(&self) -> u16 {
        self.u16(offset::INTEGRITY_TAG_SIZE)
    }
    /// `journal_sections`.
    pub fn journal_sections(&self) -> u32 {
        self.u32(offset::JOURNAL_SECTIONS)
    }
    /// `provided_data_sectors`.
    pub fn provided_data_sectors(&self) -> u64 {
        self.u64(offset::PROVIDED_DATA_SECTORS)
    }
    /// `flags`.
    pub fn flags(&self) -> u32 {
        self.u32(offset::FLAGS)
    }
    /// Set `flags`.
    pub fn set_flags(&mut self, f: u32) {
        self.0[offset::FLAGS..offset::FLAGS + 4].copy_from_slice(&f.to_le_bytes());
    }
    /// `log2_sectors_per_block`.
    pub fn log2_sectors_per_block(&self) -> u8 {
        self.0[offset::LOG2_SECTORS_PER_BLOCK]
    }
    /// `log2_blocks_per_bitmap_bit`.
    pub fn log2_blocks_per_bitmap_bit(&self) -> u8 {
        self.0[offset::LOG2_BLOCKS_PER_BITMAP_BIT]
    }
    /// Set `log2_blocks_per_bitmap_bit`.
    pub fn set_log2_blocks_per_bitmap_bit(&mut self, v: u8) {
        self.0[offset::LOG2_BLOCKS_PER_BITMAP_BIT] = v;
    }
    /// `recalc_sector`.
    pub fn recalc_sector(&self) -> u64 {
        self.u64(offset::RECALC_SECTOR)
    }
    /// Set `recalc_sector`.
    pub fn set_recalc_sector(&mut self, v: u64) {
        self.0[offset::RECALC_SECTOR..offset::RECALC_SECTOR + 8].copy_from_slice(&v.to_le_bytes());
    }
    /// `salt`.
    pub fn salt(&self) -> [u8; 16] {
        let mut s = [0u8; 16];
        s.copy_from_slice(&self.0[offset::SALT..offset::SALT + 16]);
        s
    }
    /// The version the kernel's `sb_set_version` writes for these flags in `mode` (open has
    /// no separate metadata device).
    pub fn set_version_for(&mut self, mode: Mode) {
        self.0[offset::VERSION] =
            Superblock::version_for(self.flags(), mode == Mode::Bitmap, false);
    }
}

/// The kernel's mode letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `J`: data and tags go through the journal.
    Journal,
    /// `B`: a dirty-region bitmap, tags recalculated after an unclean stop.
    Bitmap,
    /// `D`: direct writes, no crash consistency.
    Direct,
    /// `R`: recovery, no tag checks, no replay, read-only.
    Recovery,
}

impl Mode {
    /// The kernel's letter.
    pub fn letter(self) -> char {
        match self {
            Mode::Journal => 'J',
            Mode::Bitmap => 'B',
            Mode::Direct => 'D',
            Mode::Recovery => 'R',
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.letter())
    }
}

/// Where everything is on the device, in 512-byte sectors unless named otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// log2 of 512-byte sectors per integrity block.
    pub log2_spb: u32,
    /// Bytes per tag.
    pub tag_size: u32,
    /// log2 of data sectors per interleave area.
    pub log2_interleave: u32,
    /// Sectors of tags before each area's data (padded).
    pub metadata_run: u64,
    /// Superblock plus journal, sectors.
    pub initial_sectors: u64,
    /// Logical sectors the device provides.
    pub provided_data_sectors: u64,
    /// Journal sections.
    pub journal_sections: u32,
    /// Bytes per journal entry.
    pub journal_entry_size: u32,
    /// Journal entries per 512-byte journal sector.
    pub journal_entries_per_sector: u32,
    /// Journal entries per section.
    pub journal_section_entries: u32,
    /// Sectors per journal section.
    pub journal_section_sectors: u32,
}

/// Why a superblock cannot be served.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LayoutError(pub String);

impl Layout {
    /// Compute the geometry from a superblock on a device of `device_sectors` sectors,
    /// refusing what the kernel's constructor refuses. The fields are checked by
    /// [`Superblock::parse`] and the layout is [`Geometry`]'s (one implementation of the
    /// kernel's formulas); this adds what the read-write device does not serve.
    pub fn from_superblock(sb: &RawSuperblock, device_sectors: u64) -> Result<Layout, LayoutError> {
        let bad = |m: String| Err(LayoutError(m));
        if !sb.has_magic() {
            return bad("not a dm-integrity device (no superblock magic \"integrt\")".into());
        }
        let parsed = Superblock::parse(&sb.0).map_err(|e| LayoutError(e.to_string()))?;
        // Whatever `dump` refuses, open refuses too (one check for both).
        parsed
            .check_supported()
            .map_err(|e| LayoutError(e.to_string()))?;
        if parsed.has(SB_FLAG_HAVE_JOURNAL_MAC) {
            return bad("journal MAC (--journal-integrity) is not supported".into());
        }
        if parsed.log2_interleave_sectors == 0 {
            return bad(
                "a separate metadata device (--data-device) is not supported by open".into(),
            );
        }
        let g = Geometry::new(&parsed, device_sectors, &GeometryOptions::default())
            .map_err(|e| LayoutError(e.to_string()))?;
        let (sections, section_sectors) = (g.journal_sections(), g.journal_section_sectors());
        // The whole journal is held in memory, as the kernel holds it.
        if u64::from(section_sectors) * u64::from(sections) > MAX_JOURNAL_SECTORS {
            return bad(format!(
                "the journal ({sections} sections of {section_sectors} sectors) is larger than the {} MiB dmkit holds in memory",
                MAX_JOURNAL_SECTORS >> 11
            ));
        }
        Ok(Layout {
            log2_spb: g.log2_sectors_per_block(),
            tag_size: g.tag_size(),
            log2_interleave: u32::from(parsed.log2_interleave_sectors),
            metadata_run: g.metadata_run_sectors(),
            initial_sectors: g.initial_sectors(),
            provided_data_sectors: g.provided_data_sectors(),
            journal_sections: sections,
            journal_entry_size: g.journal_entry_size(),
            journal_entries_per_sector: g.journal_entries_per_sector(),
            journal_section_entries: g.journal_section_entries(),
            journal_section_sectors: section_sectors,
        })
    }

    /// 512-byte sectors per block.
    pub fn spb(&self) -> u64 {
        1 << self.log2_spb
    }
    /// Bytes per block (the integrity sector size).
    pub fn block_size(&self) -> usize {
        512 << self.log2_spb
    }
    /// Total journal entries.
    pub fn journal_entries(&self) -> u32 {
        self.journal_section_entries * self.journal_sections
    }
    /// Bytes of the journal area.
    pub fn journal_bytes(&self) -> usize {
        self.journal_sections as usize * self.journal_section_sectors as usize * 512
    }
    /// Byte offset of the journal on the device.
    pub fn journal_offset(&self) -> u64 {
        SB_SECTORS * 512
    }
    /// Interleave area and offset in it of a logical sector.
    pub fn area_offset(&self, sector: u64) -> (u64, u64) {
        (
            sector >> self.log2_interleave,
            sector & ((1u64 << self.log2_interleave) - 1),
        )
    }
    /// Device sector of a logical sector (`get_data_sector`).
    pub fn data_sector(&self, sector: u64) -> u64 {
        let (area, offset) = self.area_offset(sector);
        (area << self.log2_interleave)
            + (area + 1) * self.metadata_run
            + self.initial_sectors
            + offset
    }
    /// Device byte offset of the tag of the block at a logical sector.
    pub fn tag_offset(&self, sector: u64) -> u64 {
        let (area, offset) = self.area_offset(sector);
        let ms = (area << self.log2_interleave) + area * self.metadata_run;
        (self.initial_sectors + ms) * 512 + (offset >> self.log2_spb) * u64::from(self.tag_size)
    }
    /// Logical sectors from `sector` to the end of its interleave area.
    pub fn area_remaining(&self, sector: u64) -> u64 {
        (1u64 << self.log2_interleave) - self.area_offset(sector).1
    }
}
