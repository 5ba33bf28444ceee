//! `dmkit luks format|open|dump|...`, with cryptsetup's option names and argument order, over
//! LUKS2 and LUKS1 headers (the version is read from the header). Key management commands
//! live in `luks_slots.rs`, passphrase input in `luks_keys.rs`.

use super::luks_keys::{passphrase, KeyArgs};
use super::luks_slots;
use super::{CliError, CliResult};
use crate::block::{BlockDevice, FileDevice};
use crate::crypt::luks1;
use crate::crypt::luks2::activate::{ActivateOptions, DataSegment};
use crate::crypt::luks2::integrity as luks2_integrity;
use crate::crypt::luks2::{
    self, dump, keyslot, FormatParams, LuksError, PbkdfKind, PbkdfParams, VolumeKey,
};
use crate::export::ExportSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `dmkit luks` subcommands.
#[derive(clap::Subcommand)]
pub enum LuksCommand {
    /// Write a new LUKS2 (or LUKS1) header and keyslot 0 (like `cryptsetup luksFormat`).
    #[command(alias = "luksFormat")]
    Format(FormatArgs),
    /// Unlock DEVICE and serve the decrypted device at /run/dmkit/NAME (like `cryptsetup open`).
    #[command(alias = "luksOpen")]
    Open(OpenArgs),
    /// Print the header (like `cryptsetup luksDump`).
    #[command(alias = "luksDump")]
    Dump(DumpArgs),
    /// Add a keyslot for a new passphrase (like `cryptsetup luksAddKey`).
    #[command(alias = "luksAddKey")]
    AddKey(luks_slots::AddKeyArgs),
    /// Remove the keyslot the given passphrase opens (like `cryptsetup luksRemoveKey`).
    #[command(alias = "luksRemoveKey")]
    RemoveKey(luks_slots::RemoveKeyArgs),
    /// Replace a passphrase (like `cryptsetup luksChangeKey`).
    #[command(alias = "luksChangeKey")]
    ChangeKey(luks_slots::ChangeKeyArgs),
    /// Wipe one keyslot (like `cryptsetup luksKillSlot`).
    #[command(alias = "luksKillSlot")]
    KillSlot(luks_slots::KillSlotArgs),
    /// Check a passphrase without opening (like `cryptsetup open --test-passphrase`).
    TestPassphrase(luks_slots::TestArgs),
    /// Print or set the UUID (like `cryptsetup luksUUID`).
    #[command(alias = "luksUUID")]
    Uuid(luks_slots::UuidArgs),
    /// Save the header and keyslots to a file (like `cryptsetup luksHeaderBackup`).
    #[command(alias = "luksHeaderBackup")]
    HeaderBackup(luks_slots::BackupArgs),
    /// Write a saved header back (like `cryptsetup luksHeaderRestore`).
    #[command(alias = "luksHeaderRestore")]
    HeaderRestore(luks_slots::BackupArgs),
    /// Tear down an open device (the same as `dmkit close`; like `cryptsetup close`).
    #[command(alias = "luksClose")]
    Close(super::device::CloseArgs),
    /// Show an open device (the same as `dmkit status`; exit 4 when inactive).
    Status(super::device::StatusArgs),
    /// Exit 0 when DEVICE holds a LUKS header, 1 otherwise (like `cryptsetup isLuks`).
    #[command(name = "is-luks", alias = "isLuks")]
    IsLuks(luks_slots::IsLuksArgs),
}

