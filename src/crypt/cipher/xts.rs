//! XTS (IEEE 1619) over any 128-bit [`BlockCipher`]: dm-crypt's `xts` chaining mode for
//! serpent and twofish (and AES without VAES/AVX-512 or with a 384-bit key). The tweak of a
//! sector is E_K2(IV); block j is processed as E_K1(P ^ T·x^j) ^ T·x^j.
//!
//! Tweaks for a run of blocks are made first, then the data cipher runs over the run at once,
//! so ciphers with parallel block paths (AES-NI) use them. Nothing is allocated per sector.

use super::block::BlockCipher;
use super::iv::IvGen;
use super::sector::{check_buf, SectorCipher};

/// Blocks handled per batch (their tweaks sit on the stack: 1 KiB).
const RUN: usize = 64;

/// XTS with data cipher K1 and tweak cipher K2.
pub(crate) struct Xts {
    data: Box<dyn BlockCipher>,
    tweak: Box<dyn BlockCipher>,
    iv: IvGen,
    key_size: usize,
}

impl Xts {
    /// `data` keyed with the first half of the volume key, `tweak` with the second.
    pub(crate) fn new(
        data: Box<dyn BlockCipher>,
        tweak: Box<dyn BlockCipher>,
        iv: IvGen,
        key_size: usize,
    ) -> Xts {
        Xts {
            data,
            tweak,
            iv,
            key_size,
        }
    }

    fn run(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize, decrypt: bool) {
        check_buf(buf.len(), sector_size);
        for (i, sector) in buf.chunks_exact_mut(sector_size).enumerate() {
            let mut t = [self.iv.iv(iv_sector.wrapping_add(i as u64))];
            self.tweak.encrypt_blocks(&mut t);
            // The tweak as a little-endian polynomial (IEEE 1619's byte order).
            let mut t = u128::from_le_bytes(t[0]);
            let (blocks, _) = sector.as_chunks_mut::<16>();
            let done = self.data.xts_prefix(blocks, t, decrypt);
            let blocks = &mut blocks[done..];
            if !blocks.is_empty() {
                t = (0..done).fold(t, |t, _| mul_x(t));
            }
            for run in blocks.chunks_mut(RUN) {
                let mut tweaks = [[0u8; 16]; RUN];
                for (b, tw) in run.iter_mut().zip(tweaks.iter_mut()) {
                    *tw = t.to_le_bytes();
                    xor(b, tw);
                    t = mul_x(t);
                }
                if decrypt {
                    self.data.decrypt_blocks(run);
                } else {
                    self.data.encrypt_blocks(run);
                }
                for (b, tw) in run.iter_mut().zip(tweaks.iter()) {
                    xor(b, tw);
                }
            }
        }
    }
}

/// `b ^= t`.
#[inline(always)]
pub(crate) fn xor(b: &mut [u8; 16], t: &[u8; 16]) {
    *b = (u128::from_ne_bytes(*b) ^ u128::from_ne_bytes(*t)).to_ne_bytes();
}

/// Multiply by x modulo x^128 + x^7 + x^2 + x + 1 (bit i of the integer is the coefficient of
/// x^i), in constant time.
#[inline(always)]
pub(crate) fn mul_x(t: u128) -> u128 {
    (t << 1) ^ (0x87 & 0u128.wrapping_sub(t >> 127))
}

impl SectorCipher for Xts {
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
        self.data.implementation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::cipher::serpent::{self, Serpent};
    use crate::crypt::cipher::spec::CipherSpec;
    use crate::crypt::cipher::twofish::{self, Twofish};

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// `name` keyed with `key` on backend number `which` (0: the one-block code, then the
    /// wide ones); `None` where this CPU lacks it.
    fn keyed(name: &str, which: usize, key: &[u8]) -> Option<Box<dyn BlockCipher>> {
        if name == "serpent" {
            let b = [
                serpent::Backend::Scalar,
                serpent::Backend::Avx2,
                serpent::Backend::Avx512,
            ];
            Some(Box::new(Serpent::with_backend(key, *b.get(which)?)?))
        } else {
            let b = [
                twofish::Backend::Portable,
                twofish::Backend::Gather,
                twofish::Backend::Vbmi,
            ];
            Some(Box::new(Twofish::with_backend(key, *b.get(which)?)?))
        }
    }

