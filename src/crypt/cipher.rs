//! Sector ciphers as dm-crypt names them ("aes-xts-plain64", "aes-cbc-essiv:sha256", ...).
//!
//! The API every user of a cipher codes against (the crypt target, LUKS keyslot areas):
//! a [`CipherSpec`] parsed from dm-crypt's name, and a [`SectorCipher`] that encrypts or
//! decrypts whole sectors in place given the IV sector number of the first one, made by
//! [`new_sector_cipher`].
//!
//! Supported, with the kernel's IV semantics (`drivers/md/dm-crypt.c`):
//!
//! | spec                    | key sizes (bits) | notes                                        |
//! |-------------------------|------------------|----------------------------------------------|
//! | `aes-xts-plain64`       | 256, 512         | AES-128-XTS / AES-256-XTS, the default       |
//! | `aes-xts-plain`         | 256, 512         | IV = sector number truncated to 32 bits      |
//! | `aes-xts-plain64be`     | 256, 512         | big-endian 64-bit sector in the last 8 bytes |
//! | `aes-xts-benbi`         | 256, 512         | big-endian, 1-based, in 16-byte block units  |
//! | `aes-xts-essiv:sha256`  | 256, 512         | ESSIV over XTS                               |
//! | `aes-cbc-essiv:sha256`  | 128, 192, 256    | also `essiv:sha1`, `essiv:sha512`            |
//! | `aes-cbc-plain64`, `aes-cbc-plain`, `-plain64be`, `-benbi`, `-null` | 128, 192, 256 |   |
//!
//! AES-XTS runs on VAES + AVX-512 (16 blocks per iteration, on the calling thread) when the
//! CPU has it, else on OpenSSL's EVP (which uses AES-NI where present). CBC always runs on
//! OpenSSL's EVP. Keys live in zeroize-on-drop containers and are never printed.

use super::iv::IvGen;
use std::fmt;
use zeroize::Zeroizing;

