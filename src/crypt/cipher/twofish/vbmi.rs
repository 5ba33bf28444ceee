//! Sixteen Twofish blocks at a time in AVX-512 registers without gathers (AMD Zen runs
//! `vpgatherdd` at a fraction of Intel's rate). The g function is split where the cipher
//! splits it: the four keyed 8-bit S-boxes (`Schedule::s`, 256 bytes each) are byte lookups,
//! `vpermi2b` over 128-byte halves held in registers, and the MDS matrix, linear over GF(2),
//! is byte shuffles plus two `gf2p8affineqb` (multiplication by 0x5b and by 0xef modulo the
//! MDS polynomial, as 8x8 bit matrices). The rounds are the gather path's.

use super::super::lanes512::{load16, load16_xor, next_tweaks16, store16, store16_xor, tweaks16};
use super::{gf_mul, Schedule, MDS_POLY};
use std::arch::x86_64::*;

type V = __m512i;

/// The bit matrix of y -> c·y modulo the MDS polynomial in `gf2p8affineqb`'s layout: byte
/// 7 - i of the word is the row making output bit i, its bit j the coefficient of input bit j.
const fn mul_matrix(c: u8) -> i64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 8 {
            if (gf_mul(c, 1 << j, MDS_POLY) >> i) & 1 == 1 {
                m |= 1 << (8 * (7 - i) + j);
            }
            j += 1;
        }
        i += 1;
    }
    m as i64
}

pub(super) const MUL_5B: i64 = mul_matrix(0x5b);
pub(super) const MUL_EF: i64 = mul_matrix(0xef);

/// A `vpshufb` control moving byte `p[i]` of each 32-bit word to byte `i` (0x80: zero).
const fn word_shuffle(p: [u8; 4]) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let src = p[i % 4];
        out[i] = if src >= 4 {
            0x80
        } else {
            ((i % 16) - (i % 4)) as u8 + src
        };
        i += 1;
    }
    out
}

const Z: u8 = 0x80;
/// Output byte i of the MDS product gets y[j] times 1, 0x5b or 0xef (the specification's
/// matrix, rows 0..3):
///   out0 = y0 ^ ef·y1 ^ 5b·y2 ^ 5b·y3,  out1 = 5b·y0 ^ ef·y1 ^ ef·y2 ^ y3,
///   out2 = ef·y0 ^ 5b·y1 ^ y2 ^ ef·y3,  out3 = ef·y0 ^ y1 ^ ef·y2 ^ 5b·y3.
const ONE: [u8; 64] = word_shuffle([0, 3, 2, 1]);
const B5_A: [u8; 64] = word_shuffle([2, 0, 1, 3]);
const B5_B: [u8; 64] = word_shuffle([3, Z, Z, Z]);
const EF_A: [u8; 64] = word_shuffle([1, 1, 0, 0]);
const EF_B: [u8; 64] = word_shuffle([Z, 2, 3, 2]);

/// The constants of one batch, loaded once.
struct Tables {
    /// S-box b's 256 bytes as four 64-byte registers.
    s: [[V; 4]; 4],
    one: V,
    b5: [V; 2],
    ef: [V; 2],
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load(bytes: &[u8]) -> V {
    assert!(bytes.len() >= 64);
    // SAFETY: 64 bytes inside `bytes` (checked above); unaligned load.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn tables(s: &Schedule) -> Tables {
    Tables {
        s: std::array::from_fn(|b| std::array::from_fn(|h| load(&s.s[b][64 * h..]))),
        one: load(&ONE),
        b5: [load(&B5_A), load(&B5_B)],
        ef: [load(&EF_A), load(&EF_B)],
    }
}

/// Byte positions 0, 1, 2, 3 of every 32-bit word, as byte masks.
const POS: [u64; 4] = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x4444_4444_4444_4444,
    0x8888_8888_8888_8888,
];

