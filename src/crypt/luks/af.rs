//! The anti-forensic information splitter of LUKS (AFsplitter, Clemens Fruhwirth), exactly as
//! cryptsetup's `lib/luks1/af.c` does it: a key of `n` bytes becomes `stripes` blocks of `n`
//! bytes, all of which are needed to recover it, so wiping any one destroys the key.

use super::hash::LuksHash;
use super::{LuksError, VolumeKey};
use crate::crypt::secret::SecretBytes;
use zeroize::Zeroizing;

/// The hash for a LUKS hash name ("sha256", "sha1", "sha512", "ripemd160", "whirlpool", ...).
pub fn message_digest(hash: &str) -> Result<LuksHash, LuksError> {
    LuksHash::by_name(hash)
}

/// cryptsetup's `diffuse`: hash each digest-sized piece of `block` prefixed by its big-endian
/// index, truncating the hash of a final short piece, in place.
fn diffuse(block: &mut [u8], md: LuksHash) -> Result<(), LuksError> {
    let ds = md.size();
    let mut out = Zeroizing::new(vec![0u8; ds]);
    for (i, piece) in block.chunks_mut(ds).enumerate() {
        let len = piece.len();
        md.digest_into(&[&(i as u32).to_be_bytes(), piece], &mut out[..len])?;
        piece.copy_from_slice(&out[..len]);
    }
    Ok(())
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// Split `key` into `stripes` blocks (`key.len() * stripes` bytes), the first `stripes - 1`
/// random.
pub fn split(key: &[u8], stripes: u32, hash: &str) -> Result<SecretBytes, LuksError> {
    let md = message_digest(hash)?;
    let n = key.len();
    let stripes = stripes as usize;
    if stripes == 0 || n == 0 {
        return Err(LuksError::Invalid("AF split of an empty key".into()));
    }
    let mut out = SecretBytes::zeroed(n * stripes);
    let mut acc = SecretBytes::zeroed(n);
    getrandom::getrandom(&mut out[..n * (stripes - 1)])
        .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
    for i in 0..stripes - 1 {
        xor_into(&mut acc, &out[i * n..(i + 1) * n]);
        diffuse(&mut acc, md)?;
    }
    let last = &mut out[(stripes - 1) * n..];
    last.copy_from_slice(key);
    xor_into(last, &acc);
    Ok(out)
}

/// Recover a key of `key_len` bytes from `stripes` split blocks in `material`, into secret
/// memory.
pub fn merge(
    material: &[u8],
    key_len: usize,
    stripes: u32,
    hash: &str,
) -> Result<VolumeKey, LuksError> {
    let md = message_digest(hash)?;
    let stripes = stripes as usize;
    let total = key_len
        .checked_mul(stripes)
        .filter(|&t| t <= material.len() && stripes > 0 && key_len > 0)
        .ok_or_else(|| {
            LuksError::Invalid(format!(
                "AF material of {} bytes cannot hold {stripes} stripes of {key_len} bytes",
                material.len()
            ))
        })?;
    let material = &material[..total];
    let mut acc = VolumeKey::zeroed(key_len);
    for i in 0..stripes - 1 {
        xor_into(&mut acc, &material[i * key_len..(i + 1) * key_len]);
        diffuse(&mut acc, md)?;
    }
    xor_into(&mut acc, &material[(stripes - 1) * key_len..]);
    Ok(acc)
}

/// Bytes the split key occupies on disk, in whole 512-byte sectors (cryptsetup's
/// `AF_split_sectors`).
pub fn split_sectors_bytes(key_len: u64, stripes: u32) -> u64 {
    (key_len * stripes as u64).div_ceil(512) * 512
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_round_trips() {
        for (len, hash) in [(32, "sha256"), (64, "sha1"), (33, "sha512")] {
            let key: Vec<u8> = (0..len as u8).collect();
            let m = split(&key, 4000, hash).unwrap();
            assert_eq!(m.len(), len * 4000);
            assert_eq!(&merge(&m, len, 4000, hash).unwrap()[..], &key[..]);
            let mut bad = m.to_vec();
            bad[5] ^= 1;
            assert_ne!(&merge(&bad, len, 4000, hash).unwrap()[..], &key[..]);
        }
    }
}
