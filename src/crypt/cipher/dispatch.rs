//! From a [`CipherSpec`] and a key to a running [`SectorCipher`]: the one place that names
//! every implementation (VAES + AVX-512, OpenSSL's EVP, our portable modes) and picks the
//! fastest this machine runs.

use super::aes_x86;
use super::block_cipher;
use super::cbc::Cbc;
use super::evp::EvpSectorCipher;
use super::iv::IvGen;
use super::lrw::Lrw;
use super::sector::SectorCipher;
use super::spec::{CipherError, CipherSpec};
use super::xts::Xts;
use super::xts_vaes::XtsVaes;
use crate::crypt::secret::{self, SecretBytes};

/// Which implementation [`new_sector_cipher_with`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherImpl {
    /// The fastest available on this CPU (what [`new_sector_cipher`] uses).
    Auto,
    /// Our own VAES + AVX-512 AES-XTS (x86-64 with vaes, vpclmulqdq, avx512f/vl/bw); AES-XTS
    /// with 256- or 512-bit keys only.
    Vaes512,
    /// OpenSSL's EVP, one call per sector; AES-XTS (256, 512 bits) and AES-CBC only.
    OpenSsl,
    /// Our XTS, LRW and CBC over RustCrypto's block ciphers; every cipher.
    Portable,
}

/// Whether this CPU runs the VAES + AVX-512 XTS implementation.
pub fn vaes512_available() -> bool {
    aes_x86::available()
}

/// A sector cipher for `spec` keyed with `key` (the volume key; for XTS both halves, data key
/// first; for LRW the cipher key then the tweak key), using the fastest implementation on this
/// machine.
pub fn new_sector_cipher(
    spec: &CipherSpec,
    key: &[u8],
) -> Result<Box<dyn SectorCipher>, CipherError> {
    new_sector_cipher_with(spec, key, CipherImpl::Auto)
}

/// [`new_sector_cipher`] with a chosen implementation (benchmarks and cross-checks).
pub fn new_sector_cipher_with(
    spec: &CipherSpec,
    key: &[u8],
    imp: CipherImpl,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    let c = build(spec, key, imp);
    // Key schedules built by value (other crates' ciphers) leave copies in dead stack frames.
    secret::burn_stack();
    c
}

fn build(
    spec: &CipherSpec,
    key: &[u8],
    imp: CipherImpl,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    // Re-validate: the fields are public, so a spec may not come from parse().
    let spec = CipherSpec::parse(&spec.to_string())?;
    spec.check_key_size(key.len())?;
    let iv = IvGen::new(&spec, key)?;
    let aes = spec.cipher == "aes";
    let evp = aes && (spec.mode == "cbc" || (spec.mode == "xts" && key.len() != 48));
    let vaes = aes && spec.mode == "xts" && key.len() != 48 && vaes512_available();
    match imp {
        CipherImpl::Vaes512 if !vaes => Err(CipherError::Unavailable("vaes-avx512")),
        CipherImpl::OpenSsl if !evp => Err(CipherError::Unavailable("openssl-evp")),
        CipherImpl::Auto | CipherImpl::Vaes512 if vaes => Ok(Box::new(
            XtsVaes::new(key, iv).ok_or(CipherError::Unavailable("vaes-avx512"))?,
        )),
        CipherImpl::Auto | CipherImpl::OpenSsl if evp => {
            Ok(Box::new(EvpSectorCipher::new(&spec, key, iv)?))
        }
        _ => portable(&spec, key, iv),
    }
}

/// Our modes over RustCrypto's block ciphers.
fn portable(
    spec: &CipherSpec,
    key: &[u8],
    iv: IvGen,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    let keyed = |k: &[u8]| {
        block_cipher::new_block_cipher(&spec.cipher, k).ok_or_else(|| CipherError::KeySize {
            spec: spec.to_string(),
            bits: key.len() * 8,
            valid: spec
                .valid_key_sizes()
                .iter()
                .map(|b| (b * 8).to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    };
    Ok(match spec.mode.as_str() {
        "xts" => {
            let (k1, k2) = key.split_at(key.len() / 2);
            Box::new(Xts::new(keyed(k1)?, keyed(k2)?, iv, key.len()))
        }
        "lrw" => {
            let (k, tweak) = key.split_at(key.len() - 16);
            let tweak: &[u8; 16] = tweak.try_into().expect("a 16-byte tweak key");
            Box::new(Lrw::new(keyed(k)?, tweak, iv, key.len()))
        }
        _ => Box::new(Cbc::new(keyed(key)?, iv, key.len())),
    })
}

/// `len` random bytes from the OS in secret memory (a fresh volume key).
pub fn random_key(len: usize) -> Result<SecretBytes, CipherError> {
    let mut k = SecretBytes::zeroed(len);
    getrandom::getrandom(&mut k).map_err(|e| CipherError::Backend {
        spec: "random key".into(),
        reason: e.to_string(),
    })?;
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_sizes() {
        let xts = CipherSpec::parse("aes-xts-plain64").unwrap();
        assert!(xts.check_key_size(64).is_ok());
        let e = new_sector_cipher(&xts, &[1u8; 40])
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            e,
            "cipher 'aes-xts-plain64': a 320-bit key is not supported (valid: 256, 384, 512 bits)"
        );
        let lrw = CipherSpec::parse("twofish-lrw-benbi").unwrap();
        assert_eq!(lrw.valid_key_sizes(), &[32, 40, 48]);
        assert_eq!(lrw.default_key_size(), 32);
        let cbc = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        assert!(new_sector_cipher(&cbc, &[1u8; 64]).is_err());
        assert_eq!(cbc.default_key_size(), 32);
    }
}
