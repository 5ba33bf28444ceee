//! CBC over any 128-bit [`BlockCipher`], one chain per sector starting from the sector's IV:
//! dm-crypt's `cbc` chaining mode for serpent and twofish (AES-CBC runs on OpenSSL).
//!
//! Decryption walks each sector backwards in runs of blocks, so every run's predecessors are
//! still ciphertext in place: only a run's worth is copied.

use super::block::BlockCipher;
use super::iv::IvGen;
use super::sector::{check_buf, SectorCipher};
use super::xts::xor;

/// Blocks decrypted per call (their predecessors sit on the stack: 1 KiB).
const RUN: usize = 64;

/// CBC over a block cipher.
pub(crate) struct Cbc {
    cipher: Box<dyn BlockCipher>,
    iv: IvGen,
    key_size: usize,
}

impl Cbc {
    /// `cipher` keyed with the volume key.
    pub(crate) fn new(cipher: Box<dyn BlockCipher>, iv: IvGen, key_size: usize) -> Cbc {
        Cbc {
            cipher,
            iv,
            key_size,
        }
    }
}

impl SectorCipher for Cbc {
    fn encrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
        check_buf(buf.len(), sector_size);
        for (i, sector) in buf.chunks_exact_mut(sector_size).enumerate() {
            let mut prev = self.iv.iv(iv_sector.wrapping_add(i as u64));
            for b in sector.as_chunks_mut::<16>().0 {
                xor(b, &prev);
                self.cipher.encrypt_blocks(std::slice::from_mut(b));
                prev = *b;
            }
        }
    }
    fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
        check_buf(buf.len(), sector_size);
        for (i, sector) in buf.chunks_exact_mut(sector_size).enumerate() {
            let iv = self.iv.iv(iv_sector.wrapping_add(i as u64));
            let blocks = sector.as_chunks_mut::<16>().0;
            // Runs of blocks from the end: a run's predecessors (still ciphertext, as
            // everything before the run is) are copied aside, then the run is decrypted in
            // one call, so ciphers with parallel paths use them.
            let mut end = blocks.len();
            while end > 0 {
                let start = end.saturating_sub(RUN);
                let mut prev = [[0u8; 16]; RUN];
                for (j, p) in (start..end).zip(prev.iter_mut()) {
                    *p = if j == 0 { iv } else { blocks[j - 1] };
                }
                self.cipher.decrypt_blocks(&mut blocks[start..end]);
                for (b, p) in blocks[start..end].iter_mut().zip(prev.iter()) {
                    xor(b, p);
                }
                end = start;
            }
        }
    }
    fn key_size(&self) -> usize {
        self.key_size
    }
    fn implementation(&self) -> &'static str {
        self.cipher.implementation()
    }
}
