//! A minimal FUSE server exporting one block device as one regular file.
//!
//! It speaks the kernel protocol directly over `/dev/fuse` (no libfuse): the root of the mount
//! is the file itself (`rootmode=100000`), mounted over a regular file path, exactly like
//! qemu-storage-daemon's FUSE export. Several threads serve the connection; each one reads a
//! request, calls the [`BlockDevice`] inline and writes the reply. There is no queue, channel
//! or worker pool between the request and the device: parallelism comes from the kernel
//! handing concurrent requests to concurrent readers.
//!
//! Data moves with as few copies as the protocol allows: a request is read with `readv` into
//! an 80-byte header area plus a page-aligned data buffer, so WRITE payloads land aligned
//! (ready for an `O_DIRECT` backend); READ replies are sent with `writev` from a page-aligned
//! per-thread buffer the device read into directly.

mod mount;
mod proto;
mod serve;

pub use mount::unmount_path;
pub use proto::{DEFAULT_THREADS, MAX_WRITE};
pub use serve::ExportStats;

use crate::block::BlockDevice;
use mount::{clone_fuse_fd, ctx};
use serve::{serve, Shared};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How to serve a device.
#[derive(Debug, Clone, Copy)]
pub struct FuseOptions {
    /// Number of serving threads (at least 1).
    pub threads: usize,
    /// Honour `fallocate(PUNCH_HOLE)` by discarding on the device.
    pub allow_discards: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: DEFAULT_THREADS,
            allow_discards: false,
        }
    }
}

/// A mounted, serving FUSE export. Unmounts (lazily) when dropped.
pub struct FuseExport {
    mountpoint: PathBuf,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    mounted: AtomicBool,
    st_dev: u64,
    via_fusermount: bool,
}

impl FuseExport {
    /// Mount a FUSE filesystem whose root is a regular file holding `device` over
    /// `mountpoint` (an existing regular file), start the serving threads and wait until the
    /// kernel's INIT has been answered.
    pub fn mount(
        mountpoint: &Path,
        device: Arc<dyn BlockDevice>,
        opts: FuseOptions,
    ) -> io::Result<FuseExport> {
        let threads = opts.threads.max(1);
        let (master, via_fusermount) = mount::mount_file(mountpoint)?;
        let master = Arc::new(master);
        let shared = Arc::new(Shared::new(device, opts.allow_discards, threads));
        let mut export = FuseExport {
            mountpoint: mountpoint.to_path_buf(),
            shared: shared.clone(),
            threads: Vec::with_capacity(threads),
            mounted: AtomicBool::new(true),
            st_dev: 0,
            via_fusermount,
        };
        for idx in 0..threads {
            // A cloned descriptor gives each thread its own processing queue in the kernel
            // (less lock contention); the shared one works too, so failure is not fatal.
            let fd = clone_fuse_fd(&master)
                .map(Arc::new)
                .unwrap_or_else(|_| master.clone());
            let sh = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-{idx}"))
                .spawn(move || serve(sh, fd, idx));
            match spawned {
                Ok(h) => export.threads.push(h),
                Err(e) => {
                    shared
                        .live_threads
                        .fetch_sub(threads - idx, Ordering::SeqCst);
                    return Err(ctx("cannot start a serving thread".into(), e));
                }
            }
        }
        drop(master);
        export.wait_init(Duration::from_secs(10))?;
        // Only now: any access to the mount point blocks until INIT has been answered.
        export.st_dev = std::fs::metadata(mountpoint)
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .unwrap_or(0);
        Ok(export)
    }

    fn wait_init(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.init.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*g {
                Some(Ok(_)) => return Ok(()),
                Some(Err(m)) => return Err(io::Error::other(m.clone())),
                None => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}: the kernel did not send FUSE INIT within {} s",
                        self.mountpoint.display(),
                        timeout.as_secs()
                    ),
                ));
            }
            g = self
                .shared
                .init_cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The mount point (the exported file's path).
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether fusermount3 mounted it (a non-root user's export).
    pub fn via_fusermount(&self) -> bool {
        self.via_fusermount
    }

    /// Open file handles on the exported file right now (OPENs not yet RELEASEd), the loop
    /// device's included.
    pub fn open_handles(&self) -> i64 {
        self.shared.open_handles.load(Ordering::SeqCst)
    }

    /// The negotiated FUSE minor protocol version.
    pub fn protocol_minor(&self) -> u32 {
        self.shared.minor.load(Ordering::Relaxed)
    }

    /// The counters so far.
    pub fn stats(&self) -> ExportStats {
        let mut s = ExportStats::default();
        for c in &self.shared.counters {
            s.requests += c.requests.load(Ordering::Relaxed);
            s.bytes_read += c.bytes_read.load(Ordering::Relaxed);
            s.bytes_written += c.bytes_written.load(Ordering::Relaxed);
            s.io_errors += c.io_errors.load(Ordering::Relaxed);
            s.corruptions += c.corruptions.load(Ordering::Relaxed);
        }
        s
    }

    /// Unmount and wait (up to `wait`) for the serving threads to end. A busy mount is retried
    /// for about a second and then detached lazily (`MNT_DETACH`); the threads then keep
    /// serving whoever still has the file open until this process exits. Returns whether the
    /// unmount had to be lazy.
    pub fn unmount(&mut self, wait: Duration) -> io::Result<bool> {
        if !self.mounted.swap(false, Ordering::SeqCst) {
            return Ok(false);
        }
        let lazy = unmount_path(&self.mountpoint, self.st_dev)?;
        // Unmounting aborts the connection, which makes every blocked read return ENODEV.
        let deadline = Instant::now() + wait;
        let (m, cv) = &self.shared.exited;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while self.shared.live_threads.load(Ordering::SeqCst) > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        if self.shared.live_threads.load(Ordering::SeqCst) == 0 {
            for h in self.threads.drain(..) {
                let _ = h.join();
            }
        }
        Ok(lazy)
    }
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        if self.mounted.load(Ordering::SeqCst) {
            let _ = self.unmount(Duration::from_secs(2));
        }
    }
}
