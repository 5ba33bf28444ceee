//! Arbitrary bytes in a dm-integrity journal: the first bytes choose a layout (tag size,
//! block size, sections) and a place in a freshly initialised journal, the rest is written
//! there (a section is far larger than a fuzz input, so the input patches a valid journal
//! instead of being one). Checking its commit ids, decoding every entry and restoring every
//! entry's block never panic, and a decoded entry encodes back to the same bytes.

#![no_main]

use dmkit::integrity::journal_layout::{
    decode_entry, empty_journal, entry_block, section_bytes, section_commit_seq, summarize,
    JournalEntry,
};
use dmkit::integrity::superblock::{SB_FLAG_FIXED_HMAC, SB_FLAG_FIXED_PADDING};
use dmkit::integrity::{Geometry, GeometryOptions, Superblock};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let tag = 1 + u16::from(data[0]) % 64;
    let log2_spb = data[1] % 4;
    let sections = 1 + u32::from(data[2] % 3);
    if data.len() < 8 {
        return;
    }
    let at = u32::from_le_bytes([data[4], data[5], data[6], data[7]]) as usize;
    let patch = &data[8..];
    let sb = Superblock {
        version: 5,
        log2_interleave_sectors: 15,
        integrity_tag_size: tag,
        journal_sections: sections,
        provided_data_sectors: 1 << 16,
        flags: SB_FLAG_FIXED_PADDING | SB_FLAG_FIXED_HMAC,
        log2_sectors_per_block: log2_spb,
        log2_blocks_per_bitmap_bit: 0,
        recalc_sector: 0,
        transaction_id: 0,
        salt: [0; 16],
    };
    let Ok(g) = Geometry::new(&sb, 1 << 18, &GeometryOptions::default()) else {
        return;
    };
    let mut journal = empty_journal(&g);
    let at = at % journal.len();
    let n = patch.len().min(journal.len() - at);
    journal[at..at + n].copy_from_slice(&patch[..n]);
    let journal = &journal[..];
    let _ = summarize(&g, journal);
    let sb_len = section_bytes(&g);
    for (i, section) in journal.chunks_exact(sb_len).enumerate() {
        let _ = section_commit_seq(&g, section, i as u32);
        for e in 0..g.journal_section_entries() {
            let Ok(entry) = decode_entry(&g, section, e) else {
                continue;
            };
            let _ = entry_block(&g, section, e, &entry);
            let mut bytes = vec![0u8; g.journal_entry_size() as usize];
            entry.encode(&mut bytes);
            let again = JournalEntry::decode(&bytes, g.sectors_per_block(), g.tag_size())
                .expect("an encoded entry decodes");
            assert_eq!(again, entry);
        }
    }
});
