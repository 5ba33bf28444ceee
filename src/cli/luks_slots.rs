//! `dmkit luks add-key|remove-key|change-key|kill-slot|test-passphrase|uuid|header-backup|
//! header-restore`: keyslot management and header maintenance, LUKS2 and LUKS1.

use super::luks::{load, load_as, load_quietly, luks_err, open_file, Header, PbkdfArgs, Target};
use super::luks_keys::{passphrase, read_passphrase, KeyArgs, Passphrase};
use super::{CliError, CliResult};
use crate::block::{BlockDevice, MemoryDevice};
use crate::crypt::luks1;
use crate::crypt::luks2::{self, keyslot};
use std::path::{Path, PathBuf};

/// Arguments of `luks add-key`.
#[derive(clap::Args)]
pub struct AddKeyArgs {
    /// Device or image.
    device: PathBuf,
    /// File with the new passphrase (same as --new-keyfile).
    new_key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// File with the new passphrase.
    #[arg(long)]
    new_keyfile: Option<PathBuf>,
    /// Skip this many bytes at the start of the new key file.
    #[arg(long, default_value_t = 0)]
    new_keyfile_offset: u64,
    /// Read exactly this many bytes of the new key file (0: all of it).
    #[arg(long)]
    new_keyfile_size: Option<u32>,
    /// Keyslot for the new passphrase (default: the first free one).
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
}

