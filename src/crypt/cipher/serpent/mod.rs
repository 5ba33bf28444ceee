//! Serpent (Anderson, Biham, Knudsen, 1998) as the kernel's `serpent` cipher: the key padded
//! with a 1 bit to 256 bits, blocks as four little-endian words. Many blocks at once in
//! bitslice order (each vector lane one block): sixteen per AVX-512 pass with each S-box
//! bit two or three `vpternlogd` ([`avx512`]), eight per AVX2 pass in and/or/xor gates ([`avx2`]); both
//! run the same rounds (the macros of [`rounds`]). Single blocks (CBC encryption, the tail of
//! a run, CPUs without AVX2) go to RustCrypto's `serpent`, whose one-block bitsliced gates
//! are shorter than ours. The backend is chosen once per key from what the CPU has.
//!
//! Bitsliced Serpent has no table lookups, so no timing depends on the key or the data. The
//! round keys live in secret memory.

mod avx2;
mod avx512;
mod rounds;
mod sbox;

use super::block::BlockCipher;
use crate::crypt::secret::SecretBox;

/// The 33 round keys.
type RoundKeys = [[u32; 4]; 33];

struct Schedule(RoundKeys);

// SAFETY: plain words; all-zero bytes are a valid value.
unsafe impl crate::crypt::secret::Zeroable for Schedule {}

/// Which code runs the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Sixteen blocks per pass (AVX-512F).
    Avx512,
    /// Eight blocks per pass (AVX2).
    Avx2,
    /// One block at a time (RustCrypto's `serpent`).
    Scalar,
}

impl Backend {
    /// The fastest backend this CPU runs.
    pub(crate) fn best() -> Backend {
        if std::arch::is_x86_feature_detected!("avx512f") {
            Backend::Avx512
        } else if std::arch::is_x86_feature_detected!("avx2") {
            Backend::Avx2
        } else {
            Backend::Scalar
        }
    }

    /// Whether this CPU runs `self`.
    pub(crate) fn available(self) -> bool {
        match self {
            Backend::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            Backend::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            Backend::Scalar => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Avx512 => "serpent-avx512",
            Backend::Avx2 => "serpent-avx2",
            Backend::Scalar => "serpent-portable",
        }
    }
}

/// Serpent keyed with a 128-, 192- or 256-bit key.
pub(crate) struct Serpent {
    keys: SecretBox<Schedule>,
    /// The same key for single blocks.
    one: SecretBox<serpent::Serpent>,
    backend: Backend,
    /// Whether XTS runs fused over sixteen blocks (AVX-512 backend on a CPU with BW and
    /// VPCLMULQDQ for the tweaks).
    xts_wide: bool,
}

impl Serpent {
    /// Serpent with `key` (16, 24 or 32 bytes) on the fastest backend; `None` for another
    /// length.
    pub(crate) fn new(key: &[u8]) -> Option<Serpent> {
        Serpent::with_backend(key, Backend::best())
    }

    /// Serpent on `backend` (tests and benchmarks); `None` when the CPU lacks it or the key
    /// length is wrong.
    pub(crate) fn with_backend(key: &[u8], backend: Backend) -> Option<Serpent> {
        if !matches!(key.len(), 16 | 24 | 32) || !backend.available() {
            return None;
        }
        let keys = SecretBox::new(Schedule([[0; 4]; 33]));
        let one = SecretBox::new(<serpent::Serpent as cipher::KeyInit>::new_from_slice(key).ok()?);
        let xts_wide = backend == Backend::Avx512 && super::lanes512::xts_available();
        let mut s = Serpent {
            keys,
            one,
            backend,
            xts_wide,
        };
        schedule(key, &mut s.keys.0);
        Some(s)
    }

