//! `dmkit image open|close|status`: the mount stack of a read-only root image, and its
//! teardown in reverse order.
//!
//! ```text
//! MOUNTPOINT                     overlay: lowerdir=LOWER, upperdir=UPPER, workdir=WORK
//! $RUN_DIR/.image/NAME/rw        tmpfs holding UPPER (upper/) and WORK (work/) (or --upper DIR)
//! $RUN_DIR/.image/NAME/lower     the file system, read-only, from /dev/loopN
//! /dev/loopN -> $RUN_DIR/NAME    dmkit's dm-verity over the root partition (export daemon)
//! IMAGE                          root, root-verity, root-verity-sig partitions
//! ```
//!
//! NAME is derived from the mount point, so `close` and `status` find the whole stack from
//! it: the export's state (`dmkit status NAME`) records every path. Any failure while opening
//! undoes what was done; nothing stays mounted or running.

use super::layout::RootHashSource;
use super::mkfs::FsKind;
use super::read::verified::{open_verified, VerifyOptions};
use super::{ImageError, Result};
use crate::export::{self, CloseMode, ExportError, ExportSpec, ServeOptions};
use crate::verity::sig::VerifiedSigner;
use serde_json::{json, Value};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What to open.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The image.
    pub image: PathBuf,
    /// Where the writable root appears.
    pub mountpoint: PathBuf,
    /// Certificates one of which must have signed the root hash (none: no check).
    pub certs: Vec<PathBuf>,
    /// The root hash to trust, instead of the image's.
    pub root_hash: Option<Vec<u8>>,
    /// A persistent upper layer (`DIR/upper`, `DIR/work`) instead of a tmpfs.
    pub upper: Option<PathBuf>,
    /// Serving threads of the verity export.
    pub threads: usize,
    /// Where the FEC parity comes from.
    pub fec: super::fec::FecChoice,
    /// Without root: which writable layer (see [`super::rootless`]).
    pub overlay: super::rootless::Overlay,
    /// How the image's objects are fetched and cached when it is a URL.
    pub remote: super::remote::RemoteImageOptions,
}

/// What `open` set up.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The export's name.
    pub name: String,
    /// The overlay's mount point.
    pub mountpoint: PathBuf,
    /// How it is mounted: `kernel`, or one of the rootless modes.
    pub mode: String,
    /// The loop device under the file system (the kernel mode).
    pub loop_device: Option<PathBuf>,
    /// The server of the rootless tree (whose namespace holds a userns-mode stack).
    pub server_pid: Option<u32>,
    /// The root hash the tree was checked against.
    pub root_hash: String,
    /// Where it came from.
    pub root_hash_source: RootHashSource,
    /// Who signed it, when `--cert` checked it.
    pub signer: Option<VerifiedSigner>,
    /// The file system.
    pub fs: FsKind,
    /// The upper layer.
    pub upper: PathBuf,
    /// The FEC parity used (as `status` shows it), if any.
    pub fec: Option<Value>,
    /// What the user should know (a backup fec_header used, damaged parity).
    pub warnings: Vec<String>,
}

/// The export name of the stack at `mountpoint` (a resolved path): `image-LAST-HASH`, LAST
/// being the mount point's last component (letters, digits, `-`, `_`) and HASH the first 12
/// hex digits of the SHA-256 of the whole path.
pub fn stack_name(mountpoint: &Path) -> String {
    use sha2::Digest;
    let last: String = mountpoint
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(40)
        .collect();
    let h = sha2::Sha256::digest(mountpoint.as_os_str().as_bytes());
    let tag = &hex::encode(h)[..12];
    if last.is_empty() {
        format!("image-{tag}")
    } else {
        format!("image-{last}-{tag}")
    }
}

fn resolve_mountpoint(mp: &Path) -> Result<PathBuf> {
    let r = fs::canonicalize(mp).map_err(|e| {
        ImageError::Invalid(format!(
            "{}: cannot use as a mount point: {e}",
            mp.display()
        ))
    })?;
    if !r.is_dir() {
        return Err(ImageError::Invalid(format!(
            "{}: not a directory",
            mp.display()
        )));
    }
    Ok(r)
}

