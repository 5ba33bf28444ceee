//! `dmkit image open|close|status` without root: the image's file system served read-only by
//! dmkit's own FUSE server from the userspace readers ([`tree`], over the verified path), and a
//! writable layer on top ([`stack`]): the kernel's OverlayFS in a user namespace of the
//! server's, or fuse-overlayfs. The image is checked exactly as the kernel stack and the
//! rootless read commands check it ([`crate::image::read::verified`]).
//!
//! - [`actor`]: the reader on its own thread; [`tree`]: the reader as a FUSE tree;
//! - [`stack`]: the mounts, made and torn down inside the server process.

pub mod actor;
pub mod stack;
pub mod tree;

use super::open::{OpenOptions, Opened};
use super::read::verified::{open_image, VerifyOptions};
use super::{ImageError, Result};
use crate::export::{self, ExportError, TreeSpec};
use serde_json::json;
use stack::{Plan, Upper};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

/// Which writable layer a rootless `open` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlay {
    /// The kernel's OverlayFS in a user namespace where the kernel lets this user make one,
    /// else fuse-overlayfs.
    #[default]
    Auto,
    /// The kernel's OverlayFS in the server's user namespace.
    UserNs,
    /// fuse-overlayfs.
    FuseOverlayfs,
}

impl Overlay {
    /// Parse `--overlay`.
    pub fn parse(s: &str) -> Option<Overlay> {
        Some(match s {
            "auto" => Overlay::Auto,
            "userns" => Overlay::UserNs,
            "fuse-overlayfs" => Overlay::FuseOverlayfs,
            _ => return None,
        })
    }
}

/// Whether `prog` is an executable on `$PATH`.
fn on_path(prog: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(prog))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Whether this process may create a user namespace (tried in a child, which exits at once).
fn userns_allowed() -> bool {
    // SAFETY: fork(2) in a single-threaded process (`open` is called before any thread); the
    // child only calls unshare and _exit.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: unshare(2) and _exit(2) with plain integers, in the child.
            unsafe {
                let ok = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0;
                libc::_exit(if ok { 0 } else { 1 })
            }
        }
        pid if pid > 0 => {
            let mut status = 0;
            // SAFETY: waitpid(2) on our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
        }
        _ => false,
    }
}

/// The kernel's OverlayFS passes a read error of the tree up as EIO; fuse-overlayfs (1.10, as
/// measured here) answers the read with zeros instead, so it comes second.
fn pick(o: Overlay) -> Result<Upper> {
    let fo = on_path("fuse-overlayfs");
    let missing = || {
        ImageError::Missing(
            "fuse-overlayfs is not installed (apt-get install fuse-overlayfs), and user \
             namespaces are not allowed here"
                .into(),
        )
    };
    match o {
        Overlay::FuseOverlayfs if !fo => Err(missing()),
        Overlay::FuseOverlayfs => Ok(Upper::FuseOverlayfs),
        Overlay::UserNs => Ok(Upper::UserNs),
        Overlay::Auto if userns_allowed() => Ok(Upper::UserNs),
        Overlay::Auto if fo => Ok(Upper::FuseOverlayfs),
        Overlay::Auto => Err(missing()),
    }
}

