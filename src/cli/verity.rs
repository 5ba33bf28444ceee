//! `dmkit verity format|verify|dump|open|sign`, with veritysetup's options and argument order.

use super::ranges::ranges;
use super::remote::{location, remote_error};
use super::verity_fec::{self, FecArgs};
use super::{CliError, CliResult};
use crate::block::FileDevice;
use crate::remote::verity::RemoteVerity;
use crate::remote::Location;
use crate::verity::fec::repair::FecOutcome;
use crate::verity::fec::FecGeometry;
use crate::verity::superblock::{format_uuid, parse_uuid};
use crate::verity::tree::VerifyReport;
use crate::verity::volume::{
    self, params_json, Backing, ParamsSource, SignatureSource, VerityVolume, VolumeError,
};
use crate::verity::{self, TreeLayout, TreeSpec, VerityError, VerityOptions, VerityParams};
use std::path::{Path, PathBuf};

/// `dmkit verity` subcommands.
#[derive(clap::Subcommand)]
// Parsed once per run: the size of the largest variant (open, with its remote options) does
// not matter, and boxing would spread through every match.
#[allow(clippy::large_enum_variant)]
pub enum VerityCommand {
    /// Build the hash tree of DATA into HASH and print the root hash (like `veritysetup format`).
    Format(FormatArgs),
    /// Check DATA and HASH against ROOT_HASH offline, naming every corrupt block.
    Verify(VerifyArgs),
    /// Print the superblock of HASH (like `veritysetup dump`).
    Dump(DumpArgs),
    /// Correct corrupt data and hash blocks from the FEC device and write them back, each
    /// only after the volume verifies with it.
    Repair(RepairArgs),
    /// Serve the verified DATA read-only at /run/dmkit/NAME (veritysetup's argument order).
    Open(Box<OpenArgs>),
    /// Sign a root hash: detached DER PKCS#7 over the lowercase hex string, as the kernel checks.
    Sign(SignArgs),
    /// Tear down an open device (like `veritysetup close`; same as `dmkit close`).
    Close(super::device::CloseArgs),
    /// Show an open device (like `veritysetup status`; same as `dmkit status`).
    Status(super::device::StatusArgs),
}

/// Tree parameters, as veritysetup spells them.
#[derive(clap::Args, Clone)]
pub struct TreeArgs {
    /// Hash algorithm: sha256, sha1 or sha512.
    #[arg(long, default_value = "sha256")]
    hash: String,
    /// Block size on the data device.
    #[arg(long, default_value_t = 4096)]
    data_block_size: u32,
    /// Block size on the hash device.
    #[arg(long, default_value_t = 4096)]
    hash_block_size: u32,
    /// Number of data blocks (default: all complete blocks of DATA).
    #[arg(long)]
    data_blocks: Option<u64>,
    /// Byte offset of the hash area (superblock first) in HASH.
    #[arg(long, default_value_t = 0)]
    hash_offset: u64,
    /// Salt as hex, or `-` for none (format default: 32 random bytes; without a superblock: none).
    #[arg(long)]
    salt: Option<String>,
    /// Hash type: 1 (normal) or 0 (original Chrome OS).
    #[arg(long = "format", default_value_t = 1)]
    hash_type: u32,
    /// Do not write or read a superblock: all parameters come from the command line.
    #[arg(long)]
    no_superblock: bool,
}

/// Arguments of `verity format`.
#[derive(clap::Args)]
pub struct FormatArgs {
    /// Data device or image.
    data: PathBuf,
    /// Hash device or image (created if missing; may be DATA with --hash-offset).
    hash_device: PathBuf,
    #[command(flatten)]
    tree: TreeArgs,
    /// UUID for the superblock (default: random).
    #[arg(long)]
    uuid: Option<String>,
    #[command(flatten)]
    fec: FecArgs,
    /// Also write the root hash (hex) to this file.
    #[arg(long)]
    root_hash_file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Do not ask for confirmation when HASH already holds a superblock or a filesystem
    /// (without it: YES on a terminal, refused without one).
    #[arg(long, short = 'q', alias = "batch-mode")]
    batch_mode: bool,
}

