//! A verity volume whose data and hash are remote objects (issue 28): opened over a
//! `RangeSource` (here `LocalRange`, a file standing in for an object), read back identical,
//! a signed root hash checked from a fetched signature, a flipped byte in the served data
//! failing that block only (after a second fetch) with nothing unverified cached, and the
//! `status` counters moving.

mod common;

use common::remote_case::{cached_blocks, case, read_block, stat, BS};
use dmkit::block::BlockError;
use dmkit::remote::{LocalRange, RangeSource};
use dmkit::verity::volume::{check_signature, SignatureSource};
use std::sync::Arc;

#[test]
fn signed_volume_opens_remotely_and_reads_back_identical() {
    let Some(c) = case("signed", 1024, 28) else {
        return;
    };
    // The signature is an object too: fetched whole, then checked.
    let id = common::pki::make_ident(&c.dir, "signer", "/CN=remote verity", common::pki::RSA);
    let sig = dmkit::verity::sig::sign_root_hash(&c.root_hex, &id.key, &id.cert).unwrap();
    let sig_path = c.dir.join("root.p7s");
    std::fs::write(&sig_path, &sig).unwrap();
    let sig_obj = LocalRange::open(&sig_path).unwrap();
    let mut fetched = vec![0u8; sig_obj.identity().len as usize];
    sig_obj.read_range(0, &mut fetched).unwrap();
    check_signature(
        &c.root_hex,
        SignatureSource::Der(&fetched),
        std::slice::from_ref(&id.cert),
    )
    .unwrap();
    let wrong = format!("{}00", &c.root_hex[..c.root_hex.len() - 2]);
    assert!(check_signature(
        &wrong,
        SignatureSource::Der(&fetched),
        std::slice::from_ref(&id.cert)
    )
    .is_err());

    let a = c.open_with(&c.data, 64 << 20, false);
    assert_eq!(a.kind, "verity");
    assert_eq!(a.details["hash_tree_from"], "remote");
    assert_eq!(a.device.size(), c.bytes.len() as u64);
    // Sequential 128 KiB reads (read-ahead), then random single blocks.
    let mut all = vec![0u8; c.bytes.len()];
    for (i, chunk) in all.chunks_mut(128 << 10).enumerate() {
        a.device.read_at(chunk, (i * (128 << 10)) as u64).unwrap();
    }
    assert!(all == c.bytes, "sequential read differs");
    for b in [1000u64, 3, 517, 42, 1023, 0] {
        assert_eq!(read_block(&*a.device, b).unwrap(), c.block(b));
    }
    assert!(stat(&a, "remote_bytes_fetched") >= c.bytes.len() as u64);
    assert_eq!(stat(&a, "verification_failures"), 0);
    assert!(
        stat(&a, "cache_hits") >= 6,
        "random reads are served from the cache"
    );
    assert!(matches!(
        a.device.write_at(&[0u8; BS], 0),
        Err(BlockError::ReadOnly { .. })
    ));
    drop(a);

    // A mirror (another copy of the object) shares the cache: the second open reads the tree
    // from the cache and every block from the cache, fetching nothing but the superblock.
    let mirror = c.dir.join("mirror.img");
    std::fs::copy(&c.data, &mirror).unwrap();
    let b = c.open_with(&mirror, 64 << 20, false);
    assert_eq!(b.details["hash_tree_from"], "cache");
    let mut again = vec![0u8; c.bytes.len()];
    b.device.read_at(&mut again, 0).unwrap();
    assert!(again == c.bytes);
    assert_eq!(stat(&b, "cache_hits"), 1024);
    assert!(
        stat(&b, "remote_bytes_fetched") <= 4096,
        "only the superblock is fetched: {}",
        stat(&b, "remote_bytes_fetched")
    );
}

