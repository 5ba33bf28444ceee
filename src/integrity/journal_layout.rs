//! The journal's on-disk encoding, as the kernel's `create_journal()`, `init_journal()`,
//! `__journal_read_write()` and `replay_journal()` read and write it.
//!
//! The journal is `journal_sections` sections right after the superblock area. A section is
//! [`JOURNAL_BLOCK_SECTORS`] sectors of entries followed by the entries' data, one block per
//! entry. **Every** 512-byte journal sector ends with an 8-byte commit id:
//!
//! ```text
//! journal sector:  | 496 bytes entries (or data) | 8 bytes MAC (or data) | le64 commit id |
//! entry:           | le64 sector | le64 last_bytes[sectors_per_block] | tag | pad to 8 |
//! commit id:       commit_ids[seq] ^ ((section << 32) ^ sector_in_section)
//! ```
//!
//! An entry's `sector` has its high half `0xffffffff` when unused and `0xfffffffe` while it
//! is being written. A data sector's last 8 bytes are displaced by the commit id; the entry
//! keeps them in `last_bytes`. A section is committed when all its sectors carry the commit
//! id of one sequence number (0..4, cycling).
//!
//! With a journal MAC or journal encryption the layout stays the same but the sectors are
//! MACed or encrypted; neither is supported here (the superblock flag is refused upstream).

use super::error::{IntegrityError, Result};
use super::geometry::{Geometry, JOURNAL_BLOCK_SECTORS};
use crate::codec::{self, Reader, SliceWriter};

/// The four commit ids of `create_journal()`, indexed by commit sequence number.
pub const COMMIT_IDS: [u64; N_COMMIT_IDS] = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x3333_3333_3333_3333,
    0x4444_4444_4444_4444,
];
/// Number of commit sequence numbers.
pub const N_COMMIT_IDS: usize = 4;
/// Bytes of a journal sector before its commit id.
pub const JOURNAL_SECTOR_DATA: usize = 504;
/// High half of an unused entry's sector number.
pub const ENTRY_UNUSED: u32 = 0xffff_ffff;
/// High half of an entry's sector number while it is being written.
pub const ENTRY_IN_PROGRESS: u32 = 0xffff_fffe;

/// The commit id of sector `sector` (0-based, within the section) of section `section` for
/// commit sequence `seq` (`dm_integrity_commit_id()`): stored little-endian in the sector's
/// last 8 bytes.
pub fn commit_id(section: u32, sector: u32, seq: u8) -> u64 {
    COMMIT_IDS[usize::from(seq) % N_COMMIT_IDS] ^ ((u64::from(section) << 32) ^ u64::from(sector))
}

/// The sequence number whose commit id `id` is at that place (`find_commit_seq()`), or
/// `None`: a garbage commit id (the kernel fails the device with "journal commit id").
pub fn commit_seq_of(section: u32, sector: u32, id: u64) -> Option<u8> {
    (0..N_COMMIT_IDS as u8).find(|&k| commit_id(section, sector, k) == id)
}

/// The next commit sequence number.
pub fn next_commit_seq(seq: u8) -> u8 {
    (seq + 1) % N_COMMIT_IDS as u8
}

/// The previous commit sequence number.
pub fn prev_commit_seq(seq: u8) -> u8 {
    (seq + N_COMMIT_IDS as u8 - 1) % N_COMMIT_IDS as u8
}

/// The commit id stored in a 512-byte journal sector.
pub fn sector_commit_id(sector: &[u8]) -> Result<u64> {
    Ok(
        Reader::at(sector, JOURNAL_SECTOR_DATA, "journal commit id")?
            .u64_le("journal commit id")?,
    )
}

/// Store a commit id in a 512-byte journal sector.
///
/// Panics when `sector` is shorter than 512 bytes (the callers hand whole sectors).
pub fn set_sector_commit_id(sector: &mut [u8], id: u64) {
    SliceWriter::new(&mut sector[..512])
        .seek(JOURNAL_SECTOR_DATA, "journal commit id")
        .and_then(|w| w.u64_le(id))
        .expect("a journal sector holds its commit id");
}

/// What an entry's sector field says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// No data (the high half is `0xffffffff`).
    Unused,
    /// Being written (`0xfffffffe`): never replayed.
    InProgress,
    /// Holds the block at this logical sector.
    Sector(u64),
}

/// A decoded journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The sector field.
    pub state: EntryState,
    /// The displaced last 8 bytes of each 512-byte sector of the block (raw, as on disk).
    pub last_bytes: Vec<[u8; 8]>,
    /// The block's tag.
    pub tag: Vec<u8>,
}

