//! LUKS2 with integrity, the stacked targets on memory: crash safety with the crypt layer on
//! top of dm-integrity (modes J and D), and tampering on disk detected at exactly the
//! sectors touched.

use super::integrity::format;
use crate::block::{BlockDevice, BlockError, FaultyDevice, MemoryDevice, TaggedBlockDevice};
use crate::crypt::cipher::{AeadKind, SectorAead};
use crate::crypt::target::AeadCryptDevice;
use crate::integrity::format::FormatParams as IntegrityFormatParams;
use crate::integrity::rw_meta::{Layout, RawSuperblock};
use crate::integrity::tests::{crash_check, crash_workload, AppOp};
use crate::integrity::{IntegrityDevice, IntegrityOptions, Mode};
use std::sync::Arc;

/// Every pairing with its volume key size.
fn kinds() -> Vec<(AeadKind, usize)> {
    [
        ("aes-xts-plain64", "hmac(sha256)", 96),
        ("aes-xts-plain64", "hmac(sha512)", 128),
        ("aes-xts-random", "hmac(sha256)", 96),
        ("aes-gcm-random", "aead", 32),
        ("chacha20-random", "poly1305", 32),
        ("aes-xts-random", "none", 64),
    ]
    .into_iter()
    .map(|(c, i, k)| (AeadKind::from_luks2(c, i).unwrap(), k))
    .collect()
}

fn key(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 29 + 3) as u8).collect()
}

/// A formatted (and wiped) device of `size` bytes for `kind`: a small journal and interleave
/// (the kernel's defaults do not fit a 1 MiB device), so that it has several areas and the
/// journal wraps.
fn formatted(kind: AeadKind, vk: &[u8], ss: u32, size: usize) -> Vec<u8> {
    let mem = MemoryDevice::new("m", size);
    let mut ip = IntegrityFormatParams::external_tags(kind.metadata_size() as u16, ss);
    // Two journal sections: a write-back at about every flush, a few runs each (the crash
    // model tries every subset of the writes between two flushes).
    ip.journal_sectors = if ss == 512 { 176 } else { 528 };
    ip.interleave_sectors = if ss == 512 { 256 } else { 2048 };
    let p = crate::integrity::format::plan(&ip, size as u64).unwrap();
    let to = super::integrity::FormatTarget {
        dev: &mem,
        direct: None,
    };
    format(to, 0, &p, kind, vk, true, &mut |_, _| {}).unwrap();
    mem.contents()
}

/// The stack over `lower`: integrity in `mode` (commits and write-backs on the writing thread,
/// so each run has one I/O order), crypt on top.
fn stack(
    lower: Arc<dyn BlockDevice>,
    kind: AeadKind,
    vk: &[u8],
    ss: u32,
    mode: Mode,
) -> AeadCryptDevice {
    let mut o = IntegrityOptions::external_tags("t_dif", mode);
    o.commit_time_ms = 3_600_000;
    o.background_writeback = false;
    let i: Arc<dyn TaggedBlockDevice> = Arc::new(IntegrityDevice::open(lower, o).unwrap());
    let aead = SectorAead::new(kind, vk, ss as usize).unwrap();
    AeadCryptDevice::new("t", i, aead, false).unwrap()
}

fn crash_run(kind: AeadKind, vk_len: usize, ss: u32, mode: Mode, seed: u64) -> usize {
    let vk = key(vk_len);
    let base = formatted(kind, &vk, ss, 1 << 20);
    let faulty = Arc::new(FaultyDevice::new(MemoryDevice::from_vec("m", base)));
    // The states of the first activation (its journal set-up) are the integrity tests'
    // business; these start from the activated device.
    let dev = stack(faulty.clone(), kind, &vk, ss, mode);
    dev.flush().unwrap();
    let base = faulty.inner().contents();
    faulty.start_log();
    let bs = ss as usize;
    let blocks = dev.size() / bs as u64;
    // A flush every round: the crash model bounds the writes between flushes, and a flush
    // in mode D also writes the dirty tag pages.
    let flush = |_| true;
    let mut ops = crash_workload(&dev, &faulty, blocks, seed, 24, flush, |_| {});
    // Dropping the stack is the kernel's suspend: commit, write back, clean stop.
    drop(dev);
    ops.push(AppOp::Flush(faulty.log_len()));
    let log = faulty.take_log();
    // Mode J keeps data and tag together; mode D may leave a block whose data and tag
    // disagree, which then fails to authenticate: detected, never wrong data.
    let corrupt_ok = mode == Mode::Direct;
    crash_check(&base, &log, &ops, blocks, bs, corrupt_ok, |_, lower| {
        Box::new(stack(lower, kind, &vk, ss, mode))
    })
}

