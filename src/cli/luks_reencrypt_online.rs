//! `dmkit luks reencrypt NAME` (and `dmkit reencrypt NAME`) on a device dmkit has open: the
//! header is put into reencryption here when it is not yet (the passphrases asked as the
//! offline command asks them), then the device's server is asked to reencrypt it in the
//! background while it goes on serving; its progress frames are shown as the offline progress
//! is. The server unlocks the keys itself: only the passphrase crosses the control socket.

use super::luks_reencrypt::{init, ReencryptArgs, Shown};
use super::luks_slots::load;
use super::passphrase::{is_tty, passphrase};
use super::{CliError, CliResult};
use crate::crypt::luks2::reencrypt::Progress;
use crate::export::{self, daemon::control};
use std::path::{Path, PathBuf};

/// An open device, as its server tells it: its name, data device and detached header.
pub(super) struct Served {
    name: String,
    device: PathBuf,
    header: Option<PathBuf>,
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
    let mut v = load(&s.device, s.header.as_deref(), true, Some(2))?;
    let pass = match v.reencryption()? {
        None if a.resume_only => {
            return Err(CliError::invalid("Device reencryption not in progress."))
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
        Some(_) => passphrase(&a.key, &format!("Enter passphrase for {}: ", s.name), false)?,
    };
    drop(v);
    let req = control::Request::Reencrypt {
        secret: control::Secret {
            key_slot: a.key_slot,
            passphrase: zeroize::Zeroizing::new(pass.to_vec()),
        },
        max_hotzone: a.hotzone_size,
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