/// cryptsetup's top-level command names (`dmkit luksFormat ...`), flattened into `dmkit`.
// The variants are named after cryptsetup's commands, so they all start with "Luks".
#[allow(clippy::enum_variant_names)]
#[derive(clap::Subcommand)]
pub enum LuksAlias {
    /// Same as `dmkit luks format`.
    #[command(name = "luksFormat", hide = true)]
    LuksFormat(FormatArgs),
    /// Same as `dmkit luks open`.
    #[command(name = "luksOpen", hide = true)]
    LuksOpen(OpenArgs),
    /// Same as `dmkit luks dump`.
    #[command(name = "luksDump", hide = true)]
    LuksDump(DumpArgs),
    /// Same as `dmkit luks add-key`.
    #[command(name = "luksAddKey", hide = true)]
    LuksAddKey(luks_slots::AddKeyArgs),
    /// Same as `dmkit luks remove-key`.
    #[command(name = "luksRemoveKey", hide = true)]
    LuksRemoveKey(luks_slots::RemoveKeyArgs),
    /// Same as `dmkit luks change-key`.
    #[command(name = "luksChangeKey", hide = true)]
    LuksChangeKey(luks_slots::ChangeKeyArgs),
    /// Same as `dmkit luks kill-slot`.
    #[command(name = "luksKillSlot", hide = true)]
    LuksKillSlot(luks_slots::KillSlotArgs),
    /// Same as `dmkit luks uuid`.
    #[command(name = "luksUUID", hide = true)]
    LuksUuid(luks_slots::UuidArgs),
    /// Same as `dmkit luks header-backup`.
    #[command(name = "luksHeaderBackup", hide = true)]
    LuksHeaderBackup(luks_slots::BackupArgs),
    /// Same as `dmkit luks header-restore`.
    #[command(name = "luksHeaderRestore", hide = true)]
    LuksHeaderRestore(luks_slots::BackupArgs),
    /// Same as `dmkit close`.
    #[command(name = "luksClose", hide = true)]
    LuksClose(super::device::CloseArgs),
    /// Same as `dmkit luks is-luks`.
    #[command(name = "isLuks", hide = true)]
    IsLuks(luks_slots::IsLuksArgs),
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
    pub(super) fn params(&self, luks1: bool) -> Result<PbkdfParams, CliError> {
        let kind = match self.pbkdf.as_deref() {
            None if luks1 => PbkdfKind::Pbkdf2,
            None | Some("argon2id") => PbkdfKind::Argon2id,
            Some("argon2i") => PbkdfKind::Argon2i,
            Some("pbkdf2") => PbkdfKind::Pbkdf2,
            Some(o) => {
                return Err(CliError::invalid(format!(
                    "--pbkdf: unknown KDF {o:?} (argon2id, argon2i, pbkdf2)"
                )))
            }
        };
        let mut p = PbkdfParams {
            kind,
            ..PbkdfParams::default()
        };
        if luks1 && kind != PbkdfKind::Pbkdf2 {
            return Err(CliError::invalid("LUKS1 supports only --pbkdf pbkdf2"));
        }
        crate::crypt::luks2::af::message_digest(&self.hash)
            .map_err(|_| CliError::invalid(format!("--hash: unknown hash {:?}", self.hash)))?;
        p.hash = self.hash.clone();
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

/// Arguments of `luks format`.
#[derive(clap::Args)]
pub struct FormatArgs {
    /// Device or image to format.
    device: PathBuf,
    /// Key file with the passphrase of keyslot 0 (same as --key-file).
    key_file_arg: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// luks2 (default) or luks1.
    #[arg(long = "type", short = 'M', default_value = "luks2")]
    luks_type: String,
    /// Data cipher.
    #[arg(long, short = 'c', default_value = "aes-xts-plain64")]
    cipher: String,
    /// Volume key size in bits (default: 512 for XTS, 256 otherwise).
    #[arg(long, short = 's')]
    key_size: Option<u32>,
    /// Encryption sector size (LUKS2; default 4096 when aligned, else 512).
    #[arg(long)]
    sector_size: Option<u32>,
    /// Label (LUKS2).
    #[arg(long)]
    label: Option<String>,
    /// Subsystem (LUKS2).
    #[arg(long)]
    subsystem: Option<String>,
    /// UUID (default: random).
    #[arg(long)]
    uuid: Option<String>,
    /// Put the header in this file instead of on DEVICE (created if missing).
    #[arg(long)]
    header: Option<PathBuf>,
    /// Size of one LUKS2 header copy: 16k, 32k, ..., 4m.
    #[arg(long, value_parser = parse_size)]
    luks2_metadata_size: Option<u64>,
    /// Size of the LUKS2 keyslots area (multiple of 4096).
    #[arg(long, value_parser = parse_size)]
    luks2_keyslots_size: Option<u64>,
    /// Data offset in 512-byte sectors.
    #[arg(long, short = 'o')]
    offset: Option<u64>,
    /// Use the volume key in this file instead of a random one.
    #[arg(long)]
    volume_key_file: Option<PathBuf>,
    /// Do not ask for confirmation (without it, a format asks for YES on a terminal and is
    /// refused without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
    /// Authenticated encryption (LUKS2): hmac-sha256 or hmac-sha512 (with aes-xts-plain64 or
    /// aes-xts-random), aead (aes-gcm-random), poly1305 (chacha20-random), none
    /// (aes-xts-random). A dm-integrity device without internal hash holds the tags.
    #[arg(long, short = 'I')]
    integrity: Option<String>,
    /// With --integrity: accepted as cryptsetup does (it wipes faster without a journal);
    /// dmkit's initialisation writes in place and never goes through the journal.
    #[arg(long, requires = "integrity")]
    integrity_no_journal: bool,
    /// With --integrity: do not initialise the sectors (reading one never written fails).
    #[arg(long, requires = "integrity")]
    integrity_no_wipe: bool,
    /// With --integrity hmac-*: MAC key size in bits (default: the hash's output size).
    #[arg(long, requires = "integrity")]
    integrity_key_size: Option<u32>,
}

/// Arguments of `luks open`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// Device or image.
    device: PathBuf,
    /// Name: the device is served at /run/dmkit/NAME (not needed with --test-passphrase).
    name: Option<String>,
    #[command(flatten)]
    key: KeyArgs,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// Only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// Pass discards to DEVICE.
    #[arg(long)]
    allow_discards: bool,
    /// Serve read-only.
    #[arg(long, short = 'r')]
    read_only: bool,
    /// Check the passphrase and stop.
    #[arg(long)]
    test_passphrase: bool,
    /// With --test-passphrase: keys of keyslots bound to no data segment count too.
    #[arg(long, requires = "test_passphrase", conflicts_with = "key_slot")]
    unbound: bool,
    /// luks, luks1 or luks2 (checked against the header).
    #[arg(long = "type", short = 'M')]
    luks_type: Option<String>,
    /// Also attach a loop device and print it.
    #[arg(long = "loop")]
    loop_device: bool,
    #[command(flatten)]
    nbd: super::nbd::NbdArgs,
    /// Threads serving requests.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Serve in the foreground until interrupted.
    #[arg(long)]
    foreground: bool,
    /// LUKS2 with integrity: open the integrity device without its journal (mode D: no
    /// crash consistency between data and tags).
    #[arg(long)]
    integrity_no_journal: bool,
}

/// Arguments of `luks dump`.
#[derive(clap::Args)]
pub struct DumpArgs {
    /// Device or image (or the header file).
    device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// Print the JSON metadata (LUKS2) or the header as JSON (LUKS1).
    #[arg(long, alias = "dump-json-metadata")]
    json: bool,
    /// Print the volume key (needs the passphrase). Sensitive!
    #[arg(long)]
    dump_volume_key: bool,
    /// Only this keyslot (with --dump-volume-key).
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    #[command(flatten)]
    key: KeyArgs,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// Run a `dmkit luks` subcommand.
pub fn run(c: LuksCommand) -> CliResult {
    match c {
        LuksCommand::Format(a) => format(a),
        LuksCommand::Open(a) => open(a),
        LuksCommand::Dump(a) => dump_cmd(a),
        LuksCommand::AddKey(a) => luks_slots::add_key(a),
        LuksCommand::RemoveKey(a) => luks_slots::remove_key(a),
        LuksCommand::ChangeKey(a) => luks_slots::change_key(a),
        LuksCommand::KillSlot(a) => luks_slots::kill_slot(a),
        LuksCommand::TestPassphrase(a) => luks_slots::test_passphrase(a),
        LuksCommand::Uuid(a) => luks_slots::uuid(a),
        LuksCommand::HeaderBackup(a) => luks_slots::header_backup(a),
        LuksCommand::HeaderRestore(a) => luks_slots::header_restore(a),
        LuksCommand::Close(a) => super::device::close(a),
        LuksCommand::Status(a) => super::device::status(a),
        LuksCommand::IsLuks(a) => luks_slots::is_luks(a),
    }
}

/// Run a cryptsetup-named top-level alias.
pub fn run_alias(c: LuksAlias) -> CliResult {
    run(match c {
        LuksAlias::LuksFormat(a) => LuksCommand::Format(a),
        LuksAlias::LuksOpen(a) => LuksCommand::Open(a),
        LuksAlias::LuksDump(a) => LuksCommand::Dump(a),
        LuksAlias::LuksAddKey(a) => LuksCommand::AddKey(a),
        LuksAlias::LuksRemoveKey(a) => LuksCommand::RemoveKey(a),
        LuksAlias::LuksChangeKey(a) => LuksCommand::ChangeKey(a),
        LuksAlias::LuksKillSlot(a) => LuksCommand::KillSlot(a),
        LuksAlias::LuksUuid(a) => LuksCommand::Uuid(a),
        LuksAlias::LuksHeaderBackup(a) => LuksCommand::HeaderBackup(a),
        LuksAlias::LuksHeaderRestore(a) => LuksCommand::HeaderRestore(a),
        LuksAlias::LuksClose(a) => LuksCommand::Close(a),
        LuksAlias::IsLuks(a) => LuksCommand::IsLuks(a),
    })
}

/// "16384", "16k", "4m", "1M" -> bytes.
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or with k/m/g)"))
}

