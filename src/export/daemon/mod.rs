//! The lifecycle behind `open`, `close` and `status`: a background server per open device,
//! found through a runtime directory (`rundir`), alive as long as it holds its name lock,
//! and holding claims on the backing ranges it maps.
//!
//! - `rundir`: where a name's files live, and the checks that make them safe to trust;
//! - `namelock`: the liveness lock; `state`: the state file;
//! - `spawn`: starting a server (background or foreground) and hardening its process;
//! - `server`: mounting, the control loop, in-use checks, teardown;
//! - `client`: `close`, `status`, naming a claim's holder; `stale`: cleaning up after the dead.

mod client;
pub mod control;
mod inuse;
mod namelock;
mod rundir;
mod server;
mod spawn;
mod stale;
mod state;
mod target;

pub use client::{ask, claim_holder, close, path_holder, status, CloseMode, Closed};
pub use rundir::{run_dir, validate_name, DEFAULT_RUN_DIR, RUN_DIR_ENV};
pub use spawn::{
    check_loop_allowed, open, open_tree, serve_foreground, serve_foreground_with,
    serve_tree_foreground,
};
pub use stale::ensure_not_open;
pub use target::{resolve_target, shell_word, typeable};

use crate::block::{BlockDevice, Claim};
use crate::export::fuse::{mount_tree, Mounted, TransportChoice, TreeSource};
use serde_json::Value;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Errors of the export lifecycle. [`ExportError::exit_code`] gives cryptsetup's exit code.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The device name cannot be used.
    #[error("invalid device name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Wrong parameters.
    #[error("{0}")]
    Invalid(String),
    /// The name is already open (or being opened).
    #[error("device {name} is busy: {reason}")]
    Busy {
        /// The device name.
        name: String,
        /// Why ("already open at /run/dmkit/NAME (pid 123)", ...).
        reason: String,
    },
    /// `close` of a device that is mounted or open.
    #[error("device {name} is still in use: {reason}")]
    InUse {
        /// The device name.
        name: String,
        /// Who uses it.
        reason: String,
    },
    /// No device of that name is open.
    #[error("device {name} is not active")]
    NotOpen {
        /// The device name.
        name: String,
    },
    /// A path given for a device stands for nothing open.
    #[error("{}: no device or mount of dmkit's is open there (`dmkit status` lists them)", path.display())]
    NotOpenAt {
        /// The path, absolute.
        path: PathBuf,
    },
    /// Another user's device.
    #[error("{0}")]
    Permission(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the file.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The server failed (to start, or to stop cleanly); the message says why.
    #[error("{0}")]
    Failed(String),
    /// The server refused a request to the volume (resize, suspend, ...), with cryptsetup's
    /// exit code for it.
    #[error("{message}")]
    Refused {
        /// cryptsetup's exit code.
        code: i32,
        /// The server's message.
        message: String,
    },
}

impl ExportError {
    /// cryptsetup's exit code for this error: 5 busy or in use, 4 not open, 2 permission,
    /// 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExportError::Busy { .. } | ExportError::InUse { .. } => 5,
            ExportError::NotOpen { .. } | ExportError::NotOpenAt { .. } => 4,
            ExportError::Permission(_) => 2,
            ExportError::Refused { code, .. } => *code,
            _ => 1,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ExportError::Busy { .. } | ExportError::InUse { .. } => "busy",
            ExportError::NotOpen { .. } | ExportError::NotOpenAt { .. } => "not-open",
            ExportError::InvalidName { .. }
            | ExportError::Invalid(_)
            | ExportError::Refused { .. } => "invalid",
            ExportError::Permission(_) | ExportError::Io { .. } | ExportError::Failed(_) => {
                "failed"
            }
        }
    }
}

type Result<T> = std::result::Result<T, ExportError>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ExportError {
    let what = what.into();
    move |source| ExportError::Io { what, source }
}

/// Live counters of a layer, shown by `status` (called on the server's control thread).
pub use crate::block::StatsFn;

