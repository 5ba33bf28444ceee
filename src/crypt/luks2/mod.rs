//! LUKS2, on-disk compatible with cryptsetup: the binary header pair and its JSON metadata,
//! keyslots (PBKDF2/Argon2 + the AF splitter), the volume key digest, and the data segment.
//!
//! The pieces shared with LUKS1 (the AF splitter, the KDFs, keyslot area encryption and the
//! error type) live in `crypt::luks`.
//!
//! Nothing read from disk is trusted: every size and offset is checked against the device
//! before it is used, and the JSON text is screened before it is parsed.

pub mod activate;
pub mod base64;
pub mod convert_key;
pub mod copies;
pub mod digest;
pub mod dump;
pub mod format;
pub mod header;
pub mod integrity;
#[cfg(test)]
mod integrity_tests;
pub mod json;
pub mod jsonc;
pub mod keyslot;
pub mod reencrypt;
pub mod reencrypt_open;
pub mod reencrypt_state;
pub mod signatures;
pub mod token;
pub mod token_text;
pub mod validate;

pub use format::{format, FormatParams};
pub use header::{LoadedHeader, Luks2Header};
pub use json::{Metadata, Segment};
pub use keyslot::{PbkdfKind, PbkdfParams};
