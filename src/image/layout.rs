//! Where the parts of an image are: in a GPT disk image, the first root partition (this
//! machine's architecture first), else the first usr partition, with the verity and verity
//! signature partitions of the same role and architecture; for a bare file system image (as
//! `build --split` writes it), the sidecar files systemd looks for beside it (`NAME.verity`,
//! `NAME.roothash` or `NAME.usrhash`, and its `.p7s`, NAME being the image path without `.raw`).
//!
//! Nothing read here is trusted yet: the root hash found is only checked against the tree and
//! the signature later (by `open`), and every offset comes from a validated table.

use super::dps::{self, Role};
use super::gpt::{self, Gpt, Guid};
use super::mkfs::FsKind;
use super::sigjson::SigJson;
use super::{ImageError, Result};
use crate::block::{BlockDevice, FileDevice, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A byte range of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// The file.
    pub file: PathBuf,
    /// First byte.
    pub offset: u64,
    /// Length.
    pub size: u64,
    /// The GPT partition number, if it is one.
    pub partition: Option<u32>,
    /// The partition UUID, if it is one.
    pub uuid: Option<Guid>,
}

/// A root hash signature, from a signature partition or a `.roothash.p7s` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The root hash the signature partition names (`None` for a bare `.p7s`).
    pub root_hash: Option<Vec<u8>>,
    /// SHA-256 of the signer's certificate, if recorded.
    pub certificate_fingerprint: Option<[u8; 32]>,
    /// The DER PKCS#7 signature.
    pub der: Vec<u8>,
    /// Where it was read from.
    pub from: String,
}

/// How the image is laid out.
#[derive(Debug, Clone)]
pub enum Kind {
    /// A GPT disk image.
    Gpt(Gpt),
    /// A bare file system with sidecar files.
    Split,
}

/// Where a root hash came from, most trusted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RootHashSource {
    /// The command line.
    Given,
    /// The signature partition's JSON.
    SignaturePartition,
    /// The `.roothash` sidecar file.
    RootHashFile,
    /// The verity partitions' UUIDs (halves of the root hash, by the specification).
    PartitionUuids,
}

/// The parts of an image.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The image file.
    pub image: PathBuf,
    /// Its size.
    pub image_size: u64,
    /// GPT or split.
    pub kind: Kind,
    /// The file system (verity data).
    pub data: Region,
    /// The verity hash tree, if there is one.
    pub hash: Option<Region>,
    /// The signature, if there is one (its partition or file could be read and parsed).
    pub signature: Option<Signature>,
    /// The root hash in a `.roothash` file, if there is one.
    pub roothash_file: Option<Vec<u8>>,
    /// The file system found in the data region, by magic number.
    pub fs: Option<FsKind>,
}

fn invalid(image: &Path, what: impl std::fmt::Display) -> ImageError {
    ImageError::Invalid(format!("{}: {what}", image.display()))
}

/// `NAME.SUFFIX` beside an image `NAME[.raw]`, as systemd's `build_auxiliary_path`.
pub fn sidecar(image: &Path, suffix: &str) -> PathBuf {
    let s = image.as_os_str().to_string_lossy();
    let base = s.strip_suffix(".raw").unwrap_or(&s);
    PathBuf::from(format!("{base}{suffix}"))
}

/// Open a file for reading as a device, with a message naming it.
pub fn open_file(path: &Path) -> Result<FileDevice> {
    FileDevice::open(
        path,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .map_err(|e| invalid(path, format!("cannot open: {e}")))
}

/// Read `region` of a local file into memory (at most `max` bytes).
pub fn read_region(region: &Region, max: u64) -> Result<Vec<u8>> {
    read_region_in(&LocalFiles, region, max)
}

/// Where the files of an image are read from: local files, or remote objects
/// ([`crate::image::remote`]). Nothing read through it is trusted.
pub trait Files {
    /// The file at `path` (the image, a sidecar) as a read-only device.
    fn open(&self, path: &Path) -> Result<Arc<dyn BlockDevice>>;
    /// The size of the sidecar file at `path`, or `None` when there is none.
    fn size(&self, path: &Path) -> Result<Option<u64>>;
}

/// The image's files on the local file system.
pub struct LocalFiles;

impl Files for LocalFiles {
    fn open(&self, path: &Path) -> Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(open_file(path)?))
    }
    fn size(&self, path: &Path) -> Result<Option<u64>> {
        Ok(std::fs::metadata(path).ok().map(|m| m.len()))
    }
}

