//! The NBD options every `open` command takes (`--nbd`, `--no-fuse`, TLS), and their check.
use super::CliError;
use crate::export::nbd::{NbdConfig, TlsCredentials, DEFAULT_MAX_CONNECTIONS};
use std::path::PathBuf;

/// How to serve a device over NBD, besides (or instead of) the FUSE file.
#[derive(clap::Args, Debug, Default)]
pub struct NbdArgs {
    /// Also serve the device over NBD at unix:PATH or tcp:[HOST:]PORT (HOST defaults to the
    /// loopback address; port 0 picks a free port; the URI is printed).
    #[arg(long, value_name = "ADDRESS")]
    pub nbd: Option<String>,
    /// Serve over NBD only, without the FUSE file.
    #[arg(long, requires = "nbd")]
    pub no_fuse: bool,
    /// NBD over TLS with this certificate chain (PEM): TLS is then required of every client.
    #[arg(long, value_name = "FILE", requires_all = ["nbd", "tls_key"], conflicts_with = "tls_psk")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM): NBD clients must present a certificate one of them signed.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// NBD over TLS with pre-shared keys: a file of identity:hexkey lines (psktool's format,
    /// as qemu and nbdkit read it).
    #[arg(long, value_name = "FILE", requires = "nbd")]
    pub tls_psk: Option<PathBuf>,
    /// Allow NBD without TLS on a TCP address that is not loopback: the device's data then
    /// crosses the network in clear.
    #[arg(long, requires = "nbd")]
    pub insecure: bool,
    /// NBD connections served at once (more are closed at once); a connection counts once
    /// its handshake is done, and the handshake must end within 10 s.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub nbd_max_connections: usize,
}

impl NbdArgs {
    /// The checked configuration (TLS files loaded), `None` without `--nbd`. Commands call it
    /// before they read a key or claim a device.
    pub fn config(&self, loop_device: bool) -> Result<Option<NbdConfig>, CliError> {
        if self.no_fuse && loop_device {
            return Err(CliError::invalid(
                "--loop needs the FUSE file: it cannot be combined with --no-fuse",
            ));
        }
        let Some(addr) = &self.nbd else {
            return Ok(None);
        };
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_psk) {
            (Some(cert), Some(key), None) => Some(TlsCredentials::X509 {
                cert: cert.clone(),
                key: key.clone(),
                ca: self.tls_ca.clone(),
            }),
            (None, None, Some(psk)) => Some(TlsCredentials::Psk(psk.clone())),
            _ => None,
        };
        NbdConfig::new(addr, tls.as_ref(), self.insecure, self.nbd_max_connections)
            .map(Some)
            .map_err(CliError::invalid)
    }

    /// Whether the FUSE file is served.
    pub fn fuse(&self) -> bool {
        !self.no_fuse
    }
}
