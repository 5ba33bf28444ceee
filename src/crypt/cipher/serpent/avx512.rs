//! Sixteen blocks at a time in AVX-512 registers (one block per 32-bit lane): each S-box
//! output bit is two `vpternlogd` where it has a two-step form (`sbox::ENC_TWO`), else three
//! (two 3-input halves and the select by the fourth input), rotations are `vprold`, and the
//! linear transformation's three-way XORs one `vpternlogd`. In XTS the tweaks stay in
//! registers, sixteen made at a time ([`xts`]).

use super::super::lanes512::{load16 as load, store16 as store};
use super::super::lanes512::{load16_xor, next_tweaks16, store16_xor, tweaks16};
use super::rounds::*;
use super::RoundKeys;
use std::arch::x86_64::*;

type V = __m512i;

#[inline]
#[target_feature(enable = "avx512f")]
fn xor(a: V, b: V) -> V {
    _mm512_xor_si512(a, b)
}
#[inline]
#[target_feature(enable = "avx512f")]
fn xor3(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi32::<0x96>(a, b, c)
}
#[inline]
#[target_feature(enable = "avx512f")]
fn tern<const IMM: i32>(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi32::<IMM>(a, b, c)
}
/// `d ? one : zero`, bit by bit.
#[inline]
#[target_feature(enable = "avx512f")]
fn mux(d: V, one: V, zero: V) -> V {
    _mm512_ternarylogic_epi32::<0xca>(d, one, zero)
}
#[inline]
#[target_feature(enable = "avx512f")]
fn splat(k: u32) -> V {
    _mm512_set1_epi32(k as i32)
}
#[inline]
#[target_feature(enable = "avx512f")]
fn rotl<const L: i32, const R: i32>(a: V) -> V {
    _mm512_rol_epi32::<L>(a)
}
#[inline]
#[target_feature(enable = "avx512f")]
fn shl<const L: u32>(a: V) -> V {
    _mm512_slli_epi32::<L>(a)
}

/// Encrypt sixteen blocks in place.
#[target_feature(enable = "avx512f")]
pub(super) fn encrypt(k: &RoundKeys, b: &mut [[u8; 16]; 16]) {
    let mut x = load(b);
    encrypt_rounds!(x, k);
    store(x, b);
}

/// Decrypt sixteen blocks in place.
#[target_feature(enable = "avx512f")]
pub(super) fn decrypt(k: &RoundKeys, b: &mut [[u8; 16]; 16]) {
    let mut x = load(b);
    decrypt_rounds!(x, k);
    store(x, b);
}

/// XTS over the whole sixteen-block groups of `blocks` (one sector's run), the first tweak
/// `t`: the tweak XORs stay in registers around the rounds. Returns the blocks done.
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
pub(super) fn xts<const DEC: bool>(k: &RoundKeys, blocks: &mut [[u8; 16]], t: u128) -> usize {
    let (groups, _) = blocks.as_chunks_mut::<16>();
    let mut tw = tweaks16(t);
    for b in groups.iter_mut() {
        let mut x = load16_xor(b, &tw);
        if DEC {
            decrypt_rounds!(x, k);
        } else {
            encrypt_rounds!(x, k);
        }
        store16_xor(x, &tw, b);
        tw = next_tweaks16(&tw);
    }
    groups.len() * 16
}
