//! Crash safety and corruption detection of the read-write device, on memory and on the
//! fault-injecting device, with devices laid out as the kernel's first activation lays them
//! out (a small formatter here mirrors `initialize_superblock`, `init_journal` and a wipe).

use super::journal::init_sections;
use super::rw_meta::*;
use super::tags::{TagAlgorithm, TagHasher};
use super::*;
use crate::block::{for_each_crash_state, BlockDevice, BlockError, FaultyDevice, MemoryDevice};
use std::sync::Arc;
use zeroize::Zeroizing;

/// Format parameters (integritysetup's options of the same names).
#[derive(Clone)]
pub(crate) struct Fmt {
    pub sector_size: u32,
    pub alg: TagAlgorithm,
    pub tag_size: u16,
    pub key: Option<Vec<u8>>,
    pub journal_sectors: u32,
    pub interleave: u32,
    pub salt: Option<[u8; 16]>,
}

impl Fmt {
    pub fn new(sector_size: u32, alg: TagAlgorithm) -> Fmt {
        Fmt {
            sector_size,
            alg,
            tag_size: alg.digest_size() as u16,
            key: None,
            journal_sectors: 704,
            interleave: 256,
            salt: Some(*b"0123456789abcdef"),
        }
    }
}

/// Lay out `dev` as the kernel does on first activation, then give every sector the tag of
/// its (zero) contents.
pub(crate) fn format(dev: &dyn BlockDevice, f: &Fmt) -> Layout {
    let sectors = dev.size() / 512;
    let mut sb = RawSuperblock(vec![0u8; 4096]);
    sb.0[..8].copy_from_slice(SB_MAGIC);
    sb.0[10..12].copy_from_slice(&f.tag_size.to_le_bytes());
    let log2_spb = (f.sector_size / 512).trailing_zeros();
    sb.0[28] = log2_spb as u8;
    let mut flags = SB_FLAG_FIXED_PADDING;
    if let Some(s) = f.salt {
        flags |= SB_FLAG_FIXED_HMAC;
        sb.0[48..64].copy_from_slice(&s);
    }
    sb.set_flags(flags);
    let spb = 1u32 << log2_spb;
    let entry = (8 + 8 * spb + u32::from(f.tag_size)).div_ceil(8) * 8;
    let section_sectors = (((JOURNAL_SECTOR_DATA as u32 / entry) * 8) << log2_spb) + 8;
    let sections = (f.journal_sectors / section_sectors).max(1);
    sb.0[12..16].copy_from_slice(&sections.to_le_bytes());
    sb.0[9] = (31 - f.interleave.leading_zeros()).clamp(3, 31) as u8;
    sb.0[8] = 1;
    let mut provided = 0u64;
    for bit in (3..64 - sectors.leading_zeros()).rev() {
        let prev = provided;
        provided |= 1 << bit;
        sb.0[16..24].copy_from_slice(&provided.to_le_bytes());
        if Layout::from_superblock(&sb, sectors).is_err() {
            provided = prev;
        }
    }
    sb.0[16..24].copy_from_slice(&provided.to_le_bytes());
    sb.set_version_for(Mode::Journal);
    let l = Layout::from_superblock(&sb, sectors).expect("test format fits");
    let mut mem = vec![0u8; l.journal_bytes()];
    init_sections(&l, &mut mem, 0, l.journal_sections, 0);
    dev.write_at(&mem, l.journal_offset()).unwrap();
    dev.write_at(&sb.0, 0).unwrap();
    let tagger = TagHasher::new(
        f.alg,
        f.key.as_deref(),
        f.salt,
        l.tag_size as usize,
        l.block_size(),
    )
    .unwrap();
    let zero = vec![0u8; l.block_size()];
    let mut tags = Vec::new();
    let mut t = vec![0u8; l.tag_size as usize];
    let mut s = 0;
    while s < l.provided_data_sectors {
        let n = l.area_remaining(s).min(l.provided_data_sectors - s);
        tags.clear();
        for k in (0..n).step_by(spb as usize) {
            tagger.tag(s + k, &zero, &mut t);
            tags.extend_from_slice(&t);
        }
        dev.write_at(&tags, l.tag_offset(s)).unwrap();
        s += n;
    }
    dev.flush().unwrap();
    l
}

fn opts(mode: Mode, f: &Fmt) -> IntegrityOptions {
    let mut o = IntegrityOptions::new("t", mode, f.alg);
    o.key = f.key.clone().map(Zeroizing::new);
    o.commit_time_ms = 3_600_000;
    o.bitmap_flush_ms = 3_600_000;
    o
}

