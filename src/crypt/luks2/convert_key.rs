//! `luksConvertKey` on a LUKS2 header: keyslot `id` stores its volume key again under the same
//! passphrase with new KDF parameters, keeping its number, priority, digest and tokens.
//!
//! Crash-safe order: the new key material goes to a free range of the keyslots area and is
//! flushed, then one header write (both copies, secondary first) switches the keyslot to it,
//! and only then is the old area wiped. A cut anywhere leaves a keyslot `id` that opens with
//! the passphrase, with the old parameters or the new ones. Without a free range cryptsetup's
//! own order is the only one possible: wipe the area, then rewrite it in place.

use super::header::Luks2Header;
use super::keyslot::{self, PbkdfParams};
use crate::block::BlockDevice;
use crate::crypt::luks::{af, LuksError, STRIPES};

/// Store `vk` (the key keyslot `id` holds) again in keyslot `id` under `pass` with `params`.
pub fn convert(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    id: u32,
    vk: &[u8],
    pass: &[u8],
    params: &PbkdfParams,
) -> Result<(), LuksError> {
    let old = h
        .metadata
        .keyslots
        .get(&id)
        .cloned()
        .ok_or_else(|| LuksError::Invalid(format!("Keyslot {id} is not active.")))?;
    let size = af::split_sectors_bytes(vk.len() as u64, STRIPES).div_ceil(4096) * 4096;
    let mut new = match keyslot::free_area(h, size) {
        Some(at) => keyslot::store(dev, h, vk, pass, params, Some(at))?,
        None => {
            keyslot::wipe(dev, old.area.offset, old.area.size)?;
            keyslot::store(dev, h, vk, pass, params, Some(old.area.offset))?
        }
    };
    new.priority = old.priority;
    let moved = new.area.offset != old.area.offset;
    h.metadata.keyslots.insert(id, new);
    h.write(dev)?;
    if moved {
        keyslot::wipe(dev, old.area.offset, old.area.size)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{for_each_crash_state, FaultyDevice, MemoryDevice};
    use crate::crypt::luks::kdf::Kdf;
    use crate::crypt::luks2::{copies, FormatParams, PbkdfKind};

    const PASS: &[u8] = b"passphrase";

    fn pbkdf(kind: PbkdfKind, n: u32) -> PbkdfParams {
        PbkdfParams {
            kind,
            hash: "sha256".into(),
            iter_time_ms: 1,
            force_iterations: Some(n),
            memory_kib: 32,
            parallel: 1,
        }
    }

    /// A power cut at any point of a conversion leaves keyslot 0 opening with the passphrase,
    /// its priority kept, with the old KDF or the new one.
    #[test]
    fn a_power_cut_anywhere_leaves_the_keyslot_working() {
        let mem = MemoryDevice::new("disk", 3 << 20);
        let p = FormatParams {
            pbkdf: pbkdf(PbkdfKind::Pbkdf2, 1000),
            keyslots_size: Some(1 << 20),
            data_offset: Some(2 << 20),
            ..FormatParams::default()
        };
        let (mut h, vk) = crate::crypt::luks2::format(&mem, 3 << 20, &p, PASS).unwrap();
        h.metadata.keyslots.get_mut(&0).unwrap().priority = Some(2);
        h.write(&mem).unwrap();
        let base = mem.contents();
        let dev = FaultyDevice::new(MemoryDevice::from_vec("disk", base.clone()));
        dev.start_log();
        let mut h1 = h.clone();
        convert(&dev, &mut h1, 0, &vk, PASS, &pbkdf(PbkdfKind::Argon2id, 1)).unwrap();
        let log = dev.take_log();
        let mut kinds = std::collections::BTreeSet::new();
        for_each_crash_state(&base, &log, |what, img| {
            let d = MemoryDevice::from_vec("crashed", img.to_vec());
            let h = copies::read(&d)
                .unwrap_or_else(|e| panic!("{what}: {e}"))
                .header;
            let (slot, got) = keyslot::unlock(&d, &h, PASS, None, keyslot::Segment::Default)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!((slot, &got[..]), (0, &vk[..]), "{what}");
            let k = &h.metadata.keyslots[&0];
            assert_eq!(k.priority, Some(2), "{what}");
            kinds.insert(matches!(k.kdf, Some(Kdf::Argon2 { .. })));
        });
        assert_eq!(kinds.len(), 2, "both the old and the new keyslot were seen");
        // The old area is wiped at the end.
        let after = dev.inner().contents();
        let old = &h.metadata.keyslots[&0].area;
        assert!(after[old.offset as usize..(old.offset + old.size) as usize]
            .iter()
            .all(|&b| b == 0));
    }
}
