//! `dmkit luks add-key|remove-key|change-key|kill-slot|test-passphrase|uuid|header-backup|
//! header-restore|is-luks`: keyslot management and header maintenance, LUKS2 and LUKS1, done
//! by the library's [`LuksVolume`]; here the arguments, passphrases and questions. The KDF
//! options, loading a volume and the words for LUKS errors, which `luks format` and `luks
//! open` use too, live here.

use super::passphrase::{passphrase, read_passphrase, KeyArgs, Passphrase};
use super::{CliError, CliResult};
use crate::crypt::luks::{version_named, HeaderRestore, LuksError, LuksVolume};
use crate::crypt::luks2::PbkdfParams;
use std::path::{Path, PathBuf};

/// Arguments of `luks add-key`.
#[derive(clap::Args)]
pub struct AddKeyArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// File with the new passphrase (same as --new-keyfile).
    new_key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    new_key: NewKeyArgs,
    /// Keyslot for the new passphrase (default: the first free one).
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
}

/// The LUKS device, and its detached header if any.
#[derive(clap::Args)]
pub struct VolumeArgs {
    /// Device or image.
    pub device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
}

impl VolumeArgs {
    /// Read the volume (see [`load`]).
    pub(super) fn load(&self, writable: bool, want: Option<u16>) -> Result<LuksVolume, CliError> {
        load(&self.device, self.header.as_deref(), writable, want)
    }
}

/// Where add-key and change-key read the new passphrase.
#[derive(clap::Args)]
pub struct NewKeyArgs {
    /// File with the new passphrase.
    #[arg(long)]
    new_keyfile: Option<PathBuf>,
    /// Skip this many bytes at the start of the new key file.
    #[arg(long, default_value_t = 0)]
    new_keyfile_offset: u64,
    /// Read exactly this many bytes of the new key file (0: all of it).
    #[arg(long)]
    new_keyfile_size: Option<u32>,
}

/// Arguments of `luks remove-key`.
#[derive(clap::Args)]
pub struct RemoveKeyArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// File with the passphrase to remove (same as --key-file).
    key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask before removing the last keyslot (without it: YES on a terminal, refused
    /// without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Arguments of `luks change-key`.
#[derive(clap::Args)]
pub struct ChangeKeyArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// File with the new passphrase (same as --new-keyfile).
    new_key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    new_key: NewKeyArgs,
    /// Only try this keyslot for the old passphrase.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
}

/// Arguments of `luks kill-slot`.
#[derive(clap::Args)]
pub struct KillSlotArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// The keyslot to wipe.
    slot: u32,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for a passphrase, nor before wiping the last keyslot (without it: YES on a
    /// terminal, refused without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Arguments of `luks test-passphrase`.
#[derive(clap::Args)]
pub struct TestArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// Keys of keyslots bound to no data segment count too.
    #[arg(long, conflicts_with = "key_slot")]
    unbound: bool,
}