impl JournalEntry {
    /// An unused entry as `init_journal()` leaves it (all zero but the sector's high half).
    pub fn unused(sectors_per_block: u32, tag_size: u32) -> JournalEntry {
        JournalEntry {
            state: EntryState::Unused,
            last_bytes: vec![[0; 8]; sectors_per_block as usize],
            tag: vec![0; tag_size as usize],
        }
    }

    /// Decode the entry at the start of `bytes` (at least the entry size) for blocks of
    /// `sectors_per_block` sectors and tags of `tag_size` bytes.
    pub fn decode(bytes: &[u8], sectors_per_block: u32, tag_size: u32) -> Result<JournalEntry> {
        let spb = sectors_per_block as usize;
        let need = 8 + 8 * spb + tag_size as usize;
        if bytes.len() < need {
            return Err(IntegrityError::field(
                "journal entry",
                format!("{} bytes, need {need}", bytes.len()),
            ));
        }
        let mut r = Reader::new(&bytes[..need]);
        let raw = r.u64_le("journal entry sector")?;
        let hi = (raw >> 32) as u32;
        let state = match hi {
            ENTRY_UNUSED => EntryState::Unused,
            ENTRY_IN_PROGRESS => EntryState::InProgress,
            _ => EntryState::Sector(raw),
        };
        let last_bytes = (0..spb)
            .map(|_| r.array("journal entry last bytes"))
            .collect::<std::result::Result<_, _>>()?;
        Ok(JournalEntry {
            state,
            last_bytes,
            tag: r.take(tag_size as usize, "journal entry tag")?.to_vec(),
        })
    }

    /// Encode into the start of `bytes` (the entry's bytes; the padding after the tag is left
    /// untouched). An unused or in-progress entry stores its marker in the sector's high half
    /// and zero in the low half, as `init_journal()` leaves it.
    ///
    /// Panics when `bytes` is shorter than the entry (the geometry sizes every caller's slice).
    pub fn encode(&self, bytes: &mut [u8]) {
        self.encode_into(&mut SliceWriter::new(bytes))
            .expect("an entry's bytes hold the entry");
    }

    fn encode_into(&self, w: &mut SliceWriter<'_>) -> std::result::Result<(), codec::Error> {
        w.u64_le(match self.state {
            EntryState::Unused => u64::from(ENTRY_UNUSED) << 32,
            EntryState::InProgress => u64::from(ENTRY_IN_PROGRESS) << 32,
            EntryState::Sector(s) => s,
        })?;
        for lb in &self.last_bytes {
            w.bytes(lb, "journal entry last bytes")?;
        }
        w.bytes(&self.tag, "journal entry tag")?;
        Ok(())
    }
}

/// Byte offset of entry `entry` within a section's bytes.
pub fn entry_offset(geom: &Geometry, entry: u32) -> usize {
    let per = geom.journal_entries_per_sector();
    (entry / per) as usize * 512 + (entry % per * geom.journal_entry_size()) as usize
}

/// Byte offset of entry `entry`'s data within a section's bytes.
pub fn entry_data_offset(geom: &Geometry, entry: u32) -> usize {
    (JOURNAL_BLOCK_SECTORS as usize + ((entry as usize) << geom.log2_sectors_per_block())) * 512
}

/// Bytes of one section.
pub fn section_bytes(geom: &Geometry) -> usize {
    geom.journal_section_sectors() as usize * 512
}

/// Decode entry `entry` of a section's bytes.
pub fn decode_entry(geom: &Geometry, section: &[u8], entry: u32) -> Result<JournalEntry> {
    if entry >= geom.journal_section_entries() {
        return Err(IntegrityError::field(
            "journal entry",
            format!(
                "entry {entry} beyond {} per section",
                geom.journal_section_entries()
            ),
        ));
    }
    let off = entry_offset(geom, entry);
    let end = off + geom.journal_entry_size() as usize;
    if section.len() < end {
        return Err(IntegrityError::field("journal section", "truncated"));
    }
    JournalEntry::decode(
        &section[off..end],
        geom.sectors_per_block(),
        geom.tag_size(),
    )
}

/// Write entry `entry` into a section's bytes.
pub fn encode_entry(geom: &Geometry, section: &mut [u8], entry: u32, e: &JournalEntry) {
    let off = entry_offset(geom, entry);
    e.encode(&mut section[off..off + geom.journal_entry_size() as usize]);
}

