//! `integritysetup dump`'s report of a superblock, as text (byte for byte what integritysetup
//! 2.6 prints) and as JSON (the same fields, the salt, and the layout).

use super::geometry::Geometry;
use super::superblock::{
    Superblock, SB_FLAG_DIRTY_BITMAP, SB_FLAG_FIXED_HMAC, SB_FLAG_FIXED_PADDING,
    SB_FLAG_HAVE_JOURNAL_MAC, SB_FLAG_RECALCULATING,
};

/// Flag names in integritysetup's order.
const FLAG_NAMES: [(u32, &str); 5] = [
    (SB_FLAG_HAVE_JOURNAL_MAC, "have_journal_mac"),
    (SB_FLAG_RECALCULATING, "recalculating"),
    (SB_FLAG_DIRTY_BITMAP, "dirty_bitmap"),
    (SB_FLAG_FIXED_PADDING, "fix_padding"),
    (SB_FLAG_FIXED_HMAC, "fix_hmac"),
];

/// The names of the flags set, in integritysetup's order.
pub fn flag_names(flags: u32) -> Vec<&'static str> {
    FLAG_NAMES
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// integritysetup's text for `sb` on `device` (the path as given).
pub fn text(sb: &Superblock, device: &str) -> String {
    let mut s = format!("Info for integrity device {device}.\n");
    s += &format!("superblock_version {}\n", sb.version);
    s += &format!("log2_interleave_sectors {}\n", sb.log2_interleave_sectors);
    s += &format!("integrity_tag_size {}\n", sb.integrity_tag_size);
    s += &format!("journal_sections {}\n", sb.journal_sections);
    s += &format!("provided_data_sectors {}\n", sb.provided_data_sectors);
    s += &format!("sector_size {}\n", sb.sector_size());
    if sb.version >= 2 && sb.has(SB_FLAG_RECALCULATING) {
        s += &format!("recalc_sector {}\n", sb.recalc_sector);
    }
    s += &format!("log2_blocks_per_bitmap {}\n", sb.log2_blocks_per_bitmap_bit);
    s += "flags ";
    for n in flag_names(sb.flags) {
        s += n;
        s += " ";
    }
    s += "\n";
    s
}

/// The same as JSON, with the salt and (when the device size is known and fits) the layout.
pub fn json(sb: &Superblock, device: &str, geometry: Option<&Geometry>) -> serde_json::Value {
    let mut j = serde_json::json!({
        "device": device,
        "superblock_version": sb.version,
        "log2_interleave_sectors": sb.log2_interleave_sectors,
        "integrity_tag_size": sb.integrity_tag_size,
        "journal_sections": sb.journal_sections,
        "provided_data_sectors": sb.provided_data_sectors,
        "sector_size": sb.sector_size(),
        "log2_blocks_per_bitmap": sb.log2_blocks_per_bitmap_bit,
        "flags": flag_names(sb.flags),
        "salt": hex::encode(sb.salt),
    });
    if sb.version >= 2 && sb.has(SB_FLAG_RECALCULATING) {
        j["recalc_sector"] = sb.recalc_sector.into();
    }
    if let Some(g) = geometry {
        j["layout"] = serde_json::json!({
            "journal_start_sector": g.journal_start_sector(),
            "journal_section_sectors": g.journal_section_sectors(),
            "journal_entries_per_sector": g.journal_entries_per_sector(),
            "journal_section_entries": g.journal_section_entries(),
            "initial_sectors": g.initial_sectors(),
            "interleave_sectors": g.interleave_sectors(),
            "metadata_run_sectors": g.metadata_run_sectors(),
            "areas": g.areas(),
            "max_provided_data_sectors": g.max_provided_data_sectors(),
        });
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_as_integritysetup_prints_it() {
        let sb = Superblock {
            version: 5,
            log2_interleave_sectors: 15,
            integrity_tag_size: 4,
            journal_sections: 1,
            provided_data_sectors: 15944,
            flags: 0x1f,
            log2_sectors_per_block: 0,
            log2_blocks_per_bitmap_bit: 15,
            recalc_sector: 1234,
            transaction_id: 0,
            salt: [0; 16],
        };
        // integritysetup 2.6.1's dump of the same superblock.
        assert_eq!(
            text(&sb, "/tmp/x.img"),
            "Info for integrity device /tmp/x.img.\nsuperblock_version 5\n\
             log2_interleave_sectors 15\nintegrity_tag_size 4\njournal_sections 1\n\
             provided_data_sectors 15944\nsector_size 512\nrecalc_sector 1234\n\
             log2_blocks_per_bitmap 15\n\
             flags have_journal_mac recalculating dirty_bitmap fix_padding fix_hmac \n"
        );
    }
}
