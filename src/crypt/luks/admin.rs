//! The offline maintenance verbs of [`LuksVolume`] that change a header without opening the
//! data: `convert`, `luksConvertKey`, `erase`, `config` and `token`, with cryptsetup 2.6's
//! rules and words. Each writes the header once it is complete (both LUKS2 copies, secondary
//! first), so a crash leaves the old header or the new one.

use super::header::Header;
use super::volume::{LuksVolume, UnlockedKey};
use super::LuksError;
use crate::block::{BlockDevice, ClaimError, OpenError};
use crate::crypt::luks2::keyslot::{self, PbkdfParams};
use crate::crypt::luks2::{token, Luks2Header};
use crate::crypt::secret::SecretBytes;

/// A keyslot's priority (`cryptsetup config --priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Never tried without naming the keyslot (0).
    Ignore,
    /// Tried in order (1, the default; not written).
    Normal,
    /// Tried before the normal ones (2).
    Prefer,
}

impl Priority {
    /// cryptsetup's words: ignore, normal, prefer.
    pub fn named(word: &str) -> Result<Priority, LuksError> {
        match word {
            "ignore" => Ok(Priority::Ignore),
            "normal" => Ok(Priority::Normal),
            "prefer" => Ok(Priority::Prefer),
            _ => Err(LuksError::Invalid(
                "Option --priority can be only ignore/normal/prefer.".into(),
            )),
        }
    }
}

impl LuksVolume {
    /// The name cryptsetup gives the volume in its messages: the detached header, else the
    /// device.
    fn shown(&self) -> String {
        self.header_path
            .as_deref()
            .unwrap_or(&self.device)
            .display()
            .to_string()
    }

    /// The LUKS2 header, or cryptsetup's refusal for a LUKS1 one.
    fn luks2_mut(&mut self) -> Result<&mut Luks2Header, LuksError> {
        let shown = self.shown();
        match &mut self.header {
            Header::V2(h) => Ok(h),
            Header::V1(_) => Err(LuksError::Invalid(format!(
                "Device {shown} is not a valid LUKS2 device."
            ))),
        }
    }

    fn luks2_only(&self) -> Result<&Luks2Header, LuksError> {
        match &self.header {
            Header::V2(h) => Ok(h),
            Header::V1(_) => Err(LuksError::Invalid(format!(
                "Device {} is not a valid LUKS2 device.",
                self.shown()
            ))),
        }
    }

    /// Refuse while the data segment is served (cryptsetup's "still in use" check looks for
    /// a mapping with the volume's UUID; dmkit's mappings claim the data segment). The claim
    /// taken is held until the returned guard drops.
    fn not_in_use(&self) -> Result<Option<super::DataDevice>, LuksError> {
        if !self.device.exists() {
            return Ok(None);
        }
        match self.data(false) {
            Ok(d) => Ok(Some(d)),
            Err(LuksError::Claim(ClaimError::Busy { .. }))
            | Err(LuksError::Open(OpenError::Busy { .. })) => Err(LuksError::Busy(format!(
                "Cannot convert device {} which is still in use.",
                self.shown()
            ))),
            // A data device that cannot be opened or checked is not in use by dmkit.
            Err(_) => Ok(None),
        }
    }

