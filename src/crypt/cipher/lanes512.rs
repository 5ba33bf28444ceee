//! Sixteen 128-bit blocks in and out of four AVX-512 registers in "lane order": lane j of
//! register w holds 32-bit word w of block j (up to a fixed permutation of the blocks, the
//! same on the way out). The layout under the ciphers that run sixteen blocks side by side
//! (serpent's bitsliced rounds, twofish's gathered tables).

use std::arch::x86_64::*;

/// A 4x4 transpose of 32-bit words in each 128-bit lane of four registers; its own inverse.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose(r: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm512_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// The words of sixteen blocks in lane order.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn load16(b: &[[u8; 16]; 16]) -> [__m512i; 4] {
    // SAFETY: each load reads 64 bytes inside `b` (256 bytes); unaligned loads.
    transpose(std::array::from_fn(|i| unsafe {
        _mm512_loadu_si512(b.as_ptr().add(4 * i).cast())
    }))
}

/// Store words in lane order back as sixteen blocks.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn store16(x: [__m512i; 4], b: &mut [[u8; 16]; 16]) {
    for (i, r) in transpose(x).into_iter().enumerate() {
        // SAFETY: each store writes 64 bytes inside `b` (256 bytes); unaligned stores.
        unsafe { _mm512_storeu_si512(b.as_mut_ptr().add(4 * i).cast(), r) };
    }
}
