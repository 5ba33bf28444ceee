//! `dmkit image build|open|close|status|inspect` (and the rootless readers of
//! [`super::image_read`]): read-only root images (the logic lives in
//! [`crate::image`]).

use super::{CliError, CliResult};
use crate::image::build::{self, BuildOptions};
use crate::image::fec::FecChoice;
use crate::image::image_type::{self, ImageType};
use crate::image::mkfs::{Compression, FsKind};
use crate::image::open::{self, OpenOptions};
use crate::image::{inspect, ImageError, DEFAULT_SEED};
use crate::verity::superblock::parse_uuid;
use serde_json::Value;
use std::io::IsTerminal;
use std::path::PathBuf;

/// `dmkit image` subcommands.
#[derive(clap::Subcommand)]
pub enum ImageCommand {
    /// Build TREE into a signed, verity-protected read-only image (root, usr, sysext, confext
    /// or portable; a GPT disk image laid out as the Discoverable Partitions Specification
    /// says, or --split files).
    Build(BuildArgs),
    /// Open IMAGE at MOUNTPOINT: verity over the root partition, the file system read-only, an
    /// OverlayFS with a tmpfs (or --upper) on top.
    Open(OpenArgs),
    /// Undo `open` at MOUNTPOINT, in reverse order.
    Close(CloseArgs),
    /// Show the open images (or the one at MOUNTPOINT).
    Status(StatusArgs),
    /// Print an image's layout: partitions, file system, verity, root hash, signature.
    Inspect(InspectArgs),
    /// List the files of an image (recursively from PATH), read in userspace through its
    /// verified root partition: no root, no mount.
    Ls(super::image_read::LsArgs),
    /// Print a file of an image to standard output (read as `ls` reads).
    Cat(super::image_read::CatArgs),
    /// Copy a file or directory tree out of an image (modes, times, xattrs, symlinks, hard
    /// links; ownership and device nodes as root).
    CopyFrom(super::image_read::CopyFromArgs),
    /// Print the image's tree as `systemd-dissect --mtree` does (with each file's SHA-256).
    Mtree(super::image_read::MtreeArgs),
    /// Check the signature (--cert), the root hash and every block of the root partition.
    Validate(super::image_read::ValidateArgs),
}