    fn run(&self, blocks: &mut [[u8; 16]], decrypt: bool) {
        let k = &self.keys.0;
        let (mut sixteens, mut rest): (&mut [[[u8; 16]; 16]], _) = (&mut [], blocks);
        if self.backend == Backend::Avx512 {
            (sixteens, rest) = rest.as_chunks_mut::<16>();
        }
        for b in sixteens {
            // SAFETY: the backend is AVX-512 only when the CPU has AVX-512F (checked at keying).
            unsafe {
                if decrypt {
                    avx512::decrypt(k, b)
                } else {
                    avx512::encrypt(k, b)
                }
            }
        }
        let (mut eights, mut rest): (&mut [[[u8; 16]; 8]], _) = (&mut [], rest);
        if self.backend != Backend::Scalar {
            (eights, rest) = rest.as_chunks_mut::<8>();
        }
        for b in eights {
            // SAFETY: a vector backend was chosen only on a CPU with AVX2 (every AVX-512F
            // CPU has it).
            unsafe {
                if decrypt {
                    avx2::decrypt(k, b)
                } else {
                    avx2::encrypt(k, b)
                }
            }
        }
        let rest = cipher::Array::cast_slice_from_core_mut(rest);
        if decrypt {
            cipher::BlockCipherDecrypt::decrypt_blocks(&*self.one, rest)
        } else {
            cipher::BlockCipherEncrypt::encrypt_blocks(&*self.one, rest)
        }
    }
}

/// The round keys of `key` (the specification's bitslice key schedule, as the kernel's
/// `__serpent_setkey`): the key padded with a 1 bit to 256 bits, the prekeys
/// `w_i = (w_{i-8} ^ w_{i-5} ^ w_{i-3} ^ w_{i-1} ^ φ ^ i) <<< 11`, and round key i the S-box
/// `(3 - i) mod 8` of four of them.
fn schedule(key: &[u8], out: &mut RoundKeys) {
    let mut padded = zeroize::Zeroizing::new([0u8; 32]);
    padded[..key.len()].copy_from_slice(key);
    if key.len() < 32 {
        padded[key.len()] = 1;
    }
    let mut w = zeroize::Zeroizing::new([0u32; 8 + 132]);
    for (i, chunk) in padded.chunks_exact(4).enumerate() {
        w[i] = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
    }
    for i in 8..w.len() {
        w[i] = (w[i - 8] ^ w[i - 5] ^ w[i - 3] ^ w[i - 1] ^ 0x9e37_79b9 ^ (i as u32 - 8))
            .rotate_left(11);
    }
    for (i, k) in out.iter_mut().enumerate() {
        let words = [w[8 + 4 * i], w[9 + 4 * i], w[10 + 4 * i], w[11 + 4 * i]];
        *k = sbox::apply_scalar(&sbox::SBOX[(35 - i) % 8], words);
    }
}

impl BlockCipher for Serpent {
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.run(blocks, false)
    }
    fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.run(blocks, true)
    }
    fn xts_prefix(&self, blocks: &mut [[u8; 16]], t: u128, decrypt: bool) -> usize {
        if !self.xts_wide {
            return 0;
        }
        let k = &self.keys.0;
        // SAFETY: `xts_wide` only when the CPU has AVX-512F, BW and VPCLMULQDQ (checked at
        // keying).
        unsafe {
            if decrypt {
                avx512::xts::<true>(k, blocks, t)
            } else {
                avx512::xts::<false>(k, blocks, t)
            }
        }
    }
    fn implementation(&self) -> &'static str {
        self.backend.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// Every vector backend this CPU runs gives RustCrypto's `serpent` ciphertext (the reference,
    /// checked against the published vectors in `block_cipher`) on random keys of every length
    /// and random block counts, and decrypts back.
    #[test]
    fn every_backend_agrees_with_rustcrypto() {
        let mut next = rng(0x5e7_9e47);
        for round in 0..60 {
            let len = [16, 24, 32][round % 3];
            let key: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let n = (next() % 70) as usize + 1;
            let plain: Vec<[u8; 16]> = (0..n)
                .map(|_| std::array::from_fn(|_| next() as u8))
                .collect();
            let reference = serpent::Serpent::new_from_slice(&key).unwrap();
            let mut want = plain.clone();
            reference.encrypt_blocks(Array::cast_slice_from_core_mut(&mut want));
            for backend in [Backend::Avx512, Backend::Avx2] {
                let Some(s) = Serpent::with_backend(&key, backend) else {
                    continue;
                };
                let mut got = plain.clone();
                s.encrypt_blocks(&mut got);
                assert_eq!(got, want, "{backend:?} key {len} bytes, {n} blocks");
                s.decrypt_blocks(&mut got);
                assert_eq!(got, plain, "{backend:?} decrypt");
            }
            let mut back = want.clone();
            reference.decrypt_blocks(Array::cast_slice_from_core_mut(&mut back));
            assert_eq!(back, plain);
        }
    }
}
