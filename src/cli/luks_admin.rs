//! `dmkit luks convert|convert-key|erase|config|token`: cryptsetup's offline maintenance
//! verbs (`convert`, `luksConvertKey`, `erase`/`luksErase`, `config`, `token`), with its
//! option names and words. The library's [`LuksVolume`] decides and writes; here the
//! arguments, the questions, passphrases and JSON files.

use super::luks_slots::{PbkdfArgs, VolumeArgs};
use super::passphrase::{passphrase, KeyArgs};
use super::{CliError, CliResult};
use crate::crypt::luks::{LuksVolume, Priority, UnlockedKey};
use std::path::PathBuf;

/// Arguments of `luks convert`.
#[derive(clap::Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// The format to convert to: luks1 or luks2.
    #[arg(long = "type", short = 'M')]
    luks_type: String,
    /// Do not ask for confirmation (without it: YES on a terminal, refused without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Arguments of `luks convert-key`.
#[derive(clap::Args)]
pub struct ConvertKeyArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// The keyslot to convert (default: the one the passphrase opens).
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// The new KDF parameters.
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    key: KeyArgs,
}

/// Arguments of `luks erase`.
#[derive(clap::Args)]
pub struct EraseArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Do not ask for confirmation (without it: YES on a terminal, refused without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Arguments of `luks config`.
#[derive(clap::Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// New label (the subsystem is cleared unless --subsystem is given too, as cryptsetup does).
    #[arg(long)]
    label: Option<String>,
    /// New subsystem (the label is cleared unless --label is given too).
    #[arg(long)]
    subsystem: Option<String>,
    /// Keyslot priority: prefer, normal or ignore (with --key-slot).
    #[arg(long)]
    priority: Option<String>,
    /// The keyslot whose priority is set.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
}

/// What `luks token` does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenAction {
    /// Add a luks2-keyring token (--key-description).
    Add,
    /// Remove token --token-id.
    Remove,
    /// Import a JSON token from --json-file or stdin.
    Import,
    /// Print token --token-id's JSON (or write it to --json-file).
    Export,
    /// Unbind token --token-id from keyslot --key-slot (the token stays).
    Unassign,
}

/// Arguments of `luks token`.
#[derive(clap::Args)]
pub struct TokenArgs {
    /// add, remove, import, export or unassign.
    action: TokenAction,
    #[command(flatten)]
    volume: VolumeArgs,
    /// Token id (default for add and import: the first free one).
    #[arg(long)]
    token_id: Option<u32>,
    /// JSON file to import from or export to (default: stdin / stdout).
    #[arg(long)]
    json_file: Option<PathBuf>,
    /// add: the kernel keyring key (type user) holding the passphrase.
    #[arg(long)]
    key_description: Option<String>,
    /// add, import: bind the token to this keyslot (add default: every keyslot); unassign:
    /// the keyslot to unbind.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// add, import: replace the token already at --token-id.
    #[arg(long)]
    token_replace: bool,
    /// add: bind the token to no keyslot.
    #[arg(long)]
    unbound: bool,
}

/// Run `luks convert`.
pub fn convert(a: ConvertArgs) -> CliResult {
    let to = match a.luks_type.as_str() {
        "luks1" => 1,
        "luks2" => 2,
        _ => {
            return Err(CliError::invalid(
                "Invalid LUKS type, only luks1 and luks2 are supported.",
            ))
        }
    };
    let mut v = a.volume.load(true, None)?;
    let shown = shown(&a.volume);
    if v.version() == to {
        return Err(CliError::invalid(format!(
            "Device is already LUKS{to} type."
        )));
    }
    super::confirm::Confirm {
        batch: a.batch_mode,
        warnings: Vec::new(),
        question: format!("This operation will convert {shown} to LUKS{to} format.\n"),
        action: &format!("convert {shown}"),
        aborted: "Operation aborted, device was NOT converted.",
        code: 2,
    }
    .ask()?;
    v.convert(to)?;
    Ok(())
}

/// Run `luks convert-key`.
pub fn convert_key(a: ConvertKeyArgs) -> CliResult {
    let mut v = a.volume.load(true, None)?;
    v.check_convert_keyslot(a.key_slot)?;
    let params = a.pbkdf.params(false)?;
    let pass = passphrase(
        &a.key,
        "Enter passphrase for keyslot to be converted: ",
        false,
    )?;
    v.convert_keyslot(&pass, a.key_slot, &params)?;
    Ok(())
}

/// Run `luks erase`.
pub fn erase(a: EraseArgs) -> CliResult {
    let mut v = a.volume.load(true, None)?;
    let shown = shown(&a.volume);
    super::confirm::Confirm {
        batch: a.batch_mode,
        warnings: Vec::new(),
        question: format!(
            "This operation will erase all keyslots on device {shown}.\nDevice will become unusable after this operation."
        ),
        action: &format!("erase all keyslots of {shown}"),
        aborted: "Operation aborted, keyslots were NOT wiped.",
        code: 2,
    }
    .ask()?;
    v.erase()?;
    Ok(())
}

