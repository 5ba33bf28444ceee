//! What a served volume can be asked to do while it stays open (cryptsetup's `resize`,
//! `luksSuspend`, `luksResume`, `refresh`), and the [`Gate`] that lets its server swap the
//! device under the exporters: every request goes through the gate, which holds it (no error,
//! no timeout) while the device is suspended and lets it through the new device once resumed.

use super::{BlockDevice, BlockError, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// Why an online request was refused or failed: a message naming the device, and
/// cryptsetup's exit code for it (1 invalid, 2 wrong passphrase, 4 no device, 5 busy).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OnlineError {
    /// cryptsetup's exit code.
    pub code: i32,
    /// One line naming the device and what is wrong.
    pub message: String,
}

impl OnlineError {
    /// A refusal of an invalid request (exit 1).
    pub fn invalid(message: impl Into<String>) -> OnlineError {
        OnlineError {
            code: 1,
            message: message.into(),
        }
    }
}

/// A passphrase (or key file contents) given to [`Online::resume`] or [`Online::refresh`],
/// with the keyslot to try (all when `None`). Wiped when dropped.
pub struct Unlock {
    /// The passphrase bytes.
    pub passphrase: zeroize::Zeroizing<Vec<u8>>,
    /// Only this keyslot.
    pub key_slot: Option<u32>,
}

/// The activation flags `refresh` re-applies (cryptsetup `refresh`: given flags replace the
/// active ones; flags not given go back to the volume's defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefreshFlags {
    /// Pass discards down (`--allow-discards`), besides the volume's persistent flag.
    pub allow_discards: bool,
    /// Store the flags in the volume's header as well (`--persistent`), replacing those
    /// stored before.
    pub persistent: bool,
}