/// LUKS errors as cryptsetup's exit codes: 2 for a wrong passphrase, 1 otherwise.
pub(super) fn luks_err(e: LuksError) -> CliError {
    CliError {
        code: e.exit_code(),
        message: e.to_string(),
    }
}

/// Open a file as a block device.
pub(super) fn open_file(path: &Path, read_only: bool) -> Result<FileDevice, CliError> {
    super::files::open_device(path, read_only, false)
}

pub(super) use crate::crypt::volume::Header;

/// The device holding the header, and the header.
pub(super) struct Target {
    /// Header device (DEVICE, or --header).
    pub dev: FileDevice,
    /// The header.
    pub header: Header,
    /// Whether the header is detached.
    pub detached: bool,
    /// Held while the header may be written (see [`load`]).
    pub _claim: Option<crate::block::Claim>,
}

/// Read the header of `device` (or of `header`, when detached). One line on stderr when a
/// corrupt copy was skipped.
pub(super) fn load(
    device: &Path,
    header: Option<&Path>,
    writable: bool,
) -> Result<Target, CliError> {
    let (t, warning) = load_quietly(device, header, writable)?;
    if let Some(w) = warning {
        eprintln!("dmkit: {w}");
    }
    Ok(t)
}

/// [`load`] that hands back the warning about a skipped header copy instead of printing it.
pub(super) fn load_quietly(
    device: &Path,
    header: Option<&Path>,
    writable: bool,
) -> Result<(Target, Option<String>), CliError> {
    load_as(device, header, writable, None)
}

