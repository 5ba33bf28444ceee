//! GUID partition tables: writing one for a new disk image, and reading one from an untrusted
//! image without trusting any of its lengths or offsets.
//!
//! Layout written (512-byte sectors, as libfdisk writes for systemd-repart):
//!
//! ```text
//! LBA 0        protective MBR (one 0xEE partition over the whole disk)
//! LBA 1        primary header (92 bytes, CRC32)
//! LBA 2..33    128 entries of 128 bytes (CRC32 over the array)
//! ...          partitions, from LBA 2048 (first usable), each 4 KiB aligned
//! LBA n-33..   backup entries, then the backup header in the last sector
//! ```
//!
//! GUIDs are kept in text order (the bytes of `8-4-4-4-12`, as systemd's `sd_id128_t`); on
//! disk the first three fields are little-endian ([`to_disk`], [`from_disk`]).

/// The sector size dmkit writes.
pub const SECTOR: u64 = 512;
/// Entries in the table dmkit writes (the UEFI minimum array of 16 KiB).
pub const ENTRIES: u32 = 128;
/// Size of one entry.
pub const ENTRY_SIZE: u32 = 128;
/// Bytes of the header that are checksummed.
pub const HEADER_SIZE: u32 = 92;
/// The first usable LBA dmkit writes (1 MiB, as libfdisk aligns).
pub const FIRST_USABLE_LBA: u64 = 2048;
/// Largest entry array accepted when reading (bytes): far above any real table.
const MAX_ARRAY_BYTES: u64 = 1 << 20;
/// GPT attribute bit 60: the partition is read-only (Discoverable Partitions Specification).
pub const FLAG_READ_ONLY: u64 = 1 << 60;

/// A 16-byte GUID in text order.
pub type Guid = [u8; 16];

/// Why a partition table was refused; each names the structure and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GptError {
    /// No "EFI PART" header at LBA 1 (for any sector size) nor in the last sector.
    #[error("not a GPT disk image (no \"EFI PART\" header at LBA 1 or in the last sector)")]
    NotGpt,
    /// A header field is out of range or inconsistent.
    #[error("GPT {which} header: {field}: {what}")]
    Header {
        /// "primary" or "backup".
        which: &'static str,
        /// The field.
        field: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A partition entry is inconsistent.
    #[error("GPT partition entry {index}: {field}: {what}")]
    Entry {
        /// Entry index (1-based, as partition numbers).
        index: u32,
        /// The field.
        field: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The table describes a larger disk than the file holds.
    #[error(
        "truncated: the partition table describes {need} bytes ({what}), the image has {have}"
    )]
    Truncated {
        /// Bytes the table needs.
        need: u64,
        /// What lies there.
        what: String,
        /// Bytes there are.
        have: u64,
    },
    /// Reading failed.
    #[error("{0}")]
    Io(String),
}

/// One used partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Partition number (1-based entry index).
    pub number: u32,
    /// Partition type GUID.
    pub type_guid: Guid,
    /// Unique partition GUID.
    pub guid: Guid,
    /// First sector.
    pub first_lba: u64,
    /// Last sector (inclusive).
    pub last_lba: u64,
    /// Attribute bits.
    pub flags: u64,
    /// Name (UTF-16LE on disk, up to 36 units).
    pub name: String,
}

impl Entry {
    /// Byte offset of the partition for `sector` bytes per sector.
    pub fn offset(&self, sector: u64) -> u64 {
        self.first_lba * sector
    }
    /// Size in bytes for `sector` bytes per sector.
    pub fn size(&self, sector: u64) -> u64 {
        (self.last_lba - self.first_lba + 1) * sector
    }
}

/// A parsed partition table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpt {
    /// Bytes per sector (found by where the header is).
    pub sector_size: u64,
    /// Disk GUID.
    pub disk_guid: Guid,
    /// First usable LBA.
    pub first_usable: u64,
    /// Last usable LBA.
    pub last_usable: u64,
    /// Whether the primary header was damaged and the backup was used.
    pub from_backup: bool,
    /// The used entries, by partition number.
    pub entries: Vec<Entry>,
}

/// A partition to write.
#[derive(Debug, Clone)]
pub struct NewPartition {
    /// Type GUID.
    pub type_guid: Guid,
    /// Unique GUID.
    pub guid: Guid,
    /// Byte offset (a multiple of [`SECTOR`]).
    pub offset: u64,
    /// Byte size (a multiple of [`SECTOR`], not zero).
    pub size: u64,
    /// Attribute bits.
    pub flags: u64,
    /// Name (at most 36 UTF-16 units).
    pub name: String,
}

