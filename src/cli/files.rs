//! Opening the files and devices every command inspects, and the words for a file that cannot
//! be opened or a range that cannot be claimed (the library opens and claims, typed).

use super::CliError;
use crate::block::{BackingFailure, ClaimError, FileDevice, OpenError, VolumeFailure};
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

/// The command line's words for a volume handle's error: a backing file that cannot be opened
/// or claimed as every command words it, the rest with the handle's message and exit code.
impl<E: VolumeFailure> From<E> for CliError {
    fn from(e: E) -> CliError {
        match e.into_backing() {
            Ok(BackingFailure::Open(e)) => open_error(e),
            Ok(BackingFailure::Claim(e)) => claim_error(e),
            Err(e) => CliError {
                code: e.exit_code(),
                message: e.to_string(),
            },
        }
    }
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
