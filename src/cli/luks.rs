//! `dmkit luks format|open|dump|...`, with cryptsetup's option names and argument order, over
//! LUKS2 and LUKS1 headers (the version is read from the header). The library's
//! [`crate::crypt::luks::LuksVolume`] does the work; this shell parses arguments, reads
//! passphrases, asks before destroying anything and prints. Key management commands live in
//! `luks_slots.rs`, passphrase input in `passphrase.rs`.

use super::luks_slots::{self, load, PbkdfArgs};
use super::passphrase::{passphrase, KeyArgs};
use super::{CliError, CliResult};
use crate::crypt::luks::{version_named, ActivateParams, FormatSpec, Formatter, IntegritySpec};
use std::path::PathBuf;

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
    /// Convert the header between LUKS1 and LUKS2 in place (like `cryptsetup convert`).
    Convert(super::luks_admin::ConvertArgs),
    /// Store a keyslot again with new KDF parameters (like `cryptsetup luksConvertKey`).
    #[command(alias = "luksConvertKey")]
    ConvertKey(super::luks_admin::ConvertKeyArgs),
    /// Wipe all keyslots (like `cryptsetup erase`).
    #[command(alias = "luksErase")]
    Erase(super::luks_admin::EraseArgs),
    /// Set the label, subsystem or a keyslot's priority (LUKS2; like `cryptsetup config`).
    Config(super::luks_admin::ConfigArgs),
    /// Add, remove, import or export LUKS2 tokens (like `cryptsetup token`).
    Token(super::luks_admin::TokenArgs),
    /// Grow or shrink an open device (like `cryptsetup resize`; plain devices too).
    Resize(super::luks_online::ResizeArgs),
    /// Wipe the volume key of an open device from memory and hold its I/O (like
    /// `cryptsetup luksSuspend`).
    #[command(alias = "luksSuspend")]
    Suspend(super::luks_online::SuspendArgs),
    /// Unlock a suspended device again and let its I/O through (like `cryptsetup luksResume`).
    #[command(alias = "luksResume")]
    Resume(super::luks_online::ResumeArgs),
    /// Re-read the header and re-apply the activation flags of an open device (like
    /// `cryptsetup refresh`).
    Refresh(super::luks_online::RefreshArgs),
    /// Re-key a LUKS2 device or change its cipher, offline and resumable by cryptsetup (like
    /// `cryptsetup reencrypt --force-offline-reencrypt`).
    Reencrypt(super::luks_reencrypt::ReencryptArgs),
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
    #[arg(long, value_parser = crate::bench::parse_size)]
    luks2_metadata_size: Option<u64>,
    /// Size of the LUKS2 keyslots area (multiple of 4096).
    #[arg(long, value_parser = crate::bench::parse_size)]
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
    #[command(flatten)]
    volume: luks_slots::VolumeArgs,
    /// Name: the device is served at /run/dmkit/NAME (not needed with --test-passphrase).
    name: Option<String>,
    #[command(flatten)]
    key: KeyArgs,
    /// Only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// Pass discards to DEVICE.
    #[arg(long)]
    allow_discards: bool,
    /// Serve read-only.
    #[arg(long, short = 'r', alias = "readonly")]
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
    #[command(flatten)]
    serve: super::device::ServeArgs,
    /// LUKS2 with integrity: open the integrity device without its journal (mode D: no
    /// crash consistency between data and tags).
    #[arg(long)]
    integrity_no_journal: bool,
    /// Unlock only with a token (the luks2-keyring token: the passphrase from the kernel
    /// keyring); without it, tokens are tried first when no key file is given.
    #[arg(long)]
    token_only: bool,
    /// Only this token.
    #[arg(long)]
    token_id: Option<u32>,
    /// Store --allow-discards and --integrity-no-journal in the LUKS2 header (replacing the
    /// flags stored before), so that every later open uses them.
    #[arg(long)]
    persistent: bool,
    /// Only tokens of this type (luks2-keyring is the built-in one).
    #[arg(long)]
    token_type: Option<String>,
    /// When DEVICE is an https://, http:// or s3:// URL (with --readonly): how it is fetched.
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
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
    /// When DEVICE is an https://, http:// or s3:// URL: how it is fetched.
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
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
        LuksCommand::Convert(a) => super::luks_admin::convert(a),
        LuksCommand::ConvertKey(a) => super::luks_admin::convert_key(a),
        LuksCommand::Erase(a) => super::luks_admin::erase(a),
        LuksCommand::Config(a) => super::luks_admin::config(a),
        LuksCommand::Token(a) => super::luks_admin::token(a),
        LuksCommand::Resize(a) => super::luks_online::resize(a),
        LuksCommand::Suspend(a) => super::luks_online::suspend(a),
        LuksCommand::Resume(a) => super::luks_online::resume(a),
        LuksCommand::Refresh(a) => super::luks_online::refresh(a),
        LuksCommand::Reencrypt(a) => super::luks_reencrypt_online::dispatch(a),
    }
}

