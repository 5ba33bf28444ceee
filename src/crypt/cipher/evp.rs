//! Sector ciphers on OpenSSL's EVP, one `EVP_CipherInit_ex` (new IV) + `EVP_CipherUpdate`
//! per sector: the fallback for XTS off VAES/AVX-512 machines, and the implementation of CBC.
//!
//! Keyed contexts are kept in a small pool (one per concurrently serving thread), so a
//! sector costs an IV reset and one update, never a key schedule; no thread hops.
//!
//! Our copy of the key is in secret memory; the contexts' key schedules are on OpenSSL's heap,
//! which we cannot lock or keep out of core dumps (OpenSSL frees them with OPENSSL_clear_free).

use super::iv::IvGen;
use super::sector::{check_buf, SectorCipher};
use super::spec::{CipherError, CipherSpec};
use crate::crypt::secret::SecretBytes;
use openssl::cipher::{Cipher, CipherRef};
use openssl::cipher_ctx::CipherCtx;
use std::cell::RefCell;
use std::sync::Mutex;
use zeroize::Zeroizing;

/// A dm-crypt sector cipher on OpenSSL.
pub(crate) struct EvpSectorCipher {
    cipher: &'static CipherRef,
    xts: bool,
    key: SecretBytes,
    iv: IvGen,
    enc: Mutex<Vec<CipherCtx>>,
    dec: Mutex<Vec<CipherCtx>>,
}

thread_local! {
    /// CBC input copy (EVP cannot run CBC in place through the safe API): reused per thread.
    static SCRATCH: RefCell<Zeroizing<Vec<u8>>> = RefCell::new(Zeroizing::new(Vec::new()));
}

impl EvpSectorCipher {
    /// `spec` validated and `key` of a valid size.
    pub(crate) fn new(spec: &CipherSpec, key: &[u8], iv: IvGen) -> Result<Self, CipherError> {
        let xts = spec.mode == "xts";
        let cipher = match (xts, key.len()) {
            (true, 32) => Cipher::aes_128_xts(),
            (true, 64) => Cipher::aes_256_xts(),
            (false, 16) => Cipher::aes_128_cbc(),
            (false, 24) => Cipher::aes_192_cbc(),
            (false, 32) => Cipher::aes_256_cbc(),
            _ => {
                spec.check_key_size(key.len())?;
                return Err(CipherError::Unsupported {
                    spec: spec.to_string(),
                    reason: format!("no OpenSSL cipher for a {}-bit key", key.len() * 8),
                });
            }
        };
        if xts {
            let (k1, k2) = key.split_at(key.len() / 2);
            if k1 == k2 {
                return Err(CipherError::BadKey {
                    spec: spec.to_string(),
                    reason:
                        "the two halves of the XTS key are identical (OpenSSL refuses such keys)"
                            .into(),
                });
            }
        }
        let c = EvpSectorCipher {
            cipher,
            xts,
            key: SecretBytes::from_slice(key),
            iv,
            enc: Mutex::new(Vec::new()),
            dec: Mutex::new(Vec::new()),
        };
        // Make one context of each direction now, so a refused key is an error here.
        let backend = |e: openssl::error::ErrorStack| CipherError::Backend {
            spec: spec.to_string(),
            reason: e.to_string(),
        };
        let e = c.new_ctx(false).map_err(backend)?;
        let d = c.new_ctx(true).map_err(backend)?;
        c.enc.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        c.dec.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        Ok(c)
    }

    fn new_ctx(&self, decrypt: bool) -> Result<CipherCtx, openssl::error::ErrorStack> {
        let mut ctx = CipherCtx::new()?;
        if decrypt {
            ctx.decrypt_init(Some(self.cipher), Some(&self.key), None)?;
        } else {
            ctx.encrypt_init(Some(self.cipher), Some(&self.key), None)?;
        }
        ctx.set_padding(false);
        Ok(ctx)
    }

    fn run(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize, decrypt: bool) {
        check_buf(buf.len(), sector_size);
        let pool = if decrypt { &self.dec } else { &self.enc };
        let ctx = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut ctx = match ctx {
            Some(c) => c,
            // The key was accepted by the contexts made in `new`, so only allocation can fail.
            None => self
                .new_ctx(decrypt)
                .expect("OpenSSL: cannot make a cipher context for an accepted key"),
        };
        for (i, sector) in buf.chunks_exact_mut(sector_size).enumerate() {
            let iv = self.iv.iv(iv_sector.wrapping_add(i as u64));
            let r = if decrypt {
                ctx.decrypt_init(None, None, Some(&iv))
            } else {
                ctx.encrypt_init(None, None, Some(&iv))
            };
            r.expect("OpenSSL: IV reset of a keyed context");
            if self.xts {
                // XTS is a stream-like mode for EVP (block size 1): in place, one data unit
                // per update.
                let n = ctx
                    .cipher_update_inplace(sector, sector_size)
                    .expect("OpenSSL: XTS update of a whole sector");
                debug_assert_eq!(n, sector_size);
            } else {
                ctx.set_padding(false);
                SCRATCH.with(|s| {
                    let mut s = s.borrow_mut();
                    s.clear();
                    s.extend_from_slice(sector);
                    // SAFETY: CBC with padding off, fresh after init, and an input that is a
                    // whole number of 16-byte blocks: EVP_CipherUpdate writes exactly
                    // `sector_size` bytes, which `sector` holds; input and output do not alias.
                    let n = unsafe { ctx.cipher_update_unchecked(&s, Some(sector)) }
                        .expect("OpenSSL: CBC update of a whole sector");
                    debug_assert_eq!(n, sector_size);
                });
            }
        }
        pool.lock().unwrap_or_else(|p| p.into_inner()).push(ctx);
    }
}

impl SectorCipher for EvpSectorCipher {
    fn encrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
        self.run(buf, iv_sector, sector_size, false)
    }
    fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize) {
        self.run(buf, iv_sector, sector_size, true)
    }
    fn key_size(&self) -> usize {
        self.key.len()
    }
    fn implementation(&self) -> &'static str {
        "openssl-evp"
    }
}
