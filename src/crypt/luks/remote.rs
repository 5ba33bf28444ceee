//! A LUKS volume read from a remote object (`luks open --readonly URL`, `luks dump URL`; issue
//! 28): the header and the keyslot areas are read through the same transport as the data, and
//! the volume is served read-only. Nothing here writes: no claim, no header update, no
//! reencryption.
//!
//! Without dm-verity below it there is nothing to verify a block against, so nothing is cached
//! on disk: the ciphertext only ever sits in the remote device's read-ahead buffers in memory.
//! A block the server changed decrypts to garbage (or fails the integrity tag, with
//! authenticated encryption); a changed object fails closed through the pinned ETag.

use super::header::{self, Header};
use super::{ActivateParams, LuksError};
use crate::block::{Activated, BlockDevice};
use crate::crypt::luks2::activate::ActivateOptions;
use crate::crypt::luks2::integrity::IntegrityActivation;
use crate::crypt::luks2::{keyslot, reencrypt};
use std::sync::Arc;

/// A LUKS header read from a remote object.
pub struct RemoteLuks {
    /// The header and keyslots are read through this one.
    dev: Arc<dyn BlockDevice>,
    /// The data segment's reads (with read-ahead).
    data: Arc<dyn BlockDevice>,
    header: Header,
    warning: Option<String>,
}

impl RemoteLuks {
    /// Read the header of the object behind `dev` (`want`: the LUKS version asked for); the
    /// data segment will be read through `data`, a device over the same object.
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        data: Arc<dyn BlockDevice>,
        want: Option<u16>,
    ) -> Result<RemoteLuks, LuksError> {
        let (header, warning) = Header::read_as(&*dev, want)?;
        Ok(RemoteLuks {
            dev,
            data,
            header,
            warning,
        })
    }

    /// Why a corrupt LUKS2 header copy was skipped, once (the caller says it).
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// `luks dump`'s text.
    pub fn dump_text(&self) -> Vec<u8> {
        self.header.dump_text(self.dev.name())
    }

    /// `luks dump --json`.
    pub fn dump_json(&self) -> serde_json::Value {
        self.header.dump_json()
    }

    /// The keyslot `pass` opens (`open --test-passphrase`).
    pub fn test_passphrase(&self, pass: &[u8], slot: Option<u32>) -> Result<u32, LuksError> {
        let segment = match slot {
            Some(_) => keyslot::Segment::Any,
            None => keyslot::Segment::Default,
        };
        Ok(self.header.unlock(&*self.dev, pass, slot, segment)?.0)
    }

    /// Unlock with `pass` and activate the data segment read-only as `params.name`.
    pub fn activate(
        &self,
        pass: &[u8],
        slot: Option<u32>,
        params: &ActivateParams,
    ) -> Result<Activated, LuksError> {
        let name = self.dev.name().to_string();
        if !params.read_only {
            return Err(LuksError::Invalid(format!(
                "{name}: a remote LUKS volume opens only with --readonly"
            )));
        }
        if let Header::V2(h) = &self.header {
            if reencrypt::state::status(&h.metadata) != reencrypt::Status::None {
                return Err(LuksError::Invalid(format!(
                    "{name}: the volume is in reencryption: it cannot be opened from a remote object"
                )));
            }
        }
        let seg = self.header.data_segment(&name, self.dev.size(), false)?;
        let (slot, key) = self
            .header
            .unlock(&*self.dev, pass, slot, keyslot::Segment::Default)?;
        let opts = ActivateOptions {
            name: params.name.clone(),
            allow_discards: false,
            read_only: true,
        };
        let iopts = IntegrityActivation { no_journal: true };
        let active = header::stack(&seg, self.data.clone(), &key, &opts, &iopts)?;
        drop(key);
        let size = active.device.size();
        let details = serde_json::json!({
            "type": self.header.type_name(),
            "uuid": self.header.uuid(),
            "cipher": seg.cipher,
            "keysize_bits": self.header.key_bits(),
            "key_location": "memory",
            "device": name,
            "remote": true,
            "cache": "none (nothing to verify ciphertext against without verity)",
            "offset_sectors": seg.offset / 512,
            "size_sectors": size / 512,
            "sector_size": seg.sector_size,
            "keyslot": slot,
            "integrity": seg.integrity,
            "integrity_mode": seg.integrity.as_ref().map(|_| "R"),
        });
        Ok(Activated {
            name: params.name.clone(),
            device: active.device,
            kind: "crypt".to_string(),
            details,
            stats: Some(active.stats),
            claims: Vec::new(),
            allow_discards: false,
            online: None,
        })
    }
}
