//! `dmkit image inspect`: the layout of an image (partitions, file system, verity superblock,
//! root hash and signature) and whether its parts agree with each other. Nothing is verified
//! against a key here; `open --cert` does that.

use super::dps;
use super::layout::{self, Kind, Layout, RootHashSource};
use super::{ImageError, Result};
use crate::verity::superblock::format_uuid;
use crate::verity::{self, VerityParams};
use serde::Serialize;
use std::path::Path;

/// One GPT partition.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionInfo {
    /// Partition number.
    pub number: u32,
    /// Type name (DPS), or the type GUID.
    pub r#type: String,
    /// Partition UUID.
    pub uuid: String,
    /// Label.
    pub label: String,
    /// Byte offset.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
    /// Attribute bits (hex).
    pub flags: String,
}

/// The verity superblock of the hash tree.
#[derive(Debug, Clone, Serialize)]
pub struct VerityInfo {
    /// Hash algorithm.
    pub hash: String,
    /// Data block size.
    pub data_block_size: u32,
    /// Hash block size.
    pub hash_block_size: u32,
    /// Data blocks covered.
    pub data_blocks: u64,
    /// Salt (hex).
    pub salt: String,
    /// Superblock UUID.
    pub uuid: String,
}

/// The FEC parity a valid fec_header describes in the verity partition.
#[derive(Debug, Clone, Serialize)]
pub struct FecInfo {
    /// Parity bytes per codeword.
    pub roots: u8,
    /// Byte offset of the parity in the verity partition (or `.verity` file).
    pub offset: u64,
    /// Bytes of parity.
    pub size: u64,
    /// Bytes covered (data blocks and the hash blocks before the parity).
    pub inp_size: u64,
    /// Byte offset of the header block in the verity partition.
    pub header_offset: u64,
    /// Whether the parity matches the SHA-256 in the header.
    pub parity_intact: bool,
    /// Whether the primary header was damaged and its backup copy read.
    pub backup_header: bool,
}

/// The signature, as found (not verified).
#[derive(Debug, Clone, Serialize)]
pub struct SignatureInfo {
    /// Where it is.
    pub from: String,
    /// The root hash it names (signature partitions only).
    pub root_hash: Option<String>,
    /// SHA-256 of the signer's certificate, as recorded.
    pub certificate_fingerprint: Option<String>,
    /// Bytes of DER PKCS#7.
    pub size: usize,
}

/// What `inspect` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// The image.
    pub image: String,
    /// Its size.
    pub size: u64,
    /// "gpt" or "split".
    pub layout: String,
    /// GPT: disk GUID.
    pub disk_guid: Option<String>,
    /// GPT: sector size.
    pub sector_size: Option<u64>,
    /// GPT: whether the backup table had to be used.
    pub gpt_from_backup: bool,
    /// GPT partitions.
    pub partitions: Vec<PartitionInfo>,
    /// The root file system type found.
    pub fs: Option<String>,
    /// The verity superblock (if there is a hash tree).
    pub verity: Option<VerityInfo>,
    /// The root hash and where it came from.
    pub root_hash: Option<String>,
    /// Where the root hash came from.
    pub root_hash_source: Option<RootHashSource>,
    /// GPT: whether the verity partitions' UUIDs are the root hash halves.
    pub uuids_match_root_hash: Option<bool>,
    /// The signature (unverified).
    pub signature: Option<SignatureInfo>,
    /// The FEC parity (`build --fec`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fec: Option<FecInfo>,
    /// Problems found (an image `open` would refuse).
    pub problems: Vec<String>,
    /// What `open` warns about but takes (damaged parity, a backup fec_header used).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The verity superblock at the start of the hash region.
pub fn read_verity(l: &Layout) -> Result<Option<VerityParams>> {
    read_verity_in(&layout::LocalFiles, l)
}

