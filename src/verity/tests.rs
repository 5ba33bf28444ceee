//! Known answers from cryptsetup's tests/verity-compat-test, and corruption reporting.

use super::*;
use crate::block::MemoryDevice;
use crate::hash::HashAlgorithm;

const SALT: &str = "e48da609055204e89ae53b655ca2216dd983cf3cb829f34f63a297d106d53e2d";

fn params(bs: u32, salt: &str, hash_type: u32, hash: HashAlgorithm, sb: bool) -> VerityParams {
    VerityParams {
        hash,
        hash_type,
        data_block_size: bs,
        hash_block_size: bs,
        data_blocks: 8 * 1024 * 1024 / bs as u64,
        hash_offset: 0,
        salt: if salt == "-" {
            vec![]
        } else {
            hex::decode(salt).unwrap()
        },
        uuid: [0; 16],
        superblock: sb,
    }
}

/// (block size, root, salt, hash type, hash) exactly as verity-compat-test lists them; the data
/// device is 8 MiB of zeros.
const KNOWN: &[(u32, &str, &str, u32, HashAlgorithm)] = &[
    (
        512,
        "9de18652fe74edfb9b805aaed72ae2aa48f94333f1ba5c452ac33b1c39325174",
        SALT,
        1,
        HashAlgorithm::Sha256,
    ),
    (
        1024,
        "54d92778750495d1f80832b486ebd007617d746271511bbf0e295e143da2b3df",
        SALT,
        1,
        HashAlgorithm::Sha256,
    ),
    (
        4096,
        "e522df0f97da4febb882ac40f30b37dc0b444bf6df418929463fa25280f09d5c",
        SALT,
        1,
        HashAlgorithm::Sha256,
    ),
    (
        4096,
        "cbbf4ebd004ef65e29b935bb635a39cf754d677f3fa10b0126da725bbdf10f7d",
        SALT,
        0,
        HashAlgorithm::Sha256,
    ),
    (
        4096,
        "ef29c902d87350f1da4bfa536e16cebc162a909bf89abe448b81ec500d4fb9bf",
        "-",
        1,
        HashAlgorithm::Sha256,
    ),
    (
        1024,
        "d0e9163ca8844aaa2e88fe5265a8c5d9ee494a99",
        SALT,
        1,
        HashAlgorithm::Sha1,
    ),
    (
        1024,
        "73509e8e868be6b8ac939817a98a3d35121413b2",
        "dadada",
        1,
        HashAlgorithm::Sha1,
    ),
];

#[test]
fn known_roots_separate_devices() {
    for &(bs, root, salt, ht, hash) in KNOWN {
        for sb in [true, false] {
            let p = params(bs, salt, ht, hash, sb);
            let layout = TreeLayout::new(&p).unwrap();
            let data = MemoryDevice::new("data", 8 << 20);
            let hashdev = MemoryDevice::new("hash", layout.hash_device_size() as usize);
            let got = format(&data, &hashdev, &p, false).unwrap();
            assert_eq!(hex::encode(&got), root, "bs {bs} {hash} type {ht} sb {sb}");
            let report = verify(&data, &hashdev, &p, &got, false).unwrap();
            assert!(report.ok(), "{report:?}");
            if sb {
                let read = read_superblock(&hashdev, 0).unwrap();
                assert_eq!(VerityParams::from_superblock(&read, 0), p);
            }
        }
    }
}

#[test]
fn known_roots_one_device_with_hash_offset() {
    for &(bs, root, salt, ht, hash) in KNOWN {
        let mut p = params(bs, salt, ht, hash, true);
        p.hash_offset = 8 << 20;
        let layout = TreeLayout::new(&p).unwrap();
        let dev = MemoryDevice::new("img", layout.hash_device_size() as usize);
        let got = format(&dev, &dev, &p, true).unwrap();
        assert_eq!(hex::encode(&got), root);
        assert!(verify(&dev, &dev, &p, &got, true).unwrap().ok());
    }
}

