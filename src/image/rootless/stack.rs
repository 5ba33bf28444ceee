//! The rootless mount stack, set up inside the image's server process and torn down by it:
//! the read-only tree served by dmkit's FUSE server ([`super::tree::ImageTree`]), and the
//! writable upper layer on top of it at the mount point.
//!
//! ```text
//! fuse-overlayfs mode (the host's mount namespace: the tree is at MOUNTPOINT for the user)
//!   MOUNTPOINT         fuse-overlayfs (child of the server), lower=LOWER, upper/work in RW
//!   RUN/.image/N/rw    upper/ and work/, plain directories (removed at close)
//!   RUN/.image/N/lower dmkit's FUSE tree, mounted with fusermount3
//!
//! userns mode (the server's own user and mount namespace: the tree is at
//! /proc/PID/root/MOUNTPOINT, or MOUNTPOINT after `nsenter -t PID -U -m --preserve-credentials`)
//!   MOUNTPOINT         the kernel's OverlayFS (userxattr), lower=LOWER, upper/work on the tmpfs
//!   RUN/.image/N/rw    tmpfs
//!   RUN/.image/N/lower dmkit's FUSE tree, mounted directly (FUSE mounts in a user namespace)
//! ```
//!
//! The tree is served as owned by the user (root in the user namespace, which is the user
//! outside it): an unprivileged user reads the image's root-only files (every byte of the image
//! file is theirs to read anyway) and the overlay can copy any file up. fuse-overlayfs runs
//! as the user with `squash_to_uid/gid` to the same effect. The image's real owners are what
//! `image ls` and `image mtree` show. In the user namespace every mount dies with the server.

use super::actor::ReaderHandle;
use super::tree::ImageTree;
use crate::block::BlockDevice;
use crate::export::fuse::{mount_tree, ExportStats, Mounted, Transport, TransportChoice};
use crate::export::is_mounted;
use crate::image::mkfs::FsKind;
use crate::image::read::Source;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How the writable layer is made without root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upper {
    /// The kernel's OverlayFS in the server's own user namespace.
    UserNs,
    /// fuse-overlayfs, mounted with fusermount3 in the user's mount namespace.
    FuseOverlayfs,
}

impl Upper {
    /// The mode as `status` shows it.
    pub fn mode(self) -> &'static str {
        match self {
            Upper::UserNs => "rootless fuse+userns-overlay",
            Upper::FuseOverlayfs => "rootless fuse+fuse-overlayfs",
        }
    }
}

/// Everything the server needs to build the stack.
pub struct Plan {
    /// The writable layer's kind.
    pub upper: Upper,
    /// The verified root partition.
    pub device: Arc<dyn BlockDevice>,
    /// Its file system.
    pub fs: FsKind,
    /// Where the read-only tree is mounted.
    pub lower: PathBuf,
    /// A private directory for the upper layer (made, and removed at close), or `None` with
    /// `--upper`.
    pub rw: Option<PathBuf>,
    /// The upper and work directories.
    pub upper_dir: PathBuf,
    /// overlay's work directory.
    pub work_dir: PathBuf,
    /// The served tree, once the server has made it (for `status`' counters).
    pub tree: Arc<OnceLock<Arc<ImageTree>>>,
    /// The opener's uid and gid (mapped to root in the user namespace).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{}: path holds a NUL byte", p.display())))
}

fn ctx(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn mount(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (s, t, f, d) = (
        CString::new(source)?,
        cpath(target)?,
        CString::new(fstype)?,
        CString::new(data)?,
    );
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(ctx(format!(
            "mount -t {fstype} {source} {}",
            target.display()
        ))(io::Error::last_os_error()))
    }
}

fn umount(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let t = cpath(target)?;
    // SAFETY: umount2(2) with a NUL-terminated path.
    if unsafe { libc::umount2(t.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Move this process (single-threaded: checked by the kernel) into a new user namespace where
/// it is root, mapped to `uid`/`gid`, and a new mount namespace of its own.
fn enter_user_namespace(uid: u32, gid: u32) -> io::Result<()> {
    // A non-dumpable process's /proc/self files belong to root: it could not write its own
    // uid_map. And the owner reaches the stack through /proc/PID/root, which needs a dumpable
    // process too. (The server makes itself non-dumpable for volume keys; a verified image
    // holds none.)
    // SAFETY: prctl with plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    // SAFETY: unshare(2) with plain flags.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "cannot create a user namespace ({e}): unprivileged user namespaces are off here \
                 (sysctl user.max_user_namespaces, kernel.apparmor_restrict_unprivileged_userns); \
                 install fuse-overlayfs for the other rootless mode"
            ),
        ));
    }
    fs::write("/proc/self/setgroups", "deny").map_err(ctx("/proc/self/setgroups".into()))?;
    fs::write("/proc/self/uid_map", format!("0 {uid} 1\n"))
        .map_err(ctx("/proc/self/uid_map".into()))?;
    fs::write("/proc/self/gid_map", format!("0 {gid} 1\n"))
        .map_err(ctx("/proc/self/gid_map".into()))?;
    // Nothing mounted here may reach the parent namespace, nor its changes come in.
    mount(
        "none",
        Path::new("/"),
        "none",
        libc::MS_REC | libc::MS_PRIVATE,
        "",
    )?;
    Ok(())
}

