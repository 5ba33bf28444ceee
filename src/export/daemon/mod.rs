//! The lifecycle behind `open`, `close` and `status`: a background server per open device,
//! found through a runtime directory ([`rundir`]), alive as long as it holds its name lock,
//! and holding claims on the backing ranges it maps.
//!
//! - `rundir`: where a name's files live, and the checks that make them safe to trust;
//! - `namelock`: the liveness lock; `state`: the state file;
//! - `spawn`: starting a server (background or foreground) and hardening its process;
//! - `server`: mounting, the control loop, in-use checks, teardown;
//! - `client`: `close`, `status`, naming a claim's holder; `stale`: cleaning up after the dead.

mod client;
mod inuse;
mod namelock;
mod rundir;
mod server;
mod spawn;
mod stale;
mod state;

pub use client::{claim_holder, close, path_holder, status, CloseMode, Closed};
pub use rundir::{run_dir, validate_name, DEFAULT_RUN_DIR, RUN_DIR_ENV};
pub use spawn::{check_loop_allowed, open, serve_foreground, serve_foreground_with};
pub use stale::ensure_not_open;

use crate::block::{BlockDevice, Claim};
use serde_json::Value;
use std::io;
use std::path::PathBuf;
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
}

impl ExportError {
    /// cryptsetup's exit code for this error: 5 busy or in use, 4 not open, 2 permission,
    /// 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExportError::Busy { .. } | ExportError::InUse { .. } => 5,
            ExportError::NotOpen { .. } => 4,
            ExportError::Permission(_) => 2,
            _ => 1,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ExportError::Busy { .. } | ExportError::InUse { .. } => "busy",
            ExportError::NotOpen { .. } => "not-open",
            ExportError::InvalidName { .. } | ExportError::Invalid(_) => "invalid",
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
pub type StatsFn = Arc<dyn Fn() -> Value + Send + Sync>;

/// What to export and how.
pub struct ExportSpec {
    /// Device name: the file is `$RUN_DIR/NAME`.
    pub name: String,
    /// The top of the stack to serve.
    pub device: Arc<dyn BlockDevice>,
    /// The kind of device ("verity", "linear", "crypt", ...), shown by `status`.
    pub kind: String,
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
    /// The server's pid.
    pub pid: u32,
}

fn threads_of(spec: &ExportSpec) -> Result<usize> {
    match spec.threads {
        0 => Ok(crate::export::fuse::DEFAULT_THREADS),
        n @ 1..=256 => Ok(n),
        n => Err(ExportError::Invalid(format!(
            "threads: {n} is out of range (1 to 256)"
        ))),
    }
}