/// A tiny deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the application did, in order.
pub(crate) enum AppOp {
    /// Blocks written (block, fill byte).
    Write(Vec<(u64, u8)>),
    /// A flush, acknowledged at this log length.
    Flush(usize),
}

/// Random writes of whole blocks (each filled with one byte value) and flushes to `dev` over
/// `faulty`: `rounds` rounds of one or two writes of one to three blocks, a flush after the
/// rounds `flush_round` picks, `hook(round)` at the end of each.
pub(crate) fn crash_workload(
    dev: &dyn BlockDevice,
    faulty: &FaultyDevice<MemoryDevice>,
    blocks: u64,
    seed: u64,
    rounds: usize,
    flush_round: impl Fn(usize) -> bool,
    hook: impl Fn(usize),
) -> Vec<AppOp> {
    let bs = dev.logical_block_size() as usize;
    let mut ops = Vec::new();
    let mut rng = Rng(seed);
    let mut fill = 1u8;
    for round in 0..rounds {
        for _ in 0..1 + rng.below(2) {
            let n = 1 + rng.below(3);
            let start = rng.below(blocks - n + 1);
            let mut buf = vec![0u8; n as usize * bs];
            let mut w = Vec::new();
            for k in 0..n {
                buf[k as usize * bs..(k as usize + 1) * bs].fill(fill);
                w.push((start + k, fill));
                fill = fill.wrapping_add(1).max(1);
            }
            dev.write_at(&buf, start * bs as u64).unwrap();
            ops.push(AppOp::Write(w));
        }
        hook(round);
        if flush_round(round) {
            dev.flush().unwrap();
            ops.push(AppOp::Flush(faulty.log_len()));
        }
    }
    ops
}

