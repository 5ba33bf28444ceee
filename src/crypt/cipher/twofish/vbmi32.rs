//! Thirty-two Twofish blocks at a time (two groups of sixteen, one block per 32-bit lane), for
//! CPUs with AVX-512 VBMI and GFNI. The four g inputs of a half round (two per group) are
//! regrouped into four byte planes, one per S-box, so each keyed S-box is looked up once
//! over 64 bytes (two `vpermi2b` and a blend) instead of once per register with masks; the
//! MDS matrix runs on the planes (GF(2) bit matrices by `gf2p8affineqb`), and the planes go
//! back to words for the additions.

use super::super::lanes512::{load16, load16_xor, next_tweaks16, store16, store16_xor, tweaks16};
use super::vbmi::{MUL_5B, MUL_EF};
use super::Schedule;
use std::arch::x86_64::*;

type V = __m512i;

/// `vpermb` indices taking byte `4l + j` (byte j of word l) to byte `16j + l`, and back.
const fn regroup(back: bool) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut j = 0;
    while j < 4 {
        let mut l = 0;
        while l < 16 {
            if back {
                out[4 * l + j] = (16 * j + l) as u8;
            } else {
                out[16 * j + l] = (4 * l + j) as u8;
            }
            l += 1;
        }
        j += 1;
    }
    out
}
const TO_PLANES: [u8; 64] = regroup(false);
const FROM_PLANES: [u8; 64] = regroup(true);

struct Tables {
    s: [[V; 4]; 4],
    to: V,
    from: V,
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
        to: load(&TO_PLANES),
        from: load(&FROM_PLANES),
    }
}

/// A 4x4 transpose of the registers' 128-bit lanes (its own inverse).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_lanes(a: [V; 4]) -> [V; 4] {
    let t0 = _mm512_shuffle_i64x2::<0b01_00_01_00>(a[0], a[1]);
    let t1 = _mm512_shuffle_i64x2::<0b11_10_11_10>(a[0], a[1]);
    let t2 = _mm512_shuffle_i64x2::<0b01_00_01_00>(a[2], a[3]);
    let t3 = _mm512_shuffle_i64x2::<0b11_10_11_10>(a[2], a[3]);
    [
        _mm512_shuffle_i64x2::<0b10_00_10_00>(t0, t2),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(t0, t2),
        _mm512_shuffle_i64x2::<0b10_00_10_00>(t1, t3),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(t1, t3),
    ]
}

/// g of four registers of words.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn g4(t: &Tables, x: [V; 4]) -> [V; 4] {
    let grouped = [
        _mm512_permutexvar_epi8(t.to, x[0]),
        _mm512_permutexvar_epi8(t.to, x[1]),
        _mm512_permutexvar_epi8(t.to, x[2]),
        _mm512_permutexvar_epi8(t.to, x[3]),
    ];
    // Plane j: byte j of all 64 words.
    let p = transpose_lanes(grouped);
    let sbox = |j: usize| {
        let s = &t.s[j];
        _mm512_mask_blend_epi8(
            _mm512_movepi8_mask(p[j]),
            _mm512_permutex2var_epi8(s[0], p[j], s[1]),
            _mm512_permutex2var_epi8(s[2], p[j], s[3]),
        )
    };
    let y = [sbox(0), sbox(1), sbox(2), sbox(3)];
    let b5 = |v: V| _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(MUL_5B));
    let ef = |v: V| _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(MUL_EF));
    let xor = _mm512_xor_si512;
    let xor3 = _mm512_ternarylogic_epi32::<0x96>;
    // The MDS matrix, output byte by output byte (see `vbmi`).
    let o = [
        xor3(y[0], ef(y[1]), b5(xor(y[2], y[3]))),
        xor3(b5(y[0]), ef(xor(y[1], y[2])), y[3]),
        xor3(ef(xor(y[0], y[3])), b5(y[1]), y[2]),
        xor3(ef(xor(y[0], y[2])), y[1], b5(y[3])),
    ];
    let back = transpose_lanes(o);
    [
        _mm512_permutexvar_epi8(t.from, back[0]),
        _mm512_permutexvar_epi8(t.from, back[1]),
        _mm512_permutexvar_epi8(t.from, back[2]),
        _mm512_permutexvar_epi8(t.from, back[3]),
    ]
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

