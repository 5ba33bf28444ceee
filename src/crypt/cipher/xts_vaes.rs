//! AES-XTS on x86-64 instructions: VAES + AVX-512 (four 512-bit vectors, 16 blocks per
//! iteration, tweaks advanced with VPCLMULQDQ), over the key schedule of [`super::aes_x86`].
//!
//! Everything runs on the calling thread; nothing is queued.

use super::iv::IvGen;
use super::sector::SectorCipher;

#[cfg(target_arch = "x86_64")]
pub(crate) use imp::XtsVaes;

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
    use crate::crypt::cipher::aes_x86::{available, RoundKeys};
    use crate::crypt::cipher::sector::check_buf;
    use crate::crypt::secret::SecretBox;
    use core::arch::x86_64::*;
    use zeroize::Zeroize;

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
            if !available() || !matches!(key.len(), 32 | 64) {
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
