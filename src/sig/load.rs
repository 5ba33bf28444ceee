//! Reading keys, certificates and signatures: PEM or DER files of bounded size, each error
//! naming the file.

use std::fs;
use std::io::Read;
use std::path::Path;

use openssl::pkey::{PKey, Private};
use openssl::x509::X509;

use super::{one_line, ossl_reason, SignatureError};

/// Largest signature, certificate or key file read (1 MiB); the kernel's user keys hold at
/// most 32767 bytes, so anything near this is not a signature.
const MAX_FILE_SIZE: u64 = 1 << 20;

/// Reads a whole file of at most [`MAX_FILE_SIZE`] bytes.
fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let file = fs::File::open(path).map_err(|e| one_line(&e.to_string()))?;
    let mut buf = Vec::new();
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| one_line(&e.to_string()))?;
    if buf.len() as u64 > MAX_FILE_SIZE {
        return Err(format!("larger than {MAX_FILE_SIZE} bytes"));
    }
    Ok(buf)
}

/// True if `data` looks like PEM text (a `-----BEGIN` line, possibly after other text).
fn looks_like_pem(data: &[u8]) -> bool {
    data.windows(10).any(|w| w == b"-----BEGIN")
}

/// The length of the outer DER element (header and content), if its length is definite and
/// the header is complete; `None` for indefinite-length BER or a short header.
fn der_total_len(data: &[u8]) -> Option<usize> {
    let first = *data.get(1)?;
    if first < 0x80 {
        return Some(2 + first as usize);
    }
    let n = (first & 0x7f) as usize;
    if n == 0 || n > 4 {
        // Indefinite length (BER), or absurdly long: let the parser decide.
        return None;
    }
    let mut len = 0usize;
    for i in 0..n {
        len = (len << 8) | *data.get(2 + i)? as usize;
    }
    len.checked_add(2 + n)
}

/// Loads every certificate of a PEM file (one or several) or the one of a DER file.
pub(crate) fn load_certs(path: &Path) -> Result<Vec<X509>, SignatureError> {
    let data = read_limited(path).map_err(|reason| SignatureError::CertificateUnreadable {
        path: path.to_path_buf(),
        reason,
    })?;
    let garbled = |reason: String| SignatureError::CertificateGarbled {
        path: path.to_path_buf(),
        reason,
    };
    if data.is_empty() {
        return Err(garbled("empty file".into()));
    }
    if looks_like_pem(&data) {
        let certs = X509::stack_from_pem(&data).map_err(|e| garbled(ossl_reason(&e)))?;
        if certs.is_empty() {
            return Err(garbled("no CERTIFICATE block in the PEM file".into()));
        }
        Ok(certs)
    } else {
        if data[0] != 0x30 {
            return Err(garbled("neither PEM text nor a DER SEQUENCE".into()));
        }
        if der_total_len(&data).is_some_and(|n| n != data.len()) {
            return Err(garbled(
                "the file's length does not match the DER structure's".into(),
            ));
        }
        let cert = X509::from_der(&data).map_err(|e| garbled(ossl_reason(&e)))?;
        Ok(vec![cert])
    }
}

/// Loads the certificates of every file in `paths`, in order.
pub(crate) fn load_trusted(paths: &[impl AsRef<Path>]) -> Result<Vec<X509>, SignatureError> {
    if paths.is_empty() {
        return Err(SignatureError::NoCertificates);
    }
    let mut trusted = Vec::new();
    for path in paths {
        trusted.extend(load_certs(path.as_ref())?);
    }
    Ok(trusted)
}

/// Loads the private key of a PEM (or DER) file, refusing passphrase-protected keys without
/// ever prompting.
pub(crate) fn load_key(path: &Path) -> Result<PKey<Private>, SignatureError> {
    let data = read_limited(path).map_err(|reason| SignatureError::KeyUnreadable {
        path: path.to_path_buf(),
        reason,
    })?;
    let garbled = |reason: String| SignatureError::KeyGarbled {
        path: path.to_path_buf(),
        reason,
    };
    if data.is_empty() {
        return Err(garbled("empty file".into()));
    }
    if looks_like_pem(&data) {
        if data.windows(9).any(|w| w == b"ENCRYPTED") {
            return Err(garbled(
                "the key is passphrase-protected; decrypt it first (openssl pkey -in KEY -out PLAIN)"
                    .into(),
            ));
        }
        // A callback that supplies no passphrase, so OpenSSL never prompts on the terminal.
        PKey::private_key_from_pem_callback(&data, |_buf| Ok(0))
            .map_err(|e| garbled(ossl_reason(&e)))
    } else {
        PKey::private_key_from_der(&data).map_err(|e| garbled(ossl_reason(&e)))
    }
}

/// Reads a signature file (bounded in size; framing is checked by [`check_signature_framing`]).
pub(crate) fn read_signature(path: &Path) -> Result<Vec<u8>, SignatureError> {
    read_limited(path).map_err(|reason| SignatureError::SignatureUnreadable {
        path: path.to_path_buf(),
        reason,
    })
}

/// Checks that `data` can be a DER signature before OpenSSL parses it, so the common mistakes
/// (empty, PEM, truncated, trailing bytes) get a precise message naming `path`.
pub(crate) fn check_signature_framing(data: &[u8], path: &Path) -> Result<(), SignatureError> {
    let garbled = |reason: String| SignatureError::SignatureGarbled {
        path: path.to_path_buf(),
        reason,
    };
    if data.is_empty() {
        return Err(garbled("empty file".into()));
    }
    if looks_like_pem(data) {
        return Err(garbled(
            "the file is PEM; the kernel needs DER (openssl pkcs7 -in SIG -outform der)".into(),
        ));
    }
    if data[0] != 0x30 {
        return Err(garbled("does not start with a DER SEQUENCE".into()));
    }
    if let Some(n) = der_total_len(data) {
        if n > data.len() {
            return Err(garbled(format!(
                "truncated: the DER structure needs {n} bytes, the file has {}",
                data.len()
            )));
        }
        if n < data.len() {
            return Err(garbled(format!(
                "{} bytes of trailing data after the DER structure",
                data.len() - n
            )));
        }
    }
    Ok(())
}