/// Why a cipher specification or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CipherError {
    /// The specification string is malformed.
    #[error("cipher '{spec}': {reason}")]
    BadSpec {
        /// The specification as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Well-formed but not implemented (another block cipher, chaining mode or IV mode).
    #[error("cipher '{spec}': {reason}")]
    Unsupported {
        /// The specification.
        spec: String,
        /// What is not supported.
        reason: String,
    },
    /// The key has a size this cipher does not take.
    #[error("cipher '{spec}': a {bits}-bit key is not supported (valid: {valid} bits)")]
    KeySize {
        /// The specification.
        spec: String,
        /// Size of the key given, in bits.
        bits: usize,
        /// The valid sizes, e.g. "256, 512".
        valid: String,
    },
    /// The key is refused for another reason (e.g. identical XTS halves, which OpenSSL refuses).
    #[error("cipher '{spec}': {reason}")]
    BadKey {
        /// The specification.
        spec: String,
        /// Why.
        reason: String,
    },
    /// The crypto backend failed to set up.
    #[error("cipher '{spec}': crypto backend: {reason}")]
    Backend {
        /// The specification.
        spec: String,
        /// The backend's message.
        reason: String,
    },
    /// An implementation was asked for that this CPU or build cannot run.
    #[error("cipher implementation '{0}' is not available on this machine")]
    Unavailable(&'static str),
}

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

impl CipherSpec {
    /// Parse dm-crypt's name of a cipher: `aes-xts-plain64`, `aes-cbc-essiv:sha256`, ...
    ///
    /// Only the syntax and the supported combinations are checked here; key sizes are checked
    /// by [`new_sector_cipher`].
    pub fn parse(s: &str) -> Result<CipherSpec, CipherError> {
        let bad = |reason: &str| CipherError::BadSpec {
            spec: s.to_string(),
            reason: reason.to_string(),
        };
        let unsupported = |reason: String| CipherError::Unsupported {
            spec: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(bad("empty cipher specification (example: aes-xts-plain64)"));
        }
        if s.starts_with("capi:") {
            return Err(unsupported(
                "kernel crypto API names (capi:...) are not supported; use cipher-mode-iv, e.g. aes-xts-plain64".into(),
            ));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':' || b == b'_')
        {
            return Err(bad(
                "unexpected character (expected cipher-mode-iv, e.g. aes-xts-plain64)",
            ));
        }
        let parts: Vec<&str> = s.split('-').collect();
        let (cipher, mode, ivpart) = match parts.as_slice() {
            [c, m, iv] => (*c, *m, *iv),
            [_] | [_, _] => {
                return Err(bad(
                    "expected cipher-mode-iv with an IV mode, e.g. aes-xts-plain64 or aes-cbc-essiv:sha256",
                ))
            }
            _ => return Err(bad("too many '-' (expected cipher-mode-iv, e.g. aes-xts-plain64)")),
        };
        if cipher.is_empty() || mode.is_empty() || ivpart.is_empty() {
            return Err(bad(
                "empty component (expected cipher-mode-iv, e.g. aes-xts-plain64)",
            ));
        }
        let (iv, iv_opt) = match ivpart.split_once(':') {
            Some((iv, opt)) => {
                if iv.is_empty() || opt.is_empty() || opt.contains(':') {
                    return Err(bad("malformed IV option (expected e.g. essiv:sha256)"));
                }
                (iv, Some(opt.to_string()))
            }
            None => (ivpart, None),
        };
        if cipher != "aes" {
            return Err(unsupported(format!(
                "block cipher '{cipher}' is not supported (supported: aes)"
            )));
        }
        if mode != "xts" && mode != "cbc" {
            return Err(unsupported(format!(
                "chaining mode '{mode}' is not supported (supported: xts, cbc)"
            )));
        }
        match (iv, iv_opt.as_deref()) {
            ("plain64" | "plain" | "plain64be" | "benbi" | "null", None) => {}
            ("plain64" | "plain" | "plain64be" | "benbi" | "null", Some(o)) => {
                return Err(bad(&format!("IV mode '{iv}' takes no option, got ':{o}'")))
            }
            ("essiv", None) => {
                return Err(bad("essiv needs a hash, e.g. essiv:sha256"));
            }
            ("essiv", Some("sha256" | "sha1" | "sha512")) => {}
            ("essiv", Some(h)) => {
                return Err(unsupported(format!(
                    "essiv hash '{h}' is not supported (supported: sha256, sha1, sha512)"
                )))
            }
            _ => {
                return Err(unsupported(format!(
                    "IV mode '{iv}' is not supported (supported: plain64, plain, plain64be, essiv:HASH, benbi, null)"
                )))
            }
        }
        if mode == "xts" && iv == "null" {
            return Err(unsupported(
                "xts with a null IV would reuse tweaks across sectors; refused".into(),
            ));
        }
        Ok(CipherSpec {
            cipher: cipher.to_string(),
            mode: mode.to_string(),
            iv: iv.to_string(),
            iv_opt,
        })
    }

    /// Parse LUKS1's split form: `cipher_name` "aes" and `cipher_mode` "xts-plain64".
    pub fn from_luks1(cipher_name: &str, cipher_mode: &str) -> Result<CipherSpec, CipherError> {
        CipherSpec::parse(&format!("{cipher_name}-{cipher_mode}"))
    }

    /// LUKS1's `cipher_mode` field: "xts-plain64", "cbc-essiv:sha256".
    pub fn luks1_mode(&self) -> String {
        match &self.iv_opt {
            Some(o) => format!("{}-{}:{o}", self.mode, self.iv),
            None => format!("{}-{}", self.mode, self.iv),
        }
    }

    /// The key sizes this cipher accepts, in bytes (XTS keys are two AES keys).
    pub fn valid_key_sizes(&self) -> &'static [usize] {
        if self.mode == "xts" {
            &[32, 64]
        } else {
            &[16, 24, 32]
        }
    }

    /// cryptsetup's default key size for this cipher, in bytes (512 bits for XTS, 256 for CBC).
    pub fn default_key_size(&self) -> usize {
        if self.mode == "xts" {
            64
        } else {
            32
        }
    }

    /// Check a key size (bytes) against [`valid_key_sizes`](Self::valid_key_sizes).
    pub fn check_key_size(&self, len: usize) -> Result<(), CipherError> {
        let valid = self.valid_key_sizes();
        if valid.contains(&len) {
            return Ok(());
        }
        Err(CipherError::KeySize {
            spec: self.to_string(),
            bits: len * 8,
            valid: valid
                .iter()
                .map(|b| (b * 8).to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

impl fmt::Display for CipherSpec {
    /// dm-crypt's name: `aes-xts-plain64`, `aes-cbc-essiv:sha256`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.cipher, self.luks1_mode())
    }
}

impl std::str::FromStr for CipherSpec {
    type Err = CipherError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CipherSpec::parse(s)
    }
}

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
    /// Decrypt `buf` in place.
    fn decrypt(&self, buf: &mut [u8], iv_sector: u64, sector_size: usize);
    /// Key size in bytes this cipher was made with.
    fn key_size(&self) -> usize;
    /// Which implementation runs ("vaes-avx512", "openssl-evp"), for benchmarks and status.
    fn implementation(&self) -> &'static str {
        "generic"
    }
}

/// Which implementation [`new_sector_cipher_with`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherImpl {
    /// The fastest available on this CPU (what [`new_sector_cipher`] uses).
    Auto,
    /// Our own VAES + AVX-512 AES-XTS (x86-64 with vaes, vpclmulqdq, avx512f/vl/bw); XTS only.
    Vaes512,
    /// OpenSSL's EVP, one call per sector.
    OpenSsl,
}