/// Read `region` of a file opened through `files` (at most `max` bytes).
pub fn read_region_in(files: &dyn Files, region: &Region, max: u64) -> Result<Vec<u8>> {
    if region.size > max {
        return Err(invalid(
            &region.file,
            format!(
                "{} bytes at byte {} is more than {max}",
                region.size, region.offset
            ),
        ));
    }
    let dev = files.open(&region.file)?;
    let mut buf = vec![0u8; region.size as usize];
    dev.read_at(&mut buf, region.offset)
        .map_err(|e| invalid(&region.file, e))?;
    Ok(buf)
}

fn probe_fs(dev: &dyn BlockDevice, offset: u64, size: u64) -> Option<FsKind> {
    let n = size.min(4096) as usize;
    let mut b = vec![0u8; n];
    dev.read_at(&mut b, offset).ok()?;
    FsKind::probe(&b)
}

/// Find the parts of `image`.
pub fn locate(image: &Path) -> Result<Layout> {
    locate_in(image, &LocalFiles)
}

/// Find the parts of `image`, reading its files through `files`.
pub fn locate_in(image: &Path, files: &dyn Files) -> Result<Layout> {
    let dev = files.open(image)?;
    let size = dev.size();
    match gpt::parse(&*dev) {
        Ok(g) => from_gpt(image, files, &*dev, g),
        Err(gpt::GptError::NotGpt) => match probe_fs(&*dev, 0, size) {
            Some(fs) => from_split(image, files, size, fs),
            None => Err(invalid(
                image,
                "neither a GPT disk image nor an EROFS, SquashFS or ext4 file system",
            )),
        },
        Err(e) => Err(invalid(image, e)),
    }
}

fn from_gpt(image: &Path, files: &dyn Files, dev: &dyn BlockDevice, g: Gpt) -> Result<Layout> {
    let sector = g.sector_size;
    // The first partition of a role, this machine's architecture first (as systemd prefers).
    let native = dps::native_architecture();
    let find_in = |role: Role, arch: Option<&str>| {
        g.entries.iter().find(|e| {
            dps::lookup(&e.type_guid)
                .is_some_and(|t| t.role == role && (arch.is_none() || t.arch == arch))
        })
    };
    let find = |role: Role| find_in(role, native).or_else(|| find_in(role, None));
    let region = |e: &gpt::Entry| Region {
        file: image.to_path_buf(),
        offset: e.offset(sector),
        size: e.size(sector),
        partition: Some(e.number),
        uuid: Some(e.guid),
    };
    // A root partition, else a /usr one (`build --type usr`); its verity and signature
    // partitions are those of the same role and architecture.
    let found = [Role::Root, Role::Usr]
        .into_iter()
        .find_map(|r| find(r).map(|e| (r, e)));
    let Some((role, root)) = found else {
        let types: Vec<String> = g
            .entries
            .iter()
            .map(|e| {
                dps::lookup(&e.type_guid).map_or_else(
                    || crate::verity::superblock::format_uuid(&e.type_guid),
                    |t| t.name.to_string(),
                )
            })
            .collect();
        return Err(invalid(
            image,
            format!(
                "no root or usr partition (the partitions are: {})",
                if types.is_empty() {
                    "none".to_string()
                } else {
                    types.join(", ")
                }
            ),
        ));
    };
    let data = region(root);
    let fs = probe_fs(dev, data.offset, data.size);
    let arch = dps::lookup(&root.type_guid).and_then(|t| t.arch);
    let companion = |r: Option<Role>| r.and_then(|r| find_in(r, arch));
    let hash = companion(role.verity()).map(region);
    let signature = match companion(role.verity_sig()) {
        None => None,
        Some(e) => {
            let r = region(e);
            let bytes = read_region_in(files, &r, super::sigjson::MAX_SIZE).map_err(|_| {
                invalid(
                    image,
                    format!(
                        "partition {} ({}): {} bytes, more than a signature partition may hold",
                        e.number,
                        type_name(e),
                        r.size
                    ),
                )
            })?;
            let s = SigJson::parse(&bytes).map_err(|err| {
                invalid(
                    image,
                    format!("partition {} ({}): {err}", e.number, type_name(e)),
                )
            })?;
            Some(Signature {
                root_hash: Some(s.root_hash),
                certificate_fingerprint: s.certificate_fingerprint,
                der: s.signature,
                from: format!("partition {} ({})", e.number, type_name(e)),
            })
        }
    };
    Ok(Layout {
        image: image.to_path_buf(),
        image_size: dev.size(),
        kind: Kind::Gpt(g),
        data,
        hash,
        signature,
        roothash_file: None,
        fs,
    })
}

