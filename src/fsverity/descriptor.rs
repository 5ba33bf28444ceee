//! The fs-verity descriptor (`struct fsverity_descriptor`, 256 bytes) and the signed
//! `struct fsverity_formatted_digest`, encoded explicitly little-endian.

use crate::hash::HashAlgorithm;

/// Size of the encoded descriptor.
pub const DESCRIPTOR_SIZE: usize = 256;
/// Largest salt fs-verity takes.
pub const MAX_SALT_SIZE: usize = 32;
/// Size of the root hash field (the largest digest).
pub const ROOT_HASH_FIELD_SIZE: usize = 64;

/// fs-verity's number for a hash algorithm (`FS_VERITY_HASH_ALG_*`): 1 for SHA-256, 2 for
/// SHA-512; `None` for algorithms fs-verity does not take.
pub fn hash_algorithm_number(alg: HashAlgorithm) -> Option<u8> {
    match alg {
        HashAlgorithm::Sha256 => Some(1),
        HashAlgorithm::Sha512 => Some(2),
        HashAlgorithm::Sha1 => None,
    }
}

/// The algorithm fs-verity numbers `n`.
pub fn hash_algorithm_from_number(n: u8) -> Option<HashAlgorithm> {
    match n {
        1 => Some(HashAlgorithm::Sha256),
        2 => Some(HashAlgorithm::Sha512),
        _ => None,
    }
}

/// The fs-verity descriptor whose hash is a file's digest:
///
/// ```text
///   0  u8      version (1)
///   1  u8      hash_algorithm
///   2  u8      log_blocksize
///   3  u8      salt_size
///   4  le32    reserved (0; the kernel keeps the signature size here in memory)
///   8  le64    data_size
///  16  u8[64]  root_hash (zero-padded)
///  80  u8[32]  salt (zero-padded)
/// 112  u8[144] reserved (0)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Hash algorithm of the Merkle tree and of the digest.
    pub hash: HashAlgorithm,
    /// log2 of the Merkle tree block size.
    pub log_blocksize: u8,
    /// File size in bytes.
    pub data_size: u64,
    /// Merkle tree root hash (`hash.digest_size()` bytes).
    pub root_hash: Vec<u8>,
    /// Salt (at most [`MAX_SALT_SIZE`] bytes; empty for none).
    pub salt: Vec<u8>,
}

impl Descriptor {
    /// The 256 bytes the file digest is computed over.
    ///
    /// # Panics
    /// If the hash algorithm is not one fs-verity takes, the root hash is longer than 64
    /// bytes or the salt longer than 32 (the digest code never builds such a descriptor).
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_SIZE] {
        let mut b = [0u8; DESCRIPTOR_SIZE];
        b[0] = 1;
        b[1] = hash_algorithm_number(self.hash).expect("fs-verity hash algorithm");
        b[2] = self.log_blocksize;
        assert!(self.salt.len() <= MAX_SALT_SIZE);
        b[3] = self.salt.len() as u8;
        b[8..16].copy_from_slice(&self.data_size.to_le_bytes());
        assert!(self.root_hash.len() <= ROOT_HASH_FIELD_SIZE);
        b[16..16 + self.root_hash.len()].copy_from_slice(&self.root_hash);
        b[80..80 + self.salt.len()].copy_from_slice(&self.salt);
        b
    }

    /// Decode an encoded descriptor (from a sidecar store, a kernel, `fsverity digest
    /// --out-descriptor`): `None` unless it is exactly [`DESCRIPTOR_SIZE`] bytes of version 1
    /// with a known hash, a block size fs-verity takes, a salt of at most 32 bytes, and zeros
    /// in every unused byte (root hash and salt padding, reserved fields).
    pub fn from_bytes(b: &[u8]) -> Option<Descriptor> {
        if b.len() != DESCRIPTOR_SIZE || b[0] != 1 {
            return None;
        }
        let hash = hash_algorithm_from_number(b[1])?;
        let log_blocksize = b[2];
        if !(10..=16).contains(&log_blocksize) {
            return None;
        }
        let salt_size = b[3] as usize;
        let ds = hash.digest_size();
        let zero = |r: std::ops::Range<usize>| b[r].iter().all(|&x| x == 0);
        if salt_size > MAX_SALT_SIZE
            || !zero(4..8)
            || !zero(16 + ds..80)
            || !zero(80 + salt_size..112)
            || !zero(112..DESCRIPTOR_SIZE)
        {
            return None;
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&b[8..16]);
        Some(Descriptor {
            hash,
            log_blocksize,
            data_size: u64::from_le_bytes(size),
            root_hash: b[16..16 + ds].to_vec(),
            salt: b[80..80 + salt_size].to_vec(),
        })
    }

    /// The file digest: the hash of [`Descriptor::to_bytes`].
    pub fn digest(&self) -> Vec<u8> {
        self.hash.hash(&[&self.to_bytes()])
    }
}

/// `struct fsverity_formatted_digest`, the bytes a built-in fs-verity signature signs:
/// `"FSVerity"`, le16 digest algorithm, le16 digest size, the digest.
pub fn formatted_digest(hash: HashAlgorithm, digest: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + digest.len());
    v.extend_from_slice(b"FSVerity");
    let alg = hash_algorithm_number(hash).expect("fs-verity hash algorithm") as u16;
    v.extend_from_slice(&alg.to_le_bytes());
    v.extend_from_slice(&(digest.len() as u16).to_le_bytes());
    v.extend_from_slice(digest);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let d = Descriptor {
            hash: HashAlgorithm::Sha512,
            log_blocksize: 12,
            data_size: 0x0102_0304_0506_0708,
            root_hash: vec![0xaa; 64],
            salt: vec![0x55; 3],
        };
        let b = d.to_bytes();
        assert_eq!(&b[..4], &[1, 2, 12, 3]);
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert!(b[16..80].iter().all(|&x| x == 0xaa));
        assert_eq!(&b[80..84], &[0x55, 0x55, 0x55, 0]);
        assert!(b[112..].iter().all(|&x| x == 0));
    }

    #[test]
    fn decode_round_trip_and_refusals() {
        let d = Descriptor {
            hash: HashAlgorithm::Sha256,
            log_blocksize: 12,
            data_size: 12345,
            root_hash: vec![0xab; 32],
            salt: vec![1, 2, 3],
        };
        let b = d.to_bytes();
        assert_eq!(Descriptor::from_bytes(&b), Some(d));
        assert_eq!(Descriptor::from_bytes(&b[..255]), None);
        for (at, v) in [
            (0, 2),
            (1, 3),
            (2, 9),
            (3, 33),
            (5, 1),
            (60, 1),
            (90, 1),
            (200, 1),
        ] {
            let mut x = b;
            x[at] = v;
            assert_eq!(Descriptor::from_bytes(&x), None, "byte {at} = {v}");
        }
    }

    #[test]
    fn formatted() {
        let f = formatted_digest(HashAlgorithm::Sha256, &[7; 32]);
        assert_eq!(&f[..12], b"FSVerity\x01\x00\x20\x00");
        assert_eq!(f.len(), 44);
    }
}