/// [`load_quietly`] for `--type`: `want` is 1 or 2 for luks1 or luks2 (see
/// [`Header::read_as`]: the reader of that version, as cryptsetup's `crypt_load` with a type).
pub(super) fn load_as(
    device: &Path,
    header: Option<&Path>,
    writable: bool,
    want: Option<u16>,
) -> Result<(Target, Option<String>), CliError> {
    let path = header.unwrap_or(device);
    if header.is_some() && !device.exists() {
        return Err(CliError::no_device(format!(
            "{}: no such device or file",
            device.display()
        )));
    }
    let dev = open_file(path, !writable)?;
    // A change to the header waits for nobody: refused while another command changes it or
    // a device maps it. The data segment of an open LUKS device is not the header, so keyslots
    // change while it is open, as with cryptsetup. The first 4 KiB hold both copies' start
    // (LUKS2) or the whole binary header (LUKS1): every header writer claims them.
    let claim = if writable {
        Some(super::files::claim(dev.file(), path, 0, 4096, true)?)
    } else {
        None
    };
    let detached = header.is_some();
    let (header, warning) = Header::read_as(&dev, want).map_err(luks_err)?;
    Ok((
        Target {
            dev,
            header,
            detached,
            _claim: claim,
        },
        warning,
    ))
}

