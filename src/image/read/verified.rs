//! Opening an image's root partition through dmkit's own dm-verity, checked the way `image
//! open` checks it (root hash, partition UUIDs, signature with `--cert`, the tree's top level,
//! FEC): one sequence for the kernel mount stack ([`super::super::open`]) and the userspace
//! readers, so both trust exactly the same bytes. Nothing here needs root.

use crate::block::{Activated, BlockDevice};
use crate::image::fec::{self, FecChoice};
use crate::image::inspect::{describe_region, read_verity_in};
use crate::image::layout::{self, Layout, RootHashSource};
use crate::image::mkfs::FsKind;
use crate::image::remote::{self, RemoteFiles, RemoteImageOptions};
use crate::image::{ImageError, Result};
use crate::verity::sig::{SignatureError, VerifiedSigner};
use crate::verity::volume::{
    self, Backing, ParamsSource, SignatureSource, VerityVolume, VolumeError,
};
use crate::verity::{self, TreeLayout, VerityOptions, VerityParams};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to check an image.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// The image.
    pub image: PathBuf,
    /// Certificates one of which must have signed the root hash (none: no check).
    pub certs: Vec<PathBuf>,
    /// The root hash to trust, instead of the image's.
    pub root_hash: Option<Vec<u8>>,
    /// Where the FEC parity comes from.
    pub fec: FecChoice,
    /// How the image's objects are fetched and cached when it is a URL.
    pub remote: RemoteImageOptions,
}

/// An image whose root partition is readable only through its verity tree.
pub struct Verified {
    /// The parts of the image.
    pub layout: Layout,
    /// The file system in the root partition.
    pub fs: FsKind,
    /// The root hash the tree was checked against (hex).
    pub root_hex: String,
    /// Where the root hash came from.
    pub root_hash_source: RootHashSource,
    /// Who signed it, when certificates were given.
    pub signer: Option<VerifiedSigner>,
    /// The FEC parity used, as `status` shows it.
    pub fec: Option<Value>,
    /// What the user should know (a backup fec_header used, damaged parity).
    pub warnings: Vec<String>,
    /// The verity volume, activated (not exported): every read is verified against the tree.
    pub activated: Activated,
    /// The tree's parameters.
    pub params: VerityParams,
    /// Whether the image is read from a remote object (then without FEC).
    pub remote: bool,
}

impl Verified {
    /// The verified data path: reads of the root partition, each block checked (and
    /// FEC-corrected) before it is returned.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.activated.device.clone()
    }
}

/// Check the signature of `root_hex` against `certs`: `Verification` (exit 2) when it does not
/// verify, `Invalid` when a certificate cannot be read.
pub fn check_signature(l: &Layout, root_hex: &str, certs: &[PathBuf]) -> Result<VerifiedSigner> {
    let Some(sig) = &l.signature else {
        return Err(ImageError::Verification(format!(
            "{}: the image is not signed (no root-x86-64-verity-sig partition or .roothash.p7s \
             file), but --cert requires a valid signature",
            l.image.display()
        )));
    };
    volume::check_signature(root_hex, SignatureSource::Der(&sig.der), certs).map_err(|e| match e {
        VolumeError::Signature(e) => signature_error(l, root_hex, &sig.from, e),
        VolumeError::Invalid(m) => ImageError::Io(m),
        other => ImageError::Invalid(other.to_string()),
    })
}

/// The image's words for a signature that does not check out.
fn signature_error(l: &Layout, root_hex: &str, from: &str, e: SignatureError) -> ImageError {
    match e {
        SignatureError::NotVerified { certs, reason, .. } => ImageError::Verification(format!(
            "{}: the root hash signature in {from} does not verify over root hash {root_hex} \
             against the {certs} given certificate(s): {reason}",
            l.image.display(),
        )),
        SignatureError::SignatureGarbled { reason, .. } => ImageError::Verification(format!(
            "{}: the signature in {from} is not a DER PKCS#7 signature: {reason}",
            l.image.display(),
        )),
        SignatureError::SignatureNotDetached { .. } => ImageError::Verification(format!(
            "{}: the signature in {from} embeds its content; dm-verity needs a detached signature",
            l.image.display(),
        )),
        other => ImageError::Invalid(other.to_string()),
    }
}

/// A partition (or sidecar file) of the image as the verity volume's backing.
fn backing(r: &layout::Region) -> Backing<'_> {
    Backing {
        path: &r.file,
        region: Some((r.offset, r.size)),
    }
}

