//! Passphrases from the kernel keyring, for the `luks2-keyring` token: a `user` key found by
//! its description (`request_key(2)` searches the thread, process and session keyrings, as
//! cryptsetup's `keyring_get_passphrase` does) and read with `keyctl(KEYCTL_READ)`.

use super::LuksError;
use crate::crypt::secret::SecretBytes;
use std::ffi::CString;

const KEYCTL_READ: libc::c_long = 11;
/// The largest user key payload the kernel allows (32767 bytes).
const MAX_PAYLOAD: usize = 32767;

/// The payload of the `user` key described by `description`; a missing or unreadable key is
/// an `Invalid` error naming the description and the kernel's reason.
pub fn user_key(description: &str) -> Result<SecretBytes, LuksError> {
    let desc = CString::new(description).map_err(|_| {
        LuksError::Invalid(format!("key description {description:?} holds a NUL byte"))
    })?;
    let kind = c"user";
    // SAFETY: both strings are NUL-terminated and live across the call; a NULL callout and
    // keyring 0 ask the kernel only to search.
    let id = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            kind.as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_long,
        )
    };
    if id < 0 {
        let e = std::io::Error::last_os_error();
        return Err(LuksError::Invalid(format!(
            "kernel keyring: no user key {description:?}: {e}"
        )));
    }
    let mut buf = SecretBytes::zeroed(MAX_PAYLOAD);
    // SAFETY: the buffer is writable for its whole length, which is passed along.
    let n = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            id,
            buf.as_mut_ptr(),
            buf.len() as libc::c_long,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(LuksError::Invalid(format!(
            "kernel keyring: cannot read key {description:?}: {e}"
        )));
    }
    let n = (n as usize).min(buf.len());
    let mut out = SecretBytes::zeroed(n);
    out.copy_from_slice(&buf[..n]);
    Ok(out)
}