    /// Convert the header to LUKS `to` (1 or 2) in place (`cryptsetup convert`), refused
    /// where cryptsetup refuses; the header is read back afterwards.
    pub fn convert(&mut self, to: u16) -> Result<(), LuksError> {
        if to == self.version() {
            return Err(LuksError::Invalid(format!(
                "Device is already LUKS{to} type."
            )));
        }
        let _busy = self.not_in_use()?;
        let path = self
            .header_path
            .clone()
            .unwrap_or_else(|| self.device.clone());
        match &self.header {
            Header::V1(h1) => {
                let regular = std::fs::metadata(&path).is_ok_and(|m| m.is_file());
                let (mut h2, mv, grow) = super::convert::plan_to_luks2(h1, &self.dev, regular)?;
                if let Some(size) = grow {
                    // A detached header file too short for LUKS2's layout grows first.
                    self.dev.file().set_len(size).map_err(|e| {
                        LuksError::Invalid(format!(
                            "Unable to move keyslot area. Not enough space. ({e})"
                        ))
                    })?;
                    self.dev = crate::block::open_device(&path, false, false)?;
                }
                super::convert::move_areas(&self.dev, &mv)?;
                h2.write(&self.dev)?;
            }
            Header::V2(h2) => {
                let (h1, mv) = super::convert::plan_to_luks1(h2)?;
                let bytes = h1.encode()?;
                super::convert::move_areas(&self.dev, &mv)?;
                // The LUKS2 binary header goes before the LUKS1 one is written over it.
                self.dev.write_at(&[0u8; 4096], 0)?;
                self.dev.write_at(&bytes, 0)?;
                self.dev.flush()?;
            }
        }
        self.header = Header::read(&self.dev)?.0;
        Ok(())
    }

    /// Whether `luksConvertKey` may run (before a passphrase is asked): LUKS2, and keyslot
    /// `slot` in use when given.
    pub fn check_convert_keyslot(&self, slot: Option<u32>) -> Result<(), LuksError> {
        let h = self.luks2_only()?;
        match slot.filter(|s| !h.metadata.keyslots.contains_key(s)) {
            Some(s) => Err(LuksError::Invalid(format!("Keyslot {s} is not active."))),
            None => Ok(()),
        }
    }

    /// Whether a LUKS2 header with tokens: an open without a key file tries them first.
    pub fn has_tokens(&self) -> bool {
        matches!(&self.header, Header::V2(h) if !h.metadata.tokens.is_empty())
    }

    /// `luksConvertKey`: store the key of keyslot `slot` (or of the keyslot `pass` opens)
    /// again under the same passphrase with new KDF parameters, keeping its number, priority,
    /// digest and tokens (LUKS2 only; crash-safe, see
    /// [`crate::crypt::luks2::convert_key`]). Returns the keyslot number.
    pub fn convert_keyslot(
        &mut self,
        pass: &[u8],
        slot: Option<u32>,
        pbkdf: &PbkdfParams,
    ) -> Result<u32, LuksError> {
        self.check_convert_keyslot(slot)?;
        let UnlockedKey { slot: id, key } = self.unlock_for(pass, slot, keyslot::Segment::Any)?;
        let dev = &self.dev;
        let Header::V2(h) = &mut self.header else {
            unreachable!("checked above")
        };
        crate::crypt::luks2::convert_key::convert(dev, h, id, &key, pass, pbkdf)?;
        drop(key);
        Ok(id)
    }

    /// `erase` (luksErase): wipe every keyslot that holds the volume key (keyslots bound to
    /// no segment, like a reencryption keyslot, stay, as with cryptsetup). Returns the
    /// keyslots wiped.
    pub fn erase(&mut self) -> Result<Vec<u32>, LuksError> {
        let ids: Vec<u32> = match &self.header {
            Header::V1(h) => (0..h.keyslots.len() as u32)
                .filter(|&i| h.keyslots[i as usize].active)
                .collect(),
            Header::V2(h) => {
                let m = &h.metadata;
                m.keyslots
                    .keys()
                    .copied()
                    .filter(|&i| {
                        m.keyslot_digest(i)
                            .is_some_and(|(_, d)| !d.segments.is_empty())
                    })
                    .collect()
            }
        };
        for &i in &ids {
            self.kill_keyslot(i)?;
        }
        Ok(ids)
    }

    /// Set keyslot `slot`'s priority (LUKS2).
    pub fn set_priority(&mut self, slot: u32, priority: Priority) -> Result<(), LuksError> {
        let h = self.luks2_mut()?;
        let k = h
            .metadata
            .keyslots
            .get_mut(&slot)
            .ok_or_else(|| LuksError::Invalid(format!("Keyslot {slot} is not active.")))?;
        k.priority = match priority {
            Priority::Ignore => Some(0),
            Priority::Normal => None,
            Priority::Prefer => Some(2),
        };
        self.write_luks2()
    }

