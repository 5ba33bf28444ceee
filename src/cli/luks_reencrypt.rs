//! `dmkit luks reencrypt` (cryptsetup's `reencrypt`, offline): re-key a LUKS2 device or change
//! its cipher, key size or sector size (`--keep-key`: under the same volume key;
//! `--volume-key-file`: to a given one; `--device-size`: only the data's first bytes), encrypt a plaintext device under a new detached header
//! (`--encrypt --header`), decrypt a device with a detached header (`--decrypt`); resumable
//! by cryptsetup and resuming what cryptsetup started. The library does the work and keeps the keys; here the options, passphrases, the
//! question before resuming and the progress display (a line on a terminal with rate and
//! estimate, or `--progress-json` lines on stdout).

use super::confirm::Confirm;
use super::luks_decrypt_export::{decrypt_header, Export};
use super::luks_slots::{PbkdfArgs, VolumeArgs};
use super::passphrase::{is_tty, passphrase, KeyArgs, Passphrase};
use super::{CliError, CliResult};
use crate::crypt::cipher::CipherSpec;
use crate::crypt::luks::LuksVolume;
use crate::crypt::luks2::reencrypt::RunOutcome;
use crate::crypt::luks2::reencrypt::{
    InitParams, NewKey, NewKeyslot, Progress, Resilience, RunOptions,
};
use crate::crypt::luks2::FormatParams;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Arguments of `luks reencrypt`.
#[derive(clap::Args)]
pub struct ReencryptArgs {
    #[command(flatten)]
    pub(super) volume: VolumeArgs,
    #[command(flatten)]
    pub(super) key: KeyArgs,
    /// New data cipher (default: the current one).
    #[arg(long, short = 'c')]
    cipher: Option<String>,
    /// New volume key size in bits (default: the current one, or the cipher's default when
    /// the cipher changes).
    #[arg(long, short = 's')]
    key_size: Option<u32>,
    /// New encryption sector size (default: the current one).
    #[arg(long)]
    sector_size: Option<u32>,
    /// Hotzone protection: checksum (default), journal or none (--decrypt of a device whose
    /// header is at its start: checksum or journal protect the moved first segment).
    #[arg(long)]
    resilience: Option<String>,
    /// Hash of the checksum resilience.
    #[arg(long, default_value = "sha256")]
    resilience_hash: String,
    /// Largest hotzone in bytes (suffixes k, M, G; a multiple of the hotzone alignment).
    #[arg(long, value_parser = parse_size)]
    pub(super) hotzone_size: Option<u64>,
    /// Only write the reencryption metadata (resume later with --resume-only).
    #[arg(long, conflicts_with = "resume_only")]
    pub(super) init_only: bool,
    /// Only resume a reencryption already initialized.
    #[arg(long)]
    pub(super) resume_only: bool,
    /// Only re-key this keyslot (and use it to unlock).
    #[arg(long, short = 'S')]
    pub(super) key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Do not ask before resuming.
    #[arg(long, short = 'q')]
    pub(super) batch_mode: bool,
    /// Progress as JSON lines on stdout.
    #[arg(long, alias = "json")]
    pub(super) progress_json: bool,
    /// Accepted for cryptsetup's command lines: dmkit reencrypts offline always.
    #[arg(long)]
    force_offline_reencrypt: bool,
    /// Encrypt a plaintext device in place, its new LUKS2 header in the --header file.
    #[arg(long, conflicts_with = "decrypt")]
    encrypt: bool,
    /// Decrypt a LUKS2 device whose header is detached (--header), in place.
    #[arg(long)]
    pub(super) decrypt: bool,
    /// With --encrypt and no --header: give up this many bytes at the device's end (at most
    /// 1 GiB, whole 512-byte sectors); half of it becomes the LUKS2 header at the start and
    /// the data moves by that half while it is encrypted. With --header: the header file's
    /// size (16 KiB metadata copies, the rest keyslots), the data encrypted in place
    /// backward, this many bytes at a time.
    #[arg(long, value_parser = parse_reduce)]
    reduce_device_size: Option<u64>,
    /// The new volume key from this file instead of a random one (--encrypt, or a re-key;
    /// the current volume key keeps it, as --keep-key).
    #[arg(long)]
    volume_key_file: Option<std::path::PathBuf>,
    /// Keep the volume key: change only the cipher or the sector size (no keyslot added).
    #[arg(long)]
    keep_key: bool,
    /// Reencrypt only this many bytes of data from its start (suffixes k, M, G); the rest is
    /// left as it is. DANGEROUS: the segment still spans the whole device when done.
    #[arg(long, value_parser = parse_device_size)]
    pub(super) device_size: Option<u64>,
    /// With --encrypt: the header's type (luks2 only).
    #[arg(long = "type", short = 'M', value_name = "TYPE")]
    kind: Option<String>,
}

