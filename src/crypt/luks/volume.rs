//! [`LuksVolume`]: one LUKS volume (LUKS1 or LUKS2) with its header device, header, claim and
//! secrets, and the verbs of `cryptsetup` as methods.

use super::header::Header;
use super::{LuksError, VolumeKey};
use crate::block::{Activated, BlockDevice, Claim, FileDevice};
use crate::crypt::luks2::activate::{ActivateOptions, DataSegment};
use crate::crypt::luks2::integrity::IntegrityActivation;
use crate::crypt::luks2::{keyslot, reencrypt, reencrypt_open, Luks2Header, PbkdfParams};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A LUKS volume: the device holding its header (the data device, or a detached header
/// file), the header, and the claim that keeps other header writers away while it may be
/// written. Every version-dependent decision is taken here.
pub struct LuksVolume {
    /// Header device (DEVICE, or the detached header).
    pub(super) dev: FileDevice,
    /// The header.
    pub(super) header: Header,
    /// The data device's path.
    pub(super) device: PathBuf,
    /// The detached header's path, if any.
    pub(super) header_path: Option<PathBuf>,
    /// Held while the header may be written (see [`LuksVolume::open`]).
    _claim: Option<Claim>,
    /// Why a corrupt LUKS2 copy was skipped, if one was.
    warning: Option<String>,
}

/// A volume key unlocked from a keyslot, kept inside the library: it can be handed back to
/// the volume it came from (to add or replace a keyslot) but never read.
pub struct UnlockedKey {
    pub(super) slot: u32,
    pub(super) key: VolumeKey,
}

impl UnlockedKey {
    /// The volume key, for the activation that uses it (a resume in the serving process).
    pub(super) fn volume_key(&self) -> &[u8] {
        &self.key
    }

    /// The keyslot that opened.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

/// The data device of a volume about to be activated: opened, its data segment checked and
/// claimed (the segment only: keyslot changes stay possible while it is open, as with
/// cryptsetup).
pub struct DataDevice {
    dev: FileDevice,
    segment: DataSegment,
    claim: Claim,
}

/// How to activate a volume.
#[derive(Clone, Debug, Default)]
pub struct ActivateParams {
    /// The device name.
    pub name: String,
    /// Pass discards down (besides the volume's persistent flag).
    pub allow_discards: bool,
    /// Refuse writes.
    pub read_only: bool,
    /// LUKS2 with integrity: open the integrity device without its journal (mode D).
    pub integrity_no_journal: bool,
}

impl LuksVolume {
    /// Open the volume on `device` (its header on `header` when detached), LUKS1 or LUKS2 by
    /// cryptsetup's verdict ([`Header::read_as`]; `want` is 1 or 2 for `--type`). With
    /// `writable`, the header is opened for writing and its first 4 KiB are claimed: a change
    /// to the header waits for nobody, it is refused while another command changes it or a
    /// device maps it.
    pub fn open(
        device: &Path,
        header: Option<&Path>,
        writable: bool,
        want: Option<u16>,
    ) -> Result<LuksVolume, LuksError> {
        let path = header.unwrap_or(device);
        if header.is_some() && !device.exists() {
            return Err(LuksError::NoDevice(format!(
                "{}: no such device or file",
                device.display()
            )));
        }
        let dev = crate::block::open_device(path, !writable, false)?;
        // The data segment of an open LUKS device is not the header, so keyslots change while
        // it is open, as with cryptsetup. The first 4 KiB hold both copies' start (LUKS2) or
        // the whole binary header (LUKS1): every header writer claims them.
        let claim = if writable {
            Some(Claim::take(dev.file(), path, 0, 4096, true)?)
        } else {
            None
        };
        let (header_read, warning) = Header::read_as(&dev, want)?;
        Ok(LuksVolume {
            dev,
            header: header_read,
            device: device.to_path_buf(),
            header_path: header.map(Path::to_path_buf),
            _claim: claim,
            warning,
        })
    }

    /// Why a corrupt LUKS2 header copy was skipped, once (the caller says it).
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// 1 or 2.
    pub fn version(&self) -> u16 {
        self.header.version()
    }

    /// The UUID.
    pub fn uuid(&self) -> &str {
        self.header.uuid()
    }

    /// How many keyslots are in use.
    pub fn active_keyslots(&self) -> usize {
        self.header.active_keyslots()
    }

    /// Whether keyslot `slot` is in use.
    pub fn has_keyslot(&self, slot: u32) -> bool {
        self.header.has_keyslot(slot)
    }

    pub(super) fn unlock_for(
        &self,
        pass: &[u8],
        slot: Option<u32>,
        segment: keyslot::Segment,
    ) -> Result<UnlockedKey, LuksError> {
        let (slot, key) = self.header.unlock(&self.dev, pass, slot, segment)?;
        Ok(UnlockedKey { slot, key })
    }

    /// Unlock the key of the data segment with `pass` (keyslot `slot` only when given).
    pub fn unlock_key(&self, pass: &[u8], slot: Option<u32>) -> Result<UnlockedKey, LuksError> {
        self.unlock_for(pass, slot, keyslot::Segment::Default)
    }

    /// Check a passphrase the way `open --test-passphrase` does and give the keyslot it
    /// opens: with `slot` (or `unbound`) any key a keyslot holds counts, bound to the data
    /// segment or not (cryptsetup's unbound keys).
    pub fn test_passphrase(
        &self,
        pass: &[u8],
        slot: Option<u32>,
        unbound: bool,
    ) -> Result<u32, LuksError> {
        let segment = match (slot, unbound) {
            (Some(_), _) | (None, true) => keyslot::Segment::Any,
            (None, false) => keyslot::Segment::Default,
        };
        Ok(self.unlock_for(pass, slot, segment)?.slot)
    }

    /// Add a keyslot for `new` holding the unlocked `key` (in `slot`, or the first free one).
    pub fn add_keyslot(
        &mut self,
        key: &UnlockedKey,
        new: &[u8],
        pbkdf: &PbkdfParams,
        slot: Option<u32>,
    ) -> Result<u32, LuksError> {
        self.refuse_change()?;
        self.header
            .add_keyslot(&self.dev, &key.key, new, pbkdf, slot)
    }

    /// cryptsetup refuses to change a LUKS2 header that carries a mandatory requirement
    /// (`LUKS2_unmet_requirements` with nothing masked): a reencryption in progress, or one
    /// it does not know. Wiping a keyslot stays allowed, as there.
    pub(super) fn refuse_change(&self) -> Result<(), LuksError> {
        match &self.header {
            Header::V2(h) => reencrypt::state::refuse_change(&h.metadata).map_or(Ok(()), Err),
            Header::V1(_) => Ok(()),
        }
    }

    /// Replace the keyslot `key` came from by a new one for `new`; the new slot's number.
    /// The new keyslot is complete on disk before the old one is wiped: a crash in between
    /// leaves both passphrases working, never neither.
    pub fn change_keyslot(
        &mut self,
        key: &UnlockedKey,
        new: &[u8],
        pbkdf: &PbkdfParams,
    ) -> Result<u32, LuksError> {
        let added = self.add_keyslot(key, new, pbkdf, None)?;
        self.kill_keyslot(key.slot)?;
        Ok(added)
    }

    /// Wipe keyslot `slot`.
    pub fn kill_keyslot(&mut self, slot: u32) -> Result<(), LuksError> {
        self.header.kill_keyslot(&self.dev, slot)
    }

    /// Set the UUID (written at once).
    pub fn set_uuid(&mut self, uuid: &str) -> Result<(), LuksError> {
        if !crate::crypt::luks2::format::valid_uuid(uuid) {
            return Err(LuksError::Invalid(format!("--uuid {uuid:?} is not a UUID")));
        }
        self.refuse_change()?;
        self.header.set_uuid(&self.dev, uuid)
    }

    /// Set the label (LUKS2; written at once).
    pub fn set_label(&mut self, label: &str) -> Result<(), LuksError> {
        self.refuse_change()?;
        self.header.set_label(&self.dev, label)
    }

    /// The bytes a header backup holds: headers and keyslots (LUKS2), everything before the
    /// data (LUKS1), as cryptsetup saves them.
    pub fn header_backup_bytes(&self) -> Result<Vec<u8>, LuksError> {
        let len = self.header.backup_len().min(self.dev.size());
        let mut buf = vec![0u8; len as usize];
        self.dev
            .read_at(&mut buf, 0)
            .map_err(|e| LuksError::Invalid(e.to_string()))?;
        Ok(buf)
    }

    /// Save the header backup to `file`, a new file readable by its owner only (keyslots are
    /// all an offline attack on the passphrase needs). A partial backup is removed.
    pub fn header_backup(&self, file: &Path) -> Result<(), LuksError> {
        use std::io::Write;
        let buf = self.header_backup_bytes()?;
        let mut f = super::files::create_new(file, super::files::BACKUP_MODE).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                LuksError::Invalid(format!(
                    "Requested header backup file {} already exists.",
                    file.display()
                ))
            } else {
                LuksError::Invalid(format!(
                    "{}: cannot create backup file: {e}",
                    file.display()
                ))
            }
        })?;
        f.write_all(&buf).and_then(|_| f.sync_all()).map_err(|e| {
            // A partial backup is worse than none: it would restore a broken header.
            let _ = std::fs::remove_file(file);
            LuksError::Invalid(format!(
                "{}: cannot write header backup file: {e}",
                file.display()
            ))
        })
    }

    /// `luksDump`'s text (bytes: metadata strings are printed as they are).
    pub fn dump_text(&self) -> Vec<u8> {
        self.header.dump_text(&self.device.display().to_string())
    }

    /// The JSON metadata (LUKS2), or the header as JSON (LUKS1).
    pub fn dump_json(&self) -> serde_json::Value {
        self.header.dump_json()
    }

    /// `luksDump --dump-volume-key`: unlock with `pass` and give the text that shows the
    /// volume key. Sensitive!
    pub fn dump_volume_key(&self, pass: &[u8], slot: Option<u32>) -> Result<String, LuksError> {
        let key = self.unlock_key(pass, slot)?;
        Ok(self
            .header
            .volume_key_text(&self.device.display().to_string(), &key.key))
    }

    /// Open the data device (read-only or not), check the data segment against it and claim
    /// that segment.
    pub fn data(&self, read_only: bool) -> Result<DataDevice, LuksError> {
        let dev = crate::block::open_backing(&self.device, read_only, false)?;
        let segment =
            self.header
                .data_segment(dev.name(), dev.size(), self.header_path.is_some())?;
        let claim = Claim::take(
            dev.file(),
            &self.device,
            segment.offset,
            segment.size,
            !read_only,
        )?;
        Ok(DataDevice {
            dev,
            segment,
            claim,
        })
    }

    /// Unlock with `pass` (keyslot `slot` only when given) and activate `data`: dm-crypt, or
    /// dm-crypt in its authenticated mode over dm-integrity. The volume key lives only as long
    /// as the stack's ciphers. A LUKS2 volume in the middle of a reencryption is served with
    /// both keys, each segment with its own.
    pub fn activate(
        &self,
        data: DataDevice,
        pass: &[u8],
        slot: Option<u32>,
        params: &ActivateParams,
    ) -> Result<Activated, LuksError> {
        self.activate_with(data, Unlock::Passphrase(pass, slot), params)
    }

    /// Activate `data` with a key already unlocked from this volume (by a token, say). A
    /// volume in the middle of a reencryption needs both keys: [`LuksVolume::activate`] with
    /// the passphrase.
    pub fn activate_unlocked(
        &self,
        data: DataDevice,
        key: UnlockedKey,
        params: &ActivateParams,
    ) -> Result<Activated, LuksError> {
        self.activate_with(data, Unlock::Key(key), params)
    }

    /// Both activations, with the one check of the reencryption state: in reencryption, a
    /// passphrase opens both keys and an already unlocked key is refused.
    fn activate_with(
        &self,
        data: DataDevice,
        unlock: Unlock<'_>,
        params: &ActivateParams,
    ) -> Result<Activated, LuksError> {
        let seg = data.segment.clone();
        let opts = ActivateOptions {
            name: params.name.clone(),
            allow_discards: params.allow_discards,
            read_only: params.read_only,
        };
        let reencrypting = match &self.header {
            Header::V2(h) if reencrypt::state::status(&h.metadata) != reencrypt::Status::None => {
                Some(h)
            }
            _ => None,
        };
        let key = match (reencrypting, unlock) {
            (Some(h), Unlock::Passphrase(pass, slot)) => {
                return self.activate_reencrypt(h, data.dev, data.claim, pass, slot, &opts, &seg)
            }
            (Some(_), Unlock::Key(_)) => {
                return Err(LuksError::Invalid(format!(
                    "{}: the device is in reencryption: it opens with a passphrase, which unlocks both keys, not with a token",
                    self.device.display()
                )))
            }
            (None, Unlock::Passphrase(pass, slot)) => self.unlock_key(pass, slot)?,
            (None, Unlock::Key(k)) => k,
        };
        // A persistent "no-journal" flag in the header counts as --integrity-no-journal, as
        // cryptsetup ORs its persistent flags into every activation.
        let no_journal = params.integrity_no_journal || self.persistent_flag("no-journal");
        let iopts = IntegrityActivation { no_journal };
        // Without integrity, served through a gate its server can resize and suspend.
        let (active, online) = match seg.integrity {
            Some(_) => {
                let s = super::header::stack(&seg, Arc::new(data.dev), &key.key, &opts, &iopts)?;
                (s, None)
            }
            None => {
                let src = super::online::Source {
                    device: self.device.clone(),
                    header: self.header_path.clone(),
                    uuid: self.uuid().to_string(),
                    params: params.clone(),
                    fixed_size: super::online::fixed_size(&self.header),
                };
                let (s, o) =
                    super::online::stack(src, &seg, data.dev, &data.claim, &key.key, &opts)?;
                (s, Some(o))
            }
        };
        drop(key.key);
        let size = active.device.size();
        let mut details = self.status_details(&seg, size, key.slot);
        details["integrity"] = serde_json::json!(seg.integrity);
        details["integrity_mode"] = serde_json::json!(seg.integrity.as_ref().map(|_| {
            match (params.read_only, no_journal) {
                (true, _) => "R",
                (false, true) => "D",
                (false, false) => "J",
            }
        }));
        Ok(Activated {
            name: params.name.clone(),
            device: active.device,
            kind: "crypt".to_string(),
            details,
            stats: Some(active.stats),
            claims: vec![data.claim],
            allow_discards: params.allow_discards || seg.allow_discards,
            online,
        })
    }
}

