//! `dmkit image build`: a tree to a file system (the real mkfs, reproducibly), dm-verity over
//! it (dmkit's own tree builder, salt and superblock UUID from the seed), a signature of the
//! root hash, and either a GPT disk image laid out as systemd-repart lays it out or separate
//! files (`--split`) named as systemd looks for them.
//!
//! Everything is written to temporary files beside the output and renamed into place at the
//! end: a failed build leaves nothing behind and never touches an existing file.

use super::dps::{self, Ids, Role};
use super::gpt::{self, Guid, NewPartition};
use super::image_type::{self, Addition, ImageType};
use super::layout::sidecar;
use super::mkfs::{self, Compression, FsKind, MkfsSettings};
use super::sigjson::SigJson;
use super::tree::TreeStats;
use super::{ImageError, Result};
use crate::block::{BlockDevice, FileDevice, MemoryDevice, OpenOptions};
use crate::hash::HashAlgorithm;
use crate::verity::{self, TreeLayout, VerityParams};
use serde::Serialize;
use std::fs::{self, File};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

/// Data and hash block size of the verity tree (systemd-repart's default file system sector).
pub const VERITY_BLOCK: u64 = 4096;

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The source tree.
    pub tree: PathBuf,
    /// The image (with `split`: the file system file; the sidecars go beside it).
    pub output: PathBuf,
    /// The file system.
    pub fs: FsKind,
    /// Its compression.
    pub compression: Compression,
    /// The seed every identifier derives from.
    pub seed: Guid,
    /// The time every inode gets.
    pub timestamp: u32,
    /// Private key to sign the root hash with.
    pub key: Option<PathBuf>,
    /// Its certificate.
    pub cert: Option<PathBuf>,
    /// Separate files instead of a GPT disk image.
    pub split: bool,
    /// Replace existing output files.
    pub force: bool,
    /// Store Reed-Solomon parity with this many roots after the hash tree (`--fec`).
    pub fec_roots: Option<u8>,
    /// What the image is for (`--type`).
    pub image_type: ImageType,
    /// The architecture its partition types are for, as systemd spells it (`--architecture`).
    pub architecture: String,
    /// Fields of the extension-release file written for a sysext or confext
    /// (`--extension-release KEY=VALUE`).
    pub extension_release: Vec<(String, String)>,
}

/// One partition (or file) of the result.
#[derive(Debug, Clone, Serialize)]
pub struct Part {
    /// DPS name of its type, which is also its label.
    pub name: String,
    /// Partition UUID (GPT) or `null`.
    pub uuid: Option<String>,
    /// Byte offset in the image (0 for a split file).
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// The file it is in.
    pub file: PathBuf,
}

/// What `build` made (`--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    /// The image (or file system file).
    pub image: PathBuf,
    /// "gpt" or "split".
    pub layout: String,
    /// `--type`.
    pub image_type: ImageType,
    /// The architecture of its partition types.
    pub architecture: String,
    /// The extension-release file dmkit added to the tree (path inside the image).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extension_release: Option<PathBuf>,
    /// The file system.
    pub fs: FsKind,
    /// `--compress` as normalized.
    pub compress: String,
    /// The mkfs command line, program first.
    pub mkfs: Vec<String>,
    /// The tree's counts.
    pub tree: TreeStats,
    /// Bytes of the file system as mkfs made it.
    pub fs_size: u64,
    /// Bytes of the verity hash tree (superblock included).
    pub hash_size: u64,
    /// The FEC parity stored after the tree (`--fec`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fec: Option<FecReport>,
    /// Bytes of the whole image (GPT) or of all files (split).
    pub image_size: u64,
    /// The partitions or files.
    pub parts: Vec<Part>,
    /// The dm-verity root hash (hex).
    pub root_hash: String,
    /// The verity salt (hex).
    pub salt: String,
    /// The seed (UUID).
    pub seed: String,
    /// The disk GUID (GPT).
    pub disk_guid: Option<String>,
    /// Whether the root hash is signed.
    pub signed: bool,
    /// SHA-256 of the signer's certificate (hex).
    pub certificate_fingerprint: Option<String>,
    /// Seconds per step.
    pub seconds: StepTimes,
}

