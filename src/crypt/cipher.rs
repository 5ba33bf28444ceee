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
//! over RustCrypto's block ciphers. Keys and key schedules live in secret memory
//! ([`super::secret`]) and are never printed.

use super::iv::IvGen;
use super::secret::SecretBytes;
use std::fmt;

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
        if !super::block_cipher::NAMES.contains(&cipher) {
            return Err(unsupported(format!(
                "block cipher '{cipher}' is not supported (supported: aes, serpent, twofish)"
            )));
        }
        if !matches!(mode, "xts" | "cbc" | "lrw") {
            return Err(unsupported(format!(
                "chaining mode '{mode}' is not supported (supported: xts, cbc, lrw)"
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
            ("essiv", Some(h)) if super::iv::ESSIV_HASHES.contains(&h) => {}
            ("essiv", Some(h)) => {
                return Err(unsupported(format!(
                    "essiv hash '{h}' is not supported (supported: {})",
                    super::iv::ESSIV_HASHES.join(", ")
                )))
            }
            _ => {
                return Err(unsupported(format!(
                    "IV mode '{iv}' is not supported (supported: plain64, plain, plain64be, essiv:HASH, benbi, null)"
                )))
            }
        }
        if mode != "cbc" && iv == "null" {
            return Err(unsupported(format!(
                "{mode} with a null IV would reuse tweaks across sectors; refused"
            )));
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

    /// The key sizes this cipher accepts, in bytes: the block cipher's (128, 192, 256 bits);
    /// twice that for XTS (two keys); plus a 16-byte tweak key for LRW.
    pub fn valid_key_sizes(&self) -> &'static [usize] {
        match self.mode.as_str() {
            "xts" => &[32, 48, 64],
            "lrw" => &[32, 40, 48],
            _ => &[16, 24, 32],
        }
    }

    /// cryptsetup's default key size for this cipher, in bytes: 512 bits for XTS (two keys),
    /// 256 otherwise.
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
    super::aes_x86::available()
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
    super::secret::burn_stack();
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
            super::aes_x86::XtsVaes::new(key, iv).ok_or(CipherError::Unavailable("vaes-avx512"))?,
        )),
        CipherImpl::Auto | CipherImpl::OpenSsl if evp => {
            Ok(Box::new(super::evp::EvpSectorCipher::new(&spec, key, iv)?))
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
        super::block_cipher::new_block_cipher(&spec.cipher, k).ok_or_else(|| CipherError::KeySize {
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
            Box::new(super::xts::Xts::new(keyed(k1)?, keyed(k2)?, iv, key.len()))
        }
        "lrw" => {
            let (k, tweak) = key.split_at(key.len() - 16);
            let tweak: &[u8; 16] = tweak.try_into().expect("a 16-byte tweak key");
            Box::new(super::lrw::Lrw::new(keyed(k)?, tweak, iv, key.len()))
        }
        _ => Box::new(super::cbc::Cbc::new(keyed(key)?, iv, key.len())),
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
            "serpent-xts-plain64",
            "twofish-cbc-essiv:wp256",
            "aes-lrw-benbi",
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
            ("des-xts-plain64", "block cipher 'des'"),
            ("aes-ctr-plain64", "chaining mode 'ctr'"),
            ("aes-xts-lmk", "IV mode 'lmk'"),
            ("aes-cbc-essiv", "essiv needs a hash"),
            ("aes-cbc-essiv:md5", "essiv hash 'md5'"),
            ("aes-xts-plain64:x", "takes no option"),
            ("aes-xts-null", "null IV"),
            ("serpent-lrw-null", "null IV"),
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
