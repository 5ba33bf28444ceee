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