    /// Set the label and subsystem together, as `crypt_set_label` does: one not given is
    /// cleared (LUKS2; each below 48 bytes).
    pub fn set_labels(
        &mut self,
        label: Option<&str>,
        subsystem: Option<&str>,
    ) -> Result<(), LuksError> {
        for (what, v) in [("label", label), ("subsystem", subsystem)] {
            if v.is_some_and(|s| s.len() >= 48) {
                return Err(LuksError::Invalid(format!(
                    "--{what}: {v:?} is longer than 47 bytes"
                )));
            }
        }
        let h = self.luks2_mut()?;
        h.label = label.unwrap_or_default().to_string();
        h.subsystem = subsystem.unwrap_or_default().to_string();
        self.write_luks2()
    }

    fn write_luks2(&mut self) -> Result<(), LuksError> {
        let dev = &self.dev;
        match &mut self.header {
            Header::V2(h) => h.write(dev),
            Header::V1(_) => unreachable!("callers check the version"),
        }
    }

    /// Refusals shared by token add and import: an id out of range or in use (unless
    /// `replace`), an inactive keyslot to bind.
    fn token_slot_checks(
        &self,
        id: Option<u32>,
        slot: Option<u32>,
        replace: bool,
    ) -> Result<(), LuksError> {
        let h = self.luks2_only()?;
        if let Some(i) = id {
            if i >= super::MAX_KEYSLOTS {
                return Err(LuksError::Invalid(format!("Token {i} is invalid.")));
            }
            if token::in_use(h, i) && !replace {
                return Err(LuksError::Invalid(format!("Token {i} in use.")));
            }
        }
        if let Some(s) = slot.filter(|s| !h.metadata.keyslots.contains_key(s)) {
            return Err(LuksError::Invalid(format!("Keyslot {s} is not active.")));
        }
        Ok(())
    }

    /// `token import`: store the JSON token `json` at `id` (the first free id when `None`),
    /// bound to keyslot `slot` when given. Returns the token id.
    pub fn token_import(
        &mut self,
        id: Option<u32>,
        json: &str,
        slot: Option<u32>,
        replace: bool,
    ) -> Result<u32, LuksError> {
        self.token_slot_checks(id, slot, replace)?;
        let h = self.luks2_mut()?;
        let saved = h.metadata.clone();
        let r = token::set(h, id, json).and_then(|t| {
            if let Some(s) = slot {
                token::assign(h, t, s)?;
            }
            Ok(t)
        });
        let t = match r {
            Ok(t) => t,
            Err(e) => {
                h.metadata = saved;
                return Err(LuksError::Invalid(format!(
                    "Failed to import token from file. ({e})"
                )));
            }
        };
        self.write_luks2()?;
        Ok(t)
    }

    /// `token add`: a `luks2-keyring` token for the kernel key `description` at `id` (the
    /// first free id when `None`), bound to keyslot `slot`, or to every keyslot when `None`
    /// (cryptsetup's default), or to none when `unbound`. Returns the token id.
    pub fn token_add_keyring(
        &mut self,
        id: Option<u32>,
        description: &str,
        slot: Option<u32>,
        unbound: bool,
        replace: bool,
    ) -> Result<u32, LuksError> {
        self.token_slot_checks(id, slot, replace)?;
        let h = self.luks2_mut()?;
        let saved = h.metadata.clone();
        let t = token::set(h, id, &token::keyring_json(description)).map_err(|e| {
            LuksError::Invalid(format!(
                "Failed to add luks2-keyring token {}. ({e})",
                id.map_or(-1, |i| i as i64)
            ))
        })?;
        let slots: Vec<u32> = match (unbound, slot) {
            (true, _) => Vec::new(),
            (false, Some(s)) => vec![s],
            (false, None) => h.metadata.keyslots.keys().copied().collect(),
        };
        for s in slots {
            if let Err(e) = token::assign(h, t, s) {
                h.metadata = saved;
                return Err(LuksError::Invalid(format!(
                    "Failed to assign token {t} to keyslot {s}. ({e})"
                )));
            }
        }
        self.write_luks2()?;
        Ok(t)
    }

