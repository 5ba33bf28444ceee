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

super::rounds16::rounds16!(
    features: "avx512f,avx512bw,avx512vbmi,gfni",
    xts_features: "avx512f,avx512bw,avx512vbmi,gfni,vpclmulqdq",
    tables: Tables,
    |s| tables(s)
);
