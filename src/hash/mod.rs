//! Hash primitives, in one place: the algorithms the on-disk formats name, and a batch
//! interface that hashes many equal-sized blocks at once so a fast multi-buffer
//! implementation can serve the hash-tree builders and verifiers.

/// The largest digest any supported algorithm produces.
pub const MAX_DIGEST_SIZE: usize = 64;

/// A hash algorithm named by an on-disk format ("sha256", ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HashAlgorithm {
    /// SHA-1 (legacy dm-verity images).
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-512.
    Sha512,
}

impl HashAlgorithm {
    /// Parse a name as cryptsetup spells it (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sha1" => Some(HashAlgorithm::Sha1),
            "sha256" => Some(HashAlgorithm::Sha256),
            "sha512" => Some(HashAlgorithm::Sha512),
            _ => None,
        }
    }

    /// The name as cryptsetup writes it.
    pub fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Sha1 => "sha1",
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Sha512 => "sha512",
        }
    }

    /// Digest size in bytes.
    pub fn digest_size(self) -> usize {
        match self {
            HashAlgorithm::Sha1 => 20,
            HashAlgorithm::Sha256 => 32,
            HashAlgorithm::Sha512 => 64,
        }
    }

    /// Hash the concatenation of `parts` into `out` (which must be `digest_size` long).
    pub fn hash_parts(self, parts: &[&[u8]], out: &mut [u8]) {
        match self {
            HashAlgorithm::Sha1 => digest_into::<sha1::Sha1>(parts, out),
            HashAlgorithm::Sha256 => digest_into::<sha2::Sha256>(parts, out),
            HashAlgorithm::Sha512 => digest_into::<sha2::Sha512>(parts, out),
        }
    }

    /// Hash the concatenation of `parts`, returning the digest.
    pub fn hash(self, parts: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![0u8; self.digest_size()];
        self.hash_parts(parts, &mut out);
        out
    }
}

impl std::fmt::Display for HashAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn digest_into<D: sha2::Digest>(parts: &[&[u8]], out: &mut [u8]) {
    let mut h = D::new();
    for p in parts {
        h.update(p);
    }
    out.copy_from_slice(&h.finalize());
}

/// Hash every `block_size` block of `blocks` as `H(prefix || block || suffix)`, writing the
/// digests one after another into `out` (`blocks.len() / block_size * digest_size` bytes).
///
/// This is the hot loop of every hash tree: the blocks are independent, so an implementation
/// may hash several at once in SIMD lanes. The result is always identical to
/// [`HashAlgorithm::hash_parts`] on each block.
pub fn hash_blocks(
    alg: HashAlgorithm,
    prefix: &[u8],
    suffix: &[u8],
    blocks: &[u8],
    block_size: usize,
    out: &mut [u8],
) {
    assert!(block_size > 0 && blocks.len() % block_size == 0);
    let ds = alg.digest_size();
    assert_eq!(out.len(), blocks.len() / block_size * ds);
    for (block, digest) in blocks
        .chunks_exact(block_size)
        .zip(out.chunks_exact_mut(ds))
    {
        alg.hash_parts(&[prefix, block, suffix], digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        assert_eq!(
            hex::encode(HashAlgorithm::Sha256.hash(&[b"abc"])),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex::encode(HashAlgorithm::Sha1.hash(&[b"a", b"bc"])),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            HashAlgorithm::from_name("SHA512"),
            Some(HashAlgorithm::Sha512)
        );
        assert_eq!(HashAlgorithm::from_name("md5"), None);
    }
}
