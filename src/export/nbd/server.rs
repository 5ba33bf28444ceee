//! The NBD server of one device: an accept thread, and one thread per connection that runs
//! the handshake and then serves the connection's requests inline (no queue between the
//! socket and the device), or, for a device that waits on a network, with a small pool of
//! workers per connection ([`super::inflight`]). Connections share the device, its read-modify-write lock and its
//! flush, which is what makes `NBD_FLAG_CAN_MULTI_CONN` true: a FLUSH on any connection
//! flushes the device, so every write any connection has completed is durable when it is
//! answered.
//!
//! A client cannot hold the server: the handshake must finish within [`HANDSHAKE_TIMEOUT`]
//! (a deadline for the whole handshake, TLS included, not per read: the accept thread shuts
//! down a connection still negotiating after it), a client that stops reading its replies is
//! dropped after [`SEND_TIMEOUT`], and stopping the server ends every connection.
//!
//! The connection cap (`--nbd-max-connections`) counts connections in transmission only: a
//! connection that never finishes its handshake takes no slot a real client needs. New
//! connections are closed at once while the cap is full; connections still negotiating are
//! at most [`MAX_HANDSHAKES`], and a new one takes the place of the oldest, so idle sockets
//! cannot lock real clients out (a real client negotiates in milliseconds). A handshake that
//! ends while the cap is full (others finished first) is closed before transmission.

use super::export::ExportInfo;
use super::handshake::{Handshake, Outcome, Tls};
use super::inflight;
use super::listen::{Address, Listener};
use super::tls::TlsConfig;
use super::transmit::{CounterValues, Counters, Ending, Transmission};
use super::wire::{Socket, Stream, Wire};
use super::NbdConfig;
use crate::export::bytes::ByteDevice;
use crate::logcap::LogCap;
use serde::Serialize;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time a client has to finish the handshake (TLS included), from its connection: qemu-nbd's
/// default `--handshake-limit`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections negotiating at once; one more takes the place of the oldest.
pub const MAX_HANDSHAKES: usize = 32;
/// Time a reply may wait for a client that does not read.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(120);
/// Socket buffer asked for each way.
pub const SOCKET_BUFFER: usize = 4 << 20;

/// One connected client as `status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ClientStatus {
    /// Where it connects from: `HOST:PORT`, or the process behind a Unix socket.
    pub peer: String,
    /// When it connected (seconds since the epoch).
    pub since: u64,
    /// Whether the connection runs TLS.
    pub tls: bool,
    /// `handshake` or `transmission`.
    pub phase: &'static str,
    /// Its counters.
    #[serde(flatten)]
    pub counters: CounterValues,
}

/// The server as `status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct NbdStatus {
    /// The URI clients connect to.
    pub uri: String,
    /// The listening address.
    pub listen: String,
    /// `none`, or the kind of TLS credentials.
    pub tls: String,
    /// The connection cap.
    pub max_connections: usize,
    /// Connections accepted since the start.
    pub connections: u64,
    /// Connections closed at once because of the cap.
    pub refused: u64,
    /// Counters of every connection so far.
    pub totals: CounterValues,
    /// The clients connected now.
    pub clients: Vec<ClientStatus>,
}

struct Client {
    id: u64,
    peer: String,
    since: u64,
    /// When it connected, for the handshake deadline.
    started: Instant,
    tls: AtomicBool,
    /// Set (under the clients lock) when it takes a slot of the cap.
    transmitting: AtomicBool,
    /// Why the server cut its handshake short, for the log.
    cut: Mutex<Option<&'static str>>,
    counters: Counters,
    /// A duplicate of the connection's socket, to shut it down from outside.
    fd: OwnedFd,
}

struct Shared {
    export: ExportInfo,
    bytes: Arc<ByteDevice>,
    tls: Option<Arc<TlsConfig>>,
    max_connections: usize,
    clients: Mutex<Vec<Arc<Client>>>,
    /// Signalled when a connection ends.
    gone: Condvar,
    totals: Counters,
    accepted: AtomicU64,
    refused: AtomicU64,
    next_id: AtomicU64,
    handles: Mutex<Vec<JoinHandle<()>>>,
    log: LogCap,
}

