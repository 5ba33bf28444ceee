//! Hash functions by their LUKS names ("sha256", "sha1", "whirlpool", "ripemd160", ...): the
//! PBKDF2 PRF, the AF splitter's diffusion and the volume key digest of LUKS1 and LUKS2.
//!
//! OpenSSL computes every hash it can; Whirlpool, which OpenSSL 3 moved to its legacy provider
//! (not loaded here), is RustCrypto's `whirlpool` with `hmac` and `pbkdf2`. Names are resolved
//! and tried once up front, so an unavailable hash is an error naming it, not an OpenSSL error
//! stack in the middle of unlocking.

use super::LuksError;
use openssl::hash::{Hasher, MessageDigest};

/// A hash function LUKS metadata can name.
#[derive(Clone, Copy)]
pub enum LuksHash {
    /// Computed by OpenSSL.
    OpenSsl(MessageDigest),
    /// Whirlpool (512 bits), computed by RustCrypto.
    Whirlpool,
}

impl std::fmt::Debug for LuksHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LuksHash::OpenSsl(md) => write!(f, "OpenSsl({:?})", md.type_().long_name()),
            LuksHash::Whirlpool => write!(f, "Whirlpool"),
        }
    }
}

fn crypto_err(e: openssl::error::ErrorStack) -> LuksError {
    LuksError::Crypto(e.to_string())
}

/// The RustCrypto twin of an OpenSSL digest, for the short hashes of the AF splitter's
/// diffusion: 8000 of them per 4000-stripe keyslot of a 512-bit key, where OpenSSL's
/// per-context setup (a provider fetch, locks, allocations) cost more than the hashing. A
/// 1 GiB re-key spent 23 ms before its first hotzone with OpenSSL's, 15 ms with these.
fn native(md: MessageDigest) -> Option<crate::hash::HashAlgorithm> {
    use crate::hash::HashAlgorithm;
    use openssl::nid::Nid;
    match md.type_() {
        Nid::SHA1 => Some(HashAlgorithm::Sha1),
        Nid::SHA256 => Some(HashAlgorithm::Sha256),
        Nid::SHA512 => Some(HashAlgorithm::Sha512),
        _ => None,
    }
}

impl LuksHash {
    /// The hash LUKS calls `name` (case-insensitive), if this build can compute it.
    pub fn by_name(name: &str) -> Result<LuksHash, LuksError> {
        let lower = name.to_ascii_lowercase();
        if lower == "whirlpool" {
            return Ok(LuksHash::Whirlpool);
        }
        let unsupported = || LuksError::Unsupported(format!("hash algorithm {name:?}"));
        let md = MessageDigest::from_name(&lower).ok_or_else(unsupported)?;
        // OpenSSL 3 knows the names of algorithms whose provider is not loaded: try it.
        Hasher::new(md)
            .and_then(|mut h| h.finish())
            .map_err(|_| unsupported())?;
        Ok(LuksHash::OpenSsl(md))
    }

    /// Output size in bytes.
    pub fn size(&self) -> usize {
        match self {
            LuksHash::OpenSsl(md) => md.size(),
            LuksHash::Whirlpool => 64,
        }
    }

    /// The hash of the concatenation of `parts`, into `out` (at most [`size`](Self::size)
    /// bytes: a longer digest is cut, as the AF splitter does for its last piece).
    pub fn digest_into(&self, parts: &[&[u8]], out: &mut [u8]) -> Result<(), LuksError> {
        match self {
            LuksHash::OpenSsl(md) => match native(*md) {
                Some(alg) => {
                    let mut d = zeroize::Zeroizing::new([0u8; crate::hash::MAX_DIGEST_SIZE]);
                    alg.hash_parts(parts, &mut d[..alg.digest_size()]);
                    out.copy_from_slice(&d[..out.len()]);
                }
                None => {
                    let mut h = Hasher::new(*md).map_err(crypto_err)?;
                    for p in parts {
                        h.update(p).map_err(crypto_err)?;
                    }
                    let d = h.finish().map_err(crypto_err)?;
                    out.copy_from_slice(&d[..out.len()]);
                }
            },
            LuksHash::Whirlpool => {
                use whirlpool::Digest;
                let mut h = whirlpool::Whirlpool::new();
                for p in parts {
                    h.update(p);
                }
                let mut d = h.finalize();
                out.copy_from_slice(&d[..out.len()]);
                zeroize::Zeroize::zeroize(&mut d[..]);
            }
        }
        Ok(())
    }

