//! dm-integrity: every sector carries a tag (a checksum or a MAC) in a metadata area
//! interleaved with the data, checked on every read; a journal or a dirty bitmap keeps data and
//! tags consistent across crashes, as the kernel's dm-integrity target does.

pub mod bitmap;
pub mod device;
pub mod journal;
pub mod replay;
pub mod rw_meta;

pub use device::{IntegrityDevice, IntegrityOptions, IntegrityStats, OpenError};
pub use rw_meta::{Layout, Mode, TagAlg};
#[cfg(test)]
mod tests;
