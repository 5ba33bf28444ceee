//! The remote readers compared, each exporting the remote image as an NBD export on a Unix
//! socket, so one client (fio's nbd engine, libnbd) reads them all the same way and only the
//! remote reading differs:
//!
//! - dmkit: `dmkit verity open URL NAME HASH-URL ROOT --no-cache --data-cache 0 --no-fuse --nbd
//!   unix:SOCK`, every block read fetched and checked against the tree;
//! - dmkit raw: `dmkit bench serve-remote URL SOCK`, the same remote device (transport,
//!   fetchers, read-ahead, NBD requests in flight) without the verity layer, no verification:
//!   the two dmkit columns differ by verification alone;
//! - nbdkit's curl plugin (`nbdkit -r -U SOCK curl url=URL`), no verification;
//! - QEMU's curl block driver (`qemu-storage-daemon --blockdev driver=http,...` with an NBD
//!   export), no verification.
//!
//! Each runs with its defaults: nbdkit 1.32's curl plugin serializes requests
//! (`thread_model=serialize_requests`), QEMU's driver reads ahead 256 KiB and keeps up to 8
//! requests in flight; what a user gets from Debian 12.

use std::fs;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::bench::harness::process::{command_line, Dmkit, Export, Interrupt};
use crate::bench::harness::tools::{start_daemon, Daemon};
use crate::bench::BenchError;

/// Who reads the remote image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reader {
    /// dmkit's remote verity export (verifies every block).
    Dmkit,
    /// dmkit's remote device served raw, without the verity layer (`dmkit bench
    /// serve-remote`): what verification costs, measured the same way.
    DmkitRaw,
    /// nbdkit's curl plugin.
    NbdkitCurl,
    /// QEMU's curl (http) block driver in qemu-storage-daemon.
    QemuCurl,
}

impl Reader {
    /// All of them, dmkit verified first.
    pub const ALL: [Reader; 4] = [
        Reader::Dmkit,
        Reader::DmkitRaw,
        Reader::NbdkitCurl,
        Reader::QemuCurl,
    ];

    /// Why this reader is not run at `delay_ms`, if it is not.
    pub fn skip_reason(self, delay_ms: u64) -> Option<&'static str> {
        (self == Reader::QemuCurl && delay_ms == 0).then_some(
            "QEMU 7.2's curl driver hangs under fio's queue depth 8 when the server answers at \
             once (nginx too)",
        )
    }

    /// The column title.
    pub fn title(self) -> &'static str {
        match self {
            Reader::Dmkit => "dmkit verity (verified)",
            Reader::DmkitRaw => "dmkit raw (unverified)",
            Reader::NbdkitCurl => "nbdkit curl",
            Reader::QemuCurl => "qemu curl",
        }
    }
}

/// The remote image as the readers see it.
pub struct Remote<'a> {
    /// The data object's URL.
    pub data_url: String,
    /// The hash tree's URL.
    pub hash_url: String,
    /// The root hash.
    pub root_hash: String,
    /// The dmkit under test.
    pub dmkit: &'a Dmkit,
    /// Scratch directory (sockets, logs, dmkit's cache).
    pub scratch: &'a Path,
}

/// A started reader: its NBD URI, its serving process, and what stops it when dropped.
pub struct Started {
    /// `nbd+unix:///...?socket=...`.
    pub uri: String,
    /// The serving process (for its CPU time).
    pub pid: u32,
    /// The command line, for the report.
    pub command: String,
    _guard: Guard,
}

enum Guard {
    Daemon(#[allow(dead_code)] Daemon),
    Export(#[allow(dead_code)] Export),
}

/// The export name the NBD servers give.
const EXPORT: &str = super::raw::EXPORT;

/// Starts `reader` on the remote image; `tag` makes socket and export names unique.
pub fn start(
    reader: Reader,
    remote: &Remote<'_>,
    tag: &str,
    interrupt: &Interrupt,
) -> Result<Started, BenchError> {
    let sock = remote.scratch.join(format!("{tag}.sock"));
    let _ = fs::remove_file(&sock);
    match reader {
        Reader::Dmkit => {
            let name = format!("bench{}-{tag}", std::process::id());
            let args = dmkit_open_args(remote, &name, &sock);
            let command = format!("dmkit {}", args.join(" "));
            let (export, uri) = remote
                .dmkit
                .open_nbd(&name, &args, remote.scratch, interrupt)?;
            let pid = remote.dmkit.server_pid(&name, remote.scratch, interrupt)?;
            Ok(Started {
                uri,
                pid,
                command,
                _guard: Guard::Export(export),
            })
        }
        Reader::DmkitRaw => {
            let mut cmd = remote.dmkit.command(["bench", "serve-remote"]);
            cmd.arg(&remote.data_url).arg(&sock);
            daemon(
                cmd,
                "dmkit bench serve-remote",
                &sock,
                &remote.scratch.join(format!("{tag}.log")),
            )
        }
        Reader::NbdkitCurl => {
            let mut cmd = Command::new("nbdkit");
            cmd.args(["-f", "-r", "--exit-with-parent", "-e", EXPORT, "-U"])
                .arg(&sock)
                .arg("curl")
                .arg(format!("url={}", remote.data_url));
            daemon(
                cmd,
                "nbdkit",
                &sock,
                &remote.scratch.join(format!("{tag}.log")),
            )
        }
        Reader::QemuCurl => {
            let mut cmd = Command::new("qemu-storage-daemon");
            cmd.args([
                "--blockdev".to_string(),
                format!(
                    "driver=http,node-name=remote0,url={},read-only=on",
                    remote.data_url
                ),
                "--nbd-server".into(),
                format!("addr.type=unix,addr.path={}", sock.display()),
                "--export".into(),
                format!("type=nbd,id=exp0,node-name=remote0,name={EXPORT}"),
            ]);
            daemon(
                cmd,
                "qemu-storage-daemon",
                &sock,
                &remote.scratch.join(format!("{tag}.log")),
            )
        }
    }
}

/// `dmkit verity open` of the remote data and hash tree, served over NBD.
fn dmkit_open_args(remote: &Remote<'_>, name: &str, sock: &Path) -> Vec<String> {
    vec![
        "verity".into(),
        "open".into(),
        remote.data_url.clone(),
        name.into(),
        remote.hash_url.clone(),
        remote.root_hash.clone(),
        // Verified blocks in memory only: every run starts cold, like the other readers.
        "--no-cache".into(),
        // Nor kept in memory once verified (the verity layer's data cache would hold the whole
        // image after one pass): every block read is fetched and verified, as the unverified
        // readers fetch every block they read.
        "--data-cache".into(),
        "0".into(),
        "--no-fuse".into(),
        "--nbd".into(),
        format!("unix:{}", sock.display()),
    ]
}

fn daemon(cmd: Command, what: &str, sock: &Path, log: &Path) -> Result<Started, BenchError> {
    let command = command_line(&cmd);
    let d = start_daemon(cmd, what, sock, log)?;
    let pid = d.child.id();
    Ok(Started {
        uri: format!("nbd+unix:///{EXPORT}?socket={}", sock.display()),
        pid,
        command,
        _guard: Guard::Daemon(d),
    })
}
