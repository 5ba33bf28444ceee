//! fs-verity: the file digest (Merkle tree root and descriptor) and built-in signatures,
//! byte-compatible with the kernel and fsverity-utils (`fsverity digest`, `fsverity sign`).
//!
//! - [`descriptor`]: `struct fsverity_descriptor` and `struct fsverity_formatted_digest`.
//! - [`digest`]: parameters and the file digest ([`file_digest`]).
//! - [`geometry`]: where each level of a Merkle tree is ([`TreeGeometry`]), and where a data
//!   block's hashes are on the way up to the root.
//! - [`merkle`]: a file's Merkle tree ([`MerkleTree`]) from a path, a reader or bytes;
//!   [`digest_files`]: many files at once, on all cores.
//! - [`outputs`]: `--out-merkle-tree` / `--out-descriptor` files ([`MetadataFiles`]).
//! - [`sign`]: PKCS#7 signatures over the formatted digest ([`sign_digest`]).
//!
//! Internals: `build` reduces level-0 hashes to the root segment by segment, `source` computes
//! level 0 of a large file on all cores, `mapped` maps files safely against truncation,
//! `files` batches small files into multi-buffer hash calls.

mod build;
pub mod descriptor;
pub mod digest;
mod files;
pub mod geometry;
mod mapped;
pub mod merkle;
pub mod outputs;
pub mod sign;
mod source;

use std::path::PathBuf;

pub use descriptor::{formatted_digest, Descriptor};
pub use digest::{digest_bytes, digest_reader, file_digest, FileDigest, FsVerityParams};
pub use files::digest_files;
pub use geometry::{HashPosition, TreeGeometry};
pub use merkle::MerkleTree;
pub use outputs::MetadataFiles;
pub use sign::sign_digest;

use crate::verity::sig::SignatureError;

/// Why an fs-verity digest or signature could not be made; each names the file and what is
/// wrong, on one line.
#[derive(Debug, thiserror::Error)]
pub enum FsVerityError {
    /// The hash algorithm is not one fs-verity takes (SHA-256, SHA-512).
    #[error("hash algorithm {0} is not supported by fs-verity (sha256, sha512)")]
    UnsupportedHash(String),
    /// The block size is not a power of two from 1024 to 65536.
    #[error("block size {0} is not a power of two from 1024 to 65536")]
    BadBlockSize(u32),
    /// The salt is longer than 32 bytes.
    #[error("salt of {0} bytes is longer than 32")]
    SaltTooLong(usize),
    /// The Merkle tree does not fit in memory (or, in theory, in 64-bit offsets).
    #[error("a Merkle tree for {0} bytes of data is too large to hold in memory")]
    TreeTooLarge(u64),
    /// The file is not a regular file.
    #[error("{0}: not a regular file")]
    NotRegularFile(PathBuf),
    /// Reading the file failed.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key or certificate could not be loaded.
    #[error(transparent)]
    KeyOrCertificate(#[from] SignatureError),
    /// No certificate in the certificate file carries the private key's public key.
    #[error("{cert}: no certificate matches the private key {key}")]
    KeyCertificateMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// Making the signature failed.
    #[error("{key}: signing the file digest failed: {reason}")]
    SigningFailed {
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}
