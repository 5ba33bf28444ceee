//! One device's server: it mounts the FUSE export (and the loop device), answers control
//! requests (`status`, `close`, deferred close), and tears everything down in reverse order.

use super::control::{self, CloseHow, FailKind, Reply, Request};
use super::inuse;
use super::namelock::NameLock;
use super::rundir::{prune_logs, Paths};
use super::state::{self, State};
use super::{io_err, ExportError, ExportSpec, Job, Result, StatsFn, TreeSpec};
use crate::block::online::{Online, RefreshFlags, Unlock};
use crate::block::Claim;
use crate::export::bytes::ByteDevice;
use crate::export::fuse::{self, ExportStats, FuseOptions, Mounted, TransportChoice};
use crate::export::loopdev::{self, LoopDevice};
use crate::export::mountinfo::is_mounted;
use crate::export::nbd::{ExportInfo, NbdConfig, NbdServer};
use serde_json::{json, Value};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a pending deferred close looks whether the device is still used.
const DEFERRED_POLL: Duration = Duration::from_millis(200);
/// How long `close` keeps asking before it says "still in use": a reader that just closed the
/// file is released by the kernel a moment later, and udev probes a new loop device briefly.
const IN_USE_PATIENCE: Duration = Duration::from_millis(1500);

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What the control loop ended with.
pub(super) enum Ending {
    /// `close` asked for it: answer on this connection once the teardown is done.
    Close(UnixStream),
    /// A deferred close found the device unused.
    Deferred,
    /// SIGTERM or SIGINT, or the control loop failed.
    Signal,
}

/// How a job's filesystem gets mounted.
enum Mount {
    Device {
        device: std::sync::Arc<dyn crate::block::BlockDevice>,
        fuse: bool,
        nbd: Option<NbdConfig>,
    },
    Tree(super::TreeMounter),
}

/// What a job brings besides its state.
struct Serve {
    stats: Option<StatsFn>,
    online: Option<Arc<dyn Online>>,
    want_loop: bool,
    want_direct_io: bool,
    claims: Vec<Claim>,
    mount: Mount,
}

pub(super) struct Server {
    paths: Paths,
    lock: Option<NameLock>,
    fuse: Option<Box<dyn Mounted>>,
    nbd: Option<NbdServer>,
    loop_dev: Option<LoopDevice>,
    listener: Option<UnixListener>,
    sigfd: Option<OwnedFd>,
    old_mask: libc::sigset_t,
    stats: Option<StatsFn>,
    online: Option<Arc<dyn Online>>,
    pub state: State,
    want_loop: bool,
    want_direct_io: bool,
    // Held for the server's life: the backing ranges this device maps.
    _claims: Vec<Claim>,
    deferred: bool,
    /// The FUSE transport asked for (`DMKIT_FUSE_TRANSPORT`).
    transport: TransportChoice,
}