impl Target {
    /// Unlock the key of the data segment with `pass` (keyslot `slot` only when given).
    pub(super) fn unlock(
        &self,
        pass: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, VolumeKey), CliError> {
        self.unlock_for(pass, slot, keyslot::Segment::Default)
    }

    /// Check a passphrase the way `open --test-passphrase` does: with `-S N` (or `--unbound`)
    /// any key a keyslot holds counts, bound to the data segment or not (cryptsetup's unbound
    /// keys).
    pub(super) fn test_passphrase(
        &self,
        pass: &[u8],
        slot: Option<u32>,
        unbound: bool,
    ) -> Result<(u32, VolumeKey), CliError> {
        let segment = match (slot, unbound) {
            (Some(_), _) | (None, true) => keyslot::Segment::Any,
            (None, false) => keyslot::Segment::Default,
        };
        self.unlock_for(pass, slot, segment)
    }

    fn unlock_for(
        &self,
        pass: &[u8],
        slot: Option<u32>,
        segment: keyslot::Segment,
    ) -> Result<(u32, VolumeKey), CliError> {
        self.header
            .unlock(&self.dev, pass, slot, segment)
            .map_err(luks_err)
    }

    /// The UUID.
    pub(super) fn uuid(&self) -> &str {
        self.header.uuid()
    }

    /// Data cipher, and data offset in bytes.
    pub(super) fn cipher_and_offset(&self) -> (String, u64) {
        self.header.cipher_and_offset()
    }
}