/// How an [`Activated`](crate::block::Activated) volume is served: the transports, the loop
/// device and the serving threads. What is served comes from the volume itself.
#[derive(Default)]
pub struct ServeOptions {
    /// Serve the FUSE file `$RUN_DIR/NAME` (false only with an NBD export: `--no-fuse`).
    pub fuse: bool,
    /// Also serve the device over NBD.
    pub nbd: Option<crate::export::nbd::NbdConfig>,
    /// Also attach a loop device (`/dev/loopN`) to the exported file.
    pub loop_device: bool,
    /// Ask for direct I/O on the loop device (`LO_FLAGS_DIRECT_IO`); silently off when refused.
    pub direct_io_loop: bool,
    /// Serving threads (0 means the default, 4).
    pub threads: usize,
}

/// What to export and how.
pub struct ExportSpec {
    /// Device name: the file is `$RUN_DIR/NAME`.
    pub name: String,
    /// The top of the stack to serve.
    pub device: Arc<dyn BlockDevice>,
    /// The kind of device ("verity", "linear", "crypt", ...), shown by `status`.
    pub kind: String,
    /// Serve the FUSE file `$RUN_DIR/NAME` (false only with an NBD export: `--no-fuse`).
    pub fuse: bool,
    /// Also serve the device over NBD.
    pub nbd: Option<crate::export::nbd::NbdConfig>,
    /// Also attach a loop device (`/dev/loopN`) to the exported file.
    pub loop_device: bool,
    /// Ask for direct I/O on the loop device (`LO_FLAGS_DIRECT_IO`); silently off when refused.
    pub direct_io_loop: bool,
    /// Honour discards (`fallocate(PUNCH_HOLE)` on the file, or discards on the loop device).
    pub allow_discards: bool,
    /// Serving threads (0 means the default, 4).
    pub threads: usize,
    /// Static facts shown by `status` (backing paths, root hash, options).
    pub details: Value,
    /// Live counters shown by `status`.
    pub stats: Option<StatsFn>,
    /// The claims on backing storage this device holds while it is open (see
    /// [`crate::block::Claim`]); recorded in the state so a refused claim can name us.
    pub claims: Vec<Claim>,
    /// What the server may ask of the volume while it is open (resize, suspend, ...).
    pub online: Option<Arc<dyn crate::block::online::Online>>,
}

impl ExportSpec {
    /// The export of an activated volume, served as `how` says.
    pub fn new(volume: crate::block::Activated, how: ServeOptions) -> ExportSpec {
        ExportSpec {
            name: volume.name,
            device: volume.device,
            kind: volume.kind,
            fuse: how.fuse,
            nbd: how.nbd,
            loop_device: how.loop_device,
            direct_io_loop: how.direct_io_loop,
            allow_discards: volume.allow_discards,
            threads: how.threads,
            details: volume.details,
            stats: volume.stats,
            claims: volume.claims,
            online: volume.online,
        }
    }
}

/// Mounts a tree over a mount point with a number of serving threads and a transport choice
/// (called in the server).
pub type TreeMounter =
    Box<dyn FnOnce(&Path, usize, TransportChoice) -> io::Result<Box<dyn Mounted>> + Send>;

/// A read-only directory tree to serve at a directory (`dmkit fsverity mount`), with the same
/// lifecycle as a device: a server per name, `status`, `close`.
pub struct TreeSpec {
    /// The name the server is known by (`status NAME`, `close NAME`); see [`name_for_mountpoint`].
    pub name: String,
    /// The kind shown by `status` ("fsverity", ...).
    pub kind: String,
    /// The directory the tree is mounted over: absolute, existing.
    pub mountpoint: PathBuf,
    /// Bytes of file data the tree holds (shown as its size).
    pub size: u64,
    /// Serving threads (0 means the default, 4).
    pub threads: usize,
    /// Static facts shown by `status`.
    pub details: Value,
    /// Live counters shown by `status`.
    pub stats: Option<StatsFn>,
    /// Mounts the tree; see [`TreeSpec::mounter`].
    pub mount: TreeMounter,
}

impl TreeSpec {
    /// The mounter of a [`TreeSource`], with the mount's read-ahead window in bytes (`None`:
    /// the kernel's default).
    pub fn mounter<S: TreeSource>(source: Arc<S>, read_ahead: Option<u64>) -> TreeMounter {
        Box::new(
            move |mountpoint: &Path, threads: usize, transport: TransportChoice| {
                mount_tree(mountpoint, source, threads, transport, read_ahead)
            },
        )
    }
}

