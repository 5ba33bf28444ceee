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

/// XTS tweaks of sixteen consecutive blocks in block order: register i holds the tweaks of
/// blocks 4i..4i+3, one per 128-bit lane (little-endian, as IEEE 1619 and the data).
pub(super) type Tweaks16 = [__m512i; 4];

/// Whether this CPU runs [`tweaks16`], [`next_tweaks16`] and the fused loads and stores.
pub(super) fn xts_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
}

/// The tweaks of sixteen blocks, the first `t`: four made one by one, the rest by
/// multiplying those by x^4, x^8 and x^12 in the registers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
pub(super) fn tweaks16(t: u128) -> Tweaks16 {
    let t1 = super::xts::mul_x(t);
    let t2 = super::xts::mul_x(t1);
    let t3 = super::xts::mul_x(t2);
    let word = |v: u128, high: bool| (if high { v >> 64 } else { v }) as u64 as i64;
    let first = _mm512_set_epi64(
        word(t3, true),
        word(t3, false),
        word(t2, true),
        word(t2, false),
        word(t1, true),
        word(t1, false),
        word(t, true),
        word(t, false),
    );
    let second = times_x4(first);
    let third = times_x4(second);
    [first, second, third, times_x4(third)]
}

/// Every 128-bit lane times x^4: shifted left four bits, the four bits shifted out folded
/// back in with a carry-less multiply by 0x87.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn times_x4(v: __m512i) -> __m512i {
    let poly = _mm512_set_epi64(0, 0x87, 0, 0x87, 0, 0x87, 0, 0x87);
    // Each lane's low word's top four bits move into its high word.
    let shifted = _mm512_or_si512(
        _mm512_slli_epi64::<4>(v),
        _mm512_srli_epi64::<60>(_mm512_bslli_epi128::<8>(v)),
    );
    let out = _mm512_srli_epi64::<60>(_mm512_bsrli_epi128::<8>(v));
    _mm512_xor_si512(shifted, _mm512_clmulepi64_epi128::<0x00>(out, poly))
}

/// Every 128-bit lane times x^16: shifted left two bytes, the two bytes shifted out folded
/// back in with a carry-less multiply by 0x87.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn times_x16(v: __m512i) -> __m512i {
    let poly = _mm512_set_epi64(0, 0x87, 0, 0x87, 0, 0x87, 0, 0x87);
    let hi = _mm512_bsrli_epi128::<14>(v);
    _mm512_xor_si512(
        _mm512_bslli_epi128::<2>(v),
        _mm512_clmulepi64_epi128::<0x00>(hi, poly),
    )
}

/// The tweaks of the next sixteen blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
pub(super) fn next_tweaks16(t: &Tweaks16) -> Tweaks16 {
    [
        times_x16(t[0]),
        times_x16(t[1]),
        times_x16(t[2]),
        times_x16(t[3]),
    ]
}

/// The words of sixteen blocks, each XORed with its tweak first, in lane order.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn load16_xor(b: &[[u8; 16]; 16], t: &Tweaks16) -> [__m512i; 4] {
    // SAFETY: each load reads 64 bytes inside `b` (256 bytes); unaligned loads.
    transpose(std::array::from_fn(|i| unsafe {
        _mm512_xor_si512(_mm512_loadu_si512(b.as_ptr().add(4 * i).cast()), t[i])
    }))
}

/// Store words in lane order back as sixteen blocks, each XORed with its tweak.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn store16_xor(x: [__m512i; 4], t: &Tweaks16, b: &mut [[u8; 16]; 16]) {
    for (i, r) in transpose(x).into_iter().enumerate() {
        // SAFETY: each store writes 64 bytes inside `b` (256 bytes); unaligned stores.
        unsafe { _mm512_storeu_si512(b.as_mut_ptr().add(4 * i).cast(), _mm512_xor_si512(r, t[i])) };
    }
}
