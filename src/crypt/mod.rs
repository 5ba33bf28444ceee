//! dm-crypt in userspace, in rooms that follow the stack: [`cipher`] (sector ciphers such as
//! aes-xts-plain64, their IV generators, and the authenticated sector modes), [`target`] (the
//! crypt block devices that run them over a lower device), [`luks`] (what LUKS1 and LUKS2
//! share, and the [`luks::LuksVolume`] handle), the LUKS2/LUKS1 on-disk formats, and
//! [`plain`] mode (the [`plain::PlainVolume`] handle) on top. Keys and schedules live in [`secret`] memory.
//!
//! The crypto runs inline on the thread serving the request (the lesson of the Cloudflare
//! study, "Speeding up Linux disk encryption", 2020): no queues, no thread hops, the fastest synchronous primitive.

pub mod cipher;
#[cfg(test)]
mod crash_tests;
pub mod luks;
pub mod luks1;
pub mod luks2;
pub mod plain;
pub mod secret;
pub mod target;
