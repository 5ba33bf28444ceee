//! The dm-verity FEC decoder driven with anything: random codewords, parity and erasure
//! patterns (out-of-range and duplicated erasures, more erasures than roots), for every roots
//! count 2..=24, through the Reed-Solomon decoder itself and through the [`Corrector`] that
//! rebuilds a block from its round. Neither ever panics; a word the decoder returns is always
//! a codeword (its data re-encodes to its parity) and a word it refuses is left as it was;
//! within the bound (2·errors + erasures ≤ roots) the original comes back.
//!
//! Input: byte 0 chooses roots, byte 1's low bit the decoder or the corrector; the rest
//! shapes the case (see [`rs_case`] and [`corrector_case`]).

#![no_main]

use std::collections::BTreeSet;

use dmkit::block::MemoryDevice;
use dmkit::verity::fec::correct::{Corrector, IsBad};
use dmkit::verity::fec::encode::encode;
use dmkit::verity::fec::rs::{Rs, NN};
use dmkit::verity::fec::{FecGeometry, FecInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let roots = 2 + data[0] % 23;
    let mut input = Bytes(&data[2..]);
    if data[1] & 1 == 0 {
        rs_case(roots, data[1] >> 1, &mut input);
    } else {
        corrector_case(roots, data[1] >> 1, &mut input);
    }
});

/// The fuzzer's bytes, read front to back; zeros once they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, i| acc | u64::from(self.u8()) << (8 * i))
    }
    /// An erasure position: mostly in the codeword, sometimes far out of it.
    fn position(&mut self) -> usize {
        match self.u16() {
            v @ 0xff00.. => usize::from(v) * 0x1_0001 + usize::from(v & 1) * (usize::MAX / 2),
            v => usize::from(v) % NN,
        }
    }
    fn rest(&mut self) -> &[u8] {
        std::mem::take(&mut self.0)
    }
}

/// Whether `word` is a codeword: its data re-encodes to its parity.
fn is_codeword(rs: &Rs, word: &[u8]) -> bool {
    let mut parity = vec![0u8; rs.roots()];
    rs.encode(&word[..rs.data_len()], &mut parity);
    parity == word[rs.data_len()..]
}

/// One codeword through [`Rs::decode`]. `mode` bit 0: the word is the fuzzer's bytes as they
/// are (data and parity from disk, no original); bit 1: the erasure positions are damaged too;
/// bit 2: the erasure list names its first position twice more.
fn rs_case(roots: u8, mode: u8, input: &mut Bytes) {
    let rs = Rs::new(roots).expect("roots 2..=24");
    let n_errors = usize::from(input.u8() % 40);
    let n_erasures = usize::from(input.u8() % 40);
    let errors: Vec<(usize, u8)> = (0..n_errors)
        .map(|_| (usize::from(input.u8()) % NN, input.u8().max(1)))
        .collect();
    let mut erasures: Vec<usize> = (0..n_erasures).map(|_| input.position()).collect();
    if mode & 4 != 0 {
        if let Some(&first) = erasures.first() {
            erasures.extend([first, first]);
        }
    }
    let raw = mode & 1 != 0;
    let mut original = [0u8; NN];
    let bytes = input.rest();
    if raw {
        let n = bytes.len().min(NN);
        original[..n].copy_from_slice(&bytes[..n]);
    } else {
        let k = rs.data_len();
        let n = bytes.len().min(k);
        original[..n].copy_from_slice(&bytes[..n]);
        let (d, p) = original.split_at_mut(k);
        rs.encode(d, p);
    }
    let mut word = original;
    for &(at, x) in &errors {
        word[at] ^= x;
    }
    if mode & 2 != 0 {
        for (i, &at) in erasures.iter().enumerate() {
            if at < NN {
                word[at] ^= i as u8 | 0x80;
            }
        }
    }
    let received = word;
    let result = rs.decode(&mut word, &erasures);
    match result {
        Some(n) => {
            assert!(is_codeword(&rs, &word), "roots {roots}: decode returned a non-codeword");
            let changed = word.iter().zip(&received).filter(|(a, b)| a != b).count();
            assert!(changed <= n, "roots {roots}: {changed} symbols changed, {n} reported");
            assert!(n <= rs.roots(), "roots {roots}: {n} symbols corrected");
        }
        None => assert_eq!(word, received, "roots {roots}: a refused word was changed"),
    }
    if raw || erasures.iter().any(|&p| p >= NN) {
        return;
    }
    // Within the bound the original must come back (duplicates name one erasure).
    let erased: BTreeSet<usize> = erasures.iter().copied().collect();
    let wrong = (0..NN)
        .filter(|&i| received[i] != original[i] && !erased.contains(&i))
        .count();
    if 2 * wrong + erased.len() <= rs.roots() {
        assert_eq!(
            result.map(|_| word),
            Some(original),
            "roots {roots}: {wrong} errors + {} erasures not corrected",
            erased.len()
        );
    }
}

