//! Eight blocks at a time in AVX2 registers (one block per 32-bit lane), S-boxes in and/or/xor
//! gates: for CPUs with AVX2 but without AVX-512.

use super::rounds::*;
use super::RoundKeys;
use std::arch::x86_64::*;

type V = __m256i;

#[inline]
#[target_feature(enable = "avx2")]
fn zero() -> V {
    _mm256_setzero_si256()
}
#[inline]
#[target_feature(enable = "avx2")]
fn not(a: V) -> V {
    _mm256_xor_si256(a, _mm256_set1_epi32(-1))
}
#[inline]
#[target_feature(enable = "avx2")]
fn and(a: V, b: V) -> V {
    _mm256_and_si256(a, b)
}
#[inline]
#[target_feature(enable = "avx2")]
fn or(a: V, b: V) -> V {
    _mm256_or_si256(a, b)
}
#[inline]
#[target_feature(enable = "avx2")]
fn xor(a: V, b: V) -> V {
    _mm256_xor_si256(a, b)
}
/// `!a & b`.
#[inline]
#[target_feature(enable = "avx2")]
fn andnot(a: V, b: V) -> V {
    _mm256_andnot_si256(a, b)
}
#[inline]
#[target_feature(enable = "avx2")]
fn splat(k: u32) -> V {
    _mm256_set1_epi32(k as i32)
}
#[inline]
#[target_feature(enable = "avx2")]
fn rotl<const L: i32, const R: i32>(a: V) -> V {
    _mm256_or_si256(_mm256_slli_epi32::<L>(a), _mm256_srli_epi32::<R>(a))
}
#[inline]
#[target_feature(enable = "avx2")]
fn shl<const L: i32>(a: V) -> V {
    _mm256_slli_epi32::<L>(a)
}

gates_tern!(#[inline] #[target_feature(enable = "avx2")]);

/// Four registers of two blocks each to bitslice order and back (a 4x4 transpose of 32-bit
/// words in each 128-bit half; it is its own inverse).
#[inline]
#[target_feature(enable = "avx2")]
fn transpose(r: [V; 4]) -> [V; 4] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

#[inline]
#[target_feature(enable = "avx2")]
fn load(b: &[[u8; 16]; 8]) -> [V; 4] {
    // SAFETY: each load reads 32 bytes inside `b` (128 bytes); unaligned loads.
    transpose(std::array::from_fn(|i| unsafe {
        _mm256_loadu_si256(b.as_ptr().add(2 * i).cast())
    }))
}

#[inline]
#[target_feature(enable = "avx2")]
fn store(x: [V; 4], b: &mut [[u8; 16]; 8]) {
    for (i, r) in transpose(x).into_iter().enumerate() {
        // SAFETY: each store writes 32 bytes inside `b` (128 bytes); unaligned stores.
        unsafe { _mm256_storeu_si256(b.as_mut_ptr().add(2 * i).cast(), r) };
    }
}

/// Encrypt eight blocks in place.
#[target_feature(enable = "avx2")]
pub(super) fn encrypt(k: &RoundKeys, b: &mut [[u8; 16]; 8]) {
    let mut x = load(b);
    encrypt_rounds!(x, k);
    store(x, b);
}

/// Decrypt eight blocks in place.
#[target_feature(enable = "avx2")]
pub(super) fn decrypt(k: &RoundKeys, b: &mut [[u8; 16]; 8]) {
    let mut x = load(b);
    decrypt_rounds!(x, k);
    store(x, b);
}
