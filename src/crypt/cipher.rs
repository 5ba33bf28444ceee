//! Sector ciphers as dm-crypt names them ("aes-xts-plain64", "aes-cbc-essiv:sha256", ...).
//!
//! The API every user of a cipher codes against (the crypt target, LUKS keyslot areas):
//! a [`CipherSpec`] parsed from dm-crypt's name, and a [`SectorCipher`] that encrypts or
//! decrypts whole sectors in place given the IV sector number of the first one.

/// A parsed dm-crypt cipher specification: `cipher-chainmode-ivmode[:ivopts]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CipherSpec {
    /// Block cipher, e.g. "aes".
    pub cipher: String,
    /// Chaining mode, e.g. "xts", "cbc".
    pub mode: String,
    /// IV generator, e.g. "plain64", "plain", "essiv", "benbi".
    pub iv: String,
    /// IV generator option, e.g. "sha256" for essiv.
    pub iv_opt: Option<String>,
}

/// Encrypts or decrypts whole sectors in place.
///
/// `iv_sector` is the IV sector number of the first sector in `buf` (already adjusted for
/// `iv_offset` and `iv_large_sectors` by the caller); consecutive sectors get consecutive
/// IV sector numbers. `buf.len()` is a multiple of `sector_size`.
pub trait SectorCipher: Send + Sync {
    /// Encrypt `buf` in place.
    fn encrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize);
    /// Decrypt `buf` in place.
    fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize);
    /// Key size in bytes this cipher was made with.
    fn key_size(&self) -> usize;
}