/// Swap a GUID between text order and the on-disk mixed-endian order (its own inverse).
pub fn to_disk(g: &Guid) -> Guid {
    let mut d = *g;
    d[0..4].reverse();
    d[4..6].reverse();
    d[6..8].reverse();
    d
}

/// The on-disk mixed-endian GUID in text order.
pub fn from_disk(d: &Guid) -> Guid {
    to_disk(d)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn guid_at(b: &[u8], o: usize) -> Guid {
    from_disk(&b[o..o + 16].try_into().expect("16 bytes"))
}

/// Sectors of an entry array of `ENTRIES` entries.
fn array_sectors() -> u64 {
    (ENTRIES as u64 * ENTRY_SIZE as u64).div_ceil(SECTOR)
}

/// The smallest disk (bytes) holding partitions that end at byte `end`: the backup array and
/// header after them, the whole rounded up to 4 KiB.
pub fn disk_size_for(end: u64) -> u64 {
    let sectors = end.div_ceil(SECTOR) + array_sectors() + 1;
    (sectors * SECTOR).div_ceil(4096) * 4096
}

/// The GPT structures of a new disk: the bytes to write at offset 0 (protective MBR, primary
/// header and entries) and the bytes to write at `backup_offset` (backup entries and header,
/// up to the end of the disk).
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Sectors 0 to 33.
    pub primary: Vec<u8>,
    /// Where [`Encoded::backup`] goes.
    pub backup_offset: u64,
    /// The backup array and header.
    pub backup: Vec<u8>,
}

/// Encode the tables of a disk of `disk_size` bytes holding `parts` (in partition-number
/// order). Panics on a layout the caller should not produce (overlaps, misalignment, names
/// too long): they are computed, never taken from input.
pub fn encode(disk_size: u64, disk_guid: &Guid, parts: &[NewPartition]) -> Encoded {
    assert!(disk_size.is_multiple_of(SECTOR) && parts.len() <= ENTRIES as usize);
    let total = disk_size / SECTOR;
    let last_lba = total - 1;
    let arr = array_sectors();
    let last_usable = last_lba - arr - 1;
    let mut array = vec![0u8; (arr * SECTOR) as usize];
    let mut prev_end = FIRST_USABLE_LBA;
    for (i, p) in parts.iter().enumerate() {
        assert!(p.offset.is_multiple_of(SECTOR) && p.size.is_multiple_of(SECTOR) && p.size > 0);
        let first = p.offset / SECTOR;
        let last = first + p.size / SECTOR - 1;
        assert!(
            first >= prev_end && last <= last_usable,
            "partition {i} out of place"
        );
        prev_end = last + 1;
        let e = &mut array[i * ENTRY_SIZE as usize..(i + 1) * ENTRY_SIZE as usize];
        e[0..16].copy_from_slice(&to_disk(&p.type_guid));
        e[16..32].copy_from_slice(&to_disk(&p.guid));
        e[32..40].copy_from_slice(&first.to_le_bytes());
        e[40..48].copy_from_slice(&last.to_le_bytes());
        e[48..56].copy_from_slice(&p.flags.to_le_bytes());
        let units: Vec<u16> = p.name.encode_utf16().collect();
        assert!(units.len() <= 36, "partition name too long");
        for (k, u) in units.iter().enumerate() {
            e[56 + 2 * k..58 + 2 * k].copy_from_slice(&u.to_le_bytes());
        }
    }
    let array_crc = crc32fast::hash(&array);
    let header = |my: u64, alt: u64, entries_lba: u64| {
        let mut h = vec![0u8; SECTOR as usize];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&HEADER_SIZE.to_le_bytes());
        h[24..32].copy_from_slice(&my.to_le_bytes());
        h[32..40].copy_from_slice(&alt.to_le_bytes());
        h[40..48].copy_from_slice(&FIRST_USABLE_LBA.to_le_bytes());
        h[48..56].copy_from_slice(&last_usable.to_le_bytes());
        h[56..72].copy_from_slice(&to_disk(disk_guid));
        h[72..80].copy_from_slice(&entries_lba.to_le_bytes());
        h[80..84].copy_from_slice(&ENTRIES.to_le_bytes());
        h[84..88].copy_from_slice(&ENTRY_SIZE.to_le_bytes());
        h[88..92].copy_from_slice(&array_crc.to_le_bytes());
        let crc = crc32fast::hash(&h[..HEADER_SIZE as usize]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        h
    };
    let mut primary = vec![0u8; SECTOR as usize];
    // Protective MBR: one partition of type 0xEE from LBA 1 over the disk (capped at 2^32-1).
    let mbr = &mut primary[446..462];
    mbr[1..4].copy_from_slice(&[0x00, 0x02, 0x00]);
    mbr[4] = 0xEE;
    mbr[5..8].copy_from_slice(&[0xFF, 0xFF, 0xFF]);
    mbr[8..12].copy_from_slice(&1u32.to_le_bytes());
    let mbr_size = (total - 1).min(u32::MAX as u64) as u32;
    mbr[12..16].copy_from_slice(&mbr_size.to_le_bytes());
    primary[510] = 0x55;
    primary[511] = 0xAA;
    primary.extend_from_slice(&header(1, last_lba, 2));
    primary.extend_from_slice(&array);
    let mut backup = array;
    backup.extend_from_slice(&header(last_lba, 1, last_lba - arr));
    Encoded {
        primary,
        backup_offset: (last_lba - arr) * SECTOR,
        backup,
    }
}