    /// `token remove`.
    pub fn token_remove(&mut self, id: u32) -> Result<(), LuksError> {
        if id >= super::MAX_KEYSLOTS {
            return Err(LuksError::Invalid(format!("Token {id} is invalid.")));
        }
        token::remove(self.luks2_mut()?, id)?;
        self.write_luks2()
    }

    /// Whether the LUKS2 header's `config.flags` holds `flag` (LUKS1 has none).
    pub fn persistent_flag(&self, flag: &str) -> bool {
        matches!(&self.header, Header::V2(h) if h.metadata.config.flags.iter().any(|f| f == flag))
    }

    /// `open --persistent`: store the activation flags in the LUKS2 header (`config.flags`),
    /// replacing those stored before, as cryptsetup's `crypt_persistent_flags_set` does. Only
    /// the flags dmkit activates with are kept: "allow-discards" and "no-journal".
    pub fn set_persistent_flags(
        &mut self,
        allow_discards: bool,
        no_journal: bool,
    ) -> Result<(), LuksError> {
        self.refuse_change()?;
        let h = self.luks2_mut()?;
        let flags = [
            (allow_discards, "allow-discards"),
            (no_journal, "no-journal"),
        ];
        h.metadata.config.flags = flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| name.to_string())
            .collect();
        self.write_luks2()
    }

    /// `token unassign`: unbind token `id` from keyslot `slot`, keeping the token.
    pub fn token_unassign(&mut self, id: u32, slot: u32) -> Result<(), LuksError> {
        let h = self.luks2_mut()?;
        let saved = h.metadata.clone();
        if let Err(e) = token::unassign(h, id, slot) {
            h.metadata = saved;
            return Err(e);
        }
        self.write_luks2()
    }

    /// `token export`: the token's JSON text.
    pub fn token_export(&self, id: u32) -> Result<String, LuksError> {
        token::export(self.luks2_only()?, id)
    }

    /// Unlock the data segment's key with the `luks2-keyring` tokens (token `id` only when
    /// given): each token's passphrase is read from the kernel keyring and tried on the
    /// keyslots it is bound to. The passphrase never leaves the library. `token_type`
    /// restricts the tokens tried to that type (cryptsetup's `--token-type`); only
    /// `luks2-keyring` is built in.
    pub fn unlock_by_token(
        &self,
        id: Option<u32>,
        token_type: Option<&str>,
    ) -> Result<UnlockedKey, LuksError> {
        let h = self.luks2_only()?;
        let tokens = match token_type {
            Some(t) if t != token::KEYRING => Vec::new(),
            _ => token::keyring_tokens(h, id),
        };
        if tokens.is_empty() {
            return Err(LuksError::Invalid(match (id, token_type) {
                (Some(i), _) => format!("Token {i} is not a usable luks2-keyring token."),
                (None, Some(t)) => format!("No usable token (type {t}) is available."),
                (None, None) => "No usable token is available.".to_string(),
            }));
        }
        let mut last = LuksError::Invalid("No usable token is available.".into());
        for (_, description, slots) in tokens {
            let pass: SecretBytes = match super::keyring::user_key(&description) {
                Ok(p) => p,
                Err(e) => {
                    last = LuksError::TokenDenied(e.to_string());
                    continue;
                }
            };
            for s in slots {
                match self.unlock_for(&pass, Some(s), keyslot::Segment::Default) {
                    Ok(k) => return Ok(k),
                    Err(LuksError::WrongPassphrase | LuksError::NoUsableKeyslot) => {
                        last = LuksError::TokenDenied(format!(
                            "the passphrase of kernel key {description:?} opens no keyslot its token is bound to"
                        ))
                    }
                    Err(LuksError::Invalid(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Err(last)
    }
}
