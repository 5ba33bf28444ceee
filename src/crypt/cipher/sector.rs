//! The contract every sector cipher implements (XTS, LRW, CBC, the VAES and OpenSSL paths):
//! a leaf that the implementations and the dispatcher import, so no
//! implementation depends on the code that chooses between them.

/// Encrypts or decrypts whole sectors in place.
///
/// `iv_sector` is the IV sector number of the first sector in `buf` (already adjusted for
/// `iv_offset` and `iv_large_sectors` by the caller); consecutive sectors get consecutive
/// IV sector numbers. `buf.len()` is a multiple of `sector_size`.
///
/// `sector_size` must be a non-zero multiple of 16 (dm-crypt uses 512..4096) and `buf.len()`
/// a multiple of it; anything else is a programming error and panics.
pub trait SectorCipher: Send + Sync {
    /// Encrypt `buf` in place.
    fn encrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize);
    /// Encrypt `src` into `dst` (the same length): what copying `src` to `dst` and
    /// [`encrypt`](Self::encrypt)ing it gives, without the copy where the implementation can
    /// read one buffer and write another.
    fn encrypt_to(&self, src: &[u8], dst: &mut [u8], iv_sector: u64, sector_size: usize) {
        dst.copy_from_slice(src);
        self.encrypt(dst, iv_sector, sector_size);
    }
    /// Decrypt `buf` in place.
    fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize);
    /// Key size in bytes this cipher was made with.
    fn key_size(&self) -> usize;
    /// Which implementation runs ("vaes-avx512", "openssl-evp"), for benchmarks and status.
    fn implementation(&self) -> &'static str {
        "generic"
    }
}

/// Check the [`SectorCipher`] buffer contract; panics on misuse (a programming error).
pub(crate) fn check_buf(len: usize, sector_size: usize) {
    assert!(
        sector_size >= 16 && sector_size.is_multiple_of(16),
        "sector size {sector_size} is not a non-zero multiple of 16"
    );
    assert!(
        len.is_multiple_of(sector_size),
        "buffer of {len} bytes is not a whole number of {sector_size}-byte sectors"
    );
}
