//! [`VerityVolume`]: one dm-verity volume (a data device, a hash device, the tree's
//! parameters and the claims on both), with its verbs: [`format`](VerityVolume::format),
//! [`verify`](VerityVolume::verify) and [`activate`](VerityVolume::activate). `dmkit verity`
//! and `dmkit image open` both open their volumes here, so the open sequence (files,
//! superblock, parameters, claims, size checks, device, root check) is written once.
//!
//! ```no_run
//! use dmkit::verity::volume::{Backing, ParamsSource, VerityVolume};
//! use dmkit::verity::{self, VerityOptions};
//! use std::path::Path;
//!
//! let (data, hash) = (Path::new("data.img"), Path::new("hash.img"));
//! let params = dmkit::verity::TreeSpec::default()
//!     .params(&dmkit::block::open_device(data, true, false)?, vec![0; 32])?;
//! let root = VerityVolume::format(data, hash, &params, || Ok::<(), verity::volume::VolumeError>(()))?;
//! let volume = VerityVolume::open(
//!     Backing::whole(data),
//!     Backing::whole(hash),
//!     ParamsSource::Superblock { hash_offset: 0 },
//!     true,
//! )?;
//! assert!(volume.verify(&root)?.ok());
//! let activated = volume.activate(&root, VerityOptions { name: "v".into(), ..Default::default() })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::fec::source::FecSource;
use super::fec::write::{write_fec, Covered};
use super::fec::{FecGeometry, FecOptions};
use super::sig::{SignatureError, VerifiedSigner};
use super::superblock::format_uuid;
use super::{TreeLayout, VerifyReport, VerityDevice, VerityError, VerityOptions, VerityParams};
use crate::block::{Activated, BlockDevice, BlockError, Claim, ClaimError, OpenError, Window};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use super::spec::TreeSpec;

