//! Mounting and unmounting the export: mount(2) on /dev/fuse as root, or through fusermount3,
//! the setuid helper libfuse uses, for everyone else.
//!
//! fusermount3 opens /dev/fuse itself, mounts it over a mount point the user owns, and hands
//! the descriptor back over a Unix socket whose number it finds in `_FUSE_COMMFD` (an
//! `SCM_RIGHTS` message); unmounting is `fusermount3 -u`. Without `allow_other` (which a user
//! may not ask for unless /etc/fuse.conf says `user_allow_other`), only the user who opened the
//! device can reach it: decrypted data stays theirs.

use super::proto::FUSE_DEV_IOC_CLONE;
use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub(super) fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: path contains a NUL byte", p.display()),
        )
    })
}

pub(super) fn ctx(what: String, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The helper libfuse 3 installs setuid root.
const FUSERMOUNT: &str = "fusermount3";

/// What the root of a FUSE mount is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Root {
    /// A regular file, mounted over a regular file (the device export).
    File,
    /// A read-only directory, mounted over a directory (a served tree).
    ReadOnlyDir,
}

impl Root {
    fn rootmode(self) -> &'static str {
        match self {
            Root::File => "100000",
            Root::ReadOnlyDir => "40000",
        }
    }
}

/// Mount a FUSE connection whose root is `root` over `mountpoint`. Returns the connection's
/// /dev/fuse descriptor and whether fusermount3 mounted it.
pub(super) fn mount(mountpoint: &Path, root: Root) -> io::Result<(OwnedFd, bool)> {
    if is_root() {
        mount_directly(mountpoint, root).map(|fd| (fd, false))
    } else {
        mount_with_fusermount(mountpoint, root).map(|fd| (fd, true))
    }
}

fn mount_directly(mountpoint: &Path, root: Root) -> io::Result<OwnedFd> {
    let mp = cpath(mountpoint)?;
    // SAFETY: open(2) on a constant NUL-terminated path; the fd is owned right below.
    let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(ctx(
            "/dev/fuse: cannot open".into(),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: `raw` is a freshly opened descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode={},user_id={uid},group_id={gid},allow_other,default_permissions",
        fd.as_raw_fd(),
        root.rootmode()
    );
    let data = CString::new(data).map_err(|_| io::Error::other("mount options"))?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if root == Root::ReadOnlyDir {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"dmkit".as_ptr(),
            mp.as_ptr(),
            c"fuse".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(ctx(
            format!("{}: cannot mount FUSE", mountpoint.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(fd)
}

fn mount_with_fusermount(mountpoint: &Path, root: Root) -> io::Result<OwnedFd> {
    let mut sv = [0; 2];
    // SAFETY: socketpair(2) fills the two-element array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } != 0
    {
        return Err(ctx(
            "cannot create a socket pair for fusermount3".into(),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: both descriptors were just created and are owned here only.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    // fusermount3 must inherit its end: clear close-on-exec on it alone. The serving threads do
    // not exist yet, so no other child can inherit it by accident.
    // SAFETY: F_SETFD on a descriptor we own.
    unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) };
    let opts = match root {
        Root::File => "default_permissions,fsname=dmkit,subtype=dmkit",
        Root::ReadOnlyDir => "ro,default_permissions,fsname=dmkit,subtype=dmkit",
    };
    let child = Command::new(FUSERMOUNT)
        .arg("-o")
        .arg(opts)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    drop(theirs);
    let mut child = child.map_err(|e| {
        ctx(
            format!(
                "{}: cannot run {FUSERMOUNT} to mount it as a non-root user (apt-get install fuse3)",
                mountpoint.display()
            ),
            e,
        )
    })?;
    let received = receive_fd(&ours);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait()?;
    match received {
        Ok(fd) if status.success() => Ok(fd),
        r => {
            let why = err
                .trim()
                .lines()
                .last()
                .map(str::to_string)
                .unwrap_or_else(|| match r {
                    Err(e) => e.to_string(),
                    Ok(_) => format!("{FUSERMOUNT} exited with {status}"),
                });
            Err(io::Error::other(format!(
                "{}: cannot mount FUSE through {FUSERMOUNT}: {why}",
                mountpoint.display()
            )))
        }
    }
}

/// Receive one descriptor passed with `SCM_RIGHTS` on `sock`.
fn receive_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, aligned as the kernel writes it.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below outlives the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: recvmsg(2) into the buffers described by `msg`, on a socket we own.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CMSG_FIRSTHDR/CMSG_DATA walk the control buffer recvmsg filled; the header's
    // level, type and length are checked before its data is read.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n == 0
            || c.is_null()
            || (*c).cmsg_level != libc::SOL_SOCKET
            || (*c).cmsg_type != libc::SCM_RIGHTS
            || ((*c).cmsg_len as usize) < libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize
        {
            return Err(io::Error::other("no /dev/fuse descriptor came back"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32);
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// `fusermount3 -u [-z] PATH`; Ok(false) when it is not mounted (any more).
fn fusermount_unmount(path: &Path, lazy: bool) -> io::Result<bool> {
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ctx(format!("{}: cannot run {FUSERMOUNT} -u", path.display()), e))?;
    if out.status.success() {
        return Ok(true);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("not mounted") || err.contains("not found in /etc/mtab") {
        return Ok(false);
    }
    if err.contains("busy") {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    Err(io::Error::other(format!(
        "{}: {FUSERMOUNT} -u failed: {}",
        path.display(),
        err.trim()
    )))
}

/// One unmount attempt: `umount2` as root, fusermount3 otherwise.
fn unmount_once(path: &Path, c: &CString, lazy: bool) -> io::Result<()> {
    if !is_root() {
        return match fusermount_unmount(path, lazy)? {
            true => Ok(()),
            false => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
    }
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2(2) with a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Unmount `path` if it is still the FUSE mount identified by `st_dev` (0: don't check),
/// retrying a busy unmount for about a second before detaching lazily. Returns whether the
/// unmount was lazy.
pub fn unmount_path(path: &Path, st_dev: u64) -> io::Result<bool> {
    let c = cpath(path)?;
    for attempt in 0..20 {
        if st_dev != 0 {
            match std::fs::metadata(path) {
                Ok(m) if std::os::unix::fs::MetadataExt::dev(&m) == st_dev => {}
                // ENOTCONN (dead server) still means mounted; anything else: already gone.
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {}
                _ => return Ok(false),
            }
        }
        let e = match unmount_once(path, &c, false) {
            Ok(()) => return Ok(false),
            Err(e) => e,
        };
        match e.raw_os_error() {
            // A loop device being torn down, or an fput still in flight: give it a moment.
            Some(libc::EBUSY) if attempt < 19 => std::thread::sleep(Duration::from_millis(50)),
            Some(libc::EBUSY) => break,
            Some(libc::EINVAL) => return Ok(false), // not a mount point (any more)
            _ => return Err(ctx(format!("{}: cannot unmount", path.display()), e)),
        }
    }
    if let Err(e) = unmount_once(path, &c, true) {
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(ctx(
                format!("{}: cannot detach the mount", path.display()),
                e,
            ));
        }
    }
    Ok(true)
}

/// A second descriptor on the same FUSE connection with its own request queue in the kernel.
/// Needs /dev/fuse to be openable, which it may not be for a non-root user: callers fall back
/// to sharing the one descriptor.
pub(super) fn clone_fuse_fd(master: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: open(2) on a constant NUL-terminated path.
    let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a freshly opened descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let src: u32 = master.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the source fd) from the pointer, which is valid
    // for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &src as *const u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}
