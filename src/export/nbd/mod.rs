//! An NBD server (the Network Block Device protocol, fixed newstyle) for every layer dmkit
//! opens: what QEMU, cloud-hypervisor, `nbd-client`/`nbd.ko`, libnbd's tools and other hosts
//! speak, where the FUSE file serves only this machine.
//!
//! - [`proto`]: the protocol's numbers and message encodings;
//! - [`wire`]: the buffered byte stream to a client (batched replies, zero-copy reads);
//! - [`handshake`]: option negotiation (`GO`, `INFO`, `LIST`, `ABORT`, `STRUCTURED_REPLY`,
//!   `STARTTLS`, `EXPORT_NAME`; everything else `NBD_REP_ERR_UNSUP`);
//! - [`request`]: request headers and the checks that bound every length and range;
//! - [`transmit`]: running requests on the device (READ, WRITE, FLUSH, FUA, TRIM,
//!   WRITE_ZEROES, DISC) with structured or simple replies, inline;
//! - [`inflight`]: the same with a connection's READs in flight at once, for devices that
//!   wait on a network (remote images);
//! - [`export`]: what the server says about the export (flags, block sizes);
//! - [`replay`]: the protocol code on in-memory client bytes (tests, fuzzing);
//! - [`listen`]: `unix:PATH` / `tcp:HOST:PORT` addresses; [`tls`]: X.509 and PSK through
//!   OpenSSL; [`server`]: the accept loop, a thread per connection, the connection cap.
//!
//! Decrypted data never crosses a network in clear unless asked: [`NbdConfig::new`] refuses a
//! TCP address that is not loopback without TLS, unless `insecure` says so.

pub mod export;
pub mod handshake;
pub mod inflight;
pub mod listen;
pub mod proto;
pub mod replay;
pub mod request;
pub mod server;
pub mod tls;
pub mod transmit;
pub mod wire;

pub use export::{ExportInfo, MAX_PAYLOAD};
pub use listen::Address;
pub use server::{NbdServer, NbdStatus};
pub use tls::{TlsConfig, TlsCredentials};

use std::sync::Arc;

/// Connections served at once when no cap is given.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;

/// How to serve a device over NBD.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    /// Where to listen.
    pub address: Address,
    /// TLS, required of every client when present.
    pub tls: Option<Arc<TlsConfig>>,
    /// Connections in transmission at once; more are closed at once (connections still
    /// negotiating do not count, see [`server`]).
    pub max_connections: usize,
}

impl NbdConfig {
    /// Check and load an NBD configuration: `address` as [`Address::parse`] takes it, TLS
    /// credentials loaded now (so a bad file is reported before anything is opened). A TCP
    /// address that is not loopback needs TLS, unless `insecure`. Errors are one line naming
    /// the option or file at fault.
    pub fn new(
        address: &str,
        tls: Option<&TlsCredentials>,
        insecure: bool,
        max_connections: usize,
    ) -> Result<NbdConfig, String> {
        let address = Address::parse(address).map_err(|e| format!("--nbd {e}"))?;
        if !(1..=1024).contains(&max_connections) {
            return Err(format!(
                "--nbd-max-connections: {max_connections} is out of range (1 to 1024)"
            ));
        }
        if tls.is_none() && !insecure && !address.is_local() {
            return Err(format!(
                "--nbd {address}: not a loopback address: serving the device beyond this \
                 machine needs TLS (--tls-cert and --tls-key, or --tls-psk), or --insecure to \
                 send its data in clear"
            ));
        }
        let tls = tls.map(TlsConfig::load).transpose()?.map(Arc::new);
        Ok(NbdConfig {
            address,
            tls,
            max_connections,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_needs_tls_or_insecure() {
        let e = NbdConfig::new("tcp:0.0.0.0:10809", None, false, 16).unwrap_err();
        assert!(e.contains("needs TLS") && e.contains("--insecure"), "{e}");
        assert!(NbdConfig::new("tcp:0.0.0.0:10809", None, true, 16).is_ok());
        assert!(NbdConfig::new("tcp:127.0.0.1:10809", None, false, 16).is_ok());
        assert!(NbdConfig::new("unix:/tmp/x.sock", None, false, 16).is_ok());
        assert!(NbdConfig::new("unix:/tmp/x.sock", None, false, 0).is_err());
        assert!(NbdConfig::new("tcp:1.2.3.4", None, false, 16).is_err());
        assert!(NbdConfig::new("bogus", None, false, 16)
            .unwrap_err()
            .starts_with("--nbd bogus"));
    }
}