/// The root hash, from the command line or a file, and its optional signature.
#[derive(clap::Args)]
pub struct RootArgs {
    /// Read the root hash from this file instead of the command line.
    #[arg(long)]
    root_hash_file: Option<PathBuf>,
    /// Detached PKCS#7 signature of the root hash to check.
    #[arg(long, requires = "root_hash_cert")]
    root_hash_signature: Option<PathBuf>,
    /// Trusted certificate (PEM or DER) for --root-hash-signature; may be repeated.
    #[arg(long)]
    root_hash_cert: Vec<PathBuf>,
}

/// Arguments of `verity verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Data device or image.
    data: PathBuf,
    /// Hash device or image.
    hash_device: PathBuf,
    /// Root hash (hex); omit with --root-hash-file.
    root_hash: Option<String>,
    #[command(flatten)]
    tree: TreeArgs,
    #[command(flatten)]
    root: RootArgs,
    #[command(flatten)]
    fec: FecArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `verity repair`.
#[derive(clap::Args)]
pub struct RepairArgs {
    /// Data device or image.
    data: PathBuf,
    /// Hash device or image.
    hash_device: PathBuf,
    /// Root hash (hex); omit with --root-hash-file.
    root_hash: Option<String>,
    #[command(flatten)]
    tree: TreeArgs,
    #[command(flatten)]
    root: RootArgs,
    #[command(flatten)]
    fec: FecArgs,
    /// Report what would be repaired, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `verity dump`.
#[derive(clap::Args)]
pub struct DumpArgs {
    /// Hash device or image.
    hash_device: PathBuf,
    /// Byte offset of the superblock in HASH.
    #[arg(long, default_value_t = 0)]
    hash_offset: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `verity open`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// Data device or image, or its URL (http://, https://, s3://): read lazily, every block
    /// verified before it is served or cached.
    data: PathBuf,
    /// Name of the device: served at /run/dmkit/NAME.
    name: String,
    /// Hash device or image, or its URL (fetched whole at open).
    hash_device: PathBuf,
    /// Root hash (hex); omit with --root-hash-file.
    root_hash: Option<String>,
    #[command(flatten)]
    fec: FecArgs,
    #[command(flatten)]
    tree: TreeArgs,
    #[command(flatten)]
    root: RootArgs,
    #[command(flatten)]
    serve: super::device::ServeArgs,
    /// Verify each data block only on its first read.
    #[arg(long)]
    check_at_most_once: bool,
    /// Log corrupted blocks but serve them anyway.
    #[arg(long)]
    ignore_corruption: bool,
    /// Most verified hash blocks kept in memory.
    #[arg(long, default_value_t = 16384)]
    cache_blocks: usize,
    /// Bytes of verified data kept in memory and served without hashing again, like the page
    /// cache above the kernel's dm-verity (0 hashes every read).
    #[arg(long, default_value_t = crate::verity::device::DEFAULT_DATA_CACHE_BYTES)]
    data_cache: u64,
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
}

/// Arguments of `verity sign`.
#[derive(clap::Args)]
pub struct SignArgs {
    /// Root hash (hex); omit with --root-hash-file.
    root_hash: Option<String>,
    /// Read the root hash from this file.
    #[arg(long)]
    root_hash_file: Option<PathBuf>,
    /// Private key (PEM).
    #[arg(long)]
    key: PathBuf,
    /// Signer certificate (PEM).
    #[arg(long)]
    cert: PathBuf,
    /// Where to write the DER signature.
    #[arg(long, short)]
    output: PathBuf,
}

/// Run a `dmkit verity` subcommand.
pub fn run(c: VerityCommand) -> CliResult {
    match c {
        VerityCommand::Format(a) => format(a),
        VerityCommand::Verify(a) => verify(a),
        VerityCommand::Dump(a) => dump(a),
        VerityCommand::Repair(a) => repair(a),
        VerityCommand::Open(a) => open(*a),
        VerityCommand::Sign(a) => sign(a),
        VerityCommand::Close(a) => super::device::close(a),
        VerityCommand::Status(a) => super::device::status(a),
    }
}

fn invalid(e: impl std::fmt::Display) -> CliError {
    CliError::invalid(e.to_string())
}

fn verity_err(e: VerityError) -> CliError {
    CliError::invalid(e.to_string())
}

fn open_file(path: &Path, read_only: bool) -> Result<FileDevice, CliError> {
    super::files::open_device(path, read_only, false)
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the kernel's random source");
    b
}

fn random_uuid() -> [u8; 16] {
    let mut u = random_bytes::<16>();
    u[6] = (u[6] & 0x0f) | 0x40; // version 4
    u[8] = (u[8] & 0x3f) | 0x80; // RFC 4122 variant
    u
}

impl TreeArgs {
    /// The options as the library's tree specification.
    fn spec(&self) -> TreeSpec {
        TreeSpec {
            hash: self.hash.clone(),
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks,
            hash_offset: self.hash_offset,
            salt: self.salt.clone(),
            hash_type: self.hash_type,
            superblock: !self.no_superblock,
        }
    }

