//! LRW (Liskov, Rivest, Wagner; IEEE P1619 draft) over any 128-bit [`BlockCipher`], as the
//! kernel's `lrw` template does it: the volume key is the cipher key followed by a 16-byte
//! tweak key K2; the IV is a 128-bit big-endian block index I, incremented for each block of
//! the sector; block j is processed as E(P ^ T) ^ T with T = K2 ⊗ (I + j) in GF(2^128)
//! (big-endian integers, bit i the coefficient of x^i, modulo x^128 + x^7 + x^2 + x + 1).
//!
//! The first tweak of a sector is one multiplication; the next ones are one XOR each:
//! (I + j + 1) ^ (I + j) = 2^(k+1) - 1 where k counts the trailing one bits of I + j, and
//! K2 ⊗ (2^(k+1) - 1) is precomputed for every k (the kernel's `mulinc` table).

use super::block::BlockCipher;
use super::iv::IvGen;
use super::sector::{check_buf, SectorCipher};
use super::xts::{mul_x, xor};
use crate::crypt::secret::SecretBox;

const RUN: usize = 64;

/// K2 and its multiples, secret.
struct TweakKey {
    k2: u128,
    /// `inc[k]` = K2 ⊗ (2^(k+1) - 1).
    inc: [u128; 128],
}

// SAFETY: integers only.
unsafe impl crate::crypt::secret::Zeroable for TweakKey {}

/// a ⊗ b in GF(2^128) (see the module docs), in constant time.
pub(crate) fn gf_mul(a: u128, b: u128) -> u128 {
    let (mut a, mut r) = (a, 0u128);
    for i in 0..128 {
        r ^= a & 0u128.wrapping_sub((b >> i) & 1);
        a = mul_x(a);
    }
    r
}

/// LRW over a block cipher.
pub(crate) struct Lrw {
    cipher: Box<dyn BlockCipher>,
    key: SecretBox<TweakKey>,
    iv: IvGen,
    key_size: usize,
}

impl Lrw {
    /// `cipher` keyed with the volume key less its last 16 bytes, `tweak_key` those 16 bytes.
    pub(crate) fn new(
        cipher: Box<dyn BlockCipher>,
        tweak_key: &[u8; 16],
        iv: IvGen,
        key_size: usize,
    ) -> Lrw {
        // Filled in place: the tweak key and its multiples exist only in secret memory.
        let mut key = SecretBox::<TweakKey>::zeroed();
        key.k2 = u128::from_be_bytes(*tweak_key);
        let mut ones = 0u128;
        for k in 0..128 {
            ones |= 1 << k;
            key.inc[k] = gf_mul(key.k2, ones);
        }
        Lrw {
            cipher,
            key,
            iv,
            key_size,
        }
    }

    fn run(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize, decrypt: bool) {
        check_buf(buf.len(), sector_size);
        for (i, sector) in buf.chunks_exact_mut(sector_size).enumerate() {
            let mut index = u128::from_be_bytes(self.iv.iv(iv_sector.wrapping_add(i as u64)));
            let mut t = gf_mul(self.key.k2, index);
            let (blocks, _) = sector.as_chunks_mut::<16>();
            for run in blocks.chunks_mut(RUN) {
                let mut tweaks = [[0u8; 16]; RUN];
                for (b, tw) in run.iter_mut().zip(tweaks.iter_mut()) {
                    *tw = t.to_be_bytes();
                    xor(b, tw);
                    // Index I + j -> I + j + 1 (a full wrap uses the last entry, all ones).
                    t ^= self.key.inc[(index.trailing_ones() as usize).min(127)];
                    index = index.wrapping_add(1);
                }
                if decrypt {
                    self.cipher.decrypt_blocks(run);
                } else {
                    self.cipher.encrypt_blocks(run);
                }
                for (b, tw) in run.iter_mut().zip(tweaks.iter()) {
                    xor(b, tw);
                }
            }
        }
    }
}

impl SectorCipher for Lrw {
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
        "portable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::cipher::block_cipher::new_block_cipher;
    use crate::crypt::cipher::{new_sector_cipher, CipherSpec};

    #[test]
    fn gf_mul_is_the_field_product() {
        let a = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210u128;
        assert_eq!(gf_mul(a, 1), a);
        assert_eq!(gf_mul(1 << 127, 2), 0x87);
        assert_eq!(gf_mul(a, 0x1234 << 70), gf_mul(0x1234 << 70, a));
        assert_eq!(gf_mul(a, 6), gf_mul(a, 2) ^ gf_mul(a, 4));
    }