/// Read `len` bytes at `offset` of a source of `size` bytes; `None` past its end.
pub trait Source {
    /// Total size in bytes.
    fn size(&self) -> u64;
    /// Fill `buf` from `offset` (inside the source).
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), String>;
}

impl Source for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), String> {
        let start = usize::try_from(offset).map_err(|_| "offset out of range".to_string())?;
        let src = self
            .get(start..start.saturating_add(buf.len()))
            .ok_or("read past the end")?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl<D: crate::block::BlockDevice + ?Sized> Source for D {
    fn size(&self) -> u64 {
        crate::block::BlockDevice::size(self)
    }
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), String> {
        self.read_at(buf, offset).map_err(|e| e.to_string())
    }
}

fn read_vec(src: &(impl Source + ?Sized), offset: u64, len: u64) -> Result<Vec<u8>, GptError> {
    let end = offset.checked_add(len).filter(|&e| e <= src.size());
    if end.is_none() {
        return Err(GptError::Truncated {
            need: offset.saturating_add(len),
            what: format!("{len} bytes at byte {offset}"),
            have: src.size(),
        });
    }
    let mut buf = vec![0u8; len as usize];
    src.read(&mut buf, offset).map_err(GptError::Io)?;
    Ok(buf)
}

/// Parse the partition table of `src`: the primary header, or the backup when the primary is
/// damaged. Every length, offset and checksum is checked before use.
pub fn parse(src: &(impl Source + ?Sized)) -> Result<Gpt, GptError> {
    let size = src.size();
    // The header sits at LBA 1: byte 512, 1024, 2048 or 4096 depending on the sector size.
    let mut primary_err = None;
    for sector in [512u64, 1024, 2048, 4096] {
        if size < 2 * sector {
            break;
        }
        let sig = read_vec(src, sector, 8)?;
        if sig != b"EFI PART" {
            continue;
        }
        match parse_at(src, sector, 1, "primary") {
            Ok(g) => return Ok(g),
            Err(e) => {
                primary_err = Some((sector, e));
                break;
            }
        }
    }
    // The primary is missing or damaged: the backup header is in the last sector.
    let sector = primary_err.as_ref().map_or(SECTOR, |(s, _)| *s);
    let backup = if size >= 2 * sector && size.is_multiple_of(sector) {
        let last = size / sector - 1;
        let sig = read_vec(src, last * sector, 8)?;
        (sig == b"EFI PART").then(|| parse_at(src, sector, last, "backup"))
    } else {
        None
    };
    match (primary_err, backup) {
        (_, Some(Ok(mut g))) => {
            g.from_backup = true;
            Ok(g)
        }
        // The primary's error says more (a truncated image has lost its backup too).
        (Some((_, e)), _) => Err(e),
        (None, Some(Err(e))) => Err(e),
        (None, None) => Err(GptError::NotGpt),
    }
}

