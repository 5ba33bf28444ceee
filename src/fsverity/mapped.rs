//! Read-only mappings of files that survive the file shrinking under them.
//!
//! Hashing a large file straight from a shared mapping saves copying it through `read(2)`
//! (about a quarter of the CPU time of a digest). The catch is SIGBUS: a page past the end of
//! a file truncated meanwhile faults, and the default action kills the process. So every
//! mapping is registered here, and a SIGBUS handler (installed once, the first time a file is
//! mapped) recognises faults inside a registered mapping: it maps zeroed anonymous memory over
//! the rest of that mapping, so the read goes on, and marks the mapping, so the caller
//! reports the file as changed instead of using what it hashed. A fault anywhere else goes to
//! the handler that was there before (Rust's stack-overflow reporter, or the default action).
//!
//! Installing a process-wide SIGBUS handler is a side effect; code that must not have it
//! should not map files (the digest functions fall back to `pread` when a mapping cannot be
//! made, never the other way round).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Mappings that can be live at the same time; beyond that, callers read instead.
const SLOTS: usize = 64;

struct Slot {
    /// Start address; 0 for a free slot, 1 while being claimed.
    start: AtomicUsize,
    /// One past the last mapped byte.
    end: AtomicUsize,
    /// A fault inside the mapping was answered with zeroes.
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};
static SLOTS_TABLE: [Slot; SLOTS] = [FREE; SLOTS];
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS disposition before ours, to pass other faults on to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A file mapped read-only, registered with the SIGBUS handler.
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
    slot: usize,
}

// SAFETY: the mapping is read-only memory owned by this value; the slot is only touched
// through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file`, or `None` when that cannot be done (empty file,
    /// a file system without mmap, no free slot, no handler): the caller reads instead.
    pub(crate) fn new(file: &File, len: u64) -> Option<Mapping> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !install_handler() {
            return None;
        }
        // SAFETY: a fresh read-only shared mapping of a descriptor we hold; the kernel picks
        // the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let Some(slot) = SLOTS_TABLE.iter().position(|s| {
            s.start
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }) else {
            // SAFETY: unmapping what was just mapped.
            unsafe { libc::munmap(ptr, len) };
            return None;
        };
        let s = &SLOTS_TABLE[slot];
        s.faulted.store(false, Ordering::Relaxed);
        s.end.store(ptr as usize + len, Ordering::Release);
        s.start.store(ptr as usize, Ordering::Release);
        Some(Mapping { ptr, len, slot })
    }

    /// The mapped bytes. Pages that faulted read as zeroes (see [`Mapping::faulted`]).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` readable bytes are mapped at `ptr` for as long as `self` lives (a
        // fault is answered by mapping zeroes at the same addresses). Another process may
        // change the file's bytes meanwhile, as with any read; they are only hashed.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Whether a read of the mapping faulted (the file shrank, or a page could not be read):
    /// what was hashed is not the file's content.
    pub(crate) fn faulted(&self) -> bool {
        SLOTS_TABLE[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let s = &SLOTS_TABLE[self.slot];
        // Nothing reads the mapping any more, so no fault can race with the release.
        s.end.store(0, Ordering::Release);
        s.start.store(0, Ordering::Release);
        // SAFETY: unmapping our own mapping, which no reference outlives (`bytes` borrows
        // `self`).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Installs the SIGBUS handler once; whether it is in place.
fn install_handler() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: sysconf and sigaction with initialised arguments; the handler only uses
        // atomics, mmap and sigaction, all safe in a signal handler.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE_SIZE.store(page as usize, Ordering::Relaxed);
            }
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return false;
            }
            let _ = PREVIOUS.set(previous);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) == 0
        }
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &SLOTS_TABLE {
        let start = s.start.load(Ordering::Acquire);
        let end = s.end.load(Ordering::Acquire);
        if start > 1 && start <= addr && addr < end {
            let from = addr & !(PAGE_SIZE.load(Ordering::Relaxed) - 1);
            // SAFETY: replaces pages of a registered mapping of ours (from the faulting page
            // to its end) with private zeroed memory; nothing else lives there.
            let p = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    end - from,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                s.faulted.store(true, Ordering::Release);
                return;
            }
        }
    }
    pass_on(sig, info, ctx);
}

/// Hands a fault that is not ours to the previous disposition.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if let Some(prev) = PREVIOUS.get() {
        let h = prev.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            // SAFETY: calling the handler that was installed before ours, the way the kernel
            // would have (with siginfo when it asked for it).
            unsafe {
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(h);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                    f(sig);
                }
            }
            return;
        }
    }
    // The default action: returning re-runs the faulting access, which now kills the process
    // as it would have without us.
    // SAFETY: sigaction with a zeroed (SIG_DFL) disposition.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn truncation_under_a_mapping_reads_zeroes_and_is_reported() {
        let mut f = tempfile::tempfile().unwrap();
        let data = vec![0xa5u8; 5 * 65536];
        f.write_all(&data).unwrap();
        let m = Mapping::new(&f, data.len() as u64).unwrap();
        assert_eq!(m.bytes()[..100], data[..100]);
        assert!(!m.faulted());
        f.set_len(65536 + 10).unwrap();
        // Reading past the new end would be SIGBUS without the handler.
        let sum: u64 = m.bytes().iter().map(|&b| b as u64).sum();
        assert!(m.faulted());
        assert!(sum < data.len() as u64 * 0xa5);
        assert_eq!(m.bytes()[0], 0xa5);
        drop(m);
        // The slot is free again and a new mapping starts clean.
        let m = Mapping::new(&f, 4096).unwrap();
        assert!(!m.faulted());
    }

    #[test]
    fn empty_files_are_not_mapped() {
        let f = tempfile::tempfile().unwrap();
        assert!(Mapping::new(&f, 0).is_none());
    }
}
