//! `luksHeaderRestore` in two steps, so a caller can ask before anything is written:
//! [`HeaderRestore::new`] reads and checks the backup as a device of its own, opens the target
//! and claims the bytes to be overwritten; [`HeaderRestore::question`] words what would be lost,
//! as libcryptsetup does before it asks; [`HeaderRestore::write`] writes them.

use super::header::Header;
use super::LuksError;
use crate::block::{BlockDevice, Claim, FileDevice, MemoryDevice};
use std::path::{Path, PathBuf};

/// What a restore would destroy, in luksHeaderRestore's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreQuestion {
    /// The question to ask before writing (one or two lines).
    pub text: String,
    /// The device holds no header of the backup's version, so data (not only keyslots) may be
    /// lost: a caller names what else the device seems to hold.
    pub data_at_risk: bool,
}

/// A checked header restore, nothing written yet.
pub struct HeaderRestore {
    path: PathBuf,
    dev: FileDevice,
    backup: Header,
    bytes: Vec<u8>,
    _claim: Claim,
}

impl HeaderRestore {
    /// Read the backup `file` and check it (cryptsetup's verdict on its version, and that it
    /// fits before the data of `device`), open `device` and claim what will be overwritten:
    /// refused while a device maps any of it.
    pub fn new(device: &Path, file: &Path) -> Result<HeaderRestore, LuksError> {
        let meta = std::fs::metadata(file)
            .map_err(|e| LuksError::NoDevice(format!("{}: {e}", file.display())))?;
        if meta.len() > 256 << 20 {
            return Err(LuksError::Invalid(format!(
                "{}: {} bytes is too large for a LUKS header backup",
                file.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(file)
            .map_err(|e| LuksError::Invalid(format!("{}: {e}", file.display())))?;
        // Check the backup as a device of its own before anything touches the real one.
        let mem = MemoryDevice::from_vec(&file.display().to_string(), bytes.clone());
        let Some(backup) = Header::read_backup(&mem)? else {
            return Err(LuksError::Invalid(format!(
                "{}: Header backup file does not contain compatible LUKS header.",
                file.display()
            )));
        };
        let dev = crate::block::open_device(device, false, false)?;
        let claim = Claim::take(dev.file(), device, 0, bytes.len().max(1) as u64, true)?;
        let (_, data_offset) = backup.cipher_and_offset();
        let dev_size = dev.size();
        if bytes.len() as u64 > dev_size || (data_offset > 0 && bytes.len() as u64 > data_offset) {
            return Err(LuksError::Invalid(format!(
                "{}: the backup ({} bytes) does not fit before the data of {} ({} bytes)",
                file.display(),
                bytes.len(),
                device.display(),
                dev_size
            )));
        }
        Ok(HeaderRestore {
            path: device.to_path_buf(),
            dev,
            backup,
            bytes,
            _claim: claim,
        })
    }

    /// The backup's header.
    pub fn backup(&self) -> &Header {
        &self.backup
    }

    /// luksHeaderRestore's question: whether the device holds a header of the backup's
    /// version (its keyslots are lost) or not (data may be), and whether the UUIDs differ.
    pub fn question(&self) -> RestoreQuestion {
        let version = if self.backup.version() == 1 {
            "LUKS"
        } else {
            "LUKS2"
        };
        let dev = self.path.display();
        let current = super::LuksVolume::open(&self.path, None, false, None)
            .ok()
            .filter(|c| c.version() == self.backup.version());
        let mut text = match &current {
            Some(_) => format!("Device {dev} already contains {version} header. Replacing header will destroy existing keyslots."),
            None => format!("Device {dev} does not contain {version} header. Replacing header can destroy data on that device."),
        };
        if current
            .as_ref()
            .is_some_and(|c| c.uuid() != self.backup.uuid())
        {
            text.push_str("\nWARNING: real device header has different UUID than backup!");
        }
        RestoreQuestion {
            text,
            data_at_risk: current.is_none(),
        }
    }

    /// Write the backup over the device's header.
    pub fn write(self) -> Result<(), LuksError> {
        self.dev
            .write_at(&self.bytes, 0)
            .map_err(|e| LuksError::Invalid(e.to_string()))?;
        self.dev
            .flush()
            .map_err(|e| LuksError::Invalid(e.to_string()))
    }
}