/// g(x) in every lane: byte b of each word through S-box b, then the MDS matrix.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn g(t: &Tables, x: V) -> V {
    // Bytes with the top bit set index the upper 128 bytes of the S-box.
    let high = _mm512_movepi8_mask(x);
    let lo = !high;
    // Each lookup zeroes the bytes of the other positions and halves: XOR merges them.
    let y: [V; 8] = std::array::from_fn(|i| {
        let (b, h) = (i / 2, i % 2);
        let m = POS[b] & if h == 0 { lo } else { high };
        _mm512_maskz_permutex2var_epi8(m, t.s[b][2 * h], x, t.s[b][2 * h + 1])
    });
    let y = _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ternarylogic_epi32::<0x96>(y[0], y[1], y[2]),
        _mm512_ternarylogic_epi32::<0x96>(y[3], y[4], y[5]),
        _mm512_xor_si512(y[6], y[7]),
    );
    let b5 = _mm512_xor_si512(
        _mm512_shuffle_epi8(y, t.b5[0]),
        _mm512_shuffle_epi8(y, t.b5[1]),
    );
    let ef = _mm512_xor_si512(
        _mm512_shuffle_epi8(y, t.ef[0]),
        _mm512_shuffle_epi8(y, t.ef[1]),
    );
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_shuffle_epi8(y, t.one),
        _mm512_gf2p8affine_epi64_epi8::<0>(b5, _mm512_set1_epi64(MUL_5B)),
        _mm512_gf2p8affine_epi64_epi8::<0>(ef, _mm512_set1_epi64(MUL_EF)),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn add(a: V, b: V) -> V {
    _mm512_add_epi32(a, b)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn key(k: u32) -> V {
    _mm512_set1_epi32(k as i32)
}

/// The sixteen blocks' words (lane order) encrypted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn encrypt_words(k: &[u32; 40], t: &Tables, w: [V; 4]) -> [V; 4] {
    let mut p: [V; 4] = std::array::from_fn(|i| _mm512_xor_si512(w[i], key(k[i])));
    for r in 0..8 {
        let k = &k[8 + 4 * r..12 + 4 * r];
        let t1 = g(t, _mm512_rol_epi32::<8>(p[1]));
        let t0 = add(g(t, p[0]), t1);
        p[2] = _mm512_ror_epi32::<1>(_mm512_xor_si512(p[2], add(t0, key(k[0]))));
        p[3] = _mm512_xor_si512(_mm512_rol_epi32::<1>(p[3]), add(add(t0, t1), key(k[1])));
        let t1 = g(t, _mm512_rol_epi32::<8>(p[3]));
        let t0 = add(g(t, p[2]), t1);
        p[0] = _mm512_ror_epi32::<1>(_mm512_xor_si512(p[0], add(t0, key(k[2]))));
        p[1] = _mm512_xor_si512(_mm512_rol_epi32::<1>(p[1]), add(add(t0, t1), key(k[3])));
    }
    let out = [p[2], p[3], p[0], p[1]];
    std::array::from_fn(|i| _mm512_xor_si512(out[i], key(k[4 + i])))
}

/// The sixteen blocks' words (lane order) decrypted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn decrypt_words(k: &[u32; 40], t: &Tables, w: [V; 4]) -> [V; 4] {
    let mut c = [
        _mm512_xor_si512(w[2], key(k[6])),
        _mm512_xor_si512(w[3], key(k[7])),
        _mm512_xor_si512(w[0], key(k[4])),
        _mm512_xor_si512(w[1], key(k[5])),
    ];
    for r in (0..8).rev() {
        let k = &k[8 + 4 * r..12 + 4 * r];
        let t1 = g(t, _mm512_rol_epi32::<8>(c[3]));
        let t0 = add(g(t, c[2]), t1);
        c[0] = _mm512_xor_si512(_mm512_rol_epi32::<1>(c[0]), add(t0, key(k[2])));
        c[1] = _mm512_ror_epi32::<1>(_mm512_xor_si512(c[1], add(add(t0, t1), key(k[3]))));
        let t1 = g(t, _mm512_rol_epi32::<8>(c[1]));
        let t0 = add(g(t, c[0]), t1);
        c[2] = _mm512_xor_si512(_mm512_rol_epi32::<1>(c[2]), add(t0, key(k[0])));
        c[3] = _mm512_ror_epi32::<1>(_mm512_xor_si512(c[3], add(add(t0, t1), key(k[1]))));
    }
    std::array::from_fn(|i| _mm512_xor_si512(c[i], key(k[i])))
}

/// Encrypt sixteen blocks in place.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
pub(super) fn encrypt(s: &Schedule, b: &mut [[u8; 16]; 16]) {
    let t = &tables(s);
    store16(encrypt_words(&s.k, t, load16(b)), b);
}

/// Decrypt sixteen blocks in place.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
pub(super) fn decrypt(s: &Schedule, b: &mut [[u8; 16]; 16]) {
    let t = &tables(s);
    store16(decrypt_words(&s.k, t, load16(b)), b);
}

/// XTS over the whole sixteen-block groups of `blocks` (one sector's run), the first tweak
/// `t`: the tweak XORs stay in registers around the rounds. Returns the blocks done.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni,vpclmulqdq")]
pub(super) fn xts<const DEC: bool>(s: &Schedule, blocks: &mut [[u8; 16]], first: u128) -> usize {
    let t = &tables(s);
    let (groups, _) = blocks.as_chunks_mut::<16>();
    let mut tw = tweaks16(first);
    for b in groups.iter_mut() {
        let w = load16_xor(b, &tw);
        let x = if DEC {
            decrypt_words(&s.k, t, w)
        } else {
            encrypt_words(&s.k, t, w)
        };
        store16_xor(x, &tw, b);
        tw = next_tweaks16(&tw);
    }
    groups.len() * 16
}
