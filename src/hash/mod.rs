//! Hash primitives, in one place: the algorithms the on-disk formats name, and a batch
//! interface that hashes many equal-sized blocks at once so a fast multi-buffer
//! implementation can serve the hash-tree builders and verifiers.

mod hmac512;
mod md;
mod sha256_lanes;
mod sha256_mb;
mod sha256_shani;

pub use hmac512::HmacSha512State;
pub use sha256_lanes::HmacState as HmacSha256State;

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
///
/// SHA-256 batches of two or more blocks run multi-buffer where the CPU allows it (see
/// [`sha256_backend`]); everything else goes through the `sha2`/`sha1` crates one block at
/// a time (a prefix of 64 bytes or more is then absorbed only once per call).
pub fn hash_blocks(
    alg: HashAlgorithm,
    prefix: &[u8],
    suffix: &[u8],
    blocks: &[u8],
    block_size: usize,
    out: &mut [u8],
) {
    assert!(block_size > 0 && blocks.len().is_multiple_of(block_size));
    let ds = alg.digest_size();
    assert_eq!(out.len(), blocks.len() / block_size * ds);
    match alg {
        // A lone block would leave all lanes but one idle: a multi-buffer kernel is slower
        // than `sha2` there.
        HashAlgorithm::Sha256 if out.len() >= 2 * ds && sha256_mb::available() => {
            sha256_mb::hash_blocks(prefix, suffix, blocks, block_size, out)
        }
        HashAlgorithm::Sha256 => {
            scalar_blocks::<sha2::Sha256>(prefix, suffix, blocks, block_size, out)
        }
        HashAlgorithm::Sha512 => {
            scalar_blocks::<sha2::Sha512>(prefix, suffix, blocks, block_size, out)
        }
        HashAlgorithm::Sha1 => scalar_blocks::<sha1::Sha1>(prefix, suffix, blocks, block_size, out),
    }
}

/// SHA-256 of every `block_size` block of `blocks`, each with its own prefix:
/// digest `i` is `SHA-256(prefixes[i*prefix_len..][..prefix_len] || block i)`, written to
/// `out[32*i..]`. dm-integrity hashes each sector behind its own sector number; this is its
/// batch, multi-buffer where [`hash_blocks`] is.
pub fn sha256_prefixed_blocks(
    prefixes: &[u8],
    prefix_len: usize,
    blocks: &[u8],
    block_size: usize,
    out: &mut [u8],
) {
    assert!(block_size > 0 && blocks.len().is_multiple_of(block_size));
    let n = blocks.len() / block_size;
    assert_eq!(prefixes.len(), n * prefix_len);
    assert_eq!(out.len(), n * 32);
    if prefix_len == 0 {
        return hash_blocks(HashAlgorithm::Sha256, &[], &[], blocks, block_size, out);
    }
    // The lane engine takes each message's own prefix as it comes; `tape-sha256` is built
    // for a prefix shared by the batch (a salt), and with a different one per message (a
    // sector number) it cost dm-integrity's SHA-256 tags more CPU per GB than the lane
    // engine's HMAC tags, which hash one more block per sector.
    if prefix_len < 64 && n >= 2 && sha256_lanes::backend() != "sha2" {
        sha256_lanes::hash(
            &sha256_lanes::Batch {
                start: &sha256_lanes::IV,
                absorbed: 0,
                prefixes,
                prefix_len,
                bodies: blocks,
                body_len: block_size,
                outer: None,
            },
            out,
        );
        return;
    }
    if n >= 2 && sha256_mb::available() {
        sha256_mb::hash_prefixed_blocks(prefixes, prefix_len, blocks, block_size, out);
        return;
    }
    use sha2::Digest;
    for (i, (block, digest)) in blocks
        .chunks_exact(block_size)
        .zip(out.chunks_exact_mut(32))
        .enumerate()
    {
        let mut h = sha2::Sha256::new();
        h.update(&prefixes[i * prefix_len..(i + 1) * prefix_len]);
        h.update(block);
        digest.copy_from_slice(&h.finalize());
    }
}

