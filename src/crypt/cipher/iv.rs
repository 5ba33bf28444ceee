//! IV generators, exactly as dm-crypt computes them (`crypt_iv_*_gen` in
//! `drivers/md/dm-crypt.c`), for 16-byte IVs (128-bit block ciphers). `sector` is dm-crypt's
//! `iv_sector`.

use super::block::BlockCipher;
use super::block_cipher::new_block_cipher;
use super::spec::{CipherError, CipherSpec};
use crate::crypt::secret::SecretBytes;
use zeroize::Zeroize;

/// How the 16-byte IV of a sector is made.
pub(crate) enum IvGen {
    /// Little-endian 32-bit sector number (truncated), rest zero.
    Plain,
    /// Little-endian 64-bit sector number, rest zero.
    Plain64,
    /// Big-endian 64-bit sector number in the last 8 bytes, rest zero.
    Plain64Be,
    /// Big-endian 64-bit `(sector << 5) + 1` (1-based count of 16-byte blocks) in the last 8
    /// bytes, rest zero.
    Benbi,
    /// All zero.
    Null,
    /// The plain64 IV encrypted with the data's block cipher keyed by HASH(volume key).
    Essiv(Box<Essiv>),
}

impl IvGen {
    /// The generator for `spec` (already validated) and volume `key`.
    pub(crate) fn new(spec: &CipherSpec, key: &[u8]) -> Result<IvGen, CipherError> {
        Ok(match spec.iv.as_str() {
            "plain" => IvGen::Plain,
            "plain64" => IvGen::Plain64,
            "plain64be" => IvGen::Plain64Be,
            "benbi" => IvGen::Benbi,
            "null" => IvGen::Null,
            "essiv" => IvGen::Essiv(Box::new(Essiv::new(spec, key)?)),
            other => {
                return Err(CipherError::Unsupported {
                    spec: spec.to_string(),
                    reason: format!("IV mode '{other}' is not supported"),
                })
            }
        })
    }

    /// Whether the IV is the plain64 one (the fast path inlines it).
    pub(crate) fn is_plain64(&self) -> bool {
        matches!(self, IvGen::Plain64)
    }

    /// The IV of `sector`.
    pub(crate) fn iv(&self, sector: u64) -> [u8; 16] {
        let mut iv = [0u8; 16];
        match self {
            IvGen::Plain => iv[..4].copy_from_slice(&(sector as u32).to_le_bytes()),
            IvGen::Plain64 => iv[..8].copy_from_slice(&sector.to_le_bytes()),
            IvGen::Plain64Be => iv[8..].copy_from_slice(&sector.to_be_bytes()),
            IvGen::Benbi => {
                iv[8..].copy_from_slice(&(sector << 5).wrapping_add(1).to_be_bytes());
            }
            IvGen::Null => {}
            IvGen::Essiv(e) => {
                iv[..8].copy_from_slice(&sector.to_le_bytes());
                e.encrypt_block(&mut iv);
            }
        }
        iv
    }
}

/// HASH(`key`) for the ESSIV hash `name`, in secret memory; `None` for an unknown hash.
fn essiv_digest(name: &str, key: &[u8]) -> Option<SecretBytes> {
    fn keep(mut d: impl AsMut<[u8]>, len: usize) -> SecretBytes {
        let s = SecretBytes::from_slice(&d.as_mut()[..len]);
        d.as_mut().zeroize();
        s
    }
    use sha2::Digest as _;
    use whirlpool::Digest as _;
    Some(match name {
        "sha1" => keep(sha1::Sha1::digest(key), 20),
        "sha224" => keep(sha2::Sha224::digest(key), 28),
        "sha256" => keep(sha2::Sha256::digest(key), 32),
        "sha384" => keep(sha2::Sha384::digest(key), 48),
        "sha512" => keep(sha2::Sha512::digest(key), 64),
        "wp256" => keep(whirlpool::Whirlpool::digest(key), 32),
        "wp384" => keep(whirlpool::Whirlpool::digest(key), 48),
        "wp512" => keep(whirlpool::Whirlpool::digest(key), 64),
        _ => return None,
    })
}

/// ESSIV: the plain64 IV encrypted with the data's block cipher keyed by HASH(volume key).
pub(crate) struct Essiv {
    /// AES with AES-NI, called directly (one block per sector).
    #[cfg(target_arch = "x86_64")]
    aesni: Option<super::aes_x86::AesNiEncryptor>,
    cipher: Box<dyn BlockCipher>,
}