/// Arguments of `image build`.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// The directory tree to put in the image.
    tree: PathBuf,
    /// The image to write (with --split: the file system; NAME.verity, NAME.roothash and
    /// NAME.roothash.p7s go beside it, NAME.usrhash and NAME.usrhash.p7s for --type usr).
    image: PathBuf,
    /// What the image is for: root (a root file system), usr (the tree is /usr), sysext
    /// (usr/ and opt/ only), confext (etc/ only), portable (a portable service). Extensions get
    /// an extension-release file named after the image unless the tree has one.
    #[arg(long = "type", default_value = "root", value_parser = ["root", "usr", "sysext", "confext", "portable"])]
    image_type: String,
    /// The architecture of the partition types, as systemd spells it (x86-64, arm64, ...)
    /// [default: this machine's].
    #[arg(long)]
    architecture: Option<String>,
    /// A field of the extension-release file written for --type sysext or confext (may be
    /// repeated), over the defaults: ID and VERSION_ID of /etc/os-release, ARCHITECTURE.
    #[arg(long, value_name = "KEY=VALUE")]
    extension_release: Vec<String>,
    /// File system: erofs, squashfs or ext4.
    #[arg(long, default_value = "erofs")]
    fs: String,
    /// Compression (seed 001's settings). squashfs: none, gzip (default), lz4hc, lz4, xz, lzo,
    /// zstd; erofs: none (default), lz4, lz4hc[,LEVEL], lzma[,LEVEL], big-pcluster, hints,
    /// well-compressed.
    #[arg(long)]
    compress: Option<String>,
    /// The seed (a UUID) every identifier derives from: disk GUID, file system UUID, verity
    /// salt and UUID [default: a fixed dmkit seed].
    #[arg(long)]
    seed: Option<String>,
    /// The time every file gets, in seconds since 1970 [default: $SOURCE_DATE_EPOCH, else 0].
    #[arg(long)]
    timestamp: Option<u32>,
    /// Private key (PEM) to sign the root hash with.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// The key's certificate (PEM).
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Write separate files instead of a GPT disk image.
    #[arg(long)]
    split: bool,
    /// Replace existing output files.
    #[arg(long)]
    force: bool,
    /// Store Reed-Solomon parity of the file system and the tree after the tree in the verity
    /// partition (veritysetup's FEC, with a libfec fec_header in its last 4096 bytes), so that
    /// `image open` corrects corrupted blocks.
    #[arg(long)]
    fec: bool,
    /// Parity bytes per Reed-Solomon codeword with --fec (2 to 24): more corrects more, costs
    /// more space.
    #[arg(long, default_value_t = crate::verity::fec::DEFAULT_ROOTS, requires = "fec",
          value_parser = clap::value_parser!(u8).range(2..=24))]
    fec_roots: u8,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `image open`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// The image.
    image: PathBuf,
    /// An existing directory where the writable root appears.
    mountpoint: PathBuf,
    /// Require a valid signature of the root hash by this certificate (may be repeated).
    #[arg(long)]
    cert: Vec<PathBuf>,
    /// Trust this root hash (hex) instead of the image's.
    #[arg(long)]
    root_hash: Option<String>,
    /// A persistent upper layer: writes go to DIR/upper (DIR/work is overlayfs' scratch).
    #[arg(long)]
    upper: Option<PathBuf>,
    /// Threads serving the verity device.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Open without FEC, even when the verity partition holds parity (its fec_header is not
    /// read: for an image whose fec_header is damaged).
    #[arg(long, conflicts_with_all = ["fec_device", "fec_offset", "fec_roots"])]
    no_fec: bool,
    /// FEC parity in this file instead of the image's (as `verity open --fec-device`).
    #[arg(long)]
    fec_device: Option<PathBuf>,
    /// Byte offset of the parity: in --fec-device [default: 0], else in the image's verity
    /// partition [default: where the tree ends]; the fec_header is then not read.
    #[arg(long)]
    fec_offset: Option<u64>,
    /// Parity bytes per codeword (2 to 24) of the parity --fec-device or --fec-offset names
    /// [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u8).range(2..=24))]
    fec_roots: Option<u8>,
    /// Without root, the writable layer: `fuse-overlayfs` (the tree at MOUNTPOINT), `userns`
    /// (the kernel's OverlayFS in the server's user namespace: the tree at
    /// /proc/PID/root/MOUNTPOINT), or `auto` (fuse-overlayfs when installed). Ignored as root.
    #[arg(long, default_value = "auto", value_parser = ["auto", "userns", "fuse-overlayfs"])]
    overlay: String,
    /// Print what was opened as JSON.
    #[arg(long)]
    json: bool,
    /// When IMAGE is an https://, http:// or s3:// URL: how it is fetched and cached.
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
}

/// Arguments of `image close`.
#[derive(clap::Args)]
pub struct CloseArgs {
    /// The mount point given to `open`.
    mountpoint: PathBuf,
}