/// Reopen every state a power cut can leave of `base` after `log` with `open`, and check that
/// each block holds a version the application may see: the last one written before the last
/// acknowledged flush, or a later one (never a mix). With `corrupt_ok`, a block may instead
/// fail its check (`Corrupt`): detected, never wrong data. Returns the number of states.
pub(crate) fn crash_check(
    base: &[u8],
    log: &[crate::block::LoggedOp],
    ops: &[AppOp],
    blocks: u64,
    bs: usize,
    corrupt_ok: bool,
    open: impl Fn(&str, Arc<MemoryDevice>) -> Box<dyn BlockDevice>,
) -> usize {
    let mut states = 0;
    for_each_crash_state(base, log, |what, img| {
        states += 1;
        let cut: usize = what
            .strip_prefix("power cut before operation ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("state description");
        let acked = ops
            .iter()
            .rposition(|op| matches!(op, AppOp::Flush(at) if *at <= cut));
        let d = open(what, Arc::new(MemoryDevice::from_vec("img", img.to_vec())));
        let mut all = vec![0u8; (blocks as usize) * bs];
        let mut failed = vec![false; blocks as usize];
        if corrupt_ok {
            for (b, chunk) in all.chunks_exact_mut(bs).enumerate() {
                match d.read_at(chunk, (b * bs) as u64) {
                    Ok(()) => {}
                    Err(BlockError::Corrupt { .. }) => failed[b] = true,
                    Err(e) => panic!("{what}: read of block {b} failed: {e}"),
                }
            }
        } else {
            d.read_at(&mut all, 0)
                .unwrap_or_else(|e| panic!("{what}: read failed: {e}"));
        }
        for b in 0..blocks {
            if failed[b as usize] {
                continue;
            }
            let got = &all[b as usize * bs..(b as usize + 1) * bs];
            let v = got[0];
            assert!(got.iter().all(|&x| x == v), "{what}: block {b} is a mix");
            let mut versions = vec![(usize::MAX, 0u8)];
            for (i, op) in ops.iter().enumerate() {
                if let AppOp::Write(w) = op {
                    for &(blk, fl) in w {
                        if blk == b {
                            versions.push((i, fl));
                        }
                    }
                }
            }
            let floor = match acked {
                Some(a) => versions
                    .iter()
                    .rposition(|&(i, _)| i == usize::MAX || i < a)
                    .unwrap_or(0),
                None => 0,
            };
            assert!(
                versions[floor..].iter().any(|&(_, fl)| fl == v),
                "{what}: block {b} holds {v:#x}, not one of {:?}",
                &versions[floor..]
            );
        }
    });
    states
}

fn crash_run(mode: Mode, f: &Fmt, sectors_per_bit: Option<u64>, seed: u64, rounds: usize) -> usize {
    let mem = MemoryDevice::new("m", 1 << 20);
    let l = format(&mem, f);
    let base = mem.contents();
    let faulty = Arc::new(FaultyDevice::new(MemoryDevice::from_vec("m", base.clone())));
    let bs = l.block_size();
    let blocks = l.provided_data_sectors >> l.log2_spb;
    let mut o = opts(mode, f);
    o.sectors_per_bit = sectors_per_bit;
    // Commits and write-backs on the writing thread: one I/O order to cut.
    o.background_writeback = false;
    faulty.start_log();
    let dev = IntegrityDevice::open(faulty.clone(), o.clone()).unwrap();
    let mut ops = crash_workload(
        &dev,
        &faulty,
        blocks,
        seed,
        rounds,
        |round| round % 3 != 2 || mode == Mode::Journal,
        |round| {
            if mode == Mode::Bitmap && round % 5 == 4 {
                dev.clean_bitmap().unwrap();
            }
        },
    );
    dev.close().unwrap();
    ops.push(AppOp::Flush(faulty.log_len()));
    drop(dev);
    let log = faulty.take_log();
    crash_check(&base, &log, &ops, blocks, bs, false, |what, lower| {
        Box::new(
            IntegrityDevice::open(lower, o.clone())
                .unwrap_or_else(|e| panic!("{what}: open failed: {e}")),
        )
    })
}

#[test]
fn crash_journal_mode_512() {
    let n = crash_run(
        Mode::Journal,
        &Fmt::new(512, TagAlgorithm::Crc32c),
        None,
        1,
        40,
    );
    eprintln!("journal mode, 512-byte sectors: {n} crash states checked");
    assert!(n > 1000, "{n}");
}

#[test]
fn crash_journal_mode_4096_sha256() {
    let mut f = Fmt::new(4096, TagAlgorithm::Sha256);
    f.journal_sectors = 400;
    let n = crash_run(Mode::Journal, &f, None, 2, 30);
    eprintln!("journal mode, 4096-byte sectors: {n} crash states checked");
    assert!(n > 500, "{n}");
}

#[test]
fn crash_bitmap_mode() {
    let n = crash_run(
        Mode::Bitmap,
        &Fmt::new(512, TagAlgorithm::Crc32c),
        Some(64),
        3,
        60,
    );
    eprintln!("bitmap mode, 512-byte sectors: {n} crash states checked");
    assert!(n > 1000, "{n}");
    let n = crash_run(
        Mode::Bitmap,
        &Fmt::new(4096, TagAlgorithm::Crc32),
        Some(64),
        4,
        30,
    );
    eprintln!("bitmap mode, 4096-byte sectors: {n} crash states checked");
    assert!(n > 500, "{n}");
}

fn open_fmt(mode: Mode, f: &Fmt) -> (Arc<MemoryDevice>, IntegrityDevice, Layout) {
    let mem = Arc::new(MemoryDevice::new("m", 1 << 20));
    let l = format(&*mem, f);
    let d = IntegrityDevice::open(mem.clone(), opts(mode, f)).unwrap();
    (mem, d, l)
}

fn flip(mem: &MemoryDevice, byte: u64) {
    let mut b = [0u8];
    mem.read_at(&mut b, byte).unwrap();
    b[0] ^= 0x10;
    mem.write_at(&b, byte).unwrap();
}

fn expect_corrupt(d: &IntegrityDevice, block: u64) {
    let bs = d.logical_block_size() as usize;
    let mut buf = vec![0u8; bs];
    match d.read_at(&mut buf, block * bs as u64) {
        Err(BlockError::Corrupt {
            block: b, device, ..
        }) => {
            assert_eq!(b, block);
            assert_eq!(device, "t");
        }
        other => panic!("block {block}: expected a corruption, got {other:?}"),
    }
    // Its neighbours are fine.
    for n in [block.wrapping_sub(1), block + 1] {
        if n < d.size() / bs as u64 {
            d.read_at(&mut buf, n * bs as u64).unwrap();
        }
    }
}

#[test]
fn flipped_data_and_tag_bits_are_reported_at_their_block() {
    for mode in [Mode::Direct, Mode::Bitmap, Mode::Journal] {
        for ss in [512u32, 4096] {
            let f = Fmt::new(ss, TagAlgorithm::Crc32c);
            let (mem, d, l) = open_fmt(mode, &f);
            let bs = l.block_size();
            d.write_at(&vec![0xabu8; bs * 8], 0).unwrap();
            d.close().unwrap();
            drop(d);
            let d = IntegrityDevice::open(mem.clone(), opts(mode, &f)).unwrap();
            let data_block = 5u64;
            flip(&mem, l.data_sector(data_block << l.log2_spb) * 512 + 17);
            expect_corrupt(&d, data_block);
            let tag_block = (l.provided_data_sectors >> l.log2_spb) * 2 / 3;
            flip(&mem, l.tag_offset(tag_block << l.log2_spb) + 1);
            expect_corrupt(&d, tag_block);
            assert_eq!(
                d.stats()
                    .mismatches
                    .load(std::sync::atomic::Ordering::Relaxed),
                2
            );
        }
    }
}

/// A large read with hashed tags is read and checked in shares on the cores: it returns the
/// data written, and a flipped bit fails it at the first bad block in the request, whichever
/// share finds it first.
#[test]
fn a_large_read_checked_in_shares_fails_at_its_first_bad_block() {
    for alg in [TagAlgorithm::Sha256, TagAlgorithm::HmacSha256] {
        let mut f = Fmt::new(512, alg);
        f.key = alg.keyed().then(|| b"a key of the test".to_vec());
        // One area for the whole device, so a read is one piece large enough to split.
        f.interleave = 1 << 14;
        let mem = Arc::new(MemoryDevice::new("m", 4 << 20));
        let l = format(&*mem, &f);
        let d = IntegrityDevice::open(mem.clone(), opts(Mode::Direct, &f)).unwrap();
        let bs = l.block_size();
        let len = (d.size() as usize).min(2 << 20);
        assert!(len >= 1 << 20, "{len}");
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        d.write_at(&data, 0).unwrap();
        let mut back = vec![0u8; len];
        d.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{alg}: read back");
        let last = (len / bs) as u64 - 3;
        flip(&mem, l.data_sector(last << l.log2_spb) * 512 + 100);
        let first_bad = |d: &IntegrityDevice| match d.read_at(&mut vec![0u8; len], 0) {
            Err(BlockError::Corrupt { block, .. }) => block,
            other => panic!("{alg}: expected a corruption, got {other:?}"),
        };
        assert_eq!(first_bad(&d), last, "{alg}: the last share");
        flip(&mem, l.data_sector(2 << l.log2_spb) * 512);
        assert_eq!(
            first_bad(&d),
            2,
            "{alg}: the first bad block of the request"
        );
    }
}

#[test]
fn flipped_journal_bits_fail_the_replay_at_their_sector() {
    let f = Fmt::new(512, TagAlgorithm::Crc32c);
    let (mem, d, l) = open_fmt(Mode::Journal, &f);
    d.write_at(&[7u8; 512], 40 * 512).unwrap();
    d.flush().unwrap();
    // The state of a power cut now: committed, not written in place.
    let img = mem.contents();
    d.close().unwrap();
    // Data of the first journal entry (section 0, entry 0).
    let m = journal::JournalMap(&l);
    let mut bad = img.clone();
    bad[l.journal_offset() as usize + m.data(0, 0) + 3] ^= 1;
    let e = IntegrityDevice::open(
        Arc::new(MemoryDevice::from_vec("x", bad)),
        opts(Mode::Journal, &f),
    )
    .err()
    .expect("replay must fail");
    assert!(e.to_string().contains("at sector 40"), "{e}");
    // A commit id.
    let mut bad = img.clone();
    bad[l.journal_offset() as usize + m.sector(0, 3) + 505] ^= 1;
    let e = IntegrityDevice::open(
        Arc::new(MemoryDevice::from_vec("x", bad)),
        opts(Mode::Journal, &f),
    )
    .err()
    .expect("replay must fail");
    assert!(
        e.to_string().contains("commit id of section 0 sector 3"),
        "{e}"
    );
    // Untouched, the replay brings the write back.
    let d = IntegrityDevice::open(
        Arc::new(MemoryDevice::from_vec("x", img)),
        opts(Mode::Journal, &f),
    )
    .unwrap();
    let mut b = [0u8; 512];
    d.read_at(&mut b, 40 * 512).unwrap();
    assert_eq!(b, [7u8; 512]);
    assert_eq!(
        d.stats()
            .replayed_blocks
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn wrong_key_or_algorithm_is_refused_at_open() {
    let mut f = Fmt::new(512, TagAlgorithm::HmacSha256);
    f.key = Some(b"right key".to_vec());
    let mem = Arc::new(MemoryDevice::new("m", 1 << 20));
    format(&*mem, &f);
    let mut o = opts(Mode::Journal, &f);
    o.key = Some(Zeroizing::new(b"wrong key".to_vec()));
    let e = IntegrityDevice::open(mem.clone(), o).err().unwrap();
    assert!(
        e.to_string().contains("wrong --integrity algorithm or key"),
        "{e}"
    );
    let mut o = opts(Mode::Journal, &f);
    o.alg = Some(TagAlgorithm::Sha256);
    o.key = None;
    assert!(IntegrityDevice::open(mem.clone(), o).is_err());
    IntegrityDevice::open(mem.clone(), opts(Mode::Journal, &f)).unwrap();
    // Recovery mode reads without checking.
    let mut o = opts(Mode::Recovery, &f);
    o.key = Some(Zeroizing::new(b"wrong key".to_vec()));
    let d = IntegrityDevice::open(mem, o).unwrap();
    let mut b = [1u8; 512];
    d.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [0u8; 512]);
    assert!(d.write_at(&b, 0).is_err());
}

#[test]
fn data_survives_reopen_in_every_mode_and_mode_switch() {
    let f = Fmt::new(4096, TagAlgorithm::Sha1);
    let mem = Arc::new(MemoryDevice::new("m", 1 << 20));
    let l = format(&*mem, &f);
    let bs = l.block_size();
    let n = (l.provided_data_sectors >> l.log2_spb) as usize;
    let mut expect = vec![0u8; n * bs];
    let mut rng = Rng(9);
    for (round, mode) in [
        Mode::Journal,
        Mode::Bitmap,
        Mode::Direct,
        Mode::Journal,
        Mode::Bitmap,
    ]
    .into_iter()
    .enumerate()
    {
        let d = IntegrityDevice::open(mem.clone(), opts(mode, &f)).unwrap();
        for _ in 0..50 {
            let k = 1 + rng.below(9) as usize;
            let s = rng.below((n - k) as u64) as usize;
            let v = (round * 50 + 1) as u8 ^ rng.below(255) as u8;
            expect[s * bs..(s + k) * bs].fill(v);
            d.write_at(&expect[s * bs..(s + k) * bs], (s * bs) as u64)
                .unwrap();
        }
        let mut got = vec![0u8; n * bs];
        d.read_at(&mut got, 0).unwrap();
        assert!(got == expect, "mode {mode}: read back before close");
        drop(d);
        let d = IntegrityDevice::open(mem.clone(), opts(Mode::Direct, &f)).unwrap();
        d.read_at(&mut got, 0).unwrap();
        assert!(got == expect, "mode {mode}: read back after reopen");
    }
}

#[test]
fn concurrent_writers_and_readers_keep_tags_consistent() {
    for mode in [Mode::Journal, Mode::Bitmap, Mode::Direct] {
        let f = Fmt::new(512, TagAlgorithm::Crc32c);
        let (_mem, d, l) = open_fmt(mode, &f);
        let d = Arc::new(d);
        let blocks = l.provided_data_sectors >> l.log2_spb;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let d = d.clone();
                s.spawn(move || {
                    let mut rng = Rng(t);
                    let mut buf = vec![0u8; 4 * 512];
                    for i in 0..400 {
                        let b = rng.below(blocks - 4);
                        if i % 2 == 0 {
                            buf.fill((t as u8).wrapping_add(i as u8));
                            d.write_at(&buf, b * 512).unwrap();
                        } else {
                            d.read_at(&mut buf, b * 512).unwrap();
                        }
                        if i % 97 == 0 {
                            d.flush().unwrap();
                        }
                    }
                });
            }
        });
    }
}