#[test]
fn flipped_byte_in_served_data_fails_that_block_only() {
    let Some(c) = case("flip", 256, 29) else {
        return;
    };
    let served = c.dir.join("served.img");
    std::fs::copy(&c.data, &served).unwrap();
    let bad = 100u64;
    common::xor_byte(&served, bad * BS as u64 + 1234, 0x40);
    let a = c.open_with(&served, 64 << 20, false);
    for b in 0..256u64 {
        let r = read_block(&*a.device, b);
        if b == bad {
            match r {
                Err(BlockError::Corrupt { block, what, .. }) => {
                    assert_eq!((block, what), (bad, "data"))
                }
                other => panic!("block {bad}: expected EIO, got {:?}", other.map(|_| ())),
            }
            assert_eq!(
                BlockError::Corrupt {
                    device: String::new(),
                    what: "data",
                    block: 0
                }
                .errno(),
                libc::EIO
            );
        } else {
            assert_eq!(r.unwrap(), c.block(b), "block {b}");
        }
    }
    // Fetched again once (bypassing every cache) before giving up; still bad.
    assert_eq!(stat(&a, "refetches"), 1);
    assert_eq!(stat(&a, "refetch_recovered"), 0);
    assert_eq!(stat(&a, "data_corruptions"), 1);
    assert!(stat(&a, "verification_failures") >= 1);
    // Reading the bad block again fails again, from the object (it was never cached).
    assert!(read_block(&*a.device, bad).is_err());
    drop(a);
    // Nothing unverified in the cache: every slot the index names holds its original block,
    // and the bad block has none.
    let cached = cached_blocks(&c.image_cache());
    assert_eq!(cached.len(), 255);
    for (b, bytes) in &cached {
        assert_ne!(*b, bad);
        assert!(
            bytes == c.block(*b),
            "cache slot of block {b} holds other bytes"
        );
    }
}

#[test]
fn transient_corruption_recovers_on_the_second_fetch() {
    // A source that flips a byte of the first answer covering block 7 only (a bad transfer).
    struct Flaky {
        inner: LocalRange,
        flipped: std::sync::atomic::AtomicBool,
    }
    impl RangeSource for Flaky {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn identity(&self) -> &dmkit::remote::ObjectIdentity {
            self.inner.identity()
        }
        fn read_range(
            &self,
            offset: u64,
            buf: &mut [u8],
        ) -> Result<(), dmkit::remote::RemoteError> {
            self.inner.read_range(offset, buf)?;
            let at = 7 * BS as u64 + 5;
            if (offset..offset + buf.len() as u64).contains(&at)
                && !self.flipped.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                buf[(at - offset) as usize] ^= 1;
            }
            Ok(())
        }
        fn stats(&self) -> dmkit::remote::RemoteStats {
            self.inner.stats()
        }
    }
    let Some(c) = case("flaky", 64, 30) else {
        return;
    };
    let data = Arc::new(Flaky {
        inner: LocalRange::open(&c.data).unwrap(),
        flipped: false.into(),
    });
    let hash = Arc::new(LocalRange::open(&c.hash).unwrap());
    let a = c.open_sources(data, hash, 1 << 20, false);
    let mut all = vec![0u8; c.bytes.len()];
    a.device.read_at(&mut all, 0).unwrap();
    assert!(all == c.bytes);
    assert_eq!(stat(&a, "refetches"), 1);
    assert_eq!(stat(&a, "refetch_recovered"), 1);
    assert_eq!(stat(&a, "data_corruptions"), 0);
    drop(a);
    for (b, bytes) in cached_blocks(&c.image_cache()) {
        assert!(bytes == c.block(b), "block {b}");
    }
}