/// The DPS name of a partition's type.
fn type_name(e: &gpt::Entry) -> &'static str {
    dps::lookup(&e.type_guid).map_or("?", |t| t.name)
}

fn from_split(image: &Path, files: &dyn Files, size: u64, fs: FsKind) -> Result<Layout> {
    let whole = |file: PathBuf, size: u64| Region {
        file,
        offset: 0,
        size,
        partition: None,
        uuid: None,
    };
    let verity = sidecar(image, ".verity");
    let hash = files.size(&verity)?.map(|len| whole(verity, len));
    // `.roothash` for a root file system, `.usrhash` for a /usr one (`build --type usr`).
    let mut found = None;
    for s in [".roothash", ".usrhash"] {
        if let Some(len) = files.size(&sidecar(image, s))? {
            found = Some((s, len));
            break;
        }
    }
    let hash_suffix = found.map_or(".roothash", |(s, _)| s);
    let rh_path = sidecar(image, hash_suffix);
    let roothash_file = match found {
        Some((_, len)) => {
            // A root hash is at most 64 bytes of digest in hex, and a newline.
            let t = read_region_in(files, &whole(rh_path.clone(), len), 4096)?;
            let t = String::from_utf8_lossy(&t);
            Some(hex::decode(t.trim()).map_err(|_| invalid(&rh_path, "not a hex root hash"))?)
        }
        None => None,
    };
    let p7s = sidecar(image, &format!("{hash_suffix}.p7s"));
    let signature = match files.size(&p7s)? {
        Some(len) => Some(Signature {
            root_hash: None,
            certificate_fingerprint: None,
            der: read_region_in(files, &whole(p7s.clone(), len), super::sigjson::MAX_SIZE)?,
            from: p7s.display().to_string(),
        }),
        None => None,
    };
    Ok(Layout {
        image: image.to_path_buf(),
        image_size: size,
        kind: Kind::Split,
        data: whole(image.to_path_buf(), size),
        hash,
        signature,
        roothash_file,
        fs: Some(fs),
    })
}

impl Layout {
    /// The root hash to check the tree against, and where it came from: `given` first, then
    /// the signature partition, the `.roothash` file, and last the verity partitions' UUIDs.
    /// A given root hash that disagrees with the signature partition's is refused.
    pub fn root_hash(&self, given: Option<&[u8]>) -> Result<(Vec<u8>, RootHashSource)> {
        let signed = self.signature.as_ref().and_then(|s| s.root_hash.clone());
        if let Some(g) = given {
            if let Some(s) = &signed {
                if s != g {
                    return Err(ImageError::Verification(format!(
                        "{}: --root-hash {} differs from the root hash {} in the signature partition",
                        self.image.display(),
                        hex::encode(g),
                        hex::encode(s)
                    )));
                }
            }
            return Ok((g.to_vec(), RootHashSource::Given));
        }
        if let Some(s) = signed {
            return Ok((s, RootHashSource::SignaturePartition));
        }
        if let Some(r) = &self.roothash_file {
            return Ok((r.clone(), RootHashSource::RootHashFile));
        }
        match (&self.data.uuid, self.hash.as_ref().and_then(|h| h.uuid)) {
            (Some(d), Some(h)) => Ok((
                [d.as_slice(), h.as_slice()].concat(),
                RootHashSource::PartitionUuids,
            )),
            _ => Err(invalid(
                &self.image,
                "no root hash: give --root-hash (or a .roothash file beside the image)",
            )),
        }
    }

    /// For a GPT image: whether the verity partitions' UUIDs are the halves of `root_hash`,
    /// as systemd's dissection requires (`None` for split images).
    pub fn uuids_match(&self, root_hash: &[u8]) -> Option<bool> {
        let (d, h) = dps::verity_partition_uuids(root_hash)?;
        match (self.data.uuid, self.hash.as_ref().and_then(|r| r.uuid)) {
            (Some(du), Some(hu)) => Some(du == d && hu == h),
            _ => None,
        }
    }
}
