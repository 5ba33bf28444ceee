//! The crypt targets: block devices that run a sector cipher between their users and a lower
//! device, as dm-crypt does. [`CryptDevice`] over a [`SectorCipher`](crate::crypt::cipher::SectorCipher),
//! [`AeadCryptDevice`] over a [`SectorAead`](crate::crypt::cipher::SectorAead) and a
//! dm-integrity device that keeps each sector's tag.

mod aead_device;
mod device;
mod segment_map;
mod served;

pub use aead_device::{AeadCryptDevice, AeadStats};
pub use device::{CryptDevice, CryptError, CryptParams, CryptStats};
pub use segment_map::SegmentMap;
pub use served::ServedCrypt;
