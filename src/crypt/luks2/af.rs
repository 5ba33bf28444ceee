//! The anti-forensic information splitter of LUKS (AFsplitter, Clemens Fruhwirth), exactly as
//! cryptsetup's `lib/luks1/af.c` does it: a key of `n` bytes becomes `stripes` blocks of `n`
//! bytes, all of which are needed to recover it, so wiping any one destroys the key.

use super::LuksError;
use openssl::hash::{Hasher, MessageDigest};
use zeroize::Zeroizing;

/// The OpenSSL digest for a LUKS hash name ("sha256", "sha1", "sha512", "ripemd160", ...).
pub fn message_digest(hash: &str) -> Result<MessageDigest, LuksError> {
    MessageDigest::from_name(&hash.to_ascii_lowercase())
        .ok_or_else(|| LuksError::Unsupported(format!("hash algorithm {hash:?}")))
}

/// cryptsetup's `diffuse`: hash each digest-sized piece of `block` prefixed by its big-endian
/// index, truncating the hash of a final short piece, in place.
fn diffuse(block: &mut [u8], md: MessageDigest) -> Result<(), LuksError> {
    let ds = md.size();
    for (i, piece) in block.chunks_mut(ds).enumerate() {
        let mut h = Hasher::new(md).map_err(crypto_err)?;
        h.update(&(i as u32).to_be_bytes()).map_err(crypto_err)?;
        h.update(piece).map_err(crypto_err)?;
        let out = h.finish().map_err(crypto_err)?;
        let len = piece.len();
        piece.copy_from_slice(&out[..len]);
    }
    Ok(())
}

fn crypto_err(e: openssl::error::ErrorStack) -> LuksError {
    LuksError::Crypto(e.to_string())
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// Split `key` into `stripes` blocks (`key.len() * stripes` bytes), the first `stripes - 1`
/// random.
pub fn split(key: &[u8], stripes: u32, hash: &str) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let md = message_digest(hash)?;
    let n = key.len();
    let stripes = stripes as usize;
    if stripes == 0 || n == 0 {
        return Err(LuksError::Invalid("AF split of an empty key".into()));
    }
    let mut out = Zeroizing::new(vec![0u8; n * stripes]);
    let mut acc = Zeroizing::new(vec![0u8; n]);
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

/// Recover a key of `key_len` bytes from `stripes` split blocks in `material`.
pub fn merge(
    material: &[u8],
    key_len: usize,
    stripes: u32,
    hash: &str,
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
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
    let mut acc = Zeroizing::new(vec![0u8; key_len]);
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