/// Arguments of `image status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The mount point (all open images if omitted).
    mountpoint: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `image inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// The image.
    image: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl From<ImageError> for CliError {
    fn from(e: ImageError) -> Self {
        CliError {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

/// Run a `dmkit image` subcommand.
pub fn run(c: ImageCommand) -> CliResult {
    match c {
        ImageCommand::Build(a) => build(a),
        ImageCommand::Open(a) => open(a),
        ImageCommand::Close(a) => Ok(open::close(&a.mountpoint)?),
        ImageCommand::Status(a) => status(a),
        ImageCommand::Inspect(a) => inspect(a),
        ImageCommand::Ls(a) => super::image_read::ls(a),
        ImageCommand::Cat(a) => super::image_read::cat(a),
        ImageCommand::CopyFrom(a) => super::image_read::copy_from(a),
        ImageCommand::Mtree(a) => super::image_read::mtree(a),
        ImageCommand::Validate(a) => super::image_read::validate(a),
    }
}

fn print_json(v: &impl serde::Serialize) -> CliResult {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| CliError::invalid(format!("cannot encode JSON: {e}")))?;
    println!("{s}");
    Ok(())
}

fn build(a: BuildArgs) -> CliResult {
    let fs = FsKind::parse(&a.fs)?;
    let compression = Compression::parse(fs, a.compress.as_deref())?;
    let seed = match &a.seed {
        Some(s) => parse_uuid(s)
            .ok_or_else(|| CliError::invalid(format!("--seed: {s:?} is not a UUID")))?,
        None => DEFAULT_SEED,
    };
    let timestamp = match a.timestamp {
        Some(t) => t,
        None => match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(v) => v.trim().parse().map_err(|_| {
                CliError::invalid(format!(
                    "SOURCE_DATE_EPOCH: {v:?} is not a number of seconds (0 to 4294967295)"
                ))
            })?,
            Err(_) => 0,
        },
    };
    let o = BuildOptions {
        tree: a.tree,
        output: a.image,
        fs,
        compression,
        seed,
        timestamp,
        key: a.key,
        cert: a.cert,
        split: a.split,
        force: a.force,
        fec_roots: a.fec.then_some(a.fec_roots),
        image_type: ImageType::parse(&a.image_type)
            .ok_or_else(|| CliError::invalid(format!("--type: {:?} is not an image type", a.image_type)))?,
        architecture: match a.architecture {
            Some(arch) => arch,
            None => crate::image::dps::native_architecture()
                .ok_or_else(|| {
                    CliError::invalid(format!(
                        "this machine's architecture ({}) has no partition types: give --architecture",
                        std::env::consts::ARCH
                    ))
                })?
                .to_string(),
        },
        extension_release: a
            .extension_release
            .iter()
            .map(|f| image_type::parse_field(f))
            .collect::<Result<_, _>>()?,
    };
    let tty = std::io::stderr().is_terminal();
    let report = build::build(&o, &mut |line| {
        if tty {
            eprintln!("dmkit: {line}");
        }
    })?;
    if a.json {
        return print_json(&report);
    }
    println!("Image:          {}", report.image.display());
    println!(
        "Type:           {} ({}){}",
        report.image_type.name(),
        report.architecture,
        report
            .extension_release
            .as_ref()
            .map_or(String::new(), |p| format!(", wrote {}", p.display()))
    );
    println!(
        "File system:    {} ({}), {} bytes",
        report.fs.name(),
        report.compress,
        report.fs_size
    );
    println!("Hash tree:      {} bytes", report.hash_size);
    if let Some(f) = &report.fec {
        println!(
            "FEC:            {} bytes of parity ({} roots) at byte {} of the verity {}, fec_header at byte {}",
            f.size,
            f.roots,
            f.offset,
            if report.layout == "split" { "file" } else { "partition" },
            f.header_offset
        );
    }
    println!("Image size:     {} bytes", report.image_size);
    println!("Root hash:      {}", report.root_hash);
    println!(
        "Signed:         {}",
        report
            .certificate_fingerprint
            .as_ref()
            .map_or("no".to_string(), |f| format!(
                "yes (certificate SHA-256 {f})"
            ))
    );
    Ok(())
}

/// Where `image open` takes FEC parity from, by its options.
fn fec_choice(a: &OpenArgs) -> FecChoice {
    use crate::verity::fec::{FecOptions, DEFAULT_ROOTS};
    let roots = a.fec_roots.unwrap_or(DEFAULT_ROOTS);
    match (&a.fec_device, a.fec_offset, a.fec_roots, a.no_fec) {
        (_, _, _, true) => FecChoice::Off,
        (Some(d), offset, _, _) => FecChoice::Device(
            d.clone(),
            FecOptions {
                roots,
                offset: offset.unwrap_or(0),
            },
        ),
        (None, None, None, _) => FecChoice::Stored,
        (None, offset, _, _) => FecChoice::InPartition { roots, offset },
    }
}

fn open(a: OpenArgs) -> CliResult {
    let root_hash = super::image_read::parse_root_hash(a.root_hash.as_deref())?;
    let fec = fec_choice(&a);
    let o = OpenOptions {
        image: a.image,
        mountpoint: a.mountpoint,
        certs: a.cert,
        root_hash,
        upper: a.upper,
        threads: a.threads.max(1),
        fec,
        overlay: crate::image::rootless::Overlay::parse(&a.overlay).unwrap_or_default(),
        remote: a.remote.image(),
    };
    let r = open::open(&o)?;
    for w in &r.warnings {
        eprintln!("dmkit: warning: {w}");
    }
    if a.json {
        return print_json(&serde_json::json!({
            "name": r.name,
            "mountpoint": r.mountpoint,
            "mode": r.mode,
            "loop_device": r.loop_device,
            "server_pid": r.server_pid,
            "fs": r.fs.name(),
            "root_hash": r.root_hash,
            "root_hash_source": r.root_hash_source,
            "signed_by": r.signer.as_ref().map(|s| &s.subject),
            "upper": r.upper,
            "fec": r.fec,
        }));
    }
    let signed = match &r.signer {
        Some(s) => format!("signed by {}", s.subject),
        None => "signature not checked".to_string(),
    };
    match (&r.loop_device, r.server_pid) {
        (Some(l), _) => println!(
            "{}: {} over {} (dm-verity by dmkit, root hash {}, {signed})",
            r.mountpoint.display(),
            r.fs.name(),
            l.display(),
            r.root_hash,
        ),
        (None, pid) => {
            println!(
                "{}: {} read by dmkit's FUSE server, {} (dm-verity by dmkit, root hash {}, {signed})",
                r.mountpoint.display(),
                r.fs.name(),
                r.mode,
                r.root_hash,
            );
            if let (Some(pid), true) = (pid, r.mode.contains("userns")) {
                println!(
                    "{}: the writable tree is in the server's namespace: {} (or nsenter -t {pid} -U -m --preserve-credentials)",
                    r.mountpoint.display(),
                    crate::image::rootless::userns_path(pid, &r.mountpoint).display()
                );
            }
        }
    }
    Ok(())
}

fn status(a: StatusArgs) -> CliResult {
    let list = open::status(a.mountpoint.as_deref())?;
    if a.json {
        let v = match (a.mountpoint.is_some(), list) {
            (true, mut l) if l.len() == 1 => l.remove(0),
            (_, l) => Value::Array(l),
        };
        return print_json(&v);
    }
    for v in &list {
        let d = &v["details"];
        let s = |x: &Value| match x {
            Value::String(s) => s.clone(),
            Value::Null => "-".to_string(),
            o => o.to_string(),
        };
        let m = |k: &str| match v["mounted"][k].as_bool() {
            Some(true) => "mounted",
            Some(false) => "NOT MOUNTED",
            None => "-",
        };
        println!("{} is {}.", s(&d["mountpoint"]), s(&v["state"]));
        let mode = d["mode"].as_str().unwrap_or("kernel");
        println!("  mode:        {mode}");
        println!("  image:       {}", s(&d["image"]));
        println!(
            "  root hash:   {} ({})",
            s(&d["root_hash"]),
            s(&d["root_hash_source"])
        );
        println!("  signed by:   {}", s(&d["signed_by"]));
        match (mode.contains("userns"), v["pid"].as_u64()) {
            (true, Some(pid)) => println!(
                "  overlay:     {} in the namespace of pid {pid}, reachable at {} ({})",
                s(&d["mountpoint"]),
                crate::image::rootless::userns_path(
                    pid as u32,
                    std::path::Path::new(&s(&d["mountpoint"]))
                )
                .display(),
                m("overlay")
            ),
            _ => println!("  overlay:     {} ({})", s(&d["mountpoint"]), m("overlay")),
        }
        match d["tmpfs"].as_str() {
            Some(t) => println!(
                "  upper:       {} on tmpfs {t} ({})",
                s(&d["upper"]),
                m("upper_tmpfs")
            ),
            None => println!("  upper:       {}", s(&d["upper"])),
        }
        println!(
            "  lower:       {} {} ({})",
            s(&d["fs"]),
            s(&d["lower"]),
            m("lower")
        );
        if mode == "kernel" {
            println!("  loop:        {}", s(&v["loop_device"]));
            println!("  verity:      {} ({})", s(&v["path"]), s(&v["name"]));
        } else {
            println!(
                "  fuse:        {} (dmkit's FUSE server over the {} reader, pid {})",
                s(&d["lower"]),
                s(&d["fs"]),
                s(&v["pid"])
            );
        }
        println!("  corruptions: {}", s(&v["stats"]["corruptions"]));
        let f = &d["fec"];
        if f.is_object() {
            let at = match f["partition"].as_u64() {
                Some(n) => format!("partition {n} of {}", s(&f["device"])),
                None => s(&f["device"]),
            };
            println!(
                "  fec:         {} roots at byte {} of {at} (from {})",
                s(&f["roots"]),
                s(&f["offset"]),
                s(&f["from"])
            );
            println!(
                "  fec fixed:   {} corrected, {} uncorrectable",
                s(&v["stats"]["fec_corrected"]),
                s(&v["stats"]["fec_uncorrectable"])
            );
        }
    }
    Ok(())
}

fn inspect(a: InspectArgs) -> CliResult {
    let i = inspect::inspect(&a.image)?;
    if a.json {
        print_json(&i)?;
    } else {
        print!("{}", inspect::render(&i));
    }
    // A problem is something `open` would refuse: the check failed (exit 2, as `verity
    // verify`), after the whole report is printed.
    match i.problems.len() {
        0 => Ok(()),
        n => Err(CliError::verification(format!(
            "{}: {n} problem{} found (see above)",
            a.image.display(),
            if n == 1 { "" } else { "s" }
        ))),
    }
}
