//! Arbitrary bytes as the head of a device for the signature probe behind the safety prompts
//! (`dmkit::block::signature`): it never panics, names only what blkid would name, and reports
//! at most one partition table.
//!
//! Two shapes per input: the bytes as they are (a short device), and the bytes copied to each
//! place a signature sits in a full head (1 KiB, 32 KiB, 64 KiB, the end of each swap page),
//! so mutations reach every probe without the fuzzer growing 68 KiB of input.

#![no_main]

use dmkit::block::signature::{probe_head, SignatureKind, HEAD_LEN};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 16] = [
    "crypto_LUKS",
    "DM_verity_hash",
    "DM_integrity",
    "ext2",
    "ext3",
    "ext4",
    "jbd",
    "xfs",
    "btrfs",
    "vfat",
    "swap",
    "squashfs",
    "erofs",
    "iso9660",
    "gpt",
    "dos",
];

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut head = vec![0u8; HEAD_LEN];
    for at in [0usize, 512, 1024, 0x4000, 0x8000, 0x10000, 4086, 8182, 16374, 32758, 65526] {
        let n = data.len().min(HEAD_LEN - at);
        head[at..at + n].copy_from_slice(&data[..n]);
    }
    check(&head);
});

fn check(bytes: &[u8]) {
    let found = probe_head(bytes);
    for s in &found {
        assert!(NAMES.contains(&s.name), "unknown name {}", s.name);
    }
    let tables = found
        .iter()
        .filter(|s| s.kind == SignatureKind::PartitionTable)
        .count();
    assert!(tables <= 1, "{found:?}");
}
