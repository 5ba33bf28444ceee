//! The dm-integrity superblock: the first 512 bytes of the 8-sector superblock area the kernel
//! writes at the start of the device (or of the metadata device), little-endian.
//!
//! ```text
//! 0   magic "integrt\0"          8   version (u8)          9   log2_interleave_sectors (u8)
//! 10  integrity_tag_size (u16)   12  journal_sections      16  provided_data_sectors (u64)
//! 24  flags (u32)                28  log2_sectors_per_block 29 log2_blocks_per_bitmap_bit
//! 30  pad[2]                     32  recalc_sector (u64)   40  transaction_id (pad2 in the kernel)
//! 48  salt[16]                   64  zero (a superblock MAC at the end with a journal MAC)
//! ```
//!
//! [`Superblock::parse`] refuses what the kernel's constructor refuses (unknown version, a tag
//! too large for a journal entry, a block size over 4096, zero journal sections, an interleave
//! outside 2^3..2^31), each error naming the field.

use super::error::{IntegrityError, Result};
use crate::block::BlockDevice;
use crate::codec::{self, Reader, SliceWriter};

/// Size of the superblock structure on disk (the area is [`SB_SECTORS`] sectors).
pub const SUPERBLOCK_SIZE: usize = 512;
/// Sectors the kernel reserves for the superblock at the start of the device.
pub const SB_SECTORS: u64 = 8;
/// The magic at offset 0.
pub const MAGIC: &[u8; 8] = b"integrt\0";
/// Size of the salt (and of the random salt `fix_hmac` volumes get).
pub const SALT_SIZE: usize = 16;
/// The journal carries a MAC per sector (`journal_mac`).
pub const SB_FLAG_HAVE_JOURNAL_MAC: u32 = 0x1;
/// Tags are being recalculated from `recalc_sector` on.
pub const SB_FLAG_RECALCULATING: u32 = 0x2;
/// Bitmap mode: the bitmap in the journal area may mark regions whose tags are stale.
pub const SB_FLAG_DIRTY_BITMAP: u32 = 0x4;
/// Metadata runs are padded to 4 KiB, not to 128 KiB (`fix_padding`).
pub const SB_FLAG_FIXED_PADDING: u32 = 0x8;
/// The salt is hashed into every tag and the superblock carries a MAC (`fix_hmac`).
pub const SB_FLAG_FIXED_HMAC: u32 = 0x10;
/// Inline mode: tags live in the underlying device's integrity profile (no journal).
pub const SB_FLAG_INLINE: u32 = 0x20;
/// Every flag a kernel knows.
pub const SB_KNOWN_FLAGS: u32 = 0x3f;
/// The newest superblock version (6: inline mode).
pub const SB_VERSION_MAX: u8 = 6;
/// The newest superblock version dmkit reads, dumps and opens (integritysetup 2.6 dumps no
/// newer one either): see [`Superblock::check_supported`].
pub const SUPPORTED_VERSION_MAX: u8 = 5;
/// The largest block size, in sectors (4096 bytes).
pub const MAX_SECTORS_PER_BLOCK: u32 = 8;
/// The largest tag: what fits in a journal entry beside the sector number and the last bytes
/// of 8 sectors, in the 496 bytes of a journal sector with a MAC.
pub const MAX_TAG_SIZE: u16 = (504 - 8 - (8 + 8 * MAX_SECTORS_PER_BLOCK)) as u16;
/// Smallest log2 of the interleave (8 sectors).
pub const MIN_LOG2_INTERLEAVE_SECTORS: u8 = 3;
/// Largest log2 of the interleave.
pub const MAX_LOG2_INTERLEAVE_SECTORS: u8 = 31;