fn parse_at(
    src: &(impl Source + ?Sized),
    sector: u64,
    lba: u64,
    which: &'static str,
) -> Result<Gpt, GptError> {
    let bad = |field: &'static str, what: String| GptError::Header { which, field, what };
    let h = read_vec(src, lba * sector, sector)?;
    let rev = u32_at(&h, 8);
    if rev != 0x0001_0000 {
        return Err(bad("revision", format!("{rev:#010x}, expected 0x00010000")));
    }
    let hsize = u32_at(&h, 12) as u64;
    if !(HEADER_SIZE as u64..=sector).contains(&hsize) {
        return Err(bad(
            "header_size",
            format!("{hsize} bytes (from 92 to the sector size {sector})"),
        ));
    }
    let stored = u32_at(&h, 16);
    let mut zeroed = h[..hsize as usize].to_vec();
    zeroed[16..20].fill(0);
    let computed = crc32fast::hash(&zeroed);
    if stored != computed {
        return Err(bad(
            "header_crc32",
            format!("stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    let my = u64_at(&h, 24);
    if my != lba {
        return Err(bad(
            "my_lba",
            format!("{my}, but the header is at LBA {lba}"),
        ));
    }
    let alt = u64_at(&h, 32);
    let first_usable = u64_at(&h, 40);
    let last_usable = u64_at(&h, 48);
    let total = src.size() / sector;
    if first_usable > last_usable {
        return Err(bad(
            "first_usable_lba",
            format!("{first_usable} is after the last usable LBA {last_usable}"),
        ));
    }
    let disk_end = alt.max(last_usable).max(lba);
    if disk_end >= total {
        return Err(GptError::Truncated {
            need: disk_end.saturating_add(1).saturating_mul(sector),
            what: format!("the {which} header names LBA {disk_end}"),
            have: src.size(),
        });
    }
    let entries_lba = u64_at(&h, 72);
    let count = u32_at(&h, 80);
    let esize = u32_at(&h, 84);
    if esize < 128 || !esize.is_power_of_two() || esize as u64 > sector {
        return Err(bad(
            "size_of_partition_entry",
            format!("{esize} (128 times a power of two, at most a sector)"),
        ));
    }
    let array_bytes = count as u64 * esize as u64;
    if array_bytes > MAX_ARRAY_BYTES {
        return Err(bad(
            "number_of_partition_entries",
            format!("{count} entries of {esize} bytes exceed {MAX_ARRAY_BYTES} bytes"),
        ));
    }
    let array_start = entries_lba.checked_mul(sector).ok_or_else(|| {
        bad(
            "partition_entry_lba",
            format!("{entries_lba} is out of range"),
        )
    })?;
    let array_end_lba = entries_lba + array_bytes.div_ceil(sector);
    let inside_usable = entries_lba <= last_usable && array_end_lba > first_usable;
    if entries_lba < 2 || inside_usable || array_end_lba > total {
        return Err(bad(
            "partition_entry_lba",
            format!(
                "{entries_lba}: the entry array (LBA {entries_lba} to {array_end_lba}) must lie \
                 inside the disk, outside the usable LBAs {first_usable} to {last_usable}"
            ),
        ));
    }
    let array = read_vec(src, array_start, array_bytes)?;
    let stored = u32_at(&h, 88);
    let computed = crc32fast::hash(&array);
    if stored != computed {
        return Err(bad(
            "partition_entry_array_crc32",
            format!("stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    let mut entries: Vec<Entry> = Vec::new();
    for (i, e) in array.chunks_exact(esize as usize).enumerate() {
        let number = i as u32 + 1;
        let type_guid = guid_at(e, 0);
        if type_guid == [0; 16] {
            continue;
        }
        let ebad = |field: &'static str, what: String| GptError::Entry {
            index: number,
            field,
            what,
        };
        let first_lba = u64_at(e, 32);
        let last_lba = u64_at(e, 40);
        if first_lba > last_lba {
            return Err(ebad(
                "starting_lba",
                format!("{first_lba} is after the ending LBA {last_lba}"),
            ));
        }
        if first_lba < first_usable || last_lba > last_usable {
            return Err(ebad(
                "ending_lba",
                format!(
                    "LBA {first_lba} to {last_lba} lies outside the usable LBAs {first_usable} to {last_usable}"
                ),
            ));
        }
        let units: Vec<u16> = e[56..128]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&u| u != 0)
            .collect();
        entries.push(Entry {
            number,
            type_guid,
            guid: guid_at(e, 16),
            first_lba,
            last_lba,
            flags: u64_at(e, 48),
            name: String::from_utf16_lossy(&units),
        });
    }
    let mut by_start: Vec<&Entry> = entries.iter().collect();
    by_start.sort_by_key(|e| e.first_lba);
    if let Some(w) = by_start
        .windows(2)
        .find(|w| w[1].first_lba <= w[0].last_lba)
    {
        return Err(GptError::Entry {
            index: w[1].number,
            field: "starting_lba",
            what: format!(
                "LBA {} to {} overlaps partition {} (LBA {} to {})",
                w[1].first_lba, w[1].last_lba, w[0].number, w[0].first_lba, w[0].last_lba
            ),
        });
    }
    Ok(Gpt {
        sector_size: sector,
        disk_guid: guid_at(&h, 56),
        first_usable,
        last_usable,
        from_backup: false,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<u8>, Vec<NewPartition>) {
        let parts = vec![
            NewPartition {
                type_guid: [1; 16],
                guid: [2; 16],
                offset: FIRST_USABLE_LBA * SECTOR,
                size: 8192,
                flags: FLAG_READ_ONLY,
                name: "root-x86-64".into(),
            },
            NewPartition {
                type_guid: [3; 16],
                guid: [4; 16],
                offset: FIRST_USABLE_LBA * SECTOR + 8192,
                size: 4096,
                flags: 0,
                name: "ünïcode".into(),
            },
        ];
        let size = disk_size_for(FIRST_USABLE_LBA * SECTOR + 12288);
        let e = encode(size, &[9; 16], &parts);
        let mut disk = vec![0u8; size as usize];
        disk[..e.primary.len()].copy_from_slice(&e.primary);
        let b = e.backup_offset as usize;
        disk[b..b + e.backup.len()].copy_from_slice(&e.backup);
        assert_eq!(b + e.backup.len(), disk.len());
        (disk, parts)
    }

    #[test]
    fn round_trip() {
        let (disk, parts) = sample();
        let g = parse(&disk[..]).unwrap();
        assert_eq!(g.sector_size, 512);
        assert_eq!(g.disk_guid, [9; 16]);
        assert!(!g.from_backup);
        assert_eq!(g.entries.len(), 2);
        for (e, p) in g.entries.iter().zip(&parts) {
            assert_eq!(
                (e.type_guid, e.guid, e.flags),
                (p.type_guid, p.guid, p.flags)
            );
            assert_eq!((e.offset(512), e.size(512)), (p.offset, p.size));
            assert_eq!(e.name, p.name);
        }
    }

    #[test]
    fn mixed_endian_guids() {
        let g: Guid = hex::decode("4f68bce3e8cd4db196e7fbcaf984b709")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(hex::encode(to_disk(&g)), "e3bc684fcde8b14d96e7fbcaf984b709");
        assert_eq!(from_disk(&to_disk(&g)), g);
    }

    #[test]
    fn damaged_primary_falls_back_to_backup() {
        let (mut disk, _) = sample();
        disk[512 + 40] ^= 1;
        let g = parse(&disk[..]).unwrap();
        assert!(g.from_backup);
        assert_eq!(g.entries.len(), 2);
        // Both damaged: the primary's error is reported.
        let n = disk.len();
        disk[n - 512 + 40] ^= 1;
        let e = parse(&disk[..]).unwrap_err();
        assert!(e.to_string().contains("header_crc32"), "{e}");
    }

    #[test]
    fn refuses_bad_input() {
        assert_eq!(parse(&[0u8; 4096][..]), Err(GptError::NotGpt));
        assert_eq!(parse(&[0u8; 10][..]), Err(GptError::NotGpt));
        let (disk, _) = sample();
        // Truncated: the header names sectors the file does not have.
        let e = parse(&disk[..disk.len() - 4096]).unwrap_err();
        assert!(matches!(e, GptError::Truncated { .. }), "{e}");
        // A corrupt entry array.
        let mut d = disk.clone();
        d[1024 + 60] ^= 1;
        d[disk.len() - 512 - 16384 + 60] ^= 1;
        let e = parse(&d[..]).unwrap_err();
        assert!(e.to_string().contains("partition_entry_array_crc32"), "{e}");
    }

    #[test]
    fn fuzz_seed_is_a_valid_table() {
        // fuzz/seeds/image_gpt: a disk size, then LBA 1 onwards (the fuzz target's layout).
        let seed = include_bytes!("../../fuzz/seeds/image_gpt/three-partitions");
        let size = u32::from_le_bytes(seed[..4].try_into().unwrap()) as usize;
        let mut disk = vec![0u8; size];
        disk[512..512 + seed.len() - 4].copy_from_slice(&seed[4..]);
        let g = parse(&disk[..]).unwrap();
        assert_eq!(g.entries.len(), 3);
        assert_eq!(g.entries[2].name, "root-x86-64-verity-sig");
    }
}
