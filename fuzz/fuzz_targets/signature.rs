//! Arbitrary bytes as a detached PKCS#7/CMS signature (a dm-verity root hash signature, an
//! fs-verity built-in signature, a signed manifest): checking it never panics and gives either
//! an error naming the signature or one of the two trusted signers — a signature that verifies
//! is over the message, so it verifies over no other.
//!
//! The trusted certificates (fuzz/fixtures/signature/, an RSA-2048 and a P-256 key whose
//! private halves were discarded) signed the seeds (fuzz/seeds/signature/): detached, with and
//! without signed attributes and embedded certificates, and CMS naming the signer by subject
//! key identifier, so mutations start from structures that reach the signature check.

#![no_main]

use dmkit::sig::{verify_detached_der, Message};
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What the seeds signed.
const MESSAGE: &[u8] = b"dmkit fuzz: the signed message";

const CERTS: [(&str, &[u8]); 2] = [
    ("rsa.der", include_bytes!("../fixtures/signature/rsa.der")),
    ("ec.der", include_bytes!("../fixtures/signature/ec.der")),
];

/// The certificates as files (the API takes paths), written once per process.
fn certs() -> &'static [PathBuf] {
    static CERT_FILES: OnceLock<Vec<PathBuf>> = OnceLock::new();
    CERT_FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dmkit-fuzz-signature-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        CERTS
            .iter()
            .map(|(name, der)| {
                let path = dir.join(name);
                std::fs::write(&path, der).expect("write a certificate");
                path
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let name = Path::new("fuzz.sig");
    let message = Message::new(MESSAGE, "the fuzz message");
    match verify_detached_der(&message, data, name, certs()) {
        Ok(signer) => {
            assert!(
                signer.subject == "CN=dmkit fuzz rsa" || signer.subject == "CN=dmkit fuzz ec",
                "verified by a stranger: {}",
                signer.subject
            );
            let other = Message::new(b"dmkit fuzz: another message", "another message");
            assert!(
                verify_detached_der(&other, data, name, certs()).is_err(),
                "one signature verifies over two messages"
            );
        }
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.starts_with("fuzz.sig: "),
                "error not naming the signature: {text}"
            );
            assert!(!text.contains('\n'), "error on several lines: {text}");
        }
    }
});
