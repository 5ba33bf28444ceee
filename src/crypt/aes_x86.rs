//! AES-XTS on x86-64 instructions: VAES + AVX-512 (four 512-bit vectors, 16 blocks per
//! iteration, tweaks advanced with VPCLMULQDQ). Key expansion is portable code (no table
//! lookups on secret data: the S-box is computed arithmetically); the round keys live in secret
//! memory (locked, out of core dumps, wiped on drop).
//!
//! Everything runs on the calling thread; nothing is queued.

use super::cipher::{check_buf, SectorCipher};
use super::iv::IvGen;
use zeroize::Zeroize;

/// Expanded AES round keys (encryption order), zeroized on drop.
pub(crate) struct RoundKeys {
    keys: [[u8; 16]; 15],
    rounds: usize,
}

impl Drop for RoundKeys {
    fn drop(&mut self) {
        self.keys.zeroize();
    }
}

/// Multiply in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1, in constant time.
fn gmul(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    for _ in 0..8 {
        p ^= a & 0u8.wrapping_sub(b & 1);
        let hi = a >> 7;
        a = (a << 1) ^ (0x1b & 0u8.wrapping_sub(hi));
        b >>= 1;
    }
    p
}

/// The AES S-box, computed (inverse x^254, then the affine map) without tables.
fn sbox(x: u8) -> u8 {
    // x^254 = x^-1 (0 maps to 0).
    let x2 = gmul(x, x);
    let x3 = gmul(x2, x);
    let x6 = gmul(x3, x3);
    let x12 = gmul(x6, x6);
    let x15 = gmul(x12, x3);
    let x30 = gmul(x15, x15);
    let x60 = gmul(x30, x30);
    let x120 = gmul(x60, x60);
    let x126 = gmul(x120, x6);
    let x127 = gmul(x126, x);
    let inv = gmul(x127, x127);
    inv ^ inv.rotate_left(1) ^ inv.rotate_left(2) ^ inv.rotate_left(3) ^ inv.rotate_left(4) ^ 0x63
}

fn sub_word(w: u32) -> u32 {
    u32::from_be_bytes(w.to_be_bytes().map(sbox))
}

// SAFETY: arrays of bytes and an integer: all zeros is a valid (empty) schedule.
unsafe impl crate::crypt::secret::Zeroable for RoundKeys {}

impl RoundKeys {
    /// FIPS-197 key expansion of a 16-, 24- or 32-byte key.
    #[cfg(test)]
    pub(crate) fn expand(key: &[u8]) -> Option<RoundKeys> {
        let mut k = RoundKeys {
            keys: [[0u8; 16]; 15],
            rounds: 0,
        };
        k.expand_from(key).then_some(k)
    }

    /// FIPS-197 key expansion of a 16-, 24- or 32-byte key into `self` (in place, so the
    /// schedule is only ever where `self` is); false for another key size.
    pub(crate) fn expand_from(&mut self, key: &[u8]) -> bool {
        let nk = match key.len() {
            16 | 24 | 32 => key.len() / 4,
            _ => return false,
        };
        let rounds = nk + 6;
        let total = 4 * (rounds + 1);
        let mut w = [0u32; 60];
        for (i, c) in key.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        let mut rcon: u8 = 1;
        for i in nk..total {
            let mut t = w[i - 1];
            if i % nk == 0 {
                t = sub_word(t.rotate_left(8)) ^ (u32::from(rcon) << 24);
                rcon = gmul(rcon, 2);
            } else if nk > 6 && i % nk == 4 {
                t = sub_word(t);
            }
            w[i] = w[i - nk] ^ t;
        }
        for (r, k) in self.keys.iter_mut().enumerate().take(rounds + 1) {
            for j in 0..4 {
                k[4 * j..4 * j + 4].copy_from_slice(&w[4 * r + j].to_be_bytes());
            }
        }
        self.rounds = rounds;
        w.zeroize();
        true
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use imp::{AesNiEncryptor, XtsVaes};

/// Whether the CPU has everything the VAES + AVX-512 XTS path uses.
#[cfg(target_arch = "x86_64")]
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("aes")
        && std::is_x86_feature_detected!("pclmulqdq")
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("vaes")
        && std::is_x86_feature_detected!("vpclmulqdq")
}

/// Not x86-64: never available.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn available() -> bool {
    false
}