/// The FEC parity in the verity partition (or `.verity` file).
#[derive(Debug, Clone, Serialize)]
pub struct FecReport {
    /// Parity bytes per codeword.
    pub roots: u8,
    /// Byte offset of the parity in the verity partition: where the tree ends, 4096-aligned
    /// (`--fec-offset` for veritysetup, with the partition as the FEC device).
    pub offset: u64,
    /// Bytes of parity.
    pub size: u64,
    /// Blocks covered (data blocks, then the hash blocks after the superblock).
    pub blocks_covered: u64,
    /// veritysetup's "FEC blocks": rounds × roots.
    pub rs_blocks: u64,
    /// Byte offset of the fec_header block in the verity partition (its last 4096 bytes).
    pub header_offset: u64,
}

/// Wall time of each step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepTimes {
    /// mkfs (and the ext4 time fix).
    pub mkfs: f64,
    /// The verity tree.
    pub verity: f64,
    /// The FEC parity (`--fec`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fec: Option<f64>,
    /// The signature.
    pub sign: f64,
    /// Assembling and writing the output.
    pub write: f64,
}

/// Temporary files beside the output, removed unless kept.
struct Temps(Vec<PathBuf>);

impl Temps {
    fn add(&mut self, output: &Path, tag: &str) -> PathBuf {
        let name = output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into());
        let dir = output.parent().filter(|p| !p.as_os_str().is_empty());
        let p = dir
            .unwrap_or(Path::new("."))
            .join(format!(".{name}.dmkit-{}.{tag}", std::process::id()));
        self.0.push(p.clone());
        p
    }
}

