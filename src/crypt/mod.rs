//! dm-crypt in userspace: sector ciphers (aes-xts-plain64, ...), the crypt target, plain mode,
//! and the LUKS2/LUKS1 on-disk formats.
//!
//! The crypto runs inline on the thread serving the request (the lesson of the Cloudflare
//! study, "Speeding up Linux disk encryption", 2020): no queues, no thread hops, the fastest synchronous primitive.

pub mod aead;
pub mod aead_device;
mod aes_x86;
mod block_cipher;
mod cbc;
pub mod cipher;
#[cfg(test)]
mod crash_tests;
pub mod device;
mod evp;
mod iv;
mod lrw;
pub mod luks;
pub mod luks1;
pub mod luks2;
pub mod plain;
pub mod secret;
#[cfg(test)]
mod tests;
mod twofish;
mod xts;
