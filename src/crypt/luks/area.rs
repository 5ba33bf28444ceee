//! Encryption of keyslot areas (the AF-split key material): 512-byte sectors with IV sectors
//! counted from 0 at the start of the area, as cryptsetup's `LUKS2_encrypt_to_storage` and
//! LUKS1's `LUKS_encrypt_to_storage` do. The data-path sector ciphers do the work.

use super::LuksError;
use crate::crypt::cipher::{new_sector_cipher, CipherSpec, SectorCipher};

const SECTOR: usize = 512;

fn cipher(encryption: &str, key: &[u8]) -> Result<Box<dyn SectorCipher>, LuksError> {
    // cryptsetup decrypts keyslot areas with OpenSSL, whose names ignore case ("AES").
    let spec = CipherSpec::parse(&encryption.to_ascii_lowercase())
        .map_err(|e| LuksError::Unsupported(e.to_string()))?;
    new_sector_cipher(&spec, key).map_err(|e| LuksError::Unsupported(e.to_string()))
}

/// Whether `encryption` ("aes-xts-plain64", ...) with a key of `key_len` bytes is supported.
pub fn check(encryption: &str, key_len: usize) -> Result<(), LuksError> {
    // A patterned probe key: XTS refuses keys whose two halves are equal.
    let key: Vec<u8> = (0..key_len).map(|i| i as u8).collect();
    cipher(encryption, &key).map(|_| ())
}

/// Encrypt (or decrypt) `buf`, a whole number of 512-byte sectors, in place.
pub fn crypt(encryption: &str, key: &[u8], buf: &mut [u8], encrypt: bool) -> Result<(), LuksError> {
    if !buf.len().is_multiple_of(SECTOR) {
        return Err(LuksError::Invalid(
            "keyslot area is not whole sectors".into(),
        ));
    }
    let c = cipher(encryption, key)?;
    if encrypt {
        c.encrypt(buf, 0, SECTOR);
    } else {
        c.decrypt(buf, 0, SECTOR);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for (enc, klen) in [
            ("aes-xts-plain64", 64),
            ("aes-xts-plain64", 32),
            ("aes-cbc-essiv:sha256", 32),
            ("aes-cbc-plain64", 16),
            ("serpent-xts-plain64", 64),
            ("twofish-cbc-essiv:sha256", 32),
            ("aes-lrw-benbi", 48),
        ] {
            let key: Vec<u8> = (0..klen as u8).map(|b| b.wrapping_mul(7)).collect();
            let plain: Vec<u8> = (0..2048u32).map(|i| i as u8).collect();
            let mut buf = plain.clone();
            crypt(enc, &key, &mut buf, true).unwrap();
            assert_ne!(buf, plain);
            crypt(enc, &key, &mut buf, false).unwrap();
            assert_eq!(buf, plain, "{enc}");
        }
        assert!(check("des-xts-plain64", 64).is_err());
        assert!(check("twofish-xts-plain64", 40).is_err());
    }
}