    /// PBKDF2 with HMAC over this hash.
    pub fn pbkdf2(
        &self,
        passphrase: &[u8],
        salt: &[u8],
        iterations: u32,
        out: &mut [u8],
    ) -> Result<(), LuksError> {
        match self {
            LuksHash::OpenSsl(md) => {
                openssl::pkcs5::pbkdf2_hmac(passphrase, salt, iterations as usize, *md, out)
                    .map_err(crypto_err)
            }
            LuksHash::Whirlpool => {
                pbkdf2::pbkdf2_hmac::<whirlpool::Whirlpool>(passphrase, salt, iterations, out);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whirlpool_without_openssls_legacy_provider() {
        let h = LuksHash::by_name("Whirlpool").unwrap();
        assert_eq!(h.size(), 64);
        let mut d = [0u8; 64];
        h.digest_into(&[b"a", b"bc"], &mut d).unwrap();
        // ISO/IEC 10118-3 test vector: Whirlpool("abc").
        assert_eq!(
            hex::encode(d),
            "4e2448a4c6f486bb16b6562c73b4020bf3043e3a731bce721ae1b303d97e6d4c\
             7181eebdb6c57e277d0e34957114cbd6c797fc9d95d8b582d225292076d4eef5"
        );
        // PBKDF2-HMAC-Whirlpool against the generic HMAC construction (RFC 2104) for one
        // iteration: U1 = HMAC(P, S || INT(1)).
        let mut k = [0u8; 64];
        h.pbkdf2(b"password", b"salt", 1, &mut k).unwrap();
        let mut block = [0u8; 64];
        block[..8].copy_from_slice(b"password");
        let (mut ipad, mut opad) = ([0x36u8; 64], [0x5cu8; 64]);
        for i in 0..64 {
            ipad[i] ^= block[i];
            opad[i] ^= block[i];
        }
        let mut inner = [0u8; 64];
        h.digest_into(&[&ipad, b"salt", &[0, 0, 0, 1]], &mut inner)
            .unwrap();
        let mut outer = [0u8; 64];
        h.digest_into(&[&opad, &inner], &mut outer).unwrap();
        assert_eq!(k, outer);
    }

    #[test]
    fn sha_digests_match_openssl_at_every_cut() {
        for name in ["sha1", "sha256", "sha512", "ripemd160"] {
            let h = LuksHash::by_name(name).unwrap();
            let md = MessageDigest::from_name(name).unwrap();
            for len in [0usize, 1, 55, 56, 64, 100, 1000] {
                let data: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
                let (a, b) = data.split_at(len / 3);
                let want = openssl::hash::hash(md, &data).unwrap();
                for cut in [1, h.size() / 2, h.size()] {
                    let mut got = vec![0u8; cut];
                    h.digest_into(&[a, b], &mut got).unwrap();
                    assert_eq!(got, want[..cut], "{name}, {len} bytes, cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn openssl_hashes_and_unknown_names() {
        let h = LuksHash::by_name("SHA256").unwrap();
        let mut out = [0u8; 20];
        h.pbkdf2(b"password", b"salt", 2, &mut out[..]).unwrap();
        let sha1 = LuksHash::by_name("sha1").unwrap();
        sha1.pbkdf2(b"password", b"salt", 2, &mut out).unwrap();
        // RFC 6070.
        assert_eq!(hex::encode(out), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
        let e = LuksHash::by_name("no-such-hash").unwrap_err().to_string();
        assert_eq!(e, "unsupported hash algorithm \"no-such-hash\"");
    }
}
