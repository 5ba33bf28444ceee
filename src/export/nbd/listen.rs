//! Where the NBD server listens: `unix:PATH` or `tcp:HOST:PORT`, parsed, checked and bound.
//!
//! TCP binds the loopback address when no host is given (`tcp::10809`, `tcp:10809`). A Unix
//! socket is created owner-only (0600) under a temporary name and renamed into place, so no
//! one else can connect even for a moment; a stale socket at the path (nobody listening) is
//! replaced, a live one or any other file is refused.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The IANA port of NBD, used when a TCP address names none.
pub const DEFAULT_PORT: u16 = 10809;

/// A listening address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A Unix socket at this (absolute) path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl Address {
    /// Parse `unix:PATH` or `tcp:[HOST:]PORT` (HOST a name, an IPv4 address or a bracketed
    /// IPv6 address; loopback when empty or absent).
    pub fn parse(s: &str) -> Result<Address, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(format!("{s}: the socket path is empty"));
            }
            let p = std::path::absolute(p).map_err(|e| format!("{s}: {e}"))?;
            // sun_path holds 108 bytes with the terminating NUL.
            if p.as_os_str().len() > 100 {
                return Err(format!(
                    "{s}: the socket path is too long for a Unix socket (100 bytes at most)"
                ));
            }
            return Ok(Address::Unix(p));
        }
        let Some(rest) = s.strip_prefix("tcp:") else {
            return Err(format!("{s}: not unix:PATH or tcp:HOST:PORT"));
        };
        let (host, port) = match rest.rsplit_once(':') {
            // An IPv6 address without a port: its last colon is inside the brackets.
            Some((h, p)) if !p.contains(']') => (h, p),
            _ => ("", rest),
        };
        let port: u16 = if port.is_empty() {
            DEFAULT_PORT
        } else {
            port.parse()
                .map_err(|_| format!("{s}: {port:?} is not a port number"))?
        };
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        // "localhost" is the loopback by definition (RFC 6761), with or without /etc/hosts.
        if host.is_empty() || host.eq_ignore_ascii_case("localhost") {
            return Ok(Address::Tcp(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            )));
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Address::Tcp(SocketAddr::new(ip, port)));
        }
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("{s}: cannot resolve {host:?}: {e}"))?
            .collect();
        // A name for the loopback may resolve to ::1 and 127.0.0.1: prefer IPv4, which every
        // client reaches.
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .map(Address::Tcp)
            .ok_or_else(|| format!("{s}: {host:?} resolves to no address"))
    }

    /// Whether only this machine can connect: a Unix socket, or a loopback TCP address.
    pub fn is_local(&self) -> bool {
        match self {
            Address::Unix(_) => true,
            Address::Tcp(a) => a.ip().is_loopback(),
        }
    }

    /// The NBD URI of `export` at this address (`nbds` with TLS).
    pub fn uri(&self, export: &str, tls: bool) -> String {
        let s = if tls { "s" } else { "" };
        match self {
            Address::Unix(p) => format!("nbd{s}+unix:///{export}?socket={}", p.display()),
            Address::Tcp(a) => format!("nbd{s}://{a}/{export}"),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A bound, listening socket.
pub enum Listener {
    /// On a Unix socket (the path is removed when the server stops).
    Unix(UnixListener, PathBuf),
    /// On TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Bind `addr` and listen. The actual address is [`Listener::address`] (the port when
    /// `addr` asked for port 0).
    pub fn bind(addr: &Address) -> io::Result<Listener> {
        let ctx =
            |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let l = match addr {
            Address::Tcp(a) => {
                Listener::Tcp(TcpListener::bind(a).map_err(ctx(format!("tcp:{a}: cannot listen")))?)
            }
            Address::Unix(p) => {
                let l =
                    bind_unix(p).map_err(ctx(format!("unix:{}: cannot listen", p.display())))?;
                Listener::Unix(l, p.clone())
            }
        };
        match &l {
            Listener::Unix(u, _) => u.set_nonblocking(true)?,
            Listener::Tcp(t) => t.set_nonblocking(true)?,
        }
        Ok(l)
    }

    /// The address listened on.
    pub fn address(&self) -> Address {
        match self {
            Listener::Unix(_, p) => Address::Unix(p.clone()),
            Listener::Tcp(t) => Address::Tcp(
                t.local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0))),
            ),
        }
    }
}

/// Bind a Unix socket at `path`, owner-only, replacing a stale socket.
fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "a server already listens there",
                ));
            }
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let l = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(s: &str) -> SocketAddr {
        match Address::parse(s).unwrap() {
            Address::Tcp(a) => a,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn addresses_parse_with_loopback_defaults() {
        assert_eq!(tcp("tcp::10810"), "127.0.0.1:10810".parse().unwrap());
        assert_eq!(tcp("tcp:10810"), "127.0.0.1:10810".parse().unwrap());
        assert_eq!(tcp("tcp:"), "127.0.0.1:10809".parse().unwrap());
        assert_eq!(tcp("tcp:[::1]:5"), "[::1]:5".parse().unwrap());
        assert_eq!(tcp("tcp:0.0.0.0:7"), "0.0.0.0:7".parse().unwrap());
        assert_eq!(tcp("tcp:localhost:7"), "127.0.0.1:7".parse().unwrap());
        assert!(Address::parse("tcp:1.2.3.4:99999").is_err());
        assert!(Address::parse("udp:1").is_err());
        assert!(Address::parse("unix:").is_err());
        assert!(Address::parse(&format!("unix:/{}", "a".repeat(120))).is_err());
        assert!(Address::parse("tcp:127.0.0.1:1").unwrap().is_local());
        assert!(!Address::parse("tcp:0.0.0.0:1").unwrap().is_local());
        assert!(Address::parse("unix:/x").unwrap().is_local());
        assert_eq!(
            Address::parse("unix:/run/a.sock").unwrap().uri("n", false),
            "nbd+unix:///n?socket=/run/a.sock"
        );
        assert_eq!(
            Address::Tcp(tcp("tcp::1")).uri("n", true),
            "nbds://127.0.0.1:1/n"
        );
    }

    #[test]
    fn unix_sockets_are_private_and_replace_only_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let a = Address::Unix(p.clone());
        let l = Listener::bind(&a).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert!(Listener::bind(&a).is_err(), "a live socket is not replaced");
        drop(l);
        let l2 = Listener::bind(&a).unwrap();
        assert_eq!(l2.address(), a);
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"x").unwrap();
        assert!(
            Listener::bind(&a).is_err(),
            "a regular file is not replaced"
        );
        let t = Listener::bind(&Address::parse("tcp:127.0.0.1:0").unwrap()).unwrap();
        match t.address() {
            Address::Tcp(a) => assert_ne!(a.port(), 0),
            other => panic!("{other:?}"),
        }
    }
}
