//! Sector ciphers as dm-crypt names them ("aes-xts-plain64", "aes-cbc-essiv:sha256", ...).
//!
//! The API every user of a cipher codes against (the crypt target, LUKS keyslot areas):
//! a [`CipherSpec`] parsed from dm-crypt's name, and a [`SectorCipher`] that encrypts or
//! decrypts whole sectors in place given the IV sector number of the first one, made by
//! [`new_sector_cipher`].
//!
//! Supported, with the kernel's IV semantics (`drivers/md/dm-crypt.c`):
//!
//! | cipher                       | mode  | key sizes (bits) | notes                              |
//! |------------------------------|-------|------------------|------------------------------------|
//! | `aes`, `serpent`, `twofish`  | `xts` | 256, 384, 512    | two keys: data key, then tweak key |
//! | `aes`, `serpent`, `twofish`  | `cbc` | 128, 192, 256    |                                    |
//! | `aes`, `serpent`, `twofish`  | `lrw` | 256, 320, 384    | cipher key, then a 128-bit tweak key |
//!
//! IV modes: `plain64`, `plain`, `plain64be`, `benbi`, `null` (CBC only) and `essiv:HASH`
//! (sha1, sha224, sha256, sha384, sha512, wp256, wp384, wp512). Examples: `aes-xts-plain64`
//! (the default), `serpent-xts-plain64`, `twofish-cbc-essiv:sha256`, `aes-lrw-benbi`.
//!
//! AES-XTS with a 256- or 512-bit key runs on VAES + AVX-512 (16 blocks per iteration, on the
//! calling thread) when the CPU has it, else on OpenSSL's EVP (which uses AES-NI where
//! present); AES-CBC always runs on OpenSSL's EVP. Everything else runs our XTS, LRW and CBC
//! over the block ciphers of `block_cipher` (serpent with AVX-512 or AVX2 lanes). Keys and key schedules live in secret memory
//! ([`crate::crypt::secret`]) and are never printed.
//!
//! The rooms: [`CipherSpec`] and [`CipherError`] (`spec`) and the [`SectorCipher`] contract
//! (`sector`) are leaves every implementation imports; the implementations (`xts`, `lrw`,
//! `cbc` over the block ciphers of `block_cipher`, `xts_vaes`, `evp`) and the IV generators
//! (`iv`) import only those; `dispatch` is the one file that names every implementation.
//! [`SectorAead`] is the authenticated primitive of LUKS2 `--integrity`, built on them.

mod aead;
mod aes_x86;
mod block;
mod block_cipher;
mod cbc;
mod dispatch;
mod evp;
mod iv;
mod lanes512;
mod lrw;
mod sector;
mod serpent;
mod spec;
#[cfg(test)]
mod tests;
mod twofish;
mod xts;
mod xts_vaes;

pub use aead::{AeadError, AeadKind, SectorAead};
pub use dispatch::{
    new_sector_cipher, new_sector_cipher_with, random_key, vaes512_available, CipherImpl,
};
pub use sector::SectorCipher;
pub use spec::{CipherError, CipherSpec};