/// Two groups' words (lane order) encrypted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn encrypt_words(k: &[u32; 40], t: &Tables, w: [[V; 4]; 2]) -> [[V; 4]; 2] {
    let mut p = w.map(|w| -> [V; 4] { std::array::from_fn(|i| _mm512_xor_si512(w[i], key(k[i]))) });
    for r in 0..8 {
        let k = &k[8 + 4 * r..12 + 4 * r];
        for (a, b, c, d, k0, k1) in [(0, 1, 2, 3, k[0], k[1]), (2, 3, 0, 1, k[2], k[3])] {
            let g = g4(
                t,
                [
                    p[0][a],
                    p[1][a],
                    _mm512_rol_epi32::<8>(p[0][b]),
                    _mm512_rol_epi32::<8>(p[1][b]),
                ],
            );
            for h in 0..2 {
                let t1 = g[2 + h];
                let t0 = add(g[h], t1);
                p[h][c] = _mm512_ror_epi32::<1>(_mm512_xor_si512(p[h][c], add(t0, key(k0))));
                p[h][d] =
                    _mm512_xor_si512(_mm512_rol_epi32::<1>(p[h][d]), add(add(t0, t1), key(k1)));
            }
        }
    }
    p.map(|p| {
        let out = [p[2], p[3], p[0], p[1]];
        std::array::from_fn(|i| _mm512_xor_si512(out[i], key(k[4 + i])))
    })
}

/// Two groups' words (lane order) decrypted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn decrypt_words(k: &[u32; 40], t: &Tables, w: [[V; 4]; 2]) -> [[V; 4]; 2] {
    let mut c = w.map(|w| {
        [
            _mm512_xor_si512(w[2], key(k[6])),
            _mm512_xor_si512(w[3], key(k[7])),
            _mm512_xor_si512(w[0], key(k[4])),
            _mm512_xor_si512(w[1], key(k[5])),
        ]
    });
    for r in (0..8).rev() {
        let k = &k[8 + 4 * r..12 + 4 * r];
        for (a, b, x, y, k0, k1) in [(2, 3, 0, 1, k[2], k[3]), (0, 1, 2, 3, k[0], k[1])] {
            let g = g4(
                t,
                [
                    c[0][a],
                    c[1][a],
                    _mm512_rol_epi32::<8>(c[0][b]),
                    _mm512_rol_epi32::<8>(c[1][b]),
                ],
            );
            for h in 0..2 {
                let t1 = g[2 + h];
                let t0 = add(g[h], t1);
                c[h][x] = _mm512_xor_si512(_mm512_rol_epi32::<1>(c[h][x]), add(t0, key(k0)));
                c[h][y] =
                    _mm512_ror_epi32::<1>(_mm512_xor_si512(c[h][y], add(add(t0, t1), key(k1))));
            }
        }
    }
    c.map(|c| std::array::from_fn(|i| _mm512_xor_si512(c[i], key(k[i]))))
}

/// The two halves of a 32-block group.
fn halves(b: &mut [[u8; 16]; 32]) -> (&mut [[u8; 16]; 16], &mut [[u8; 16]; 16]) {
    let (lo, hi) = b.split_at_mut(16);
    (
        lo.try_into().expect("16 blocks"),
        hi.try_into().expect("16 blocks"),
    )
}

/// Encrypt thirty-two blocks in place.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
pub(super) fn encrypt(s: &Schedule, b: &mut [[u8; 16]; 32]) {
    let (lo, hi) = halves(b);
    let x = encrypt_words(&s.k, &tables(s), [load16(lo), load16(hi)]);
    store16(x[0], lo);
    store16(x[1], hi);
}

/// Decrypt thirty-two blocks in place.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
pub(super) fn decrypt(s: &Schedule, b: &mut [[u8; 16]; 32]) {
    let (lo, hi) = halves(b);
    let x = decrypt_words(&s.k, &tables(s), [load16(lo), load16(hi)]);
    store16(x[0], lo);
    store16(x[1], hi);
}

/// XTS over the whole 32-block groups of `blocks`, the first tweak `first`. Returns the
/// blocks done.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni,vpclmulqdq")]
pub(super) fn xts<const DEC: bool>(s: &Schedule, blocks: &mut [[u8; 16]], first: u128) -> usize {
    let t = &tables(s);
    let (groups, _) = blocks.as_chunks_mut::<32>();
    let mut tw = tweaks16(first);
    for b in groups.iter_mut() {
        let (lo, hi) = halves(b);
        let tw2 = next_tweaks16(&tw);
        let w = [load16_xor(lo, &tw), load16_xor(hi, &tw2)];
        let x = if DEC {
            decrypt_words(&s.k, t, w)
        } else {
            encrypt_words(&s.k, t, w)
        };
        store16_xor(x[0], &tw, lo);
        store16_xor(x[1], &tw2, hi);
        tw = next_tweaks16(&tw2);
    }
    groups.len() * 32
}