impl LuksVolume {
    /// What `status` shows of an active volume serving `size` bytes of `seg`, opened by
    /// keyslot `slot`.
    fn status_details(&self, seg: &DataSegment, size: u64, slot: u32) -> serde_json::Value {
        serde_json::json!({
            "type": self.header.type_name(),
            "uuid": self.uuid(),
            "cipher": seg.cipher,
            "keysize_bits": self.header.key_bits(),
            "key_location": "memory",
            "device": absolute(&self.device),
            "header": self.header_path.as_deref().map(absolute),
            "offset_sectors": seg.offset / 512,
            "size_sectors": size / 512,
            "sector_size": seg.sector_size,
            "keyslot": slot,
        })
    }

    /// [`LuksVolume::activate`] of a LUKS2 volume in the middle of a reencryption: every
    /// segment with its own key (see [`reencrypt_open`]).
    #[allow(clippy::too_many_arguments)]
    fn activate_reencrypt(
        &self,
        h: &Luks2Header,
        dev: FileDevice,
        claim: Claim,
        pass: &[u8],
        slot: Option<u32>,
        opts: &ActivateOptions,
        area: &DataSegment,
    ) -> Result<Activated, LuksError> {
        let hdr_path = self.header_path.as_deref().unwrap_or(&self.device);
        let hdr_dev: Arc<dyn BlockDevice> =
            Arc::new(crate::block::open_device(hdr_path, true, false)?);
        let before = reencrypt_open::state(h)?;
        let recovered = match &before {
            Some(st) if !opts.read_only && st.hot.is_some() => {
                recover_moved(hdr_path, &dev, h, st, pass, slot)?
            }
            _ => None,
        };
        let h = recovered.as_ref().unwrap_or(h);
        let active = match (reencrypt_open::state(h)?, &before) {
            (None, Some(st)) if recovered.is_some() => finished_by_recovery(h, st, dev, opts)?,
            _ => reencrypt_open::activate(hdr_dev, h, Arc::new(dev), pass, slot, opts)?,
        };
        let size = active.device.size();
        // Served through a gate: its server may resume the reencryption online.
        let place = super::online_reencrypt::Place {
            device: self.device.clone(),
            header: self.header_path.clone(),
            opts: opts.clone(),
        };
        let (device, online) = super::online_reencrypt::serve_in_reencryption(active.device, place);
        let mut details = self.status_details(area, size, active.keyslot);
        if let (Some(d), Some(r)) = (details.as_object_mut(), active.details.as_object()) {
            d.extend(r.clone());
        }
        Ok(Activated {
            name: opts.name.clone(),
            device,
            kind: "crypt".to_string(),
            details,
            stats: None,
            claims: vec![claim],
            allow_discards: opts.allow_discards || area.allow_discards,
            // Two keys over moving segments: not resized or suspended, but reencrypted online.
            online: Some(online),
        })
    }
}

