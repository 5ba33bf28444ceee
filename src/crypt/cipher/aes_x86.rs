//! AES on x86-64 instructions, the parts shared by its users: the key schedule (portable code,
//! no table lookups on secret data: the S-box is computed arithmetically; the round keys live
//! in secret memory, locked, out of core dumps, wiped on drop), the CPU check of the VAES +
//! AVX-512 XTS path (`xts_vaes`), and one-block AES-NI encryption for ESSIV.
//!
//! Everything runs on the calling thread; nothing is queued.

use zeroize::Zeroize;

/// Expanded AES round keys (encryption order), zeroized on drop.
pub(crate) struct RoundKeys {
    pub(super) keys: [[u8; 16]; 15],
    pub(super) rounds: usize,
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
pub(crate) use imp::AesNiEncryptor;

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
