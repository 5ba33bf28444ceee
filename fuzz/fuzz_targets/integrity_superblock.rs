//! Arbitrary bytes as a dm-integrity superblock: parsing never panics, whatever parses
//! encodes back to itself, and the geometry derived from it on a device of any size (taken
//! from the bytes after the superblock) never panics and places the first and last sector's
//! data and tag inside the device.

#![no_main]

use dmkit::integrity::{Geometry, GeometryOptions, Superblock};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 64 {
        // The magic and a plausible version, so mutations reach the fields behind them.
        let mut patched = data.to_vec();
        patched[..8].copy_from_slice(b"integrt\0");
        patched[8] = 1 + patched[8] % 6;
        check(&patched);
    }
});

fn check(bytes: &[u8]) {
    let Ok(sb) = Superblock::parse(bytes) else {
        return;
    };
    let encoded = sb.encode();
    let again = Superblock::parse(&encoded).expect("an encoded superblock parses");
    assert_eq!(again, sb, "parse(encode(sb)) != sb");
    assert_eq!(again.encode(), encoded, "encode is not stable");

    let word = |off: usize| {
        bytes
            .get(off..off + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let sizes = [
        word(512).unwrap_or(0),
        sb.provided_data_sectors.saturating_mul(2),
        sb.provided_data_sectors.saturating_add(1 << 20),
    ];
    let meta = word(520).map(|m| m >> (m & 63));
    for device_sectors in sizes {
        for meta_device_sectors in [None, meta] {
            let opts = GeometryOptions {
                buffer_sectors: word(528).unwrap_or(128) as u32,
                meta_device_sectors,
            };
            let Ok(g) = Geometry::new(&sb, device_sectors, &opts) else {
                continue;
            };
            let last = g.provided_data_sectors() - 1;
            for l in [0, last & !u64::from(g.sectors_per_block() - 1)] {
                let p = g.data_physical_sector(l);
                assert!(
                    p < device_sectors,
                    "data sector {p} of {l} beyond the device"
                );
                let t = g.tag_byte_offset(l) + u64::from(g.tag_size());
                let holder = meta_device_sectors.unwrap_or(device_sectors);
                assert!(t <= holder * 512, "tag of {l} beyond the device");
                let _ = g.tag_position(l);
                let _ = g.metadata_block_and_offset(l);
            }
            let a = g.area(g.areas() - 1);
            assert!(a.data_sectors > 0);
            let _ =
                g.journal_entry_position(g.journal_sections() - 1, g.journal_section_entries() - 1);
            let lb = g.log2_blocks_per_bitmap_bit(word(536));
            let _ = g.bitmap_blocks(lb);
            let _ = g.bitmap_blocks(sb.log2_blocks_per_bitmap_bit);
        }
    }
}