/// A small FEC area built over random blocks, damaged, then asked for one block through
/// [`Corrector::decode_pass`]. `mode` bit 0: the FEC device is cut short; bit 1: the FEC offset is
/// near the end of the address space; bit 2: a parity byte is damaged; bit 3: the target is
/// any u64 rather than a covered block; bit 4: no block covered at all; bit 5: no erasures.
fn corrector_case(roots: u8, mode: u8, input: &mut Bytes) {
    let bs = 1 + u32::from(input.u8() % 16);
    let blocks = if mode & 16 != 0 {
        0
    } else {
        1 + u64::from(input.u16() % 1200)
    };
    let data_blocks = blocks * u64::from(input.u8()) / 255;
    let hash_start = u64::from(input.u8() % 4) * u64::from(bs);
    let seed = input.u64();
    let target = if mode & 8 != 0 {
        input.u64()
    } else {
        input.u64() % blocks.max(1)
    };
    let bad: Vec<u64> = (0..input.u8() % 32)
        .map(|_| match input.u16() {
            v @ 0xff00.. => u64::MAX - u64::from(v & 0xff),
            v => u64::from(v) % (blocks + 3),
        })
        .collect();
    let damage: Vec<(u64, u32, u8)> = (0..input.u8() % 32)
        .map(|_| {
            (
                u64::from(input.u16()) % blocks.max(1),
                u32::from(input.u8()) % bs,
                input.u8().max(1),
            )
        })
        .collect();
    let parity_hit = (usize::from(input.u16()), input.u8().max(1));

    let Ok(g) = FecGeometry::new(roots, bs, blocks) else {
        panic!("roots {roots} refused");
    };
    let bsz = u64::from(bs);
    let mut covered = noise(seed, (blocks * bsz) as usize);
    let original = covered.clone();
    // The covered area as a data file and a hash file with a superblock's worth in front.
    let split = (data_blocks * bsz) as usize;
    let build = |bytes: &[u8]| {
        let data = MemoryDevice::from_vec("data", bytes[..split].to_vec());
        let mut h = vec![0u8; hash_start as usize];
        h.extend_from_slice(&bytes[split..]);
        (data, MemoryDevice::from_vec("hash", h))
    };
    let hash_len = (blocks - data_blocks) * bsz;
    let parity_len = g.parity_bytes() as usize;
    let (data, hash) = build(&covered);
    let fec_clean = MemoryDevice::new("fec", parity_len);
    encode(&inputs(&data, &hash, split as u64, hash_start, hash_len), &g, &fec_clean, 0, 1).expect("encoding into memory");

    for &(b, at, x) in damage.iter().filter(|_| blocks > 0) {
        covered[(b * bsz) as usize + at as usize] ^= x;
    }
    let mut parity = fec_clean.contents();
    let parity_damaged = mode & 4 != 0 && !parity.is_empty();
    if parity_damaged {
        let n = parity.len();
        parity[parity_hit.0 % n] ^= parity_hit.1;
    }
    let offset = if mode & 2 != 0 { u64::MAX - 511 } else { 512 };
    let fec = if mode & 2 != 0 {
        MemoryDevice::from_vec("fec", parity)
    } else {
        let mut v = vec![0u8; 512];
        v.extend_from_slice(&parity);
        if mode & 1 != 0 {
            v.truncate(v.len() - v.len().min(1 + bs as usize));
        }
        MemoryDevice::from_vec("fec", v)
    };
    let sane = mode & 3 == 0;
    let (data, hash) = build(&covered);
    let corrector = Corrector::new(g, inputs(&data, &hash, split as u64, hash_start, hash_len), &fec, offset).expect("roots");
    // The blocks the caller calls bad (the kernel: data blocks whose digest fails); bit 5 of
    // the mode: the errors-only pass.
    let bad_set: BTreeSet<u64> = bad.iter().copied().collect();
    let is_bad = |index: u64, _: &[u8]| bad_set.contains(&index);
    let with_erasures = mode & 32 == 0;
    let result = corrector.decode_pass(target, with_erasures.then_some(&is_bad as IsBad<'_>));
    if !sane || target >= blocks {
        if target >= blocks {
            assert!(
                !matches!(result, Ok(Some(_))),
                "block {target} of {blocks} corrected"
            );
        }
        return;
    }
    let rounds = g.rounds;
    let round = target % rounds;
    let in_round = |b: u64| b < blocks && b % rounds == round;
    let damaged: BTreeSet<u64> = damage
        .iter()
        .filter(|&&(b, _, _)| {
            let at = (b * bsz) as usize;
            in_round(b) && covered[at..at + bs as usize] != original[at..at + bs as usize]
        })
        .map(|&(b, _, _)| b)
        .collect();
    // Only data blocks are erasures (the kernel never checks tree blocks).
    let erased: BTreeSet<u64> = bad_set
        .iter()
        .copied()
        .filter(|&b| with_erasures && in_round(b) && b < data_blocks)
        .collect();
    let wrong = damaged.difference(&erased).count();
    let result = result.expect("a sane FEC device reads");
    if !parity_damaged && 2 * wrong + erased.len() <= usize::from(roots) {
        let at = (target * bsz) as usize;
        assert_eq!(
            result.map(|(b, _)| b),
            Some(original[at..at + bs as usize].to_vec()),
            "roots {roots}: block {target} with {wrong} errors + {} erasures in its round",
            erased.len()
        );
    }
}

/// The covered area: `split` bytes of `data`, then `hash_len` bytes of `hash` from
/// `hash_start`.
fn inputs<'a>(
    data: &'a MemoryDevice,
    hash: &'a MemoryDevice,
    split: u64,
    hash_start: u64,
    hash_len: u64,
) -> Vec<FecInput<'a>> {
    vec![
        FecInput { device: data, start: 0, len: split },
        FecInput { device: hash, start: hash_start, len: hash_len },
    ]
}

/// `len` bytes of SHA-256 in counter mode from `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut out = Vec::with_capacity(len + 32);
    let mut counter = 0u64;
    while out.len() < len {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(counter.to_le_bytes());
        out.extend_from_slice(&h.finalize());
        counter += 1;
    }
    out.truncate(len);
    out
}
