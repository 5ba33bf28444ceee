//! Memory for secrets: volume keys, cipher key schedules and passphrases.
//!
//! A core dump of a serving daemon, or its pages in swap, must not hold the volume key. Every
//! secret here lives in an anonymous mapping of its own (page-aligned, never shared with other
//! data), which is
//!
//! - locked in RAM (`mlock`), so it is never written to swap; a process that may not lock that
//!   much (`RLIMIT_MEMLOCK`, non-root) keeps going unlocked and says so once on stderr;
//! - excluded from core dumps (`madvise(MADV_DONTDUMP)`);
//! - wiped (volatile writes) before it is unlocked and unmapped.
//!
//! Locks are not inherited by `fork(2)` children, but `open` forks its server after the keys
//! are made: a `pthread_atfork` child handler locks every live secret again in the child.
//! `MADV_DONTDUMP` is a property of the mapping and survives the fork.
//!
//! Kept here: volume keys (`luks2::VolumeKey`), passphrases and key files as read, KDF outputs
//! and decrypted keyslot material while a keyslot is opened or written, and every key schedule
//! a serving daemon holds that is ours: the VAES AES-XTS round keys, the serpent, AES (LRW,
//! ESSIV, portable XTS) and twofish schedules, LRW's tweak-key tables, OpenSSL EVP's copy of
//! the key.
//!
//! What this cannot cover: copies the compiler leaves in registers and stack frames while a
//! value is built or used (moved into place, then left to be overwritten); memory other
//! libraries allocate for themselves (OpenSSL's EVP cipher contexts, used for AES-CBC and for
//! AES-XTS without VAES, keep their key schedule on OpenSSL's heap; OpenSSL's PBKDF2 keeps its
//! HMAC state there while it runs); Argon2's working memory (up to gigabytes: wiped before it
//! is freed, but not locked).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use zeroize::Zeroize;

/// Live secret mappings (address, bytes) that are locked, re-locked in a forked child.
static LOCKED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
/// Whether the "cannot lock" warning was printed by this process.
static WARNED: AtomicBool = AtomicBool::new(false);
static ATFORK: Once = Once::new();

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// In a forked child (single-threaded, see `export::daemon::open`): lock every secret again.
extern "C" fn relock_in_child() {
    // try_lock: a lock held by another thread at fork time would never be released here.
    if let Ok(regions) = LOCKED.try_lock() {
        for &(addr, len) in regions.iter() {
            // SAFETY: the region is a live mapping of this many bytes (registered on map,
            // removed before unmap), and the child has the same address space.
            if unsafe { libc::mlock(addr as *const libc::c_void, len) } != 0 {
                warn_unlocked(std::io::Error::last_os_error());
                break;
            }
        }
    }
}

fn warn_unlocked(e: std::io::Error) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "dmkit: warning: cannot lock key memory in RAM (mlock: {e}; raise the locked-memory \
             limit, ulimit -l): keys may reach swap; they are still kept out of core dumps"
        );
    }
}

/// One anonymous mapping holding a secret.
struct Region {
    ptr: NonNull<u8>,
    /// Bytes mapped (a whole number of pages).
    size: usize,
    locked: bool,
}

// SAFETY: a Region is an owned mapping with no thread affinity; access to its bytes goes
// through the owning SecretBytes/SecretBox, whose borrows the compiler checks.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` gives out no mutable access.
unsafe impl Sync for Region {}

impl Region {
    /// A zero-filled mapping of at least `bytes` (at least one page).
    fn new(bytes: usize) -> Region {
        ATFORK.call_once(|| {
            // SAFETY: registers a plain function with no preconditions as the child handler.
            unsafe { libc::pthread_atfork(None, None, Some(relock_in_child)) };
        });
        let page = page_size();
        let size = bytes.max(1).div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // Out of memory for a few pages: what a Vec does in that case.
            let layout = std::alloc::Layout::from_size_align(size, page)
                .unwrap_or(std::alloc::Layout::new::<u8>());
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is the mapping just made, of `size` bytes. MADV_DONTDUMP cannot fail on
        // a private anonymous mapping of this process.
        let locked = unsafe {
            libc::madvise(p, size, libc::MADV_DONTDUMP);
            libc::mlock(p, size) == 0
        };
        if locked {
            LOCKED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((p as usize, size));
        } else {
            warn_unlocked(std::io::Error::last_os_error());
        }
        Region {
            ptr: NonNull::new(p.cast()).expect("mmap returned a null mapping"),
            size,
            locked,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `size` bytes mapped readable at `ptr` for as long as self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.bytes_mut().zeroize();
        let addr = self.ptr.as_ptr() as usize;
        if self.locked {
            let mut regions = LOCKED.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = regions.iter().position(|&(a, _)| a == addr) {
                regions.swap_remove(i);
            }
        }
        // SAFETY: the mapping made in `new`, unmapped once; nothing refers to it any more.
        unsafe {
            if self.locked {
                libc::munlock(self.ptr.as_ptr().cast(), self.size);
            }
            libc::munmap(self.ptr.as_ptr().cast(), self.size);
        }
    }
}

/// Secret bytes (a volume key, a passphrase) in locked, undumpable memory, wiped on drop.
///
/// Dereferences to `[u8]` of its length; the length can change within the mapping's capacity
/// ([`resize`](Self::resize) moves to a bigger mapping when needed, wiping the old one).
pub struct SecretBytes {
    region: Region,
    len: usize,
}

impl SecretBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> SecretBytes {
        SecretBytes {
            region: Region::new(len),
            len,
        }
    }

