//! The unverified side of `bench remote`'s 0 ms rows: dmkit's own remote device (the same
//! transport, fetchers and read-ahead as `verity open` of a URL) served raw over NBD, with no
//! verity layer above it, so dmkit verified / dmkit unverified is the cost of verification
//! alone. Run by the hidden `dmkit bench serve-remote URL SOCKET` in the foreground until it is
//! killed; never a way to open an image for use (nothing it serves is checked).

use crate::export::nbd::{inflight::WORKERS, NbdConfig, NbdServer};
use crate::remote::device::{RemoteDevice, RemoteOptions};
use crate::remote::objects::Objects;
use crate::remote::{HttpOptions, Location};
use std::path::Path;
use std::sync::Arc;

/// The export name it serves (the one the other readers of the bench serve).
pub const EXPORT: &str = "bench";

/// Serve the object at `url` raw on the Unix socket `socket`; returns only on an error (one
/// line naming the URL or the socket).
pub fn serve(url: &str, socket: &Path) -> Result<(), String> {
    let loc = Location::parse(url).map_err(|e| format!("{url}: {e}"))?;
    let remote = RemoteOptions::default();
    // As `verity open` sizes its client (see `cli::remote`).
    let http = HttpOptions::default();
    let http = HttpOptions {
        connections: http.connections.max(remote.fetchers + WORKERS / 2),
        ..http
    };
    let source = Objects::new(http)
        .open(&loc)
        .map_err(|e| format!("{url}: {e}"))?;
    let device = Arc::new(RemoteDevice::new(source, remote));
    let cfg = NbdConfig::new(&format!("unix:{}", socket.display()), None, false, 16)?;
    let _server = NbdServer::serve_device(cfg, EXPORT, device)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    loop {
        std::thread::park();
    }
}