/// Arguments of `luks remove-key`.
#[derive(clap::Args)]
pub struct RemoveKeyArgs {
    /// Device or image.
    device: PathBuf,
    /// File with the passphrase to remove (same as --key-file).
    key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// Do not ask before removing the last keyslot (without it: YES on a terminal, refused
    /// without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Arguments of `luks change-key`.
#[derive(clap::Args)]
pub struct ChangeKeyArgs {
    /// Device or image.
    device: PathBuf,
    /// File with the new passphrase (same as --new-keyfile).
    new_key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// File with the new passphrase.
    #[arg(long)]
    new_keyfile: Option<PathBuf>,
    /// Skip this many bytes at the start of the new key file.
    #[arg(long, default_value_t = 0)]
    new_keyfile_offset: u64,
    /// Read exactly this many bytes of the new key file (0: all of it).
    #[arg(long)]
    new_keyfile_size: Option<u32>,
    /// Only try this keyslot for the old passphrase.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
}

/// Arguments of `luks kill-slot`.
#[derive(clap::Args)]
pub struct KillSlotArgs {
    /// Device or image.
    device: PathBuf,
    /// The keyslot to wipe.
    slot: u32,
    #[command(flatten)]
    key: KeyArgs,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// Do not ask for a passphrase, nor before wiping the last keyslot (without it: YES on a
    /// terminal, refused without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Arguments of `luks test-passphrase`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Device or image.
    device: PathBuf,
    #[command(flatten)]
    key: KeyArgs,
    /// Only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// Keys of keyslots bound to no data segment count too.
    #[arg(long, conflicts_with = "key_slot")]
    unbound: bool,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
}

/// Arguments of `luks uuid`.
#[derive(clap::Args)]
pub struct UuidArgs {
    /// Device or image.
    device: PathBuf,
    /// Set this UUID instead of printing it.
    #[arg(long)]
    uuid: Option<String>,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
}

/// Arguments of `luks is-luks`.
#[derive(clap::Args)]
pub struct IsLuksArgs {
    /// Device or image.
    device: PathBuf,
    /// Only this version: luks, luks1 or luks2.
    #[arg(long = "type", short = 'M')]
    luks_type: Option<String>,
    /// Say the outcome, in cryptsetup's words.
    #[arg(long, short = 'v')]
    verbose: bool,
}

/// Arguments of `luks header-backup` and `header-restore`.
#[derive(clap::Args)]
pub struct BackupArgs {
    /// Device or image.
    device: PathBuf,
    /// The backup file.
    #[arg(long)]
    header_backup_file: PathBuf,
    /// header-restore: do not ask for confirmation (without it: YES on a terminal, refused
    /// without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

fn prompt(device: &Path) -> String {
    format!("Enter passphrase for {}: ", device.display())
}

/// The new passphrase of add-key and change-key: `--new-keyfile` (or the positional file) with
/// `--new-keyfile-offset`/`--new-keyfile-size`, by the same rules as the old one (a second line
/// of stdin when both come from it).
fn new_passphrase(
    arg: &Option<PathBuf>,
    flag: &Option<PathBuf>,
    offset: u64,
    size: Option<u32>,
) -> Result<Passphrase, CliError> {
    let file = flag.as_ref().or(arg.as_ref());
    read_passphrase(
        file.map(PathBuf::as_path),
        offset,
        size,
        "Enter new passphrase for key slot: ",
        true,
    )
}

fn active_slots(t: &Target) -> usize {
    match &t.header {
        Header::V2(h) => h.metadata.keyslots.len(),
        Header::V1(h) => h.keyslots.iter().filter(|k| k.active).count(),
    }
}

/// Add a keyslot for `new` holding `vk`.
fn add_slot(
    t: &mut Target,
    vk: &[u8],
    new: &[u8],
    pbkdf: &PbkdfArgs,
    slot: Option<u32>,
) -> Result<u32, CliError> {
    match &mut t.header {
        Header::V2(h) => {
            let p = pbkdf.params(false)?;
            keyslot::add(&t.dev, h, vk, new, &p, slot).map_err(luks_err)
        }
        Header::V1(h) => {
            let p = pbkdf.params(true)?;
            luks1::add_key(&t.dev, h, vk, new, p.force_iterations, p.iter_time_ms, slot)
                .map_err(luks_err)
        }
    }
}

/// cryptsetup's question before the last keyslot goes (`verb`: "wipe" or "remove").
fn last_slot(batch: bool, slot: u32, verb: &str) -> CliResult {
    super::confirm::Confirm {
        batch,
        warnings: Vec::new(),
        question: "This is the last keyslot. Device will become unusable after purging this key."
            .to_string(),
        action: &format!("{verb} keyslot {slot}, the last one (the device would become unusable),"),
        aborted: "Operation aborted, the keyslot was NOT wiped.",
        code: 2,
    }
    .ask()
}

fn kill(t: &mut Target, slot: u32) -> CliResult {
    match &mut t.header {
        Header::V2(h) => keyslot::kill(&t.dev, h, slot),
        Header::V1(h) => luks1::kill_slot(&t.dev, h, slot),
    }
    .map_err(luks_err)
}

/// Run `luks add-key`.
pub fn add_key(a: AddKeyArgs) -> CliResult {
    let mut t = load(&a.device, a.header.as_deref(), true)?;
    let old = passphrase(&a.key, &prompt(&a.device), false)?;
    let (_, vk) = t.unlock(&old, None)?;
    drop(old);
    let new = new_passphrase(
        &a.new_key_file_arg,
        &a.new_keyfile,
        a.new_keyfile_offset,
        a.new_keyfile_size,
    )?;
    let slot = add_slot(&mut t, &vk, &new, &a.pbkdf, a.key_slot)?;
    eprintln!("Key slot {slot} created.");
    Ok(())
}

/// Run `luks remove-key`.
pub fn remove_key(a: RemoveKeyArgs) -> CliResult {
    let mut t = load(&a.device, a.header.as_deref(), true)?;
    let mut key = a.key.clone();
    if key.key_file.is_none() {
        key.key_file = a.key_file_arg.clone();
    }
    let pass = passphrase(&key, &prompt(&a.device), false)?;
    let (slot, _vk) = t.unlock(&pass, None)?;
    if active_slots(&t) == 1 {
        last_slot(a.batch_mode, slot, "remove")?;
    }
    kill(&mut t, slot)
}

/// Run `luks change-key`.
pub fn change_key(a: ChangeKeyArgs) -> CliResult {
    let mut t = load(&a.device, a.header.as_deref(), true)?;
    let old = passphrase(&a.key, &prompt(&a.device), false)?;
    let (slot, vk) = t.unlock(&old, a.key_slot)?;
    drop(old);
    let new = new_passphrase(
        &a.new_key_file_arg,
        &a.new_keyfile,
        a.new_keyfile_offset,
        a.new_keyfile_size,
    )?;
    // The new keyslot is complete on disk before the old one is wiped: a crash in between
    // leaves both passphrases working, never neither.
    let added = add_slot(&mut t, &vk, &new, &a.pbkdf, None)?;
    kill(&mut t, slot)?;
    eprintln!("Key slot {slot} replaced by key slot {added}.");
    Ok(())
}

/// Run `luks kill-slot`.
pub fn kill_slot(a: KillSlotArgs) -> CliResult {
    let mut t = load(&a.device, a.header.as_deref(), true)?;
    let exists = match &t.header {
        Header::V2(h) => h.metadata.keyslots.contains_key(&a.slot),
        Header::V1(h) => h.keyslots.get(a.slot as usize).is_some_and(|k| k.active),
    };
    if !exists {
        return Err(CliError::invalid(format!(
            "keyslot {} is not active",
            a.slot
        )));
    }
    if !a.batch_mode {
        // cryptsetup asks before it reads the passphrase.
        if active_slots(&t) == 1 {
            last_slot(false, a.slot, "wipe")?;
        }
        // Like cryptsetup: prove you hold a key before destroying one.
        let pass = passphrase(&a.key, &prompt(&a.device), false)?;
        t.unlock(&pass, None)?;
    }
    kill(&mut t, a.slot)
}

/// Run `luks test-passphrase`.
pub fn test_passphrase(a: TestArgs) -> CliResult {
    let t = load(&a.device, a.header.as_deref(), false)?;
    let pass = passphrase(&a.key, &prompt(&a.device), false)?;
    let (slot, _vk) = t.test_passphrase(&pass, a.key_slot, a.unbound)?;
    println!("Key slot {slot} unlocked.");
    Ok(())
}

/// Run `luks uuid`.
pub fn uuid(a: UuidArgs) -> CliResult {
    let mut t = load(&a.device, a.header.as_deref(), a.uuid.is_some())?;
    let Some(new) = &a.uuid else {
        println!("{}", t.uuid());
        return Ok(());
    };
    if !luks2::format::valid_uuid(new) {
        return Err(CliError::invalid(format!("--uuid {new:?} is not a UUID")));
    }
    match &mut t.header {
        Header::V2(h) => {
            h.uuid = new.to_ascii_lowercase();
            h.write(&t.dev).map_err(luks_err)
        }
        Header::V1(h) => {
            h.uuid = new.to_ascii_lowercase();
            let bytes = h.encode().map_err(luks_err)?;
            t.dev
                .write_at(&bytes, 0)
                .map_err(|e| CliError::invalid(e.to_string()))?;
            t.dev.flush().map_err(|e| CliError::invalid(e.to_string()))
        }
    }
}

/// Bytes a header backup covers: headers and keyslots (LUKS2), everything before the data
/// (LUKS1), as cryptsetup saves them.
fn backup_len(t: &Target) -> u64 {
    match &t.header {
        Header::V2(h) => h.metadata_end(),
        Header::V1(h) => h.payload_offset as u64 * 512,
    }
}

/// Run `luks header-backup`.
pub fn header_backup(a: BackupArgs) -> CliResult {
    let t = load(&a.device, None, false)?;
    let len = backup_len(&t).min(t.dev.size());
    let mut buf = vec![0u8; len as usize];
    t.dev
        .read_at(&mut buf, 0)
        .map_err(|e| CliError::invalid(e.to_string()))?;
    use std::io::Write;
    let file = &a.header_backup_file;
    // Keyslots are all an offline attack on the passphrase needs: owner-read-only, new.
    let mut f =
        super::secret_files::create_new(file, super::secret_files::BACKUP_MODE).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CliError::invalid(format!(
                    "Requested header backup file {} already exists.",
                    file.display()
                ))
            } else {
                CliError::invalid(format!(
                    "{}: cannot create backup file: {e}",
                    file.display()
                ))
            }
        })?;
    f.write_all(&buf).and_then(|_| f.sync_all()).map_err(|e| {
        // A partial backup is worse than none: it would restore a broken header.
        let _ = std::fs::remove_file(file);
        CliError::invalid(format!(
            "{}: cannot write header backup file: {e}",
            file.display()
        ))
    })
}