    /// Where verify/open take the parameters from: the superblock, or the command line
    /// without one.
    fn source(&self) -> ParamsSource {
        if self.no_superblock {
            ParamsSource::Spec(self.spec())
        } else {
            ParamsSource::Superblock {
                hash_offset: self.hash_offset,
            }
        }
    }
}

/// Open the data and hash files of verify/open (claimed shared for open).
fn open_volume(
    data: &Path,
    hash: &Path,
    t: &TreeArgs,
    claim: bool,
) -> Result<VerityVolume, CliError> {
    VerityVolume::open(
        Backing::whole(data),
        Backing::whole(hash),
        t.source(),
        claim,
    )
    .map_err(CliError::from)
}

fn root_hash_text(positional: &Option<String>, file: &Option<PathBuf>) -> Result<String, CliError> {
    match (positional, file) {
        (Some(_), Some(_)) => Err(invalid(
            "give the root hash either as an argument or with --root-hash-file, not both",
        )),
        (Some(h), None) => Ok(h.clone()),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map(|s| s.trim().to_string())
            .map_err(|e| {
                CliError::invalid(format!("{}: cannot read root hash file: {e}", f.display()))
            }),
        (None, None) => Err(invalid("missing root hash (argument or --root-hash-file)")),
    }
}

fn check_signature(root_hex: &str, root: &RootArgs) -> CliResult {
    let Some(sig) = &root.root_hash_signature else {
        return Ok(());
    };
    volume::check_signature(root_hex, SignatureSource::File(sig), &root.root_hash_cert)?;
    Ok(())
}

/// veritysetup overwrites silently; dmkit asks when the hash area already holds something
/// (an older tree's superblock, or the wrong file: a filesystem), as luksFormat would. Runs
/// after the claim (a device in use is refused as such), before the first write.
fn confirm_overwrite(path: &Path, hash_offset: u64, batch: bool) -> CliResult {
    let warnings = super::confirm::signature_warnings(path, hash_offset)?;
    if !warnings.is_empty() {
        super::confirm::Confirm {
            batch,
            warnings,
            question: super::confirm::overwrite_question(path),
            action: &format!("format {}", path.display()),
            aborted: "Operation aborted.",
            code: 1,
        }
        .ask()?;
    }
    Ok(())
}

fn describe(p: &VerityParams, layout: &TreeLayout, device: &Path) -> Vec<(&'static str, String)> {
    let salt = if p.salt.is_empty() {
        "-".to_string()
    } else {
        hex::encode(&p.salt)
    };
    vec![
        (
            "UUID",
            if p.superblock {
                format_uuid(&p.uuid)
            } else {
                String::new()
            },
        ),
        ("Hash type", p.hash_type.to_string()),
        ("Data blocks", p.data_blocks.to_string()),
        ("Data block size", p.data_block_size.to_string()),
        ("Hash blocks", layout.tree_blocks().to_string()),
        ("Hash block size", p.hash_block_size.to_string()),
        ("Hash algorithm", p.hash.name().to_string()),
        ("Salt", salt),
        ("Device", device.display().to_string()),
    ]
}

/// A FEC area as the header block shows it.
struct FecShown<'a> {
    geometry: &'a FecGeometry,
    /// In a file of its own at offset 0: veritysetup then prints its size too.
    own_file: bool,
    /// In the hash device.
    in_hash: bool,
}

