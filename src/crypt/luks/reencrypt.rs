//! Reencryption verbs of the volume handle: the volume keys stay inside the library, the
//! caller gives passphrases and gets progress through a callback. The work itself is
//! `crypt::luks2::reencrypt`; this file opens the data device, claims it and picks the
//! version.

use super::header::Header;
use super::volume::LuksVolume;
use super::LuksError;
use crate::block::{BlockDevice, Claim, FileDevice};
use crate::crypt::luks2::reencrypt::{self, engine, InitParams, NewKeyslot, Progress, RunOptions};
use crate::crypt::luks2::reencrypt::{ReencryptState, RunOutcome};
use crate::crypt::luks2::Luks2Header;
use std::os::fd::AsRawFd;

/// The data segment's parameters a reencryption starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentParams {
    /// Cipher ("aes-xts-plain64").
    pub cipher: String,
    /// Volume key size, bytes.
    pub key_size: usize,
    /// Encryption sector size.
    pub sector_size: u32,
}

/// cryptsetup's I/O block of a data device: the file system's block for a file (at most a
/// page), the logical block of a block device.
pub(super) fn io_block(dev: &FileDevice) -> u64 {
    let f = dev.file();
    if f.metadata().is_ok_and(|m| m.is_file()) {
        // SAFETY: fstatvfs writes into a struct we own, on a descriptor we hold open.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::fstatvfs(f.as_raw_fd(), &mut st) };
        if rc == 0 && st.f_bsize > 0 && st.f_bsize <= 4096 {
            return st.f_bsize as u64;
        }
        4096
    } else {
        u64::from(dev.logical_block_size())
    }
}

impl LuksVolume {
    fn luks2(&self) -> Result<&Luks2Header, LuksError> {
        match &self.header {
            Header::V2(h) => Ok(h),
            Header::V1(_) => Err(LuksError::Unsupported(
                "reencryption of a LUKS1 device (convert it to LUKS2 first)".into(),
            )),
        }
    }

    /// The reencryption in progress on this volume, if any.
    pub fn reencryption(&self) -> Result<Option<ReencryptState>, LuksError> {
        match &self.header {
            Header::V2(h) => ReencryptState::read(&h.metadata),
            Header::V1(_) => Ok(None),
        }
    }

    /// The data segment's cipher, key size and sector size (the defaults of a reencryption).
    pub fn segment_params(&self) -> Result<SegmentParams, LuksError> {
        let h = self.luks2()?;
        let s = h
            .metadata
            .segments
            .get(&0)
            .ok_or_else(|| LuksError::Invalid("no data segment 0".into()))?;
        let key_size = h
            .metadata
            .segment_digest(0)
            .and_then(|(d, _)| {
                h.metadata
                    .keyslots
                    .iter()
                    .find(|(id, _)| h.metadata.keyslot_digest(**id).map(|x| x.0) == Some(d))
            })
            .map_or(0, |(_, k)| k.key_size as usize);
        Ok(SegmentParams {
            cipher: s.encryption.clone(),
            key_size,
            sector_size: s.sector_size,
        })
    }

    /// Whether a re-key with `new_key` keeps the volume key (`--keep-key`, or a given key
    /// that is the current one).
    pub fn reencrypt_keeps_key(&self, new_key: &reencrypt::NewKey) -> Result<bool, LuksError> {
        reencrypt::keeps_key(self.luks2()?, new_key)
    }

    /// The keyslots whose key opens the data segment (the ones a reencryption re-keys).
    pub fn data_keyslots(&self) -> Result<Vec<u32>, LuksError> {
        let h = self.luks2()?;
        let m = &h.metadata;
        let Some((d, _)) = m.segment_digest(0) else {
            return Ok(Vec::new());
        };
        Ok(m.digests[&d].keyslots.clone())
    }

    /// The data device, opened for writing and claimed whole for the reencryption (no
    /// device may map it meanwhile); `None` when it is the header device itself.
    fn reencrypt_data(&self) -> Result<(Option<FileDevice>, Claim), LuksError> {
        if self.header_path.is_some() {
            let d = crate::block::open_backing(&self.device, false, false)?;
            let c = Claim::take(d.file(), &self.device, 0, 0, true)?;
            Ok((Some(d), c))
        } else {
            let c = Claim::take(self.dev.file(), &self.device, 4096, 0, true)?;
            Ok((None, c))
        }
    }