/// The parsed superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Format version 1..=6 (the kernel derives it from the flags when it writes).
    pub version: u8,
    /// log2 of the data sectors between two metadata runs (0 with a separate metadata device).
    pub log2_interleave_sectors: u8,
    /// Bytes of tag per block.
    pub integrity_tag_size: u16,
    /// Number of journal sections (also the size of the bitmap area in bitmap mode).
    pub journal_sections: u32,
    /// 512-byte sectors the device provides (what userspace maps).
    pub provided_data_sectors: u64,
    /// `SB_FLAG_*` bits.
    pub flags: u32,
    /// log2 of the block (sector size) in 512-byte sectors, 0..=3.
    pub log2_sectors_per_block: u8,
    /// log2 of the blocks one bitmap bit covers (bitmap mode).
    pub log2_blocks_per_bitmap_bit: u8,
    /// Where recalculation stands when [`SB_FLAG_RECALCULATING`] is set.
    pub recalc_sector: u64,
    /// Bytes 40..48 (`pad2` in the kernel): zero as the kernel writes them, kept as read so a
    /// round trip is exact.
    pub transaction_id: u64,
    /// The salt (hashed into tags when [`SB_FLAG_FIXED_HMAC`] is set).
    pub salt: [u8; SALT_SIZE],
}

/// Byte offsets of the superblock's fields (`struct superblock` in dm-integrity.c), shared by
/// [`Superblock`] and the device's raw copy ([`super::rw_meta::RawSuperblock`]).
pub mod offset {
    /// `version` (u8).
    pub const VERSION: usize = 8;
    /// `log2_interleave_sectors` (u8).
    pub const LOG2_INTERLEAVE_SECTORS: usize = 9;
    /// `integrity_tag_size` (le16).
    pub const INTEGRITY_TAG_SIZE: usize = 10;
    /// `journal_sections` (le32).
    pub const JOURNAL_SECTIONS: usize = 12;
    /// `provided_data_sectors` (le64).
    pub const PROVIDED_DATA_SECTORS: usize = 16;
    /// `flags` (le32).
    pub const FLAGS: usize = 24;
    /// `log2_sectors_per_block` (u8).
    pub const LOG2_SECTORS_PER_BLOCK: usize = 28;
    /// `log2_blocks_per_bitmap_bit` (u8).
    pub const LOG2_BLOCKS_PER_BITMAP_BIT: usize = 29;
    /// `recalc_sector` (le64).
    pub const RECALC_SECTOR: usize = 32;
    /// `transaction_id` (le64).
    pub const TRANSACTION_ID: usize = 40;
    /// `salt` (16 bytes).
    pub const SALT: usize = 48;
}