/// Print veritysetup's header block ("VERITY header information for ...").
fn print_header(
    p: &VerityParams,
    layout: &TreeLayout,
    device: &Path,
    root: Option<&[u8]>,
    fec: Option<FecShown>,
) {
    println!("VERITY header information for {}", device.display());
    for (k, v) in describe(p, layout, device) {
        if k != "Device" {
            println!("{:<17}\t{}", format!("{k}:"), v);
        }
        if let (Some(f), "Hash algorithm") = (&fec, k) {
            verity_fec::header_lines(f.geometry)
                .iter()
                .for_each(|l| println!("{l}"));
        }
    }
    if let Some(r) = root {
        println!("Root hash:      \t{}", hex::encode(r));
    }
    // veritysetup prints the size only for a hash area at offset 0, and counts a FEC area
    // in the hash device as if it followed the tree.
    if p.hash_offset == 0 {
        let fec_in_hash = fec.as_ref().filter(|f| f.in_hash).map_or(0, |f| {
            f.geometry.rounds * u64::from(f.geometry.roots) * u64::from(p.hash_block_size)
        });
        println!(
            "Hash device size: \t{} [bytes]",
            layout.hash_device_size() + fec_in_hash
        );
    }
    if let Some(f) = fec.filter(|f| f.own_file) {
        println!("{}", verity_fec::size_line(f.geometry));
    }
}

fn format(a: FormatArgs) -> CliResult {
    let data = open_file(&a.data, true)?;
    let mut p = a
        .tree
        .spec()
        .params(&data, random_bytes::<32>().to_vec())
        .map_err(CliError::invalid)?;
    p.uuid = match &a.uuid {
        Some(u) => parse_uuid(u).ok_or_else(|| invalid(format!("--uuid: {u:?} is not a UUID")))?,
        None => random_uuid(),
    };
    let layout = TreeLayout::new(&p).map_err(invalid)?;
    let fec = a.fec.fec_device.as_deref().map(|f| (f, a.fec.options()));
    let (root, fec_geometry) =
        VerityVolume::format_device(&data, &a.data, &a.hash_device, &p, fec, || {
            confirm_overwrite(&a.hash_device, p.hash_offset, a.batch_mode)
        })?;
    if let Some(f) = &a.root_hash_file {
        std::fs::write(f, hex::encode(&root))
            .map_err(|e| invalid(format!("{}: cannot write root hash file: {e}", f.display())))?;
    }
    let in_hash = a
        .fec
        .fec_device
        .as_deref()
        .is_some_and(|f| volume::same_file(f, &a.hash_device));
    let fec_shown = fec_geometry.as_ref().map(|g| FecShown {
        geometry: g,
        own_file: a.fec.fec_offset == 0 && !in_hash,
        in_hash,
    });
    if a.json {
        let mut j = params_json(&p, &layout);
        j["root_hash"] = hex::encode(&root).into();
        if let (Some(g), Some(f)) = (&fec_geometry, &a.fec.fec_device) {
            j["fec"] = verity_fec::json(g, f, a.fec.fec_offset);
        }
        println!("{j:#}");
    } else {
        print_header(&p, &layout, &a.hash_device, Some(&root), fec_shown);
    }
    Ok(())
}

fn verify(a: VerifyArgs) -> CliResult {
    let volume = open_volume(&a.data, &a.hash_device, &a.tree, false)?;
    let root = checked_root(&volume, &a.root_hash, &a.root)?;
    let (report, fec) = match &a.fec.fec_device {
        Some(f) => volume.verify_with_fec(&root, f, &a.fec.options())?,
        None => (volume.verify(&root)?, None),
    };
    if let (Some(o), Some(f)) = (&fec, &a.fec.fec_device) {
        verity_fec::report_corrected(o, [&a.data, &a.hash_device, f], "corrected");
    }
    conclude(
        &volume,
        &a.data,
        &a.hash_device,
        &report,
        fec.as_ref(),
        a.json,
    )
}

/// The root hash of verify and repair, parsed for the volume's hash and its signature
/// checked.
fn checked_root(
    volume: &VerityVolume,
    positional: &Option<String>,
    root: &RootArgs,
) -> Result<Vec<u8>, CliError> {
    let root_hex = root_hash_text(positional, &root.root_hash_file)?;
    let bytes = verity::parse_root_hash(&root_hex, volume.params()).map_err(verity_err)?;
    check_signature(&root_hex, root)?;
    Ok(bytes)
}