/// Not x86-64: the VAES path does not exist (never constructed, `available()` is false).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) struct XtsVaes;

#[cfg(not(target_arch = "x86_64"))]
impl XtsVaes {
    pub(crate) fn new(_key: &[u8], _iv: IvGen) -> Option<XtsVaes> {
        None
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl SectorCipher for XtsVaes {
    fn encrypt(&self, _: &mut [u8], _: u64, _: usize) {
        unreachable!("XtsVaes is never constructed off x86-64")
    }
    fn decrypt(&self, _: &mut [u8], _: u64, _: usize) {
        unreachable!("XtsVaes is never constructed off x86-64")
    }
    fn key_size(&self) -> usize {
        0
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::*;
    use crate::crypt::secret::SecretBox;
    use core::arch::x86_64::*;

    /// One-block AES encryption with AES-NI: ESSIV's IV cipher, one block per sector, where a
    /// direct call beats a general-purpose block cipher's dispatch. Encryption only.
    pub(crate) struct AesNiEncryptor {
        keys: SecretBox<RoundKeys>,
    }

    impl AesNiEncryptor {
        /// `None` without AES-NI or with a key that is not 16, 24 or 32 bytes.
        pub(crate) fn new(key: &[u8]) -> Option<AesNiEncryptor> {
            if !std::is_x86_feature_detected!("aes") {
                return None;
            }
            let mut keys = SecretBox::<RoundKeys>::zeroed();
            keys.expand_from(key).then_some(AesNiEncryptor { keys })
        }

        /// Encrypt one block in place.
        pub(crate) fn encrypt(&self, block: &mut [u8; 16]) {
            // SAFETY: AES-NI was detected in `new`, the only constructor.
            unsafe { aes_block(&self.keys, block) }
        }
    }

    #[target_feature(enable = "aes,sse2")]
    fn aes_block(k: &RoundKeys, block: &mut [u8; 16]) {
        // SAFETY: unaligned 16-byte loads/stores within `block` and the key arrays.
        unsafe {
            let ld = |p: &[u8; 16]| _mm_loadu_si128(p.as_ptr().cast());
            let mut s = _mm_xor_si128(ld(block), ld(&k.keys[0]));
            for r in 1..k.rounds {
                s = _mm_aesenc_si128(s, ld(&k.keys[r]));
            }
            s = _mm_aesenclast_si128(s, ld(&k.keys[k.rounds]));
            _mm_storeu_si128(block.as_mut_ptr().cast(), s);
        }
    }

    /// The schedules of an XTS key: K1 for encryption and decryption, K2 for the tweak.
    struct Schedules {
        enc: RoundKeys,
        dec: RoundKeys,
        tweak: RoundKeys,
    }

    // SAFETY: three Zeroable schedules.
    unsafe impl crate::crypt::secret::Zeroable for Schedules {}

    /// AES-XTS on VAES + AVX-512: the key schedules (in secret memory) and the IV generator.
    pub(crate) struct XtsVaes {
        keys: SecretBox<Schedules>,
        iv: IvGen,
        key_size: usize,
    }

    impl XtsVaes {
        /// `key` is K1 || K2 (32 or 64 bytes). `None` when the CPU lacks the instructions.
        pub(crate) fn new(key: &[u8], iv: IvGen) -> Option<XtsVaes> {
            if !super::available() || !matches!(key.len(), 32 | 64) {
                return None;
            }
            let (k1, k2) = key.split_at(key.len() / 2);
            // Built in place in secret memory: no copy of a schedule on the stack.
            let mut keys = SecretBox::<Schedules>::zeroed();
            let k = &mut *keys;
            if !k.enc.expand_from(k1) || !k.tweak.expand_from(k2) {
                return None;
            }
            // SAFETY: AES-NI is part of `available()`.
            unsafe { decryption_keys(&k.enc, &mut k.dec) };
            Some(XtsVaes {
                keys,
                iv,
                key_size: key.len(),
            })
        }

        fn run(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize, decrypt: bool) {
            check_buf(buf.len(), sector_size);
            let k = &*self.keys;
            let data = if decrypt { &k.dec } else { &k.enc };
            // SAFETY: `available()` was true in `new`, the only constructor: the CPU has every
            // feature the callee enables.
            unsafe {
                match (k.enc.rounds, decrypt) {
                    (14, false) => {
                        xts::<14, false>(data, &k.tweak, &self.iv, buf, iv_sector, sector_size)
                    }
                    (14, true) => {
                        xts::<14, true>(data, &k.tweak, &self.iv, buf, iv_sector, sector_size)
                    }
                    (_, false) => {
                        xts::<10, false>(data, &k.tweak, &self.iv, buf, iv_sector, sector_size)
                    }
                    (_, true) => {
                        xts::<10, true>(data, &k.tweak, &self.iv, buf, iv_sector, sector_size)
                    }
                }
            }
        }
    }

    impl SectorCipher for XtsVaes {
        fn encrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
            self.run(buf, iv_sector, sector_size, false)
        }
        fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
            self.run(buf, iv_sector, sector_size, true)
        }
        fn key_size(&self) -> usize {
            self.key_size
        }
        fn implementation(&self) -> &'static str {
            "vaes-avx512"
        }
    }