fn format(a: FormatArgs) -> CliResult {
    let luks1 = version_named(&a.luks_type)? == Some(1);
    let key = a.key.or_positional(&a.key_file_arg);
    let spec = FormatSpec {
        device: a.device.clone(),
        header: a.header.clone(),
        luks1,
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        pbkdf: a.pbkdf.params(luks1)?,
        sector_size: a.sector_size,
        label: a.label.clone(),
        subsystem: a.subsystem.clone(),
        uuid: a.uuid.clone(),
        metadata_size: a.luks2_metadata_size,
        keyslots_size: a.luks2_keyslots_size,
        offset: a.offset,
        integrity: a.integrity.clone().map(|name| IntegritySpec {
            name,
            key_bits: a.integrity_key_size,
            no_wipe: a.integrity_no_wipe,
        }),
    };
    let formatter = Formatter::new(spec)?;
    let hdr_path = formatter.header_path().to_path_buf();
    // luksFormat names what the header device holds and always asks (before the passphrase).
    super::confirm::Confirm {
        batch: a.batch_mode,
        warnings: super::confirm::signature_warnings(&hdr_path, 0)?,
        question: super::confirm::overwrite_question(&hdr_path),
        action: &format!("format {}", hdr_path.display()),
        aborted: "Operation aborted.",
        code: 1,
    }
    .ask()?;
    let volume_key = match &a.volume_key_file {
        Some(f) => Some(super::luks_compat::read_volume_key(
            f,
            formatter.key_bytes(),
        )?),
        None => None,
    };
    let pass = passphrase(&key, &luks_slots::prompt(&a.device), true)?;
    let mut progress = super::integrity::progress_printer("Wiping");
    if let Some(w) = formatter.format(&pass, volume_key, &mut progress)? {
        println!("{w}");
    }
    Ok(())
}

fn open(a: OpenArgs) -> CliResult {
    let want = luks_slots::wanted_version(&a.luks_type)?;
    if let Some(loc) = super::luks_remote::remote(&a.volume.device)? {
        if a.volume.header.is_some() || a.persistent || a.allow_discards || a.token_only {
            return Err(CliError::invalid(format!(
                "{loc}: --header, --persistent, --allow-discards and --token-only are not \
                 available for a remote device"
            )));
        }
        return super::luks_remote::open(super::luks_remote::OpenRemote {
            loc,
            name: a.name.clone(),
            read_only: a.read_only,
            key_slot: a.key_slot,
            want,
            key: &a.key,
            serve: &a.serve,
            remote: &a.remote,
        });
    }
    let serving = match (&a.name, a.test_passphrase) {
        (_, true) => None,
        (Some(n), false) => Some((n.clone(), a.serve.prepare(n)?)),
        (None, false) => return Err(CliError::invalid("missing NAME (or use --test-passphrase)")),
    };
    let v = a.volume.load(false, want)?;
    let data = v.data(a.read_only || a.test_passphrase)?;
    let params = |name: String| ActivateParams {
        name,
        allow_discards: a.allow_discards,
        read_only: a.read_only,
        integrity_no_journal: a.integrity_no_journal,
    };
    if let Some(key) = super::luks_admin::token_key(
        &v,
        &a.key,
        a.token_only,
        a.token_id,
        a.token_type.as_deref(),
    )? {
        let Some((name, how)) = serving else {
            println!("Key slot {} unlocked.", key.slot());
            return Ok(());
        };
        let active = v.activate_unlocked(data, key, &params(name))?;
        persist(&a, want);
        return a.serve.serve(active, how);
    }
    let pass = passphrase(&a.key, &luks_slots::prompt(&a.volume.device), false)?;
    let Some((name, how)) = serving else {
        let slot = v.test_passphrase(&pass, a.key_slot, a.unbound)?;
        println!("Key slot {slot} unlocked.");
        return Ok(());
    };
    let active = v.activate(data, &pass, a.key_slot, &params(name))?;
    drop(pass);
    persist(&a, want);
    a.serve.serve(active, how)
}

/// `open --persistent`, after the activation as with cryptsetup: a failure leaves the device
/// open and is one line on stderr. The header is claimed only for this write, so keyslots
/// still change while the device is served.
fn persist(a: &OpenArgs, want: Option<u16>) {
    if !a.persistent {
        return;
    }
    let r = a.volume.load(true, want).and_then(|mut w| {
        w.set_persistent_flags(a.allow_discards, a.integrity_no_journal)
            .map_err(Into::into)
    });
    if let Err(e) = r {
        eprintln!(
            "Device activated but cannot make flags persistent. ({})",
            e.message
        );
    }
}

fn dump_cmd(a: DumpArgs) -> CliResult {
    if let Some(loc) = super::luks_remote::remote(&a.device)? {
        if a.header.is_some() || a.dump_volume_key {
            return Err(CliError::invalid(format!(
                "{loc}: --header and --dump-volume-key are not available for a remote device"
            )));
        }
        return super::luks_remote::dump(&loc, &a.remote, a.json);
    }
    let v = load(&a.device, a.header.as_deref(), false, None)?;
    if a.dump_volume_key {
        let pass = passphrase(&a.key, &luks_slots::prompt(&a.device), false)?;
        print!("{}", v.dump_volume_key(&pass, a.key_slot)?);
        return Ok(());
    }
    super::luks_dump::print_dump(a.json, || v.dump_json(), || v.dump_text())
}