/// The block of entry `entry` as it is to be written in place: the journal's data sectors
/// with each sector's last 8 bytes (the commit id) put back from the entry's `last_bytes`.
/// Refused (not a panic) when the entry lies beyond the section or `section` is short.
pub fn entry_block(
    geom: &Geometry,
    section: &[u8],
    entry: u32,
    e: &JournalEntry,
) -> Result<Vec<u8>> {
    let off = entry_data_offset(geom, entry);
    let end = off + geom.sector_size() as usize;
    if entry >= geom.journal_section_entries() || section.len() < end {
        return Err(IntegrityError::field(
            "journal entry",
            format!("the data of entry {entry} lies beyond the section"),
        ));
    }
    let mut block = section[off..end].to_vec();
    for (s, lb) in block.chunks_exact_mut(512).zip(&e.last_bytes) {
        s[JOURNAL_SECTOR_DATA..].copy_from_slice(lb);
    }
    Ok(block)
}

/// Put `block` into the journal as entry `entry`'s data: its sectors' last 8 bytes go into
/// the returned `last_bytes` (for the entry) and are not copied (the commit ids stay).
pub fn store_entry_block(
    geom: &Geometry,
    section: &mut [u8],
    entry: u32,
    block: &[u8],
) -> Vec<[u8; 8]> {
    let off = entry_data_offset(geom, entry);
    let dst = &mut section[off..off + geom.sector_size() as usize];
    let mut last = Vec::new();
    for (d, s) in dst.chunks_exact_mut(512).zip(block.chunks_exact(512)) {
        d[..JOURNAL_SECTOR_DATA].copy_from_slice(&s[..JOURNAL_SECTOR_DATA]);
        let mut lb = [0u8; 8];
        lb.copy_from_slice(&s[JOURNAL_SECTOR_DATA..]);
        last.push(lb);
    }
    last
}

/// Fill `section` (one section's bytes) as `init_journal()` does for section number
/// `index` and commit sequence `seq`: everything zero, every sector's commit id set, every
/// entry marked unused.
pub fn init_section(geom: &Geometry, section: &mut [u8], index: u32, seq: u8) {
    let bytes = section_bytes(geom);
    let section = &mut section[..bytes];
    section.fill(0);
    for (j, s) in section.chunks_exact_mut(512).enumerate() {
        set_sector_commit_id(s, commit_id(index, j as u32, seq));
    }
    let unused = JournalEntry::unused(0, 0);
    for e in 0..geom.journal_section_entries() {
        unused.encode(&mut section[entry_offset(geom, e)..]);
    }
}

/// The whole journal as a fresh volume has it (`init_journal(ic, 0, journal_sections, 0)`).
pub fn empty_journal(geom: &Geometry) -> Vec<u8> {
    let sb = section_bytes(geom);
    let mut j = vec![0u8; sb * geom.journal_sections() as usize];
    for (i, s) in j.chunks_exact_mut(sb).enumerate() {
        init_section(geom, s, i as u32, 0);
    }
    j
}

/// The commit sequence every sector of section `index` carries, or `Ok(None)` when the
/// sectors disagree (a section torn by a crash). A commit id of no sequence at all is an
/// error naming the sector.
pub fn section_commit_seq(geom: &Geometry, section: &[u8], index: u32) -> Result<Option<u8>> {
    if section.len() < section_bytes(geom) {
        return Err(IntegrityError::field("journal section", "truncated"));
    }
    let mut seq = None;
    let mut torn = false;
    for (j, s) in section[..section_bytes(geom)].chunks_exact(512).enumerate() {
        let id = sector_commit_id(s)?;
        let k = commit_seq_of(index, j as u32, id).ok_or_else(|| {
            IntegrityError::field(
                "journal commit id",
                format!("section {index} sector {j}: {id:#018x} is no commit id"),
            )
        })?;
        match seq {
            None => seq = Some(k),
            Some(p) if p != k => torn = true,
            _ => {}
        }
    }
    Ok(if torn { None } else { seq })
}

/// Summary of a journal read from disk: whether it holds entries that are not yet written
/// in place, as far as the on-disk state tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalSummary {
    /// Commit sequences seen in any sector.
    pub used_seqs: [bool; N_COMMIT_IDS],
    /// Entries that are not unused.
    pub used_entries: u64,
}

impl JournalSummary {
    /// Whether the journal holds no entry (nothing to replay).
    pub fn is_clean(&self) -> bool {
        self.used_entries == 0
    }
}