/// Run `luks header-restore`.
pub fn header_restore(a: BackupArgs) -> CliResult {
    let file = &a.header_backup_file;
    let meta = std::fs::metadata(file)
        .map_err(|e| CliError::no_device(format!("{}: {e}", file.display())))?;
    if meta.len() > 256 << 20 {
        return Err(CliError::invalid(format!(
            "{}: {} bytes is too large for a LUKS header backup",
            file.display(),
            meta.len()
        )));
    }
    let bytes =
        std::fs::read(file).map_err(|e| CliError::invalid(format!("{}: {e}", file.display())))?;
    // Check the backup as a device of its own before anything touches the real one.
    let mem = MemoryDevice::from_vec(&file.display().to_string(), bytes.clone());
    let backup = {
        let mut first = [0u8; 8];
        if mem.size() >= 8 {
            mem.read_at(&mut first, 0)
                .map_err(|e| CliError::invalid(e.to_string()))?;
        }
        // cryptsetup's verdict (`crypt_header_restore`): the primary magic's version picks
        // the reader, and a backup without that magic (or with version 0) is no backup, whatever
        // copy follows.
        match luks2::header::luks_version(&first) {
            None | Some(0) => {
                return Err(CliError::invalid(format!(
                    "{}: Header backup file does not contain compatible LUKS header.",
                    file.display()
                )))
            }
            Some(1) => Header::V1(Box::new(luks1::read(&mem).map_err(luks_err)?)),
            Some(_) => Header::V2(Box::new(
                luks2::header::read(&mem).map_err(luks_err)?.header,
            )),
        }
    };
    let dev = open_file(&a.device, false)?;
    // The bytes to be overwritten, claimed first: refused while a device maps any of them.
    let claim = super::files::claim(dev.file(), &a.device, 0, bytes.len().max(1) as u64, true)?;
    let backup = Target {
        dev,
        header: backup,
        detached: false,
        _claim: Some(claim),
    };
    let (_, data_offset) = backup.cipher_and_offset();
    let dev_size = backup.dev.size();
    if bytes.len() as u64 > dev_size || (data_offset > 0 && bytes.len() as u64 > data_offset) {
        return Err(CliError::invalid(format!(
            "{}: the backup ({} bytes) does not fit before the data of {} ({} bytes)",
            file.display(),
            bytes.len(),
            a.device.display(),
            dev_size
        )));
    }
    restore_question(&a, &backup)?;
    backup
        .dev
        .write_at(&bytes, 0)
        .map_err(|e| CliError::invalid(e.to_string()))?;
    backup
        .dev
        .flush()
        .map_err(|e| CliError::invalid(e.to_string()))
}