/// HMAC-SHA-256 of every `block_size` block of `blocks`, each behind its own message prefix:
/// tag `i` is `HMAC(key, prefixes[i*prefix_len..][..prefix_len] || block i)`, written to
/// `out[32*i..]`, for the key whose pad states `key` holds ([`HmacSha256State::new`]).
///
/// Every tag starts from the key's inner state (the pad blocks are never compressed again)
/// and ends with one compression from its outer state; the blocks are hashed side by side in
/// SIMD lanes where the CPU allows ([`sha256_lanes_backend`]). A prefix of 64 bytes or more
/// (no caller has one) goes through `sha2` one tag at a time.
pub fn hmac_sha256_prefixed_blocks(
    key: &HmacSha256State,
    prefixes: &[u8],
    prefix_len: usize,
    blocks: &[u8],
    block_size: usize,
    out: &mut [u8],
) {
    assert!(block_size > 0 && blocks.len().is_multiple_of(block_size));
    let n = blocks.len() / block_size;
    assert_eq!(prefixes.len(), n * prefix_len);
    assert_eq!(out.len(), n * 32);
    if prefix_len >= 64 {
        for (i, (block, tag)) in blocks
            .chunks_exact(block_size)
            .zip(out.chunks_exact_mut(32))
            .enumerate()
        {
            let p = &prefixes[i * prefix_len..(i + 1) * prefix_len];
            tag.copy_from_slice(&key.mac(&[p, block]));
        }
        return;
    }
    sha256_lanes::hash(
        &sha256_lanes::Batch {
            start: &key.inner,
            absorbed: 64,
            prefixes,
            prefix_len,
            bodies: blocks,
            body_len: block_size,
            outer: Some(&key.outer),
        },
        out,
    );
}

/// Name of the lane engine [`hmac_sha256_prefixed_blocks`] (and the SHA-256 tags of
/// dm-integrity) run on this CPU: `"avx512-16"`, `"avx2-8"`, or `"sha2"` (one message at a
/// time through the `sha2` crate's block function), `"+shani"` or `"shani"` where groups of
/// up to eight messages go through the SHA extensions.
pub fn sha256_lanes_backend() -> &'static str {
    sha256_lanes::backend()
}

/// The inner and outer pads of an HMAC-SHA-256 key (a key longer than 64 bytes is hashed
/// first, as RFC 2104 and the kernel's `hmac()` do).
pub fn hmac_sha256_pads(key: &[u8]) -> zeroize::Zeroizing<[u8; 128]> {
    use sha2::Digest;
    let mut k = zeroize::Zeroizing::new([0u8; 64]);
    if key.len() > 64 {
        k[..32].copy_from_slice(&sha2::Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut pads = zeroize::Zeroizing::new([0u8; 128]);
    for i in 0..64 {
        pads[i] = k[i] ^ 0x36;
        pads[64 + i] = k[i] ^ 0x5c;
    }
    pads
}

/// HMAC-SHA-256 of one message (RFC 2104), for deriving identifiers from a seed: systemd
/// derives partition, file system and verity UUIDs and salts this way.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let pads = hmac_sha256_pads(key);
    let inner = sha2::Sha256::new()
        .chain_update(&pads[..64])
        .chain_update(message)
        .finalize();
    sha2::Sha256::new()
        .chain_update(&pads[64..])
        .chain_update(inner)
        .finalize()
        .into()
}

/// Name of the implementation [`hash_blocks`] uses for SHA-256 batches on this CPU: the
/// multi-buffer kernel of the `tape-sha256` crate (`"avx512-2x16"`, `"avx512-16"`,
/// `"avx2-8"`, `"shani-x4"`), or `"sha2"` when none applies and blocks are hashed one at
/// a time with the `sha2` crate.
pub fn sha256_backend() -> &'static str {
    if sha256_mb::available() {
        sha256_mb::backend()
    } else {
        "sha2"
    }
}

