//! TLS for NBD's `STARTTLS`, through OpenSSL (already the project's crypto library): X.509
//! (a certificate and key, optionally a CA whose certificates clients must present), or a
//! pre-shared key from a file in the format qemu's `tls-creds-psk` and nbdkit's `--tls-psk`
//! read (`identity:hexkey` per line, as GnuTLS' psktool writes it). Only TLS 1.2 and later
//! are offered.

use openssl::ssl::{SslAcceptor, SslFiletype, SslMethod, SslStream, SslVerifyMode, SslVersion};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// TLS 1.2 suites offered with a PSK (TLS 1.3 uses its own, all AEAD): key exchanges with
/// forward secrecy first, AEAD ciphers only.
const PSK_CIPHERS: &str = "kECDHEPSK:kDHEPSK:kPSK:!SHA1:!aNULL:!eNULL:!CBC";

/// Where the server's TLS credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsCredentials {
    /// A certificate (chain) and its key, PEM; with a CA file, clients must present a
    /// certificate it signed.
    X509 {
        /// Certificate chain file (`--tls-cert`).
        cert: PathBuf,
        /// Private key file (`--tls-key`).
        key: PathBuf,
        /// CA certificates that sign acceptable client certificates (`--tls-ca`).
        ca: Option<PathBuf>,
    },
    /// Pre-shared keys (`--tls-psk FILE`).
    Psk(PathBuf),
}

/// A loaded TLS configuration, ready to accept connections.
pub struct TlsConfig {
    acceptor: SslAcceptor,
    kind: &'static str,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("kind", &self.kind)
            .finish()
    }
}

/// One error line naming the file and the option.
fn err(path: &Path, option: &str, what: impl std::fmt::Display) -> String {
    format!("{} ({option}): {what}", path.display())
}

/// The keys of a PSK file: identities and keys, the keys wiped when dropped.
pub struct PskKeys(Vec<(String, Zeroizing<Vec<u8>>)>);