    /// Empty, with room for `capacity` bytes before the next move.
    pub fn with_capacity(capacity: usize) -> SecretBytes {
        SecretBytes {
            region: Region::new(capacity),
            len: 0,
        }
    }

    /// A copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> SecretBytes {
        let mut s = SecretBytes::zeroed(bytes.len());
        s.copy_from_slice(bytes);
        s
    }

    /// Takes the contents of `v` and wipes `v`.
    pub fn new(mut v: Vec<u8>) -> SecretBytes {
        let s = SecretBytes::from_slice(&v);
        v.zeroize();
        s
    }

    /// Bytes it can hold without moving.
    pub fn capacity(&self) -> usize {
        self.region.size
    }

    /// Whether the memory is locked in RAM (false when `mlock` was refused).
    pub fn is_locked(&self) -> bool {
        self.region.locked
    }

    /// Change the length to `len`: new bytes are zero, dropped bytes are wiped. Growing past the
    /// capacity moves the contents to a mapping twice as large (the old one is wiped).
    pub fn resize(&mut self, len: usize) {
        if len > self.region.size {
            let mut bigger = Region::new(len.max(2 * self.region.size));
            bigger.bytes_mut()[..self.len].copy_from_slice(&self.region.bytes()[..self.len]);
            self.region = bigger;
        }
        if len < self.len {
            self.region.bytes_mut()[len..self.len].zeroize();
        }
        self.len = len;
    }

    /// Shorten to `len` bytes (no-op when already shorter), wiping the rest.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.resize(len);
        }
    }
}

impl Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.region.bytes()[..self.len]
    }
}

impl DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.region.bytes_mut()[..len]
    }
}

impl Clone for SecretBytes {
    fn clone(&self) -> SecretBytes {
        SecretBytes::from_slice(self)
    }
}

impl PartialEq for SecretBytes {
    /// Constant-time comparison.
    fn eq(&self, other: &SecretBytes) -> bool {
        bool::from(subtle::ConstantTimeEq::ct_eq(&self[..], &other[..]))
    }
}

impl Eq for SecretBytes {}

impl std::fmt::Debug for SecretBytes {
    /// The length only; never the contents.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes({} bytes)", self.len)
    }
}

impl From<Vec<u8>> for SecretBytes {
    fn from(v: Vec<u8>) -> SecretBytes {
        SecretBytes::new(v)
    }
}

/// A value (a cipher's key schedule) in locked, undumpable memory of its own: dropped in place,
/// then its bytes wiped.
///
/// The value is built by the caller and moved in, so a transient copy may stay in the
/// constructing stack frame until it is overwritten.
pub struct SecretBox<T> {
    region: Region,
    _value: PhantomData<T>,
}

// SAFETY: the box owns its T exclusively, like Box<T>.
unsafe impl<T: Send> Send for SecretBox<T> {}
// SAFETY: `&SecretBox<T>` only gives `&T`, like Box<T>.
unsafe impl<T: Sync> Sync for SecretBox<T> {}

impl<T> SecretBox<T> {
    /// Move `value` into secret memory.
    pub fn new(value: T) -> SecretBox<T> {
        assert!(
            std::mem::align_of::<T>() <= page_size(),
            "secret values are aligned to a page at most"
        );
        let region = Region::new(std::mem::size_of::<T>());
        // SAFETY: the mapping is page-aligned (so aligned for T, checked above), at least
        // size_of::<T>() bytes, writable, and not yet holding a T.
        unsafe { std::ptr::write(region.ptr.as_ptr().cast::<T>(), value) };
        SecretBox {
            region,
            _value: PhantomData,
        }
    }

    /// Whether the memory is locked in RAM (false when `mlock` was refused).
    pub fn is_locked(&self) -> bool {
        self.region.locked
    }
}

/// Types for which all-zero bytes are a valid value (integers and arrays of them), so a
/// [`SecretBox`] can be made zeroed and filled in place, leaving no copy anywhere else.
///
/// # Safety
/// Every bit pattern of all zeros must be a valid value of the type.
pub unsafe trait Zeroable {}

