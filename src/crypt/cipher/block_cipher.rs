//! 128-bit block ciphers by dm-crypt name ("aes", "serpent", "twofish"), keyed, with their key
//! schedules in secret memory: the primitive under the generic XTS, LRW, CBC and ESSIV code.
//!
//! AES is RustCrypto's (`aes` picks AES-NI at run time); serpent is ours ([`Serpent`],
//! bitsliced over AVX-512 or AVX2 lanes, RustCrypto's kept as the reference in tests);
//! twofish is ours ([`Twofish`], table-driven; sixteen blocks at once on AVX-512). All are
//! used through one small trait so a mode is written once.

use super::block::BlockCipher;
use super::serpent::Serpent;
use super::twofish::Twofish;
use crate::crypt::secret::SecretBox;
use cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, BlockSizeUser, KeyInit};

/// The block ciphers [`new_block_cipher`] knows, by dm-crypt name.
pub(crate) const NAMES: &[&str] = &["aes", "serpent", "twofish"];

/// Key sizes (bytes) the block cipher `name` takes, as the kernel's do (128, 192, 256 bits).
pub(crate) fn key_sizes(name: &str) -> &'static [usize] {
    match name {
        "aes" | "serpent" | "twofish" => &[16, 24, 32],
        _ => &[],
    }
}

/// A RustCrypto cipher whose key schedule lives in secret memory.
struct Keyed<C>(SecretBox<C>);

impl<C> BlockCipher for Keyed<C>
where
    C: BlockCipherEncrypt + BlockCipherDecrypt + BlockSizeUser<BlockSize = cipher::consts::U16>,
    C: Send + Sync,
{
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.0
            .encrypt_blocks(Array::cast_slice_from_core_mut(blocks));
    }
    fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.0
            .decrypt_blocks(Array::cast_slice_from_core_mut(blocks));
    }
}

fn keyed<C>(key: &[u8]) -> Option<Box<dyn BlockCipher>>
where
    C: KeyInit + BlockCipherEncrypt + BlockCipherDecrypt,
    C: BlockSizeUser<BlockSize = cipher::consts::U16> + Send + Sync + 'static,
{
    Some(Box::new(Keyed(SecretBox::new(
        C::new_from_slice(key).ok()?,
    ))))
}

/// The block cipher `name` keyed with `key`; `None` for an unknown name or a key size it does
/// not take.
pub(crate) fn new_block_cipher(name: &str, key: &[u8]) -> Option<Box<dyn BlockCipher>> {
    if !key_sizes(name).contains(&key.len()) {
        return None;
    }
    match (name, key.len()) {
        ("aes", 16) => keyed::<aes::Aes128>(key),
        ("aes", 24) => keyed::<aes::Aes192>(key),
        ("aes", 32) => keyed::<aes::Aes256>(key),
        ("serpent", _) => Some(Box::new(Serpent::new(key)?)),
        ("twofish", _) => Some(Box::new(Twofish::new(key)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(hex_text: &str) -> [u8; 16] {
        hex::decode(hex_text).unwrap().try_into().unwrap()
    }

    /// (cipher, key, plaintext, ciphertext) from the algorithms' published vectors.
    const VECTORS: &[(&str, &str, &str, &str)] = &[
        // FIPS-197 appendix C.1 and C.3.
        (
            "aes",
            "000102030405060708090a0b0c0d0e0f",
            "00112233445566778899aabbccddeeff",
            "69c4e0d86a7b0430d8cdb78070b4c55a",
        ),
        (
            "aes",
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
            "00112233445566778899aabbccddeeff",
            "8ea2b7ca516745bfeafc49904b496089",
        ),
        // Serpent: NESSIE set 1 vector 0, and Bouncy Castle's vectors for 128-, 192- and
        // 256-bit keys, which are printed in the reversed byte order (the kernel's "tnepres"):
        // key, plaintext and ciphertext reversed here into the kernel's "serpent" order.
        (
            "serpent",
            "80000000000000000000000000000000",
            "00000000000000000000000000000000",
            "264e5481eff42a4606abda06c0bfda3d",
        ),
        (
            "serpent",
            "00000000000000000000000000000000",
            "00000000000000000000000000000080",
            "4ae9a20b2b14a10290cbb820b7ffb510",
        ),
        (
            "serpent",
            "000000000000000000000000000000000000000000000000",
            "00000000000000000000000000000040",
            "9668f388dd4f122a4d9dd8d6b8a322d5",
        ),
        (
            "serpent",
            "0000000000000000000000000000000000000000000000000000000000000000",
            "00000000000000000000000000000000",
            "49672ba898d98df95019180445491089",
        ),
        // The Twofish paper's test vectors (ECB_TBL.TXT, first entry per key size).
        (
            "twofish",
            "00000000000000000000000000000000",
            "00000000000000000000000000000000",
            "9f589f5cf6122c32b6bfec2f2ae8c35a",
        ),
        (
            "twofish",
            "0123456789abcdeffedcba98765432100011223344556677",
            "00000000000000000000000000000000",
            "cfd1d2e5a9be9cdf501f13b892bd2248",
        ),
        (
            "twofish",
            "0123456789abcdeffedcba987654321000112233445566778899aabbccddeeff",
            "00000000000000000000000000000000",
            "37527be0052334b89f0cfccae87cfa20",
        ),
    ];

    /// Every backend of `name` this CPU runs, keyed with `key`.
    fn every_backend(name: &str, key: &[u8]) -> Vec<Box<dyn BlockCipher>> {
        use super::super::{serpent, twofish};
        let mut v: Vec<Box<dyn BlockCipher>> = vec![new_block_cipher(name, key).unwrap()];
        if name == "serpent" {
            for b in [
                serpent::Backend::Scalar,
                serpent::Backend::Avx2,
                serpent::Backend::Avx512,
            ] {
                v.extend(Serpent::with_backend(key, b).map(|c| Box::new(c) as _));
            }
        } else if name == "twofish" {
            for b in [
                twofish::Backend::Portable,
                twofish::Backend::Gather,
                twofish::Backend::Vbmi,
            ] {
                v.extend(Twofish::with_backend(key, b).map(|c| Box::new(c) as _));
            }
        }
        v
    }

    /// The vectors on every backend, as a run of 35 copies (so the sixteen- and eight-block
    /// paths and the one-block tail all see them).
    #[test]
    fn published_vectors() {
        for (name, key, pt, ct) in VECTORS {
            for c in every_backend(name, &hex::decode(key).unwrap()) {
                let imp = c.implementation();
                let mut b = vec![block(pt); 35];
                c.encrypt_blocks(&mut b);
                for x in &b {
                    assert_eq!(hex::encode(x), *ct, "{name} {key} {imp}");
                }
                c.decrypt_blocks(&mut b);
                for x in &b {
                    assert_eq!(hex::encode(x), *pt, "{name} {key} {imp}");
                }
            }
        }
    }

    #[test]
    fn refuses_unknown_names_and_key_sizes() {
        assert!(new_block_cipher("des", &[0; 8]).is_none());
        for name in NAMES {
            assert!(new_block_cipher(name, &[0; 20]).is_none(), "{name}");
            assert!(new_block_cipher(name, &[0; 64]).is_none(), "{name}");
        }
    }
}
