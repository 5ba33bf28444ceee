//! Writing a verity volume's FEC area into its file, as `veritysetup format --fec-device`
//! does: a new FEC file is created owner-only (0600), the area may share the hash file (after
//! the tree, at `--fec-offset`), and the FEC file is claimed while it is written.

use super::{encode, layout, FecError, FecGeometry, FecOptions};
use crate::block::{BlockDevice, Claim};
use crate::verity::VerityParams;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The data and hash of a formatted volume, and whether the FEC file is one of them.
pub struct Covered<'a> {
    /// The data device.
    pub data: &'a dyn BlockDevice,
    /// The hash device.
    pub hash: &'a dyn BlockDevice,
    /// The FEC file is the hash file (its area follows the tree).
    pub fec_in_hash: bool,
    /// The FEC file is the data file (its area follows the data).
    pub fec_in_data: bool,
}

/// Compute `p`'s FEC over `covered` on all cores and write it to `fec_path` at
/// `opts.offset`; returns the geometry written.
pub fn write_fec(
    covered: &Covered<'_>,
    p: &VerityParams,
    fec_path: &Path,
    opts: &FecOptions,
) -> Result<FecGeometry, FecError> {
    // The parameters first: a refused offset or size creates no file.
    let (geometry, inputs) = layout(
        p,
        opts,
        covered.data,
        covered.hash,
        covered.fec_in_hash,
        covered.fec_in_data,
    )?;
    let file_error = |what, source| FecError::File {
        path: fec_path.to_path_buf(),
        what,
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(fec_path)
        .map_err(|e| file_error("create", e))?;
    // The hash file is claimed by the format already; a FEC file of its own is claimed here.
    let _claim = if covered.fec_in_hash {
        None
    } else {
        Some(Claim::take(&file, fec_path, opts.offset, 0, true)?)
    };
    // A regular file grows to hold the area, as veritysetup's writes grow it.
    let end = opts.offset + geometry.parity_bytes();
    let meta = file.metadata().map_err(|e| file_error("extend", e))?;
    if meta.is_file() && meta.len() < end {
        file.set_len(end).map_err(|e| file_error("extend", e))?;
    }
    drop(file);
    let fec = crate::block::open_device(fec_path, false, false)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    encode::encode(&inputs, &geometry, &fec, opts.offset, threads)?;
    fec.flush()?;
    Ok(geometry)
}