/// A running NBD server; stopped by [`NbdServer::stop`] (or when dropped).
pub struct NbdServer {
    shared: Arc<Shared>,
    address: Address,
    uri: String,
    accept: Option<JoinHandle<()>>,
    wake: Option<OwnedFd>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn set_timeout(fd: RawFd, opt: libc::c_int, t: Option<Duration>) {
    let tv = match t {
        Some(t) => libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            tv_usec: t.subsec_micros() as libc::suseconds_t,
        },
        None => libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: setsockopt(2) with a timeval that outlives the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

/// Ask for socket buffers of [`SOCKET_BUFFER`] each way (the kernel caps them at
/// `net.core.wmem_max`/`rmem_max`): a 1 MiB read reply then goes into the socket whole, and the
/// connection's thread moves on to the next request while the client drains it.
fn set_buffers(fd: RawFd) {
    let size = SOCKET_BUFFER as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: setsockopt(2) with an int that outlives the call.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}

fn shutdown(fd: &OwnedFd, how: libc::c_int) {
    // SAFETY: shutdown(2) on a socket descriptor we own.
    unsafe { libc::shutdown(fd.as_raw_fd(), how) };
}

impl NbdServer {
    /// Listen at `config.address` and serve `bytes` as `export` to every client that
    /// connects, until stopped.
    pub(crate) fn start(
        config: NbdConfig,
        export: ExportInfo,
        bytes: Arc<ByteDevice>,
    ) -> io::Result<NbdServer> {
        let listener = Listener::bind(&config.address)?;
        let address = listener.address();
        let uri = address.uri(&export.name, config.tls.is_some());
        // SAFETY: eventfd(2) with plain flags; the descriptor is owned right below.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned only here.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let shared = Arc::new(Shared {
            export,
            bytes,
            tls: config.tls,
            max_connections: config.max_connections.max(1),
            clients: Mutex::new(Vec::new()),
            gone: Condvar::new(),
            totals: Counters::default(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            handles: Mutex::new(Vec::new()),
            log: LogCap::new("NBD connection messages", 1000),
        });
        let sh = shared.clone();
        let wake_fd = wake.as_raw_fd();
        let accept = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept_loop(sh, listener, wake_fd))?;
        Ok(NbdServer {
            shared,
            address,
            uri,
            accept: Some(accept),
            wake: Some(wake),
        })
    }

    /// Serve `device` alone as export `name` (no daemon, no FUSE file), until stopped: for
    /// programs that embed the server, and tests.
    pub fn serve_device(
        config: NbdConfig,
        name: &str,
        device: Arc<dyn crate::block::BlockDevice>,
    ) -> io::Result<NbdServer> {
        let export = ExportInfo::new(
            name,
            "",
            device.size(),
            device.logical_block_size(),
            device.read_only(),
            false,
        );
        Self::start(config, export, Arc::new(ByteDevice::new(device)))
    }

    /// The URI clients connect to.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The address listened on.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The clients connected now.
    pub fn client_count(&self) -> usize {
        lock(&self.shared.clients).len()
    }

    /// The totals of every connection so far.
    pub fn totals(&self) -> CounterValues {
        self.shared.totals.values()
    }

    /// What `status` shows.
    pub fn status(&self) -> NbdStatus {
        let clients = lock(&self.shared.clients)
            .iter()
            .map(|c| ClientStatus {
                peer: c.peer.clone(),
                since: c.since,
                tls: c.tls.load(Ordering::Relaxed),
                phase: if c.transmitting.load(Ordering::Relaxed) {
                    "transmission"
                } else {
                    "handshake"
                },
                counters: c.counters.values(),
            })
            .collect();
        NbdStatus {
            uri: self.uri.clone(),
            listen: self.address.to_string(),
            tls: self
                .shared
                .tls
                .as_ref()
                .map(|t| t.kind().to_string())
                .unwrap_or_else(|| "none".into()),
            max_connections: self.shared.max_connections,
            connections: self.shared.accepted.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
            totals: self.shared.totals.values(),
            clients,
        }
    }