/// A decryption moving the data down (`reencrypt::decrypt_shift`) whose hotzone a crash
/// interrupted, opened read-write: the hotzone recovered and the metadata moved past it, as
/// cryptsetup's open recovers it, so that the device is served and its server can resume the
/// decryption. The header as it is then; `None` for any other reencryption.
fn recover_moved(
    hdr_path: &Path,
    data: &FileDevice,
    h: &Luks2Header,
    st: &reencrypt::ReencryptState,
    pass: &[u8],
    slot: Option<u32>,
) -> Result<Option<Luks2Header>, LuksError> {
    if !reencrypt::decrypt_shift::is_moved_decryption(st) {
        return Ok(None);
    }
    let hdr_dev = crate::block::open_device(hdr_path, false, false)?;
    let mut next = h.clone();
    let keys = reencrypt::engine::unlock_keys(&hdr_dev, &next, st, pass, slot)?;
    // Stopped before the first hotzone: the recovery alone.
    reencrypt::decrypt_shift::run(&hdr_dev, data, &mut next, &keys, &mut |_| false, None)?;
    Ok(Some(next))
}

/// The volume whose decryption moving the data down `st` was, finished by the recovery of its
/// last hotzone (the moved segment) when it was opened, `h` its header now, as cryptsetup's
/// `repair` finishes it there: the plaintext at its new place, as many bytes as were served
/// during the decryption (the rest of the device is wiped old ciphertext), no key, no
/// keyslot (the teardown destroyed them), nothing left to resume.
fn finished_by_recovery(
    h: &Luks2Header,
    st: &reencrypt::ReencryptState,
    data: FileDevice,
    opts: &ActivateOptions,
) -> Result<reencrypt_open::ReencryptActivation, LuksError> {
    let seg = h
        .metadata
        .segments
        .get(&0)
        .filter(|s| s.kind == "linear")
        .ok_or_else(|| {
            LuksError::Invalid("the finished decryption left no linear segment".into())
        })?;
    let too_small = || LuksError::Invalid(format!("Device {} is too small.", data.name()));
    let size = match st.previous.size {
        Some(s) => s,
        None => data
            .size()
            .checked_sub(st.fin.offset + st.keyslot.shift)
            .ok_or_else(too_small)?,
    };
    let device =
        reencrypt_open::segment_view(seg, Arc::new(data), seg.offset, size, 0, None, opts)?;
    Ok(reencrypt_open::ReencryptActivation {
        device,
        keyslot: 0,
        details: serde_json::json!({
            "keyslot": null,
            "reencryption": {
                "status": "finished",
                "mode": "decrypt",
                "note": "the recovery of its last hotzone finished the decryption on open",
            }
        }),
    })
}

/// How an activation gets its key.
enum Unlock<'a> {
    /// A passphrase, from keyslot `.1` only when given.
    Passphrase(&'a [u8], Option<u32>),
    /// A key already unlocked.
    Key(UnlockedKey),
}

/// A path as status shows it: absolute, resolved when it exists.
fn absolute(p: &Path) -> String {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}
