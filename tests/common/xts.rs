//! AES-XTS over dm-crypt sectors with OpenSSL (plain64 IVs in 512-byte units), independent of
//! dmkit's ciphers: what a test uses to check data another tool's key encrypts.

use openssl::symm::{Cipher, Crypter, Mode};

/// Encrypt (or decrypt) `data`, sectors of `sector_size` bytes whose first has IV sector
/// `first_iv`, with the AES-XTS key `key` (32 or 64 bytes).
pub fn xts(key: &[u8], data: &[u8], sector_size: usize, first_iv: u64, encrypt: bool) -> Vec<u8> {
    let c = if key.len() == 64 {
        Cipher::aes_256_xts()
    } else {
        Cipher::aes_128_xts()
    };
    let mode = if encrypt {
        Mode::Encrypt
    } else {
        Mode::Decrypt
    };
    let mut out = Vec::with_capacity(data.len());
    for (n, sector) in data.chunks(sector_size).enumerate() {
        let mut iv = [0u8; 16];
        let iv_sector = first_iv + (n * sector_size / 512) as u64;
        iv[..8].copy_from_slice(&iv_sector.to_le_bytes());
        let mut cr = Crypter::new(c, mode, key, Some(&iv)).unwrap();
        cr.pad(false);
        let mut buf = vec![0u8; sector.len() + 16];
        let k = cr.update(sector, &mut buf).unwrap();
        out.extend_from_slice(&buf[..k]);
    }
    out
}
