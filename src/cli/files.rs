//! Opening the files and devices every command works on, with one error convention.

use super::CliError;
use crate::block::{FileDevice, OpenOptions};
use std::path::Path;

/// Open `path` as a block device. A missing file is "no such device" (exit 4, as cryptsetup);
/// any other failure (permissions, a directory, ...) is bad input (exit 1). The message names
/// the file.
pub(super) fn open_device(
    path: &Path,
    read_only: bool,
    direct: bool,
) -> Result<FileDevice, CliError> {
    FileDevice::open(path, OpenOptions { read_only, direct }).map_err(|e| {
        let m = format!("{}: cannot open: {e}", path.display());
        if e.kind() == std::io::ErrorKind::NotFound {
            CliError::no_device(m)
        } else {
            CliError::invalid(m)
        }
    })
}