    /// The Equivalent Inverse Cipher's schedule for AESDEC: reversed, with InvMixColumns
    /// applied to the middle round keys.
    #[target_feature(enable = "aes,sse2")]
    fn decryption_keys(enc: &RoundKeys, dec: &mut RoundKeys) {
        let nr = enc.rounds;
        dec.rounds = nr;
        dec.keys[0] = enc.keys[nr];
        dec.keys[nr] = enc.keys[0];
        for i in 1..nr {
            // SAFETY: unaligned 16-byte load/store of whole arrays.
            unsafe {
                let k = _mm_loadu_si128(enc.keys[nr - i].as_ptr().cast());
                _mm_storeu_si128(dec.keys[i].as_mut_ptr().cast(), _mm_aesimc_si128(k));
            }
        }
    }

    /// The tweak times x (little-endian 128-bit, reduction polynomial x^128 + x^7 + x^2 + x + 1).
    #[inline(always)]
    fn mul_x(t: u128) -> u128 {
        (t << 1) ^ (0x87 & 0u128.wrapping_sub(t >> 127))
    }

    /// Each 128-bit lane times x^16: shift left two bytes, fold the two bytes shifted out
    /// back in with a carry-less multiply by 0x87.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
    fn next16(v: __m512i, poly: __m512i) -> __m512i {
        let hi = _mm512_bsrli_epi128::<14>(v);
        _mm512_xor_si512(
            _mm512_bslli_epi128::<2>(v),
            _mm512_clmulepi64_epi128::<0x00>(hi, poly),
        )
    }