#[test]
fn crash_journal_mode_keeps_every_sector_old_or_new() {
    let (hmac, _) = kinds()[0];
    let (gcm, _) = kinds()[3];
    let n =
        crash_run(hmac, 96, 512, Mode::Journal, 11) + crash_run(gcm, 32, 4096, Mode::Journal, 12);
    eprintln!("crypt over integrity, mode J: {n} crash states checked");
    assert!(n > 500, "{n}");
}

#[test]
fn crash_without_journal_never_returns_unauthenticated_data() {
    let (hmac, _) = kinds()[0];
    let (chacha, _) = kinds()[4];
    let n =
        crash_run(hmac, 96, 4096, Mode::Direct, 13) + crash_run(chacha, 32, 512, Mode::Direct, 14);
    eprintln!("crypt over integrity, mode D: {n} crash states checked");
    assert!(n > 100, "{n}");
}

/// Raw positions of a sector's data and tag on the formatted device.
struct Raw {
    layout: Layout,
    ss: usize,
    ts: usize,
}

impl Raw {
    fn new(img: &MemoryDevice, ss: u32) -> Raw {
        let mut sb = vec![0u8; 4096];
        img.read_at(&mut sb, 0).unwrap();
        let layout = Layout::from_superblock(&RawSuperblock(sb), img.size() / 512).unwrap();
        let ts = layout.tag_size as usize;
        Raw {
            layout,
            ss: ss as usize,
            ts,
        }
    }
    fn data_at(&self, block: u64) -> u64 {
        self.layout.data_sector(block * (self.ss as u64 / 512)) * 512
    }
    fn tag_at(&self, block: u64) -> u64 {
        self.layout.tag_offset(block * (self.ss as u64 / 512))
    }
    /// (data, tag) of `block`.
    fn get(&self, img: &MemoryDevice, block: u64) -> (Vec<u8>, Vec<u8>) {
        let mut d = vec![0u8; self.ss];
        let mut t = vec![0u8; self.ts];
        img.read_at(&mut d, self.data_at(block)).unwrap();
        img.read_at(&mut t, self.tag_at(block)).unwrap();
        (d, t)
    }
    fn put(&self, img: &MemoryDevice, block: u64, (d, t): &(Vec<u8>, Vec<u8>)) {
        img.write_at(d, self.data_at(block)).unwrap();
        img.write_at(t, self.tag_at(block)).unwrap();
    }
    fn flip(&self, img: &MemoryDevice, at: u64) {
        let mut b = [0u8];
        img.read_at(&mut b, at).unwrap();
        b[0] ^= 0x40;
        img.write_at(&b, at).unwrap();
    }
}

/// The blocks of the first `n` that fail to read, each read alone; the others read `want`.
fn failing(dev: &AeadCryptDevice, n: u64, want: &dyn Fn(u64) -> u8) -> Vec<u64> {
    let bs = dev.logical_block_size() as usize;
    let mut bad = Vec::new();
    for b in 0..n {
        let mut buf = vec![0u8; bs];
        match dev.read_at(&mut buf, b * bs as u64) {
            Ok(()) => assert!(
                buf.iter().all(|&x| x == want(b)),
                "block {b} reads {:#x}, not {:#x}",
                buf[0],
                want(b)
            ),
            Err(BlockError::Corrupt { .. }) => {
                assert!(buf.iter().all(|&x| x == 0), "a failed read leaks data");
                bad.push(b)
            }
            Err(e) => panic!("block {b}: {e}"),
        }
    }
    bad
}