/// Why a verity volume could not be formatted, opened, verified or activated.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A data or hash file could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A data or hash range could not be claimed.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The hash file to format could not be created or opened.
    #[error("{}: cannot open hash device: {source}", path.display())]
    CreateHash {
        /// The hash file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Bad parameters or devices that cannot hold them (the message names the one at fault).
    #[error("{0}")]
    Invalid(String),
    /// The verity layer refused (superblock, sizes, overlap, I/O while formatting or
    /// verifying).
    #[error(transparent)]
    Verity(#[from] VerityError),
    /// Reading the tree's top level to check the root hash failed.
    #[error(transparent)]
    ReadRoot(BlockError),
    /// The root hash does not match the tree (wrong root, salt or parameters).
    #[error("root hash {root_hex} does not match the hash tree")]
    RootMismatch {
        /// The root hash that was given.
        root_hex: String,
    },
    /// The root hash signature does not check out.
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// Forward error correction could not be computed or read.
    #[error(transparent)]
    Fec(#[from] super::fec::FecError),
}

crate::block::open::volume_failure!(VolumeError);

impl VolumeError {
    /// veritysetup's exit code: 2 for a failed verification (root mismatch, a signature that
    /// does not verify), 4 for a missing file or an unreadable signature or certificate, 5 for
    /// a busy one, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        use SignatureError as S;
        match self {
            VolumeError::Open(e) => e.exit_code(),
            VolumeError::Claim(ClaimError::Busy { .. }) => 5,
            VolumeError::CreateHash { .. } => 4,
            VolumeError::RootMismatch { .. } => 2,
            // A signature that does not check out, however garbled, is a failed verification.
            VolumeError::Signature(
                S::NotVerified { .. } | S::SignatureGarbled { .. } | S::SignatureNotDetached { .. },
            ) => 2,
            VolumeError::Signature(
                S::SignatureUnreadable { .. } | S::CertificateUnreadable { .. },
            ) => 4,
            VolumeError::Fec(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// Result type of [`VerityVolume`].
pub type Result<T> = std::result::Result<T, VolumeError>;

/// Where a data or hash area lies: a whole file, or a region of one (a partition of an image).
#[derive(Debug, Clone, Copy)]
pub struct Backing<'a> {
    /// The file or block device.
    pub path: &'a Path,
    /// The region (start, length) inside it; None: the whole file.
    pub region: Option<(u64, u64)>,
}

impl<'a> Backing<'a> {
    /// The whole of `path`.
    pub fn whole(path: &'a Path) -> Self {
        Backing { path, region: None }
    }
}

/// Where the tree's parameters come from.
#[derive(Debug, Clone)]
pub enum ParamsSource {
    /// The superblock at this offset of the hash device.
    Superblock {
        /// Byte offset of the superblock.
        hash_offset: u64,
    },
    /// Options alone (no superblock): resolved against the data device, no salt by default.
    Spec(TreeSpec),
    /// Parameters already known (read from an image's partition table and superblock).
    Given(VerityParams),
}

/// Where the root hash signature is.
#[derive(Debug, Clone, Copy)]
pub enum SignatureSource<'a> {
    /// A file holding the detached DER PKCS#7 signature.
    File(&'a Path),
    /// The signature's bytes (from an image's signature partition).
    Der(&'a [u8]),
}

/// Check a signature of `root_hex` against `certs` (see
/// [`crate::verity::sig::verify_root_hash_signature`]); returns the signer.
pub fn check_signature(
    root_hex: &str,
    signature: SignatureSource<'_>,
    certs: &[PathBuf],
) -> Result<VerifiedSigner> {
    match signature {
        SignatureSource::File(path) => Ok(super::sig::verify_root_hash_signature(
            root_hex, path, certs,
        )?),
        SignatureSource::Der(der) => {
            // The checker reads a file: hand it one in memory.
            let file = memfd("dmkit-root-hash-sig", der)?;
            let path = PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&file)
            ));
            let r = super::sig::verify_root_hash_signature(root_hex, &path, certs);
            drop(file);
            Ok(r?)
        }
    }
}

/// An anonymous in-memory file holding `bytes`.
fn memfd(name: &str, bytes: &[u8]) -> Result<std::fs::File> {
    let name = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: memfd_create(2) with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(VolumeError::Invalid(format!(
            "memfd_create: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor owned only here.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::io::Write::write_all(&mut &file, bytes)
        .map_err(|e| VolumeError::Invalid(format!("memfd: {e}")))?;
    Ok(file)
}

/// Whether two paths name the same file (data and hash area in one image).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The parameters and layout as JSON (`verity dump --json`, and the start of `status`).
pub fn params_json(p: &VerityParams, layout: &TreeLayout) -> Value {
    serde_json::json!({
        "uuid": if p.superblock { Some(format_uuid(&p.uuid)) } else { None },
        "hash_type": p.hash_type,
        "data_blocks": p.data_blocks,
        "data_block_size": p.data_block_size,
        "hash_blocks": layout.tree_blocks(),
        "hash_block_size": p.hash_block_size,
        "hash_algorithm": p.hash.name(),
        "salt": hex::encode(&p.salt),
        "hash_offset": p.hash_offset,
        "superblock": p.superblock,
        "hash_device_size": layout.hash_device_size(),
    })
}

/// A dm-verity volume: data and hash devices (whole files or regions), the tree's
/// parameters, and the claims held on both while it lives.
pub struct VerityVolume {
    data: Arc<dyn BlockDevice>,
    hash: Arc<dyn BlockDevice>,
    data_path: PathBuf,
    hash_path: PathBuf,
    params: VerityParams,
    same_file: bool,
    /// The hash area's region of its file, when it is one (a partition of an image).
    hash_region: Option<(u64, u64)>,
    claims: Vec<Claim>,
    /// Where data blocks are also kept (a remote image's cache); see [`Self::with_store`].
    store: Option<Arc<dyn super::store::BlockStore>>,
    /// A FEC area on a device already open (a remote object), named for `status`; see
    /// [`Self::with_fec_device`].
    fec_device: Option<(Arc<dyn BlockDevice>, String, FecOptions)>,
}

impl VerityVolume {
    /// Build the hash tree of the data file `data` into `hash` (created if missing, grown to
    /// the tree's size when a regular file; it may be `data` itself with a hash offset past
    /// the data) and write the superblock; returns the root hash. `confirm` runs after the
    /// hash area is claimed and before anything is written: it may refuse (a prompt).
    pub fn format<E: From<VolumeError>>(
        data: &Path,
        hash: &Path,
        params: &VerityParams,
        confirm: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<u8>, E> {
        let data_dev = crate::block::open_device(data, true, false).map_err(VolumeError::from)?;
        Ok(Self::format_device(&data_dev, data, hash, params, None, confirm)?.0)
    }

    /// [`format`](Self::format) over a data device already open (at `data`), and with `fec`,
    /// the FEC area written into its file after the tree (while the hash file is still
    /// claimed); returns the root hash and the FEC geometry.
    pub fn format_device<E: From<VolumeError>>(
        data_dev: &dyn BlockDevice,
        data: &Path,
        hash: &Path,
        params: &VerityParams,
        fec: Option<(&Path, FecOptions)>,
        confirm: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<(Vec<u8>, Option<FecGeometry>), E> {
        let layout = TreeLayout::new(params).map_err(|e| VolumeError::Invalid(e.to_string()))?;
        let same = same_file(data, hash);
        if same && params.data_size() > params.hash_offset {
            return Err(VolumeError::from(VerityError::Overlap {
                hash_offset: params.hash_offset,
                data_end: params.data_size(),
            })
            .into());
        }
        let (file, _claim) = create_hash_file(hash, params.hash_offset)?;
        confirm()?;
        let meta = file
            .metadata()
            .map_err(|e| VolumeError::Invalid(format!("{}: {e}", hash.display())))?;
        if meta.is_file() && meta.len() < layout.new_file_size() {
            file.set_len(layout.new_file_size()).map_err(|e| {
                VolumeError::Invalid(format!(
                    "{}: cannot extend hash device: {e}",
                    hash.display()
                ))
            })?;
        }
        let hash_dev = crate::block::open_device(hash, false, false).map_err(VolumeError::from)?;
        let root = super::format(data_dev, &hash_dev, params, same).map_err(VolumeError::from)?;
        let geometry = match fec {
            Some((path, opts)) => {
                let covered = Covered {
                    data: data_dev,
                    hash: &hash_dev,
                    fec_in_hash: same_file(hash, path),
                    fec_in_data: same_file(data, path),
                };
                Some(write_fec(&covered, params, path, &opts).map_err(VolumeError::from)?)
            }
            None => None,
        };
        Ok((root, geometry))
    }

    /// Open the data and hash areas read-only, claim them shared when `claim` (other verity
    /// devices may read them; writers may not), and resolve the parameters from `source`.
    pub fn open(
        data: Backing<'_>,
        hash: Backing<'_>,
        source: ParamsSource,
        claim: bool,
    ) -> Result<Self> {
        Self::open_mode(data, hash, source, claim, false)
    }

    /// [`open`](Self::open) read-write with both areas claimed exclusively: for `verity
    /// repair`, the one writer of a volume nobody else has open.
    pub fn open_writable(
        data: Backing<'_>,
        hash: Backing<'_>,
        source: ParamsSource,
    ) -> Result<Self> {
        Self::open_mode(data, hash, source, true, true)
    }

    fn open_mode(
        data: Backing<'_>,
        hash: Backing<'_>,
        source: ParamsSource,
        claim: bool,
        writable: bool,
    ) -> Result<Self> {
        let data_file = crate::block::open_device(data.path, !writable, false)?;
        let hash_file = crate::block::open_device(hash.path, !writable, false)?;
        let mut claims = Vec::new();
        if claim {
            for (f, b) in [(&data_file, &data), (&hash_file, &hash)] {
                let (start, len) = b.region.unwrap_or((0, 0));
                // One file holding both areas is claimed once when exclusive.
                if writable && claims.len() == 1 && same_file(data.path, hash.path) {
                    continue;
                }
                claims.push(Claim::take(f.file(), b.path, start, len, writable)?);
            }
        }
        let data_dev = windowed(data_file, &data)?;
        let hash_dev = windowed(hash_file, &hash)?;
        let params = resolve_params(source, &*data_dev, &*hash_dev)?;
        // Regions of one image never overlap; whole files that are one file share it.
        let same =
            data.region.is_none() && hash.region.is_none() && same_file(data.path, hash.path);
        Ok(VerityVolume {
            data: data_dev,
            hash: hash_dev,
            data_path: data.path.to_path_buf(),
            hash_path: hash.path.to_path_buf(),
            params,
            same_file: same,
            hash_region: hash.region,
            claims,
            store: None,
            fec_device: None,
        })
    }

    /// A volume over data and hash devices already open (remote objects, named by `data_name`
    /// and `hash_name` in `status`), parameters resolved from `source`; nothing is claimed.
    pub fn from_devices(
        data: Arc<dyn BlockDevice>,
        hash: Arc<dyn BlockDevice>,
        data_name: &str,
        hash_name: &str,
        source: ParamsSource,
    ) -> Result<Self> {
        let params = resolve_params(source, &*data, &*hash)?;
        Ok(VerityVolume {
            data,
            hash,
            data_path: PathBuf::from(data_name),
            hash_path: PathBuf::from(hash_name),
            params,
            same_file: false,
            hash_region: None,
            claims: Vec::new(),
            store: None,
            fec_device: None,
        })
    }

    /// Serve data blocks from `store` too (each verified again), hand it the blocks that
    /// verify, and fetch a failing block again through it before reporting it corrupt.
    pub fn with_store(mut self, store: Arc<dyn super::store::BlockStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Correct from the FEC area at `opts.offset` of `device` (a remote object, named `name`
    /// in `status`) when [`VerityOptions::fec`] names no file. Nothing in it is trusted: what
    /// it rebuilds is served only when it hashes as the tree says.
    pub fn with_fec_device(
        mut self,
        device: Arc<dyn BlockDevice>,
        name: &str,
        opts: FecOptions,
    ) -> Self {
        self.fec_device = Some((device, name.to_string(), opts));
        self
    }

    /// The tree's parameters.
    pub fn params(&self) -> &VerityParams {
        &self.params
    }

    /// The data device's size in bytes (the covered part is `params().data_size()`).
    pub fn data_size(&self) -> u64 {
        self.data.size()
    }

    /// Check every data and hash block against `root` offline.
    pub fn verify(&self, root: &[u8]) -> Result<VerifyReport> {
        Ok(super::verify(
            &*self.data,
            &*self.hash,
            &self.params,
            root,
            self.same_file,
        )?)
    }

    /// Activate the volume as `opts.name`, checked against `root`: the verifying device, its
    /// stats and claims, kind "verity", and details naming the files, the root hash and the
    /// options. A root hash that does not match the tree is refused unless
    /// `opts.ignore_corruption`.
    pub fn activate(self, root: &[u8], opts: VerityOptions) -> Result<Activated> {
        let layout =
            TreeLayout::new(&self.params).map_err(|e| VolumeError::Invalid(e.to_string()))?;
        super::check_sizes(
            &*self.data,
            &*self.hash,
            &self.params,
            &layout,
            self.same_file,
        )?;
        let root_hex = hex::encode(root);
        let mut details = params_json(&self.params, &layout);
        // Absolute paths: status is read from anywhere, not from where `open` ran.
        let absolute = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        details["data_device"] = absolute(&self.data_path).display().to_string().into();
        details["hash_device"] = absolute(&self.hash_path).display().to_string().into();
        details["root_hash"] = root_hex.clone().into();
        details["check_at_most_once"] = opts.check_at_most_once.into();
        details["ignore_corruption"] = opts.ignore_corruption.into();
        details["data_cache_bytes"] = opts.data_cache_bytes.into();
        let name = opts.name.clone();
        let ignore = opts.ignore_corruption;
        let mut claims = self.claims;
        let fec = match &opts.fec {
            Some((path, fo)) => {
                let file = crate::block::open_device(path, true, false)?;
                let in_hash_file = same_file(&self.hash_path, path);
                if !in_hash_file {
                    claims.push(Claim::take(file.file(), path, fo.offset, 0, false)?);
                }
                details["fec_device"] = absolute(path).display().to_string().into();
                details["fec_offset"] = fo.offset.into();
                details["fec_roots"] = fo.roots.into();
                // A FEC area inside the hash region (after the tree in an image's verity
                // partition) is read through that region, at its offset there.
                let (device, local, in_hash): (Arc<dyn BlockDevice>, _, _) =
                    match (in_hash_file, self.hash_region) {
                        (true, Some((start, len)))
                            if fo.offset >= start && fo.offset - start < len =>
                        {
                            let local = super::fec::FecOptions {
                                offset: fo.offset - start,
                                ..*fo
                            };
                            (self.hash.clone(), local, true)
                        }
                        (true, Some(_)) => (Arc::new(file), *fo, false),
                        (in_hash, None) => (Arc::new(file), *fo, in_hash),
                        (false, Some(_)) => (Arc::new(file), *fo, false),
                    };
                let source = FecSource::new(
                    &self.params,
                    &local,
                    device,
                    &*self.data,
                    &*self.hash,
                    in_hash,
                )?;
                Some(source)
            }
            None => match self.fec_device {
                Some((device, fec_name, fo)) => {
                    details["fec_device"] = fec_name.into();
                    details["fec_offset"] = fo.offset.into();
                    details["fec_roots"] = fo.roots.into();
                    Some(FecSource::new(
                        &self.params,
                        &fo,
                        device,
                        &*self.data,
                        &*self.hash,
                        false,
                    )?)
                }
                None => None,
            },
        };
        let mut dev = VerityDevice::new(self.data, self.hash, self.params, root.to_vec(), opts)
            .map_err(|e| VolumeError::Invalid(e.to_string()))?;
        if let Some(f) = fec {
            dev = dev.with_fec(f);
        }
        if let Some(store) = self.store {
            dev = dev.with_store(store);
        }
        let matches = dev.check_root().map_err(VolumeError::ReadRoot)?;
        if !matches && !ignore {
            return Err(VolumeError::RootMismatch { root_hex });
        }
        let stats = dev.stats();
        Ok(Activated {
            name,
            device: Arc::new(dev),
            kind: "verity".to_string(),
            details,
            stats: Some(Arc::new(move || stats.to_json())),
            claims,
            allow_discards: false,
            online: None,
        })
    }
}

/// The parameters `source` names: the superblock in `hash`, options resolved against `data`,
/// or given.
fn resolve_params(
    source: ParamsSource,
    data: &dyn BlockDevice,
    hash: &dyn BlockDevice,
) -> Result<VerityParams> {
    Ok(match source {
        ParamsSource::Superblock { hash_offset } => {
            let sb = super::read_superblock(hash, hash_offset)?;
            let p = VerityParams::from_superblock(&sb, hash_offset);
            p.validate()
                .map_err(|e| VolumeError::Invalid(e.to_string()))?;
            p
        }
        ParamsSource::Spec(spec) => spec
            .params(data, Vec::new())
            .map_err(VolumeError::Invalid)?,
        ParamsSource::Given(p) => p,
    })
}

/// The device over `b`: the file itself, or a window on its region.
fn windowed(file: crate::block::FileDevice, b: &Backing<'_>) -> Result<Arc<dyn BlockDevice>> {
    let Some((start, len)) = b.region else {
        return Ok(Arc::new(file));
    };
    let w = Window::new(Arc::new(file) as Arc<dyn BlockDevice>, start, len).ok_or_else(|| {
        VolumeError::Invalid(format!("{}: region out of range", b.path.display()))
    })?;
    Ok(Arc::new(w))
}

mod fec_verbs;

/// Create (or open) the hash file to format and claim its hash area exclusively.
fn create_hash_file(path: &Path, hash_offset: u64) -> Result<(std::fs::File, Claim)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| VolumeError::CreateHash {
            path: path.to_path_buf(),
            source,
        })?;
    let claim = Claim::take(&f, path, hash_offset, 0, true)?;
    Ok((f, claim))
}