impl Superblock {
    /// Parse and validate the first 512 bytes of a device. Every field is checked before it
    /// is used, as the kernel's constructor checks it.
    pub fn parse(bytes: &[u8]) -> Result<Superblock> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(IntegrityError::Truncated(bytes.len()));
        }
        let b = &bytes[..SUPERBLOCK_SIZE];
        if &b[0..8] != MAGIC {
            return Err(IntegrityError::Magic);
        }
        let sb = Self::decode(b)?;
        sb.validate()?;
        Ok(sb)
    }

    /// The fields at their offsets (`b` holds at least [`SUPERBLOCK_SIZE`] bytes).
    fn decode(b: &[u8]) -> std::result::Result<Superblock, codec::Error> {
        let at = |off, what| Reader::at(b, off, what);
        Ok(Superblock {
            version: at(offset::VERSION, "version")?.u8("version")?,
            log2_interleave_sectors: at(
                offset::LOG2_INTERLEAVE_SECTORS,
                "log2_interleave_sectors",
            )?
            .u8("log2_interleave_sectors")?,
            integrity_tag_size: at(offset::INTEGRITY_TAG_SIZE, "integrity_tag_size")?
                .u16_le("integrity_tag_size")?,
            journal_sections: at(offset::JOURNAL_SECTIONS, "journal_sections")?
                .u32_le("journal_sections")?,
            provided_data_sectors: at(offset::PROVIDED_DATA_SECTORS, "provided_data_sectors")?
                .u64_le("provided_data_sectors")?,
            flags: at(offset::FLAGS, "flags")?.u32_le("flags")?,
            log2_sectors_per_block: at(offset::LOG2_SECTORS_PER_BLOCK, "log2_sectors_per_block")?
                .u8("log2_sectors_per_block")?,
            log2_blocks_per_bitmap_bit: at(
                offset::LOG2_BLOCKS_PER_BITMAP_BIT,
                "log2_blocks_per_bitmap_bit",
            )?
            .u8("log2_blocks_per_bitmap_bit")?,
            recalc_sector: at(offset::RECALC_SECTOR, "recalc_sector")?.u64_le("recalc_sector")?,
            transaction_id: at(offset::TRANSACTION_ID, "transaction_id")?
                .u64_le("transaction_id")?,
            salt: at(offset::SALT, "salt")?.array("salt")?,
        })
    }

    /// The checks of [`parse`](Superblock::parse), for a superblock built in memory.
    pub fn validate(&self) -> Result<()> {
        if self.version == 0 || self.version > SB_VERSION_MAX {
            return Err(IntegrityError::field(
                "version",
                format!("unknown superblock version {}", self.version),
            ));
        }
        if self.flags & !SB_KNOWN_FLAGS != 0 {
            return Err(IntegrityError::field(
                "flags",
                format!("unknown flags {:#x}", self.flags & !SB_KNOWN_FLAGS),
            ));
        }
        if self.integrity_tag_size == 0 || self.integrity_tag_size > MAX_TAG_SIZE {
            return Err(IntegrityError::field(
                "integrity_tag_size",
                format!("{} is not in 1..={MAX_TAG_SIZE}", self.integrity_tag_size),
            ));
        }
        if u32::from(self.log2_sectors_per_block) > MAX_SECTORS_PER_BLOCK.trailing_zeros() {
            return Err(IntegrityError::field(
                "log2_sectors_per_block",
                format!(
                    "{} (a block of {} sectors; at most 8)",
                    self.log2_sectors_per_block,
                    1u64.checked_shl(u32::from(self.log2_sectors_per_block))
                        .unwrap_or(0)
                ),
            ));
        }
        let inline = self.flags & SB_FLAG_INLINE != 0;
        if inline != (self.journal_sections == 0) {
            return Err(IntegrityError::field(
                "journal_sections",
                if inline {
                    "must be 0 in inline mode".to_string()
                } else {
                    "is 0 (corrupted superblock)".to_string()
                },
            ));
        }
        let il = self.log2_interleave_sectors;
        if il != 0 && !(MIN_LOG2_INTERLEAVE_SECTORS..=MAX_LOG2_INTERLEAVE_SECTORS).contains(&il) {
            return Err(IntegrityError::field(
                "log2_interleave_sectors",
                format!("{il} is not in 3..=31 (or 0 with a metadata device)"),
            ));
        }
        if il != 0 && il < self.log2_sectors_per_block {
            return Err(IntegrityError::field(
                "log2_interleave_sectors",
                format!(
                    "{il} is smaller than the block (log2 {})",
                    self.log2_sectors_per_block
                ),
            ));
        }
        if self.provided_data_sectors == 0 {
            return Err(IntegrityError::field("provided_data_sectors", "is 0"));
        }
        let spb_mask = (1u64 << self.log2_sectors_per_block) - 1;
        if self.provided_data_sectors & spb_mask != 0 {
            return Err(IntegrityError::field(
                "provided_data_sectors",
                format!(
                    "{} is not a whole number of {}-byte blocks",
                    self.provided_data_sectors,
                    512u64 << self.log2_sectors_per_block
                ),
            ));
        }
        if u32::from(self.log2_blocks_per_bitmap_bit) + u32::from(self.log2_sectors_per_block) >= 64
        {
            return Err(IntegrityError::field(
                "log2_blocks_per_bitmap_bit",
                format!("{} is out of range", self.log2_blocks_per_bitmap_bit),
            ));
        }
        Ok(())
    }

    /// What dmkit refuses beyond [`parse`](Superblock::parse), as integritysetup 2.6's dump
    /// does: a version newer than [`SUPPORTED_VERSION_MAX`] (6, inline mode, keeps the tags in
    /// the device's integrity profile, which a file has not). The one check that `dump`,
    /// `verify` and `open` (through [`Layout::from_superblock`](super::rw_meta::Layout)) all
    /// make, so that `open` can never serve a superblock `dump` refuses.
    pub fn check_supported(&self) -> Result<()> {
        if self.version > SUPPORTED_VERSION_MAX {
            return Err(IntegrityError::field(
                "version",
                format!(
                    "superblock version {} (inline mode) is not supported",
                    self.version
                ),
            ));
        }
        Ok(())
    }

    /// Encode as the kernel writes it (unused bytes zero).
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        self.encode_into(&mut b)
            .expect("every field lies inside the 512-byte superblock");
        b
    }

    /// Write the magic and every field at its offset into `b`.
    fn encode_into(&self, b: &mut [u8]) -> std::result::Result<(), codec::Error> {
        let mut w = SliceWriter::new(b);
        w.bytes(MAGIC, "magic")?;
        w.seek(offset::VERSION, "version")?.u8(self.version)?;
        w.seek(offset::LOG2_INTERLEAVE_SECTORS, "log2_interleave_sectors")?
            .u8(self.log2_interleave_sectors)?;
        w.seek(offset::INTEGRITY_TAG_SIZE, "integrity_tag_size")?
            .u16_le(self.integrity_tag_size)?;
        w.seek(offset::JOURNAL_SECTIONS, "journal_sections")?
            .u32_le(self.journal_sections)?;
        w.seek(offset::PROVIDED_DATA_SECTORS, "provided_data_sectors")?
            .u64_le(self.provided_data_sectors)?;
        w.seek(offset::FLAGS, "flags")?.u32_le(self.flags)?;
        w.seek(offset::LOG2_SECTORS_PER_BLOCK, "log2_sectors_per_block")?
            .u8(self.log2_sectors_per_block)?;
        w.seek(
            offset::LOG2_BLOCKS_PER_BITMAP_BIT,
            "log2_blocks_per_bitmap_bit",
        )?
        .u8(self.log2_blocks_per_bitmap_bit)?;
        w.seek(offset::RECALC_SECTOR, "recalc_sector")?
            .u64_le(self.recalc_sector)?;
        w.seek(offset::TRANSACTION_ID, "transaction_id")?
            .u64_le(self.transaction_id)?;
        w.seek(offset::SALT, "salt")?.bytes(&self.salt, "salt")?;
        Ok(())
    }

    /// The version the kernel's `sb_set_version()` gives these flags (bitmap mode and a
    /// separate metadata device also raise it).
    pub fn version_for(flags: u32, bitmap_mode: bool, meta_device: bool) -> u8 {
        if flags & SB_FLAG_INLINE != 0 {
            6
        } else if flags & SB_FLAG_FIXED_HMAC != 0 {
            5
        } else if flags & SB_FLAG_FIXED_PADDING != 0 {
            4
        } else if bitmap_mode || flags & SB_FLAG_DIRTY_BITMAP != 0 {
            3
        } else if meta_device || flags & SB_FLAG_RECALCULATING != 0 {
            2
        } else {
            1
        }
    }

    /// Bytes per block (the sector size of the mapped device).
    pub fn sector_size(&self) -> u32 {
        512 << self.log2_sectors_per_block
    }

    /// Whether a flag is set.
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }
}

