//! Opening the files and devices every command works on, and claiming what a mapping or a
//! format writes, with one error convention.

use super::CliError;
use crate::block::{Claim, ClaimError, FileDevice, OpenError};
use std::fs::File;
use std::path::Path;

/// Open `path` as a block device for reading or inspecting it. A missing file is "no such
/// device" (exit 4, as cryptsetup); any other failure (permissions, a directory, ...) is bad
/// input (exit 1). The message names the file.
pub(super) fn open_device(
    path: &Path,
    read_only: bool,
    direct: bool,
) -> Result<FileDevice, CliError> {
    crate::block::open_device(path, read_only, direct).map_err(open_error)
}

/// Open `path` as the backing device of a mapping or a format: like [`open_device`], and a
/// block device opened for writing is claimed exclusively (`O_EXCL`), as device-mapper claims
/// its devices: refused while mounted or in use (exit 5), and not mountable while we hold it.
pub(super) fn open_backing(
    path: &Path,
    read_only: bool,
    direct: bool,
) -> Result<FileDevice, CliError> {
    crate::block::open_backing(path, read_only, direct).map_err(open_error)
}

/// The command line's words for a file that could not be opened: a busy device names who
/// holds it.
pub(super) fn open_error(e: OpenError) -> CliError {
    match &e {
        OpenError::Busy { path } => CliError::busy(format!(
            "cannot use {}: it is in use by {}",
            path.display(),
            crate::export::path_holder(path).unwrap_or_else(|| {
                "the kernel (mounted, or claimed by another device)".to_string()
            })
        )),
        _ => CliError {
            code: e.exit_code(),
            message: e.to_string(),
        },
    }
}

/// Claim `[start, start + len)` of `file` (opened at `path`; `len` 0: to the end) for as long
/// as the returned claim lives: exclusively to write it, shared to only read it. A conflict is
/// exit 5 and names the open device that holds the range, as the kernel's "which is in use".
pub(super) fn claim(
    file: &File,
    path: &Path,
    start: u64,
    len: u64,
    exclusive: bool,
) -> Result<Claim, CliError> {
    Claim::take(file, path, start, len, exclusive).map_err(claim_error)
}

/// The command line's words for a claim that could not be taken: a conflict is exit 5 and
/// names the open device that holds the range, as the kernel's "which is in use".
pub(super) fn claim_error(e: ClaimError) -> CliError {
    match &e {
        ClaimError::Busy {
            path, start, len, ..
        } => {
            let holder = crate::export::claim_holder(&e)
                .unwrap_or_else(|| "another process (not a dmkit device of yours)".to_string());
            CliError::busy(format!(
                "cannot use {}: {} in use by {holder}",
                path.display(),
                if *len == 0 && *start == 0 {
                    "it is".to_string()
                } else {
                    format!("{} are", crate::block::range_text(*start, *len))
                }
            ))
        }
        ClaimError::Io { .. } => CliError::invalid(e.to_string()),
    }
}