    /// Put the volume into reencryption (`reencrypt --init-only`): a new volume key in new
    /// keyslots, one for each old keyslot in `slots` under the same passphrase, and the
    /// reencryption metadata. Returns the reencrypt keyslot. The volume must have been opened
    /// writable.
    pub fn reencrypt_init(
        &mut self,
        slots: &[NewKeyslot<'_>],
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        self.luks2()?;
        let (data, claim) = self.reencrypt_data()?;
        self.reencrypt_init_with(data, Some(claim), slots, params)
    }

    /// [`LuksVolume::reencrypt_init`] of a volume its server serves (and claims): only the
    /// header changes, the server reencrypts the data online.
    pub fn reencrypt_init_served(
        &mut self,
        slots: &[NewKeyslot<'_>],
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        self.luks2()?;
        let data = match &self.header_path {
            Some(_) => Some(crate::block::open_device(&self.device, true, false)?),
            None => None,
        };
        self.reencrypt_init_with(data, None, slots, params)
    }

    fn reencrypt_init_with(
        &mut self,
        data: Option<FileDevice>,
        _claim: Option<Claim>,
        slots: &[NewKeyslot<'_>],
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        let mut p = params.clone();
        p.io_block = io_block(data.as_ref().unwrap_or(&self.dev));
        let data_size = data.as_ref().unwrap_or(&self.dev).size();
        let Header::V2(h) = &mut self.header else {
            unreachable!("checked above")
        };
        reencrypt::init(&self.dev, h, data_size, slots, &p)
    }

    /// Run (or resume) the reencryption with `pass` (keyslot `slot` when given), reporting
    /// progress before each hotzone and at the end; `progress` returning `false` stops it
    /// cleanly at a hotzone boundary. A hotzone a crash interrupted is recovered first.
    pub fn reencrypt_run(
        &mut self,
        pass: &[u8],
        slot: Option<u32>,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<RunOutcome, LuksError> {
        let st = self
            .reencryption()?
            .ok_or_else(|| LuksError::Invalid("Device reencryption not in progress.".into()))?;
        let (data, _claim) = self.reencrypt_data()?;
        let mut o = opts.clone();
        o.io_block = io_block(data.as_ref().unwrap_or(&self.dev));
        let Header::V2(h) = &mut self.header else {
            unreachable!("reencryption is LUKS2 only")
        };
        if engine::finish_orphaned(&self.dev, h, &st, pass, slot)? {
            return Ok(RunOutcome::Finished);
        }
        let keys = match engine::unlock_keys(&self.dev, h, &st, pass, slot) {
            Ok(keys) => keys,
            Err(e) if engine::finish_keyless_decryption(&self.dev, h, &st, &e)? => {
                return Ok(RunOutcome::Finished)
            }
            Err(e) => return Err(e),
        };
        let data_dev: &dyn BlockDevice = match &data {
            Some(d) => d,
            None => &self.dev,
        };
        let shifted = reencrypt::datashift::is_moved_encryption(&st)
            || reencrypt::datashift::is_in_place_encryption(&st)
            || reencrypt::decrypt_shift::is_moved_decryption(&st);
        if shifted && o.device_size.is_some() {
            return Err(LuksError::Unsupported(
                "--device-size with a reencryption that moves the data (dmkit moves it whole)"
                    .into(),
            ));
        }
        let r = if reencrypt::datashift::is_moved_encryption(&st)
            || reencrypt::datashift::is_in_place_encryption(&st)
        {
            reencrypt::datashift::run(&self.dev, data_dev, h, &keys, progress)
        } else if reencrypt::decrypt_shift::is_moved_decryption(&st) {
            reencrypt::decrypt_shift::run(&self.dev, data_dev, h, &keys, progress, None)
        } else {
            engine::Run::new(&self.dev, data_dev, h, &keys).and_then(|run| run.run(&o, progress))
        };
        drop(keys);
        crate::crypt::secret::burn_stack();
        r
    }
}
