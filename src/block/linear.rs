//! Linear activation: a file or block device served unchanged, like dm-linear over all of it
//! (`dmkit linear open`, the baseline every layer's benchmark is compared against).
//!
//! ```no_run
//! let activated = dmkit::block::linear::activate(
//!     std::path::Path::new("disk.img"),
//!     &dmkit::block::linear::LinearOptions { name: "disk".into(), ..Default::default() },
//! )?;
//! # Ok::<(), dmkit::block::linear::LinearError>(())
//! ```

use super::{Activated, BlockDevice, Claim, ClaimError, OpenError};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to activate a linear device.
#[derive(Debug, Clone, Default)]
pub struct LinearOptions {
    /// The device name.
    pub name: String,
    /// Refuse writes (the file is opened read-only and claimed shared).
    pub read_only: bool,
    /// Open the file with `O_DIRECT` (its size must be whole 512-byte sectors).
    pub direct: bool,
    /// Pass discards down to the file.
    pub allow_discards: bool,
}

/// Why a linear device could not be activated.
#[derive(Debug, thiserror::Error)]
pub enum LinearError {
    /// The file could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The file could not be claimed.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The file holds nothing to serve.
    #[error("{}: is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// `direct` with a size that is not whole sectors.
    #[error("{}: size {size} is not a multiple of 512 bytes, which --direct needs", path.display())]
    Unaligned {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
}

crate::block::open::volume_failure!(LinearError);

impl LinearError {
    /// cryptsetup's exit code: 4 for a missing file, 5 for a busy one, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LinearError::Open(e) => e.exit_code(),
            LinearError::Claim(ClaimError::Busy { .. }) => 5,
            _ => 1,
        }
    }
}

/// Open `path` as the backing of a linear device (claimed exclusively unless read-only) and
/// activate it: kind "linear", details naming the file and whether it is read direct.
pub fn activate(path: &Path, o: &LinearOptions) -> Result<Activated, LinearError> {
    let dev = super::open_backing(path, o.read_only, o.direct)?;
    let claim = Claim::take(dev.file(), path, 0, 0, !o.read_only)?;
    let size = dev.size();
    if size == 0 {
        return Err(LinearError::Empty {
            path: path.to_path_buf(),
        });
    }
    if o.direct && size % 512 != 0 {
        return Err(LinearError::Unaligned {
            path: path.to_path_buf(),
            size,
        });
    }
    let backing = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(Activated {
        name: o.name.clone(),
        device: Arc::new(dev),
        kind: "linear".to_string(),
        details: json!({ "backing": backing, "direct": o.direct }),
        stats: None,
        claims: vec![claim],
        allow_discards: o.allow_discards,
        online: None,
    })
}