impl Drop for Temps {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

fn io(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> ImageError {
    let m = format!("{}: {what}", path.display());
    move |e| ImageError::Io(format!("{m}: {e}"))
}

fn format_uuid(u: &Guid) -> String {
    crate::verity::superblock::format_uuid(u)
}

/// The output files a build writes.
fn outputs(o: &BuildOptions) -> Vec<PathBuf> {
    if o.split {
        vec![
            o.output.clone(),
            sidecar(&o.output, ".verity"),
            sidecar(&o.output, o.image_type.hash_suffix()),
            sidecar(&o.output, &format!("{}.p7s", o.image_type.hash_suffix())),
        ]
    } else {
        vec![o.output.clone()]
    }
}

/// The partition types of an image: file system, verity, signature.
type PartTypes = [&'static dps::PartType; 3];

/// What preflight found out.
struct Checked {
    stats: TreeStats,
    fingerprint: Option<[u8; 32]>,
    types: PartTypes,
    addition: Option<Addition>,
}

/// The partition types of `--type` for `--architecture`.
fn part_types(o: &BuildOptions) -> Result<PartTypes> {
    let role = o.image_type.data_role();
    let find = |r: Option<Role>| r.and_then(|r| dps::find(&o.architecture, r));
    match (
        find(Some(role)),
        find(role.verity()),
        find(role.verity_sig()),
    ) {
        (Some(d), Some(v), Some(s)) => Ok([d, v, s]),
        _ => Err(ImageError::Invalid(format!(
            "--architecture {}: not one systemd names partition types for ({})",
            o.architecture,
            dps::ARCHITECTURES.join(", ")
        ))),
    }
}

/// Check everything that can be checked before mkfs runs.
fn preflight(o: &BuildOptions) -> Result<Checked> {
    let types = part_types(o)?;
    let stats = TreeStats::scan(&o.tree)?;
    let parent = o
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(ImageError::Invalid(format!(
            "{}: the output's directory {} does not exist",
            o.output.display(),
            parent.display()
        )));
    }
    let tree = fs::canonicalize(&o.tree).map_err(io(&o.tree, "cannot resolve"))?;
    if fs::canonicalize(parent).is_ok_and(|p| p.starts_with(&tree)) {
        return Err(ImageError::Invalid(format!(
            "{}: the output lies inside the tree {}; it would end up in its own image",
            o.output.display(),
            o.tree.display()
        )));
    }
    for p in outputs(o) {
        if !o.force && fs::symlink_metadata(&p).is_ok() {
            return Err(ImageError::Invalid(format!(
                "{}: exists (give --force to replace it)",
                p.display()
            )));
        }
    }
    let fingerprint = match (&o.key, &o.cert) {
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(ImageError::Invalid(
                "--key and --cert go together: the key signs, the certificate names the signer"
                    .into(),
            ))
        }
        (Some(k), Some(c)) => Some(signer_fingerprint(k, c)?),
    };
    let addition = image_type::plan(
        o.image_type,
        &o.tree,
        &o.output,
        &o.architecture,
        &o.extension_release,
        Path::new("/etc/os-release"),
    )?;
    Ok(Checked {
        stats,
        fingerprint,
        types,
        addition,
    })
}

/// SHA-256 of the DER certificate in `cert` that carries `key`'s public key (the one
/// `sign_root_hash` signs with), checking both load.
fn signer_fingerprint(key: &Path, cert: &Path) -> Result<[u8; 32]> {
    use crate::sig::{load_certs, load_key};
    use sha2::Digest;
    let sig_err = |e: crate::sig::SignatureError| ImageError::Invalid(e.to_string());
    let k = load_key(key).map_err(sig_err)?;
    let certs = load_certs(cert).map_err(sig_err)?;
    let c = certs
        .iter()
        .find(|c| c.public_key().is_ok_and(|pk| pk.public_eq(&k)))
        .ok_or_else(|| {
            ImageError::Invalid(format!(
                "{}: no certificate matches the private key {}",
                cert.display(),
                key.display()
            ))
        })?;
    let der = c
        .to_der()
        .map_err(|e| ImageError::Invalid(format!("{}: {e}", cert.display())))?;
    Ok(sha2::Sha256::digest(der).into())
}

/// The last lines of a tool's output, on one line.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let start = lines.len().saturating_sub(3);
    lines[start..].join(" / ")
}

/// Run `cmd`; its output, or an error naming the program and its last words.
fn run(cmd: &mut std::process::Command, program: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ImageError::Tool(format!("{program}: cannot run: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(ImageError::Tool(format!(
            "{program} failed ({}): {}",
            out.status,
            tail(&text)
        )));
    }
    Ok(text)
}

/// Refuse what this mkfs.erofs cannot do, before running it: a compressor it lacks, or
/// extended options that erofs-utils before 1.6 silently ignores.
fn check_erofs(program: &Path, c: &Compression, scratch: &Path) -> Result<()> {
    if let Some(alg) = c.needs_compressor {
        let out = std::process::Command::new(program)
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ImageError::Tool(format!("mkfs.erofs: cannot run: {e}")))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let have = mkfs::erofs_compressors(&text);
        if !have.iter().any(|h| h == alg) {
            return Err(ImageError::Invalid(format!(
                "--compress {}: this mkfs.erofs has no {alg} compressor (it offers: {}); \
                 {alg} needs erofs-utils 1.6 or later built with it",
                c.name,
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            )));
        }
    }
    if c.needs_erofs_1_6 {
        // A build of an empty tree prints the version.
        let dir = scratch.with_extension("probe.d");
        let img = scratch.with_extension("probe.img");
        fs::create_dir_all(&dir).map_err(io(&dir, "cannot create"))?;
        let r = run(
            std::process::Command::new(program).arg(&img).arg(&dir),
            "mkfs.erofs",
        );
        let _ = fs::remove_dir(&dir);
        let _ = fs::remove_file(&img);
        let version = mkfs::erofs_version(&r?);
        if version.is_none_or(|v| v < (1, 6)) {
            return Err(ImageError::Invalid(format!(
                "--compress {}: needs erofs-utils 1.6 or later for -Eall-fragments and -Ededupe; \
                 this mkfs.erofs is {} and would ignore them",
                c.name,
                version.map_or("older".to_string(), |(a, b)| format!("{a}.{b}"))
            )));
        }
    }
    Ok(())
}

