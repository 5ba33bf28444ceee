//! Other on-disk signatures next to a LUKS2 header, found the way blkid's fast probe finds
//! them. cryptsetup refuses to repair (and so to use) a LUKS2 device with one damaged header
//! copy when it also carries another signature: the "damage" may be that other format's
//! data, and picking the surviving LUKS2 copy could destroy it.
//!
//! Only signatures that can coexist with a LUKS2 header are probed: the header's first 4 KiB
//! leave room only for formats whose magic lies in the first sectors or far beyond it.

use crate::block::BlockDevice;
use crate::crypt::luks::LuksError;

/// (name, byte offset, magic) of the probed signatures.
const MAGICS: &[(&str, u64, &[u8])] = &[
    ("xfs", 0, b"XFSB"),
    ("btrfs", 0x10040, b"_BHRfS_M"),
    ("swap", 4086, b"SWAPSPACE2"),
    ("swap", 4086, b"SWAP-SPACE"),
];

fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Result<Option<Vec<u8>>, LuksError> {
    if off + len as u64 > dev.size() {
        return Ok(None);
    }
    let mut b = vec![0u8; len];
    dev.read_at(&mut b, off)?;
    Ok(Some(b))
}

/// An LVM2 physical volume label: "LABELONE" in one of the first four sectors, with type
/// "LVM2 001" at byte 24 of that sector.
fn lvm2(dev: &dyn BlockDevice) -> Result<bool, LuksError> {
    for sector in 0..4u64 {
        if let Some(b) = read(dev, sector * 512, 32)? {
            if &b[..8] == b"LABELONE" && &b[24..32] == b"LVM2 001" {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The name of another signature on `dev`, if there is one.
pub fn other_signature(dev: &dyn BlockDevice) -> Result<Option<&'static str>, LuksError> {
    if lvm2(dev)? {
        return Ok(Some("LVM2_member"));
    }
    for &(name, off, magic) in MAGICS {
        if read(dev, off, magic.len())?.as_deref() == Some(magic) {
            return Ok(Some(name));
        }
    }
    Ok(None)
}