    /// Every backend's XTS (the wide ones with their fused tweaks where the CPU has them)
    /// gives the one-block code's sectors on random 512-bit keys, sector numbers, sector
    /// sizes and buffer offsets (misaligned), and decrypts back.
    #[test]
    fn every_backend_agrees_with_the_one_block_code() {
        let mut next = rng(0x0123_4567_89ab_cdef);
        for name in ["serpent", "twofish"] {
            let spec = CipherSpec::parse(&format!("{name}-xts-plain64")).unwrap();
            for round in 0..16 {
                let key: Vec<u8> = (0..64).map(|_| next() as u8).collect();
                let (k1, k2) = key.split_at(32);
                let xts = |which: usize| {
                    let iv = IvGen::new(&spec, &key).unwrap();
                    Some(Xts::new(
                        keyed(name, which, k1)?,
                        keyed(name, 0, k2)?,
                        iv,
                        64,
                    ))
                };
                let sector_size = 512 << (round % 4);
                let len = sector_size * (1 + (next() % 3) as usize);
                let offset = (next() % 16) as usize;
                let sector = next();
                let plain: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let mut want = plain.clone();
                xts(0).unwrap().encrypt(&mut want, sector, sector_size);
                for which in 1..3 {
                    let Some(x) = xts(which) else { continue };
                    let mut buf = vec![0u8; len + offset];
                    let data = &mut buf[offset..];
                    data.copy_from_slice(&plain);
                    x.encrypt(data, sector, sector_size);
                    assert!(data == want, "{name} backend {which} size {sector_size}");
                    x.decrypt(data, sector, sector_size);
                    assert!(data == plain, "{name} backend {which} decrypt");
                }
            }
        }
    }

    /// The fused XTS path on block counts that are not multiples of sixteen and random
    /// tweaks: it does the whole groups, exactly as block-by-block XTS would.
    #[test]
    fn fused_prefix_matches_block_by_block_xts() {
        let mut next = rng(0x5eed_f00d);
        for name in ["serpent", "twofish"] {
            for round in 0..30 {
                let key: Vec<u8> = (0..[16, 24, 32][round % 3]).map(|_| next() as u8).collect();
                let one = keyed(name, 0, &key).unwrap();
                let n = (next() % 80) as usize;
                let t = u128::from(next()) << 64 | u128::from(next());
                let plain: Vec<[u8; 16]> = (0..n)
                    .map(|_| std::array::from_fn(|_| next() as u8))
                    .collect();
                for decrypt in [false, true] {
                    let mut want = plain.clone();
                    let mut tw = t;
                    for b in want.iter_mut() {
                        xor(b, &tw.to_le_bytes());
                        if decrypt {
                            one.decrypt_blocks(std::slice::from_mut(b));
                        } else {
                            one.encrypt_blocks(std::slice::from_mut(b));
                        }
                        xor(b, &tw.to_le_bytes());
                        tw = mul_x(tw);
                    }
                    for which in 1..3 {
                        let Some(c) = keyed(name, which, &key) else {
                            continue;
                        };
                        let mut got = plain.clone();
                        let done = c.xts_prefix(&mut got, t, decrypt);
                        assert!(
                            done == 0 || done == n / 16 * 16,
                            "{name} {which}: {done} of {n}"
                        );
                        assert_eq!(got[..done], want[..done], "{name} {which} {n} {decrypt}");
                        assert_eq!(got[done..], plain[done..], "{name} {which}: tail untouched");
                    }
                }
            }
        }
    }
}