    /// The LRW-AES vectors the kernel's lrw template was checked against (IEEE P1619 draft,
    /// pdf00017): (key = AES key || tweak key, block index, ciphertext of "0123456789ABCDEF").
    const VECTORS: &[(&str, u64, &str)] = &[
        (
            "4562ac25f828176d4c268414b5680185258e2a05e73e9d03ee5a830ccc094c87",
            1,
            "f1b273cd65a3df5fe95d489254634eb8",
        ),
        (
            "59704714f557478cd779e80f548879440d48f0b7b15a53ea1caa6b29c2cafbaf",
            2,
            "00c82bae95bbcde5274f0769b260e136",
        ),
        (
            "d82a9134b26a565030fe69e2377f9847cdf90b160c648fb6b00d0d1bae85871f",
            2 << 32,
            "76322183ed8ff182f9596203690e5e01",
        ),
        (
            "0f6aeff8d3d2bb152583f73c1f012874cac6bc354d4a655490ae61cf7baebdccade494c54a29ae70",
            1,
            "9c0f152f55a2d8f0d67b8f9e2822bc41",
        ),
        (
            "8ad4ee102fbd81fff886ceac93c5adc6a01907c09df7bbdd5213b2b7f0ff11d8d608d0cd2eb1176f",
            2 << 32,
            "d4276a7f14913d65c860480287e33406",
        ),
        (
            "f8d476ffd646ee6c2384cb1c77d6195dfef1a9f37bbc8d21a79c21f8cb900289a845348ec8c5b5f126f50e76fefd1b1e",
            1,
            "bd06b8e1db98899ec498e491cf1c702b",
        ),
        (
            "fb7615b23d80891dd470980bc79584c8b2fb64ce6097878d17fce45a49e830b76e7817e72d5e12d46064047af12f9e0c",
            2 << 32,
            "5b908ec1abdd675f3d698a9553c89ce5",
        ),
    ];

    #[test]
    fn kernel_and_p1619_vectors() {
        // plain64be puts the sector number big-endian in the low 64 bits: the block index.
        let spec = CipherSpec::parse("aes-lrw-plain64be").unwrap();
        for (key, index, ct) in VECTORS {
            let key = hex::decode(key).unwrap();
            let c = new_sector_cipher(&spec, &key).unwrap();
            let mut b = b"0123456789ABCDEF".to_vec();
            c.encrypt(&mut b, *index, 16);
            assert_eq!(hex::encode(&b), *ct, "{}", hex::encode(&key));
            c.decrypt(&mut b, *index, 16);
            assert_eq!(&b, b"0123456789ABCDEF");
        }
    }

    #[test]
    fn running_tweaks_equal_direct_products_across_carries() {
        let key: Vec<u8> = (0..48u8)
            .map(|i| i.wrapping_mul(29).wrapping_add(5))
            .collect();
        let block = new_block_cipher("twofish", &key[..32]).unwrap();
        let k2 = u128::from_be_bytes(key[32..].try_into().unwrap());
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        for ivmode in ["plain64", "plain64be"] {
            let spec = CipherSpec::parse(&format!("twofish-lrw-{ivmode}")).unwrap();
            let c = new_sector_cipher(&spec, &key).unwrap();
            // plain64be near 2^64 makes the running index carry out of its low 64 bits.
            for sector in [0u64, 1, 0x00ff_ffff_ffff_ffff, u64::MAX - 3, u64::MAX] {
                let mut got = data.clone();
                c.encrypt(&mut got, sector, 4096);
                let first = match ivmode {
                    // The sector little-endian in the first 8 bytes of the big-endian index.
                    "plain64" => u128::from(sector.swap_bytes()) << 64,
                    _ => u128::from(sector),
                };
                for (j, (g, p)) in got.chunks(16).zip(data.chunks(16)).enumerate() {
                    let t = gf_mul(k2, first.wrapping_add(j as u128)).to_be_bytes();
                    let mut b = [<[u8; 16]>::try_from(p).unwrap()];
                    xor(&mut b[0], &t);
                    block.encrypt_blocks(&mut b);
                    xor(&mut b[0], &t);
                    assert_eq!(g, b[0], "{ivmode} sector {sector:#x} block {j}");
                }
                c.decrypt(&mut got, sector, 4096);
                assert!(got == data);
            }
        }
    }
}
