//! A file's fs-verity Merkle tree and digest, from a path, a reader or bytes.
//!
//! The tree is laid out as the kernel returns it from `FS_IOC_READ_VERITY_METADATA` and as
//! `fsverity digest --out-merkle-tree` writes it (see [`TreeGeometry`]); a file of at most one
//! block has an empty tree. Without `keep_tree` only the digest is computed, in memory bounded
//! by a few MiB whatever the file size. Many files at once: [`digest_files`].
//!
//! [`TreeGeometry`]: super::geometry::TreeGeometry
//! [`digest_files`]: super::files::digest_files

use std::io::Read;
use std::path::Path;

use super::build::{build_tree, BlockHasher};
use super::descriptor::DESCRIPTOR_SIZE;
use super::digest::{FileDigest, FsVerityParams};
use super::files::{digest_one, finish};
use super::geometry::TreeGeometry;
use super::source::{hash_level0_from_reader, Source};
use super::FsVerityError;

/// A file's digest and, when asked for, its Merkle tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerkleTree {
    /// The digest and the descriptor it is the hash of.
    pub digest: FileDigest,
    /// The tree as the kernel stores it (top level first); empty for a file of at most one
    /// block, and when the tree was not kept.
    pub tree: Vec<u8>,
}

impl MerkleTree {
    /// The tree of the file at `path`.
    ///
    /// A large file is hashed on rayon's global thread pool from a mapping of the file (see
    /// [`digest_files`](super::files::digest_files) for what that implies); a small one on
    /// the calling thread.
    pub fn from_path(
        path: &Path,
        params: &FsVerityParams,
        keep_tree: bool,
    ) -> Result<MerkleTree, FsVerityError> {
        digest_one(path, params, keep_tree)
    }

    /// The tree of `size` bytes read from `reader`, on the calling thread; `name` is only
    /// used in messages. Fails if the reader ends before `size` bytes.
    pub fn from_reader<R: Read>(
        mut reader: R,
        size: u64,
        params: &FsVerityParams,
        keep_tree: bool,
        name: &Path,
    ) -> Result<MerkleTree, FsVerityError> {
        let geometry = TreeGeometry::new(size, params)?;
        let hasher = BlockHasher::new(params);
        let mut done = 0;
        let built = build_tree(&geometry, &hasher, keep_tree, |_, out| {
            hash_level0_from_reader(&mut reader, &hasher, size, &mut done, out, name)
        })?;
        Ok(finish(params, size, built))
    }

    /// The tree of bytes in memory; large inputs are hashed on rayon's global thread pool.
    pub fn from_bytes(
        data: &[u8],
        params: &FsVerityParams,
        keep_tree: bool,
    ) -> Result<MerkleTree, FsVerityError> {
        let size = data.len() as u64;
        let geometry = TreeGeometry::new(size, params)?;
        let hasher = BlockHasher::new(params);
        let source = Source::Bytes(data);
        let name = Path::new("<memory>");
        let built = build_tree(&geometry, &hasher, keep_tree, |first, out| {
            source.hash_level0(&hasher, size, first, out, name)
        })?;
        Ok(finish(params, size, built))
    }

    /// The root hash of the tree.
    pub fn root_hash(&self) -> &[u8] {
        &self.digest.descriptor.root_hash
    }

    /// The 256-byte descriptor (what `--out-descriptor` writes).
    pub fn descriptor_bytes(&self) -> [u8; DESCRIPTOR_SIZE] {
        self.digest.descriptor.to_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashAlgorithm;

    /// Deterministic bytes (xorshift64).
    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// The tree the slow, obvious way: every level in full, then stored top level first.
    fn reference(data: &[u8], p: &FsVerityParams) -> (Vec<u8>, Vec<u8>) {
        let bs = p.block_size as usize;
        let prefix = p.hash_prefix();
        let ds = p.hash.digest_size();
        if data.is_empty() {
            return (vec![0; ds], Vec::new());
        }
        let mut levels: Vec<Vec<u8>> = Vec::new();
        let mut cur: Vec<u8> = data.to_vec();
        loop {
            cur.resize(cur.len().div_ceil(bs) * bs, 0);
            let hashes: Vec<u8> = cur
                .chunks(bs)
                .flat_map(|b| p.hash.hash(&[&prefix, b]))
                .collect();
            if hashes.len() == ds {
                let tree = levels.iter().rev().flatten().copied().collect();
                return (hashes, tree);
            }
            let mut level = hashes;
            level.resize(level.len().div_ceil(bs) * bs, 0);
            levels.push(level.clone());
            cur = level;
        }
    }

    fn params(hash: HashAlgorithm, block_size: u32, salt: &[u8]) -> FsVerityParams {
        FsVerityParams {
            hash,
            block_size,
            salt: salt.to_vec(),
        }
    }

    #[test]
    fn trees_match_the_reference() {
        let data = bytes(300_000, 5);
        for (hash, bs) in [
            (HashAlgorithm::Sha256, 1024),
            (HashAlgorithm::Sha512, 1024),
            (HashAlgorithm::Sha256, 4096),
        ] {
            for salt in [&[][..], &[1, 2, 3][..]] {
                let p = params(hash, bs, salt);
                for len in [0, 1, 1023, 1024, 1025, 16 * 1024 + 1, 70_000, 300_000] {
                    let (root, tree) = reference(&data[..len], &p);
                    let t = MerkleTree::from_bytes(&data[..len], &p, true).unwrap();
                    assert_eq!(t.root_hash(), &root[..], "{hash} {bs} {len}");
                    assert_eq!(t.tree, tree, "{hash} {bs} {len}");
                    let g = TreeGeometry::new(len as u64, &p).unwrap();
                    assert_eq!(t.tree.len() as u64, g.tree_size());
                    let d = MerkleTree::from_bytes(&data[..len], &p, false).unwrap();
                    assert_eq!(d.digest, t.digest);
                    assert!(d.tree.is_empty());
                    let r = MerkleTree::from_reader(&data[..len], len as u64, &p, true, name())
                        .unwrap();
                    assert_eq!(r, t);
                }
            }
        }
    }

    fn name() -> &'static Path {
        Path::new("<test>")
    }

    /// Sizes that take the segmented path (more than one segment of 16^4 blocks of 1024
    /// bytes with SHA-512), checked against the single-pass reference.
    #[test]
    fn segmented_trees_match_the_reference() {
        let p = params(HashAlgorithm::Sha512, 1024, &[7; 32]);
        let data = bytes(3 * 65536 * 1024 / 2 + 1000, 9);
        let (root, tree) = reference(&data, &p);
        let t = MerkleTree::from_bytes(&data, &p, true).unwrap();
        assert_eq!(t.root_hash(), &root[..]);
        assert!(t.tree == tree);
        let d = MerkleTree::from_reader(&data[..], data.len() as u64, &p, false, name()).unwrap();
        assert_eq!(d.digest, t.digest);
    }

    #[test]
    fn short_reader_is_an_error() {
        let p = FsVerityParams::default();
        let e = MerkleTree::from_reader(&[0u8; 10][..], 11, &p, false, name()).unwrap_err();
        assert!(e.to_string().contains("shrank"), "{e}");
    }
}