impl PskKeys {
    /// Parse a PSK file's text (`identity:hexkey` lines; blank lines ignored). `path` names
    /// the file in errors, which never quote a key.
    pub fn parse(text: &str, path: &Path) -> Result<PskKeys, String> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let Some((id, hexkey)) = line.split_once(':') else {
                return Err(err(
                    path,
                    "--tls-psk",
                    format!("line {n}: not identity:hexkey"),
                ));
            };
            if id.is_empty() || id.len() > 128 {
                return Err(err(
                    path,
                    "--tls-psk",
                    format!("line {n}: the identity must be 1 to 128 bytes"),
                ));
            }
            let key = Zeroizing::new(hex::decode(hexkey.trim()).map_err(|_| {
                err(
                    path,
                    "--tls-psk",
                    format!("line {n}: the key of {id:?} is not hexadecimal"),
                )
            })?);
            if key.len() < 16 || key.len() > 256 {
                return Err(err(
                    path,
                    "--tls-psk",
                    format!(
                        "line {n}: the key of {id:?} must be 16 to 256 bytes, not {}",
                        key.len()
                    ),
                ));
            }
            if keys.iter().any(|(k, _): &(String, _)| k == id) {
                return Err(err(
                    path,
                    "--tls-psk",
                    format!("line {n}: identity {id:?} appears twice"),
                ));
            }
            keys.push((id.to_string(), key));
        }
        if keys.is_empty() {
            return Err(err(path, "--tls-psk", "holds no key"));
        }
        Ok(PskKeys(keys))
    }

    /// The key of `identity`.
    pub fn get(&self, identity: &[u8]) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(id, _)| id.as_bytes() == identity)
            .map(|(_, k)| &k[..])
    }

    /// How many identities there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TlsConfig {
    /// Load `creds`: a missing or malformed file, or a key that does not match its
    /// certificate, is an error naming the file and the option.
    pub fn load(creds: &TlsCredentials) -> Result<TlsConfig, String> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        let kind = match creds {
            TlsCredentials::X509 { cert, key, ca } => {
                for (p, o) in [(cert, "--tls-cert"), (key, "--tls-key")] {
                    std::fs::metadata(p).map_err(|e| err(p, o, e))?;
                }
                b.set_certificate_chain_file(cert)
                    .map_err(|e| err(cert, "--tls-cert", format!("not a PEM certificate: {e}")))?;
                b.set_private_key_file(key, SslFiletype::PEM)
                    .map_err(|e| err(key, "--tls-key", format!("not a PEM private key: {e}")))?;
                b.check_private_key().map_err(|_| {
                    err(
                        key,
                        "--tls-key",
                        format!("does not match the certificate {}", cert.display()),
                    )
                })?;
                match ca {
                    Some(ca) => {
                        std::fs::metadata(ca).map_err(|e| err(ca, "--tls-ca", e))?;
                        b.set_ca_file(ca).map_err(|e| {
                            err(ca, "--tls-ca", format!("not PEM certificates: {e}"))
                        })?;
                        let names =
                            openssl::x509::X509Name::load_client_ca_file(ca).map_err(|e| {
                                err(ca, "--tls-ca", format!("not PEM certificates: {e}"))
                            })?;
                        b.set_client_ca_list(names);
                        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
                        "x509, client certificates required"
                    }
                    None => "x509",
                }
            }
            TlsCredentials::Psk(path) => {
                let text = Zeroizing::new(
                    std::fs::read_to_string(path).map_err(|e| err(path, "--tls-psk", e))?,
                );
                let keys = PskKeys::parse(&text, path)?;
                b.set_cipher_list(PSK_CIPHERS)
                    .map_err(|e| format!("cannot set up TLS-PSK: {e}"))?;
                b.set_psk_server_callback(move |_ssl, identity, out| {
                    // An unknown identity (or a key too long for OpenSSL's buffer) is a
                    // length of 0: the handshake fails.
                    Ok(match identity.and_then(|id| keys.get(id)) {
                        Some(k) if k.len() <= out.len() => {
                            out[..k.len()].copy_from_slice(k);
                            k.len()
                        }
                        _ => 0,
                    })
                });
                "psk"
            }
        };
        Ok(TlsConfig {
            acceptor: b.build(),
            kind,
        })
    }

    /// What kind of credentials, for `status`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Run the server side of a TLS handshake on `stream`.
    pub fn accept<S: Read + Write>(&self, stream: S) -> io::Result<SslStream<S>> {
        self.acceptor.accept(stream).map_err(|e| {
            let msg = match &e {
                openssl::ssl::HandshakeError::SetupFailure(s) => s.to_string(),
                openssl::ssl::HandshakeError::Failure(m) => m.error().to_string(),
                openssl::ssl::HandshakeError::WouldBlock(_) => "timed out".to_string(),
            };
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("TLS handshake failed: {msg}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_are_checked_line_by_line() {
        let p = Path::new("/k.psk");
        let k = PskKeys::parse(
            "alice:000102030405060708090a0b0c0d0e0f\n\nbob:ffeeddccbbaa99887766554433221100aa\n",
            p,
        )
        .unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.get(b"alice").unwrap()[15], 15);
        assert!(k.get(b"carol").is_none());
        for (bad, why) in [
            ("alice", "line 1: not identity:hexkey"),
            (":00", "identity must be"),
            ("a:zz", "not hexadecimal"),
            ("a:0011", "must be 16 to 256 bytes"),
            ("", "holds no key"),
        ] {
            let e = PskKeys::parse(bad, p).err().unwrap();
            assert!(e.starts_with("/k.psk (--tls-psk): "), "{e}");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let twice = "a:000102030405060708090a0b0c0d0e0f\na:000102030405060708090a0b0c0d0e0f";
        assert!(PskKeys::parse(twice, p).err().unwrap().contains("line 2"));
    }

    #[test]
    fn missing_credentials_name_the_file_and_option() {
        let e = TlsConfig::load(&TlsCredentials::X509 {
            cert: "/nonexistent/c.pem".into(),
            key: "/nonexistent/k.pem".into(),
            ca: None,
        })
        .unwrap_err();
        assert!(e.starts_with("/nonexistent/c.pem (--tls-cert): "), "{e}");
        let e = TlsConfig::load(&TlsCredentials::Psk("/nonexistent/p".into())).unwrap_err();
        assert!(e.starts_with("/nonexistent/p (--tls-psk): "), "{e}");
    }
}
