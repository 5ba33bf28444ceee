//! Twofish (Schneier et al., 1998) with "full keying": the key-dependent S-boxes and the MDS
//! matrix are folded into four 256-entry tables when the key is set, so the g function is
//! four lookups and three XORs, as in the kernel's `twofish_generic` and the reference
//! implementation's fastest option. (RustCrypto's `twofish` recomputes the S-boxes for every
//! byte and runs at a few MB/s: too slow for a disk.)
//!
//! Sixteen or thirty-two blocks run side by side on AVX-512: with VBMI and GFNI ([`vbmi32`],
//! [`vbmi`]: the keyed S-boxes as byte permutations, the MDS matrix as GF(2) bit matrices), or
//! with gathers from the tables ([`avx512`]). Gathers are fast on Intel and slow on AMD Zen, so where both run the
//! faster is timed once per process ([`Backend::best`]). In XTS the wide paths also keep the
//! tweaks in registers (`xts_prefix`).
//!
//! Like every table-driven Twofish, lookups depend on secret data. The tables live in secret
//! memory with the rest of the key schedule.

mod avx512;
mod rounds16;
mod vbmi;
mod vbmi32;

use super::block::BlockCipher;
use crate::crypt::secret::SecretBox;

/// The nibble permutations t0..t3 of q0 and q1 (the specification's section 4.3.5).
const QBOX: [[[u8; 16]; 4]; 2] = [
    [
        [8, 1, 7, 13, 6, 15, 3, 2, 0, 11, 5, 9, 14, 12, 10, 4],
        [14, 12, 11, 8, 1, 2, 3, 5, 15, 4, 10, 6, 7, 0, 9, 13],
        [11, 10, 5, 14, 6, 13, 9, 0, 12, 8, 15, 3, 2, 4, 7, 1],
        [13, 7, 15, 4, 1, 2, 6, 14, 9, 11, 3, 0, 8, 5, 12, 10],
    ],
    [
        [2, 8, 11, 13, 15, 7, 6, 14, 3, 1, 9, 4, 0, 10, 12, 5],
        [1, 14, 2, 11, 4, 12, 3, 7, 6, 13, 10, 5, 15, 9, 0, 8],
        [4, 12, 7, 5, 1, 6, 9, 10, 0, 14, 13, 8, 2, 11, 3, 15],
        [11, 9, 5, 1, 12, 3, 13, 14, 6, 4, 7, 15, 2, 0, 8, 10],
    ],
];

/// The Reed-Solomon matrix that makes the S-box key words (section 4.3).
const RS: [[u8; 8]; 4] = [
    [0x01, 0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e],
    [0xa4, 0x56, 0x82, 0xf3, 0x1e, 0xc6, 0x68, 0xe5],
    [0x02, 0xa1, 0xfc, 0xc1, 0x47, 0xae, 0x3d, 0x19],
    [0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e, 0x03],
];

/// Low bytes of the field polynomials: MDS x^8+x^6+x^5+x^3+1, RS x^8+x^6+x^3+x^2+1.
const MDS_POLY: u8 = 0x69;
const RS_POLY: u8 = 0x4d;

/// Which q permutation each byte position goes through at each stage of h, outermost
/// (k = 4 keys) first: `Q_ORDER[byte][stage]`.
const Q_ORDER: [[usize; 5]; 4] = [
    [1, 1, 0, 0, 1],
    [0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1],
    [1, 0, 1, 1, 0],
];

const fn gf_mul(mut a: u8, mut b: u8, poly: u8) -> u8 {
    let mut r = 0;
    let mut i = 0;
    while i < 8 {
        r ^= b & 0u8.wrapping_sub(a & 1);
        a >>= 1;
        b = (b << 1) ^ (poly & 0u8.wrapping_sub(b >> 7));
        i += 1;
    }
    r
}

/// q0 (`i` = 0) or q1 (`i` = 1), from its nibble permutations (section 4.3.5).
fn q(i: usize, x: u8) -> u8 {
    let t = &QBOX[i];
    let ror4 = |v: u8| ((v >> 1) | (v << 3)) & 15;
    let (a0, b0) = (x >> 4, x & 15);
    let (a1, b1) = (a0 ^ b0, (a0 ^ ror4(b0) ^ (a0 << 3)) & 15);
    let (a2, b2) = (t[0][a1 as usize], t[1][b1 as usize]);
    let (a3, b3) = (a2 ^ b2, (a2 ^ ror4(b2) ^ (a2 << 3)) & 15);
    (t[3][b3 as usize] << 4) | t[2][a3 as usize]
}

