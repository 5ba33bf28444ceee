//! `luks reencrypt --decrypt --header NEWFILE DEVICE` where NEWFILE does not exist and DEVICE
//! carries its LUKS2 header at its start (cryptsetup's `decrypt_luks2_datashift_init`): the
//! question, cryptsetup's refusals and words, the passphrase, then the library exports the
//! header and starts the decryption, which runs here unless `--init-only`.

use super::confirm::Confirm;
use super::luks_reencrypt::{run, ReencryptArgs};
use super::passphrase::passphrase;
use super::{CliError, CliResult};
use crate::crypt::luks::{LuksError, LuksVolume};
use crate::crypt::luks2::reencrypt::{InitParams, Resilience};
use std::io::ErrorKind;
use std::path::Path;

/// The moved segment's resilience (`decrypt_verify_and_set_params`): checksum and journal
/// become their datashift variants; datashift and none are refused.
fn resilience(a: &ReencryptArgs) -> Result<Resilience, CliError> {
    let checksum = || Resilience::DatashiftChecksum {
        hash: a.resilience_hash.clone(),
        sector_size: 0,
    };
    match a.resilience.as_deref() {
        None | Some("checksum" | "datashift-checksum") => Ok(checksum()),
        Some("journal" | "datashift-journal") => Ok(Resilience::DatashiftJournal),
        Some("datashift" | "none") => Err(CliError::invalid(
            "Requested --resilience option cannot be applied to current reencryption operation.",
        )),
        Some(o) => Err(CliError::invalid(format!(
            "Unsupported resilience mode {o}"
        ))),
    }
}

/// `--decrypt --header HEADER`: the export when HEADER does not exist, cryptsetup's refusal
/// when it holds no LUKS header; `None` for a header to decrypt with as it is.
pub(super) fn decrypt_header(a: &ReencryptArgs, header: &Path, device: &str) -> Option<CliResult> {
    if std::fs::symlink_metadata(header).is_err_and(|e| e.kind() == ErrorKind::NotFound) {
        return Some(decrypt_export(a, header, device));
    }
    match LuksVolume::open(&a.volume.device, Some(header), false, None) {
        Err(LuksError::NotLuks { .. }) => Some(Err(CliError::invalid(format!(
            "Device {} is not a valid LUKS device.",
            header.display()
        )))),
        _ => None,
    }
}

/// Decrypt `a`'s device, exporting its header to `header` (which does not exist).
fn decrypt_export(a: &ReencryptArgs, header: &Path, device: &str) -> CliResult {
    let gone = || {
        CliError::invalid(format!(
            "Device {} does not exist or access denied.",
            header.display()
        ))
    };
    if a.resume_only {
        return Err(CliError::invalid("Device reencryption not in progress."));
    }
    // cryptsetup exports only the header of a LUKS2 device not in reencryption; anything
    // else reads as the detached header that is missing.
    let mut v = match LuksVolume::open(&a.volume.device, None, true, Some(2)) {
        Ok(v) if v.version() == 2 && matches!(v.reencryption(), Ok(None)) => v,
        _ => return Err(gone()),
    };
    if let Some(w) = v.take_warning() {
        eprintln!("dmkit: {w}");
    }
    Confirm {
        batch: a.batch_mode,
        warnings: Vec::new(),
        question: format!(
            "Header file {h} does not exist. Do you want to initialize LUKS2 decryption of device {device} and export LUKS2 header to file {h}?",
            h = header.display()
        ),
        action: "decrypt the device and export its header",
        aborted: "Operation aborted.",
        code: 1,
    }
    .ask()?;
    let params = InitParams {
        cipher: String::new(),
        key_size: 0,
        sector_size: 512,
        resilience: resilience(a)?,
        pbkdf: None,
        io_block: 0,
        hash: a.pbkdf.hash.clone(),
        benchmark_digest: a.pbkdf.pbkdf_force_iterations.is_none(),
    };
    let pass = passphrase(&a.key, &format!("Enter passphrase for {device}: "), false)?;
    v.reencrypt_init_decrypt_export(header, &pass, a.key_slot, a.hotzone_size, &params)?;
    drop(v);
    if a.init_only {
        return Ok(());
    }
    run(a, a.volume.load(true, Some(2))?, pass, device)
}