impl Server {
    /// Set everything up; on failure, undo what was done and return the error.
    pub fn start(job: Job, paths: Paths, lock: NameLock, pid: u32) -> Result<Server> {
        let threads = job.threads()?;
        let transport = TransportChoice::from_env().map_err(ExportError::Invalid)?;
        prune_logs(&paths.private);
        let (state, serve) = match job {
            Job::Device(spec) => Self::device_state(spec, &paths, pid, threads),
            Job::Tree(spec) => Self::tree_state(spec, &paths, pid, threads),
        };
        // SAFETY: sigset_t is plain data; sigemptyset initializes it right away.
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut server = Server {
            state,
            paths,
            lock: Some(lock),
            fuse: None,
            nbd: None,
            loop_dev: None,
            listener: None,
            sigfd: None,
            old_mask,
            stats: serve.stats,
            online: serve.online,
            want_loop: serve.want_loop,
            want_direct_io: serve.want_direct_io,
            _claims: serve.claims,
            deferred: false,
            transport,
        };
        // Signals are taken through a signalfd in the control loop; block them before any
        // serving thread exists so that every thread inherits the mask.
        // SAFETY: signal set manipulation on local sigset_t values; pthread_sigmask and
        // signalfd with valid pointers.
        let sigfd = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
            libc::signalfd(-1, &set, libc::SFD_CLOEXEC)
        };
        server.old_mask = old_mask;
        if sigfd < 0 {
            let e = io_err("cannot create a signalfd")(io::Error::last_os_error());
            let _ = server.teardown();
            return Err(e);
        }
        // SAFETY: a fresh descriptor owned only here.
        server.sigfd = Some(unsafe { OwnedFd::from_raw_fd(sigfd) });
        let mounted = match serve.mount {
            Mount::Device { device, fuse, nbd } => server.setup_device(device, fuse, nbd, threads),
            Mount::Tree(mount) => server.setup_tree(mount, threads),
        };
        if let Err(e) = mounted.and_then(|()| server.listen()) {
            if let Err(t) = server.teardown() {
                eprintln!("dmkit: {t}");
            }
            return Err(e);
        }
        Ok(server)
    }

    fn device_state(spec: ExportSpec, paths: &Paths, pid: u32, threads: usize) -> (State, Serve) {
        let device = spec.device;
        let state = State {
            name: spec.name,
            kind: spec.kind,
            pid,
            start_ticks: state::start_ticks(pid).unwrap_or(0),
            path: paths.dev.clone(),
            tree: false,
            loop_device: None,
            loop_direct_io: false,
            fuse: spec.fuse,
            nbd_uri: None,
            size: device.size(),
            read_only: device.read_only(),
            allow_discards: spec.allow_discards,
            threads,
            started: now_secs(),
            log: paths.log.clone(),
            claims: spec.claims.iter().map(|c| c.info().clone()).collect(),
            details: spec.details,
        };
        let serve = Serve {
            stats: spec.stats,
            online: spec.online,
            want_loop: spec.loop_device,
            want_direct_io: spec.direct_io_loop,
            claims: spec.claims,
            mount: Mount::Device {
                device,
                fuse: spec.fuse,
                nbd: spec.nbd,
            },
        };
        (state, serve)
    }

    fn tree_state(spec: TreeSpec, paths: &Paths, pid: u32, threads: usize) -> (State, Serve) {
        let state = State {
            name: spec.name,
            kind: spec.kind,
            pid,
            start_ticks: state::start_ticks(pid).unwrap_or(0),
            path: spec.mountpoint,
            tree: true,
            loop_device: None,
            loop_direct_io: false,
            fuse: true,
            nbd_uri: None,
            size: spec.size,
            read_only: true,
            allow_discards: false,
            threads,
            started: now_secs(),
            log: paths.log.clone(),
            claims: Vec::new(),
            details: spec.details,
        };
        let serve = Serve {
            stats: spec.stats,
            online: None,
            want_loop: false,
            want_direct_io: false,
            claims: Vec::new(),
            mount: Mount::Tree(spec.mount),
        };
        (state, serve)
    }

    /// Mount a tree over its mount point (an existing directory, left in place afterwards).
    fn setup_tree(&mut self, mount: super::TreeMounter, threads: usize) -> Result<()> {
        let mp = self.state.path.clone();
        match fs::metadata(&mp) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ExportError::Invalid(format!(
                    "{}: the mount point is not a directory",
                    mp.display()
                )))
            }
            Err(e) => {
                return Err(io_err(format!(
                    "{}: cannot use as mount point",
                    mp.display()
                ))(e))
            }
        }
        let fuse =
            mount(&mp, threads, self.transport).map_err(|e| ExportError::Failed(e.to_string()))?;
        eprintln!(
            "dmkit: {}: serving {} read-only at {} through {}, FUSE 7.{}{}",
            self.state.name,
            self.state.kind,
            mp.display(),
            fuse.transport(),
            fuse.protocol_minor(),
            if fuse.via_fusermount() {
                ", mounted with fusermount3"
            } else {
                ""
            },
        );
        self.fuse = Some(fuse);
        Ok(())
    }

    fn setup_device(
        &mut self,
        device: std::sync::Arc<dyn crate::block::BlockDevice>,
        fuse: bool,
        nbd: Option<NbdConfig>,
        threads: usize,
    ) -> Result<()> {
        let lbs = device.logical_block_size();
        let read_only = device.read_only();
        // One byte access for every exporter: their read-modify-writes exclude each other.
        let bytes = std::sync::Arc::new(ByteDevice::new(device));
        if fuse {
            self.setup_fuse(bytes.clone(), lbs, read_only, threads)?;
        }
        if let Some(cfg) = nbd {
            let info = ExportInfo::new(
                &self.state.name,
                &format!("dmkit {} device {}", self.state.kind, self.state.name),
                self.state.size,
                lbs,
                read_only,
                self.state.allow_discards,
            );
            let tls = cfg.tls.as_ref().map(|t| t.kind());
            let server = NbdServer::start(cfg, info, bytes)
                .map_err(|e| ExportError::Failed(format!("nbd: {e}")))?;
            eprintln!(
                "dmkit: {}: serving {} over NBD at {}{}",
                self.state.name,
                self.state.kind,
                server.uri(),
                tls.map(|k| format!(" (TLS required: {k})"))
                    .unwrap_or_default()
            );
            self.state.nbd_uri = Some(server.uri().to_string());
            self.nbd = Some(server);
        }
        Ok(())
    }

    fn setup_fuse(
        &mut self,
        bytes: std::sync::Arc<ByteDevice>,
        lbs: u32,
        read_only: bool,
        threads: usize,
    ) -> Result<()> {
        let dev = self.paths.dev.clone();
        match fs::symlink_metadata(&dev) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(ExportError::Failed(format!(
                    "{}: exists and is not a regular file",
                    dev.display()
                )))
            }
            Err(_) => {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&dev)
                    .map_err(io_err(format!("{}: cannot create", dev.display())))?;
            }
        }
        let fuse = fuse::mount_device_shared(
            &dev,
            bytes,
            FuseOptions {
                threads,
                allow_discards: self.state.allow_discards,
                transport: self.transport,
            },
        )
        .map_err(|e| ExportError::Failed(e.to_string()))?;
        eprintln!(
            "dmkit: {}: serving {} ({} bytes{}) at {} through {}, FUSE 7.{}{}",
            self.state.name,
            self.state.kind,
            self.state.size,
            if read_only { ", read-only" } else { "" },
            dev.display(),
            fuse.transport(),
            fuse.protocol_minor(),
            if fuse.via_fusermount() {
                ", mounted with fusermount3"
            } else {
                ""
            },
        );
        self.fuse = Some(fuse);
        if self.want_loop {
            let l = loopdev::attach(&dev, read_only, self.want_direct_io, lbs)
                .map_err(|e| ExportError::Failed(e.to_string()))?;
            eprintln!(
                "dmkit: {}: attached {}{}",
                self.state.name,
                l.path.display(),
                if l.direct_io { " (direct I/O)" } else { "" }
            );
            self.state.loop_device = Some(l.path.clone());
            self.state.loop_direct_io = l.direct_io;
            self.loop_dev = Some(l);
        }
        Ok(())
    }

    /// Record the state and open the control socket: the last step before "ready".
    fn listen(&mut self) -> Result<()> {
        state::write(&self.paths, &self.state)?;
        let _ = fs::remove_file(&self.paths.sock);
        let listener = UnixListener::bind(&self.paths.sock).map_err(io_err(format!(
            "{}: cannot listen",
            self.paths.sock.display()
        )))?;
        // The private directory (0700) already keeps others out; the socket gets the mode of
        // every private file too, whatever the umask left it.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&self.paths.sock, fs::Permissions::from_mode(0o600)).map_err(
            io_err(format!(
                "{}: cannot set its mode",
                self.paths.sock.display()
            )),
        )?;
        self.listener = Some(listener);
        Ok(())
    }

    /// Opens of the exported file other than the loop device's own.
    fn open_handles(&self) -> i64 {
        let opens = self.fuse.as_ref().map(|f| f.open_handles()).unwrap_or(0);
        opens - i64::from(self.loop_dev.is_some())
    }

    /// Why the device is still in use, or `None` when nothing uses it.
    fn users(&self) -> Option<String> {
        if let Some(l) = &self.loop_dev {
            if let Some(why) = inuse::loop_users(&l.path) {
                return Some(why);
            }
        }
        if let Some(nbd) = &self.nbd {
            let st = nbd.status();
            if !st.clients.is_empty() {
                let peers: Vec<&str> = st.clients.iter().map(|c| c.peer.as_str()).collect();
                return Some(format!(
                    "{} NBD client{} connected ({})",
                    peers.len(),
                    if peers.len() == 1 { " is" } else { "s are" },
                    peers.join(", ")
                ));
            }
        }
        let n = self.open_handles();
        if n > 0 && self.state.tree {
            return Some(format!(
                "{} has {n} open file{} or director{}",
                self.state.path.display(),
                if n == 1 { "" } else { "s" },
                if n == 1 { "y" } else { "ies" }
            ));
        }
        if n > 0 {
            let who = inuse::processes_holding(&self.paths.dev);
            let by = if who.is_empty() {
                String::new()
            } else {
                format!(" by {}", who.join(", "))
            };
            return Some(format!(
                "{} is open{by} ({n} open file handle{})",
                self.paths.dev.display(),
                if n == 1 { "" } else { "s" }
            ));
        }
        None
    }

    /// [`Server::users`], asked again for a moment before the answer is "in use".
    fn users_after_patience(&self) -> Option<String> {
        let deadline = Instant::now() + IN_USE_PATIENCE;
        loop {
            let why = self.users()?;
            if Instant::now() >= deadline {
                return Some(why);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn status_json(&self) -> Value {
        let mut v = serde_json::to_value(&self.state).unwrap_or_else(|_| json!({}));
        let export = self.fuse.as_ref().map(|f| f.stats()).unwrap_or_default();
        let stats = self.stats.as_ref().map(|f| f()).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("state".into(), json!("active"));
            m.insert(
                "uptime".into(),
                json!(now_secs().saturating_sub(self.state.started)),
            );
            m.insert("open_handles".into(), json!(self.open_handles().max(0)));
            m.insert("deferred_close".into(), json!(self.deferred));
            if let Some(o) = &self.online {
                m.insert("suspended".into(), json!(o.suspended()));
                m.insert("allow_discards".into(), json!(o.allow_discards()));
                if let Some(r) = o.reencryption() {
                    m.insert("reencryption".into(), r);
                }
            }
            if let Some(f) = &self.fuse {
                m.insert("export".into(), export_json(&export));
                m.insert("fuse_transport".into(), transport_json(&f.transport()));
            }
            if let Some(nbd) = &self.nbd {
                m.insert(
                    "nbd".into(),
                    serde_json::to_value(nbd.status()).unwrap_or(Value::Null),
                );
            }
            m.insert("stats".into(), stats);
        }
        v
    }

    /// Answer control requests until a close, a deferred close that found the device unused,
    /// or a signal.
    pub fn run(&mut self) -> Ending {
        let (lfd, sfd) = match (&self.listener, &self.sigfd) {
            (Some(l), Some(s)) => (l.as_raw_fd(), s.as_raw_fd()),
            _ => return Ending::Signal,
        };
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: lfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: sfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let timeout = if self.deferred {
                DEFERRED_POLL.as_millis() as libc::c_int
            } else {
                -1
            };
            // SAFETY: poll(2) on a two-element array that outlives the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                eprintln!("dmkit: control loop failed: {e}; shutting down");
                return Ending::Signal;
            }
            if fds[1].revents != 0 {
                let mut info = [0u8; 128];
                // SAFETY: reading one signalfd_siginfo (128 bytes) into a buffer of that size.
                unsafe { libc::read(sfd, info.as_mut_ptr().cast(), info.len()) };
                let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
                eprintln!("dmkit: signal {signo} received, shutting down");
                return Ending::Signal;
            }
            if fds[0].revents != 0 {
                let accepted = self.listener.as_ref().map(|l| l.accept());
                if let Some(Ok((stream, _))) = accepted {
                    if let Some(end) = self.handle(stream) {
                        return end;
                    }
                }
            }
            if self.deferred && self.users().is_none() {
                eprintln!("dmkit: the last user is gone: deferred close");
                return Ending::Deferred;
            }
        }
    }

    fn handle(&mut self, stream: UnixStream) -> Option<Ending> {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        let mut stream = stream;
        let peer = control::peer_uid(stream.as_fd());
        let req = match control::read_frame(&mut stream) {
            Err(e) => match control::other_version(&e) {
                // Another dmkit build: told in its own version, which it can read.
                Some(v) => {
                    eprintln!("dmkit: control request of protocol version {v} refused");
                    let _ = control::write_frame(
                        &mut stream,
                        &control::refuse_version(&self.state.name, v),
                    );
                    return None;
                }
                None => Err(e.to_string()),
            },
            Ok(f) => Request::decode(&f).map_err(|e| e.to_string()),
        };
        let req = match (req, peer) {
            (Err(e), _) => {
                send(&mut stream, failed(1, FailKind::Invalid, e));
                return None;
            }
            (Ok(_), Ok(uid)) if !control::peer_allowed(uid) => {
                eprintln!("dmkit: control request from uid {uid} refused");
                send(
                    &mut stream,
                    failed(
                        2,
                        FailKind::Failed,
                        format!("{}: permission denied (uid {uid})", self.state.name),
                    ),
                );
                return None;
            }
            (Ok(_), Err(e)) => {
                send(
                    &mut stream,
                    failed(1, FailKind::Failed, format!("SO_PEERCRED: {e}")),
                );
                return None;
            }
            (Ok(r), Ok(_)) => r,
        };
        let reply = match req {
            Request::Status => Reply::Done(self.status_json()),
            Request::Close(CloseHow::Now) => match self.users_after_patience() {
                Some(why) => {
                    eprintln!("dmkit: close refused: {why}");
                    failed(5, FailKind::Busy, why)
                }
                None => {
                    eprintln!("dmkit: close requested");
                    return Some(Ending::Close(stream));
                }
            },
            Request::Close(CloseHow::Deferred) => {
                if self.users().is_none() {
                    eprintln!("dmkit: deferred close requested; nothing uses the device");
                    return Some(Ending::Close(stream));
                }
                eprintln!("dmkit: deferred close requested: closing when the last user goes");
                self.deferred = true;
                Reply::Done(json!({"ok": true, "deferred": true}))
            }
            Request::Close(CloseHow::CancelDeferred) => {
                if self.deferred {
                    eprintln!("dmkit: deferred close cancelled");
                }
                self.deferred = false;
                Reply::Done(json!({"ok": true}))
            }
            Request::Reencrypt {
                secret,
                max_hotzone,
                header,
            } => match self.online.clone() {
                Some(o) => {
                    reencrypt(o, stream, secret, max_hotzone, header);
                    return None;
                }
                None => failed(
                    1,
                    FailKind::Invalid,
                    format!(
                        "{}: a {} device cannot be reencrypted while open",
                        self.state.name, self.state.kind
                    ),
                ),
            },
            other => self.online_request(other),
        };
        send(&mut stream, reply);
        None
    }

    /// A request to the volume itself: resize, suspend, resume, refresh.
    fn online_request(&mut self, req: Request) -> Reply {
        let Some(o) = self.online.clone() else {
            return failed(
                1,
                FailKind::Invalid,
                format!(
                    "{}: a {} device cannot be resized, suspended or refreshed while open",
                    self.state.name, self.state.kind
                ),
            );
        };
        let unlock = |s: control::Secret| Unlock {
            passphrase: s.passphrase,
            key_slot: s.key_slot,
        };
        let r = match req {
            Request::Resize(sectors) => o.resize(sectors).map(|size| {
                self.resized(size);
                json!({"ok": true, "size": size})
            }),
            Request::Suspend => o.suspend().map(|()| {
                eprintln!("dmkit: suspended: the volume key is wiped, I/O is held");
                json!({"ok": true})
            }),
            Request::Resume(s) => o.resume(&unlock(s)).map(|()| {
                eprintln!("dmkit: resumed");
                json!({"ok": true})
            }),
            Request::Refresh {
                secret,
                allow_discards,
                persistent,
            } => o
                .refresh(
                    &unlock(secret),
                    RefreshFlags {
                        allow_discards,
                        persistent,
                    },
                )
                .map(|()| {
                    self.state.allow_discards = o.allow_discards();
                    let _ = state::write(&self.paths, &self.state);
                    eprintln!(
                        "dmkit: refreshed (discards {})",
                        if o.allow_discards() { "on" } else { "off" }
                    );
                    json!({"ok": true})
                }),
            Request::Status | Request::Close(_) | Request::Reencrypt { .. } => {
                unreachable!("answered by handle")
            }
        };
        match r {
            Ok(v) => Reply::Done(v),
            Err(e) => {
                eprintln!("dmkit: {e}");
                failed(e.code.clamp(1, 255) as u8, FailKind::Invalid, e.message)
            }
        }
    }

    /// The device now has `size` bytes: record it, and make the exporters see it (the FUSE
    /// file's cached size, the loop device's capacity). NBD clients see it when they connect.
    fn resized(&mut self, size: u64) {
        eprintln!("dmkit: resized to {size} bytes ({} sectors)", size / 512);
        self.state.size = size;
        if let Err(e) = state::write(&self.paths, &self.state) {
            eprintln!("dmkit: {e}");
        }
        if let Some(f) = &self.fuse {
            f.invalidate();
            // A stat asks the serving threads for the new size: the kernel's cached size, which
            // the loop device reads, follows.
            let _ = fs::metadata(&self.paths.dev);
        }
        if let Some(l) = &self.loop_dev {
            if let Err(e) = loopdev::set_capacity(&l.path) {
                eprintln!("dmkit: {}: LOOP_SET_CAPACITY: {e}", l.path.display());
            }
        }
    }

    /// Undo everything, in reverse order; idempotent. Removes the files (not the log).
    pub fn teardown(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        // Requests held by a suspended device fail: nothing will resume it.
        if let Some(o) = &self.online {
            o.closing();
        }
        self.listener = None;
        let _ = fs::remove_file(&self.paths.sock);
        if let Some(mut n) = self.nbd.take() {
            n.stop(Duration::from_secs(5));
            let t = n.totals();
            eprintln!(
                "dmkit: nbd: served {} requests, {} bytes read, {} written, {} I/O errors, {} of them corruptions",
                t.requests, t.bytes_read, t.bytes_written, t.io_errors, t.corruptions
            );
        }
        if let Some(l) = self.loop_dev.take() {
            match loopdev::detach(&l.path) {
                // The kernel lets go of the exported file only once the last opener of the
                // loop device (udev's probe, say) closes it: wait for that before unmounting.
                Ok(()) => loopdev::wait_detached(&l.path, &self.paths.dev, Duration::from_secs(5)),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if let Some(mut f) = self.fuse.take() {
            match f.unmount(Duration::from_secs(5)) {
                Ok(true) => eprintln!(
                    "dmkit: {} was busy: detached lazily; open handles fail once the server exits",
                    self.state.path.display()
                ),
                Ok(false) => {}
                Err(e) => errors.push(e.to_string()),
            }
            let s = f.stats();
            eprintln!(
                "dmkit: served {} requests, {} bytes read, {} written, {} I/O errors, {} of them corruptions",
                s.requests, s.bytes_read, s.bytes_written, s.io_errors, s.corruptions
            );
        }
        let _ = fs::remove_file(&self.paths.state);
        // A tree's mount point is the user's directory: it stays.
        if !self.state.tree {
            if let Err(e) = remove_export_file(&self.paths.dev) {
                errors.push(e);
            }
        }
        if let Some(l) = self.lock.take() {
            l.remove();
        }
        if self.sigfd.take().is_some() {
            // SAFETY: restoring the mask saved when the signals were blocked.
            unsafe {
                libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut())
            };
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ExportError::Failed(errors.join("; ")))
        }
    }
}

