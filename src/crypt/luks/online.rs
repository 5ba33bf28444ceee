//! A LUKS volume served online: cryptsetup's `resize`, `luksSuspend`, `luksResume` and
//! `refresh` on an open device, over a [`ServedCrypt`]. A resume or refresh re-reads the header
//! and unlocks with a passphrase in the serving process itself, so the volume key never
//! travels between processes.

use super::header::Stack;
use super::online_reencrypt::{Place, Reencryptor};
use super::{ActivateParams, Header, LuksError, LuksVolume};
use crate::block::online::{Online, OnlineError, RefreshFlags, Unlock};
use crate::block::{BlockDevice, Claim, FileDevice};
use crate::crypt::luks2::activate::{self, ActivateOptions, DataSegment};
use crate::crypt::target::{CryptDevice, ServedCrypt};
use std::path::PathBuf;
use std::sync::Arc;

/// Where the volume lives and how it was opened: what a resume needs to unlock it again.
pub(super) struct Source {
    /// The data device.
    pub device: PathBuf,
    /// The detached header, if any.
    pub header: Option<PathBuf>,
    /// The volume's UUID at open: a resume refuses a header that is another volume's.
    pub uuid: String,
    /// The activation parameters.
    pub params: ActivateParams,
    /// The LUKS2 data segment has a fixed size (LUKS1 and "dynamic" segments follow the
    /// device).
    pub fixed_size: bool,
}

/// A LUKS volume whose server may resize, suspend, resume and refresh it.
struct LuksOnline {
    src: Source,
    seg: DataSegment,
    served: ServedCrypt,
    reenc: Reencryptor,
}

/// Build the served stack of `seg` (without integrity) over `lower`, whose range `claim`
/// holds, with the volume key `vk`.
pub(super) fn stack(
    src: Source,
    seg: &DataSegment,
    lower: FileDevice,
    claim: &Claim,
    vk: &[u8],
    opts: &ActivateOptions,
) -> Result<(Stack, Arc<dyn Online>), LuksError> {
    let dup = lower
        .reopened()
        .map_err(|e| LuksError::Invalid(format!("{}: cannot reopen: {e}", src.device.display())))?;
    let crypt = activate::crypt_device(seg, Arc::new(dup), vk, opts)?;
    let stats = crypt.stats();
    let served = ServedCrypt::new(crypt, lower, claim)?;
    let device = served.device();
    let place = Place {
        device: src.device.clone(),
        header: src.header.clone(),
        opts: opts.clone(),
    };
    let online = Arc::new(LuksOnline {
        reenc: Reencryptor::new(place, served.gate()),
        src,
        seg: seg.clone(),
        served,
    });
    Ok((
        Stack {
            device,
            stats: Arc::new(move || stats.to_json()),
        },
        online,
    ))
}

/// Whether the volume's data segment has a fixed size (LUKS2 only; LUKS1 follows the device).
pub(super) fn fixed_size(h: &Header) -> bool {
    match h {
        Header::V2(h) => h
            .metadata
            .segments
            .get(&0)
            .is_some_and(|s| s.size.is_some()),
        Header::V1(_) => false,
    }
}

fn failure(e: LuksError) -> OnlineError {
    OnlineError {
        code: e.exit_code(),
        message: e.to_string(),
    }
}

impl LuksOnline {
    /// Read the header again and unlock its volume key with `u`: the target for the segment
    /// as served now, discards passed down when `allow_discards` or the header's flag (as
    /// it is now) says so.
    fn unlock(&self, u: &Unlock, allow_discards: bool) -> Result<CryptDevice, OnlineError> {
        let vol = LuksVolume::open(&self.src.device, self.src.header.as_deref(), false, None)
            .map_err(failure)?;
        if vol.uuid() != self.src.uuid {
            return Err(OnlineError::invalid(format!(
                "{}: the header now belongs to volume {} (it was {} at open); refusing",
                self.src
                    .header
                    .as_ref()
                    .unwrap_or(&self.src.device)
                    .display(),
                vol.uuid(),
                self.src.uuid
            )));
        }
        let key = vol.unlock_key(&u.passphrase, u.key_slot).map_err(failure)?;
        let lower = self.served.lower()?;
        let now = vol
            .header()
            .data_segment(lower.name(), lower.size(), self.src.header.is_some())
            .map_err(failure)?;
        let mut seg = self.seg.clone();
        seg.size = self.served.params().size;
        seg.allow_discards = now.allow_discards;
        let opts = ActivateOptions {
            name: self.src.params.name.clone(),
            allow_discards,
            read_only: self.src.params.read_only,
        };
        activate::crypt_device(&seg, Arc::new(lower), key.volume_key(), &opts).map_err(failure)
    }
}

impl Online for LuksOnline {
    fn resize(&self, sectors: Option<u64>) -> Result<u64, OnlineError> {
        self.reenc.refuse("resize")?;
        let fixed = self.src.fixed_size.then_some(self.seg.size);
        self.served.resize(sectors, fixed)
    }

    fn suspend(&self) -> Result<(), OnlineError> {
        self.reenc.refuse("suspend")?;
        self.served.suspend()
    }

    fn resume(&self, u: &Unlock) -> Result<(), OnlineError> {
        if !self.served.suspended() {
            return Err(OnlineError::invalid(format!(
                "Volume {} is not suspended.",
                self.src.params.name
            )));
        }
        let crypt = self.unlock(u, self.src.params.allow_discards)?;
        self.served.install(crypt);
        Ok(())
    }

    fn refresh(&self, u: &Unlock, flags: RefreshFlags) -> Result<(), OnlineError> {
        self.served.refuse_suspended()?;
        self.reenc.refuse("refresh")?;
        let crypt = self.unlock(u, flags.allow_discards)?;
        self.served.install(crypt);
        if flags.persistent {
            // After the refresh, as cryptsetup: a failure here leaves the new flags active.
            let mut vol =
                LuksVolume::open(&self.src.device, self.src.header.as_deref(), true, None)
                    .map_err(failure)?;
            vol.set_persistent_flags(flags.allow_discards, false)
                .map_err(|e| {
                    OnlineError::invalid(format!(
                        "Device refreshed but cannot make flags persistent. ({e})"
                    ))
                })?;
        }
        Ok(())
    }

    fn suspended(&self) -> bool {
        self.served.suspended()
    }

    fn allow_discards(&self) -> bool {
        self.served.params().allow_discards
    }

    fn closing(&self) {
        self.reenc.stop();
        self.served.close();
    }

    fn reencrypt(
        &self,
        unlock: &Unlock,
        max_hotzone: Option<u64>,
        header: Option<&std::path::Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), OnlineError> {
        let r = match header {
            // The command line exported the header and moved the first data segment while
            // the device was suspended; the reencryption's mapping resumes it. A device left
            // serving nothing by a failure of that is taken as a suspended one.
            Some(h) => {
                let suspended = self.served.suspended() || self.reenc.unserved();
                self.reenc.adopt(h, suspended, &self.src.uuid)
            }
            None => self.served.refuse_suspended(),
        }
        .and_then(|()| self.reenc.run(unlock, max_hotzone, progress));
        if self.reenc.started() {
            self.served.retire();
        }
        r.map_err(
            |e| match header.and_then(|h| self.reenc.fail_unserved(&e.message, h)) {
                Some(message) => OnlineError { message, ..e },
                None => e,
            },
        )
    }

    fn reencryption(&self) -> Option<serde_json::Value> {
        self.reenc.status()
    }
}