/// The verity superblock at the start of the hash region, read through `files`.
pub fn read_verity_in(files: &dyn layout::Files, l: &Layout) -> Result<Option<VerityParams>> {
    let Some(h) = &l.hash else {
        return Ok(None);
    };
    let dev = files.open(&h.file)?;
    let w = crate::block::Window::new(&*dev, h.offset, h.size).ok_or_else(|| {
        ImageError::Invalid(format!("{}: hash region out of range", h.file.display()))
    })?;
    let sb = verity::read_superblock(&w, 0).map_err(|e| {
        ImageError::Invalid(format!(
            "{}: {}: {e}",
            l.image.display(),
            describe_region(h)
        ))
    })?;
    Ok(Some(VerityParams::from_superblock(&sb, 0)))
}

/// "partition 2 (root-x86-64-verity)" or the file name.
pub fn describe_region(r: &layout::Region) -> String {
    match r.partition {
        Some(n) => format!("partition {n}"),
        None => r.file.display().to_string(),
    }
}

/// Inspect `image`.
pub fn inspect(image: &Path) -> Result<Inspection> {
    let l = layout::locate(image)?;
    let mut problems = Vec::new();
    let (disk_guid, sector_size, from_backup, partitions) = match &l.kind {
        Kind::Gpt(g) => (
            Some(format_uuid(&g.disk_guid)),
            Some(g.sector_size),
            g.from_backup,
            g.entries
                .iter()
                .map(|e| PartitionInfo {
                    number: e.number,
                    r#type: dps::lookup(&e.type_guid)
                        .map_or_else(|| format_uuid(&e.type_guid), |t| t.name.to_string()),
                    uuid: format_uuid(&e.guid),
                    label: e.name.clone(),
                    offset: e.offset(g.sector_size),
                    size: e.size(g.sector_size),
                    flags: format!("{:#x}", e.flags),
                })
                .collect(),
        ),
        Kind::Split => (None, None, false, Vec::new()),
    };
    if from_backup {
        problems.push("the primary GPT header is damaged; the backup was used".into());
    }
    let verity = match read_verity(&l) {
        Ok(v) => v,
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    if l.hash.is_none() {
        problems
            .push("no dm-verity hash tree (root-x86-64-verity partition or .verity file)".into());
    }
    if l.fs.is_none() {
        problems.push("the root partition holds no EROFS, SquashFS or ext4 file system".into());
    }
    let mut warnings = Vec::new();
    let fec = match (&verity, &l.hash) {
        (Some(p), Some(h)) => match super::fec::resolve(&l, h, p, &Default::default()) {
            Ok((r, w)) => {
                warnings = w;
                r.and_then(|r| r.stored).map(|s| FecInfo {
                    roots: s.options.roots,
                    offset: s.options.offset,
                    size: u64::from(s.header.fec_size),
                    inp_size: s.header.inp_size,
                    header_offset: s.options.offset + u64::from(s.header.fec_size),
                    parity_intact: s.parity_intact,
                    backup_header: s.primary_damaged.is_some(),
                })
            }
            Err(e) => {
                problems.push(e.to_string());
                None
            }
        },
        _ => None,
    };
    let (root_hash, source) = match l.root_hash(None) {
        Ok((r, s)) => (Some(r), Some(s)),
        Err(_) => (None, None),
    };
    let uuids = root_hash.as_ref().and_then(|r| l.uuids_match(r));
    if uuids == Some(false) {
        problems.push(
            "the verity partitions' UUIDs are not the halves of the root hash (systemd would not \
             find them by it)"
                .into(),
        );
    }
    if let (Some(v), Some(r)) = (&verity, &root_hash) {
        if r.len() != v.hash.digest_size() {
            problems.push(format!(
                "the root hash has {} bytes, {} needs {}",
                r.len(),
                v.hash,
                v.hash.digest_size()
            ));
        }
        if v.data_size() > l.data.size {
            problems.push(format!(
                "the verity superblock covers {} bytes, the root partition has {}",
                v.data_size(),
                l.data.size
            ));
        }
    }
    Ok(Inspection {
        image: image.display().to_string(),
        size: l.image_size,
        layout: match l.kind {
            Kind::Gpt(_) => "gpt",
            Kind::Split => "split",
        }
        .into(),
        disk_guid,
        sector_size,
        gpt_from_backup: from_backup,
        partitions,
        fs: l.fs.map(|f| f.name().to_string()),
        verity: verity.map(|p| VerityInfo {
            hash: p.hash.name().into(),
            data_block_size: p.data_block_size,
            hash_block_size: p.hash_block_size,
            data_blocks: p.data_blocks,
            salt: hex::encode(&p.salt),
            uuid: format_uuid(&p.uuid),
        }),
        root_hash: root_hash.map(hex::encode),
        root_hash_source: source,
        uuids_match_root_hash: uuids,
        signature: l.signature.as_ref().map(|s| SignatureInfo {
            from: s.from.clone(),
            root_hash: s.root_hash.as_ref().map(hex::encode),
            certificate_fingerprint: s.certificate_fingerprint.map(hex::encode),
            size: s.der.len(),
        }),
        fec,
        problems,
        warnings,
    })
}

/// The text `inspect` prints.
pub fn render(i: &Inspection) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Image:        {} ({} bytes, {})",
        i.image, i.size, i.layout
    );
    if let Some(g) = &i.disk_guid {
        let _ = writeln!(o, "Disk GUID:    {g}");
    }
    if !i.partitions.is_empty() {
        let _ = writeln!(
            o,
            "\n  # {:<24} {:<36} {:>12} {:>12}  {:<18} LABEL",
            "TYPE", "UUID", "OFFSET", "SIZE", "FLAGS"
        );
        for p in &i.partitions {
            let _ = writeln!(
                o,
                "{:>3} {:<24} {:<36} {:>12} {:>12}  {:<18} {}",
                p.number, p.r#type, p.uuid, p.offset, p.size, p.flags, p.label
            );
        }
        o.push('\n');
    }
    let _ = writeln!(o, "File system:  {}", i.fs.as_deref().unwrap_or("unknown"));
    match &i.verity {
        Some(v) => {
            let _ = writeln!(
                o,
                "Verity:       {}, {} data blocks of {} bytes, hash blocks of {}, salt {}",
                v.hash, v.data_blocks, v.data_block_size, v.hash_block_size, v.salt
            );
            let _ = writeln!(o, "Verity UUID:  {}", v.uuid);
        }
        None => {
            let _ = writeln!(o, "Verity:       none");
        }
    }
    if let Some(r) = &i.root_hash {
        let src = match i.root_hash_source {
            Some(RootHashSource::SignaturePartition) => "from the signature partition",
            Some(RootHashSource::RootHashFile) => "from the .roothash file",
            Some(RootHashSource::PartitionUuids) => "from the verity partition UUIDs",
            _ => "",
        };
        let _ = writeln!(o, "Root hash:    {r} ({src})");
    }
    if let Some(m) = i.uuids_match_root_hash {
        let _ = writeln!(
            o,
            "UUIDs:        {}",
            if m {
                "root and root-verity partition UUIDs are the root hash halves"
            } else {
                "MISMATCH with the root hash"
            }
        );
    }
    match &i.signature {
        Some(s) => {
            let _ = writeln!(
                o,
                "Signature:    {} bytes of PKCS#7 in {}{}",
                s.size,
                s.from,
                s.certificate_fingerprint
                    .as_ref()
                    .map(|f| format!(", certificate SHA-256 {f}"))
                    .unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(o, "Signature:    none");
        }
    }
    if let Some(f) = &i.fec {
        let _ = writeln!(
            o,
            "FEC:          {} roots, {} bytes of parity at byte {} of the verity {} over {} bytes, fec_header at byte {} ({}{})",
            f.roots,
            f.size,
            f.offset,
            if i.layout == "split" { "file" } else { "partition" },
            f.inp_size,
            f.header_offset,
            if f.parity_intact { "parity SHA-256 matches" } else { "parity DAMAGED: SHA-256 mismatch" },
            if f.backup_header { ", backup header used" } else { "" }
        );
    }
    for p in &i.problems {
        let _ = writeln!(o, "Problem:      {p}");
    }
    for w in &i.warnings {
        let _ = writeln!(o, "Warning:      {w}");
    }
    o
}
