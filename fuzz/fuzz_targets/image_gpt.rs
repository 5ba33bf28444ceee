//! Arbitrary bytes as a GPT disk image: parsing never panics, and whatever parses describes
//! partitions that lie inside the disk's usable area without overlapping.
//!
//! Two shapes per input: the bytes as a whole disk, and a disk of a size the first four bytes
//! choose (up to 1 MiB) with the rest placed at LBA 1, so mutations reach the header and entry
//! fields without the fuzzer having to grow a megabyte of input.

#![no_main]

use dmkit::image::gpt;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() > 4 {
        let size = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize % (1 << 20);
        let size = (size.max(4096) / 512) * 512;
        let mut disk = vec![0u8; size];
        let body = &data[4..];
        let n = body.len().min(size - 512);
        disk[512..512 + n].copy_from_slice(&body[..n]);
        check(&disk);
    }
});

fn check(disk: &[u8]) {
    let Ok(g) = gpt::parse(disk) else {
        return;
    };
    let sectors = disk.len() as u64 / g.sector_size;
    assert!(g.first_usable <= g.last_usable && g.last_usable < sectors);
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for e in &g.entries {
        assert!(e.first_lba >= g.first_usable && e.last_lba <= g.last_usable);
        assert!(e.offset(g.sector_size) + e.size(g.sector_size) <= disk.len() as u64);
        for &(a, b) in &spans {
            assert!(e.last_lba < a || e.first_lba > b, "overlapping partitions accepted");
        }
        spans.push((e.first_lba, e.last_lba));
    }
}