/// luksHeaderRestore's question, in its words: whether DEVICE holds a header of the backup's
/// version (keyslots are lost) or not (data may be), and whether the UUIDs differ. Where there
/// is no header, the signatures found on DEVICE are named too.
fn restore_question(a: &BackupArgs, backup: &Target) -> CliResult {
    if a.batch_mode {
        return Ok(());
    }
    let (version, v1) = match backup.header {
        Header::V1(_) => ("LUKS", true),
        Header::V2(_) => ("LUKS2", false),
    };
    let current = load_quietly(&a.device, None, false)
        .ok()
        .map(|(t, _)| t)
        .filter(|t| matches!(t.header, Header::V1(_)) == v1);
    let dev = a.device.display();
    let (mut question, warnings) = match &current {
        Some(_) => (
            format!("Device {dev} already contains {version} header. Replacing header will destroy existing keyslots."),
            Vec::new(),
        ),
        None => (
            format!("Device {dev} does not contain {version} header. Replacing header can destroy data on that device."),
            super::confirm::signature_warnings(&a.device, 0)?,
        ),
    };
    if current.is_some_and(|c| c.uuid() != backup.uuid()) {
        question.push_str("\nWARNING: real device header has different UUID than backup!");
    }
    super::confirm::Confirm {
        batch: false,
        warnings,
        question,
        action: &format!("restore the header of {dev}"),
        aborted: "",
        code: 1,
    }
    .ask()
}

/// Run `luks is-luks`: quiet like cryptsetup, exit 0 for a LUKS header (of `--type`), 1 when
/// there is none or it is corrupt, 4 when DEVICE is missing. `-v` prints cryptsetup's lines.
pub fn is_luks(a: IsLuksArgs) -> CliResult {
    let want = match a.luks_type.as_deref() {
        None | Some("luks") => None,
        Some("luks1") => Some(1),
        Some("luks2") => Some(2),
        Some(o) => {
            return Err(CliError::invalid(format!(
                "--type: {o:?} is not luks, luks1 or luks2"
            )))
        }
    };
    let result = match load_as(&a.device, None, false, want) {
        Ok((t, _)) => {
            let version = match t.header {
                Header::V1(_) => 1,
                Header::V2(_) => 2,
            };
            if want.is_some_and(|w| w != version) {
                Err(1)
            } else {
                Ok(())
            }
        }
        Err(e) if e.code == 4 => {
            eprintln!(
                "Device {} does not exist or access denied.",
                a.device.display()
            );
            Err(4)
        }
        Err(_) => Err(1),
    };
    match result {
        Ok(()) => {
            if a.verbose {
                println!("Command successful.");
            }
            Ok(())
        }
        Err(code) => {
            if a.verbose {
                let what = if code == 4 {
                    "-4 (wrong device or file specified)"
                } else {
                    "-1 (wrong or missing parameters)"
                };
                // cryptsetup says this on stdout too.
                println!("Command failed with code {what}.");
            }
            Err(CliError {
                code,
                message: String::new(),
            })
        }
    }
}