/// Column `col` of the MDS matrix times `x`, as a little-endian word.
fn mds_column(x: u8, col: usize) -> u32 {
    let x5b = gf_mul(x, 0x5b, MDS_POLY);
    let xef = gf_mul(x, 0xef, MDS_POLY);
    u32::from_le_bytes(match col {
        0 => [x, x5b, xef, xef],
        1 => [xef, xef, x5b, x],
        2 => [x5b, xef, x, xef],
        _ => [x5b, x, xef, x5b],
    })
}

/// Byte `b` of the function h before the MDS matrix: `x` through the q stages keyed by the
/// words `l` (`l[0]` innermost, `l[k-1]` outermost and applied first).
fn keyed_q(b: usize, x: u8, l: &[[u8; 4]]) -> u8 {
    let k = l.len();
    let mut v = x;
    for (stage, word) in (4 - k..4).zip(l.iter().rev()) {
        v = q(Q_ORDER[b][stage], v) ^ word[b];
    }
    q(Q_ORDER[b][4], v)
}

/// The function h (section 4.3.2).
fn h(x: u32, l: &[[u8; 4]]) -> u32 {
    let y = x.to_le_bytes();
    (0..4).fold(0, |acc, b| acc ^ mds_column(keyed_q(b, y[b], l), b))
}

/// A Twofish key schedule: 40 round subkeys, the four keyed S-box/MDS tables, and the four
/// keyed S-boxes alone (the MDS matrix left to the caller: the VBMI path).
struct Schedule {
    k: [u32; 40],
    t: [[u32; 256]; 4],
    s: [[u8; 256]; 4],
}

// SAFETY: integers only.
unsafe impl crate::crypt::secret::Zeroable for Schedule {}

/// Which code runs the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Sixteen blocks per pass, the S-boxes by `vpermi2b` and the MDS matrix by GFNI
    /// (AVX-512 VBMI and GFNI): no gathers.
    Vbmi,
    /// Sixteen blocks per pass, the keyed tables by `vpgatherdd` (AVX-512F).
    Gather,
    /// One block at a time, scalar table lookups.
    Portable,
}

impl Backend {
    /// Whether this CPU runs `self`.
    pub(crate) fn available(self) -> bool {
        match self {
            Backend::Vbmi => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vbmi")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            Backend::Gather => std::arch::is_x86_feature_detected!("avx512f"),
            Backend::Portable => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Vbmi => "twofish-avx512-vbmi",
            Backend::Gather => "twofish-avx512",
            Backend::Portable => "portable",
        }
    }

    /// The fastest backend on this CPU. Where both wide paths run, which one wins depends
    /// on the core (gathers are cheap on Intel and slow on AMD Zen), so both are timed once
    /// per process on a throwaway key and the faster kept.
    pub(crate) fn best() -> Backend {
        static BEST: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let wide: Vec<Backend> = [Backend::Vbmi, Backend::Gather]
                .into_iter()
                .filter(|b| b.available())
                .collect();
            match wide.as_slice() {
                [] => Backend::Portable,
                [only] => *only,
                _ => fastest(&wide),
            }
        })
    }
}

/// The backend of `candidates` that encrypts 16 KiB fastest (best of five interleaved runs
/// each, so a burst of load elsewhere does not decide).
fn fastest(candidates: &[Backend]) -> Backend {
    let ciphers: Vec<Twofish> = candidates
        .iter()
        .filter_map(|&b| Twofish::with_backend(&[0x5a; 32], b))
        .collect();
    let mut best = vec![std::time::Duration::MAX; ciphers.len()];
    let mut blocks = vec![[0xa5u8; 16]; 1024];
    for _ in 0..5 {
        for (c, best) in ciphers.iter().zip(best.iter_mut()) {
            let start = std::time::Instant::now();
            c.encrypt_blocks(std::hint::black_box(&mut blocks));
            *best = (*best).min(start.elapsed());
        }
    }
    let winner = (0..ciphers.len()).min_by_key(|&i| best[i]);
    winner.map_or(Backend::Portable, |i| ciphers[i].backend)
}

