//! `dmkit luks reencrypt NAME` (and `dmkit reencrypt NAME`) on a device dmkit has open: the
//! header is put into reencryption here when it is not yet (the passphrases asked as the
//! offline command asks them), then the device's server is asked to reencrypt it in the
//! background while it goes on serving; its progress frames are shown as the offline progress
//! is. The server unlocks the keys itself: only the passphrase crosses the control socket.
//! `--decrypt` of a device open with a detached header is decrypted the same way (backward, as
//! cryptsetup does); one whose header is at its start (`--header NEWFILE`) has its header
//! exported to NEWFILE and its first data segment moved while its server holds it suspended,
//! then its server decrypts it forward, moving the data down.

use super::luks_decrypt_export::decrypt_export_served;
use super::luks_reencrypt::{export_args, init, init_params, ReencryptArgs, Shown};
use super::luks_slots::load;
use super::passphrase::Passphrase;
use super::passphrase::{is_tty, passphrase};
use super::{CliError, CliResult};
use crate::crypt::luks2::reencrypt::{Mode, Progress};
use crate::export::{self, daemon::control};
use std::path::{Path, PathBuf};

/// An open device, as its server tells it: its name, data device and detached header, the
/// bytes it serves and whether read-only.
pub(super) struct Served {
    name: String,
    device: PathBuf,
    header: Option<PathBuf>,
    size: Option<u64>,
    read_only: bool,
}

/// The open crypt device `arg` names, if any (an image or block device nothing serves is
/// reencrypted offline).
pub(super) fn served(arg: &Path) -> Result<Option<Served>, CliError> {
    let Some(s) = arg.to_str() else {
        return Ok(None);
    };
    let Ok(name) = export::resolve_target(s) else {
        return Ok(None);
    };
    let Ok(status) = export::daemon::status(Some(&name)) else {
        return Ok(None);
    };
    let Some(st) = status.into_iter().next() else {
        return Ok(None);
    };
    if st["state"] != "active" {
        return Ok(None);
    }
    let d = &st["details"];
    let Some(device) = d["device"].as_str() else {
        return Err(CliError::invalid(format!(
            "{name}: a {} device, not a LUKS volume; cannot reencrypt it",
            st["kind"].as_str().unwrap_or("non-LUKS")
        )));
    };
    Ok(Some(Served {
        name,
        device: PathBuf::from(device),
        header: d["header"].as_str().map(PathBuf::from),
        size: st["size"].as_u64(),
        read_only: st["read_only"].as_bool().unwrap_or(false),
    }))
}

/// Run `luks reencrypt`: online when it names a device dmkit has open, offline otherwise.
pub fn dispatch(a: ReencryptArgs) -> CliResult {
    match served(&a.volume.device)? {
        Some(s) => reencrypt(a, s),
        None => super::luks_reencrypt::reencrypt(a),
    }
}

/// Run `luks reencrypt` on an open device.
pub(super) fn reencrypt(a: ReencryptArgs, s: Served) -> CliResult {
    if a.device_size.is_some() {
        return Err(CliError::invalid(format!(
            "{}: dmkit reencrypts an open device whole: no --device-size online (close it to reencrypt offline).",
            s.name
        )));
    }
    let mut header = s.header.clone();
    let mut exported = None;
    if a.decrypt {
        match check_decrypt_header(&a, &s)? {
            Plan::Served => {}
            Plan::Export(h) => return export(&a, &s, h),
            Plan::Exported(h) => {
                let h = std::path::absolute(&h)
                    .map_err(|e| CliError::invalid(format!("{}: {e}", h.display())))?;
                header = Some(h.clone());
                exported = Some(h);
            }
        }
    }
    let mut v = load(&s.device, header.as_deref(), true, Some(2))?;
    let pass = match v.reencryption()? {
        None if a.resume_only => {
            return Err(CliError::invalid("Device reencryption not in progress."))
        }
        None if a.decrypt => {
            let p = passphrase(&a.key, &format!("Enter passphrase for {}: ", s.name), false)?;
            v.reencrypt_init_decrypt_served(&p, a.key_slot, &init_params(&a)?)?;
            if a.init_only {
                return Ok(());
            }
            p
        }
        None => {
            let p = init(&a, &mut v, true)?;
            if a.init_only {
                return Ok(());
            }
            p
        }
        Some(_) if a.init_only => {
            return Err(CliError::invalid(
                "LUKS2 reencryption already initialized. Aborting operation.",
            ))
        }
        Some(st) if a.decrypt && st.keyslot.mode != Mode::Decrypt => {
            return Err(CliError::invalid(
                "Device is not in LUKS2 decryption. Conflicting option --decrypt.",
            ))
        }
        Some(_) => passphrase(&a.key, &format!("Enter passphrase for {}: ", s.name), false)?,
    };
    drop(v);
    ask(&a, &s, pass, exported)
}