/// A byte count with an optional binary suffix (k, M, G, T; cryptsetup's sizes).
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_lowercase() {
                'k' => 1u64 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => return Err(format!("{s:?}: unknown size suffix {c:?}")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size"))
}

/// `--reduce-device-size`: cryptsetup's limits, its messages.
fn parse_reduce(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if n > 1 << 30 {
        return Err("Maximum device reduce size is 1 GiB.".into());
    }
    if n % 512 != 0 {
        return Err("Reduce size must be multiple of 512 bytes sector.".into());
    }
    Ok(n)
}

/// `--device-size`: cryptsetup's checks, its messages.
fn parse_device_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("invalid numeric value".into()),
        n if n % 512 != 0 => Err("Device size must be multiple of 512 bytes sector.".into()),
        n => Ok(n),
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM stop the run at the next hotzone boundary, with metadata to resume.
fn catch_signals() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

fn resilience(a: &ReencryptArgs) -> Result<Resilience, CliError> {
    match a.resilience.as_deref().unwrap_or("checksum") {
        "checksum" => Ok(Resilience::Checksum {
            hash: a.resilience_hash.clone(),
            sector_size: 0,
        }),
        "journal" => Ok(Resilience::Journal),
        "none" => Ok(Resilience::None),
        o => Err(CliError::invalid(format!(
            "Unsupported resilience mode {o}"
        ))),
    }
}

/// `--key-size` in bytes, `default` without it.
fn key_bytes(a: &ReencryptArgs, default: usize) -> Result<usize, CliError> {
    match a.key_size {
        Some(bits) if bits % 8 == 0 => Ok(bits as usize / 8),
        Some(bits) => Err(CliError::invalid(format!(
            "--key-size {bits} is not a multiple of 8"
        ))),
        None => Ok(default),
    }
}

fn prompt_for(slot: u32) -> String {
    format!("Enter passphrase for key slot {slot}: ")
}

/// Initialize the reencryption; the passphrase of the keyslot used to unlock for the run.
pub(super) fn init(
    a: &ReencryptArgs,
    v: &mut LuksVolume,
    served: bool,
) -> Result<Passphrase, CliError> {
    let seg = v.segment_params()?;
    let cipher = a.cipher.clone().unwrap_or_else(|| seg.cipher.clone());
    let spec = CipherSpec::parse(&cipher).map_err(|e| {
        CliError::invalid(format!(
            "No known cipher specification pattern detected ({e})."
        ))
    })?;
    let default = if cipher != seg.cipher {
        spec.default_key_size()
    } else {
        seg.key_size
    };
    let key_size = match a.key_size {
        Some(bits) if a.keep_key && bits as usize != seg.key_size * 8 => {
            return Err(CliError::invalid(format!(
                "--keep-key keeps the {}-bit volume key: --key-size {bits} cannot change it.",
                seg.key_size * 8
            )))
        }
        _ if a.keep_key => seg.key_size,
        _ => key_bytes(a, default)?,
    };
    let new_key = match &a.volume_key_file {
        _ if a.keep_key => NewKey::Keep,
        Some(f) => NewKey::Given(super::luks_compat::read_volume_key(f, key_size)?),
        None => NewKey::Random,
    };
    let sector_size = a.sector_size.unwrap_or(seg.sector_size);
    let keep = v.reencrypt_keeps_key(&new_key)?;
    if keep && cipher == seg.cipher && sector_size == seg.sector_size {
        return Err(CliError::invalid(
            "No data segment parameters changed. Reencryption aborted.",
        ));
    }
    let mut slots = match a.key_slot {
        Some(s) => vec![s],
        None => v.data_keyslots()?,
    };
    // cryptsetup asks for the first keyslot's passphrase only when the key stays.
    if keep {
        slots.truncate(1);
    }
    if slots.len() > 1 && (a.key.key_file.is_some() || !is_tty(0)) {
        return Err(CliError::invalid(
            "Key file can be used only with --key-slot or with exactly one key slot active.",
        ));
    }
    let passes = slots
        .iter()
        .map(|&s| passphrase(&a.key, &prompt_for(s), false))
        .collect::<Result<Vec<_>, _>>()?;
    let new: Vec<NewKeyslot<'_>> = slots
        .iter()
        .zip(&passes)
        .map(|(&old, p)| NewKeyslot { old, passphrase: p })
        .collect();
    let pb = &a.pbkdf;
    let custom = pb.pbkdf.is_some()
        || pb.pbkdf_force_iterations.is_some()
        || pb.pbkdf_memory.is_some()
        || pb.pbkdf_parallel.is_some();
    let params = InitParams {
        cipher,
        key_size,
        sector_size,
        resilience: resilience(a)?,
        pbkdf: if custom {
            Some(pb.params(false)?)
        } else {
            None
        },
        io_block: 0,
        hash: pb.hash.clone(),
        benchmark_digest: pb.pbkdf_force_iterations.is_none(),
        new_key,
        device_size: a.device_size,
    };
    if served {
        v.reencrypt_init_served(&new, &params)?;
    } else {
        v.reencrypt_init(&new, &params)?;
    }
    Ok(passes.into_iter().next().expect("at least one keyslot"))
}

/// The new LUKS2 header of `--encrypt`: cryptsetup's defaults (aes-xts-plain64, the cipher's
/// key size, 512-byte sectors).
fn encrypt_format(a: &ReencryptArgs) -> Result<FormatParams, CliError> {
    let cipher = a
        .cipher
        .clone()
        .unwrap_or_else(|| "aes-xts-plain64".to_string());
    let spec = CipherSpec::parse(&cipher).map_err(|e| {
        CliError::invalid(format!(
            "No known cipher specification pattern detected ({e})."
        ))
    })?;
    let key_size = key_bytes(a, spec.default_key_size())?;
    let volume_key = match &a.volume_key_file {
        Some(f) => Some(super::luks_compat::read_volume_key(f, key_size)?),
        None => None,
    };
    Ok(FormatParams {
        cipher,
        key_size,
        volume_key,
        pbkdf: a.pbkdf.params(false)?,
        sector_size: Some(a.sector_size.unwrap_or(512)),
        ..FormatParams::default()
    })
}

/// What protects the hotzones of an encryption or decryption started here.
pub(super) fn init_params(a: &ReencryptArgs) -> Result<InitParams, CliError> {
    Ok(InitParams {
        cipher: String::new(),
        key_size: 0,
        sector_size: 512,
        resilience: resilience(a)?,
        pbkdf: None,
        io_block: 0,
        hash: a.pbkdf.hash.clone(),
        benchmark_digest: a.pbkdf.pbkdf_force_iterations.is_none(),
        new_key: NewKey::Random,
        device_size: a.device_size,
    })
}

/// `--encrypt`: the header written (unless a reencryption is already in it), and the volume
/// with the passphrase to run it; `None` after `--init-only`.
fn start_encrypt(a: &ReencryptArgs) -> Result<Option<(LuksVolume, Passphrase)>, CliError> {
    if a.kind.as_deref().is_some_and(|t| t != "luks2") {
        return Err(CliError::invalid(
            "dmkit encrypts in place into LUKS2 only (--type luks2).",
        ));
    }
    let Some(header) = a.volume.header.as_deref() else {
        let Some(reduce) = a.reduce_device_size.filter(|&r| r > 0) else {
            return Err(CliError::invalid(
                "Encryption without detached header (--header) is not possible without data device size reduction (--reduce-device-size).",
            ));
        };
        return start_encrypt_shift(a, reduce);
    };
    let resuming = header.exists() && in_reencryption(a, Some(header));
    begin_encrypt(a, resuming, |pass| {
        let (format, params) = (encrypt_format(a)?, init_params(a)?);
        let device = &a.volume.device;
        match a.reduce_device_size.filter(|&r| r > 0) {
            // cryptsetup 2.6.1: a header as large as the reduction, the data left in place.
            Some(reduce) => crate::crypt::luks::encrypt_init_in_place(
                device, header, reduce, &format, pass, &params,
            ),
            None => crate::crypt::luks::encrypt_init(device, header, &format, pass, &params),
        }
        .map_err(CliError::from)
    })
}

/// Whether the device (its header in `header` when detached) is in reencryption.
fn in_reencryption(a: &ReencryptArgs, header: Option<&std::path::Path>) -> bool {
    LuksVolume::open(&a.volume.device, header, false, Some(2))
        .ok()
        .and_then(|v| v.reencryption().ok().flatten())
        .is_some()
}

/// The rest of an `--encrypt` start: nothing when resuming, else the passphrase asked twice,
/// `init` with it, and the volume to run unless `--init-only`.
fn begin_encrypt(
    a: &ReencryptArgs,
    resuming: bool,
    init: impl FnOnce(&Passphrase) -> Result<(), CliError>,
) -> Result<Option<(LuksVolume, Passphrase)>, CliError> {
    if resuming || a.resume_only {
        return Ok(None);
    }
    let device = a.volume.device.display().to_string();
    let pass = passphrase(&a.key, &format!("Enter passphrase for {device}: "), true)?;
    init(&pass)?;
    if a.init_only {
        return Ok(None);
    }
    Ok(Some((a.volume.load(true, Some(2))?, pass)))
}

/// `--encrypt --reduce-device-size` without `--header`: the data shifted to make room for the
/// header at the device's start; a device already in that reencryption is resumed.
fn start_encrypt_shift(
    a: &ReencryptArgs,
    reduce: u64,
) -> Result<Option<(LuksVolume, Passphrase)>, CliError> {
    begin_encrypt(a, in_reencryption(a, None), |pass| {
        crate::crypt::luks::encrypt_init_shift(
            &a.volume.device,
            reduce,
            &encrypt_format(a)?,
            pass,
            &init_params(a)?,
        )
        .map_err(CliError::from)
    })
}

/// Run `luks reencrypt`.
pub fn reencrypt(a: ReencryptArgs) -> CliResult {
    let device = a.volume.device.display().to_string();
    if a.reduce_device_size.is_some() && a.device_size.is_some() {
        return Err(CliError::invalid(
            "Options --reduce-device-size and --data-size cannot be combined.",
        ));
    }
    let exporting = a.decrypt && a.volume.header.as_deref().is_some_and(|h| !h.exists());
    if exporting && a.device_size.is_some() {
        return Err(CliError::invalid(
            "dmkit decrypts a device whose header moves out whole: no --device-size with it.",
        ));
    }
    if a.encrypt {
        if let Some((v, pass)) = start_encrypt(&a)? {
            return run(&a, v, pass, &device);
        }
        if a.init_only {
            return Ok(());
        }
    }
    if let Some(header) = a.volume.header.as_deref().filter(|_| a.decrypt) {
        let x = export_args(&a, &a.volume.device, header, None);
        match decrypt_header(&x) {
            Some(Ok(Some((v, pass)))) => return run(&a, v, pass, &device),
            Some(Ok(None)) => return Ok(()),
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    let mut v = a.volume.load(true, Some(2))?;
    let pass = match v.reencryption()? {
        None if a.resume_only => {
            return Err(CliError::invalid("Device reencryption not in progress."))
        }
        None if a.encrypt => {
            return Err(CliError::invalid(format!(
                "Device {} is already LUKS device. Aborting operation.",
                a.volume
                    .header
                    .as_deref()
                    .unwrap_or(&a.volume.device)
                    .display()
            )))
        }
        None if a.decrypt => {
            if a.volume.header.is_none() {
                return Err(CliError::invalid(
                    "LUKS2 decryption requires --header option.",
                ));
            }
            let p = passphrase(&a.key, &format!("Enter passphrase for {device}: "), false)?;
            v.reencrypt_init_decrypt(&p, a.key_slot, &init_params(&a)?)?;
            if a.init_only {
                return Ok(());
            }
            p
        }
        None => {
            let p = init(&a, &mut v, false)?;
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
        Some(_) => {
            if !a.resume_only {
                Confirm {
                    batch: a.batch_mode,
                    warnings: Vec::new(),
                    question: format!("Device {device} is already in LUKS2 reencryption. Do you wish to resume previously initialised operation?"),
                    action: "resume the reencryption",
                    aborted: "Operation aborted.",
                    code: 1,
                }
                .ask()?;
            }
            passphrase(&a.key, &format!("Enter passphrase for {device}: "), false)?
        }
    };
    run(&a, v, pass, &device)
}

/// Run (or resume) the reencryption of `v` to its end, with progress.
pub(super) fn run(
    a: &ReencryptArgs,
    mut v: LuksVolume,
    pass: Passphrase,
    device: &str,
) -> CliResult {
    catch_signals();
    let mut shown = Shown::new(device, a.progress_json, !a.batch_mode && is_tty(2));
    let opts = RunOptions {
        max_hotzone: a.hotzone_size,
        io_block: 0,
        device_size: a.device_size,
    };
    let outcome = v.reencrypt_run(&pass, a.key_slot, &opts, &mut |p| {
        shown.show(p);
        !STOP.load(Ordering::SeqCst)
    })?;
    drop(pass);
    shown.end();
    match outcome {
        RunOutcome::Finished => Ok(()),
        RunOutcome::Stopped => Err(CliError::invalid("Reencryption interrupted.")),
    }
}

/// The progress display.
pub(super) struct Shown {
    device: String,
    json: bool,
    tty: bool,
    start: Instant,
    first: Option<u64>,
    last: Instant,
    drawn: bool,
}

impl Shown {
    pub(super) fn new(device: &str, json: bool, tty: bool) -> Shown {
        Shown {
            device: device.to_string(),
            json,
            tty,
            start: Instant::now(),
            first: None,
            last: Instant::now(),
            drawn: false,
        }
    }

    pub(super) fn show(&mut self, p: Progress) {
        let first = *self.first.get_or_insert(p.done);
        let secs = self.start.elapsed().as_secs_f64();
        let moved = p.done - first;
        let rate = if secs > 0.0 { moved as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 {
            (p.size - p.done) as f64 / rate
        } else {
            0.0
        };
        if self.json {
            let line = serde_json::json!({
                "device": self.device,
                "device_bytes": p.done.to_string(),
                "device_size": p.size.to_string(),
                "speed": (rate as u64).to_string(),
                "eta_ms": ((eta * 1000.0) as u64).to_string(),
                "time_ms": ((secs * 1000.0) as u64).to_string(),
            });
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        if self.tty && (self.last.elapsed().as_millis() >= 500 || p.done == p.size) {
            self.last = Instant::now();
            let pct = if p.size > 0 {
                p.done as f64 * 100.0 / p.size as f64
            } else {
                100.0
            };
            let e = eta as u64;
            eprint!(
                "\rProgress: {pct:5.1}%, ETA {:02}:{:02}, {:4} MiB written, speed {:5.1} MiB/s",
                e / 60,
                e % 60,
                moved >> 20,
                rate / (1 << 20) as f64
            );
            self.drawn = true;
        }
    }

    pub(super) fn end(&self) {
        if self.drawn {
            eprintln!();
        }
    }
}

/// What `--decrypt --header HEADER` of `device` was given (`served`: the name dmkit serves
/// the device as).
pub(super) fn export_args<'a>(
    a: &'a ReencryptArgs,
    device: &'a std::path::Path,
    header: &'a std::path::Path,
    served: Option<&'a str>,
) -> Export<'a> {
    Export {
        device,
        header,
        key: &a.key,
        key_slot: a.key_slot,
        batch: a.batch_mode,
        init_only: a.init_only,
        resume_only: a.resume_only,
        resilience: a.resilience.as_deref(),
        resilience_hash: &a.resilience_hash,
        moved: a.hotzone_size,
        hash: &a.pbkdf.hash,
        benchmark_digest: a.pbkdf.pbkdf_force_iterations.is_none(),
        served,
    }
}
