//! The persistent cache of remote verity images (issue 28): a tampered or torn cache entry is
//! detected and fetched again, the bound holds with eviction, a garbled index or hash-tree copy
//! is never trusted, files are private, and `--prefetch` fetches the blocks a previous open
//! read first.

mod common;

use common::remote_case::{cached_blocks, case, read_block, slot_offset, stat, BS};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn tampered_cache_entry_is_detected_refetched_and_replaced() {
    let Some(c) = case("tamper", 128, 31) else {
        return;
    };
    let a = c.open_with(&c.data, 16 << 20, false);
    let mut all = vec![0u8; c.bytes.len()];
    a.device.read_at(&mut all, 0).unwrap();
    drop(a);
    let cache = c.image_cache();
    // Private: the cache shows which blocks a host read.
    assert_eq!(mode(&c.cache_dir()), 0o700);
    assert_eq!(mode(&cache), 0o700);
    for f in ["data", "index", "hash"] {
        assert_eq!(mode(&cache.join(f)), 0o600, "{f}");
    }
    // Tamper one slot, and tear another (half of it zeroed, as an interrupted write leaves it).
    let data_file = cache.join("data");
    common::xor_byte(&data_file, slot_offset(&cache, 7) + 100, 0xff);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&data_file)
            .unwrap();
        f.write_all_at(&[0u8; BS / 2], slot_offset(&cache, 9) + BS as u64 / 2)
            .unwrap();
    }
    let b = c.open_with(&c.data, 16 << 20, false);
    for blk in 0..128u64 {
        assert_eq!(
            read_block(&*b.device, blk).unwrap(),
            c.block(blk),
            "block {blk}"
        );
    }
    assert_eq!(stat(&b, "store_rejects"), 2);
    assert_eq!(stat(&b, "refetches"), 2);
    assert_eq!(stat(&b, "refetch_recovered"), 2);
    assert_eq!(stat(&b, "data_corruptions"), 0);
    assert_eq!(stat(&b, "cache_hits"), 128);
    // Fetched from the object: the two blocks only (and the superblock).
    assert!(stat(&b, "remote_bytes_fetched") <= 3 * BS as u64);
    drop(b);
    // The entries were replaced with the good blocks.
    let cached = cached_blocks(&cache);
    assert_eq!(cached.len(), 128);
    for (blk, bytes) in cached {
        assert!(bytes == c.block(blk), "block {blk}");
    }
}

#[test]
fn eviction_keeps_the_cache_within_its_bound() {
    let Some(c) = case("evict", 512, 32) else {
        return;
    };
    let bound = 64 * BS as u64;
    let a = c.open_with(&c.data, bound, false);
    // Twice over the whole volume in a scattered order.
    for round in 0..2u64 {
        for i in 0..512u64 {
            let blk = (i * 37 + round) % 512;
            assert_eq!(read_block(&*a.device, blk).unwrap(), c.block(blk));
        }
    }
    assert!(stat(&a, "cache_blocks") <= 64);
    assert!(stat(&a, "cache_evictions") >= 1024 - 64);
    drop(a);
    let cache = c.image_cache();
    let data_len = std::fs::metadata(cache.join("data")).unwrap().len();
    assert!(
        data_len <= bound,
        "data file {data_len} bytes over the bound {bound}"
    );
    let cached = cached_blocks(&cache);
    assert!(cached.len() <= 64);
    for (blk, bytes) in cached {
        assert!(bytes == c.block(blk), "block {blk}");
    }
    // A smaller bound at the next open: the file shrinks, the old index is not trusted.
    let b = c.open_with(&c.data, 16 * BS as u64, false);
    for blk in 0..32u64 {
        assert_eq!(read_block(&*b.device, blk).unwrap(), c.block(blk));
    }
    assert!(stat(&b, "cache_blocks") <= 16);
    drop(b);
    assert!(std::fs::metadata(cache.join("data")).unwrap().len() <= 16 * BS as u64);
}

#[test]
fn garbled_index_and_tree_copy_are_not_trusted() {
    let Some(c) = case("garbled", 64, 33) else {
        return;
    };
    let a = c.open_with(&c.data, 1 << 20, false);
    let mut all = vec![0u8; c.bytes.len()];
    a.device.read_at(&mut all, 0).unwrap();
    drop(a);
    let cache = c.image_cache();
    // One flipped bit in the index: the whole index is dropped, the cache starts empty.
    common::xor_byte(&cache.join("index"), 40, 1);
    // One flipped bit in the pinned hash tree: the tree is fetched again.
    common::xor_byte(&cache.join("hash"), 10, 1);
    let b = c.open_with(&c.data, 1 << 20, false);
    assert_eq!(b.details["hash_tree_from"], "remote");
    b.device.read_at(&mut all, 0).unwrap();
    assert!(all == c.bytes);
    assert_eq!(stat(&b, "cache_hits"), 0);
    assert_eq!(stat(&b, "store_rejects"), 0);
    drop(b);
    // Both were written again, good.
    let d = c.open_with(&c.data, 1 << 20, false);
    assert_eq!(d.details["hash_tree_from"], "cache");
    d.device.read_at(&mut all, 0).unwrap();
    assert_eq!(stat(&d, "cache_hits"), 64);
    // A torn index write cannot happen (written beside, synced, renamed); a leftover
    // temporary file is ignored.
    assert!(std::fs::read_dir(&cache).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains("tmp")));
}

#[test]
fn prefetch_fetches_the_blocks_a_previous_open_read_first() {
    let Some(c) = case("prefetch", 512, 34) else {
        return;
    };
    let first: Vec<u64> = vec![5, 6, 7, 8, 300, 301, 42, 511, 100];
    let a = c.open_with(&c.data, 16 << 20, true);
    for &blk in &first {
        assert_eq!(read_block(&*a.device, blk).unwrap(), c.block(blk));
    }
    drop(a);
    let cache = c.image_cache();
    let record = std::fs::read(cache.join("prefetch")).unwrap();
    let recorded: Vec<u64> = record
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(recorded, first);
    assert_eq!(mode(&cache.join("prefetch")), 0o600);
    // Forget the cached blocks (keep the record and the tree): the next open with --prefetch
    // fetches the recorded blocks by itself.
    std::fs::remove_file(cache.join("index")).unwrap();
    std::fs::remove_file(cache.join("data")).unwrap();
    let b = c.open_with(&c.data, 16 << 20, true);
    assert_eq!(b.details["prefetch_blocks"], first.len() as u64);
    // The prefetch starts at the first read (in the process that serves the device).
    assert_eq!(stat(&b, "prefetch_done"), 0);
    assert_eq!(read_block(&*b.device, 200).unwrap(), c.block(200));
    let deadline = Instant::now() + Duration::from_secs(20);
    while stat(&b, "prefetch_done") < first.len() as u64 {
        assert!(Instant::now() < deadline, "prefetch did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stat(&b, "prefetch_failed"), 0);
    assert_eq!(stat(&b, "cache_inserts"), first.len() as u64 + 1);
    let fetched = stat(&b, "remote_bytes_fetched");
    assert!(fetched >= (first.len() * BS) as u64);
    for &blk in &first {
        assert_eq!(read_block(&*b.device, blk).unwrap(), c.block(blk));
    }
    // Read by the reader from the cache: nothing more fetched.
    assert_eq!(stat(&b, "remote_bytes_fetched"), fetched);
    assert!(stat(&b, "cache_hits") >= first.len() as u64);
}