/// Check every commit id of `journal` (all sections' bytes) and count the used entries, as
/// the first pass of `replay_journal()` does. A garbage commit id is an error naming the
/// section and sector.
pub fn summarize(geom: &Geometry, journal: &[u8]) -> Result<JournalSummary> {
    let sb = section_bytes(geom);
    if journal.len() < sb * geom.journal_sections() as usize {
        return Err(IntegrityError::field("journal", "truncated"));
    }
    let mut used_seqs = [false; N_COMMIT_IDS];
    let mut used_entries = 0;
    for i in 0..geom.journal_sections() {
        let section = &journal[i as usize * sb..(i as usize + 1) * sb];
        for (j, s) in section.chunks_exact(512).enumerate() {
            let id = sector_commit_id(s)?;
            let k = commit_seq_of(i, j as u32, id).ok_or_else(|| {
                IntegrityError::field(
                    "journal commit id",
                    format!("section {i} sector {j}: {id:#018x} is no commit id"),
                )
            })?;
            used_seqs[usize::from(k)] = true;
        }
        for e in 0..geom.journal_section_entries() {
            let off = entry_offset(geom, e);
            let hi = Reader::at(section, off + 4, "journal entry sector")?
                .u32_le("journal entry sector")?;
            if hi != ENTRY_UNUSED {
                used_entries += 1;
            }
        }
    }
    Ok(JournalSummary {
        used_seqs,
        used_entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrity::geometry::tests::{fmt, sb};
    use crate::integrity::geometry::GeometryOptions;

    fn geom(tag: u16, ss: u32) -> Geometry {
        let sectors = 32768;
        let f = fmt(tag, ss, 0, 0, sectors);
        Geometry::new(&sb(f, tag), sectors, &GeometryOptions::default()).unwrap()
    }

    #[test]
    fn commit_ids_mix_section_and_sector() {
        assert_eq!(commit_id(0, 0, 0), 0x1111_1111_1111_1111);
        assert_eq!(commit_id(1, 2, 3), 0x4444_4444_4444_4444 ^ (1 << 32) ^ 2);
        for k in 0..4 {
            assert_eq!(commit_seq_of(7, 100, commit_id(7, 100, k)), Some(k));
        }
        assert_eq!(commit_seq_of(7, 100, commit_id(7, 101, 0)), None);
        assert_eq!(next_commit_seq(3), 0);
        assert_eq!(prev_commit_seq(0), 3);
    }

    #[test]
    fn empty_journal_is_clean_and_sequence_zero() {
        for (tag, ss) in [(4, 512), (32, 4096), (3, 1024)] {
            let g = geom(tag, ss);
            let j = empty_journal(&g);
            let s = summarize(&g, &j).unwrap();
            assert!(s.is_clean());
            assert_eq!(s.used_seqs, [true, false, false, false]);
            let sb = section_bytes(&g);
            for i in 0..g.journal_sections() {
                let sec = &j[i as usize * sb..][..sb];
                assert_eq!(section_commit_seq(&g, sec, i).unwrap(), Some(0));
                let e = decode_entry(&g, sec, g.journal_section_entries() - 1).unwrap();
                assert_eq!(e, JournalEntry::unused(g.sectors_per_block(), g.tag_size()));
            }
            // A garbage commit id is named.
            let mut bad = j.clone();
            bad[511] ^= 1;
            let e = summarize(&g, &bad).unwrap_err().to_string();
            assert!(
                e.starts_with("journal commit id: section 0 sector 0"),
                "{e}"
            );
        }
    }

    #[test]
    fn entry_and_block_round_trip() {
        let g = geom(32, 4096);
        let mut sec = vec![0u8; section_bytes(&g)];
        init_section(&g, &mut sec, 3, 1);
        let block: Vec<u8> = (0..4096).map(|i| (i % 253) as u8).collect();
        let last = store_entry_block(&g, &mut sec, 5, &block);
        let e = JournalEntry {
            state: EntryState::Sector(4096),
            last_bytes: last,
            tag: vec![9; 32],
        };
        encode_entry(&g, &mut sec, 5, &e);
        let d = decode_entry(&g, &sec, 5).unwrap();
        assert_eq!(d, e);
        assert_eq!(entry_block(&g, &sec, 5, &d).unwrap(), block);
        // The commit ids were left alone.
        assert_eq!(section_commit_seq(&g, &sec, 3).unwrap(), Some(1));
    }
}