/// Arguments of `luks uuid`.
#[derive(clap::Args)]
pub struct UuidArgs {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Set this UUID instead of printing it.
    #[arg(long)]
    uuid: Option<String>,
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

/// KDF options of commands that make keyslots.
#[derive(clap::Args, Clone, Debug)]
pub struct PbkdfArgs {
    /// KDF: argon2id (LUKS2 default), argon2i or pbkdf2 (LUKS1's only one).
    #[arg(long)]
    pub pbkdf: Option<String>,
    /// Hash for PBKDF2, the AF splitter and the volume key digest.
    #[arg(long, default_value = "sha256")]
    pub hash: String,
    /// Argon2 memory cost in KiB (default: 1 GiB, at most half the RAM).
    #[arg(long)]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 threads (default: up to 4).
    #[arg(long)]
    pub pbkdf_parallel: Option<u32>,
    /// Unlock time to aim for, in milliseconds.
    #[arg(long, short = 'i', default_value_t = 2000)]
    pub iter_time: u32,
    /// Exact PBKDF2 iterations or Argon2 passes (no benchmark).
    #[arg(long)]
    pub pbkdf_force_iterations: Option<u32>,
}

impl PbkdfArgs {
    /// The KDF parameters of a new keyslot (LUKS1 if `luks1`).
    pub(super) fn params(&self, luks1: bool) -> Result<PbkdfParams, CliError> {
        let mut p = PbkdfParams::choose(self.pbkdf.as_deref(), &self.hash, luks1)?;
        p.iter_time_ms = self.iter_time.max(1);
        p.force_iterations = self.pbkdf_force_iterations;
        if let Some(m) = self.pbkdf_memory {
            p.memory_kib = m;
        }
        if let Some(n) = self.pbkdf_parallel {
            p.parallel = n;
        }
        Ok(p)
    }
}

/// Read the volume of `device` (or of `header`, when detached), of version `want` (1 or 2)
/// when given. One line on stderr when a corrupt copy was skipped.
pub(super) fn load(
    device: &Path,
    header: Option<&Path>,
    writable: bool,
    want: Option<u16>,
) -> Result<LuksVolume, CliError> {
    let mut v = LuksVolume::open(device, header, writable, want)?;
    if let Some(w) = v.take_warning() {
        eprintln!("dmkit: {w}");
    }
    Ok(v)
}

/// The LUKS version `--type` asks for: `None` for `luks` (either) or no `--type`.
pub(super) fn wanted_version(luks_type: &Option<String>) -> Result<Option<u16>, LuksError> {
    Ok(luks_type
        .as_deref()
        .map(version_named)
        .transpose()?
        .flatten())
}

/// The question for the passphrase of `device`.
pub(super) fn prompt(device: &Path) -> String {
    format!("Enter passphrase for {}: ", device.display())
}

/// The new passphrase of add-key and change-key: `--new-keyfile` (or the positional file) with
/// `--new-keyfile-offset`/`--new-keyfile-size`, by the same rules as the old one (a second line
/// of stdin when both come from it).
fn new_passphrase(arg: &Option<PathBuf>, new: &NewKeyArgs) -> Result<Passphrase, CliError> {
    let file = new.new_keyfile.as_ref().or(arg.as_ref());
    read_passphrase(
        file.map(PathBuf::as_path),
        new.new_keyfile_offset,
        new.new_keyfile_size,
        "Enter new passphrase for key slot: ",
        true,
    )
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

/// Run `luks add-key`.
pub fn add_key(a: AddKeyArgs) -> CliResult {
    let mut v = a.volume.load(true, None)?;
    let old = passphrase(&a.key, &prompt(&a.volume.device), false)?;
    let key = v.unlock_key(&old, None)?;
    drop(old);
    let new = new_passphrase(&a.new_key_file_arg, &a.new_key)?;
    let p = a.pbkdf.params(v.version() == 1)?;
    let slot = v.add_keyslot(&key, &new, &p, a.key_slot)?;
    eprintln!("Key slot {slot} created.");
    Ok(())
}

/// Run `luks remove-key`.
pub fn remove_key(a: RemoveKeyArgs) -> CliResult {
    let mut v = a.volume.load(true, None)?;
    let key = a.key.or_positional(&a.key_file_arg);
    let pass = passphrase(&key, &prompt(&a.volume.device), false)?;
    let slot = v.unlock_key(&pass, None)?.slot();
    if v.active_keyslots() == 1 {
        last_slot(a.batch_mode, slot, "remove")?;
    }
    Ok(v.kill_keyslot(slot)?)
}

/// Run `luks change-key`.
pub fn change_key(a: ChangeKeyArgs) -> CliResult {
    let mut v = a.volume.load(true, None)?;
    let old = passphrase(&a.key, &prompt(&a.volume.device), false)?;
    let key = v.unlock_key(&old, a.key_slot)?;
    drop(old);
    let new = new_passphrase(&a.new_key_file_arg, &a.new_key)?;
    let p = a.pbkdf.params(v.version() == 1)?;
    let added = v.change_keyslot(&key, &new, &p)?;
    eprintln!("Key slot {} replaced by key slot {added}.", key.slot());
    Ok(())
}

/// Run `luks kill-slot`.
pub fn kill_slot(a: KillSlotArgs) -> CliResult {
    let mut v = a.volume.load(true, None)?;
    if !v.has_keyslot(a.slot) {
        return Err(CliError::invalid(format!(
            "keyslot {} is not active",
            a.slot
        )));
    }
    if !a.batch_mode {
        // cryptsetup asks before it reads the passphrase.
        if v.active_keyslots() == 1 {
            last_slot(false, a.slot, "wipe")?;
        }
        // Like cryptsetup: prove you hold a key before destroying one.
        let pass = passphrase(&a.key, &prompt(&a.volume.device), false)?;
        v.unlock_key(&pass, None)?;
    }
    Ok(v.kill_keyslot(a.slot)?)
}

/// Run `luks test-passphrase`.
pub fn test_passphrase(a: TestArgs) -> CliResult {
    let v = a.volume.load(false, None)?;
    let pass = passphrase(&a.key, &prompt(&a.volume.device), false)?;
    let slot = v.test_passphrase(&pass, a.key_slot, a.unbound)?;
    println!("Key slot {slot} unlocked.");
    Ok(())
}

/// Run `luks uuid`.
pub fn uuid(a: UuidArgs) -> CliResult {
    let mut v = a.volume.load(a.uuid.is_some(), None)?;
    match &a.uuid {
        Some(new) => Ok(v.set_uuid(new)?),
        None => {
            println!("{}", v.uuid());
            Ok(())
        }
    }
}

/// Run `luks header-backup`.
pub fn header_backup(a: BackupArgs) -> CliResult {
    let v = load(&a.device, None, false, None)?;
    Ok(v.header_backup(&a.header_backup_file)?)
}

/// Run `luks header-restore`: the library words the question, this shell names what else
/// DEVICE seems to hold when data may be lost.
pub fn header_restore(a: BackupArgs) -> CliResult {
    let restore = HeaderRestore::new(&a.device, &a.header_backup_file)?;
    if !a.batch_mode {
        let q = restore.question();
        super::confirm::Confirm {
            batch: false,
            warnings: match q.data_at_risk {
                true => super::confirm::signature_warnings(&a.device, 0)?,
                false => Vec::new(),
            },
            question: q.text,
            action: &format!("restore the header of {}", a.device.display()),
            aborted: "",
            code: 1,
        }
        .ask()?;
    }
    Ok(restore.write()?)
}

/// Run `luks is-luks`: quiet like cryptsetup, exit 0 for a LUKS header (of `--type`), 1 when
/// there is none or it is corrupt, 4 when DEVICE is missing. `-v` prints cryptsetup's lines.
pub fn is_luks(a: IsLuksArgs) -> CliResult {
    let want = wanted_version(&a.luks_type)?;
    let result = match LuksVolume::open(&a.device, None, false, want) {
        Ok(v) if want.is_some_and(|w| w != v.version()) => Err(1),
        Ok(_) => Ok(()),
        Err(e) if e.exit_code() == 4 => {
            eprintln!(
                "Device {} does not exist or access denied.",
                a.device.display()
            );
            Err(4)
        }
        Err(_) => Err(1),
    };
    if a.verbose {
        match result {
            Ok(()) => println!("Command successful."),
            // cryptsetup says this on stdout too.
            Err(4) => println!("Command failed with code -4 (wrong device or file specified)."),
            Err(_) => println!("Command failed with code -1 (wrong or missing parameters)."),
        }
    }
    result.map_err(|code| CliError {
        code,
        message: String::new(),
    })
}