/// Deterministic test data without a dependency (xorshift; the seed is spread first so that
/// neighbouring seeds give unrelated streams). The FEC tests use it too.
pub(crate) fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn every_flipped_bit_is_reported_at_its_block() {
    let mut p = params(4096, SALT, 1, HashAlgorithm::Sha256, true);
    p.data_blocks = 300; // three level-0 hash blocks and a top block
    let layout = TreeLayout::new(&p).unwrap();
    let data = MemoryDevice::from_vec("data", random_bytes(300 * 4096, 7));
    let hashdev = MemoryDevice::new("hash", layout.hash_device_size() as usize);
    let root = format(&data, &hashdev, &p, false).unwrap();
    for block in [0u64, 1, 127, 128, 299] {
        let off = block * 4096 + 1234;
        let mut b = [0u8; 1];
        data.read_at(&mut b, off).unwrap();
        data.write_at(&[b[0] ^ 0x10], off).unwrap();
        let r = verify(&data, &hashdev, &p, &root, false).unwrap();
        assert_eq!(r.corrupt_data_blocks, vec![block]);
        assert!(r.corrupt_hash_blocks.is_empty());
        data.write_at(&b, off).unwrap();
    }
    for hblock in layout.tree_start..layout.tree_end {
        let off = hblock * 4096 + 4095; // padding bytes are covered too
        let mut b = [0u8; 1];
        hashdev.read_at(&mut b, off).unwrap();
        hashdev.write_at(&[b[0] ^ 1], off).unwrap();
        let r = verify(&data, &hashdev, &p, &root, false).unwrap();
        assert_eq!(r.corrupt_hash_blocks, vec![hblock]);
        assert!(r.corrupt_data_blocks.is_empty());
        hashdev.write_at(&b, off).unwrap();
    }
    let mut wrong = root.clone();
    wrong[0] ^= 1;
    let r = verify(&data, &hashdev, &p, &wrong, false).unwrap();
    assert!(r.root_hash_mismatch && !r.ok());
    assert!(r.corrupt_data_blocks.is_empty() && r.corrupt_hash_blocks.is_empty());
    // A wrong salt blames no block either: nothing in the tree can be trusted.
    let mut salted = p.clone();
    salted.salt[0] ^= 1;
    let r = verify(&data, &hashdev, &salted, &root, false).unwrap();
    assert!(r.root_hash_mismatch);
    assert!(r.corrupt_data_blocks.is_empty() && r.corrupt_hash_blocks.is_empty());
    // Against a valid tree for other data, every data block is named.
    let other = MemoryDevice::from_vec("other", random_bytes(300 * 4096, 8));
    let r = verify(&other, &hashdev, &p, &root, false).unwrap();
    assert_eq!(r.corrupt_data_blocks, (0..300).collect::<Vec<u64>>());
    assert!(!r.root_hash_mismatch && r.corrupt_hash_blocks.is_empty());
}

#[test]
fn hash_type_0_with_unfilled_hash_blocks() {
    // sha1 in 4 KiB blocks under hash type 0 packs 128 digests of 20 bytes and leaves the rest
    // of each block zero; a worker's group spans many blocks, so slots must be per block.
    let mut p = params(512, "-", 0, HashAlgorithm::Sha1, false);
    p.hash_block_size = 4096;
    p.data_blocks = 5000;
    let layout = TreeLayout::new(&p).unwrap();
    let data = MemoryDevice::from_vec("data", random_bytes(5000 * 512, 3));
    let hashdev = MemoryDevice::new("hash", layout.hash_device_size() as usize);
    let root = format(&data, &hashdev, &p, false).unwrap();
    let tree = hashdev.contents();
    let level0 = &tree[(layout.level_start[0] * 4096) as usize..];
    for i in [0usize, 127, 128, 4999] {
        let block = &data.contents()[i * 512..(i + 1) * 512];
        let pos = (i / 128) * 4096 + (i % 128) * 20;
        assert_eq!(
            &level0[pos..pos + 20],
            &HashAlgorithm::Sha1.hash(&[block])[..]
        );
    }
    assert!(level0[2560..4096].iter().all(|&b| b == 0));
    assert!(verify(&data, &hashdev, &p, &root, false).unwrap().ok());
}