/// Read `len` bytes at `offset` of `dev` through a 4 KiB-aligned buffer (so a device opened
/// with `O_DIRECT` takes it; `offset` and `len` must then be multiples of its block size).
pub fn read_aligned(dev: &dyn BlockDevice, offset: u64, len: usize) -> Result<Vec<u8>> {
    let mut raw = vec![0u8; len + 4096];
    let off = raw.as_ptr().align_offset(4096).min(4096);
    dev.read_at(&mut raw[off..off + len], offset)?;
    raw.truncate(off + len);
    raw.drain(..off);
    Ok(raw)
}

/// Read and parse the superblock of `dev` (the first 4 KiB are read, aligned, so a device
/// opened with `O_DIRECT` works). A device shorter than a superblock is `Truncated`.
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let size = dev.size();
    if size < SUPERBLOCK_SIZE as u64 {
        return Err(IntegrityError::Truncated(size as usize));
    }
    let len = if size >= 4096 { 4096 } else { SUPERBLOCK_SIZE };
    Superblock::parse(&read_aligned(dev, 0, len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            version: 5,
            log2_interleave_sectors: 15,
            integrity_tag_size: 4,
            journal_sections: 17,
            provided_data_sectors: 12345 * 8,
            flags: SB_FLAG_FIXED_PADDING | SB_FLAG_FIXED_HMAC,
            log2_sectors_per_block: 3,
            log2_blocks_per_bitmap_bit: 12,
            recalc_sector: 0,
            transaction_id: 0,
            salt: *b"0123456789abcdef",
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let bytes = sb.encode();
        assert_eq!(&bytes[0..8], b"integrt\0");
        assert_eq!(bytes[8], 5);
        assert_eq!(&bytes[48..64], b"0123456789abcdef");
        assert!(bytes[64..].iter().all(|&b| b == 0));
        assert_eq!(Superblock::parse(&bytes).unwrap(), sb);
    }

    #[test]
    fn refusals_name_the_field() {
        let good = sample().encode();
        let cases: Vec<(usize, u8, &str)> = vec![
            (0, b'X', "magic"),
            (8, 0, "version"),
            (8, 7, "version"),
            (9, 2, "log2_interleave_sectors"),
            (9, 32, "log2_interleave_sectors"),
            (10, 0, "integrity_tag_size"),
            (11, 2, "integrity_tag_size"),
            (27, 0x80, "flags"),
            (28, 4, "log2_sectors_per_block"),
            (29, 61, "log2_blocks_per_bitmap_bit"),
        ];
        for (off, val, field) in cases {
            let mut b = good;
            b[off] = val;
            let e = Superblock::parse(&b).unwrap_err().to_string();
            assert!(e.starts_with(field), "byte {off} = {val}: {e}");
        }
        let mut b = good;
        b[12..16].fill(0);
        assert!(Superblock::parse(&b)
            .unwrap_err()
            .to_string()
            .starts_with("journal_sections"));
        let mut b = good;
        b[16..24].fill(0);
        assert!(Superblock::parse(&b)
            .unwrap_err()
            .to_string()
            .starts_with("provided_data_sectors"));
        let mut b = good;
        b[16] = 1;
        assert!(Superblock::parse(&b)
            .unwrap_err()
            .to_string()
            .starts_with("provided_data_sectors"));
        assert!(matches!(
            Superblock::parse(&good[..100]),
            Err(IntegrityError::Truncated(100))
        ));
    }

    #[test]
    fn versions() {
        assert_eq!(
            Superblock::version_for(SB_FLAG_FIXED_HMAC | SB_FLAG_FIXED_PADDING, true, false),
            5
        );
        assert_eq!(
            Superblock::version_for(SB_FLAG_FIXED_PADDING, false, false),
            4
        );
        assert_eq!(Superblock::version_for(0, true, false), 3);
        assert_eq!(Superblock::version_for(0, false, true), 2);
        assert_eq!(Superblock::version_for(0, false, false), 1);
    }
}