fn make_dir(d: &Path, mode: u32, made: &mut Vec<PathBuf>) -> io::Result<()> {
    match fs::DirBuilder::new().mode(mode).create(d) {
        Ok(()) => {
            made.push(d.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => Ok(()),
        Err(e) => Err(ctx(format!("{}: cannot create", d.display()))(e)),
    }
}

/// The mounted stack: what [`Mounted`] needs of it, and its teardown.
pub struct Stack {
    upper: Upper,
    mountpoint: PathBuf,
    lower: Option<Box<dyn Mounted>>,
    lower_path: PathBuf,
    overlay: bool,
    tmpfs: Option<PathBuf>,
    child: Mutex<Option<Child>>,
    /// Directories made here, removed (with what is in them, for `rw`) at the end.
    made: Vec<PathBuf>,
    rw: Option<PathBuf>,
    /// The tree's counters when it was unmounted.
    last_stats: ExportStats,
}

/// Build the stack at `mountpoint` (in the server, before any thread: the user namespace needs
/// a single-threaded process).
pub fn build(
    plan: Plan,
    mountpoint: &Path,
    threads: usize,
    transport: TransportChoice,
) -> io::Result<Box<dyn Mounted>> {
    if plan.upper == Upper::UserNs {
        enter_user_namespace(plan.uid, plan.gid)?;
    }
    let mut st = Stack {
        upper: plan.upper,
        mountpoint: mountpoint.to_path_buf(),
        lower: None,
        lower_path: plan.lower.clone(),
        overlay: false,
        tmpfs: None,
        child: Mutex::new(None),
        made: Vec::new(),
        rw: plan.rw.clone(),
        last_stats: ExportStats::default(),
    };
    let reader = ReaderHandle::start(plan.fs, Source::new(plan.device.clone()))
        .map_err(|e| io::Error::other(format!("{} file system: {e}", plan.fs.name())))?;
    // Owned by the user: in the namespace that is root.
    let owner = match plan.upper {
        Upper::UserNs => (0, 0),
        Upper::FuseOverlayfs => (plan.uid, plan.gid),
    };
    let tree = Arc::new(
        ImageTree::new(reader, plan.device.size(), Some(owner))
            .map_err(|e| io::Error::other(format!("{} file system: {e}", plan.fs.name())))?,
    );
    let _ = plan.tree.set(tree.clone());
    if let Some(parent) = plan.lower.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(ctx(format!("{}: cannot create", parent.display())))?;
    }
    make_dir(&plan.lower, 0o700, &mut st.made)?;
    st.lower = Some(mount_tree(&plan.lower, tree, threads, transport, None)?);
    if let Some(rw) = &plan.rw {
        make_dir(rw, 0o700, &mut st.made)?;
        if plan.upper == Upper::UserNs {
            mount(
                "tmpfs",
                rw,
                "tmpfs",
                libc::MS_NOSUID | libc::MS_NODEV,
                "mode=0700",
            )?;
            st.tmpfs = Some(rw.clone());
        }
    }
    let fresh = !plan.upper_dir.exists();
    // Inside `rw` (removed whole at the end) or the user's --upper directory (kept).
    let mut kept = Vec::new();
    make_dir(&plan.upper_dir, 0o755, &mut kept)?;
    make_dir(&plan.work_dir, 0o700, &mut kept)?;
    if fresh {
        // The merged root takes the upper directory's mode: give it the image's.
        if let Ok(m) = fs::metadata(&plan.lower) {
            let _ = fs::set_permissions(&plan.upper_dir, m.permissions());
        }
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        plan.lower.display(),
        plan.upper_dir.display(),
        plan.work_dir.display()
    );
    match plan.upper {
        Upper::UserNs => {
            mount(
                "overlay",
                mountpoint,
                "overlay",
                0,
                &format!("{opts},userxattr"),
            )?;
            st.overlay = true;
        }
        Upper::FuseOverlayfs => {
            let child = Command::new("fuse-overlayfs")
                .arg("-f")
                .arg("-o")
                .arg(format!(
                    "{opts},squash_to_uid={},squash_to_gid={}",
                    plan.uid, plan.gid
                ))
                .arg(mountpoint)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(ctx(
                    "cannot run fuse-overlayfs (apt-get install fuse-overlayfs)".into(),
                ))?;
            *st.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
            st.wait_overlay()?;
            st.overlay = true;
        }
    }
    Ok(Box::new(st))
}

impl Stack {
    /// Wait until fuse-overlayfs has mounted (or died).
    fn wait_overlay(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if is_mounted(&self.mountpoint) {
                return Ok(());
            }
            let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = g.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    *g = None;
                    return Err(io::Error::other(format!(
                        "fuse-overlayfs exited with {s} before mounting {} (see the server log)",
                        self.mountpoint.display()
                    )));
                }
            }
            drop(g);
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "fuse-overlayfs did not mount {} within 10 s",
                    self.mountpoint.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Unmount the overlay: busy is retried for a second, then detached lazily.
    fn unmount_overlay(&mut self) -> io::Result<bool> {
        if !std::mem::take(&mut self.overlay) {
            return Ok(false);
        }
        let lazy = match self.upper {
            Upper::UserNs => {
                let mut r = umount(&self.mountpoint, 0);
                for _ in 0..20 {
                    match &r {
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            std::thread::sleep(Duration::from_millis(50));
                            r = umount(&self.mountpoint, 0);
                        }
                        _ => break,
                    }
                }
                match r {
                    Ok(()) => false,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
                    Err(_) => {
                        umount(&self.mountpoint, libc::MNT_DETACH).map_err(ctx(format!(
                            "{}: cannot unmount the overlay",
                            self.mountpoint.display()
                        )))?;
                        true
                    }
                }
            }
            // `close` unmounted it already unless the server is being stopped otherwise.
            Upper::FuseOverlayfs => {
                crate::export::fuse::unmount_path(&self.mountpoint, 0).unwrap_or(false)
            }
        };
        // fuse-overlayfs exits once unmounted; a lazily detached one when its last user goes.
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let deadline = Instant::now() + Duration::from_secs(if lazy { 1 } else { 5 });
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
        Ok(lazy)
    }

    fn teardown(&mut self, wait: Duration) -> io::Result<bool> {
        let mut errors = Vec::new();
        let mut lazy = self.unmount_overlay().unwrap_or_else(|e| {
            errors.push(e.to_string());
            false
        });
        if let Some(t) = self.tmpfs.take() {
            if umount(&t, 0).is_err() {
                let _ = umount(&t, libc::MNT_DETACH);
            }
        }
        if let Some(mut l) = self.lower.take() {
            match l.unmount(wait) {
                Ok(z) => lazy |= z,
                Err(e) => errors.push(e.to_string()),
            }
            self.last_stats = l.stats();
        }
        if let Some(rw) = self.rw.take() {
            if let Err(e) = fs::remove_dir_all(&rw) {
                if e.kind() != io::ErrorKind::NotFound {
                    errors.push(format!("{}: cannot remove: {e}", rw.display()));
                }
            }
        }
        for d in self.made.drain(..).rev() {
            let _ = fs::remove_dir(&d);
        }
        let _ = fs::remove_dir(&self.lower_path);
        if let Some(p) = self.lower_path.parent() {
            let _ = fs::remove_dir(p);
        }
        if errors.is_empty() {
            Ok(lazy)
        } else {
            Err(io::Error::other(errors.join("; ")))
        }
    }
}

impl Mounted for Stack {
    fn open_handles(&self) -> i64 {
        self.lower.as_ref().map_or(0, |l| l.open_handles())
    }
    fn stats(&self) -> ExportStats {
        self.lower.as_ref().map_or(self.last_stats, |l| l.stats())
    }
    fn protocol_minor(&self) -> u32 {
        self.lower.as_ref().map_or(0, |l| l.protocol_minor())
    }
    fn transport(&self) -> Transport {
        match &self.lower {
            Some(l) => l.transport(),
            None => Transport::DevFuse {
                threads: 0,
                why: None,
            },
        }
    }
    fn via_fusermount(&self) -> bool {
        self.lower.as_ref().is_some_and(|l| l.via_fusermount())
    }
    fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        self.teardown(wait)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.teardown(Duration::from_secs(2));
    }
}