impl<T: Zeroable> SecretBox<T> {
    /// A zeroed value in secret memory, to be filled in place.
    pub fn zeroed() -> SecretBox<T> {
        assert!(
            std::mem::align_of::<T>() <= page_size(),
            "secret values are aligned to a page at most"
        );
        // Fresh anonymous mappings are zero-filled: by the Zeroable contract that is a T.
        SecretBox {
            region: Region::new(std::mem::size_of::<T>()),
            _value: PhantomData,
        }
    }
}

/// Overwrite the stack below the caller's frame: the dead frames of functions it called,
/// where key schedules built by value (other crates' ciphers) or key derivation may have left
/// copies. A best effort, like libgcrypt's `_gcry_burn_stack`; call it after making keys.
#[inline(never)]
pub fn burn_stack() {
    let mut scratch = [0u8; 32 << 10];
    std::hint::black_box(&mut scratch);
    scratch.zeroize();
    std::hint::black_box(&scratch);
}

impl<T> Deref for SecretBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: `new` wrote a T there; it lives until drop.
        unsafe { &*self.region.ptr.as_ptr().cast::<T>() }
    }
}

impl<T> DerefMut for SecretBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, with `&mut self` the only access.
        unsafe { &mut *self.region.ptr.as_ptr().cast::<T>() }
    }
}

impl<T> Drop for SecretBox<T> {
    fn drop(&mut self) {
        // SAFETY: the T written in `new`, dropped exactly once; the region (dropped after this)
        // then wipes and unmaps its bytes.
        unsafe { std::ptr::drop_in_place(self.region.ptr.as_ptr().cast::<T>()) };
    }
}

impl<T> std::fmt::Debug for SecretBox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBox<{}>", std::any::type_name::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VmFlags of the mapping that holds `addr`, from /proc/self/smaps.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = (lo..hi).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    return f.to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn bytes_are_page_aligned_undumpable_and_locked_when_allowed() {
        let mut s = SecretBytes::from_slice(b"volume key");
        assert_eq!(&s[..], b"volume key");
        let addr = s.as_ptr() as usize;
        assert_eq!(addr % page_size(), 0);
        let flags = vm_flags(addr);
        assert!(
            flags.contains(" dd"),
            "not excluded from core dumps: {flags}"
        );
        if s.is_locked() {
            assert!(flags.contains(" lo"), "not locked: {flags}");
        }
        s[0] = b'V';
        assert_eq!(format!("{s:?}"), "SecretBytes(10 bytes)");
        assert_eq!(s.clone(), s);
        assert_ne!(SecretBytes::from_slice(b"other"), s);
    }

    #[test]
    fn resize_grows_by_moving_and_wipes_what_it_drops() {
        let mut s = SecretBytes::with_capacity(16);
        s.resize(3);
        s.copy_from_slice(b"abc");
        let cap = s.capacity();
        s.resize(cap + 1);
        assert!(s.capacity() > cap);
        assert_eq!(&s[..3], b"abc");
        assert!(s[3..].iter().all(|&b| b == 0));
        s.truncate(1);
        s.resize(3);
        assert_eq!(&s[..], b"a\0\0");
        let v = vec![1u8, 2, 3];
        assert_eq!(&SecretBytes::from(v)[..], &[1, 2, 3]);
    }

    #[test]
    fn boxes_hold_values_and_drop_them() {
        use std::sync::atomic::AtomicUsize;
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Schedule([u32; 2000]);
        impl Drop for Schedule {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::Relaxed);
            }
        }
        let b = SecretBox::new(Schedule([7; 2000]));
        assert_eq!(b.0[1999], 7);
        let addr = &b.0 as *const _ as usize;
        assert_eq!(addr % page_size(), 0);
        assert!(vm_flags(addr).contains(" dd"));
        drop(b);
        assert_eq!(DROPS.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_forked_child_has_its_secrets_locked_again() {
        let s = SecretBytes::from_slice(b"k");
        if !s.is_locked() {
            return; // mlock is not allowed here; nothing to re-lock
        }
        // Locks are not inherited by fork: only the atfork handler can lock them again. The
        // child counts its locked memory (VmLck) with raw syscalls only: other test threads
        // may hold the allocator's locks at fork time.
        // SAFETY: fork in a test; the child runs async-signal-safe calls only, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut buf = [0u8; 4096];
            // SAFETY: raw open/read/close of a proc file into a stack buffer, then _exit.
            let code = unsafe {
                let fd = libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY);
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                libc::close(fd);
                let text = &buf[..n.max(0) as usize];
                let at = text.windows(6).position(|w| w == b"VmLck:");
                let locked = at.is_some_and(|i| {
                    text[i + 6..]
                        .iter()
                        .take_while(|&&c| c != b'\n')
                        .any(|&c| (b'1'..=b'9').contains(&c))
                });
                if locked {
                    0
                } else {
                    1
                }
            };
            // SAFETY: leave the child without running destructors or atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child has no locked memory"
        );
    }
}