    #[inline]
    #[target_feature(enable = "avx512f,vaes")]
    fn round<const DEC: bool>(b: __m512i, k: __m512i) -> __m512i {
        if DEC {
            _mm512_aesdec_epi128(b, k)
        } else {
            _mm512_aesenc_epi128(b, k)
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,vaes")]
    fn last<const DEC: bool>(b: __m512i, k: __m512i) -> __m512i {
        if DEC {
            _mm512_aesdeclast_epi128(b, k)
        } else {
            _mm512_aesenclast_epi128(b, k)
        }
    }

    /// XTS over whole sectors of `buf`. `data` is K1's schedule (decryption schedule when
    /// `DEC`), `tweak` K2's encryption schedule; `NR` is the number of rounds (10 or 14).
    #[target_feature(enable = "aes,pclmulqdq,avx512f,avx512vl,avx512bw,vaes,vpclmulqdq")]
    fn xts<const NR: usize, const DEC: bool>(
        data: &RoundKeys,
        tweak: &RoundKeys,
        iv: &IvGen,
        buf: &mut [u8],
        iv_sector: u64,
        sector_size: usize,
    ) {
        // SAFETY: 16-byte unaligned loads of the round-key arrays.
        let ld = |p: &[u8; 16]| unsafe { _mm_loadu_si128(p.as_ptr().cast()) };
        let mut rk = [_mm512_setzero_si512(); 15];
        let mut rk1 = [_mm_setzero_si128(); 15];
        let mut tk = [_mm_setzero_si128(); 15];
        for r in 0..=NR {
            rk1[r] = ld(&data.keys[r]);
            rk[r] = _mm512_broadcast_i32x4(rk1[r]);
            tk[r] = ld(&tweak.keys[r]);
        }
        let poly = _mm512_set_epi64(0, 0x87, 0, 0x87, 0, 0x87, 0, 0x87);
        let plain64 = iv.is_plain64();
        for (i, sector) in buf.chunks_exact_mut(sector_size).enumerate() {
            let s = iv_sector.wrapping_add(i as u64);
            let ivb = if plain64 {
                _mm_set_epi64x(0, s as i64)
            } else {
                ld(&iv.iv(s))
            };
            // T = E_K2(IV)
            let mut t = _mm_xor_si128(ivb, tk[0]);
            for k in &tk[1..NR] {
                t = _mm_aesenc_si128(t, *k);
            }
            t = _mm_aesenclast_si128(t, tk[NR]);
            sector_xts::<NR, DEC>(&rk, &rk1, t, poly, sector);
        }
        // Round keys left in registers and on the stack are not secret-free, but the stack
        // copies die with this frame; wipe the arrays we own.
        rk.fill(_mm512_setzero_si512());
        rk1.fill(_mm_setzero_si128());
        tk.fill(_mm_setzero_si128());
        // Keep the wipes from being optimised away.
        std::hint::black_box((&rk, &rk1, &tk));
    }

    #[inline]
    #[target_feature(enable = "aes,pclmulqdq,avx512f,avx512vl,avx512bw,vaes,vpclmulqdq")]
    fn sector_xts<const NR: usize, const DEC: bool>(
        rk: &[__m512i; 15],
        rk1: &[__m128i; 15],
        t: __m128i,
        poly: __m512i,
        sector: &mut [u8],
    ) {
        // The first 16 tweaks T * x^i, then each vector advances by x^16 per iteration.
        let mut tw = [0u128; 16];
        let mut x = (_mm_cvtsi128_si64(t) as u64 as u128)
            | ((_mm_extract_epi64::<1>(t) as u64 as u128) << 64);
        for e in tw.iter_mut() {
            *e = x;
            x = mul_x(x);
        }
        // SAFETY: `tw` is 256 bytes; four unaligned 64-byte loads inside it.
        let (mut v0, mut v1, mut v2, mut v3) = unsafe {
            let p = tw.as_ptr().cast::<u8>();
            (
                _mm512_loadu_si512(p.cast()),
                _mm512_loadu_si512(p.add(64).cast()),
                _mm512_loadu_si512(p.add(128).cast()),
                _mm512_loadu_si512(p.add(192).cast()),
            )
        };
        tw.zeroize();
        let mut chunks = sector.chunks_exact_mut(256);
        for c in &mut chunks {
            let p = c.as_mut_ptr();
            // SAFETY: `c` is exactly 256 bytes: four unaligned 64-byte loads and stores.
            unsafe {
                let mut b0 = _mm512_loadu_si512(p.cast());
                let mut b1 = _mm512_loadu_si512(p.add(64).cast());
                let mut b2 = _mm512_loadu_si512(p.add(128).cast());
                let mut b3 = _mm512_loadu_si512(p.add(192).cast());
                b0 = _mm512_ternarylogic_epi64::<0x96>(b0, v0, rk[0]);
                b1 = _mm512_ternarylogic_epi64::<0x96>(b1, v1, rk[0]);
                b2 = _mm512_ternarylogic_epi64::<0x96>(b2, v2, rk[0]);
                b3 = _mm512_ternarylogic_epi64::<0x96>(b3, v3, rk[0]);
                for k in &rk[1..NR] {
                    b0 = round::<DEC>(b0, *k);
                    b1 = round::<DEC>(b1, *k);
                    b2 = round::<DEC>(b2, *k);
                    b3 = round::<DEC>(b3, *k);
                }
                b0 = last::<DEC>(b0, rk[NR]);
                b1 = last::<DEC>(b1, rk[NR]);
                b2 = last::<DEC>(b2, rk[NR]);
                b3 = last::<DEC>(b3, rk[NR]);
                _mm512_storeu_si512(p.cast(), _mm512_xor_si512(b0, v0));
                _mm512_storeu_si512(p.add(64).cast(), _mm512_xor_si512(b1, v1));
                _mm512_storeu_si512(p.add(128).cast(), _mm512_xor_si512(b2, v2));
                _mm512_storeu_si512(p.add(192).cast(), _mm512_xor_si512(b3, v3));
            }
            v0 = next16(v0, poly);
            v1 = next16(v1, poly);
            v2 = next16(v2, poly);
            v3 = next16(v3, poly);
        }
        // Sectors that are not a multiple of 256 bytes (never for dm-crypt's 512..4096):
        // one block at a time from the current tweak.
        let rest = chunks.into_remainder();
        if rest.is_empty() {
            return;
        }
        let t0 = _mm512_castsi512_si128(v0);
        let mut x = (_mm_cvtsi128_si64(t0) as u64 as u128)
            | ((_mm_extract_epi64::<1>(t0) as u64 as u128) << 64);
        for blk in rest.chunks_exact_mut(16) {
            let tv = _mm_set_epi64x((x >> 64) as u64 as i64, x as u64 as i64);
            // SAFETY: `blk` is exactly 16 bytes.
            unsafe {
                let mut b = _mm_xor_si128(_mm_loadu_si128(blk.as_ptr().cast()), tv);
                b = _mm_xor_si128(b, rk1[0]);
                for k in &rk1[1..NR] {
                    b = if DEC {
                        _mm_aesdec_si128(b, *k)
                    } else {
                        _mm_aesenc_si128(b, *k)
                    };
                }
                b = if DEC {
                    _mm_aesdeclast_si128(b, rk1[NR])
                } else {
                    _mm_aesenclast_si128(b, rk1[NR])
                };
                _mm_storeu_si128(blk.as_mut_ptr().cast(), _mm_xor_si128(b, tv));
            }
            x = mul_x(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbox_and_key_expansion_match_fips197() {
        assert_eq!(sbox(0x00), 0x63);
        assert_eq!(sbox(0x53), 0xed);
        assert_eq!(sbox(0xff), 0x16);
        // FIPS-197 A.1: last round key of 2b7e1516...
        let k =
            RoundKeys::expand(&hex::decode("2b7e151628aed2a6abf7158809cf4f3c").unwrap()).unwrap();
        assert_eq!(hex::encode(k.keys[10]), "d014f9a8c9ee2589e13f0cc8b6630ca6");
        // A.3: AES-256, w[56..60].
        let k = RoundKeys::expand(
            &hex::decode("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(hex::encode(k.keys[14]), "fe4890d1e6188d0b046df344706c631e");
        // A.2: AES-192, w[48..52].
        let k = RoundKeys::expand(
            &hex::decode("8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b").unwrap(),
        )
        .unwrap();
        assert_eq!(hex::encode(k.keys[12]), "e98ba06f448c773c8ecc720401002202");
    }
}
