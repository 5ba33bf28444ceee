//! Small pieces of cryptsetup's command-line behaviour the LUKS verbs share.

use super::CliError;
use crate::crypt::luks::VolumeKey;
use std::io::Read;
use std::path::Path;

/// Read a `--volume-key-file` as cryptsetup does: exactly `len` bytes from its start (a
/// longer file, or a device like /dev/urandom, gives its first `len` bytes; a shorter one is
/// refused with cryptsetup's words).
pub fn read_volume_key(file: &Path, len: usize) -> Result<VolumeKey, CliError> {
    let cannot = |e: std::io::Error| {
        CliError::invalid(format!("{}: cannot read volume key: {e}", file.display()))
    };
    let f = std::fs::File::open(file).map_err(cannot)?;
    let mut key = VolumeKey::new(vec![0u8; len]);
    let mut got = 0;
    let mut r = f.take(len as u64);
    while got < len {
        match r.read(&mut key[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(cannot(e)),
        }
    }
    if got < len {
        return Err(CliError::invalid(format!(
            "Cannot read {len} bytes from keyfile {}.",
            file.display()
        )));
    }
    Ok(key)
}
