//! dm-crypt's cipher names parsed and checked: [`CipherSpec`] (`cipher-chainmode-ivmode[:ivopts]`)
//! and [`CipherError`], the error every cipher constructor returns.

use super::block_cipher;
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
    /// by [`new_sector_cipher`](super::new_sector_cipher).
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
        if !block_cipher::NAMES.contains(&cipher) {
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
            ("essiv", Some(h)) if ESSIV_HASHES.contains(&h) => {}
            ("essiv", Some(h)) => {
                return Err(unsupported(format!(
                    "essiv hash '{h}' is not supported (supported: {})",
                    ESSIV_HASHES.join(", ")
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

/// The ESSIV hashes: kernel crypto names (`wpN` is Whirlpool cut to N bits).
pub(crate) const ESSIV_HASHES: &[&str] = &[
    "sha1", "sha224", "sha256", "sha384", "sha512", "wp256", "wp384", "wp512",
];

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
}