/// `dmkit verity open URL NAME URL ROOT` against nginx: the FUSE export reads back identical,
/// `status` shows the remote counters; then a byte flipped in the served data fails that block
/// with EIO (after a second fetch), every other block reads fine, and the cache holds only
/// verified blocks.
#[test]
fn verity_open_of_urls_over_nginx() {
    if common::env::fuse_missing() {
        return;
    }
    let Some(c) = case("nginx", 1024, 35) else {
        return;
    };
    let www = c.dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::copy(&c.data, www.join("data.img")).unwrap();
    std::fs::copy(&c.hash, www.join("hash.img")).unwrap();
    let Some(server) = common::remote_case::nginx(&www, &c.dir.join("nginx")) else {
        return;
    };
    let url = |f: &str| format!("http://127.0.0.1:{}/{f}", server.port);
    let run = common::run::RunDir::new();
    let cache = c.cache_dir();
    let open = |name: &str| {
        run.ok(&[
            "verity",
            "open",
            &url("data.img"),
            name,
            &url("hash.img"),
            &c.root_hex,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--cache-size",
            "8M",
        ]);
        run.track(name);
        run.path().join(name)
    };
    let dev = open("rv");
    assert!(
        std::fs::read(&dev).unwrap() == c.bytes,
        "served bytes differ"
    );
    let status = run.ok(&["status", "rv"]);
    let field =
        |k: &str| common::status_field(&status, k).unwrap_or_else(|| panic!("{k}: {status}"));
    assert_eq!(field("remote"), "true");
    assert!(field("remote bytes fetched").parse::<u64>().unwrap() >= c.bytes.len() as u64);
    assert_eq!(field("verification failures"), "0");
    assert_eq!(field("cache inserts"), "1024");
    run.close("rv");

    // The server now serves a damaged copy (same length; nginx gives it a new ETag, and the
    // new open pins that one).
    let bad = 300u64;
    common::xor_byte(&www.join("data.img"), bad * BS as u64 + 7, 1);
    std::fs::remove_dir_all(&cache).unwrap();
    let dev = open("rv2");
    let f = std::fs::File::open(&dev).unwrap();
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; BS];
    for b in 0..1024u64 {
        let r = f.read_exact_at(&mut buf, b * BS as u64);
        if b == bad {
            let e = r.expect_err("the flipped block must not read");
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "block {bad}: {e}");
        } else {
            r.unwrap_or_else(|e| panic!("block {b}: {e}"));
            assert!(buf == c.block(b), "block {b}");
        }
    }
    drop(f);
    let status = run.ok(&["status", "rv2"]);
    let field =
        |k: &str| common::status_field(&status, k).unwrap_or_else(|| panic!("{k}: {status}"));
    assert!(field("refetches").parse::<u64>().unwrap() >= 1);
    assert_eq!(field("refetch recovered"), "0");
    run.close("rv2");
    let cached = cached_blocks(&c.image_cache());
    assert!(!cached.is_empty());
    for (b, bytes) in cached {
        assert_ne!(b, bad, "the bad block was cached");
        assert!(bytes == c.block(b), "cache slot of block {b}");
    }
}

/// `verity open URL ... --fec-device URL`: a block the server serves damaged is rebuilt from
/// the remote FEC object, verified against the tree, and served; the FEC object is read only
/// for the damaged blocks' codewords.
#[test]
fn verity_open_of_urls_corrects_from_a_remote_fec_object() {
    if common::env::fuse_missing() {
        return;
    }
    let Some(c) = case("fec", 1024, 43) else {
        return;
    };
    let www = c.dir.join("www-fec");
    std::fs::create_dir_all(&www).unwrap();
    let (data, hash, fec) = (
        www.join("data.img"),
        www.join("hash.img"),
        www.join("fec.img"),
    );
    std::fs::write(&data, &c.bytes).unwrap();
    let run = common::run::RunDir::new();
    let root_file = c.dir.join("fec-root.txt");
    run.ok(&[
        "verity",
        "format",
        data.to_str().unwrap(),
        hash.to_str().unwrap(),
        "--root-hash-file",
        root_file.to_str().unwrap(),
        "--fec-device",
        fec.to_str().unwrap(),
        "--fec-roots",
        "2",
    ]);
    let root = std::fs::read_to_string(&root_file)
        .unwrap()
        .trim()
        .to_string();
    // Two damaged blocks, far apart.
    for bad in [5u64, 700] {
        common::xor_byte(&data, bad * BS as u64 + 99, 0x10);
    }
    let Some(server) = common::remote_case::nginx(&www, &c.dir.join("nginx-fec")) else {
        return;
    };
    let url = |f: &str| format!("http://127.0.0.1:{}/{f}", server.port);
    let cache = c.dir.join("fec-cache");
    run.ok(&[
        "verity",
        "open",
        &url("data.img"),
        "rfec",
        &url("hash.img"),
        &root,
        "--fec-device",
        &url("fec.img"),
        "--fec-roots",
        "2",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    run.track("rfec");
    let dev = run.path().join("rfec");
    assert!(
        std::fs::read(&dev).unwrap() == c.bytes,
        "served bytes differ from the original"
    );
    let status = run.ok(&["status", "rfec"]);
    let field =
        |k: &str| common::status_field(&status, k).unwrap_or_else(|| panic!("{k}: {status}"));
    assert_eq!(field("fec corrected"), "2", "{status}");
    assert_eq!(field("fec uncorrectable"), "0", "{status}");
    run.close("rfec");
}