/// Writes of many blocks from several threads at once, each spanning journal sections and
/// sharing a section with the next writer's reservation (which a writer fills first and
/// releases early), while another thread reads: every read verifies, and each writer's region
/// holds what it last wrote, before and after a replay of the journal.
#[test]
fn section_spanning_writes_from_many_threads_read_back_and_replay() {
    let f = Fmt::new(512, TagAlgorithm::Crc32c);
    let (mem, d, l) = open_fmt(Mode::Journal, &f);
    assert!(l.journal_sections > 1 && l.journal_section_entries < 200);
    let blocks = l.provided_data_sectors >> l.log2_spb;
    let (writers, region) = (3u64, 256u64);
    assert!(writers * region <= blocks, "{blocks}");
    let d = Arc::new(d);
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..writers)
            .map(|t| {
                let d = d.clone();
                s.spawn(move || {
                    let mut rng = Rng(100 + t);
                    let mut model = vec![0u8; region as usize * 512];
                    for i in 0..150u64 {
                        let n = 1 + rng.below(200);
                        let b = rng.below(region - n + 1);
                        let v = (t * 64 + i % 64 + 1) as u8;
                        let buf = vec![v; n as usize * 512];
                        d.write_at(&buf, (t * region + b) * 512).unwrap();
                        model[b as usize * 512..(b + n) as usize * 512].copy_from_slice(&buf);
                        if i % 37 == 36 {
                            d.flush().unwrap();
                        }
                    }
                    model
                })
            })
            .collect();
        let reader = d.clone();
        s.spawn(move || {
            let mut all = vec![0u8; (writers * region) as usize * 512];
            for _ in 0..60 {
                reader.read_at(&mut all, 0).unwrap();
            }
        });
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let check = |d: &IntegrityDevice, when: &str| {
        for (t, model) in models.iter().enumerate() {
            let mut got = vec![0u8; model.len()];
            d.read_at(&mut got, t as u64 * region * 512).unwrap();
            assert!(got == *model, "writer {t}'s region differs {when}");
        }
    };
    check(&d, "before the replay");
    d.flush().unwrap();
    // A power cut after the flush: what the journal holds is replayed at the next open.
    let img = mem.contents();
    drop(d);
    let d = IntegrityDevice::open(
        Arc::new(MemoryDevice::from_vec("x", img)),
        opts(Mode::Journal, &f),
    )
    .unwrap();
    check(&d, "after the replay");
}

