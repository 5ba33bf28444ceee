//! Read-only root images in one command, as systemd-repart and mkosi build them and
//! systemd-dissect reads them: a compressed read-only file system (EROFS or SquashFS, or
//! ext4), dm-verity over it, and a signature of the root hash, in a GPT disk image laid out as
//! the Discoverable Partitions Specification says (root, root-verity, root-verity-sig); opened
//! anywhere through dmkit's own verity layer with a writable OverlayFS on top.
//!
//! - [`gpt`]: the partition table (write, and parse untrusted);
//! - [`dps`]: partition types and how every UUID, the salt and the seeds derive;
//!   [`image_type`]: root, usr, sysext, confext and portable images;
//! - [`sigjson`]: the signature partition's JSON;
//! - [`mkfs`]: the three builders' reproducible command lines; [`tree`]: counting the tree;
//!   [`ext4_times`]: fixing ext4's inode times after `mkfs.ext4 -d`;
//! - [`build`]: `dmkit image build`; [`layout`]: finding the parts of an image (GPT or split
//!   files) for [`inspect`] and [`open`] (the mount stack and its teardown); [`rootless`]:
//!   the same without root (dmkit's FUSE server over the userspace [`read`]ers).

pub mod build;
pub mod dps;
pub mod ext4_times;
pub mod fec;
pub mod fecheader;
pub mod gpt;
pub mod image_type;
pub mod inspect;
pub mod layout;
pub mod mkfs;
pub mod open;
pub mod read;
pub mod remote;
pub mod rootless;
pub mod sigjson;
pub mod stage;
pub mod tree;

/// Errors of image commands, each one line naming the file and what is wrong.
/// [`ImageError::exit_code`] gives cryptsetup's exit code.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Bad input or parameters.
    #[error("{0}")]
    Invalid(String),
    /// A required program is not installed (the message names the package).
    #[error("{0}")]
    Missing(String),
    /// A tool (mkfs) failed.
    #[error("{0}")]
    Tool(String),
    /// A signature or the verity tree does not check out.
    #[error("{0}")]
    Verification(String),
    /// Something is in the way (already open, in use).
    #[error("{0}")]
    Busy(String),
    /// Nothing is open there.
    #[error("{0}")]
    NotOpen(String),
    /// A system call failed.
    #[error("{0}")]
    Io(String),
    /// The export layer refused or failed.
    #[error(transparent)]
    Export(#[from] crate::export::ExportError),
}

impl ImageError {
    /// cryptsetup's exit code: 2 verification failure, 4 not open, 5 busy, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ImageError::Verification(_) => 2,
            ImageError::NotOpen(_) => 4,
            ImageError::Busy(_) => 5,
            ImageError::Export(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// Result of image operations.
pub type Result<T> = std::result::Result<T, ImageError>;

/// The seed used when none is given: images of the same tree are then identical everywhere.
/// Give `--seed` to make images of different trees distinct (disk GUID, file system UUID).
pub const DEFAULT_SEED: [u8; 16] = [
    0x5e, 0xed, 0xd4, 0x4b, 0x1e, 0x2a, 0x4c, 0x3d, 0x9b, 0x0f, 0x6a, 0x27, 0xd1, 0x3c, 0x88, 0x01,
];
