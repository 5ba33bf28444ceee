//! Offline LUKS2 reencryption with cryptsetup 2.6's on-disk metadata, so that either tool
//! resumes what the other started (`lib/luks2/luks2_reencrypt*.c`).
//!
//! While a device is reencrypted its header carries:
//! - the requirement `online-reencrypt-v2` in `config.requirements.mandatory` (older tools
//!   refuse the device);
//! - a `reencrypt` keyslot: `mode`, `direction` and an area in the keyslots area that protects
//!   the hotzone (the range being rewritten): per-block hashes of its old ciphertext
//!   (`checksum`), a copy of it (`journal`), or nothing (`none`);
//! - the data segments as they are (new key before the hotzone, old key after it), plus two
//!   backup segments flagged `backup-previous` and `backup-final` that describe the device
//!   before and after;
//! - a digest bound to the reencrypt keyslot over both volume keys, the keyslot's parameters
//!   and the backup segments (`verify`): metadata changed without the keys is refused.
//!
//! Every hotzone is committed in cryptsetup's order ([`engine`]): the segments with the
//! hotzone flagged `in-reencryption` and its protection are written first, then the data,
//! then the segments that say the hotzone is done (offline, the last hotzone's is the
//! teardown's write: cryptsetup 2.6.1 would start a device left with every byte rewritten and
//! the metadata still there again from its first byte). A crash leaves either state, and
//! `recover` finishes a hotzone left `in-reencryption` with cryptsetup's rules.

mod area;
pub mod datashift;
pub mod decrypt_shift;
mod direct;
pub mod engine;
mod init;
mod layout;
mod mapped;
mod parallel;
mod recover;
pub mod state;
#[cfg(test)]
mod tests;
pub mod verify;

pub use engine::{Hotzones, Progress, RunOptions, RunOutcome};
pub use init::{init, init_decrypt, init_encrypt, keeps_key, InitParams, NewKey, NewKeyslot};
pub use state::{Direction, Mode, ReencryptState, Resilience, Status};

/// cryptsetup's largest hotzone (`LUKS2_REENCRYPT_MAX_HOTZONE_LENGTH`, 1 GiB).
pub const MAX_HOTZONE: u64 = 1 << 30;
/// cryptsetup's hotzone without resilience when none is asked for (20 MiB).
pub const DEFAULT_NONE_HOTZONE: u64 = 0x140_0000;
/// The requirement version cryptsetup 2.6 writes for reencryption (`LUKS2_REENCRYPT_REQ_VERSION`).
pub const REQ_VERSION: u8 = 2;
/// The requirement version of a decryption that moves the data (`LUKS2_DECRYPT_DATASHIFT_REQ_VERSION`).
pub const DECRYPT_SHIFT_REQ_VERSION: u8 = 3;

/// The hotzone length a reencryption of `h` protected by `resilience` would take (cryptsetup's
/// `reencrypt_length`: what the largest free gap of the keyslots area covers, capped), aligned
/// to `alignment` bytes; for planning, as benchmarks count hotzones and their flushes.
pub fn planned_hotzone(
    h: &crate::crypt::luks2::Luks2Header,
    resilience: &Resilience,
    alignment: u64,
) -> Result<u64, crate::crypt::luks::LuksError> {
    let (_, len) = area::max_gap(h).ok_or_else(|| {
        crate::crypt::luks::LuksError::Invalid("no free space in the keyslots area".into())
    })?;
    area::hotzone_length(resilience, len, None, alignment)
}

/// Flushes (durable barriers) the engine issues per hotzone with resilience: the protection's
/// (which also settles the previous hotzone's last header copy), the "in reencryption"
/// commit's secondary copy, the data's (which also settles that commit's primary copy on the
/// same device), the "done" commit's secondary copy.
pub const FLUSHES_PER_HOTZONE: u64 = 4;