#[test]
fn batched_tags_equal_single_tags() {
    for alg in [
        TagAlgorithm::Crc32c,
        TagAlgorithm::Crc32,
        TagAlgorithm::Sha256,
    ] {
        for bs in [512usize, 4096] {
            for salt in [None, Some(*b"fedcba9876543210")] {
                for ts in [4usize, 8] {
                    let h = TagHasher::new(alg, None, salt, ts, bs).unwrap();
                    let mut rng = Rng(bs as u64);
                    let data: Vec<u8> = (0..9 * bs).map(|_| rng.next() as u8).collect();
                    for n in 1..=9 {
                        let mut batch = vec![0u8; n * ts];
                        h.tag_blocks(77 * 8, &data[..n * bs], &mut batch);
                        for k in 0..n {
                            let mut one = vec![0u8; ts];
                            h.tag(
                                77 * 8 + (k * bs / 512) as u64,
                                &data[k * bs..(k + 1) * bs],
                                &mut one,
                            );
                            assert_eq!(
                                batch[k * ts..(k + 1) * ts],
                                one[..],
                                "{alg} bs {bs} n {n} k {k}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn replayed_entries_are_not_written_again_after_the_journal_wraps() {
    let f = Fmt::new(512, TagAlgorithm::Crc32c);
    let mem = Arc::new(MemoryDevice::new("m", 1 << 20));
    let l = format(&*mem, &f);
    assert_eq!(l.journal_sections, 4);
    let mut o = opts(Mode::Journal, &f);
    o.background_writeback = false;
    let d = IntegrityDevice::open(mem.clone(), o.clone()).unwrap();
    d.write_at(&[7u8; 5 * 512], 40 * 512).unwrap();
    d.flush().unwrap();
    // A power cut: the journal holds blocks 40..45, nothing is in place.
    let img = mem.contents();
    drop(d);
    let mem = Arc::new(MemoryDevice::from_vec("x", img));
    let d = IntegrityDevice::open(mem.clone(), o.clone()).unwrap();
    d.write_at(&[9u8; 512], 42 * 512).unwrap();
    d.flush().unwrap();
    // Go round the journal: the replayed section is filled again and written back.
    for k in 0..8u64 {
        d.write_at(&[k as u8 + 1; 512], (100 + k) * 512).unwrap();
        d.flush().unwrap();
    }
    drop(d);
    let d = IntegrityDevice::open(mem, o).unwrap();
    let mut b = [0u8; 512];
    d.read_at(&mut b, 42 * 512).unwrap();
    assert_eq!(
        b, [9u8; 512],
        "a replayed entry came back over a newer write"
    );
    d.read_at(&mut b, 41 * 512).unwrap();
    assert_eq!(b, [7u8; 512]);
}

#[test]
fn reads_of_journalled_blocks_during_background_writeback_do_not_deadlock() {
    // A one-section journal written back by the background thread at every flush while other
    // threads read the very blocks being written back.
    let mut f = Fmt::new(512, TagAlgorithm::Crc32c);
    f.journal_sectors = 176;
    let (_mem, d, l) = open_fmt(Mode::Journal, &f);
    assert_eq!(l.journal_sections, 1);
    let d = Arc::new(d);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let d = d.clone();
            s.spawn(move || {
                let mut buf = vec![0u8; 8 * 512];
                let mut all = vec![0u8; 64 * 512];
                for i in 0..3000u64 {
                    let b = (i * 8) % 64;
                    if t == 0 {
                        buf.fill(i as u8);
                        d.write_at(&buf, b * 512).unwrap();
                        if i % 4 == 0 {
                            d.flush().unwrap();
                        }
                    } else {
                        d.read_at(&mut all, 0).unwrap();
                    }
                }
            });
        }
    });
}

/// A device handed over to a forked server writes nothing when this process drops it: the
/// journal and the dirty bitmap on disk stay the server's (without the hand-over, the drop's
/// clean stop rewrites them, which is what made a crashed server's device unopenable).
#[test]
fn a_handed_over_device_writes_nothing_at_drop() {
    for mode in [Mode::Journal, Mode::Bitmap] {
        for hand_over in [false, true] {
            let f = Fmt::new(512, TagAlgorithm::Crc32c);
            let (mem, d, _) = open_fmt(mode, &f);
            d.write_at(&[0x5a; 4096], 8192).unwrap();
            d.flush().unwrap();
            let before = mem.contents();
            if hand_over {
                d.hand_over();
            }
            drop(d);
            let same = mem.contents() == before;
            assert_eq!(same, hand_over, "{mode:?}, hand_over={hand_over}");
        }
    }
}

/// Go round a four-section journal (mode J, inline write-back): every block written before
/// is then in place, its tags written through the tag cache. Blocks 100..108 are used.
fn go_round_the_journal(d: &IntegrityDevice) {
    for k in 0..8u64 {
        d.write_at(&[k as u8 + 1; 512], (100 + k) * 512).unwrap();
        d.flush().unwrap();
    }
}

#[test]
fn cached_tags_follow_writes_and_replay_and_still_catch_corruption() {
    let f = Fmt::new(512, TagAlgorithm::Sha256);
    for mode in [Mode::Journal, Mode::Bitmap, Mode::Direct] {
        let mem = Arc::new(MemoryDevice::new("m", 1 << 20));
        let l = format(&*mem, &f);
        let mut o = opts(mode, &f);
        o.background_writeback = false;
        let d = IntegrityDevice::open(mem.clone(), o.clone()).unwrap();
        let settle = |d: &IntegrityDevice| {
            d.flush().unwrap();
            if mode == Mode::Journal {
                go_round_the_journal(d);
            }
        };
        let (x, y) = (40u64, 41u64);
        d.write_at(&[0xa1u8; 1024], x * 512).unwrap();
        settle(&d);
        // Read from the disk: the page with x's and y's tags is now cached.
        let mut b = [0u8; 512];
        d.read_at(&mut b, x * 512).unwrap();
        assert_eq!(b, [0xa1u8; 512], "{mode:?}");
        // A new write of x reaches the disk and the cached tag alike (a stale cached tag
        // would fail the read after it).
        let rewrite = |d: &IntegrityDevice, v: u8| {
            d.write_at(&[v; 512], x * 512).unwrap();
            settle(d);
            let mut b = [0u8; 512];
            d.read_at(&mut b, x * 512).unwrap();
            assert_eq!(b, [v; 512], "{mode:?}");
        };
        rewrite(&d, 0xb2);
        // Data changed behind the device's back is caught against the cached tag, and again
        // on the next read (the cached tag is not replaced by the bad data's).
        flip(&mem, l.data_sector(x) * 512 + 9);
        expect_corrupt(&d, x);
        expect_corrupt(&d, x);
        d.read_at(&mut b, y * 512).unwrap();
        assert_eq!(b, [0xa1u8; 512], "{mode:?}");
        // Rewriting the block heals it.
        rewrite(&d, 0xc3);
        if mode == Mode::Journal {
            assert!(
                d.stats()
                    .journal_writebacks
                    .load(std::sync::atomic::Ordering::Relaxed)
                    > 0
            );
            // A power cut after a commit: the journal alone holds x's new version; the replay
            // at the next open writes it in place through that device's cache, and what it
            // caches checks the data.
            d.write_at(&[0xd4u8; 512], x * 512).unwrap();
            d.flush().unwrap();
            let img = mem.contents();
            drop(d);
            let mem = Arc::new(MemoryDevice::from_vec("t", img));
            let d = IntegrityDevice::open(mem.clone(), o.clone()).unwrap();
            assert!(d.replay_report().is_some());
            d.read_at(&mut b, x * 512).unwrap();
            assert_eq!(b, [0xd4u8; 512]);
            flip(&mem, l.data_sector(x) * 512 + 100);
            expect_corrupt(&d, x);
            continue;
        }
        // Modes B and D keep tags dirty in the cache: close writes them, and a fresh open
        // (an empty cache) reads them from the disk.
        d.close().unwrap();
        drop(d);
        let d = IntegrityDevice::open(mem.clone(), o.clone()).unwrap();
        d.read_at(&mut b, x * 512).unwrap();
        assert_eq!(b, [0xc3u8; 512], "{mode:?}");
        // A flipped tag on the disk is caught once its page is read into the cache, and
        // again from the cache.
        flip(&mem, l.tag_offset(y) + 3);
        drop(d);
        let d = IntegrityDevice::open(mem.clone(), o.clone()).unwrap();
        expect_corrupt(&d, y);
        expect_corrupt(&d, y);
    }
}

/// The serving path's tags (batched multi-buffer, split over the pool for large requests)
/// equal the per-block tags and OpenSSL's HMAC, on random keys, first sectors, salts, tag
/// sizes, batch lengths on both sides of the split and data at odd addresses.
#[test]
fn pooled_hmac_and_sha256_tags_equal_single_tags_and_openssl() {
    use openssl::{hash::MessageDigest, pkey::PKey, sign::Signer};
    let mut rng = Rng(2027);
    for round in 0..12 {
        let alg = [TagAlgorithm::HmacSha256, TagAlgorithm::Sha256][round % 2];
        let bs = [512usize, 4096][rng.below(2) as usize];
        let key: Vec<u8> = (0..1 + rng.below(100)).map(|_| rng.next() as u8).collect();
        let salt = (rng.below(2) == 0).then(|| std::array::from_fn(|_| rng.next() as u8));
        let ts = 4 + rng.below(29) as usize;
        let keyed = alg == TagAlgorithm::HmacSha256;
        let h = TagHasher::new(alg, keyed.then_some(&key[..]), salt, ts, bs).unwrap();
        // Around the 512 KiB where a request is split, and small ones that are not.
        let n = match round % 3 {
            0 => 1 + rng.below(40) as usize,
            1 => (512 << 10) / bs - 1 + rng.below(3) as usize,
            _ => (1 << 20) / bs + rng.below(9) as usize,
        };
        let align = 1 + rng.below(15) as usize;
        let raw: Vec<u8> = (0..align + n * bs).map(|_| rng.next() as u8).collect();
        let data = &raw[align..];
        let first = rng.below(1 << 40) * (bs as u64 / 512);
        let mut pooled = vec![0u8; n * ts];
        h.tag_blocks_pooled(first, data, &mut pooled);
        for k in 0..n {
            let sector = first + (k * bs / 512) as u64;
            let block = &data[k * bs..(k + 1) * bs];
            let mut one = vec![0u8; ts];
            h.tag(sector, block, &mut one);
            let got = &pooled[k * ts..(k + 1) * ts];
            assert_eq!(got, &one[..], "{alg} round {round} n {n} k {k}");
            if keyed && (k == 0 || k == n - 1 || k == n / 2) {
                let pk = PKey::hmac(&key).unwrap();
                let mut s = Signer::new(MessageDigest::sha256(), &pk).unwrap();
                if let Some(salt) = &salt {
                    s.update(salt).unwrap();
                }
                s.update(&sector.to_le_bytes()).unwrap();
                s.update(block).unwrap();
                let mac = s.sign_to_vec().unwrap();
                let m = ts.min(32);
                assert_eq!(&got[..m], &mac[..m], "openssl: round {round} k {k}");
                assert!(got[m..].iter().all(|&b| b == 0));
            }
        }
    }
}
