//! TLS for the remote transport: the system CA store by default (OpenSSL's, through
//! native-tls), or only the CAs of a `--ca-file`; a client certificate and key for servers that
//! require one (mutual TLS).
//!
//! Files are read with OpenSSL's PEM readers, so a key may be PKCS#8, PKCS#1 (RSA) or SEC1 (EC);
//! it is handed to native-tls as PKCS#8, the one form it takes. Copies of the key made here are
//! wiped when dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::pkey::PKey;
use openssl::x509::X509;
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
use zeroize::Zeroizing;

/// Where the TLS trust and the client identity come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// Trust only the CA certificates in this PEM file instead of the system store (like
    /// `curl --cacert`).
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM, the chain may follow it) for servers that require one.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM; a private file).
    pub client_key: Option<PathBuf>,
}

/// A TLS file that cannot be used: the file, and why, in one line.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {what}")]
pub struct TlsFileError {
    /// The file (as given).
    pub path: String,
    /// What is wrong with it.
    pub what: String,
}

fn file_error(path: &Path, what: impl Into<String>) -> TlsFileError {
    TlsFileError {
        path: path.display().to_string(),
        what: what.into(),
    }
}

/// The OpenSSL error stack as one short line (its first reason).
fn openssl_line(e: &openssl::error::ErrorStack) -> String {
    e.errors()
        .first()
        .and_then(|e| e.reason().map(str::to_string))
        .unwrap_or_else(|| "not valid PEM".to_string())
}

/// Every certificate in the PEM file at `path`, in DER (at least one).
fn read_certs(path: &Path, option: &str) -> Result<Vec<Certificate<'static>>, TlsFileError> {
    let pem = std::fs::read(path).map_err(|e| file_error(path, format!("{option}: {e}")))?;
    let stack = X509::stack_from_pem(&pem)
        .map_err(|e| file_error(path, format!("{option}: {}", openssl_line(&e))))?;
    if stack.is_empty() {
        return Err(file_error(
            path,
            format!("{option}: no PEM certificate in it"),
        ));
    }
    stack
        .iter()
        .map(|c| {
            c.to_der()
                .map(|der| Certificate::from_der(&der).to_owned())
                .map_err(|e| file_error(path, format!("{option}: {}", openssl_line(&e))))
        })
        .collect()
}

/// The private key in the PEM file at `path`, as PKCS#8.
fn read_key(path: &Path) -> Result<PrivateKey<'static>, TlsFileError> {
    let pem = Zeroizing::new(
        std::fs::read(path).map_err(|e| file_error(path, format!("--client-key: {e}")))?,
    );
    let key = PKey::private_key_from_pem(&pem).map_err(|e| {
        file_error(
            path,
            format!("--client-key: not a PEM private key ({})", openssl_line(&e)),
        )
    })?;
    let pkcs8 = Zeroizing::new(
        key.private_key_to_pem_pkcs8()
            .map_err(|e| file_error(path, format!("--client-key: {}", openssl_line(&e))))?,
    );
    PrivateKey::from_pem(&pkcs8)
        .map_err(|_| file_error(path, "--client-key: the key cannot be used"))
}

/// The TLS configuration for `options`: native-tls (OpenSSL) with the system CA store, or the
/// CAs of `ca_file` only; the client certificate when one is given (with its key).
pub fn tls_config(options: &TlsOptions) -> Result<TlsConfig, TlsFileError> {
    let roots = match &options.ca_file {
        Some(path) => RootCerts::Specific(Arc::new(read_certs(path, "--ca-file")?)),
        // native-tls without `disable_built_in_roots`: OpenSSL's default verify paths, which
        // on Debian are the system store /etc/ssl/certs (ca-certificates).
        None => RootCerts::PlatformVerifier,
    };
    let client = match (&options.client_cert, &options.client_key) {
        (Some(cert), Some(key)) => Some(ClientCert::new_with_certs(
            &read_certs(cert, "--client-cert")?,
            read_key(key)?,
        )),
        (Some(cert), None) => {
            return Err(file_error(cert, "--client-cert needs its --client-key"));
        }
        (None, Some(key)) => {
            return Err(file_error(key, "--client-key needs its --client-cert"));
        }
        (None, None) => None,
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::NativeTls)
        .root_certs(roots)
        .client_cert(client)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_garbage_files_are_named() {
        let dir = std::env::temp_dir().join(format!("dmkit-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, b"not a certificate\n").unwrap();
        let e = tls_config(&TlsOptions {
            ca_file: Some(junk.clone()),
            ..TlsOptions::default()
        })
        .unwrap_err();
        assert!(e
            .to_string()
            .starts_with(&format!("{}: --ca-file", junk.display())));
        let e = tls_config(&TlsOptions {
            client_cert: Some(dir.join("absent.crt")),
            ..TlsOptions::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("needs its --client-key"), "{e}");
        assert!(tls_config(&TlsOptions::default()).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