/// Run `luks config`.
pub fn config(a: ConfigArgs) -> CliResult {
    if a.priority.is_none() && a.label.is_none() && a.subsystem.is_none() {
        return Err(CliError::invalid(
            "Option --priority, --label or --subsystem is missing.",
        ));
    }
    let priority = match (&a.priority, a.key_slot) {
        (Some(p), Some(s)) => Some((Priority::named(p)?, s)),
        (Some(_), None) => return Err(CliError::invalid("Keyslot specification is required.")),
        (None, _) => None,
    };
    let mut v = a.volume.load(true, Some(2)).map_err(not_luks2(&a.volume))?;
    if let Some((p, s)) = priority {
        v.set_priority(s, p)?;
    }
    if a.label.is_some() || a.subsystem.is_some() {
        v.set_labels(a.label.as_deref(), a.subsystem.as_deref())?;
    }
    Ok(())
}

/// Run `luks token`.
pub fn token(a: TokenArgs) -> CliResult {
    let writes = a.action != TokenAction::Export;
    let mut v = a
        .volume
        .load(writes, Some(2))
        .map_err(not_luks2(&a.volume))?;
    let need_id = || {
        a.token_id
            .ok_or_else(|| CliError::invalid("Token --token-id is required."))
    };
    match a.action {
        TokenAction::Add => {
            let desc = a
                .key_description
                .as_deref()
                .ok_or_else(|| CliError::invalid("Option --key-description is required."))?;
            v.token_add_keyring(a.token_id, desc, a.key_slot, a.unbound, a.token_replace)?;
        }
        TokenAction::Remove => v.token_remove(need_id()?)?,
        TokenAction::Import => {
            let json = read_json(&a.json_file)?;
            v.token_import(a.token_id, &json, a.key_slot, a.token_replace)?;
        }
        TokenAction::Export => {
            let text = v.token_export(need_id()?)?;
            write_json(&a.json_file, &text)?;
        }
        TokenAction::Unassign => {
            // cryptsetup's order of checks and words.
            let slot = a.key_slot.ok_or_else(|| {
                CliError::invalid("Action requires specific keyslot. Use --key-slot parameter.")
            })?;
            let id = a.token_id.ok_or_else(|| {
                CliError::invalid("Action requires specific token. Use --token-id parameter.")
            })?;
            v.token_unassign(id, slot)?;
        }
    }
    Ok(())
}

/// `open` without a key file on a LUKS2 header with tokens (or with `--token-only`): the key
/// from the `luks2-keyring` tokens. `None` when no token opened and a passphrase may be
/// asked; with `token_only` a failure is the answer.
pub(super) fn token_key(
    v: &LuksVolume,
    key: &KeyArgs,
    token_only: bool,
    token_id: Option<u32>,
    token_type: Option<&str>,
) -> Result<Option<UnlockedKey>, CliError> {
    if !token_only && (key.key_file.is_some() || !v.has_tokens()) {
        return Ok(None);
    }
    match v.unlock_by_token(token_id, token_type) {
        Ok(k) => Ok(Some(k)),
        Err(e) if token_only => Err(e.into()),
        Err(_) => Ok(None),
    }
}

/// The name cryptsetup shows: the detached header, else the device.
fn shown(v: &VolumeArgs) -> String {
    v.header.as_ref().unwrap_or(&v.device).display().to_string()
}

/// cryptsetup's words when a LUKS2-only verb meets a LUKS1 (or no LUKS) header.
fn not_luks2(v: &VolumeArgs) -> impl Fn(CliError) -> CliError + '_ {
    move |e| {
        if e.code == 1 {
            CliError::invalid(format!("Device {} is not a valid LUKS2 device.", shown(v)))
        } else {
            e
        }
    }
}

/// The most JSON a token import reads (a LUKS2 JSON area is at most 4 MiB).
const MAX_JSON: u64 = 4 << 20;

fn read_json(file: &Option<PathBuf>) -> Result<String, CliError> {
    use std::io::Read;
    let mut text = String::new();
    let r = match file.as_deref().filter(|p| p.as_os_str() != "-") {
        Some(p) => std::fs::File::open(p)
            .and_then(|f| f.take(MAX_JSON).read_to_string(&mut text))
            .map_err(|e| format!("{}: cannot read token JSON: {e}", p.display())),
        None => std::io::stdin()
            .lock()
            .take(MAX_JSON)
            .read_to_string(&mut text)
            .map_err(|e| format!("stdin: cannot read token JSON: {e}")),
    };
    r.map_err(CliError::invalid)?;
    Ok(text)
}

fn write_json(file: &Option<PathBuf>, text: &str) -> CliResult {
    use std::io::Write;
    match file.as_deref().filter(|p| p.as_os_str() != "-") {
        Some(p) => std::fs::write(p, text).map_err(|e| {
            CliError::invalid(format!("{}: cannot write token JSON: {e}", p.display()))
        }),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|_| out.flush())
                .map_err(|e| CliError::invalid(format!("cannot write token JSON: {e}")))
        }
    }
}
