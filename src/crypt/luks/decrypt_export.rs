//! `reencrypt --decrypt --header NEWFILE` of a LUKS2 device whose header is at its start: the
//! header is exported to NEWFILE and the data decrypted in place while it moves down to byte 0
//! (`crypt::luks2::reencrypt::decrypt_shift`). Everything is checked and the new header made
//! in memory first, so a refusal writes nothing. Then, in an order where every crash leaves a
//! device that opens with `--header NEWFILE`:
//! 1. NEWFILE is created (owner-only) holding the header as it is (a header backup) and synced;
//! 2. the LUKS magic of both header copies on the device is wiped (it is no LUKS device any
//!    more once its data moves), and the moved segment's ciphertext copied to the device's
//!    start, durably; the data after the header is untouched, as NEWFILE still describes it;
//! 3. NEWFILE's header copies are replaced by the ones in decryption (secondary first).

use super::{LuksError, LuksVolume};
use crate::block::{BlockDevice, Claim, MemoryDevice};
use crate::crypt::luks2::reencrypt::decrypt_shift::{self, DecryptShift};
use crate::crypt::luks2::reencrypt::{InitParams, ReencryptState};
use std::path::Path;

/// Bytes of a LUKS2 header copy's magic, zeroed on the device as blkid wipes a signature (the
/// primary's at 0, the secondary's at the header size).
const MAGIC_LEN: usize = 6;

impl LuksVolume {
    /// Put this volume, whose LUKS2 header is at the device's start, into decryption with the
    /// header exported to the new file `header` (which must not exist), unlocking with `pass`
    /// (keyslot `slot` when given). `moved` is the first segment moved ahead of the rest
    /// (`--hotzone-size`; `None`: cryptsetup's default). Returns the reencrypt keyslot. The
    /// volume must have been opened writable; once this returns it describes a device that
    /// is no LUKS device any more: reopen it with `header`.
    pub fn reencrypt_init_decrypt_export(
        &mut self,
        header: &Path,
        pass: &[u8],
        slot: Option<u32>,
        moved: Option<u64>,
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        self.init_decrypt_export(header, pass, slot, moved, params, true)
    }

    /// [`LuksVolume::reencrypt_init_decrypt_export`] of a volume its server holds suspended
    /// (an online decryption, cryptsetup's with an active device): the server claims the
    /// data already and serves nothing until its reencryption takes the exported header.
    pub fn reencrypt_init_decrypt_export_served(
        &mut self,
        header: &Path,
        pass: &[u8],
        slot: Option<u32>,
        moved: Option<u64>,
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        self.init_decrypt_export(header, pass, slot, moved, params, false)
    }

    /// Refuse what the server of the volume served as `name` (`served` bytes when it says,
    /// `read_only`) would refuse once its data moved, before anything is written: a
    /// read-only device, or one serving other than all its data segment (cryptsetup
    /// compares the active mapping with the header's segment likewise). This volume is
    /// the one served, opened with its header at its start.
    pub fn check_served_whole(
        &self,
        name: &str,
        served: Option<u64>,
        read_only: bool,
    ) -> Result<(), LuksError> {
        if read_only {
            return Err(LuksError::Invalid(format!(
                "Device {name} is read-only; cannot reencrypt it."
            )));
        }
        let seg = self.header.data_segment(
            &self.device.display().to_string(),
            self.dev.size(),
            self.header_path.is_some(),
        )?;
        if served != Some(seg.size) {
            return Err(LuksError::Invalid(
                "Active device size and requested reencryption size don't match.".into(),
            ));
        }
        Ok(())
    }

    fn init_decrypt_export(
        &mut self,
        header: &Path,
        pass: &[u8],
        slot: Option<u32>,
        moved: Option<u64>,
        params: &InitParams,
        claim: bool,
    ) -> Result<u32, LuksError> {
        let super::Header::V2(h) = &self.header else {
            return Err(LuksError::Unsupported(
                "reencryption of a LUKS1 device (convert it to LUKS2 first)".into(),
            ));
        };
        // cryptsetup 2.6.1 finds unmet requirements only after it wiped the device's magic
        // (it says where the header backup is); refused here before anything is written.
        if !crate::crypt::luks2::reencrypt::state::unknown_requirements(&h.metadata).is_empty() {
            return Err(LuksError::Invalid(
                "Unmet LUKS2 requirements detected.".into(),
            ));
        }
        if self.header_path.is_some() {
            return Err(LuksError::Unsupported(
                "the header is detached already: decrypt with it, without exporting".into(),
            ));
        }
        // The header's first 4 KiB are claimed by the writable open; the rest of the device
        // here, as nobody may map or change its data meanwhile (a served volume's server
        // holds that claim itself).
        let _claim = match claim {
            true => Some(Claim::take(self.dev.file(), &self.device, 4096, 0, true)?),
            false => None,
        };
        let backup = self.header_backup_bytes()?;
        let name = self.device.display().to_string();
        let mem = MemoryDevice::from_vec(&name, backup.clone());
        let mut next = h.clone();
        let mut ip = params.clone();
        ip.io_block = super::reencrypt::io_block(&self.dev);
        let d = DecryptShift {
            data_name: &name,
            device_size: self.dev.size(),
            pass,
            slot,
            moved,
        };
        let ks = decrypt_shift::init(&mem, &mut next, &d, &ip)?;
        let st = ReencryptState::read(&next.metadata)?
            .ok_or_else(|| LuksError::Invalid("reencryption state lost".into()))?;
        let image = mem.contents();
        let copies = 2 * next.hdr_size as usize;
        write_new(header, &backup)?;
        let zeros = [0u8; MAGIC_LEN];
        self.dev.write_at(&zeros, 0)?;
        self.dev.write_at(&zeros, next.hdr_size)?;
        self.dev.flush()?;
        decrypt_shift::move_first_segment(&self.dev, &st)?;
        let file = crate::block::open_device(header, false, false)?;
        let half = copies / 2;
        file.write_at(&image[half..copies], half as u64)?;
        file.flush()?;
        file.write_at(&image[..half], 0)?;
        file.flush()?;
        Ok(ks)
    }
}

/// Create the header file `path` (owner read and write only, as cryptsetup leaves an exported
/// header) holding `bytes`, durably; a partial file is removed.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), LuksError> {
    use std::io::Write;
    let mut f = super::files::create_new(path, super::files::HEADER_MODE).map_err(|e| {
        LuksError::Invalid(format!(
            "Device {} does not exist or access denied. ({e})",
            path.display()
        ))
    })?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| {
        let _ = std::fs::remove_file(path);
        LuksError::Invalid(format!(
            "{}: cannot write the exported header: {e}",
            path.display()
        ))
    })
}
