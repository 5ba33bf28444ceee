//! dm-integrity: per-sector tags beside the data, byte-compatible with the kernel's
//! dm-integrity target and integritysetup.
//!
//! The on-disk format lives in its own files: [`superblock`] (parse/encode, flags),
//! [`geometry`] (where the journal, the tags and the data of each sector are, computed as
//! the kernel computes them), [`tags`] (internal-hash tags), [`journal_layout`] (journal
//! sectors, entries, commit ids).

pub mod dump;
pub mod error;
pub mod format;
pub mod geometry;
pub mod journal_layout;
pub mod superblock;
pub mod tags;
pub mod verify;

pub use error::{IntegrityError, Result};
pub use geometry::{Area, FormatFields, FormatLayout, Geometry, GeometryOptions};
pub use superblock::Superblock;
pub use tags::{TagAlgorithm, TagHasher};