/// Twofish keyed with a 128-, 192- or 256-bit key.
pub(crate) struct Twofish {
    schedule: SecretBox<Schedule>,
    backend: Backend,
    /// Whether XTS runs fused over sixteen blocks (a wide backend on a CPU with AVX-512BW
    /// and VPCLMULQDQ for the tweaks).
    xts_wide: bool,
}

impl Twofish {
    /// `None` unless the key has 16, 24 or 32 bytes.
    pub(crate) fn new(key: &[u8]) -> Option<Twofish> {
        Twofish::with_backend(key, Backend::best())
    }

    /// Twofish on `backend` (tests, calibration); `None` when the CPU lacks it or the key
    /// length is wrong.
    pub(crate) fn with_backend(key: &[u8], backend: Backend) -> Option<Twofish> {
        if !matches!(key.len(), 16 | 24 | 32) || !backend.available() {
            return None;
        }
        let k = key.len() / 8;
        let word = |i: usize| -> [u8; 4] { key[4 * i..4 * i + 4].try_into().expect("4 bytes") };
        let even: Vec<[u8; 4]> = (0..k).map(|i| word(2 * i)).collect();
        let odd: Vec<[u8; 4]> = (0..k).map(|i| word(2 * i + 1)).collect();
        // The S-box key words S_i = RS · (key bytes 8i..8i+8).
        let mut s = vec![[0u8; 4]; k];
        for (i, si) in s.iter_mut().enumerate() {
            for (r, row) in RS.iter().enumerate() {
                si[r] = (0..8).fold(0, |acc, j| acc ^ gf_mul(key[8 * i + j], row[j], RS_POLY));
            }
        }
        let mut sched = SecretBox::<Schedule>::zeroed();
        const RHO: u32 = 0x0101_0101;
        for i in 0..20u32 {
            let a = h(2 * i * RHO, &even);
            let b = h((2 * i + 1) * RHO, &odd).rotate_left(8);
            sched.k[2 * i as usize] = a.wrapping_add(b);
            sched.k[2 * i as usize + 1] = a.wrapping_add(b).wrapping_add(b).rotate_left(9);
        }
        // Full keying: g(X) = h(X, S) = T0[x0] ^ T1[x1] ^ T2[x2] ^ T3[x3], with the S-box key
        // words in reverse order (S_(k-1) innermost).
        let rev: Vec<[u8; 4]> = s.iter().rev().copied().collect();
        for b in 0..4 {
            for x in 0..256 {
                sched.s[b][x] = keyed_q(b, x as u8, &rev);
                sched.t[b][x] = mds_column(sched.s[b][x], b);
            }
        }
        let mut rev = rev;
        zeroize::Zeroize::zeroize(&mut rev);
        zeroize::Zeroize::zeroize(&mut s);
        Some(Twofish {
            schedule: sched,
            backend,
            xts_wide: backend != Backend::Portable && super::lanes512::xts_available(),
        })
    }

    fn run(&self, blocks: &mut [[u8; 16]], decrypt: bool) {
        let s = &*self.schedule;
        let (thirty_twos, rest) = match self.backend {
            Backend::Vbmi => blocks.as_chunks_mut::<32>(),
            _ => (&mut [][..], blocks),
        };
        for b in thirty_twos {
            // SAFETY: the VBMI backend is kept only when the CPU has its features (checked
            // by `with_backend`).
            unsafe {
                if decrypt {
                    vbmi32::decrypt(s, b)
                } else {
                    vbmi32::encrypt(s, b)
                }
            }
        }
        let (sixteens, rest) = match self.backend {
            Backend::Portable => (&mut [][..], rest),
            _ => rest.as_chunks_mut::<16>(),
        };
        for b in sixteens {
            // SAFETY: a wide backend is kept only when the CPU has its features (checked by
            // `with_backend`).
            unsafe {
                match (self.backend, decrypt) {
                    (Backend::Vbmi, false) => vbmi::encrypt(s, b),
                    (Backend::Vbmi, true) => vbmi::decrypt(s, b),
                    (_, false) => avx512::encrypt(s, b),
                    (_, true) => avx512::decrypt(s, b),
                }
            }
        }
        for b in rest {
            if decrypt {
                self.decrypt(b)
            } else {
                self.encrypt(b)
            }
        }
    }

