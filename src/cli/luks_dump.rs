//! Printing a LUKS header's dump, shared by `luks dump` of a local file and of a URL.

use super::{CliError, CliResult};

/// Print a header's dump: its JSON with `json`, else its text, as bytes (cryptsetup prints
/// metadata strings as they are).
pub(super) fn print_dump(
    json: bool,
    dump_json: impl FnOnce() -> serde_json::Value,
    dump_text: impl FnOnce() -> Vec<u8>,
) -> CliResult {
    use std::io::Write;
    if json {
        println!("{:#}", dump_json());
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    out.write_all(&dump_text())
        .and_then(|_| out.flush())
        .map_err(|e| CliError::invalid(format!("cannot write the dump: {e}")))
}