/// Find the parts of `o.image`, check its root hash (and signature with certificates) and
/// activate its verity volume as `name` (not exported: the caller serves or reads it).
pub fn open_verified(o: &VerifyOptions, name: &str) -> Result<Verified> {
    let image = &o.image;
    // A URL: its files are read through the remote transport, its blocks verified by the
    // remote verity layer (see [`crate::image::remote`]).
    let remote_files = remote::location(image)?.map(|_| RemoteFiles::new(&o.remote));
    let files: &dyn layout::Files = match &remote_files {
        Some(r) => r,
        None => &layout::LocalFiles,
    };
    let l = layout::locate_in(image, files)?;
    let Some(hash_region) = l.hash.clone() else {
        return Err(ImageError::Invalid(format!(
            "{}: no dm-verity hash tree (an image without verity: no root-x86-64-verity \
             partition or .verity file)",
            image.display()
        )));
    };
    let fs_kind = l.fs.ok_or_else(|| {
        ImageError::Invalid(format!(
            "{}: {} holds no EROFS, SquashFS or ext4 file system",
            image.display(),
            describe_region(&l.data)
        ))
    })?;
    let (root, source) = l.root_hash(o.root_hash.as_deref())?;
    let root_hex = hex::encode(&root);
    if l.uuids_match(&root) == Some(false) {
        return Err(ImageError::Verification(format!(
            "{}: the root and root-verity partition UUIDs are not the halves of root hash {root_hex}",
            image.display()
        )));
    }
    let signer = if o.certs.is_empty() {
        None
    } else {
        Some(check_signature(&l, &root_hex, &o.certs)?)
    };
    let params = read_verity_in(files, &l)?.expect("the hash region exists");
    let root = verity::parse_root_hash(&root_hex, &params)
        .map_err(|e| ImageError::Invalid(format!("{}: {e}", image.display())))?;
    TreeLayout::new(&params)
        .map_err(|e| ImageError::Invalid(format!("{}: {e}", image.display())))?;
    let image_err = |e: VolumeError| volume_error(image, &root_hex, &hash_region, e);
    if let Some(files) = &remote_files {
        if matches!(o.fec, FecChoice::Device(..)) {
            return Err(ImageError::Invalid(format!(
                "{}: --fec-device: forward error correction is not available for remote \
                 images (a block that fails is fetched again, then fails with EIO)",
                image.display()
            )));
        }
        let activated = remote::activate(
            files,
            &l.data,
            &hash_region,
            params.clone(),
            &root,
            name,
            &o.remote,
        )
        .map_err(image_err)?;
        return Ok(Verified {
            layout: l,
            fs: fs_kind,
            root_hex,
            root_hash_source: source,
            signer,
            fec: None,
            warnings: Vec::new(),
            activated,
            params,
            remote: true,
        });
    }
    let (fec, warnings) = fec::resolve(&l, &hash_region, &params, &o.fec)?;
    let volume = VerityVolume::open(
        backing(&l.data),
        backing(&hash_region),
        ParamsSource::Given(params.clone()),
        true,
    )
    .map_err(image_err)?;
    let opts = VerityOptions {
        name: name.to_string(),
        fec: fec.as_ref().map(|f| f.device.clone()),
        ..VerityOptions::default()
    };
    let fec_details = fec.map(|f| f.details);
    let activated = volume.activate(&root, opts).map_err(image_err)?;
    Ok(Verified {
        layout: l,
        fs: fs_kind,
        root_hex,
        root_hash_source: source,
        signer,
        fec: fec_details,
        warnings,
        activated,
        params,
        remote: false,
    })
}

/// The image's words for a verity volume that would not open.
fn volume_error(
    image: &Path,
    root_hex: &str,
    hash_region: &layout::Region,
    e: VolumeError,
) -> ImageError {
    match e {
        VolumeError::Open(e) => ImageError::Invalid(e.to_string()),
        VolumeError::Claim(e) => ImageError::Busy(e.to_string()),
        VolumeError::ReadRoot(e) => ImageError::Io(format!("{}: {e}", image.display())),
        VolumeError::Verity(e) => ImageError::Invalid(format!("{}: {e}", image.display())),
        VolumeError::RootMismatch { .. } => ImageError::Verification(format!(
            "{}: root hash {root_hex} does not match the hash tree in {}",
            image.display(),
            describe_region(hash_region)
        )),
        e => ImageError::Invalid(e.to_string()),
    }
}

/// An image opened for reading: the checked volume and a reader of its file system.
pub struct OpenedImage {
    /// The checked volume.
    pub verified: Verified,
    /// The file system, read through the verified path.
    pub fs: Box<dyn super::FsReader>,
}

/// Open `o.image` for the rootless commands: check it as [`open_verified`] does and open the
/// reader of its file system over the verified device.
pub fn open_image(o: &VerifyOptions) -> Result<OpenedImage> {
    // The volume's name starts every block error, after the image and the path.
    let verified = open_verified(o, "root partition")?;
    let src = super::Source::new(verified.device());
    let fs = super::open_reader(verified.fs, src).map_err(|e| {
        let msg = format!(
            "{}: {} file system: {e}",
            o.image.display(),
            verified.fs.name()
        );
        match e {
            super::ReadError::Io(_) => ImageError::Verification(msg),
            _ => ImageError::Invalid(msg),
        }
    })?;
    Ok(OpenedImage { verified, fs })
}