impl Essiv {
    fn new(spec: &CipherSpec, key: &[u8]) -> Result<Essiv, CipherError> {
        let hash = spec.iv_opt.as_deref().unwrap_or("");
        let salt = essiv_digest(hash, key).ok_or_else(|| CipherError::Unsupported {
            spec: spec.to_string(),
            reason: format!("essiv hash {hash:?} is not supported"),
        })?;
        // The ESSIV cipher takes the whole digest as its key, so the digest size must be a
        // key size of the cipher (sha512 cannot key AES), as the kernel requires.
        let cipher =
            new_block_cipher(&spec.cipher, &salt).ok_or_else(|| CipherError::Unsupported {
                spec: spec.to_string(),
                reason: format!(
                    "an essiv digest of {} bits is not a valid {} key size",
                    salt.len() * 8,
                    spec.cipher
                ),
            })?;
        Ok(Essiv {
            #[cfg(target_arch = "x86_64")]
            aesni: (spec.cipher == "aes")
                .then(|| super::aes_x86::AesNiEncryptor::new(&salt))
                .flatten(),
            cipher,
        })
    }

    fn encrypt_block(&self, block: &mut [u8; 16]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(a) = &self.aesni {
            a.encrypt(block);
            return;
        }
        self.cipher.encrypt_blocks(std::slice::from_mut(block));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_layouts() {
        let s = 0x1122_3344_5566_7788u64;
        let mut want = [0u8; 16];
        want[..4].copy_from_slice(&[0x88, 0x77, 0x66, 0x55]);
        assert_eq!(IvGen::Plain.iv(s), want);
        want[4..8].copy_from_slice(&[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(IvGen::Plain64.iv(s), want);
        let mut be = [0u8; 16];
        be[8..].copy_from_slice(&s.to_be_bytes());
        assert_eq!(IvGen::Plain64Be.iv(s), be);
        let mut benbi = [0u8; 16];
        benbi[15] = 1;
        assert_eq!(IvGen::Benbi.iv(0), benbi);
        benbi[15] = 0x21; // (1 << 5) + 1
        assert_eq!(IvGen::Benbi.iv(1), benbi);
        assert_eq!(IvGen::Null.iv(s), [0u8; 16]);
    }

    #[test]
    fn essiv_is_aes_of_plain64_under_the_key_digest() {
        use sha2::Digest;
        let key = [7u8; 32];
        let spec = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        let g = IvGen::new(&spec, &key).unwrap();
        let salt = sha2::Sha256::digest(key);
        for sector in [0u64, 1, 12345, u64::MAX] {
            let mut plain = [0u8; 16];
            plain[..8].copy_from_slice(&sector.to_le_bytes());
            let mut c = openssl::symm::Crypter::new(
                openssl::symm::Cipher::aes_256_ecb(),
                openssl::symm::Mode::Encrypt,
                &salt,
                None,
            )
            .unwrap();
            c.pad(false);
            let mut out = [0u8; 32];
            c.update(&plain, &mut out).unwrap();
            assert_eq!(g.iv(sector), out[..16], "sector {sector}");
        }
    }

    #[test]
    fn essiv_with_whirlpool_and_other_ciphers() {
        use whirlpool::Digest;
        // ISO/IEC 10118-3 Whirlpool of "abc", the first 32 bytes keying wp256's ESSIV.
        assert_eq!(
            hex::encode(whirlpool::Whirlpool::digest(b"abc")),
            "4e2448a4c6f486bb16b6562c73b4020bf3043e3a731bce721ae1b303d97e6d4c\
             7181eebdb6c57e277d0e34957114cbd6c797fc9d95d8b582d225292076d4eef5"
        );
        let key = [9u8; 32];
        let digest = whirlpool::Whirlpool::digest(key);
        for cipher in ["aes", "serpent", "twofish"] {
            let spec = CipherSpec::parse(&format!("{cipher}-cbc-essiv:wp256")).unwrap();
            let g = IvGen::new(&spec, &key).unwrap();
            let c = new_block_cipher(cipher, &digest[..32]).unwrap();
            let mut want = [[0u8; 16]];
            want[0][..8].copy_from_slice(&77u64.to_le_bytes());
            c.encrypt_blocks(&mut want);
            assert_eq!(g.iv(77), want[0], "{cipher}");
        }
        let e = IvGen::new(
            &CipherSpec::parse("serpent-cbc-essiv:sha512").unwrap(),
            &key,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("512 bits is not a valid serpent key size"),
            "{e}"
        );
    }
}
