//! `luks reencrypt --decrypt --header NEWFILE DEVICE` where NEWFILE does not exist and DEVICE
//! carries its LUKS2 header at its start (cryptsetup's `decrypt_luks2_datashift_init`): the
//! question, cryptsetup's refusals and words, the passphrase, then the library exports the
//! header and starts the decryption, which the caller runs unless `--init-only`.

use super::confirm::Confirm;
use super::passphrase::{passphrase, KeyArgs, Passphrase};
use super::CliError;
use crate::crypt::luks::{LuksError, LuksVolume};
use crate::crypt::luks2::reencrypt::{InitParams, Resilience};
use std::io::ErrorKind;
use std::path::Path;

/// What `luks reencrypt --decrypt --header HEADER` was given.
pub(super) struct Export<'a> {
    /// The device.
    pub device: &'a Path,
    /// `--header`.
    pub header: &'a Path,
    /// Where the passphrase comes from.
    pub key: &'a KeyArgs,
    /// `--key-slot`.
    pub key_slot: Option<u32>,
    /// `--batch-mode`.
    pub batch: bool,
    /// `--init-only`.
    pub init_only: bool,
    /// `--resume-only`.
    pub resume_only: bool,
    /// `--resilience`.
    pub resilience: Option<&'a str>,
    /// `--resilience-hash`.
    pub resilience_hash: &'a str,
    /// `--hotzone-size`: the moved segment's length.
    pub moved: Option<u64>,
    /// `--hash` of the digests.
    pub hash: &'a str,
    /// Benchmark the digests' iterations (no `--pbkdf-force-iterations`).
    pub benchmark_digest: bool,
    /// The name dmkit serves the device as (an online decryption): the device is suspended
    /// while its header is exported and its first data segment moved.
    pub served: Option<&'a str>,
}

/// The volume to run and its passphrase; `None` after `--init-only`.
type Started = Option<(LuksVolume, Passphrase)>;

/// The moved segment's resilience (`decrypt_verify_and_set_params`): checksum and journal
/// become their datashift variants; datashift and none are refused.
fn resilience(x: &Export<'_>) -> Result<Resilience, CliError> {
    match x.resilience {
        None | Some("checksum" | "datashift-checksum") => Ok(Resilience::DatashiftChecksum {
            hash: x.resilience_hash.to_string(),
            sector_size: 0,
        }),
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
pub(super) fn decrypt_header(x: &Export<'_>) -> Option<Result<Started, CliError>> {
    if std::fs::symlink_metadata(x.header).is_err_and(|e| e.kind() == ErrorKind::NotFound) {
        return Some(decrypt_export(x));
    }
    match LuksVolume::open(x.device, Some(x.header), false, None) {
        Err(LuksError::NotLuks { .. }) => Some(Err(CliError::invalid(format!(
            "Device {} is not a valid LUKS device.",
            x.header.display()
        )))),
        _ => None,
    }
}

/// Decrypt the device, exporting its header to `x.header` (which does not exist).
pub(super) fn decrypt_export(x: &Export<'_>) -> Result<Started, CliError> {
    let (mut v, params, pass) = prepare(x)?;
    v.reencrypt_init_decrypt_export(x.header, &pass, x.key_slot, x.moved, &params)?;
    drop(v);
    if x.init_only {
        return Ok(None);
    }
    let v = super::luks_slots::load(x.device, Some(x.header), true, Some(2))?;
    Ok(Some((v, pass)))
}

/// [`decrypt_export`] of the device dmkit serves as `name` (see [`init_served`]): the
/// passphrase for its server's decryption, which takes the exported header; nothing here
/// reads the device once its data moved, so that nothing but that request can fail
/// between the two.
pub(super) fn decrypt_export_served(x: &Export<'_>, name: &str) -> Result<Passphrase, CliError> {
    let (mut v, params, pass) = prepare(x)?;
    init_served(x, name, &mut v, &pass, &params)?;
    Ok(pass)
}

/// What both exports do before writing: cryptsetup's refusals and question, the
/// parameters, the passphrase; the device's volume (opened writable) with them.
fn prepare(x: &Export<'_>) -> Result<(LuksVolume, InitParams, Passphrase), CliError> {
    let header = x.header;
    let device = x.device.display().to_string();
    let gone = || {
        CliError::invalid(format!(
            "Device {} does not exist or access denied.",
            header.display()
        ))
    };
    if x.resume_only {
        return Err(CliError::invalid("Device reencryption not in progress."));
    }
    if let Some(name) = x.served.filter(|_| x.init_only) {
        // The served mapping must change with the data: the server does that when it runs.
        return Err(CliError::invalid(format!(
            "{name}: dmkit starts the decryption of an open device whose header is at its start with the decryption itself: no --init-only (close it to initialize offline)."
        )));
    }
    // cryptsetup exports only the header of a LUKS2 device not in reencryption; anything
    // else reads as the detached header that is missing.
    let mut v = match LuksVolume::open(x.device, None, true, Some(2)) {
        Ok(v) if v.version() == 2 && matches!(v.reencryption(), Ok(None)) => v,
        _ => return Err(gone()),
    };
    if let Some(w) = v.take_warning() {
        eprintln!("dmkit: {w}");
    }
    Confirm {
        batch: x.batch,
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
        resilience: resilience(x)?,
        pbkdf: None,
        io_block: 0,
        hash: x.hash.to_string(),
        benchmark_digest: x.benchmark_digest,
        new_key: Default::default(),
        device_size: None,
    };
    let pass = passphrase(x.key, &format!("Enter passphrase for {device}: "), false)?;
    Ok((v, params, pass))
}

/// The export of a device dmkit serves as `name`, as cryptsetup's of an active device: the
/// device suspended (requests in flight finish, new ones wait) while the header is exported
/// and the first data segment moved, so that no request sees the data half moved. A
/// refusal that wrote nothing resumes it; once the data moved, only the server's decryption,
/// taking the exported header, serves it again.
fn init_served(
    x: &Export<'_>,
    name: &str,
    v: &mut LuksVolume,
    pass: &Passphrase,
    params: &InitParams,
) -> Result<(), CliError> {
    use crate::export::daemon::{self, control};
    daemon::ask(name, &control::Request::Suspend, |_, _| {})?;
    let r = v.reencrypt_init_decrypt_export_served(x.header, pass, x.key_slot, x.moved, params);
    let Err(e) = r else {
        return Ok(());
    };
    if x.header.exists() {
        eprintln!(
            "dmkit: {name} stays suspended: close it and open it with --header {}.",
            x.header.display()
        );
    } else {
        let secret = control::Secret {
            key_slot: x.key_slot,
            passphrase: zeroize::Zeroizing::new(pass.to_vec()),
        };
        if let Err(r) = daemon::ask(name, &control::Request::Resume(secret), |_, _| {}) {
            eprintln!("dmkit: {name}: cannot resume: {r}");
        }
    }
    Err(e.into())
}