#[test]
fn device_reads_verify_and_report() {
    let mut p = params(4096, SALT, 1, HashAlgorithm::Sha256, true);
    p.data_blocks = 1000;
    let layout = TreeLayout::new(&p).unwrap();
    let content = random_bytes(1000 * 4096, 9);
    let data = std::sync::Arc::new(MemoryDevice::from_vec("data", content.clone()));
    let hashdev = std::sync::Arc::new(MemoryDevice::new(
        "hash",
        layout.hash_device_size() as usize,
    ));
    let root = format(&*data, &*hashdev, &p, false).unwrap();
    data.write_at(&[0xff], 500 * 4096 + 3).unwrap();
    let opts = VerityOptions {
        name: "v".into(),
        cache_blocks: 2,
        data_cache_bytes: 0,
        ..VerityOptions::default()
    };
    let dev =
        VerityDevice::new(data.clone(), hashdev.clone(), p.clone(), root.clone(), opts).unwrap();
    assert!(dev.check_root().unwrap());
    let mut buf = vec![0u8; 64 * 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, content[..64 * 4096]);
    let mut small = [0u8; 100];
    dev.read_at(&mut small, 4096 * 3 + 7).unwrap(); // unaligned
    assert_eq!(small[..], content[4096 * 3 + 7..4096 * 3 + 107]);
    let err = dev.read_at(&mut buf[..4096], 500 * 4096).unwrap_err();
    assert!(matches!(
        err,
        crate::block::BlockError::Corrupt {
            what: "data",
            block: 500,
            ..
        }
    ));
    dev.read_at(&mut buf[..4096], 501 * 4096).unwrap();
    assert_eq!(
        dev.stats()
            .data_corruptions
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // A wrong root hash is refused up front.
    let mut wrong = root;
    wrong[5] ^= 1;
    let dev = VerityDevice::new(data, hashdev, p, wrong, VerityOptions::default()).unwrap();
    assert!(!dev.check_root().unwrap());
}

#[test]
fn large_reads_are_verified_in_shares_and_name_the_first_bad_block() {
    use std::sync::atomic::Ordering::Relaxed;
    for (bs, blocks) in [(4096u32, 1000usize), (512, 6000)] {
        let mut p = params(bs, SALT, 1, HashAlgorithm::Sha256, true);
        p.data_blocks = blocks as u64;
        let layout = TreeLayout::new(&p).unwrap();
        let bsz = bs as usize;
        let content = random_bytes(blocks * bsz, 21);
        let data = std::sync::Arc::new(MemoryDevice::from_vec("data", content.clone()));
        let hashdev = std::sync::Arc::new(MemoryDevice::new(
            "hash",
            layout.hash_device_size() as usize,
        ));
        let root = format(&*data, &*hashdev, &p, false).unwrap();
        let open = |ignore_corruption: bool| {
            let opts = VerityOptions {
                name: "v".into(),
                data_cache_bytes: 0,
                ignore_corruption,
                ..VerityOptions::default()
            };
            VerityDevice::new(data.clone(), hashdev.clone(), p.clone(), root.clone(), opts).unwrap()
        };
        let dev = open(false);
        // A request of 1 MiB and one of an odd number of blocks, from an odd block: both are
        // cut into shares, every block hashed once, the bytes those of the device.
        let odd = (1 << 20) / bsz + 37;
        for (first, n) in [(0usize, (1 << 20) / bsz), (3, odd)] {
            let mut buf = vec![0u8; n * bsz];
            dev.read_at(&mut buf, (first * bsz) as u64).unwrap();
            assert_eq!(
                buf,
                content[first * bsz..(first + n) * bsz],
                "{bs}: {first}+{n}"
            );
        }
        let verified = dev.stats().verified_blocks.load(Relaxed);
        assert_eq!(verified as usize, (1 << 20) / bsz + odd, "{bs}");
        // Two bad blocks in different shares: the error names the first.
        let n = (1 << 20) / bsz;
        let (early, late) = (n / 3 + 1, n - 2);
        data.write_at(&[0xa5], (late * bsz + 9) as u64).unwrap();
        data.write_at(&[0x5a], (early * bsz + 1) as u64).unwrap();
        let mut buf = vec![0u8; n * bsz];
        let err = dev.read_at(&mut buf, 0).unwrap_err();
        assert!(
            matches!(err, crate::block::BlockError::Corrupt { what: "data", block, .. } if block == early as u64),
            "{bs}: {err}"
        );
        // Told to ignore corruption, the read is served and both blocks are counted.
        let dev = open(true);
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(dev.stats().data_corruptions.load(Relaxed), 2, "{bs}");
        // Many large reads at once (the helpers shared between them) all verify.
        let dev = open(false);
        std::thread::scope(|s| {
            for t in 0..4usize {
                let (dev, content) = (&dev, &content);
                s.spawn(move || {
                    let first = n + 1 + t * 7;
                    let mut buf = vec![0u8; n * bsz];
                    dev.read_at(&mut buf, (first * bsz) as u64).unwrap();
                    assert_eq!(buf, content[first * bsz..(first + n) * bsz]);
                });
            }
        });
    }
}

#[test]
fn data_cache_serves_verified_blocks_and_ignores_later_tampering() {
    let mut p = params(4096, SALT, 1, HashAlgorithm::Sha256, true);
    p.data_blocks = 64;
    let layout = TreeLayout::new(&p).unwrap();
    let content = random_bytes(64 * 4096, 11);
    let data = std::sync::Arc::new(MemoryDevice::from_vec("data", content.clone()));
    let hashdev = std::sync::Arc::new(MemoryDevice::new(
        "hash",
        layout.hash_device_size() as usize,
    ));
    let root = format(&*data, &*hashdev, &p, false).unwrap();
    let opts = VerityOptions {
        data_cache_bytes: 16 * 4096,
        ..VerityOptions::default()
    };
    let dev = VerityDevice::new(data.clone(), hashdev, p, root, opts).unwrap();
    let mut buf = vec![0u8; 8 * 4096];
    dev.read_at(&mut buf, 4 * 4096).unwrap(); // blocks 4..12 verified and cached
                                              // Tampering with a cached block does not change what is served: it was verified.
    data.write_at(&[0xee; 16], 5 * 4096).unwrap();
    let mut again = vec![0u8; 16 * 4096];
    dev.read_at(&mut again, 0).unwrap();
    assert_eq!(again, content[..16 * 4096]);
    let hits = dev
        .stats()
        .data_cache_hits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(hits >= 8, "{hits}");
    // A block tampered with while not cached is refused.
    data.write_at(&[0xee], 40 * 4096).unwrap();
    assert!(dev.read_at(&mut buf[..4096], 40 * 4096).is_err());
}

#[test]
fn a_corrupt_top_block_and_a_corrupt_data_block_are_both_named() {
    let mut p = params(4096, SALT, 1, HashAlgorithm::Sha256, true);
    p.data_blocks = 1000;
    let layout = TreeLayout::new(&p).unwrap();
    let data = MemoryDevice::from_vec("data", random_bytes(1000 * 4096, 5));
    let hashdev = MemoryDevice::new("hash", layout.hash_device_size() as usize);
    let root = format(&data, &hashdev, &p, false).unwrap();
    let top = layout.level_start[layout.levels() - 1];
    data.write_at(&[0x5a], 700 * 4096 + 9).unwrap();
    hashdev.write_at(&[0x5a], top * 4096 + 3000).unwrap();
    let r = verify(&data, &hashdev, &p, &root, false).unwrap();
    assert_eq!(r.corrupt_hash_blocks, vec![top]);
    assert_eq!(r.corrupt_data_blocks, vec![700]);
    assert!(!r.root_hash_mismatch);
}
