//! The fs-verity file digest: the Merkle tree root over the file's contents, then the hash of
//! the descriptor naming it — what `fsverity digest` prints and what the kernel's
//! `FS_IOC_MEASURE_VERITY` returns once verity is enabled on the file.
//!
//! The tree (Documentation/filesystems/fsverity.rst): the file is split into blocks, the last
//! one zero-padded; each block is hashed as `H(salt' || block)`, where `salt'` is the salt
//! zero-padded to the hash function's input block size (64 bytes for SHA-256, 128 for
//! SHA-512), or nothing without a salt. The digests of a level, concatenated and zero-padded
//! to whole blocks, are the blocks of the next level, until one block is left; the root hash
//! is that block's hash. A file of one block has the hash of that block as its root, an empty
//! file the all-zero root.

use std::io::Read;
use std::path::Path;

use super::descriptor::{hash_algorithm_number, Descriptor, MAX_SALT_SIZE};
use super::merkle::MerkleTree;
use super::FsVerityError;
use crate::hash::HashAlgorithm;

/// Smallest Merkle tree block size fsverity-utils takes.
pub const MIN_BLOCK_SIZE: u32 = 1024;
/// Largest Merkle tree block size fsverity-utils takes.
pub const MAX_BLOCK_SIZE: u32 = 65536;
/// Default block size (the page size; what ext4 supports on most kernels).
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

/// Merkle tree parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsVerityParams {
    /// Hash algorithm (SHA-256 or SHA-512).
    pub hash: HashAlgorithm,
    /// Block size: a power of two from [`MIN_BLOCK_SIZE`] to [`MAX_BLOCK_SIZE`].
    pub block_size: u32,
    /// Salt, at most 32 bytes; empty for none.
    pub salt: Vec<u8>,
}

impl Default for FsVerityParams {
    fn default() -> Self {
        FsVerityParams {
            hash: HashAlgorithm::Sha256,
            block_size: DEFAULT_BLOCK_SIZE,
            salt: Vec::new(),
        }
    }
}

impl FsVerityParams {
    /// Checks the parameters as fsverity-utils does.
    pub fn validate(&self) -> Result<(), FsVerityError> {
        if hash_algorithm_number(self.hash).is_none() {
            return Err(FsVerityError::UnsupportedHash(self.hash.name().to_string()));
        }
        if !self.block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&self.block_size)
        {
            return Err(FsVerityError::BadBlockSize(self.block_size));
        }
        if self.salt.len() > MAX_SALT_SIZE {
            return Err(FsVerityError::SaltTooLong(self.salt.len()));
        }
        Ok(())
    }

    /// The salt as prepended to every hashed block: zero-padded to the hash's input block
    /// size, or empty.
    pub(crate) fn hash_prefix(&self) -> Vec<u8> {
        if self.salt.is_empty() {
            return Vec::new();
        }
        let input_block = match self.hash {
            HashAlgorithm::Sha512 => 128,
            _ => 64,
        };
        let mut p = self.salt.clone();
        p.resize(self.salt.len().div_ceil(input_block) * input_block, 0);
        p
    }
}

/// A file's fs-verity digest and the descriptor it is the hash of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// The descriptor (root hash, size, parameters).
    pub descriptor: Descriptor,
    /// The digest: the hash of the descriptor.
    pub digest: Vec<u8>,
}

impl FileDigest {
    /// The hash algorithm.
    pub fn hash(&self) -> HashAlgorithm {
        self.descriptor.hash
    }
}

/// `sha256:<hex>`, as `fsverity digest` and `fsverity measure` print it.
impl std::fmt::Display for FileDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.hash().name(), hex::encode(&self.digest))
    }
}

/// Computes the fs-verity digest of `size` bytes read from `reader`, on the calling thread;
/// `name` is only used in messages. Fails if the reader ends before `size` bytes.
pub fn digest_reader<R: Read>(
    reader: R,
    size: u64,
    params: &FsVerityParams,
    name: &Path,
) -> Result<FileDigest, FsVerityError> {
    MerkleTree::from_reader(reader, size, params, false, name).map(|t| t.digest)
}

/// Computes the fs-verity digest of the file at `path` (what `fsverity digest` prints). A
/// large file is hashed on all cores: see [`MerkleTree::from_path`].
pub fn file_digest(path: &Path, params: &FsVerityParams) -> Result<FileDigest, FsVerityError> {
    MerkleTree::from_path(path, params, false).map(|t| t.digest)
}

/// Computes the fs-verity digest of bytes in memory (large inputs on all cores).
pub fn digest_bytes(data: &[u8], params: &FsVerityParams) -> Result<FileDigest, FsVerityError> {
    MerkleTree::from_bytes(data, params, false).map(|t| t.digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(hash: HashAlgorithm, block_size: u32, salt: &[u8]) -> FsVerityParams {
        FsVerityParams {
            hash,
            block_size,
            salt: salt.to_vec(),
        }
    }

    #[test]
    fn empty_file_has_zero_root() {
        let d = digest_bytes(&[], &FsVerityParams::default()).unwrap();
        assert_eq!(d.descriptor.root_hash, vec![0; 32]);
        // Known answer from fsverity-utils (`fsverity digest` of an empty file).
        assert_eq!(
            d.to_string(),
            "sha256:3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95"
        );
    }

    #[test]
    fn one_block_root_is_the_block_hash() {
        let data = vec![0x61u8; 100];
        let d = digest_bytes(&data, &FsVerityParams::default()).unwrap();
        let mut block = data.clone();
        block.resize(4096, 0);
        assert_eq!(
            d.descriptor.root_hash,
            HashAlgorithm::Sha256.hash(&[&block])
        );
    }

    #[test]
    fn two_levels_by_hand() {
        // 3 blocks of 1024 bytes with a salt: level 0 has 3 hashes in one block.
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let salt = [9u8; 5];
        let d = digest_bytes(&data, &p(HashAlgorithm::Sha512, 1024, &salt)).unwrap();
        let mut prefix = salt.to_vec();
        prefix.resize(128, 0);
        let mut padded = data.clone();
        padded.resize(3072, 0);
        let mut level0 = Vec::new();
        for b in padded.chunks(1024) {
            level0.extend(HashAlgorithm::Sha512.hash(&[&prefix, b]));
        }
        level0.resize(1024, 0);
        assert_eq!(
            d.descriptor.root_hash,
            HashAlgorithm::Sha512.hash(&[&prefix, &level0])
        );
    }

    #[test]
    fn bad_params() {
        assert!(matches!(
            digest_bytes(b"x", &p(HashAlgorithm::Sha1, 4096, &[])),
            Err(FsVerityError::UnsupportedHash(_))
        ));
        assert!(matches!(
            digest_bytes(b"x", &p(HashAlgorithm::Sha256, 512, &[])),
            Err(FsVerityError::BadBlockSize(512))
        ));
        assert!(matches!(
            digest_bytes(b"x", &p(HashAlgorithm::Sha256, 4096, &[0; 33])),
            Err(FsVerityError::SaltTooLong(33))
        ));
    }
}