#[test]
fn tampering_fails_exactly_the_sectors_touched() {
    for (kind, vk_len) in kinds() {
        for ss in [512u32, 4096] {
            let vk = key(vk_len);
            let img = Arc::new(MemoryDevice::from_vec(
                "m",
                formatted(kind, &vk, ss, 1 << 20),
            ));
            let raw = Raw::new(&img, ss);
            let bs = ss as usize;
            let n = 8u64;
            let fill = |b: u64| 0x10 + b as u8;
            // v1 everywhere, remember block 1's sealed v1, then v2 in block 1.
            let write = |b: u64, v: u8| {
                let d = stack(img.clone(), kind, &vk, ss, Mode::Journal);
                d.write_at(&vec![v; bs], b * bs as u64).unwrap();
            };
            for b in 0..n {
                write(b, fill(b));
            }
            let old1 = raw.get(&img, 1);
            write(1, 0x99);
            let want = |b: u64| if b == 1 { 0x99 } else { fill(b) };
            let check = |what: &str, expect: &[u64], want: &dyn Fn(u64) -> u8| {
                let d = stack(img.clone(), kind, &vk, ss, Mode::Journal);
                let bad = failing(&d, n, want);
                assert_eq!(bad, expect, "{kind:?} {ss}: {what}");
                d.stats()
                    .auth_failures
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            assert_eq!(check("untouched", &[], &want), 0);
            if kind == AeadKind::XtsRandom {
                // No authentication: nothing to detect, by design (integrity "none").
                continue;
            }
            let snapshot = img.contents();
            let restore = || img.write_at(&snapshot, 0).unwrap();
            // A bit of ciphertext, of the tag, of the stored IV.
            raw.flip(&img, raw.data_at(2) + 100);
            assert_eq!(check("ciphertext bit", &[2], &want), 1);
            restore();
            raw.flip(&img, raw.tag_at(3));
            check("tag bit", &[3], &want);
            restore();
            if kind.stores_iv() {
                raw.flip(&img, raw.tag_at(4) + kind.auth_size() as u64);
                check("IV bit", &[4], &want);
                restore();
            }
            // Old ciphertext under the current tag.
            let cur1 = raw.get(&img, 1);
            raw.put(&img, 1, &(old1.0.clone(), cur1.1.clone()));
            check("old ciphertext, current tag", &[1], &want);
            restore();
            // An old sector (ciphertext and tag) at another position.
            raw.put(&img, 5, &old1);
            check("old sector replayed at another position", &[5], &want);
            restore();
            // Two sectors swapped.
            let (s6, s7) = (raw.get(&img, 6), raw.get(&img, 7));
            raw.put(&img, 6, &s7);
            raw.put(&img, 7, &s6);
            check("sectors 6 and 7 swapped", &[6, 7], &want);
            restore();
            // An old sector at its own position is authentic for that position: the kernel
            // accepts it too (LUKS2 integrity has no freshness); it reads the old data.
            raw.put(&img, 1, &old1);
            let old_want = |b: u64| fill(b);
            check("old sector at its own position", &[], &old_want);
            restore();
        }
    }
}

/// A request large enough to be split over the cores (each part read, or sealed, by its own
/// thread) reads back what was written, and a tampered sector in any part fails the whole
/// request, names that sector and leaks nothing.
#[test]
fn a_request_split_over_the_cores_fails_whole_at_a_tampered_sector() {
    let (kind, vk_len) = kinds()[0];
    let vk = key(vk_len);
    for ss in [512u32, 4096] {
        let img = Arc::new(MemoryDevice::from_vec(
            "m",
            formatted(kind, &vk, ss, 4 << 20),
        ));
        let raw = Raw::new(&img, ss);
        let dev = stack(img.clone(), kind, &vk, ss, Mode::Journal);
        let len = (2 << 20) - (2 << 20) % ss as usize;
        let data: Vec<u8> = (0..len).map(|i| (i / 512 * 7 + i % 251) as u8).collect();
        dev.write_at(&data, 0).unwrap();
        let mut back = vec![0u8; len];
        dev.read_at(&mut back, 0).unwrap();
        assert!(
            back == data,
            "{ss}: the split read differs from the split write"
        );
        drop(dev);
        let blocks = (len / ss as usize) as u64;
        // A sector in the first part, then one in the last.
        for bad in [3, blocks - 2] {
            let snapshot = img.contents();
            raw.flip(&img, raw.data_at(bad) + 17);
            let dev = stack(img.clone(), kind, &vk, ss, Mode::Journal);
            let mut back = vec![0xa5u8; len];
            match dev.read_at(&mut back, 0) {
                Err(BlockError::Corrupt { block, .. }) => assert_eq!(block, bad, "{ss}"),
                other => panic!("{ss}: block {bad} tampered, the read gave {other:?}"),
            }
            assert!(
                back.iter().all(|&b| b == 0),
                "{ss}: a failed read leaks data"
            );
            let failures = dev
                .stats()
                .auth_failures
                .load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(failures, 1, "{ss}");
            drop(dev);
            img.write_at(&snapshot, 0).unwrap();
        }
    }
}

/// A write filled in the journal's memory (`write_tagged_with`) stores what a copied one
/// (`write_tagged`) stores, byte for byte: single blocks, runs across sections, a write that
/// wraps the journal and one larger than the whole journal (several rounds, each waiting for
/// a write-back); and the blocks and tags read back are the last ones written.
#[test]
fn a_write_filled_in_the_journal_stores_what_a_copied_one_does() {
    let (kind, vk_len) = kinds()[0];
    let vk = key(vk_len);
    for ss in [512u32, 4096] {
        let base = formatted(kind, &vk, ss, 1 << 20);
        let open = || {
            let mem = Arc::new(MemoryDevice::from_vec("m", base.clone()));
            let mut o = IntegrityOptions::external_tags("t_dif", Mode::Journal);
            o.commit_time_ms = 3_600_000;
            o.background_writeback = false;
            (mem.clone(), IntegrityDevice::open(mem, o).unwrap())
        };
        let ((copied_mem, copied), (filled_mem, filled)) = (open(), open());
        let (bs, ts) = (ss as usize, copied.tag_size());
        let blocks = copied.size() as usize / bs;
        let mut want = vec![0u8; blocks * bs];
        let mut want_tags = vec![0u8; blocks * ts];
        let writes = [
            (0, 1),
            (3, 7),
            (1, blocks / 2),
            (5, blocks - 5),
            (blocks - 2, 2),
            (9, 30),
        ];
        for (w, &(at, n)) in writes.iter().enumerate() {
            let data: Vec<u8> = (0..n * bs)
                .map(|i| (i * 13 + w * 71 + i / 509) as u8)
                .collect();
            let tags: Vec<u8> = (0..n * ts).map(|i| (i * 7 + w) as u8).collect();
            let off = (at * bs) as u64;
            copied.write_tagged(&data, &tags, off).unwrap();
            let mut pieces_seen = 0;
            filled
                .write_tagged_with(off, n * bs, &mut |pieces| {
                    for p in pieces.iter_mut() {
                        let k = (p.offset - off) as usize;
                        p.data.copy_from_slice(&data[k..k + p.data.len()]);
                        p.tags.copy_from_slice(&tags[k / bs * ts..][..p.tags.len()]);
                        pieces_seen += 1;
                    }
                })
                .unwrap();
            assert!(pieces_seen >= 1);
            want[at * bs..(at + n) * bs].copy_from_slice(&data);
            want_tags[at * ts..(at + n) * ts].copy_from_slice(&tags);
        }
        for dev in [&copied, &filled] {
            let (mut back, mut back_tags) = (vec![0u8; blocks * bs], vec![0u8; blocks * ts]);
            dev.read_tagged(&mut back, &mut back_tags, 0).unwrap();
            assert!(back == want && back_tags == want_tags, "{ss}: read back");
        }
        // Dropping is the kernel's suspend: commit, write back, clean stop.
        drop((copied, filled));
        assert!(
            copied_mem.contents() == filled_mem.contents(),
            "{ss}: the images differ"
        );
    }
}
