//! Sixteen Twofish blocks at a time in AVX-512 registers (one block per 32-bit lane): the g
//! function's four table lookups are `vpgatherdd` over the keyed tables, the rest is lane-wise
//! adds, XORs and rotations. The rounds are the portable code's, lane by lane.

use super::super::lanes512::{load16, load16_xor, next_tweaks16, store16, store16_xor, tweaks16};
use super::Schedule;
use std::arch::x86_64::*;

type V = __m512i;

/// g(x) = T0[x0] ^ T1[x1] ^ T2[x2] ^ T3[x3] in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn g(t: &[[u32; 256]; 4], x: V) -> V {
    let byte = _mm512_set1_epi32(0xff);
    let i0 = _mm512_and_si512(x, byte);
    let i1 = _mm512_and_si512(_mm512_srli_epi32::<8>(x), byte);
    let i2 = _mm512_and_si512(_mm512_srli_epi32::<16>(x), byte);
    let i3 = _mm512_srli_epi32::<24>(x);
    // SAFETY: every index is a byte (0..=255), inside its 256-entry table; scale 4 = u32.
    unsafe {
        let t0 = _mm512_i32gather_epi32::<4>(i0, t[0].as_ptr().cast());
        let t1 = _mm512_i32gather_epi32::<4>(i1, t[1].as_ptr().cast());
        let t2 = _mm512_i32gather_epi32::<4>(i2, t[2].as_ptr().cast());
        let t3 = _mm512_i32gather_epi32::<4>(i3, t[3].as_ptr().cast());
        _mm512_ternarylogic_epi32::<0x96>(t0, t1, _mm512_xor_si512(t2, t3))
    }
}

super::rounds16::rounds16!(
    features: "avx512f",
    xts_features: "avx512f,avx512bw,vpclmulqdq",
    tables: [[u32; 256]; 4],
    |s| s.t
);