/// Print the outcome of a verification (corrected by FEC when `fec`), and fail with every
/// block still corrupt.
fn conclude(
    volume: &VerityVolume,
    data: &Path,
    hash: &Path,
    before: &VerifyReport,
    fec: Option<&FecOutcome>,
    json: bool,
) -> CliResult {
    let p = volume.params();
    let report = fec.map_or(before, |o| &o.after);
    let data_bytes = volume.data_size();
    if json {
        let mut j = serde_json::to_value(before).expect("report serializes");
        j["ok"] = report.ok().into();
        j["covered_bytes"] = p.data_size().into();
        j["data_device_bytes"] = data_bytes.into();
        if let Some(o) = fec {
            j["fec"] = serde_json::to_value(o).expect("outcome serializes");
        }
        println!("{j:#}");
    }
    if report.ok() {
        if !json {
            println!(
                "{}",
                coverage(data, p.data_blocks, p.data_block_size, data_bytes)
            );
        }
        return Ok(());
    }
    if report.root_hash_mismatch {
        return Err(CliError::verification(format!(
            "{}: root hash does not match the hash tree: wrong root hash, salt or parameters, or a hash device made for other data (the data gives root {})",
            hash.display(),
            report.computed_root
        )));
    }
    let mut parts = Vec::new();
    if !report.corrupt_data_blocks.is_empty() {
        parts.push(format!(
            "{} corrupt data block(s) in {}: {}",
            report.corrupt_data_blocks.len(),
            data.display(),
            ranges(&report.corrupt_data_blocks, 1)
        ));
    }
    if !report.corrupt_hash_blocks.is_empty() {
        parts.push(format!(
            "{} corrupt hash block(s) in {}: {}",
            report.corrupt_hash_blocks.len(),
            hash.display(),
            ranges(&report.corrupt_hash_blocks, 1)
        ));
    }
    if !report.spare_not_zeroed.is_empty() {
        parts.push(format!(
            "{} hash block(s) in {} hold digests past the {} data blocks the superblock \
             covers (spare area is not zeroed; was the tree built for more data?): {}",
            report.spare_not_zeroed.len(),
            hash.display(),
            p.data_blocks,
            ranges(&report.spare_not_zeroed, 1)
        ));
    }
    let beyond = if fec.is_some() {
        " (beyond what the FEC area corrects)"
    } else {
        ""
    };
    Err(CliError::verification(format!(
        "verification failed: {}{beyond}",
        parts.join("; ")
    )))
}

fn repair(a: RepairArgs) -> CliResult {
    let volume = VerityVolume::open_writable(
        Backing::whole(&a.data),
        Backing::whole(&a.hash_device),
        a.tree.source(),
    )?;
    let root = checked_root(&volume, &a.root_hash, &a.root)?;
    let fec = a
        .fec
        .fec_device
        .as_deref()
        .expect("clap requires --fec-device");
    let (report, outcome) = volume.repair(&root, fec, &a.fec.options(), a.dry_run)?;
    if let Some(o) = &outcome {
        let verb = if a.dry_run {
            "would repair"
        } else {
            "repaired"
        };
        verity_fec::report_corrected(o, [&a.data, &a.hash_device, fec], verb);
    }
    conclude(
        &volume,
        &a.data,
        &a.hash_device,
        &report,
        outcome.as_ref(),
        a.json,
    )
}

/// What a verified root hash vouches for: "verified: 4096 data blocks of 4096 bytes, all
/// 16777216 bytes of data.img", or which part of the data device it leaves unchecked.
fn coverage(data: &Path, blocks: u64, block_size: u32, device_bytes: u64) -> String {
    let covered = blocks * u64::from(block_size);
    let head = format!("verified: {blocks} data blocks of {block_size} bytes");
    if covered >= device_bytes {
        format!("{head}, all {device_bytes} bytes of {}", data.display())
    } else {
        format!(
            "{head}: bytes 0..{covered} of {} ({device_bytes} bytes); the last {} bytes are not covered by the root hash",
            data.display(),
            device_bytes - covered
        )
    }
}

fn dump(a: DumpArgs) -> CliResult {
    let hash = open_file(&a.hash_device, true)?;
    let sb = verity::read_superblock(&hash, a.hash_offset).map_err(verity_err)?;
    let p = VerityParams::from_superblock(&sb, a.hash_offset);
    let layout = TreeLayout::new(&p).map_err(invalid)?;
    if a.json {
        println!("{:#}", params_json(&p, &layout));
    } else {
        print_header(&p, &layout, &a.hash_device, None, None);
    }
    Ok(())
}