    #[inline(always)]
    fn g(&self, x: u32) -> u32 {
        let t = &self.schedule.t;
        t[0][(x & 0xff) as usize]
            ^ t[1][((x >> 8) & 0xff) as usize]
            ^ t[2][((x >> 16) & 0xff) as usize]
            ^ t[3][(x >> 24) as usize]
    }

    fn encrypt(&self, block: &mut [u8; 16]) {
        let k = &self.schedule.k;
        let w = |i: usize| u32::from_le_bytes(block[4 * i..4 * i + 4].try_into().expect("4"));
        let mut p = [w(0) ^ k[0], w(1) ^ k[1], w(2) ^ k[2], w(3) ^ k[3]];
        for r in 0..8 {
            let k = &k[8 + 4 * r..12 + 4 * r];
            let t1 = self.g(p[1].rotate_left(8));
            let t0 = self.g(p[0]).wrapping_add(t1);
            p[2] = (p[2] ^ t0.wrapping_add(k[0])).rotate_right(1);
            p[3] = p[3].rotate_left(1) ^ t0.wrapping_add(t1).wrapping_add(k[1]);
            let t1 = self.g(p[3].rotate_left(8));
            let t0 = self.g(p[2]).wrapping_add(t1);
            p[0] = (p[0] ^ t0.wrapping_add(k[2])).rotate_right(1);
            p[1] = p[1].rotate_left(1) ^ t0.wrapping_add(t1).wrapping_add(k[3]);
        }
        let out = [p[2] ^ k[4], p[3] ^ k[5], p[0] ^ k[6], p[1] ^ k[7]];
        for (i, v) in out.iter().enumerate() {
            block[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
    }

    fn decrypt(&self, block: &mut [u8; 16]) {
        let k = &self.schedule.k;
        let w = |i: usize| u32::from_le_bytes(block[4 * i..4 * i + 4].try_into().expect("4"));
        let mut c = [w(2) ^ k[6], w(3) ^ k[7], w(0) ^ k[4], w(1) ^ k[5]];
        for r in (0..8).rev() {
            let k = &k[8 + 4 * r..12 + 4 * r];
            let t1 = self.g(c[3].rotate_left(8));
            let t0 = self.g(c[2]).wrapping_add(t1);
            c[0] = c[0].rotate_left(1) ^ t0.wrapping_add(k[2]);
            c[1] = (c[1] ^ t0.wrapping_add(t1).wrapping_add(k[3])).rotate_right(1);
            let t1 = self.g(c[1].rotate_left(8));
            let t0 = self.g(c[0]).wrapping_add(t1);
            c[2] = c[2].rotate_left(1) ^ t0.wrapping_add(k[0]);
            c[3] = (c[3] ^ t0.wrapping_add(t1).wrapping_add(k[1])).rotate_right(1);
        }
        let out = [c[0] ^ k[0], c[1] ^ k[1], c[2] ^ k[2], c[3] ^ k[3]];
        for (i, v) in out.iter().enumerate() {
            block[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

impl BlockCipher for Twofish {
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.run(blocks, false)
    }
    fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.run(blocks, true)
    }
    fn xts_prefix(&self, blocks: &mut [[u8; 16]], t: u128, decrypt: bool) -> usize {
        if !self.xts_wide {
            return 0;
        }
        let s = &*self.schedule;
        // SAFETY: `xts_wide` only with a wide backend the CPU runs and AVX-512BW and
        // VPCLMULQDQ (checked by `with_backend`).
        unsafe {
            match (self.backend, decrypt) {
                (Backend::Vbmi, _) => {
                    let done = if decrypt {
                        vbmi32::xts::<true>(s, blocks, t)
                    } else {
                        vbmi32::xts::<false>(s, blocks, t)
                    };
                    // A last group of sixteen (runs of 16..31 blocks more: not in whole
                    // sectors, whose sizes are multiples of 512 bytes).
                    let rest = &mut blocks[done..];
                    if rest.len() < 16 {
                        return done;
                    }
                    let t = (0..done).fold(t, |t, _| super::xts::mul_x(t));
                    done + if decrypt {
                        vbmi::xts::<true>(s, rest, t)
                    } else {
                        vbmi::xts::<false>(s, rest, t)
                    }
                }
                (_, false) => avx512::xts::<false>(s, blocks, t),
                (_, true) => avx512::xts::<true>(s, blocks, t),
            }
        }
    }
    fn implementation(&self) -> &'static str {
        self.backend.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Twofish paper's iterated known-answer test (ECB_TBL.TXT): starting from zero key
    /// and plaintext, each step's key is the previous two ciphertexts and its plaintext the
    /// previous ciphertext; the 49th ciphertext is printed in the paper for each key size.
    #[test]
    fn paper_iterated_test_49_steps() {
        for (len, want) in [
            (16, "5d9d4eeffa9151575524f115815a12e0"),
            (24, "e75449212beef9f4a390bd860a640941"),
            (32, "37fe26ff1cf66175f5ddf4c33b97a205"),
        ] {
            let mut key = vec![0u8; len];
            let mut pt = [0u8; 16];
            let mut ct = [0u8; 16];
            for _ in 0..49 {
                let c = Twofish::new(&key).unwrap();
                ct = pt;
                c.encrypt(&mut ct);
                let mut back = ct;
                c.decrypt(&mut back);
                assert_eq!(back, pt);
                // Shift: key <- (previous plaintext || key) truncated, plaintext <- ct.
                let mut next = pt.to_vec();
                next.extend_from_slice(&key);
                next.truncate(len);
                key = next;
                pt = ct;
            }
            assert_eq!(hex::encode(ct), want, "{}-bit key", len * 8);
        }
    }

    #[test]
    fn agrees_with_rustcryptos_twofish() {
        use cipher::{Array, BlockCipherEncrypt, KeyInit};
        for len in [16usize, 24, 32] {
            for seed in 0..20u8 {
                let key: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37) ^ seed).collect();
                let ours = Twofish::new(&key).unwrap();
                let theirs = twofish::Twofish::new_from_slice(&key).unwrap();
                let mut b = [seed.wrapping_mul(11); 16];
                let mut t = Array::from(b);
                ours.encrypt(&mut b);
                theirs.encrypt_block(&mut t);
                assert_eq!(b, <[u8; 16]>::from(t), "{len} {seed}");
            }
        }
    }

    /// Every wide backend this CPU runs gives the one-block code's ciphertext on random keys
    /// of every length and random block counts, and decrypts back; the chosen backend is one
    /// of them.
    #[test]
    fn wide_paths_agree_with_one_block_code() {
        let mut x = 0x7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        assert!(Backend::best().available());
        for round in 0..60 {
            let len = [16, 24, 32][round % 3];
            let key: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let narrow = Twofish::with_backend(&key, Backend::Portable).unwrap();
            let n = (next() % 70) as usize + 1;
            let plain: Vec<[u8; 16]> = (0..n)
                .map(|_| std::array::from_fn(|_| next() as u8))
                .collect();
            let mut want = plain.clone();
            narrow.encrypt_blocks(&mut want);
            for backend in [Backend::Vbmi, Backend::Gather] {
                let Some(wide) = Twofish::with_backend(&key, backend) else {
                    continue;
                };
                let mut a = plain.clone();
                wide.encrypt_blocks(&mut a);
                assert_eq!(a, want, "{backend:?} key {len} bytes, {n} blocks");
                wide.decrypt_blocks(&mut a);
                assert_eq!(a, plain, "{backend:?} decrypt");
            }
        }
    }

    /// The VBMI path's MDS multiply matrices agree with the field multiplication.
    #[test]
    fn gfni_matrices_multiply_in_the_mds_field() {
        for (c, m) in [(0x5b, vbmi::MUL_5B), (0xef, vbmi::MUL_EF)] {
            for y in 0..=255u8 {
                let rows = (m as u64).to_le_bytes();
                let got = (0..8).fold(0u8, |acc, i| {
                    acc | (((rows[7 - i] & y).count_ones() & 1) as u8) << i
                });
                assert_eq!(got, gf_mul(c, y, MDS_POLY), "{c:#x} * {y:#x}");
            }
        }
    }
}
