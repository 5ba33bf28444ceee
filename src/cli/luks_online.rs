//! The LUKS verbs that act on an open device through its server (cryptsetup's `resize`,
//! `luksSuspend`, `luksResume`, `refresh`): parse, read the passphrase, send one request over
//! the control socket, print. The server does the work (`block::online`); a passphrase is
//! unlocked in the server itself, so the volume key never leaves it.

use super::passphrase::{passphrase, KeyArgs};
use super::CliResult;
use crate::export::{self, daemon::control};

/// Arguments of `luks resize`.
#[derive(clap::Args)]
pub struct ResizeArgs {
    /// Name of the open device.
    name: String,
    /// New size in 512-byte sectors (default: up to the end of the backing device).
    #[arg(long, short = 'b')]
    size: Option<u64>,
}

/// Arguments of `luks suspend`.
#[derive(clap::Args)]
pub struct SuspendArgs {
    /// Name of the open device.
    name: String,
}

/// Arguments of `luks resume`: the device and its passphrase, read as `open` reads it.
#[derive(clap::Args)]
pub struct ResumeArgs {
    /// Name of the suspended (or, for refresh, open) device.
    name: String,
    /// Try only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    #[command(flatten)]
    key: KeyArgs,
}

/// Arguments of `luks refresh`.
#[derive(clap::Args)]
pub struct RefreshArgs {
    #[command(flatten)]
    unlock: ResumeArgs,
    /// Pass discards down from now on (without it, discards go back to the volume's default).
    #[arg(long)]
    allow_discards: bool,
    /// Store the flags in the LUKS2 header too, replacing those stored before.
    #[arg(long)]
    persistent: bool,
    /// Refused: a device's mode cannot change while it is open (close and open it again).
    #[arg(long, short = 'r')]
    readonly: bool,
}

/// Run `luks resize`.
pub fn resize(a: ResizeArgs) -> CliResult {
    let name = export::resolve_target(&a.name)?;
    export::daemon::ask(&name, &control::Request::Resize(a.size), |_, _| {})?;
    Ok(())
}

/// Run `luks suspend`.
pub fn suspend(a: SuspendArgs) -> CliResult {
    let name = export::resolve_target(&a.name)?;
    export::daemon::ask(&name, &control::Request::Suspend, |_, _| {})?;
    Ok(())
}

/// The passphrase for `name`, as `open` reads it.
fn secret(
    name: &str,
    key: &KeyArgs,
    key_slot: Option<u32>,
) -> Result<control::Secret, super::CliError> {
    let pass = passphrase(key, &format!("Enter passphrase for {name}: "), false)?;
    Ok(control::Secret {
        key_slot,
        passphrase: zeroize::Zeroizing::new(pass.to_vec()),
    })
}

/// Run `luks resume`.
pub fn resume(a: ResumeArgs) -> CliResult {
    let name = export::resolve_target(&a.name)?;
    let s = secret(&name, &a.key, a.key_slot)?;
    export::daemon::ask(&name, &control::Request::Resume(s), |_, _| {})?;
    Ok(())
}

/// Run `luks refresh`.
pub fn refresh(a: RefreshArgs) -> CliResult {
    let u = &a.unlock;
    if a.readonly {
        return Err(super::CliError::invalid(format!(
            "{}: the read-only mode of an open device cannot be changed by refresh",
            u.name
        )));
    }
    let name = export::resolve_target(&u.name)?;
    let secret = secret(&name, &u.key, u.key_slot)?;
    let req = control::Request::Refresh {
        secret,
        allow_discards: a.allow_discards,
        persistent: a.persistent,
    };
    export::daemon::ask(&name, &req, |_, _| {})?;
    Ok(())
}
