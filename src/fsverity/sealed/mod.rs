//! Sealed trees: fs-verity for whole directory trees on any filesystem.
//!
//! [`seal`](seal::seal) records every node of a tree in a [`manifest`] (each regular file with
//! its fs-verity digest) and keeps each file's Merkle tree in a sidecar [`store`] beside it;
//! [`open`](open::open) checks a tree against its manifest (signature, structure, every stored
//! tree) and gives a [`SealedTree`] that serves it read-only over FUSE with every block read
//! checked ([`verify`]) — what the kernel's fs-verity does for one file on ext4, f2fs or
//! btrfs, here for any directory on any filesystem, without kernel support.
//!
//! - [`manifest`]: the format, its canonical bytes and its strict parser;
//! - [`walk`]: the tree on disk as sealing records it and mounting compares it;
//! - [`store`]: the sidecar trees, written and checked;
//! - [`verify`]: checking blocks against a tree, with a bounded cache of verified tree blocks;
//! - [`source`]: the tree as a FUSE [`TreeSource`](crate::export::fuse::TreeSource).

pub mod manifest;
pub mod open;
pub mod seal;
pub mod source;
pub mod store;
pub mod verify;
pub mod walk;

pub use manifest::{Entry, EntryKind, Manifest};
pub use open::{open, MountOptions};
pub use seal::{seal, SealOptions, SealSummary};
pub use source::SealedTree;

use std::path::PathBuf;

/// Why a tree could not be sealed or mounted; each names the file and what is wrong, on one
/// line.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A file or directory could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The tree's root is not a directory.
    #[error("{0}: not a directory")]
    NotADirectory(PathBuf),
    /// A name that is not UTF-8 (the manifest stores UTF-8 paths).
    #[error("{0}: the name is not UTF-8, which a manifest cannot record")]
    NotUtf8(PathBuf),
    /// A name a manifest cannot hold.
    #[error("{path}: {reason}")]
    BadName {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Bad parameters (where outputs go, options).
    #[error("{0}")]
    Invalid(String),
    /// Measuring a file failed.
    #[error(transparent)]
    Digest(#[from] crate::fsverity::FsVerityError),
    /// The manifest is not one, or one of its fields is wrong.
    #[error("{path}: {field}: {reason}")]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// The field at fault (`entries[3] ("a/b").digest`).
        field: String,
        /// Why.
        reason: String,
    },
    /// The manifest's signature or pinned digest does not hold.
    #[error("{0}")]
    NotTrusted(String),
    /// A store file is missing or does not match the manifest.
    #[error("{path}: {reason}")]
    BadStore {
        /// The store file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The tree on disk differs from its manifest (files added, removed, renamed, resized).
    #[error("{dir}: the tree changed since it was sealed: {summary}")]
    TreeChanged {
        /// The tree's root.
        dir: PathBuf,
        /// The differences, the first few named.
        summary: String,
    },
}

impl SealError {
    /// cryptsetup's exit code: 2 when something fails verification (tampered or changed
    /// data, a signature that does not hold), 1 for bad input.
    pub fn exit_code(&self) -> i32 {
        match self {
            SealError::NotTrusted(_)
            | SealError::BadStore { .. }
            | SealError::TreeChanged { .. } => 2,
            _ => 1,
        }
    }
}
