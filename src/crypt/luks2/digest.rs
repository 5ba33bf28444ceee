//! The volume key digest: PBKDF2 of the volume key, which tells a right passphrase (the
//! keyslot yields the volume key) from a wrong one (it yields noise).

use super::json::Digest;
use crate::crypt::luks::kdf::{benchmark_pbkdf2, pbkdf2, MIN_PBKDF2_ITERATIONS};
use crate::crypt::luks::{LuksError, SALT_SIZE};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// Whether `key` is the volume key `d` checks; compared in constant time. A digest that cannot
/// check anything is an error, never a match.
pub fn verify(d: &Digest, key: &[u8]) -> Result<bool, LuksError> {
    if let Some(p) = &d.problem {
        return Err(LuksError::Unsupported(format!("volume key digest: {p}")));
    }
    let mut out = Zeroizing::new(vec![0u8; d.digest.len()]);
    pbkdf2(&d.hash, key, &d.salt, d.iterations, &mut out)?;
    Ok(bool::from(out.ct_eq(&d.digest)))
}

/// A new digest of `key` for keyslot and segment 0, like cryptsetup's: a random 32-byte salt,
/// a digest as long as `hash`'s output, and iterations for 125 ms (at least 1000), or exactly
/// 1000 when `benchmark` is false (cryptsetup does that when iterations are forced).
pub fn create(key: &[u8], hash: &str, benchmark: bool) -> Result<Digest, LuksError> {
    let len = crate::crypt::luks::af::message_digest(hash)?.size();
    let iterations = if benchmark {
        benchmark_pbkdf2(hash, key.len(), 125)?
    } else {
        MIN_PBKDF2_ITERATIONS
    };
    let mut salt = vec![0u8; SALT_SIZE];
    getrandom::getrandom(&mut salt)
        .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
    let mut digest = vec![0u8; len];
    pbkdf2(hash, key, &salt, iterations, &mut digest)?;
    Ok(Digest {
        kind: "pbkdf2".into(),
        keyslots: Vec::new(),
        segments: vec![0],
        hash: hash.to_string(),
        iterations,
        salt,
        digest,
        raw: Default::default(),
        problem: None,
    })
}