/// One block at a time through the `sha1`/`sha2` crates. A prefix of a whole input block or
/// more (a long salt) is absorbed once and its state cloned for every block; a shorter one
/// saves no compression, so it is simply fed in again.
fn scalar_blocks<D: sha2::Digest + Clone>(
    prefix: &[u8],
    suffix: &[u8],
    blocks: &[u8],
    block_size: usize,
    out: &mut [u8],
) {
    let ds = <D as sha2::Digest>::output_size();
    let digests = out.chunks_exact_mut(ds);
    if prefix.len() >= 64 {
        let mut start = D::new();
        start.update(prefix);
        for (block, digest) in blocks.chunks_exact(block_size).zip(digests) {
            let mut h = start.clone();
            h.update(block);
            h.update(suffix);
            digest.copy_from_slice(&h.finalize());
        }
    } else {
        for (block, digest) in blocks.chunks_exact(block_size).zip(digests) {
            let mut h = D::new();
            h.update(prefix);
            h.update(block);
            h.update(suffix);
            digest.copy_from_slice(&h.finalize());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_rfc4231_case_2() {
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

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

    /// Deterministic pseudo-random bytes (xorshift64).
    pub(crate) fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    /// `H(prefix || block || suffix)` per block, straight from the `sha1`/`sha2` crates.
    fn reference(
        alg: HashAlgorithm,
        prefix: &[u8],
        suffix: &[u8],
        blocks: &[u8],
        bs: usize,
    ) -> Vec<u8> {
        use sha2::Digest;
        fn one<D: Digest>(parts: [&[u8]; 3], out: &mut Vec<u8>) {
            let mut h = D::new();
            for p in parts {
                h.update(p);
            }
            out.extend_from_slice(&h.finalize());
        }
        let mut out = Vec::new();
        for b in blocks.chunks_exact(bs) {
            let parts = [prefix, b, suffix];
            match alg {
                HashAlgorithm::Sha1 => one::<sha1::Sha1>(parts, &mut out),
                HashAlgorithm::Sha256 => one::<sha2::Sha256>(parts, &mut out),
                HashAlgorithm::Sha512 => one::<sha2::Sha512>(parts, &mut out),
            }
        }
        out
    }

    const LENGTHS: [usize; 9] = [0, 1, 32, 55, 56, 63, 64, 65, 256];

    /// The salt placements dm-verity uses (hash type 1: prefix only, hash type 0: suffix
    /// only) for every length, plus a few with both.
    fn salt_shapes() -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = LENGTHS.iter().map(|&p| (p, 0)).collect();
        v.extend(LENGTHS.iter().skip(1).map(|&s| (0, s)));
        v.extend([(1, 1), (32, 32), (55, 9), (64, 64), (65, 63), (256, 256)]);
        v
    }

    fn check(alg: HashAlgorithm, data: &[u8], salt: &[u8], bs: usize, batches: &[usize]) {
        let ds = alg.digest_size();
        for &(plen, slen) in &salt_shapes() {
            let (prefix, suffix) = (&salt[..plen], &salt[salt.len() - slen..]);
            for &n in batches {
                // Start at an odd offset now and then, so the blocks are unaligned.
                let off = n % 3;
                let blocks = &data[off..off + n * bs];
                let mut out = vec![0u8; n * ds];
                hash_blocks(alg, prefix, suffix, blocks, bs, &mut out);
                assert!(
                    out == reference(alg, prefix, suffix, blocks, bs),
                    "{alg} backend {} block size {bs} batch {n} prefix {plen} suffix {slen}",
                    sha256_backend()
                );
            }
        }
    }

    #[test]
    fn hash_blocks_sha256_matches_sha2() {
        let data = random_bytes(40 * 4096 + 2, 1);
        let salt = random_bytes(256, 2);
        let batches: Vec<usize> = (1..=40).collect();
        for bs in [100, 512, 1024, 4096] {
            check(HashAlgorithm::Sha256, &data, &salt, bs, &batches);
        }
    }

    #[test]
    fn hash_blocks_sha256_large_blocks() {
        let data = random_bytes(40 * 65536 + 2, 3);
        let salt = random_bytes(256, 4);
        check(
            HashAlgorithm::Sha256,
            &data,
            &salt,
            65536,
            &[1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40],
        );
    }

    #[test]
    fn hash_blocks_other_algorithms_match() {
        let data = random_bytes(17 * 4096 + 2, 5);
        let salt = random_bytes(256, 6);
        for alg in [HashAlgorithm::Sha1, HashAlgorithm::Sha512] {
            for bs in [100, 512, 4096] {
                check(alg, &data, &salt, bs, &[1, 2, 3, 16, 17]);
            }
        }
    }

    #[test]
    fn hash_blocks_empty_batch() {
        for alg in [
            HashAlgorithm::Sha1,
            HashAlgorithm::Sha256,
            HashAlgorithm::Sha512,
        ] {
            hash_blocks(alg, b"salt", b"", &[], 4096, &mut []);
        }
    }

    #[test]
    fn prefixed_blocks_match_sha2() {
        use sha2::Digest;
        let data = random_bytes(70 * 512 + 1, 7);
        for plen in [0usize, 8, 24, 88] {
            for n in [0usize, 1, 2, 17, 64, 65, 70] {
                let prefixes = random_bytes(n * plen, 8 + plen as u64);
                let blocks = &data[1..1 + n * 512];
                let mut out = vec![0u8; n * 32];
                sha256_prefixed_blocks(&prefixes, plen, blocks, 512, &mut out);
                for i in 0..n {
                    let mut h = sha2::Sha256::new();
                    h.update(&prefixes[i * plen..(i + 1) * plen]);
                    h.update(&blocks[i * 512..(i + 1) * 512]);
                    assert_eq!(
                        out[i * 32..(i + 1) * 32],
                        h.finalize()[..],
                        "prefix {plen} n {n} i {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn backend_is_named() {
        let name = sha256_backend();
        assert!(!name.is_empty());
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            assert_ne!(
                name, "sha2",
                "AVX2 present but no multi-buffer backend selected"
            );
        }
    }
}