/// Whether this CPU runs the VAES + AVX-512 XTS implementation.
pub fn vaes512_available() -> bool {
    super::aes_x86::available()
}

/// A sector cipher for `spec` keyed with `key` (the volume key; for XTS both halves, data key
/// first), using the fastest implementation on this machine.
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
    // Re-validate: the fields are public, so a spec may not come from parse().
    let spec = CipherSpec::parse(&spec.to_string())?;
    spec.check_key_size(key.len())?;
    let iv = IvGen::new(&spec, key)?;
    let vaes = spec.mode == "xts" && vaes512_available();
    match imp {
        CipherImpl::Vaes512 if !vaes => Err(CipherError::Unavailable("vaes-avx512")),
        CipherImpl::Auto | CipherImpl::Vaes512 if vaes => Ok(Box::new(
            super::aes_x86::XtsVaes::new(key, iv).ok_or(CipherError::Unavailable("vaes-avx512"))?,
        )),
        _ => Ok(Box::new(super::evp::EvpSectorCipher::new(&spec, key, iv)?)),
    }
}

/// `len` random bytes from the OS in a zeroize-on-drop buffer (a fresh volume key).
pub fn random_key(len: usize) -> Result<Zeroizing<Vec<u8>>, CipherError> {
    let mut k = Zeroizing::new(vec![0u8; len]);
    getrandom::getrandom(&mut k).map_err(|e| CipherError::Backend {
        spec: "random key".into(),
        reason: e.to_string(),
    })?;
    Ok(k)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for s in [
            "aes-xts-plain64",
            "aes-xts-plain",
            "aes-cbc-essiv:sha256",
            "aes-cbc-plain64",
            "aes-xts-benbi",
            "aes-cbc-null",
            "aes-xts-plain64be",
        ] {
            let c = CipherSpec::parse(s).unwrap();
            assert_eq!(c.to_string(), s);
        }
        let c = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        assert_eq!(c.iv, "essiv");
        assert_eq!(c.iv_opt.as_deref(), Some("sha256"));
        assert_eq!(c.luks1_mode(), "cbc-essiv:sha256");
        assert_eq!(
            CipherSpec::from_luks1("aes", "xts-plain64")
                .unwrap()
                .to_string(),
            "aes-xts-plain64"
        );
    }

    #[test]
    fn clear_errors() {
        let cases = [
            ("", "empty"),
            ("aes", "expected cipher-mode-iv"),
            ("aes-xts", "expected cipher-mode-iv"),
            ("aes-xts-plain64-x", "too many"),
            ("serpent-xts-plain64", "block cipher 'serpent'"),
            ("aes-ctr-plain64", "chaining mode 'ctr'"),
            ("aes-xts-lmk", "IV mode 'lmk'"),
            ("aes-cbc-essiv", "essiv needs a hash"),
            ("aes-cbc-essiv:md5", "essiv hash 'md5'"),
            ("aes-xts-plain64:x", "takes no option"),
            ("aes-xts-null", "null IV"),
            ("capi:xts(aes)-plain64", "capi"),
            ("aes-xts-pla in", "unexpected character"),
        ];
        for (s, want) in cases {
            let e = CipherSpec::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(e.starts_with(&format!("cipher '{s}'")), "{e}");
        }
    }

    #[test]
    fn key_sizes() {
        let xts = CipherSpec::parse("aes-xts-plain64").unwrap();
        assert!(xts.check_key_size(64).is_ok());
        let e = new_sector_cipher(&xts, &[1u8; 48])
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            e,
            "cipher 'aes-xts-plain64': a 384-bit key is not supported (valid: 256, 512 bits)"
        );
        let cbc = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        assert!(new_sector_cipher(&cbc, &[1u8; 64]).is_err());
        assert_eq!(cbc.default_key_size(), 32);
    }
}