/// The name a tree mounted at `mountpoint` (an absolute path) is known by when none is given:
/// the path escaped as systemd escapes mount unit names (`/mnt/app` is `mnt-app`, a `-` in a
/// component is `\x2d`), so that one mount point has one name; long paths end in a hash.
pub fn name_for_mountpoint(mountpoint: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = mountpoint.as_os_str().as_bytes();
    let trimmed: Vec<&[u8]> = bytes
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    if trimmed.is_empty() {
        return "-".to_string();
    }
    let mut name = String::new();
    for (i, comp) in trimmed.iter().enumerate() {
        if i > 0 {
            name.push('-');
        }
        for (j, &b) in comp.iter().enumerate() {
            let plain = b.is_ascii_alphanumeric() || b == b'_' || (b == b'.' && (i, j) != (0, 0));
            if plain {
                name.push(b as char);
            } else {
                name.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    if name.len() > 127 {
        use sha2::Digest;
        let h = hex::encode(&sha2::Sha256::digest(bytes)[..8]);
        let mut cut = 127 - 17;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
        name.push('-');
        name.push_str(&h);
    }
    name
}

/// What a server serves: a device as a file, or a tree at a directory.
pub(super) enum Job {
    Device(ExportSpec),
    Tree(TreeSpec),
}

impl Job {
    fn name(&self) -> &str {
        match self {
            Job::Device(s) => &s.name,
            Job::Tree(s) => &s.name,
        }
    }

    fn threads(&self) -> Result<usize> {
        let n = match self {
            Job::Device(s) => s.threads,
            Job::Tree(s) => s.threads,
        };
        threads_of(n)
    }

    /// This process forked the server that serves the job: give up its devices
    /// ([`BlockDevice::hand_over`]). A tree is read-only and has nothing to give up.
    fn hand_over(&self) {
        if let Job::Device(s) = self {
            s.device.hand_over();
        }
    }

    fn wants_loop(&self) -> bool {
        matches!(self, Job::Device(s) if s.loop_device)
    }

    /// What cannot be served: a loop device needs the FUSE file, and a device is served
    /// somewhere.
    fn check(&self) -> Result<()> {
        if let Job::Device(s) = self {
            if !s.fuse && s.loop_device {
                return Err(ExportError::Invalid(format!(
                    "{}: --loop needs the FUSE file (drop --no-fuse)",
                    s.name
                )));
            }
            if !s.fuse && s.nbd.is_none() {
                return Err(ExportError::Invalid(format!(
                    "{}: --no-fuse needs --nbd (the device would be served nowhere)",
                    s.name
                )));
            }
        }
        Ok(())
    }
}

/// A device that is open and served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The device name.
    pub name: String,
    /// The exported file, `$RUN_DIR/NAME`.
    pub path: PathBuf,
    /// The loop device, when one was asked for.
    pub loop_device: Option<PathBuf>,
    /// The NBD URI clients connect to, when the device is served over NBD.
    pub nbd: Option<String>,
    /// The server's pid.
    pub pid: u32,
}

fn threads_of(threads: usize) -> Result<usize> {
    match threads {
        0 => Ok(crate::export::fuse::DEFAULT_THREADS),
        n @ 1..=256 => Ok(n),
        n => Err(ExportError::Invalid(format!(
            "threads: {n} is out of range (1 to 256)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoint_names_are_systemd_escapes() {
        let n = |p: &str| name_for_mountpoint(Path::new(p));
        assert_eq!(n("/mnt/app"), "mnt-app");
        assert_eq!(n("/mnt/my-app/"), "mnt-my\\x2dapp");
        assert_eq!(n("/"), "-");
        assert_eq!(n("/srv/.hidden/x y"), "srv-.hidden-x\\x20y");
        assert_eq!(n("/.a"), "\\x2ea");
        // Distinct paths, distinct names; every name is a valid device name.
        assert_ne!(n("/a-b"), n("/a/b"));
        let long = format!("/{}", "d/".repeat(100));
        for p in ["/mnt/app", "/.a", long.as_str()] {
            validate_name(&n(p)).unwrap();
        }
        assert_ne!(n(&long), n(&format!("{long}e")));
    }
}