/// Make the file system of `tree` in `out`; returns the mkfs command line.
fn make_fs(
    o: &BuildOptions,
    tree: &Path,
    ids: &Ids,
    stats: &TreeStats,
    out: &Path,
    temps: &mut Temps,
) -> Result<Vec<String>> {
    let program = mkfs::require_program(o.fs)?;
    let hints_file = if o.compression.hints {
        let h = temps.add(&o.output, "hints");
        fs::write(&h, mkfs::EROFS_HINTS).map_err(io(&h, "cannot write"))?;
        Some(h)
    } else {
        None
    };
    if o.fs == FsKind::Erofs {
        check_erofs(&program, &o.compression, out)?;
    }
    let mut s = MkfsSettings {
        kind: o.fs,
        compression: o.compression.clone(),
        timestamp: o.timestamp,
        fs_uuid: ids.fs_uuid,
        hash_seed: ids.fs_uuid,
        ext4_size: stats.ext4_size_estimate(),
        ext4_inodes: stats.ext4_inodes(),
        hints_file,
    };
    let _ = fs::remove_file(out);
    let mut attempt = 0;
    loop {
        let mut cmd = mkfs::command(&program, &s, tree, out);
        let line: Vec<String> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if o.fs == FsKind::Ext4 {
            let f = File::create(out).map_err(io(out, "cannot create"))?;
            f.set_len(s.ext4_size).map_err(io(out, "cannot size"))?;
        }
        match run(&mut cmd, o.fs.program()) {
            Ok(_) => {
                if o.fs == FsKind::Ext4 {
                    let f = fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(out)
                        .map_err(io(out, "cannot open"))?;
                    super::ext4_times::fix_times(&f, o.timestamp).map_err(|e| {
                        ImageError::Tool(format!("{}: fixing inode times: {e}", out.display()))
                    })?;
                    f.sync_all().map_err(io(out, "cannot sync"))?;
                }
                return Ok(line);
            }
            // ext4 has a fixed size: a tree that did not fit gets a larger one.
            Err(ImageError::Tool(m))
                if o.fs == FsKind::Ext4
                    && attempt < 6
                    && (m.contains("space") || m.contains("allocate")) =>
            {
                attempt += 1;
                s.ext4_size += s.ext4_size / 2;
                let _ = fs::remove_file(out);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Build the image `o` describes, calling `progress` with one line per finished step.
pub fn build(o: &BuildOptions, progress: &mut dyn FnMut(&str)) -> Result<BuildReport> {
    let Checked {
        mut stats,
        fingerprint,
        types,
        addition,
    } = preflight(o)?;
    let ids = Ids::derive_for(&o.seed, types[0], types[2]);
    let mut temps = Temps(Vec::new());
    let mut times = StepTimes::default();
    let steps = 3 + usize::from(fingerprint.is_some()) + usize::from(o.fec_roots.is_some());

    // 1. The file system.
    let t = Instant::now();
    let fs_file = temps.add(&o.output, "fs");
    let staged = match &addition {
        Some(a) => {
            let st = super::stage::stage(&o.tree, temps.add(&o.output, "tree"), a)?;
            stats = TreeStats::scan(st.path())?;
            Some(st)
        }
        None => None,
    };
    let tree = staged.as_ref().map_or(o.tree.as_path(), |st| st.path());
    let mkfs_line = make_fs(o, tree, &ids, &stats, &fs_file, &mut temps)?;
    drop(staged);
    let fs_size = fs::metadata(&fs_file)
        .map_err(io(&fs_file, "cannot stat"))?
        .len();
    if fs_size == 0 {
        return Err(ImageError::Tool(format!(
            "{} made an empty file",
            o.fs.program()
        )));
    }
    // The verity data is whole 4 KiB blocks: pad the file system with zeros.
    let data_size = fs_size.div_ceil(VERITY_BLOCK) * VERITY_BLOCK;
    File::options()
        .write(true)
        .open(&fs_file)
        .and_then(|f| f.set_len(data_size))
        .map_err(io(&fs_file, "cannot pad"))?;
    times.mkfs = t.elapsed().as_secs_f64();
    progress(&format!(
        "[1/{steps}] {} {}: {} files, {} -> {} ({:.1} s)",
        o.fs.program(),
        o.compression.name,
        stats.files,
        human(stats.bytes),
        human(fs_size),
        times.mkfs
    ));

    // 2. The hash tree.
    let t = Instant::now();
    let data = FileDevice::open(
        &fs_file,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .map_err(io(&fs_file, "cannot open"))?;
    let params = VerityParams {
        hash: HashAlgorithm::Sha256,
        hash_type: 1,
        data_block_size: VERITY_BLOCK as u32,
        hash_block_size: VERITY_BLOCK as u32,
        data_blocks: data_size / VERITY_BLOCK,
        hash_offset: 0,
        salt: ids.verity_salt.to_vec(),
        uuid: ids.verity_uuid,
        superblock: true,
    };
    let tree_layout = TreeLayout::new(&params).map_err(|e| ImageError::Invalid(e.to_string()))?;
    let hash_dev = MemoryDevice::new("hash tree", tree_layout.new_file_size() as usize);
    let root = verity::format(&data, &hash_dev, &params, false)
        .map_err(|e| ImageError::Io(e.to_string()))?;
    let mut hash_bytes = hash_dev.contents();
    let hash_size = hash_bytes.len() as u64;
    let root_hex = hex::encode(&root);
    times.verity = t.elapsed().as_secs_f64();
    progress(&format!(
        "[2/{steps}] dm-verity sha256 over {}: hash tree {}, root hash {root_hex} ({:.1} s)",
        human(data_size),
        human(hash_size),
        times.verity
    ));
    let mut step = 2;

    // 3. The FEC parity, after the tree in the same partition, with its fec_header last.
    let fec = match o.fec_roots {
        Some(roots) => {
            let t = Instant::now();
            let (report, tail) = fec_parity(&data, &hash_bytes, &params, roots)?;
            hash_bytes.resize(report.offset as usize, 0);
            hash_bytes.extend_from_slice(&tail);
            let secs = t.elapsed().as_secs_f64();
            times.fec = Some(secs);
            step += 1;
            progress(&format!(
                "[{step}/{steps}] FEC: Reed-Solomon parity, {roots} roots over {} blocks: {} \
                 after the tree, fec_header in the last 4096 bytes ({secs:.1} s)",
                report.blocks_covered,
                human(report.size)
            ));
            Some(report)
        }
        None => None,
    };

    // 4. The signature.
    let signature = match (&o.key, &o.cert, fingerprint) {
        (Some(k), Some(c), Some(fp)) => {
            let t = Instant::now();
            let der = crate::verity::sig::sign_root_hash(&root_hex, k, c)
                .map_err(|e| ImageError::Invalid(e.to_string()))?;
            times.sign = t.elapsed().as_secs_f64();
            step += 1;
            progress(&format!(
                "[{step}/{steps}] signed the root hash with {} (certificate SHA-256 {})",
                k.display(),
                hex::encode(fp)
            ));
            Some(SigJson {
                root_hash: root.clone(),
                certificate_fingerprint: Some(fp),
                signature: der,
            })
        }
        _ => None,
    };

    // 5. The output.
    let t = Instant::now();
    let (parts, image_size, disk_guid) = if o.split {
        write_split(
            o,
            &fs_file,
            &hash_bytes,
            &root_hex,
            signature.as_ref(),
            &mut temps,
        )?
    } else {
        write_gpt(
            o,
            &ids,
            &data,
            &hash_bytes,
            &root,
            signature.as_ref(),
            &mut temps,
        )?
    };
    times.write = t.elapsed().as_secs_f64();
    progress(&format!(
        "[{steps}/{steps}] wrote {} ({}, {})",
        o.output.display(),
        if o.split {
            "split files"
        } else {
            "GPT disk image"
        },
        human(image_size)
    ));
    Ok(BuildReport {
        image: o.output.clone(),
        layout: if o.split { "split" } else { "gpt" }.into(),
        image_type: o.image_type,
        architecture: o.architecture.clone(),
        extension_release: addition.map(|a| a.path),
        fs: o.fs,
        compress: o.compression.name.clone(),
        mkfs: mkfs_line,
        tree: stats,
        fs_size,
        hash_size,
        fec,
        image_size,
        parts,
        root_hash: root_hex,
        salt: hex::encode(ids.verity_salt),
        seed: format_uuid(&o.seed),
        disk_guid: disk_guid.map(|g| format_uuid(&g)),
        signed: signature.is_some(),
        certificate_fingerprint: fingerprint.map(hex::encode),
        seconds: times,
    })
}

/// The parity of `data` and the tree `tree` with `roots` roots, as `veritysetup format
/// --fec-device PARTITION --fec-offset END` writes it with the verity partition as the FEC
/// device (END: the tree's end, 4096-aligned), on all cores; and what follows the tree in the
/// partition: the parity, then the fec_header block.
fn fec_parity(
    data: &FileDevice,
    tree: &[u8],
    p: &VerityParams,
    roots: u8,
) -> Result<(FecReport, Vec<u8>)> {
    use super::fecheader;
    use crate::verity::fec::{encode, layout, FecOptions};
    let offset = fecheader::tree_end(p).map_err(ImageError::Invalid)?;
    let mut padded = tree.to_vec();
    padded.resize(offset as usize, 0);
    let hash = MemoryDevice::from_vec("hash tree", padded);
    let opts = FecOptions { roots, offset };
    let fec_err = |e: crate::verity::fec::FecError| ImageError::Invalid(format!("--fec: {e}"));
    let (g, inputs) = layout(p, &opts, data, &hash, true, false).map_err(fec_err)?;
    let parity = MemoryDevice::new("FEC parity", g.parity_bytes() as usize);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    encode::encode(&inputs, &g, &parity, 0, threads).map_err(fec_err)?;
    let mut tail = parity.contents();
    let header = fecheader::for_parity(&g, &tail).map_err(ImageError::Invalid)?;
    tail.extend_from_slice(&header.block());
    let report = FecReport {
        roots,
        offset,
        size: g.parity_bytes(),
        blocks_covered: g.blocks,
        rs_blocks: g.rounds * u64::from(roots),
        header_offset: offset + g.parity_bytes(),
    };
    Ok((report, tail))
}

/// Bytes as "12.3 MiB".
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Sync `tmp` and rename it over `dest`.
fn commit(tmp: &Path, dest: &Path) -> Result<()> {
    File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(tmp, "cannot sync"))?;
    fs::rename(tmp, dest).map_err(io(dest, "cannot write"))
}

type Written = (Vec<Part>, u64, Option<Guid>);

fn write_split(
    o: &BuildOptions,
    fs_file: &Path,
    hash: &[u8],
    root_hex: &str,
    sig: Option<&SigJson>,
    temps: &mut Temps,
) -> Result<Written> {
    let files = outputs(o);
    let mut staged = vec![(fs_file.to_path_buf(), files[0].clone())];
    let mut write = |tag: &str, bytes: &[u8], dest: &Path| -> Result<()> {
        let t = temps.add(&o.output, tag);
        fs::write(&t, bytes).map_err(io(&t, "cannot write"))?;
        staged.push((t, dest.to_path_buf()));
        Ok(())
    };
    write("verity", hash, &files[1])?;
    write("hash", format!("{root_hex}\n").as_bytes(), &files[2])?;
    if let Some(s) = sig {
        write("p7s", &s.signature, &files[3])?;
    }
    let mut parts = Vec::new();
    let mut total = 0;
    for (tmp, dest) in &staged {
        let size = fs::metadata(tmp).map_err(io(tmp, "cannot stat"))?.len();
        total += size;
        commit(tmp, dest)?;
        parts.push(Part {
            name: dest
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            uuid: None,
            offset: 0,
            size,
            file: dest.clone(),
        });
    }
    if o.force && sig.is_none() {
        // A stale signature of an earlier build must not sit beside the new image.
        let _ = fs::remove_file(&files[3]);
    }
    Ok((parts, total, None))
}

fn write_gpt(
    o: &BuildOptions,
    ids: &Ids,
    data: &FileDevice,
    hash: &[u8],
    root: &[u8],
    sig: Option<&SigJson>,
    temps: &mut Temps,
) -> Result<Written> {
    let types = part_types(o)?;
    let (data_uuid, hash_uuid) = dps::verity_partition_uuids(root)
        .ok_or_else(|| ImageError::Invalid("root hash shorter than 32 bytes".into()))?;
    let align = |v: u64| v.div_ceil(VERITY_BLOCK) * VERITY_BLOCK;
    let mut parts = Vec::new();
    let mut at = gpt::FIRST_USABLE_LBA * gpt::SECTOR;
    let mut add = |t: &dps::PartType, guid: Guid, size: u64, flags: u64| {
        let p = NewPartition {
            type_guid: t.guid,
            guid,
            offset: at,
            size: align(size),
            flags,
            name: t.name.to_string(),
        };
        at += p.size;
        parts.push(p);
    };
    add(types[0], data_uuid, data.size(), gpt::FLAG_READ_ONLY);
    add(types[1], hash_uuid, hash.len() as u64, gpt::FLAG_READ_ONLY);
    let sig_bytes = sig.map(SigJson::to_partition);
    if let Some(b) = &sig_bytes {
        add(types[2], ids.sig_partition, b.len() as u64, 0);
    }
    let disk_size = gpt::disk_size_for(at);
    let enc = gpt::encode(disk_size, &ids.disk, &parts);
    let tmp = temps.add(&o.output, "img");
    let mut f = File::create(&tmp).map_err(io(&tmp, "cannot create"))?;
    f.set_len(disk_size).map_err(io(&tmp, "cannot size"))?;
    let w = |f: &File, bytes: &[u8], off: u64| {
        f.write_all_at(bytes, off).map_err(io(&tmp, "cannot write"))
    };
    w(&f, &enc.primary, 0)?;
    // The file system, copied in kernel (copy_file_range where the file system can).
    let mut src = data.file().try_clone().map_err(io(&tmp, "cannot copy"))?;
    src.seek(SeekFrom::Start(0))
        .map_err(io(&tmp, "cannot copy"))?;
    f.seek(SeekFrom::Start(parts[0].offset))
        .map_err(io(&tmp, "cannot copy"))?;
    let copied = std::io::copy(&mut src, &mut f).map_err(io(&tmp, "cannot copy"))?;
    if copied != data.size() {
        return Err(ImageError::Io(format!(
            "{}: copied {copied} of {} bytes of the file system",
            tmp.display(),
            data.size()
        )));
    }
    w(&f, hash, parts[1].offset)?;
    if let Some(b) = &sig_bytes {
        w(&f, b, parts[2].offset)?;
    }
    w(&f, &enc.backup, enc.backup_offset)?;
    f.flush().map_err(io(&tmp, "cannot write"))?;
    drop(f);
    commit(&tmp, &o.output)?;
    let out = parts
        .iter()
        .map(|p| Part {
            name: p.name.clone(),
            uuid: Some(format_uuid(&p.guid)),
            offset: p.offset,
            size: p.size,
            file: o.output.clone(),
        })
        .collect();
    Ok((out, disk_size, Some(ids.disk)))
}
