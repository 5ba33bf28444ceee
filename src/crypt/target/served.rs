//! A crypt target as its server holds it while it stays open: behind a [`Gate`] the server
//! can hold requests at, and reloadable as dm-crypt's table is: resized over the backing
//! device as it is now (same key), taken out (its key schedule wiped once the last reference
//! goes) and put back with a key unlocked again. The volume handles (LUKS, plain) build their
//! `resize`, `luksSuspend`, `luksResume` and `refresh` on it.

use super::{CryptDevice, CryptParams};
use crate::block::online::{Gate, OnlineError};
use crate::block::{BlockDevice, Claim, FileDevice};
use std::sync::{Arc, Mutex, MutexGuard};

/// What changes on a reload: the target served now (none while suspended), its parameters,
/// the backing device and the claim on the mapped range.
struct Live {
    crypt: Option<Arc<CryptDevice>>,
    params: CryptParams,
    lower: FileDevice,
    claim: Claim,
}

/// A served crypt target (see the module documentation).
pub struct ServedCrypt {
    gate: Arc<Gate>,
    live: Mutex<Live>,
}

impl ServedCrypt {
    /// Serve `crypt`, built over (a [`FileDevice::reopened`] copy of) `lower`, whose mapped
    /// range `claim` holds.
    pub fn new(
        crypt: CryptDevice,
        lower: FileDevice,
        claim: &Claim,
    ) -> Result<ServedCrypt, crate::block::ClaimError> {
        let crypt = Arc::new(crypt);
        let params = crypt.params().clone();
        Ok(ServedCrypt {
            gate: Arc::new(Gate::new(crypt.clone())),
            live: Mutex::new(Live {
                claim: claim.retake(params.size)?,
                crypt: Some(crypt),
                params,
                lower,
            }),
        })
    }

    /// The device to export.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.gate.clone()
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The gate the device is served through (an online reencryption serves its own device
    /// through it).
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// The gate serves another device for good (an online reencryption's): drop our
    /// reference to the target, and its key schedule with the gate's.
    pub fn retire(&self) {
        self.live().crypt = None;
    }

    /// The parameters of the target as served now.
    pub fn params(&self) -> CryptParams {
        self.live().params.clone()
    }

    /// The backing device as it is now (its current size), on the same open file.
    pub fn lower(&self) -> Result<FileDevice, OnlineError> {
        let live = self.live();
        live.lower
            .reopened()
            .map_err(|e| OnlineError::invalid(format!("{}: cannot reopen: {e}", live.lower.name())))
    }

    /// Whether requests are held (suspended).
    pub fn suspended(&self) -> bool {
        self.gate.is_held()
    }

    /// Refuse while suspended, as cryptsetup does for every reload but a resume.
    pub fn refuse_suspended(&self) -> Result<(), OnlineError> {
        if self.suspended() {
            return Err(OnlineError::invalid(format!(
                "Device {} is suspended.",
                self.live().params.name
            )));
        }
        Ok(())
    }

    /// Serve `sectors` 512-byte sectors (`None` or 0: up to the end of the backing device as
    /// it is now); `fixed`: the only size allowed (a LUKS2 segment of fixed size). Returns the
    /// new size in bytes.
    pub fn resize(&self, sectors: Option<u64>, fixed: Option<u64>) -> Result<u64, OnlineError> {
        self.refuse_suspended()?;
        let lower = self.lower()?;
        let mut live = self.live();
        let p = &live.params;
        let ss = u64::from(p.sector_size);
        let room = lower.size().saturating_sub(p.offset);
        let size = match sectors {
            Some(0) | None => room / ss * ss,
            Some(s) => s
                .checked_mul(512)
                .ok_or_else(|| OnlineError::invalid(format!("--size {s}: too large")))?,
        };
        if size == 0 || !size.is_multiple_of(ss) {
            return Err(OnlineError::invalid(format!(
                "Device {} size is not aligned to requested sector size ({ss} bytes).",
                p.name
            )));
        }
        if size > room {
            return Err(OnlineError::invalid(format!(
                "{}: {} sectors reach beyond the end of {} ({} sectors after the data offset)",
                p.name,
                size / 512,
                lower.name(),
                room / 512
            )));
        }
        if fixed.is_some_and(|f| f != size) {
            return Err(OnlineError::invalid(format!(
                "{}: the LUKS2 data segment has a fixed size ({} sectors); cannot resize it",
                p.name,
                p.size / 512
            )));
        }
        let Some(crypt) = live.crypt.clone() else {
            return Err(OnlineError::invalid(format!(
                "Device {} is suspended.",
                p.name
            )));
        };
        let claim = live.claim.retake(size).map_err(|e| OnlineError {
            code: 5,
            message: e.to_string(),
        })?;
        let new = crypt
            .reshaped(Arc::new(lower), size, p.allow_discards)
            .map_err(|e| OnlineError::invalid(e.to_string()))?;
        self.install_locked(&mut live, new);
        live.claim = claim;
        Ok(size)
    }

    /// Hold every request and wipe the key: the gate's reference and ours go, and with the
    /// last one the cipher's key schedule.
    pub fn suspend(&self) -> Result<(), OnlineError> {
        self.refuse_suspended()?;
        let mut live = self.live();
        drop(self.gate.hold());
        live.crypt = None;
        Ok(())
    }

    /// Serve `crypt` (a target unlocked again, for a resume or a refresh) and let held
    /// requests through.
    pub fn install(&self, crypt: CryptDevice) {
        let mut live = self.live();
        self.install_locked(&mut live, crypt);
    }

    fn install_locked(&self, live: &mut Live, crypt: CryptDevice) {
        let crypt = Arc::new(crypt);
        live.params = crypt.params().clone();
        self.gate.replace(crypt.clone());
        live.crypt = Some(crypt);
    }

    /// The device is being closed: fail held requests instead of holding them.
    pub fn close(&self) {
        self.gate.close();
    }
}