/// What the server of an open volume can ask of it besides I/O. Implemented by the volume
/// handles that support it (LUKS, plain); requests run on the server's control thread.
pub trait Online: Send + Sync {
    /// Serve `sectors` 512-byte sectors (`None`: up to the end of the backing device, as it
    /// is now); returns the new size in bytes. Refused beyond the backing device.
    fn resize(&self, sectors: Option<u64>) -> std::result::Result<u64, OnlineError>;
    /// Wipe the volume key from memory and hold every request until [`Online::resume`].
    fn suspend(&self) -> std::result::Result<(), OnlineError>;
    /// Unlock the volume key again from the header and let held requests through.
    fn resume(&self, unlock: &Unlock) -> std::result::Result<(), OnlineError>;
    /// Re-read the header, unlock, and re-apply `flags` without closing.
    fn refresh(&self, unlock: &Unlock, flags: RefreshFlags)
        -> std::result::Result<(), OnlineError>;
    /// Whether the volume is suspended.
    fn suspended(&self) -> bool;
    /// Whether discards pass down now.
    fn allow_discards(&self) -> bool;
    /// The device is being closed: stop a reencryption at a hotzone boundary, then fail held
    /// requests instead of holding them.
    fn closing(&self);
    /// Reencrypt the volume while it is served (its header already in reencryption), hotzone
    /// by hotzone, with the keys `unlock` opens; `progress` gets (bytes done, bytes in all).
    /// `header`: the file a volume served with its header at its start had its header
    /// exported to, while suspended, for a decryption that moves the data down.
    /// Returns when finished, stopped by a close, or failed. Volumes that cannot refuse.
    fn reencrypt(
        &self,
        unlock: &Unlock,
        max_hotzone: Option<u64>,
        header: Option<&std::path::Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> std::result::Result<(), OnlineError> {
        let _ = (unlock, max_hotzone, header, progress);
        Err(OnlineError::invalid(
            "this device cannot be reencrypted while it is open",
        ))
    }
    /// What `status` shows of an online reencryption (none when never started).
    fn reencryption(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The device an exporter serves when its volume can change under it: the current device,
/// or none while suspended (requests then wait).
pub struct Gate {
    name: String,
    logical_block_size: u32,
    read_only: bool,
    current: RwLock<Option<Arc<dyn BlockDevice>>>,
    /// Whether requests are held; waited on with `resumed`.
    held: Mutex<bool>,
    resumed: Condvar,
    size: AtomicU64,
    closing: AtomicBool,
}

impl Gate {
    /// A gate letting requests through to `device`.
    pub fn new(device: Arc<dyn BlockDevice>) -> Gate {
        Gate {
            name: device.name().to_string(),
            logical_block_size: device.logical_block_size(),
            read_only: device.read_only(),
            size: AtomicU64::new(device.size()),
            current: RwLock::new(Some(device)),
            held: Mutex::new(false),
            resumed: Condvar::new(),
            closing: AtomicBool::new(false),
        }
    }

    /// Serve `device` from now on: waits for the requests in flight on the old one, then lets
    /// the held ones through. Its size may differ; its block size and mode must not.
    pub fn replace(&self, device: Arc<dyn BlockDevice>) {
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        self.size.store(device.size(), Ordering::SeqCst);
        *cur = Some(device);
        drop(cur);
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.resumed.notify_all();
    }

    /// Hold every new request and take the device out once the requests in flight are done:
    /// when the caller drops it (and its own references), nothing of it is left in memory.
    pub fn hold(&self) -> Option<Arc<dyn BlockDevice>> {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether requests are held.
    pub fn is_held(&self) -> bool {
        *self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail the held requests and every later one while held (the device is being closed).
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let _g = self.held.lock().unwrap_or_else(|e| e.into_inner());
        self.resumed.notify_all();
    }

    /// Run `f` on the current device, waiting while requests are held.
    fn with<T>(&self, f: impl FnOnce(&dyn BlockDevice) -> Result<T>) -> Result<T> {
        loop {
            {
                let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
                if let Some(d) = cur.as_ref() {
                    return f(d.as_ref());
                }
            }
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            while *held {
                if self.closing.load(Ordering::SeqCst) {
                    return Err(BlockError::Io {
                        device: self.name.clone(),
                        offset: 0,
                        source: std::io::Error::other("the suspended device was closed"),
                    });
                }
                held = self.resumed.wait(held).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

impl BlockDevice for Gate {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }
    fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.with(|d| d.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.with(|d| d.write_at(buf, offset))
    }
    fn flush(&self) -> Result<()> {
        self.with(|d| d.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.with(|d| d.discard(offset, len))
    }
    fn discard_zeroes(&self) -> bool {
        let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
        cur.as_ref().is_some_and(|d| d.discard_zeroes())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.with(|d| d.write_zeroes(offset, len))
    }
    fn hand_over(&self) {
        let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = cur.as_ref() {
            d.hand_over();
        }
    }
    fn blocks_on_network(&self) -> bool {
        let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
        cur.as_ref().is_some_and(|d| d.blocks_on_network())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;
    use std::time::Duration;

    #[test]
    fn held_requests_wait_and_go_to_the_new_device() {
        let a: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("a", 4096));
        let gate = Arc::new(Gate::new(a));
        assert!(gate.hold().is_some());
        let g = gate.clone();
        let reader = std::thread::spawn(move || {
            let mut b = [1u8; 512];
            g.read_at(&mut b, 0).map(|()| b[0])
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!reader.is_finished(), "a held read must wait");
        let b = MemoryDevice::new("b", 8192);
        b.write_at(&[7u8; 512], 0).unwrap();
        gate.replace(Arc::new(b));
        assert_eq!(reader.join().unwrap().unwrap(), 7);
        assert_eq!(gate.size(), 8192);
    }

    #[test]
    fn closing_fails_held_requests() {
        let gate = Arc::new(Gate::new(Arc::new(MemoryDevice::new("a", 4096))));
        gate.hold();
        let g = gate.clone();
        let reader = std::thread::spawn(move || g.read_at(&mut [0u8; 512], 0));
        std::thread::sleep(Duration::from_millis(50));
        gate.close();
        assert!(reader.join().unwrap().is_err());
    }
}