/// Open `o.image` at the resolved mount point `mp` under the stack name `name`, as an
/// ordinary user. Call before the process has spawned any thread (the server is forked).
pub(super) fn open(o: &OpenOptions, mp: &Path, name: &str) -> Result<Opened> {
    let upper = pick(o.overlay)?;
    // fusermount3 mounts the tree in fuse-overlayfs mode; in a user namespace the server
    // mounts FUSE itself.
    if upper == Upper::FuseOverlayfs && !on_path("fusermount3") {
        return Err(ImageError::Missing(
            "fusermount3 is not installed (apt-get install fuse3): a non-root user mounts FUSE through it".into(),
        ));
    }
    let upper_base = super::open::upper_base(o, mp)?;
    // Checked and its file system opened here, so that a bad image is refused in one line
    // before any server starts (the server opens its own reader over the same device).
    let opened = open_image(&VerifyOptions {
        image: o.image.clone(),
        certs: o.certs.clone(),
        root_hash: o.root_hash.clone(),
        fec: o.fec.clone(),
        remote: o.remote.clone(),
    })?;
    drop(opened.fs);
    let mut v = opened.verified;
    if upper == Upper::FuseOverlayfs {
        v.warnings.push(format!(
            "{}: fuse-overlayfs answers a read that fails below it with zeros: a corrupt block \
             of the image reads as zeros there (the read-only tree under it gives EIO); \
             --overlay userns does not have this flaw",
            mp.display()
        ));
    }
    let image_abs = std::fs::canonicalize(&o.image).unwrap_or_else(|_| o.image.clone());
    let private = export::run_dir().join(".image").join(name);
    let lower = private.join("lower");
    let (rw, upper_dir, work_dir) = match &upper_base {
        Some(u) => (None, u.join("upper"), u.join("work")),
        None => {
            let rw = private.join("rw");
            (Some(rw.clone()), rw.join("upper"), rw.join("work"))
        }
    };
    let tree = Arc::new(OnceLock::<Arc<tree::ImageTree>>::new());
    let t = tree.clone();
    let dev_stats = v.activated.stats.clone();
    let stats = Arc::new(move || {
        let mut s = dev_stats.as_ref().map(|f| f()).unwrap_or_else(|| json!({}));
        if let (Some(t), Some(m)) = (t.get(), s.as_object_mut()) {
            m.insert(
                "corruptions".into(),
                json!(t.corruptions.load(Ordering::Relaxed)),
            );
            m.insert(
                "reader_errors".into(),
                json!(t.errors.load(Ordering::Relaxed)),
            );
        }
        s
    });
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let details = json!({
        "image": image_abs,
        "mountpoint": mp,
        "mode": upper.mode(),
        "fs": v.fs.name(),
        "root_hash": v.root_hex,
        "root_hash_source": v.root_hash_source,
        "signed_by": v.signer.as_ref().map(|s| s.subject.clone()),
        "fec": v.fec.clone(),
        "remote": v.remote,
        "private_dir": private,
        "lower": lower,
        "tmpfs": if upper == Upper::UserNs { rw.clone() } else { None },
        "rw_dir": rw,
        "upper": upper_dir,
        "work": work_dir,
    });
    let plan = Plan {
        upper,
        device: v.device(),
        fs: v.fs,
        lower: lower.clone(),
        rw,
        upper_dir: upper_dir.clone(),
        work_dir,
        tree,
        uid,
        gid,
    };
    let spec = TreeSpec {
        name: name.to_string(),
        kind: "image".into(),
        mountpoint: mp.to_path_buf(),
        size: v.device().size(),
        threads: o.threads,
        details,
        stats: Some(stats),
        mount: Box::new(move |mp, threads, transport| stack::build(plan, mp, threads, transport)),
    };
    let served = export::open_tree(spec).map_err(|e| super::open::busy_at(mp, e))?;
    Ok(Opened {
        name: name.to_string(),
        mountpoint: mp.to_path_buf(),
        mode: upper.mode().to_string(),
        loop_device: None,
        server_pid: Some(served.pid),
        root_hash: v.root_hex,
        root_hash_source: v.root_hash_source,
        signer: v.signer,
        fs: v.fs,
        upper: upper_dir,
        fec: v.fec,
        warnings: v.warnings,
    })
}

/// Where the merged tree of a userns-mode stack is reachable from outside its namespace.
pub fn userns_path(pid: u32, mp: &Path) -> PathBuf {
    let rel = mp.strip_prefix("/").unwrap_or(mp);
    PathBuf::from(format!("/proc/{pid}/root")).join(rel)
}

/// Whether `path` is mounted in the mount namespace of process `pid`.
pub fn mounted_in(pid: u32, path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
        return false;
    };
    let want = path.as_os_str().as_bytes();
    // mountinfo escapes space, tab, newline and backslash as octal.
    let esc: Vec<u8> = want
        .iter()
        .flat_map(|&b| match b {
            b' ' | b'\t' | b'\n' | b'\\' => format!("\\{b:03o}").into_bytes(),
            b => vec![b],
        })
        .collect();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m.as_bytes() == esc.as_slice())
}

/// Close a rootless stack: in fuse-overlayfs mode the overlay is unmounted here first, so
/// that a busy mount point is refused (exit 5) with nothing changed; the server then unmounts
/// the tree (and, in userns mode, the overlay in its namespace) and removes its directories.
pub(super) fn close(mp: &Path, name: &str, d: &serde_json::Value) -> Result<()> {
    if d["mode"].as_str() == Some(Upper::FuseOverlayfs.mode()) && export::is_mounted(mp) {
        let out = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg("--")
            .arg(mp)
            .output()
            .map_err(|e| ImageError::Io(format!("fusermount3 -u {}: {e}", mp.display())))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("busy") {
                return Err(ImageError::Busy(format!(
                    "{}: still in use (a process has a file open or its working directory there)",
                    mp.display()
                )));
            }
            return Err(ImageError::Io(format!(
                "fusermount3 -u {}: {}",
                mp.display(),
                err.trim()
            )));
        }
    }
    match export::close(name, export::CloseMode::Now) {
        Ok(_) | Err(ExportError::NotOpen { .. }) => {}
        Err(ExportError::InUse { reason, .. }) => {
            return Err(ImageError::Busy(format!(
                "{}: still in use: {reason}",
                mp.display()
            )))
        }
        Err(e) => return Err(e.into()),
    }
    for k in ["rw_dir", "lower", "private_dir"] {
        if let Some(p) = d[k].as_str() {
            let _ = std::fs::remove_dir(p);
        }
    }
    // The stacks' parent directory, when this was the last one.
    let _ = std::fs::remove_dir(export::run_dir().join(".image"));
    Ok(())
}
