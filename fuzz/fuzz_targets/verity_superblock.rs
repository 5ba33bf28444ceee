//! Arbitrary bytes as a dm-verity superblock: parsing never panics, whatever parses encodes
//! back to bytes that parse to the same superblock, and the parameters and tree geometry
//! derived from it never panic either.

#![no_main]

use dmkit::verity::{Superblock, TreeLayout, VerityParams};
use libfuzzer_sys::fuzz_target;

/// The signature and version a superblock must start with, so that mutations also reach the
/// fields behind them without waiting for the fuzzer to guess 12 exact bytes.
const HEADER: &[u8; 12] = b"verity\0\0\x01\0\0\0";

fuzz_target!(|data: &[u8]| {
    check(data, 0);
    if data.len() >= 512 {
        let mut patched = data.to_vec();
        patched[..12].copy_from_slice(HEADER);
        // Bytes after the superblock (if any) choose a hash offset, to exercise its arithmetic.
        let hash_offset = data
            .get(512..520)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0);
        check(&patched, 0);
        check(&patched, hash_offset);
        check(&patched, hash_offset & !511);
    }
});

fn check(bytes: &[u8], hash_offset: u64) {
    let Ok(sb) = Superblock::parse(bytes) else {
        return;
    };
    let encoded = sb.encode();
    let again = Superblock::parse(&encoded).expect("an encoded superblock parses");
    assert_eq!(again, sb, "parse(encode(sb)) != sb");
    assert_eq!(again.encode(), encoded, "encode is not stable");

    let p = VerityParams::from_superblock(&sb, hash_offset);
    let valid = p.validate().is_ok();
    if let Ok(layout) = TreeLayout::new(&p) {
        assert!(layout.tree_start <= layout.tree_end);
        assert_eq!(layout.levels(), layout.level_blocks.len());
        let _ = layout.hash_device_size();
        let _ = layout.tree_blocks();
        if valid {
            // The data digests of the first and last data block have a place in level 0.
            if layout.levels() > 0 {
                for index in [0, p.data_blocks - 1] {
                    let (block, offset) = layout.locate(0, index);
                    assert!(block >= layout.level_start[0]);
                    assert!(block < layout.level_start[0] + layout.level_blocks[0]);
                    assert!(offset + layout.digest_size <= layout.hash_block_size as usize);
                }
            }
            let _ = p.data_size();
            let _ = p.to_superblock().encode();
        }
    } else {
        assert!(
            !valid,
            "validate() accepted parameters TreeLayout::new refuses"
        );
    }
}