fn open(a: OpenArgs) -> CliResult {
    let how = a.serve.prepare(&a.name)?;
    let (data, hash) = (location(&a.data)?, location(&a.hash_device)?);
    if data.is_remote() || hash.is_remote() {
        return open_remote(a, data, hash, how);
    }
    let volume = open_volume(&a.data, &a.hash_device, &a.tree, true)?;
    let root_hex = root_hash_text(&a.root_hash, &a.root.root_hash_file)?;
    let root = verity::parse_root_hash(&root_hex, volume.params()).map_err(verity_err)?;
    check_signature(&root_hex, &a.root)?;
    let opts = a.options();
    let mut activated = volume.activate(&root, opts).map_err(|e| match e {
        VolumeError::RootMismatch { .. } => CliError::verification(format!(
            "{}: root hash {root_hex} does not match the hash tree: wrong root hash, salt or parameters, or a hash device made for other data",
            a.hash_device.display()
        )),
        e => e.into(),
    })?;
    activated.details["root_hash"] = root_hex.to_lowercase().into();
    activated.details["signed"] = a.root.root_hash_signature.is_some().into();
    a.serve.serve(activated, how)
}

impl OpenArgs {
    /// The verified device's options.
    fn options(&self) -> VerityOptions {
        VerityOptions {
            name: self.name.clone(),
            check_at_most_once: self.check_at_most_once,
            ignore_corruption: self.ignore_corruption,
            cache_blocks: self.cache_blocks,
            data_cache_bytes: self.data_cache,
            fec: self.fec.fec_device.clone().map(|f| (f, self.fec.options())),
        }
    }
}

/// `verity open` of a volume whose data or hash is remote: fetched through the remote layer
/// (hash tree pinned at open, data blocks verified before they are served or cached).
fn open_remote(
    a: OpenArgs,
    data: Location,
    hash: Location,
    how: crate::export::ServeOptions,
) -> CliResult {
    let mut objects = a.remote.objects();
    let data_obj = objects.open(&data).map_err(remote_error)?;
    let hash_obj = if hash == data {
        data_obj.clone()
    } else {
        objects.open(&hash).map_err(remote_error)?
    };
    // The FEC area, often after the tree in the hash object: one object opened once.
    let fec = match &a.fec.fec_device {
        None => None,
        Some(f) => {
            let loc = location(f)?;
            let obj = if loc == hash {
                hash_obj.clone()
            } else if loc == data {
                data_obj.clone()
            } else {
                objects.open(&loc).map_err(remote_error)?
            };
            Some((obj, a.fec.options()))
        }
    };
    let opened = crate::remote::verity::open(RemoteVerity {
        data: data_obj,
        hash: hash_obj,
        params: a.tree.source(),
        remote: a.remote.device(),
        cache: a.remote.cache(),
        prefetch: a.remote.prefetch(),
        fec,
    })?;
    let root_hex = root_hash_text(&a.root_hash, &a.root.root_hash_file)?;
    let root = verity::parse_root_hash(&root_hex, opened.params()).map_err(verity_err)?;
    if let Some(sig) = &a.root.root_hash_signature {
        let der = objects.read_all(&location(sig)?).map_err(remote_error)?;
        volume::check_signature(
            &root_hex,
            SignatureSource::Der(&der),
            &a.root.root_hash_cert,
        )?;
    }
    // The FEC object went to the remote layer above; the options name no local file.
    let opts = VerityOptions {
        fec: None,
        ..a.options()
    };
    let mut activated = opened.activate(&root, opts).map_err(|e| match e {
        VolumeError::RootMismatch { .. } => CliError::verification(format!(
            "{hash}: root hash {root_hex} does not match the hash tree: wrong root hash, salt or parameters, or a hash object made for other data"
        )),
        e => e.into(),
    })?;
    activated.details["root_hash"] = root_hex.to_lowercase().into();
    activated.details["signed"] = a.root.root_hash_signature.is_some().into();
    a.serve.serve(activated, how)
}

fn sign(a: SignArgs) -> CliResult {
    let root_hex = root_hash_text(&a.root_hash, &a.root_hash_file)?;
    let der = verity::sig::sign_root_hash(&root_hex, &a.key, &a.cert)
        .map_err(|e| CliError::invalid(e.to_string()))?;
    std::fs::write(&a.output, der).map_err(|e| {
        invalid(format!(
            "{}: cannot write signature: {e}",
            a.output.display()
        ))
    })?;
    Ok(())
}