/// The stack's private directory.
fn private_dir(name: &str) -> PathBuf {
    export::run_dir().join(".image").join(name)
}

/// Overlay options are split at ',' and ':'; a path holding them (or '\') is refused.
fn check_overlay_path(p: &Path) -> Result<()> {
    let b = p.as_os_str().as_bytes();
    if b.iter().any(|c| matches!(c, b',' | b':' | b'\\')) {
        return Err(ImageError::Invalid(format!(
            "{}: overlayfs cannot take a path with ',', ':' or '\\'",
            p.display()
        )));
    }
    Ok(())
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| ImageError::Invalid(format!("{}: path holds a NUL byte", p.display())))
}

fn sys_mount(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> std::io::Result<()> {
    let s = CString::new(source)?;
    let t = CString::new(target.as_os_str().as_bytes())?;
    let f = CString::new(fstype)?;
    let d = CString::new(data)?;
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn sys_umount(target: &Path) -> std::io::Result<()> {
    let t = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: umount2(2) with a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(t.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn mount_error(fstype: &str, source: &str, target: &Path, e: std::io::Error) -> ImageError {
    if e.raw_os_error() == Some(libc::ENODEV) {
        return ImageError::Missing(format!(
            "the kernel has no {fstype} support (modprobe {})",
            if fstype == "overlay" {
                "overlay"
            } else {
                fstype
            }
        ));
    }
    ImageError::Io(format!(
        "mount -t {fstype} {source} {}: {e}",
        target.display()
    ))
}

/// An export's "busy" as the image's: an image is already open at `mp`.
pub(super) fn busy_at(mp: &Path, e: ExportError) -> ImageError {
    match e {
        ExportError::Busy { .. } => ImageError::Busy(format!(
            "{}: an image is already open there (dmkit image close {} first)",
            mp.display(),
            mp.display()
        )),
        e => e.into(),
    }
}

/// `--upper DIR` made absolute and checked (usable by overlayfs, outside the mount point).
pub(super) fn upper_base(o: &OpenOptions, mp: &Path) -> Result<Option<PathBuf>> {
    let Some(u) = &o.upper else {
        return Ok(None);
    };
    let abs =
        std::path::absolute(u).map_err(|e| ImageError::Invalid(format!("{}: {e}", u.display())))?;
    check_overlay_path(&abs)?;
    if abs.starts_with(mp) {
        return Err(ImageError::Invalid(format!(
            "--upper {}: lies inside the mount point {}",
            u.display(),
            mp.display()
        )));
    }
    Ok(Some(abs))
}

/// What was set up so far, undone in reverse order on drop unless disarmed.
struct Rollback {
    name: Option<String>,
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl Rollback {
    fn undo(&mut self) {
        for m in self.mounts.drain(..).rev() {
            let _ = sys_umount(&m);
        }
        if let Some(n) = self.name.take() {
            if let Err(e) = export::close(&n, CloseMode::Now) {
                eprintln!("dmkit: {n}: {e}");
            }
        }
        for d in self.dirs.drain(..).rev() {
            let _ = fs::remove_dir(&d);
        }
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        self.undo();
    }
}

/// Make `dir` (and missing parents), recording the directories created for the rollback.
fn make_dirs(dir: &Path, mode: u32, rb: &mut Rollback) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = dir;
    while fs::symlink_metadata(p).is_err() {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(q) => p = q,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        fs::DirBuilder::new()
            .mode(mode)
            .create(&d)
            .map_err(|e| ImageError::Io(format!("{}: cannot create: {e}", d.display())))?;
        rb.dirs.push(d);
    }
    Ok(())
}

/// Open `o.image` at `o.mountpoint`. Call before the process has spawned any thread (the
/// verity export forks its server).
pub fn open(o: &OpenOptions) -> Result<Opened> {
    let mp = resolve_mountpoint(&o.mountpoint)?;
    check_overlay_path(&mp)?;
    let name = stack_name(&mp);
    export::ensure_not_open(&name).map_err(|e| busy_at(&mp, e))?;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return super::rootless::open(o, &mp, &name);
    }
    let upper_base = upper_base(o, &mp)?;

    // The image: its parts, the root hash to trust, the signature, the tree.
    let image_abs = fs::canonicalize(&o.image).unwrap_or_else(|_| o.image.clone());
    let v = open_verified(
        &VerifyOptions {
            image: o.image.clone(),
            certs: o.certs.clone(),
            root_hash: o.root_hash.clone(),
            fec: o.fec.clone(),
            remote: o.remote.clone(),
        },
        &name,
    )?;
    let (fs_kind, root_hex, source, signer) = (v.fs, v.root_hex, v.root_hash_source, v.signer);
    let (fec_details, warnings, remote) = (v.fec, v.warnings, v.remote);
    let mut activated = v.activated;

    // Every path of the stack, recorded in the export's state for close and status.
    let private = private_dir(&name);
    let lower = private.join("lower");
    let (tmpfs, upper, work) = match &upper_base {
        Some(u) => (None, u.join("upper"), u.join("work")),
        None => {
            let rw = private.join("rw");
            (Some(rw.clone()), rw.join("upper"), rw.join("work"))
        }
    };
    activated.details = json!({
        "image": image_abs,
        "mountpoint": mp,
        "mode": "kernel",
        "fs": fs_kind.name(),
        "root_hash": root_hex,
        "root_hash_source": source,
        "signed_by": signer.as_ref().map(|s| s.subject.clone()),
        "fec": fec_details.clone(),
        "remote": remote,
        "private_dir": private,
        "lower": lower,
        "tmpfs": tmpfs,
        "upper": upper,
        "work": work,
    });
    let how = ServeOptions {
        fuse: true,
        nbd: None,
        loop_device: true,
        direct_io_loop: true,
        threads: o.threads,
    };
    let spec = ExportSpec::new(activated, how);
    let mut rb = Rollback {
        name: None,
        mounts: Vec::new(),
        dirs: Vec::new(),
    };
    let opened = export::open(spec)?;
    rb.name = Some(name.clone());
    let loop_dev = opened
        .loop_device
        .clone()
        .ok_or_else(|| ImageError::Io(format!("{name}: the export has no loop device")))?;

    // The read-only file system.
    let image_root = export::run_dir().join(".image");
    make_dirs(&image_root, 0o700, &mut rb)?;
    make_dirs(&lower, 0o700, &mut rb)?;
    let loop_s = loop_dev.to_string_lossy().into_owned();
    let fs_opts = if fs_kind == FsKind::Ext4 {
        "noload"
    } else {
        ""
    };
    sys_mount(&loop_s, &lower, fs_kind.name(), libc::MS_RDONLY, fs_opts).map_err(|e| {
        // EINVAL from a file system with blocks smaller than the loop device's: say so (the
        // kernel only logs "bad block size" in dmesg).
        match (
            e.raw_os_error(),
            export::loopdev::block_size_note(&loop_dev),
        ) {
            (Some(libc::EINVAL), Some(note)) => ImageError::Io(format!(
                "mount -t {} {loop_s} {}: {e} ({note})",
                fs_kind.name(),
                lower.display()
            )),
            _ => mount_error(fs_kind.name(), &loop_s, &lower, e),
        }
    })?;
    rb.mounts.push(lower.clone());

    // The upper layer.
    if let Some(rw) = &tmpfs {
        make_dirs(rw, 0o700, &mut rb)?;
        sys_mount(
            "tmpfs",
            rw,
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=0700",
        )
        .map_err(|e| mount_error("tmpfs", "tmpfs", rw, e))?;
        rb.mounts.push(rw.clone());
    }
    let fresh_upper = fs::symlink_metadata(&upper).is_err();
    make_dirs(&upper, 0o755, &mut rb)?;
    make_dirs(&work, 0o700, &mut rb)?;
    if fresh_upper {
        // The overlay's root takes the upper directory's owner and mode: give it the image's.
        let m = fs::metadata(&lower)
            .map_err(|e| ImageError::Io(format!("{}: {e}", lower.display())))?;
        let c = cstr(&upper)?;
        // SAFETY: chown(2) with a NUL-terminated path.
        unsafe { libc::chown(c.as_ptr(), m.uid(), m.gid()) };
        let _ = fs::set_permissions(&upper, fs::Permissions::from_mode(m.mode() & 0o7777));
    }

    // The overlay.
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    sys_mount("overlay", &mp, "overlay", 0, &data)
        .map_err(|e| mount_error("overlay", "overlay", &mp, e))?;
    // Done: keep everything.
    rb.mounts.clear();
    rb.dirs.clear();
    rb.name = None;
    Ok(Opened {
        name,
        mountpoint: mp,
        mode: "kernel".into(),
        loop_device: Some(loop_dev),
        server_pid: Some(opened.pid),
        root_hash: root_hex,
        root_hash_source: source,
        signer,
        fs: fs_kind,
        upper,
        fec: fec_details,
        warnings,
    })
}

fn str_field(d: &Value, k: &str) -> Option<PathBuf> {
    d[k].as_str().map(PathBuf::from)
}

/// The export state of the stack at `mp`, or `NotOpen`.
fn stack_state(mp: &Path) -> Result<(String, Value)> {
    let name = stack_name(mp);
    match export::status(Some(&name)) {
        Ok(mut v) if !v.is_empty() => Ok((name, v.remove(0))),
        Ok(_) | Err(ExportError::NotOpen { .. }) => Err(ImageError::NotOpen(format!(
            "{}: no image is open there",
            mp.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Undo `open` at `mountpoint`, in reverse order: the overlay, the tmpfs, the file system,
/// the verity export (and its loop device), the private directories. A busy mount point is
/// refused (exit 5) with nothing changed. Run again after a partial failure, it goes on.
pub fn close(mountpoint: &Path) -> Result<()> {
    let mp = resolve_mountpoint(mountpoint)?;
    let (name, st) = stack_state(&mp)?;
    let d = &st["details"];
    if d["mode"].as_str().is_some_and(|m| m != "kernel") {
        return super::rootless::close(&mp, &name, d);
    }
    let busy = |what: &Path, e: std::io::Error| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            ImageError::Busy(format!(
                "{}: still in use (a process has a file open or its working directory there)",
                what.display()
            ))
        } else {
            ImageError::Io(format!("umount {}: {e}", what.display()))
        }
    };
    if export::is_mounted(&mp) && str_field(d, "mountpoint").as_deref() == Some(&mp) {
        sys_umount(&mp).map_err(|e| busy(&mp, e))?;
    }
    for k in ["tmpfs", "lower"] {
        if let Some(p) = str_field(d, k) {
            if export::is_mounted(&p) {
                sys_umount(&p).map_err(|e| busy(&p, e))?;
            }
        }
    }
    match export::close(&name, CloseMode::Now) {
        Ok(_) | Err(ExportError::NotOpen { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    for k in ["tmpfs", "lower", "private_dir"] {
        if let Some(p) = str_field(d, k) {
            let _ = fs::remove_dir(&p);
        }
    }
    Ok(())
}

/// The stacks that are open (or the one at `mountpoint`): the export's status with each
/// layer's mount state added as `"mounted"`.
pub fn status(mountpoint: Option<&Path>) -> Result<Vec<Value>> {
    let list = match mountpoint {
        Some(m) => vec![stack_state(&resolve_mountpoint(m)?)?.1],
        None => export::status(None)?
            .into_iter()
            .filter(|v| v["details"]["mountpoint"].is_string() && v["details"]["lower"].is_string())
            .collect(),
    };
    Ok(list
        .into_iter()
        .map(|mut v| {
            let d = &v["details"];
            // A userns-mode stack is mounted in its server's namespace only.
            let pid = v["pid"].as_u64().unwrap_or(0) as u32;
            let userns = d["mode"].as_str() == Some(super::rootless::stack::Upper::UserNs.mode());
            let m = |k: &str| {
                str_field(d, k).map(|p| {
                    if userns {
                        super::rootless::mounted_in(pid, &p)
                    } else {
                        export::is_mounted(&p)
                    }
                })
            };
            let mounted = json!({
                "overlay": m("mountpoint"),
                "upper_tmpfs": m("tmpfs"),
                "lower": m("lower"),
            });
            v["mounted"] = mounted;
            v
        })
        .collect())
}