/// Remove the exported file once nothing is mounted on it. Unlinking a mount point fails with
/// EBUSY: a lazily detached mount can take a moment to go, so that is retried briefly.
pub(super) fn remove_export_file(dev: &std::path::Path) -> std::result::Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if is_mounted(dev) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match fs::remove_file(dev) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("{}: cannot remove: {e}", dev.display())),
        }
    }
}

fn failed(code: u8, kind: FailKind, message: String) -> Reply {
    Reply::Failed {
        code,
        kind,
        message,
    }
}

/// Send the final reply of a request (a client that went away is not our problem).
/// Reencrypt on a thread of its own, so that the control loop goes on answering `status` and
/// `close`: progress frames (at most five a second) and the final answer go to `stream`. A
/// command line that goes away does not stop the reencryption; a close does, at a hotzone
/// boundary.
fn reencrypt(
    o: Arc<dyn Online>,
    mut stream: UnixStream,
    secret: control::Secret,
    max_hotzone: Option<u64>,
    header: Option<std::path::PathBuf>,
) {
    eprintln!("dmkit: online reencryption requested");
    let spawned = std::thread::Builder::new()
        .name("reencrypt".into())
        .spawn(move || {
            let unlock = Unlock {
                passphrase: secret.passphrase,
                key_slot: secret.key_slot,
            };
            let mut last: Option<Instant> = None;
            let mut gone = false;
            let r = o.reencrypt(
                &unlock,
                max_hotzone,
                header.as_deref(),
                &mut |done, total| {
                    if gone
                        || last.is_some_and(|l| {
                            l.elapsed() < Duration::from_millis(200) && done < total
                        })
                    {
                        return;
                    }
                    last = Some(Instant::now());
                    gone = control::write_frame(
                        &mut stream,
                        &Reply::Progress { done, total }.encode(),
                    )
                    .is_err();
                },
            );
            drop(unlock);
            let reply = match r {
                Ok(()) => {
                    eprintln!("dmkit: online reencryption finished");
                    Reply::Done(json!({"ok": true}))
                }
                Err(e) => {
                    eprintln!("dmkit: online reencryption: {e}");
                    failed(e.code.clamp(1, 255) as u8, FailKind::Invalid, e.message)
                }
            };
            send(&mut stream, reply);
        });
    if let Err(e) = spawned {
        eprintln!("dmkit: cannot start the reencryption thread: {e}");
    }
}

fn send(s: &mut UnixStream, r: Reply) {
    let _ = control::write_frame(s, &r.encode());
}

/// The transport as `status` shows it: its description, and the numbers a script wants.
fn transport_json(t: &fuse::Transport) -> Value {
    match t {
        fuse::Transport::IoUring { queues, depth } => json!({
            "kind": "io-uring",
            "description": t.to_string(),
            "queues": queues,
            "queue_depth": depth,
        }),
        fuse::Transport::DevFuse { threads, why } => json!({
            "kind": "dev-fuse",
            "description": t.to_string(),
            "threads": threads,
            "why_not_io_uring": why,
        }),
    }
}

fn export_json(s: &ExportStats) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}

/// Answer the `close` request (if there was one) once the teardown is done, and log the end.
pub(super) fn finish(ending: Ending, result: &Result<()>) {
    if let Ending::Close(mut s) = ending {
        let reply = match result {
            Ok(()) => Reply::Done(json!({"ok": true})),
            Err(e) => failed(1, FailKind::Failed, e.to_string()),
        };
        send(&mut s, reply);
    }
    match result {
        Ok(()) => eprintln!("dmkit: closed"),
        Err(e) => eprintln!("dmkit: close: {e}"),
    }
}
