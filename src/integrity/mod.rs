//! dm-integrity: per-sector tags beside the data, byte-compatible with the kernel's
//! dm-integrity target and integritysetup.
//!
//! The on-disk format lives in its own files: [`superblock`] (parse/encode, flags),
//! [`geometry`] (where the journal, the tags and the data of each sector are, computed as
//! the kernel computes them), [`tags`] (internal-hash tags), [`journal_layout`] (journal
//! sectors, entries, commit ids).
//!
//! The read-write device: [`device`] (every read checked, every write tagged, modes J, B, D and
//! R), [`journal`] (mode J's journal: commit and write-back), [`replay`] (the kernel's journal
//! replay at activation), [`bitmap`] (mode B's dirty bitmap), over [`rw_meta`] (the
//! superblock fields, geometry and tags the device uses).
//!
//! [`IntegrityVolume`] ([`volume`]) is the handle a program uses: format (with integritysetup's
//! option checks), activate, verify (see its module for an example).

pub mod bitmap;
pub mod device;
pub mod dump;
pub mod error;
pub mod format;
pub mod geometry;
pub mod journal;
pub mod journal_layout;
pub mod newest_map;
pub mod replay;
pub mod rw_meta;
pub mod samples;
mod scratch;
pub mod superblock;
pub mod tag_cache;
pub mod tags;
pub mod verify;
pub mod volume;

pub use device::{IntegrityDevice, IntegrityOptions, IntegrityStats, OpenError};
pub use error::{IntegrityError, Result};
pub use geometry::{Area, FormatFields, FormatLayout, Geometry, GeometryOptions};
pub use rw_meta::{Layout, Mode};
pub use superblock::Superblock;
pub use tags::{TagAlgorithm, TagHasher};
pub use volume::IntegrityVolume;

#[cfg(test)]
pub(crate) mod tests;
