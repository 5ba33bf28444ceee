//! fs-verity: the file digest (Merkle tree root and descriptor), built-in signatures, and the
//! kernel's ioctls, byte-compatible with the kernel and fsverity-utils (`fsverity digest`,
//! `sign`, `enable`, `measure`, `dump_metadata`).
//!
//! - [`descriptor`]: `struct fsverity_descriptor` and `struct fsverity_formatted_digest`.
//! - [`digest`]: parameters and the file digest ([`file_digest`]).
//! - [`geometry`]: where each level of a Merkle tree is ([`TreeGeometry`]), and where a data
//!   block's hashes are on the way up to the root.
//! - [`merkle`]: a file's Merkle tree ([`MerkleTree`]) from a path, a reader or bytes;
//!   [`digest_files`]: many files at once, on all cores.
//! - [`outputs`]: `--out-merkle-tree` / `--out-descriptor` files ([`MetadataFiles`]).
//! - [`sign`]: PKCS#7 signatures over the formatted digest ([`sign_digest`]).
//! - [`verify`]: checking such a signature in userspace as the kernel's `.fs-verity` keyring
//!   check does ([`verify_file_signature`]).
//! - [`ioctl`]: `FS_IOC_ENABLE_VERITY`, `FS_IOC_MEASURE_VERITY`, `FS_IOC_READ_VERITY_METADATA`.
//!
//! Internals: `build` reduces level-0 hashes to the root segment by segment, `source` computes
//! level 0 of a large file on all cores, `mapped` maps files safely against truncation,
//! `files` batches small files into multi-buffer hash calls.

mod build;
pub mod descriptor;
pub mod digest;
mod files;
pub mod geometry;
pub mod ioctl;
mod mapped;
pub mod merkle;
pub mod outputs;
pub mod sealed;
pub mod sign;
mod source;
pub mod verify;

use std::path::PathBuf;

pub use descriptor::{formatted_digest, Descriptor};
pub use digest::{digest_bytes, digest_reader, file_digest, FileDigest, FsVerityParams};
pub use files::digest_files;
pub use geometry::{HashPosition, TreeGeometry};
pub use merkle::MerkleTree;
pub use outputs::MetadataFiles;
pub use sign::sign_digest;
pub use verify::{verify_file_signature, verify_formatted};

use crate::sig::SignatureError;

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
    /// A digest of the wrong length for its hash algorithm.
    #[error("a {hash} digest is {expected} bytes, not {len}")]
    BadDigestLength {
        /// The hash algorithm.
        hash: &'static str,
        /// Its digest size.
        expected: usize,
        /// The length given.
        len: usize,
    },
    /// Signing, or checking a signature, failed (key, certificate or signature unusable, or
    /// the signature does not verify).
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// The signature does not verify over the file's digest with the hash algorithm given, but
    /// does over its digest with the other one.
    #[error("{signature}: signature is over the {signed} fs-verity digest of {file}, not its {given} digest (give --hash-alg={signed})")]
    SignatureOverOtherHash {
        /// The signature file.
        signature: PathBuf,
        /// The signed file.
        file: PathBuf,
        /// The algorithm of the digest it signs.
        signed: &'static str,
        /// The algorithm asked for.
        given: &'static str,
    },
    /// The kernel or the file's filesystem has no fs-verity (the ioctl failed with `ENOTTY` or
    /// `EOPNOTSUPP`).
    #[error("{path}: this kernel or filesystem does not support {feature} ({errno})")]
    NotSupported {
        /// The file.
        path: PathBuf,
        /// What is missing: `fs-verity`, or `fs-verity or its built-in signatures`.
        feature: &'static str,
        /// The errno's name.
        errno: &'static str,
    },
    /// An fs-verity ioctl failed.
    #[error("{path}: {action}: {reason}")]
    Kernel {
        /// The file.
        path: PathBuf,
        /// What failed ("cannot enable fs-verity", "cannot measure").
        action: &'static str,
        /// Why, with the errno's name.
        reason: String,
    },
}

impl FsVerityError {
    /// Whether this is a signature that does not verify (as opposed to unusable input or a
    /// failed system call).
    pub fn is_not_verified(&self) -> bool {
        match self {
            FsVerityError::Signature(e) => e.is_not_verified(),
            FsVerityError::SignatureOverOtherHash { .. } => true,
            _ => false,
        }
    }
}