fn format(a: FormatArgs) -> CliResult {
    let luks1 = match a.luks_type.as_str() {
        "luks2" | "luks" => false,
        "luks1" => true,
        o => {
            return Err(CliError::invalid(format!(
                "--type: {o:?} is not luks2 or luks1"
            )))
        }
    };
    let mut key = a.key.clone();
    if key.key_file.is_none() {
        key.key_file = a.key_file_arg.clone();
    }
    let pbkdf = a.pbkdf.params(luks1)?;
    let integrity = match &a.integrity {
        Some(_) if luks1 => {
            return Err(CliError::invalid(
                "--integrity needs LUKS2 (--type luks2)",
            ))
        }
        Some(_) if a.header.is_some() => {
            return Err(CliError::invalid(
                "--integrity with a detached --header is not supported (the integrity superblock lives on DEVICE at the data offset)",
            ))
        }
        Some(name) => {
            let itype = luks2_integrity::integrity_type(name).map_err(luks_err)?;
            let (kind, vk_len) = luks2_integrity::key_layout(
                &a.cipher,
                itype,
                a.key_size,
                a.integrity_key_size,
            )
            .map_err(luks_err)?;
            Some((itype, kind, vk_len))
        }
        None => None,
    };
    let key_bits = match &integrity {
        Some((_, _, vk_len)) => *vk_len as u32 * 8,
        None => {
            let spec = crate::crypt::cipher::CipherSpec::parse(&a.cipher)
                .map_err(|e| CliError::invalid(format!("--cipher: {e}")))?;
            let key_bits = a.key_size.unwrap_or(spec.default_key_size() as u32 * 8);
            if !key_bits.is_multiple_of(8) || spec.check_key_size(key_bits as usize / 8).is_err() {
                return Err(CliError::invalid(format!(
                    "--key-size: {key_bits} bits is not valid for {}",
                    a.cipher
                )));
            }
            key_bits
        }
    };
    if !a.device.exists() {
        return Err(CliError::no_device(format!(
            "{}: no such device or file",
            a.device.display()
        )));
    }
    // A device in use is not formatted (cryptsetup: "Cannot format device ... in use"): the
    // claim covers the whole device, for as long as this command runs.
    let data = super::files::open_backing(&a.device, a.header.is_some(), false)?;
    let _claim = super::files::claim(data.file(), &a.device, 0, 0, a.header.is_none())?;
    let hdr_path = a.header.as_deref().unwrap_or(&a.device);
    // luksFormat names what the header device holds and always asks (before the passphrase).
    super::confirm::Confirm {
        batch: a.batch_mode,
        warnings: super::confirm::signature_warnings(hdr_path, 0)?,
        question: super::confirm::overwrite_question(hdr_path),
        action: &format!("format {}", hdr_path.display()),
        aborted: "Operation aborted.",
        code: 1,
    }
    .ask()?;
    let volume_key = match &a.volume_key_file {
        Some(f) => Some(VolumeKey::new(std::fs::read(f).map_err(|e| {
            CliError::invalid(format!("{}: cannot read volume key: {e}", f.display()))
        })?)),
        None => None,
    };
    let pass = passphrase(
        &key,
        &format!("Enter passphrase for {}: ", a.device.display()),
        true,
    )?;
    if luks1 {
        if a.header.is_some()
            || a.sector_size.is_some_and(|s| s != 512)
            || a.label.is_some()
            || volume_key.is_some()
        {
            return Err(CliError::invalid("LUKS1 has no --header, --sector-size, --label or --volume-key-file here; use --type luks2"));
        }
        let uuid = a.uuid.clone().unwrap_or_else(luks2::format::random_uuid);
        if !luks2::format::valid_uuid(&uuid) {
            return Err(CliError::invalid(format!("--uuid {uuid:?} is not a UUID")));
        }
        let payload = a
            .offset
            .map(|o| {
                u32::try_from(o).map_err(|_| CliError::invalid("--offset is too large for LUKS1"))
            })
            .transpose()?;
        luks1::format(
            &data,
            &a.cipher,
            key_bits / 8,
            &pbkdf.hash,
            &uuid,
            pbkdf.force_iterations,
            pbkdf.iter_time_ms,
            payload,
            &pass,
        )
        .map_err(luks_err)?;
        return Ok(());
    }
    let p = FormatParams {
        cipher: a.cipher.clone(),
        key_size: key_bits as usize / 8,
        pbkdf,
        sector_size: a.sector_size,
        label: a.label.clone().unwrap_or_default(),
        subsystem: a.subsystem.clone().unwrap_or_default(),
        uuid: a.uuid.clone(),
        metadata_size: a.luks2_metadata_size.unwrap_or(16 << 10),
        keyslots_size: a.luks2_keyslots_size,
        data_offset: a.offset.map(|o| o.saturating_mul(512)),
        detached: a.header.is_some(),
        volume_key,
        integrity: integrity.map(|(t, _, _)| t.to_string()),
    };
    let data_size = data.size();
    let (hdr_dev, _header_claim) = match &a.header {
        Some(h) => {
            // A detached header file is created, and grown to hold headers and keyslots.
            let need = 2 * p.metadata_size
                + p.keyslots_size
                    .unwrap_or(luks2::format::DEFAULT_DATA_OFFSET - 2 * p.metadata_size);
            // A new one is created owner-only (it holds the keyslots), as cryptsetup does; an
            // existing file or device is used as it is.
            let cannot =
                |e| CliError::no_device(format!("{}: cannot create header file: {e}", h.display()));
            let f = match super::secret_files::create_new(h, super::secret_files::HEADER_MODE) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(h)
                        .map_err(cannot)?
                }
                Err(e) => return Err(cannot(e)),
            };
            let claim = super::files::claim(&f, h, 0, 0, true)?;
            let meta = f.metadata().map_err(|e| CliError::invalid(e.to_string()))?;
            if meta.is_file() && meta.len() < need {
                f.set_len(need)
                    .map_err(|e| CliError::invalid(format!("{}: {e}", h.display())))?;
            }
            (open_file(h, false)?, Some(claim))
        }
        None => (data, None),
    };
    // Every check first: a refused format writes nothing.
    let prepared = luks2::format::prepare(&hdr_dev, data_size, &p).map_err(luks_err)?;
    if let Some((_, kind, _)) = integrity {
        format_integrity(&a.device, &hdr_dev, &prepared, kind, !a.integrity_no_wipe)?;
    }
    luks2::format::write(&hdr_dev, prepared, &p, &pass).map_err(luks_err)?;
    Ok(())
}

