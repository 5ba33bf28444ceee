//! Loop devices over the exported file, set up with ioctls (what `losetup` does).
//!
//! The loop device turns the FUSE-exported file into a real block device (`/dev/loopN`) for
//! programs that need one (mkfs, mount, fio on a block device).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LOOP_CLR_FD: u64 = 0x4C01;
const LOOP_SET_CAPACITY: u64 = 0x4C07;
const LOOP_GET_STATUS64: u64 = 0x4C05;
const LOOP_CONFIGURE: u64 = 0x4C0A;
const LOOP_CTL_GET_FREE: u64 = 0x4C82;

const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64` (include/uapi/linux/loop.h): a kernel ABI struct, not an on-disk one.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

impl LoopInfo64 {
    fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        }
    }
}

/// An attached loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: PathBuf,
    /// Whether the kernel accepted direct I/O (`LO_FLAGS_DIRECT_IO`).
    pub direct_io: bool,
}

fn ctx(what: String, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Attach a free loop device to `file`. `block_size` is the loop device's logical block size
/// (clamped to 512..=4096). Direct I/O is asked for with `direct_io`; when the kernel refuses it
/// the device is set up without it (see [`LoopDevice::direct_io`]).
pub fn attach(
    file: &Path,
    read_only: bool,
    direct_io: bool,
    block_size: u32,
) -> io::Result<LoopDevice> {
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(libc::O_CLOEXEC)
        .open(file)
        .map_err(|e| {
            ctx(
                format!("{}: cannot open for the loop device", file.display()),
                e,
            )
        })?;
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| ctx("/dev/loop-control: cannot open".into(), e))?;
    let block_size = block_size.clamp(512, 4096).next_power_of_two();
    let mut flags = if read_only { LO_FLAGS_READ_ONLY } else { 0 };
    if direct_io {
        flags |= LO_FLAGS_DIRECT_IO;
    }
    let mut last_err = None;
    // Another process may grab the free device between GET_FREE and CONFIGURE: retry.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(ctx(
                "/dev/loop-control: no free loop device".into(),
                io::Error::last_os_error(),
            ));
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = open_node(&path, read_only)?;
        let mut info = LoopInfo64::zeroed();
        let name = file.as_os_str().as_bytes();
        let k = name.len().min(63);
        info.lo_file_name[..k].copy_from_slice(&name[..k]);
        info.lo_flags = flags;
        let mut cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size,
            info,
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which `cfg` matches in layout
        // (checked by the size assertions) and which outlives the call.
        let mut rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg) };
        if rc != 0 && direct_io && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            // Direct I/O is a wish: fall back to buffered I/O silently.
            cfg.info.lo_flags &= !LO_FLAGS_DIRECT_IO;
            // SAFETY: as above.
            rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg) };
        }
        if rc == 0 {
            let direct_io = status_flags(&dev).map(|f| f & LO_FLAGS_DIRECT_IO != 0)?;
            return Ok(LoopDevice { path, direct_io });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EBUSY) {
            last_err = Some(e);
            continue;
        }
        return Err(ctx(
            format!("{}: cannot attach {}", path.display(), file.display()),
            e,
        ));
    }
    Err(ctx(
        "no loop device could be attached".into(),
        last_err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EBUSY)),
    ))
}

fn open_node(path: &Path, read_only: bool) -> io::Result<File> {
    // devtmpfs creates the node when GET_FREE adds the device; allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(ctx(format!("{}: cannot open", path.display()), e)),
        }
    }
}

fn status_flags(dev: &File) -> io::Result<u32> {
    let mut info = LoopInfo64::zeroed();
    // SAFETY: LOOP_GET_STATUS64 fills a `struct loop_info64`, which `info` matches in layout.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.lo_flags)
}

/// Make the loop device `dev` take the size its file has now (`LOOP_SET_CAPACITY`, after the
/// served device was resized).
pub fn set_capacity(dev: &Path) -> io::Result<()> {
    let f = std::fs::File::open(dev)?;
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_CAPACITY as _, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Detach the loop device at `dev` (`/dev/loopN`). Detaching one that is not attached is not
/// an error. If someone still has it open, the kernel detaches it when they close it.
pub fn detach(dev: &Path) -> io::Result<()> {
    let f = match File::open(dev) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ctx(format!("{}: cannot open", dev.display()), e)),
    };
    // SAFETY: LOOP_CLR_FD takes no argument.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_CLR_FD as _) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENXIO) {
            return Err(ctx(format!("{}: cannot detach", dev.display()), e));
        }
    }
    Ok(())
}

/// The file a loop device is attached to, from sysfs (`None` when not attached).
pub fn backing_file(dev: &Path) -> Option<PathBuf> {
    let name = dev.file_name()?.to_str()?;
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let s = s.trim_end_matches('\n');
    let s = s.strip_suffix(" (deleted)").unwrap_or(s);
    Some(PathBuf::from(s))
}

/// Detach `dev` only if it is still attached to `file` (a loop device number may have been
/// reused since).
pub fn detach_if_backing(dev: &Path, file: &Path) -> io::Result<()> {
    match backing_file(dev) {
        Some(b) if b == file => detach(dev),
        _ => Ok(()),
    }
}

/// Check that `path` names a loop device node (`/dev/loopN`), for values read from state files.
pub fn is_loop_path(path: &Path) -> bool {
    let Some(s) = path.to_str() else { return false };
    match s.strip_prefix("/dev/loop") {
        Some(n) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Wait (up to `timeout`) until the loop device `dev` no longer holds `file`. `LOOP_CLR_FD` on
/// a device someone still has open (udev's probe of a new device, say) only marks it for
/// autoclear: the kernel lets go of the file when that opener closes it.
pub fn wait_detached(dev: &Path, file: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while backing_file(dev).as_deref() == Some(file) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The logical block size of the block device at `dev` (e.g. `/dev/loop3`), from sysfs: the
/// smallest I/O it takes, so a file system with smaller blocks cannot be mounted from it.
pub fn logical_block_size(dev: &Path) -> io::Result<u32> {
    let name = dev
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no device name"))?;
    let sys = Path::new("/sys/class/block")
        .join(name)
        .join("queue/logical_block_size");
    let text = std::fs::read_to_string(&sys).map_err(|e| ctx(sys.display().to_string(), e))?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number: {}", sys.display(), text.trim()),
        )
    })
}

/// One line for `open --loop` to print: the loop device's logical block size and, when it is
/// larger than 1 KiB blocks, which file systems cannot be mounted from it (the kernel only
/// says "bad block size 1024" in dmesg).
pub fn block_size_note(dev: &Path) -> Option<String> {
    let lbs = logical_block_size(dev).ok()?;
    let mut note = format!("{}: logical block size {lbs} bytes", dev.display());
    if lbs > 512 {
        note.push_str(&format!(
            "; a file system with blocks smaller than {lbs} bytes (e.g. ext4 made with -b 1024) \
             will not mount from it"
        ));
    }
    Some(note)
}
