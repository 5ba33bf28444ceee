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

        /// XTS over `len` bytes of whole sectors read at `src` and written at `dst` (the same
        /// address for in place).
        ///
        /// Safety: `src` must be readable and `dst` writable for `len` bytes, and the two
        /// either the same address or not overlapping.
        unsafe fn run(
            &self,
            src: *const u8,
            dst: *mut u8,
            len: usize,
            iv_sector: u64,
            sector_size: usize,
            decrypt: bool,
        ) {
            check_buf(len, sector_size);
            let k = &*self.keys;
            let data = if decrypt { &k.dec } else { &k.enc };
            let io = Io { src, dst, len };
            // SAFETY: `available()` was true in `new`, the only constructor: the CPU has every
            // feature the callee enables; the caller vouches for the buffers.
            unsafe {
                match (k.enc.rounds, decrypt) {
                    (14, false) => {
                        xts::<14, false>(data, &k.tweak, &self.iv, io, iv_sector, sector_size)
                    }
                    (14, true) => {
                        xts::<14, true>(data, &k.tweak, &self.iv, io, iv_sector, sector_size)
                    }
                    (_, false) => {
                        xts::<10, false>(data, &k.tweak, &self.iv, io, iv_sector, sector_size)
                    }
                    (_, true) => {
                        xts::<10, true>(data, &k.tweak, &self.iv, io, iv_sector, sector_size)
                    }
                }
            }
        }
    }

    /// The bytes one call transforms: `len` bytes read at `src`, written at `dst`.
    #[derive(Clone, Copy)]
    struct Io {
        src: *const u8,
        dst: *mut u8,
        len: usize,
    }

    impl SectorCipher for XtsVaes {
        fn encrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
            let p = buf.as_mut_ptr();
            // SAFETY: in place over one buffer we own for its length.
            unsafe { self.run(p, p, buf.len(), iv_sector, sector_size, false) }
        }
        fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
            let p = buf.as_mut_ptr();
            // SAFETY: in place over one buffer we own for its length.
            unsafe { self.run(p, p, buf.len(), iv_sector, sector_size, true) }
        }
        fn encrypt_to(&self, src: &[u8], dst: &mut [u8], iv_sector: u64, sector_size: usize) {
            assert_eq!(
                src.len(),
                dst.len(),
                "XTS source and destination lengths differ"
            );
            // SAFETY: a shared and an exclusive borrow never overlap; both hold `len` bytes.
            unsafe {
                self.run(
                    src.as_ptr(),
                    dst.as_mut_ptr(),
                    dst.len(),
                    iv_sector,
                    sector_size,
                    false,
                )
            }
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

    /// Each 128-bit lane times x^n, n (below 56) given per 64-bit half in `n` (the same for
    /// both halves of a lane): both halves shifted left, the bits shifted out of the low half
    /// moved into the high half, those out of the high half folded in with a carry-less
    /// multiply by 0x87.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
    fn mul_xn(v: __m512i, n: __m512i, poly: __m512i) -> __m512i {
        // A shift right by 64 (n = 0) gives 0: nothing carried.
        let out = _mm512_srlv_epi64(v, _mm512_sub_epi64(_mm512_set1_epi64(64), n));
        _mm512_ternarylogic_epi64::<0x96>(
            _mm512_sllv_epi64(v, n),
            _mm512_bslli_epi128::<8>(out),
            _mm512_clmulepi64_epi128::<0x00>(_mm512_bsrli_epi128::<8>(out), poly),
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

    /// XTS over the whole sectors of `io`. `data` is K1's schedule (decryption schedule when
    /// `DEC`), `tweak` K2's encryption schedule; `NR` is the number of rounds (10 or 14).
    ///
    /// Safety: as [`XtsVaes::run`]'s for `io`.
    #[target_feature(enable = "aes,pclmulqdq,avx512f,avx512vl,avx512bw,vaes,vpclmulqdq")]
    unsafe fn xts<const NR: usize, const DEC: bool>(
        data: &RoundKeys,
        tweak: &RoundKeys,
        iv: &IvGen,
        io: Io,
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
        let mut tk4 = [_mm512_setzero_si512(); 15];
        for r in 0..=NR {
            tk4[r] = _mm512_broadcast_i32x4(tk[r]);
        }
        let plain64 = iv.is_plain64();
        // The tweaks of four sectors at a time, one in each lane: one chain of AES rounds for
        // four sectors instead of one chain each, which a 512-byte sector otherwise waits on.
        let sectors = io.len / sector_size;
        let mut first = iv_sector;
        for start in (0..sectors).step_by(4) {
            let ivs = if plain64 {
                let s = |j: u64| first.wrapping_add(j) as i64;
                _mm512_set_epi64(0, s(3), 0, s(2), 0, s(1), 0, s(0))
            } else {
                let mut a = [0u8; 64];
                for (j, lane) in a.chunks_exact_mut(16).enumerate() {
                    lane.copy_from_slice(&iv.iv(first.wrapping_add(j as u64)));
                }
                // SAFETY: a 64-byte unaligned load of `a`.
                let v = unsafe { _mm512_loadu_si512(a.as_ptr().cast()) };
                a.zeroize();
                v
            };
            // T = E_K2(IV), in every lane.
            let mut t = _mm512_xor_si512(ivs, tk4[0]);
            for k in &tk4[1..NR] {
                t = _mm512_aesenc_epi128(t, *k);
            }
            t = _mm512_aesenclast_epi128(t, tk4[NR]);
            let lanes = [
                _mm512_shuffle_i32x4::<0x00>(t, t),
                _mm512_shuffle_i32x4::<0x55>(t, t),
                _mm512_shuffle_i32x4::<0xaa>(t, t),
                _mm512_shuffle_i32x4::<0xff>(t, t),
            ];
            for (j, tw) in lanes.into_iter().enumerate().take(sectors - start) {
                let at = (start + j) * sector_size;
                // SAFETY: sector `start + j` lies inside `io` (fewer than `sectors`).
                unsafe {
                    let (src, dst) = (io.src.add(at), io.dst.add(at));
                    sector_xts::<NR, DEC>(&rk, &rk1, tw, poly, src, dst, sector_size);
                }
            }
            first = first.wrapping_add(4);
        }
        tk4.fill(_mm512_setzero_si512());
        // Round keys left in registers and on the stack are not secret-free, but the stack
        // copies die with this frame; wipe the arrays we own.
        rk.fill(_mm512_setzero_si512());
        rk1.fill(_mm_setzero_si128());
        tk.fill(_mm_setzero_si128());
        // Keep the wipes from being optimised away.
        std::hint::black_box((&rk, &rk1, &tk, &tk4));
    }

    /// XTS over the 64-byte vectors at `$p` (one per tweak vector `$t`, in order): block i
    /// of each vector with the tweak in lane i of its `$t`. A macro over named vectors, not a
    /// function over an array: with arrays the vectors went through memory and XTS ran at half
    /// the speed here.
    ///
    /// Safety: `$src` must point to 64 readable bytes per tweak vector and `$dst` to as many
    /// writable ones (the same address, or not overlapping), in a function with AVX-512F and
    /// VAES enabled.
    macro_rules! xts_blocks {
        ($nr:ident, $dec:ident, $rk:expr, $src:expr, $dst:expr;
         $($b:ident: $t:expr, $off:literal);+) => {{
            let (src, dst): (*const u8, *mut u8) = ($src, $dst);
            let rk: &[__m512i; 15] = $rk;
            $(
                // SAFETY: inside the caller's bytes (see the macro's safety note).
                let $b = unsafe { _mm512_loadu_si512(src.add($off).cast()) };
                let mut $b = _mm512_ternarylogic_epi64::<0x96>($b, $t, rk[0]);
            )+
            for k in &rk[1..$nr] {
                $( $b = round::<$dec>($b, *k); )+
            }
            $(
                let x = _mm512_xor_si512(last::<$dec>($b, rk[$nr]), $t);
                // SAFETY: inside the caller's bytes (see the macro's safety note).
                unsafe { _mm512_storeu_si512(dst.add($off).cast(), x) };
            )+
        }};
    }

    #[inline]
    #[target_feature(enable = "aes,pclmulqdq,avx512f,avx512vl,avx512bw,vaes,vpclmulqdq")]
    /// XTS over one sector of `sector_size` bytes read at `src` and written at `dst`.
    ///
    /// Safety: `src` readable and `dst` writable for `sector_size` bytes, the same address or
    /// not overlapping.
    unsafe fn sector_xts<const NR: usize, const DEC: bool>(
        rk: &[__m512i; 15],
        rk1: &[__m128i; 15],
        t: __m512i,
        poly: __m512i,
        src: *const u8,
        dst: *mut u8,
        sector_size: usize,
    ) {
        // `t` holds the sector's tweak T in every lane. Lane j of vector k becomes
        // T * x^(4k + j): a shift of 4k + j bits per lane, the bits carried out of each 64-bit
        // half moved up, those out of the top folded back with 0x87. The four are
        // independent, so the first blocks do not wait on a chain of multiplications.
        let at = |k: i64| _mm512_set_epi64(k + 3, k + 3, k + 2, k + 2, k + 1, k + 1, k, k);
        let v0 = mul_xn(t, at(0), poly);
        let v1 = mul_xn(t, at(4), poly);
        let v2 = mul_xn(t, at(8), poly);
        let v3 = mul_xn(t, at(12), poly);
        let (mut v0, mut v1, mut v2, mut v3) = (v0, v1, v2, v3);
        let whole = sector_size / 256 * 256;
        for at in (0..whole).step_by(256) {
            // SAFETY: 256 bytes at `at`, inside the sector.
            let (s, d) = unsafe { (src.add(at), dst.add(at)) };
            xts_blocks!(NR, DEC, rk, s, d;
                b0: v0, 0; b1: v1, 64; b2: v2, 128; b3: v3, 192);
            v0 = next16(v0, poly);
            v1 = next16(v1, poly);
            v2 = next16(v2, poly);
            v3 = next16(v3, poly);
        }
        // Sectors that are not a multiple of 256 bytes (never for dm-crypt's 512..4096):
        // one block at a time from the current tweak.
        if whole == sector_size {
            return;
        }
        let t0 = _mm512_castsi512_si128(v0);
        let mut x = (_mm_cvtsi128_si64(t0) as u64 as u128)
            | ((_mm_extract_epi64::<1>(t0) as u64 as u128) << 64);
        for at in (whole..sector_size).step_by(16) {
            let tv = _mm_set_epi64x((x >> 64) as u64 as i64, x as u64 as i64);
            // SAFETY: 16 bytes at `at`, inside the sector (its size is a multiple of 16).
            unsafe {
                let mut b = _mm_xor_si128(_mm_loadu_si128(src.add(at).cast()), tv);
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
                _mm_storeu_si128(dst.add(at).cast(), _mm_xor_si128(b, tv));
            }
            x = mul_x(x);
        }
    }
}