/// The integrity half of `luksFormat --integrity`, between the checks and the header: the
/// old header goes first (a format cut short leaves no header that opens), then the
/// integrity superblock and journal, then (with `wipe`) every sector sealed with the volume
/// key the header will hold.
fn format_integrity(
    path: &Path,
    dev: &FileDevice,
    prepared: &luks2::format::Prepared,
    kind: crate::crypt::cipher::AeadKind,
    wipe: bool,
) -> CliResult {
    let seg = prepared
        .header
        .metadata
        .segments
        .get(&0)
        .ok_or_else(|| CliError::invalid("the new header has no data segment"))?;
    let plan =
        luks2_integrity::plan(kind, seg.sector_size, dev.size(), seg.offset).map_err(luks_err)?;
    luks2::keyslot::wipe(dev, 0, prepared.metadata_end).map_err(luks_err)?;
    let mut progress = super::integrity::progress_printer("Wiping");
    // The sealed sectors bypass the page cache where the storage allows O_DIRECT (tmpfs and
    // a few others do not).
    let direct = super::files::open_backing(path, false, true).ok();
    let to = luks2_integrity::FormatTarget {
        dev,
        direct: direct.as_ref().map(|d| d as &dyn BlockDevice),
    };
    luks2_integrity::format(
        to,
        seg.offset,
        &plan,
        kind,
        &prepared.volume_key,
        wipe,
        &mut progress,
    )
    .map_err(luks_err)?;
    Ok(())
}

