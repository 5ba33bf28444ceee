//! Detached PKCS#7 signatures over arbitrary messages, made and checked as the kernel's
//! keyrings check them: one implementation for dm-verity root hash signatures
//! ([`crate::verity::sig`]), fs-verity built-in file signatures ([`crate::fsverity::sign`],
//! [`crate::fsverity::verify`]) and any other signed message.
//!
//! - [`sign_detached`]: a DER PKCS#7 `signedData` without signed attributes and without
//!   certificates, its content left out, with a chosen digest algorithm — the bytes of
//!   `openssl smime -sign -noattr -nocerts -binary -outform der -md ALG` (deterministic for RSA,
//!   randomized for ECDSA).
//! - [`verify_detached`] / [`verify_detached_der`]: checks such a signature (also with signed
//!   attributes, embedded certificates, or CMS naming the signer by subject key identifier, as
//!   the kernel accepts them) against certificates trusted as given, like keys in a kernel
//!   keyring: no chain is built, no dates are checked, and a certificate embedded in the
//!   signature is never trusted. A signature that embeds its content is refused, as the kernel
//!   refuses it.
//!
//! Every error names the file and what is wrong on one line; [`Message::what`] lets the caller
//! say what was signed ("root hash 4392…", "the fs-verity digest sha256:… of FILE").
//!
//! Known differences from the kernel: it also accepts a signer certificate embedded in the
//! signature if a keyring key signed it; dmkit accepts only the given certificates themselves.
//! With several signers, every signer must be among the given certificates (OpenSSL's rule),
//! where the kernel needs only one trusted signer.

mod error;
mod load;
mod ossl;
mod sign;
mod verify;

pub use error::SignatureError;
pub use sign::sign_detached;
pub use verify::{verify_detached, verify_detached_der, VerifiedSigner};

pub(crate) use load::{
    check_signature_framing, load_certs, load_key, load_trusted, read_signature,
};
pub(crate) use ossl::{one_line, ossl_reason};
pub(crate) use verify::verify_loaded;

/// A signed message: its exact bytes, and what they are for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The bytes the signature is over, exactly.
    pub content: &'a [u8],
    /// What they are, as messages name them after "signing" and "does not verify over", e.g.
    /// `root hash 4392…` or `the fs-verity digest sha256:… of FILE`.
    pub what: &'a str,
}

impl<'a> Message<'a> {
    /// The message `content`, named `what` in errors.
    pub fn new(content: &'a [u8], what: &'a str) -> Self {
        Message { content, what }
    }
}