/// `--decrypt --header NEWFILE` of a device served with its header at its start, NEWFILE
/// not there yet: the export (see [`decrypt_export_served`]), then the server's decryption.
/// NEWFILE goes to the server as an absolute path: the server resolves it from its own
/// working directory.
fn export(a: &ReencryptArgs, s: &Served, header: PathBuf) -> CliResult {
    let header = std::path::absolute(&header)
        .map_err(|e| CliError::invalid(format!("{}: {e}", header.display())))?;
    load(&s.device, None, false, Some(2))?.check_served_whole(&s.name, s.size, s.read_only)?;
    let x = export_args(a, &s.device, &header, Some(&s.name));
    let pass = decrypt_export_served(&x, &s.name)?;
    ask(a, s, pass, Some(header))
}

/// Ask the server of `s` to reencrypt with `pass` (`header`: the file its header at its
/// start was exported to), showing its progress.
fn ask(a: &ReencryptArgs, s: &Served, pass: Passphrase, header: Option<PathBuf>) -> CliResult {
    let req = control::Request::Reencrypt {
        secret: control::Secret {
            key_slot: a.key_slot,
            passphrase: zeroize::Zeroizing::new(pass.to_vec()),
        },
        max_hotzone: a.hotzone_size,
        header,
    };
    drop(pass);
    let mut shown = Shown::new(&s.name, a.progress_json, !a.batch_mode && is_tty(2));
    let r = export::daemon::ask(&s.name, &req, |done, size| {
        shown.show(Progress { size, done })
    });
    drop(req);
    shown.end();
    r?;
    Ok(())
}

/// Which header an online decryption uses.
enum Plan {
    /// The detached header the device is served with.
    Served,
    /// The device is served with its header at its start: export it to this new file.
    Export(PathBuf),
    /// The file the header at the device's start was exported to (its server checks that).
    Exported(PathBuf),
}

/// `--decrypt` of an open device: the detached header it is served with (`--header`, when
/// given, names that file), or, for a device served with its header at its start, the file
/// `--header` names, to export the header to when it does not exist.
fn check_decrypt_header(a: &ReencryptArgs, s: &Served) -> Result<Plan, CliError> {
    let same = |x: &Path, y: &Path| {
        std::fs::canonicalize(x)
            .ok()
            .zip(std::fs::canonicalize(y).ok())
            .is_some_and(|(x, y)| x == y)
    };
    match (&s.header, a.volume.header.as_deref()) {
        (None, None) => Err(CliError::invalid(
            "LUKS2 decryption requires --header option.",
        )),
        (None, Some(h)) if std::fs::symlink_metadata(h).is_err() => Ok(Plan::Export(h.into())),
        (None, Some(h)) => Ok(Plan::Exported(h.into())),
        (Some(served), Some(h)) if !same(served, h) => Err(CliError::invalid(format!(
            "{}: served with the header {}, not {}.",
            s.name,
            served.display(),
            h.display()
        ))),
        (Some(_), _) => Ok(Plan::Served),
    }
}