fn open(a: OpenArgs) -> CliResult {
    if let Some(t) = a
        .luks_type
        .as_deref()
        .filter(|t| !matches!(*t, "luks" | "luks1" | "luks2"))
    {
        return Err(CliError::invalid(format!(
            "--type: {t:?} is not luks, luks1 or luks2"
        )));
    }
    let (name, nbd) = match (&a.name, a.test_passphrase) {
        (_, true) => (None, None),
        (Some(n), false) => {
            super::device::prepare_open(n, a.loop_device)?;
            (Some(n.clone()), a.nbd.config(a.loop_device)?)
        }
        (None, false) => return Err(CliError::invalid("missing NAME (or use --test-passphrase)")),
    };
    let want = match a.luks_type.as_deref() {
        Some("luks1") => Some(1),
        Some("luks2") => Some(2),
        _ => None,
    };
    let (t, warning) = load_as(&a.device, a.header.as_deref(), false, want)?;
    if let Some(w) = warning {
        eprintln!("dmkit: {w}");
    }
    let read_only = a.read_only || a.test_passphrase;
    let data = super::files::open_backing(&a.device, read_only, false)?;
    let seg = data_segment(&t, &data)?;
    // The data segment only: keyslot changes (the header area) stay possible while it is open,
    // as with cryptsetup.
    let claim = super::files::claim(data.file(), &a.device, seg.offset, seg.size, !read_only)?;
    let pass = passphrase(
        &a.key,
        &format!("Enter passphrase for {}: ", a.device.display()),
        false,
    )?;
    let (slot, vk) = if a.test_passphrase {
        t.test_passphrase(&pass, a.key_slot, a.unbound)?
    } else {
        t.unlock(&pass, a.key_slot)?
    };
    drop(pass);
    let Some(name) = name else {
        println!("Key slot {slot} unlocked.");
        return Ok(());
    };
    let opts = ActivateOptions {
        name: name.clone(),
        allow_discards: a.allow_discards,
        read_only: a.read_only,
    };
    let iopts = luks2_integrity::IntegrityActivation {
        no_journal: a.integrity_no_journal,
    };
    let active = crate::crypt::volume::activate(&seg, Arc::new(data), &vk, &opts, &iopts)
        .map_err(luks_err)?;
    drop(vk);
    let size = active.device.size();
    let details = serde_json::json!({
        "type": t.header.type_name(),
        "uuid": t.uuid(),
        "cipher": seg.cipher,
        "keysize_bits": t.header.key_bits(),
        "key_location": "memory",
        "device": absolute(&a.device),
        "header": a.header.as_deref().map(absolute),
        "offset_sectors": seg.offset / 512,
        "size_sectors": size / 512,
        "sector_size": seg.sector_size,
        "integrity": seg.integrity,
        "integrity_mode": seg.integrity.as_ref().map(|_| match (a.read_only, a.integrity_no_journal) {
            (true, _) => "R",
            (false, true) => "D",
            (false, false) => "J",
        }),
        "keyslot": slot,
    });
    let spec = ExportSpec {
        fuse: a.nbd.fuse(),
        nbd,
        name,
        device: active.device,
        kind: "crypt".to_string(),
        loop_device: a.loop_device,
        direct_io_loop: true,
        allow_discards: a.allow_discards || seg.allow_discards,
        threads: a.threads.max(1),
        details,
        stats: Some(active.stats),
        claims: vec![claim],
    };
    super::device::open_export(spec, a.foreground)
}

/// A path as status shows it: absolute, resolved when it exists.
fn absolute(p: &Path) -> String {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// The data segment of `t` on `data`, checked.
pub(super) fn data_segment(t: &Target, data: &FileDevice) -> Result<DataSegment, CliError> {
    t.header
        .data_segment(data.name(), data.size(), t.detached)
        .map_err(luks_err)
}

fn dump_cmd(a: DumpArgs) -> CliResult {
    let t = load(&a.device, a.header.as_deref(), false)?;
    if a.dump_volume_key {
        let pass = passphrase(
            &a.key,
            &format!("Enter passphrase for {}: ", a.device.display()),
            false,
        )?;
        let (_, vk) = t.unlock(&pass, a.key_slot)?;
        let head = match &t.header {
            Header::V2(h) => dump::luks2_volume_key_header(h),
            Header::V1(h) => dump::VolumeKeyHeader {
                cipher: Some(h.cipher_name.clone()),
                mode: Some(h.cipher_mode.clone()),
                payload_sectors: h.payload_offset as u64,
            },
        };
        print!(
            "{}",
            dump::volume_key_text(&a.device.display().to_string(), &head, t.uuid(), &vk)
        );
        return Ok(());
    }
    match (&t.header, a.json) {
        (Header::V2(h), true) => println!("{:#}", h.metadata.to_value()),
        (Header::V2(h), false) => {
            use std::io::Write;
            // Bytes, not text: cryptsetup prints metadata strings as they are.
            let mut out = std::io::stdout().lock();
            out.write_all(&dump::text(h))
                .and_then(|_| out.flush())
                .map_err(|e| CliError::invalid(format!("cannot write the dump: {e}")))?;
        }
        (Header::V1(h), true) => println!("{:#}", luks1::dump_json(h)),
        (Header::V1(h), false) => {
            use std::io::Write;
            let text = luks1::dump_text(h, &a.device.display().to_string());
            let mut out = std::io::stdout().lock();
            out.write_all(&text)
                .and_then(|_| out.flush())
                .map_err(|e| CliError::invalid(format!("cannot write the dump: {e}")))?;
        }
    }
    Ok(())
}