    /// Stop: no new connections; every connection is ended (its request in progress is
    /// answered first, for up to a second) and its thread joined, up to `wait`. Then the
    /// device is flushed if anything was written, and a Unix socket's path removed.
    pub fn stop(&mut self, wait: Duration) {
        let Some(wake) = self.wake.take() else {
            return;
        };
        let one: u64 = 1;
        // SAFETY: write(2) of 8 bytes to an eventfd we own.
        unsafe { libc::write(wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let deadline = Instant::now() + wait;
        // Reads end first (the thread answers what it is doing, then sees the end), writes
        // too if that takes long (a client that does not read).
        for (how, patience) in [
            (libc::SHUT_RD, Duration::from_secs(1)),
            (libc::SHUT_RDWR, wait),
        ] {
            let until = (Instant::now() + patience).min(deadline);
            let mut g = lock(&self.shared.clients);
            for c in g.iter() {
                shutdown(&c.fd, how);
            }
            while !g.is_empty() && Instant::now() < until {
                g = self
                    .shared
                    .gone
                    .wait_timeout(g, until - Instant::now())
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let handles = std::mem::take(&mut *lock(&self.shared.handles));
        for h in handles {
            if h.is_finished() {
                let _ = h.join();
            }
        }
        if self.shared.totals.values().bytes_written > 0 {
            if let Err(e) = self.shared.bytes.device().flush() {
                eprintln!("dmkit: nbd: flush at shutdown failed: {e}");
            }
        }
        if let Address::Unix(p) = &self.address {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn accept_loop(shared: Arc<Shared>, listener: Listener, wake: RawFd) {
    let lfd = match &listener {
        Listener::Unix(l, _) => l.as_raw_fd(),
        Listener::Tcp(l) => l.as_raw_fd(),
    };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: lfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = expire_handshakes(&shared).map_or(-1, |d| {
            d.as_millis().clamp(1, i32::MAX as u128) as libc::c_int
        });
        // SAFETY: poll(2) on a two-element array that outlives the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            eprintln!(
                "dmkit: nbd: waiting for connections failed: {}",
                io::Error::last_os_error()
            );
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        let accepted = match &listener {
            Listener::Unix(l, _) => l.accept().map(|(s, _)| {
                let peer = unix_peer(s.as_fd().as_raw_fd());
                (OwnedFd::from(s), peer)
            }),
            Listener::Tcp(l) => l.accept().map(|(s, a)| {
                let _ = s.set_nodelay(true);
                (OwnedFd::from(s), a.to_string())
            }),
        };
        match accepted {
            Ok((fd, peer)) => admit(&shared, fd, peer),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                shared.log.log(|| format!("nbd: accept failed: {e}"));
                // EMFILE and the like: do not spin.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The process behind a Unix socket connection.
fn unix_peer(fd: RawFd) -> String {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) of SO_PEERCRED into a ucred of the size given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        format!("pid {} uid {}", cred.pid, cred.uid)
    } else {
        "unix".to_string()
    }
}

/// Shut down every connection still negotiating past [`HANDSHAKE_TIMEOUT`]; the time until
/// the next one's deadline, `None` when none negotiates.
fn expire_handshakes(shared: &Shared) -> Option<Duration> {
    let now = Instant::now();
    let clients = lock(&shared.clients);
    let mut next: Option<Duration> = None;
    for c in clients.iter() {
        if c.transmitting.load(Ordering::Relaxed) || lock(&c.cut).is_some() {
            continue;
        }
        let deadline = c.started + HANDSHAKE_TIMEOUT;
        if deadline <= now {
            *lock(&c.cut) = Some("did not finish the handshake in time");
            shutdown(&c.fd, libc::SHUT_RDWR);
        } else {
            let left = deadline - now;
            next = Some(next.map_or(left, |n| n.min(left)));
        }
    }
    next
}

/// Whether the cap is full: the connections in transmission.
fn cap_full(shared: &Shared, clients: &[Arc<Client>]) -> bool {
    let transmitting = clients
        .iter()
        .filter(|c| c.transmitting.load(Ordering::Relaxed))
        .count();
    transmitting >= shared.max_connections
}

fn log_refused(shared: &Shared, peer: &str) {
    shared.refused.fetch_add(1, Ordering::Relaxed);
    shared.log.log(|| {
        format!(
            "nbd: {peer}: refused, {} connections already (--nbd-max-connections)",
            shared.max_connections
        )
    });
}

/// Take a new connection (accepted sockets are blocking), or close it at once when the cap
/// is full. When [`MAX_HANDSHAKES`] connections negotiate already, the oldest of them is
/// shut down to make room.
fn admit(shared: &Arc<Shared>, fd: OwnedFd, peer: String) {
    let mut clients = lock(&shared.clients);
    if cap_full(shared, &clients) {
        drop(clients);
        log_refused(shared, &peer);
        return;
    }
    let negotiating: Vec<&Arc<Client>> = clients
        .iter()
        .filter(|c| !c.transmitting.load(Ordering::Relaxed) && lock(&c.cut).is_none())
        .collect();
    if negotiating.len() >= MAX_HANDSHAKES {
        if let Some(oldest) = negotiating.iter().min_by_key(|c| c.started) {
            *lock(&oldest.cut) = Some("made room for a new connection");
            shutdown(&oldest.fd, libc::SHUT_RDWR);
        }
    }
    let Ok(dup) = fd.try_clone() else {
        return;
    };
    let client = Arc::new(Client {
        id: shared.next_id.fetch_add(1, Ordering::Relaxed),
        peer,
        since: now_secs(),
        started: Instant::now(),
        tls: AtomicBool::new(false),
        transmitting: AtomicBool::new(false),
        cut: Mutex::new(None),
        counters: Counters::default(),
        fd: dup,
    });
    clients.push(client.clone());
    let n = clients.len();
    drop(clients);
    shared.accepted.fetch_add(1, Ordering::Relaxed);
    shared
        .log
        .log(|| format!("nbd: {} connected ({n} connections)", client.peer));
    let sh = shared.clone();
    let c = client.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("nbd-{}", client.id))
        .spawn(move || connection(sh, Socket(fd), c));
    let mut handles = lock(&shared.handles);
    handles.retain(|h| !h.is_finished());
    match spawned {
        Ok(h) => handles.push(h),
        Err(e) => {
            drop(handles);
            shared
                .log
                .log(|| format!("nbd: {}: cannot start a thread: {e}", client.peer));
            forget(shared, &client);
        }
    }
}

fn forget(shared: &Shared, client: &Client) {
    let mut g = lock(&shared.clients);
    g.retain(|c| c.id != client.id);
    shared.gone.notify_all();
}

/// One connection, from the greeting to the end.
fn connection(shared: Arc<Shared>, sock: Socket, client: Arc<Client>) {
    let fd = sock.as_raw_fd();
    set_timeout(fd, libc::SO_RCVTIMEO, Some(HANDSHAKE_TIMEOUT));
    set_timeout(fd, libc::SO_SNDTIMEO, Some(SEND_TIMEOUT));
    set_buffers(fd);
    let r = negotiate_and_serve(&shared, sock, &client, fd);
    let c = client.counters.values();
    let cut = *lock(&client.cut);
    let how = match (r, cut) {
        (Ok(Some(Ending::Disconnect)), _) => "disconnected".to_string(),
        (Ok(Some(Ending::HungUp)), _) => "hung up".to_string(),
        (Ok(None), _) => "aborted the handshake".to_string(),
        (Err(_), Some(why)) => format!("dropped: {why}"),
        (Err(e), None) => format!("dropped: {e}"),
    };
    shared.log.log(|| {
        format!(
            "nbd: {} {how} ({} requests, {} bytes read, {} written)",
            client.peer, c.requests, c.bytes_read, c.bytes_written
        )
    });
    forget(&shared, &client);
}

fn negotiate_and_serve(
    shared: &Shared,
    sock: Socket,
    client: &Client,
    fd: RawFd,
) -> io::Result<Option<Ending>> {
    // Each connection is told the size the device has now: an online resize changes what
    // new connections see (NBD has no way to tell a connected client).
    let export = ExportInfo {
        size: shared.bytes.size(),
        ..shared.export.clone()
    };
    let mut wire = Wire::new(sock);
    let mut hs = Handshake::greet(&export, &mut wire)?;
    let mode = if shared.tls.is_some() {
        Tls::Required
    } else {
        Tls::Off
    };
    match hs.options(&mut wire, mode)? {
        Outcome::Aborted => Ok(None),
        Outcome::Go { structured } => {
            serve(shared, &export, wire, client, fd, structured).map(Some)
        }
        Outcome::StartTls => {
            let sock = wire.into_stream()?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "data sent before the TLS handshake",
                )
            })?;
            let tls = shared
                .tls
                .as_ref()
                .ok_or_else(|| io::Error::other("no TLS"))?;
            let stream = tls.accept(sock)?;
            client.tls.store(true, Ordering::Relaxed);
            let mut wire = Wire::new(stream);
            match hs.options(&mut wire, Tls::Active)? {
                Outcome::Go { structured } => {
                    serve(shared, &export, wire, client, fd, structured).map(Some)
                }
                Outcome::Aborted | Outcome::StartTls => {
                    wire.close();
                    Ok(None)
                }
            }
        }
    }
}

fn serve<S: Stream>(
    shared: &Shared,
    export: &ExportInfo,
    mut wire: Wire<S>,
    client: &Client,
    fd: RawFd,
    structured: bool,
) -> io::Result<Ending> {
    {
        // The handshake is over: take a slot of the cap, unless others took them all first
        // or the deadline passed meanwhile.
        let clients = lock(&shared.clients);
        if lock(&client.cut).is_some() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "handshake cut"));
        }
        if cap_full(shared, &clients) {
            drop(clients);
            log_refused(shared, &client.peer);
            return Err(io::Error::other("the connection cap is full"));
        }
        client.transmitting.store(true, Ordering::Relaxed);
    }
    // Clients may stay idle between requests as long as they like.
    set_timeout(fd, libc::SO_RCVTIMEO, None);
    // A device that waits on a network gets a connection's requests in flight at once; a
    // local one is served inline (and so is TLS, whose stream cannot be split).
    let out = if shared.bytes.device().blocks_on_network() {
        wire.stream().try_clone_writer()
    } else {
        None
    };
    let r = match out {
        Some(out) => inflight::run(
            export,
            &shared.bytes,
            structured,
            [&client.counters, &shared.totals],
            &mut wire,
            out,
            inflight::WORKERS,
        ),
        None => Transmission::new(
            export,
            &shared.bytes,
            structured,
            &client.counters,
            &shared.totals,
        )
        .run(&mut wire),
    };
    if let Ok(Ending::Disconnect) = r {
        wire.close();
    }
    r
}
