//! IV generators, exactly as dm-crypt computes them (`crypt_iv_*_gen` in
//! `drivers/md/dm-crypt.c`), for 16-byte (AES) IVs. `sector` is dm-crypt's `iv_sector`.

use super::cipher::{CipherError, CipherSpec};
use openssl::cipher::Cipher;
use openssl::cipher_ctx::CipherCtx;
use std::sync::Mutex;

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
    /// The plain64 IV encrypted with AES keyed by HASH(volume key).
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

/// ESSIV: one AES block encryption of the plain64 IV with the salt key HASH(volume key).
pub(crate) struct Essiv {
    #[cfg(target_arch = "x86_64")]
    aesni: Option<super::aes_x86::AesBlock>,
    /// OpenSSL AES-ECB contexts (keyed), used when AES-NI is missing.
    pool: Mutex<Vec<CipherCtx>>,
    salt: zeroize::Zeroizing<Vec<u8>>,
}

impl Essiv {
    fn new(spec: &CipherSpec, key: &[u8]) -> Result<Essiv, CipherError> {
        use sha2::Digest;
        let salt: Vec<u8> = match spec.iv_opt.as_deref() {
            Some("sha256") => sha2::Sha256::digest(key).to_vec(),
            Some("sha512") => sha2::Sha512::digest(key).to_vec(),
            Some("sha1") => sha1::Sha1::digest(key).to_vec(),
            other => {
                return Err(CipherError::Unsupported {
                    spec: spec.to_string(),
                    reason: format!("essiv hash {other:?} is not supported"),
                })
            }
        };
        let salt = zeroize::Zeroizing::new(salt);
        // The ESSIV cipher is the data cipher (AES) keyed with the digest; AES takes at most
        // 256 bits, so a longer digest is refused, as the kernel does.
        if !matches!(salt.len(), 16 | 24 | 32) {
            return Err(CipherError::Unsupported {
                spec: spec.to_string(),
                reason: format!(
                    "essiv digest of {} bits is not a valid AES key size",
                    salt.len() * 8
                ),
            });
        }
        Ok(Essiv {
            #[cfg(target_arch = "x86_64")]
            aesni: super::aes_x86::AesBlock::new(&salt),
            pool: Mutex::new(Vec::new()),
            salt,
        })
    }

    fn encrypt_block(&self, block: &mut [u8; 16]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(a) = &self.aesni {
            a.encrypt(block);
            return;
        }
        let ctx = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut ctx = match ctx {
            Some(c) => c,
            None => {
                let cipher = match self.salt.len() {
                    16 => Cipher::aes_128_ecb(),
                    24 => Cipher::aes_192_ecb(),
                    _ => Cipher::aes_256_ecb(),
                };
                let mut c = CipherCtx::new().expect("OpenSSL: cannot allocate a cipher context");
                c.encrypt_init(Some(cipher), Some(&self.salt), None)
                    .expect("OpenSSL: AES-ECB init with a valid key size");
                c.set_padding(false);
                c
            }
        };
        let mut out = [0u8; 32];
        let n = ctx
            .cipher_update(&block[..], Some(&mut out))
            .expect("OpenSSL: AES-ECB of one block");
        debug_assert_eq!(n, 16);
        block.copy_from_slice(&out[..16]);
        zeroize::Zeroize::zeroize(&mut out);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ctx);
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
}
