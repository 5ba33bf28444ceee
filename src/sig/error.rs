//! Why a message could not be signed or its signature was refused.

use std::path::PathBuf;

/// Why a message could not be signed or its signature was refused. Each names the file and
/// what is wrong, on one line; [`SignatureError::NotVerified`] alone means "well formed, but not
/// a valid signature over this message by these certificates".
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// A dm-verity root hash is empty, of odd length or holds a non-hex character.
    #[error("root hash {0:?} is not a hex string (an even number of 0-9a-f digits)")]
    RootHashNotHex(String),
    /// The signature file could not be read.
    #[error("{path}: cannot read signature: {reason}")]
    SignatureUnreadable {
        /// The signature file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The signature is not a DER PKCS#7 signature.
    #[error("{path}: not a DER PKCS#7 signature: {reason}")]
    SignatureGarbled {
        /// The signature file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The signature embeds its content; the kernel takes only detached signatures.
    #[error("{path}: signature embeds its content; the kernel takes only detached signatures (sign without -nodetach)")]
    SignatureNotDetached {
        /// The signature file.
        path: PathBuf,
    },
    /// No certificate was given to check the signature against.
    #[error("no certificate given to check the signature against")]
    NoCertificates,
    /// A certificate file could not be read.
    #[error("{path}: cannot read certificate: {reason}")]
    CertificateUnreadable {
        /// The certificate file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A certificate file holds no PEM or DER X.509 certificate.
    #[error("{path}: not a PEM or DER X.509 certificate: {reason}")]
    CertificateGarbled {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The private key file could not be read.
    #[error("{path}: cannot read private key: {reason}")]
    KeyUnreadable {
        /// The key file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The private key file holds no usable private key.
    #[error("{path}: not a usable private key: {reason}")]
    KeyGarbled {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No certificate in the certificate file carries the private key's public key.
    #[error("{cert}: no certificate matches the private key {key}")]
    KeyCertificateMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// Making the signature failed.
    #[error("{key}: signing {what} failed: {reason}")]
    SigningFailed {
        /// The key file.
        key: PathBuf,
        /// What was being signed ([`super::Message::what`]).
        what: String,
        /// Why.
        reason: String,
    },
    /// The signature is well formed but not a valid signature over this message by any of the
    /// given certificates.
    #[error("{path}: signature does not verify over {what} against the {certs} given certificate(s): {reason}")]
    NotVerified {
        /// The signature file.
        path: PathBuf,
        /// What the message is ([`super::Message::what`]).
        what: String,
        /// How many certificates were given (after splitting PEM bundles).
        certs: usize,
        /// OpenSSL's reason.
        reason: String,
    },
}

impl SignatureError {
    /// Whether this is a verification failure (a well-formed signature that does not verify),
    /// as opposed to unusable input.
    pub fn is_not_verified(&self) -> bool {
        matches!(self, SignatureError::NotVerified { .. })
    }
}
