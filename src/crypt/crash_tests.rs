//! Crash safety of keyslot changes: every state a power cut can leave behind during `add-key`
//! or `kill-slot` (LUKS1 and LUKS2) still has a readable header that opens with the passphrase
//! that was there before, and a keyslot the header calls active opens with its passphrase.
//! The states come from the fault-injecting device's crash model (writes after the last flush
//! may or may not have reached the disk, in any combination).

use super::luks1;
use super::luks2::{self, copies, keyslot, FormatParams, PbkdfKind, PbkdfParams};
use crate::block::{for_each_crash_state, FaultyDevice, LoggedOp, MemoryDevice};
use crate::crypt::luks::VolumeKey;

const OLD: &[u8] = b"old passphrase";
const NEW: &[u8] = b"new passphrase";

pub(crate) fn fast_pbkdf() -> PbkdfParams {
    PbkdfParams {
        kind: PbkdfKind::Pbkdf2,
        hash: "sha256".into(),
        iter_time_ms: 1,
        force_iterations: Some(1000),
        memory_kib: 32768,
        parallel: 1,
    }
}

/// Run `op` on a copy of `base` and return what it wrote and flushed.
fn logged(base: &[u8], op: impl FnOnce(&FaultyDevice<MemoryDevice>)) -> Vec<LoggedOp> {
    let dev = FaultyDevice::new(MemoryDevice::from_vec("disk", base.to_vec()));
    dev.start_log();
    op(&dev);
    dev.take_log()
}

fn luks1_base() -> (Vec<u8>, luks1::Luks1Header, VolumeKey) {
    let mem = MemoryDevice::new("disk", 3 << 20);
    let uuid = "0c3ed3d5-4b0a-4c52-9b3a-1f1d2d0a0b0c";
    let (h, vk) = luks1::format(
        &mem,
        "aes-xts-plain64",
        64,
        "sha256",
        uuid,
        Some(1000),
        1,
        luks1::Payload::Attached(None),
        OLD,
        None,
    )
    .unwrap();
    (mem.contents(), h, vk)
}

/// The LUKS1 invariant in one crash state.
fn luks1_opens(what: &str, img: &[u8], vk: &[u8]) {
    let d = MemoryDevice::from_vec("crashed", img.to_vec());
    let h = luks1::read(&d).unwrap_or_else(|e| panic!("{what}: header: {e}"));
    let (_, got) = luks1::unlock(&d, &h, OLD, None)
        .unwrap_or_else(|e| panic!("{what}: the old passphrase: {e}"));
    assert_eq!(&got[..], vk, "{what}");
    if h.keyslots[1].active {
        let (slot, got) = luks1::unlock(&d, &h, NEW, Some(1))
            .unwrap_or_else(|e| panic!("{what}: keyslot 1 is active but does not open: {e}"));
        assert_eq!((slot, &got[..]), (1, vk), "{what}");
    }
}

#[test]
fn luks1_add_key_and_kill_slot_survive_a_power_cut_anywhere() {
    let (base, h, vk) = luks1_base();
    let mut h1 = h.clone();
    let log = logged(&base, |d| {
        luks1::add_key(d, &mut h1, &vk, NEW, Some(1000), 1, None).unwrap();
    });
    let mut states = 0;
    for_each_crash_state(&base, &log, |what, img| {
        luks1_opens(what, img, &vk);
        states += 1;
    });
    assert!(states >= 4, "{states} states");
    // Now remove it again.
    let dev = MemoryDevice::from_vec("disk", base.clone());
    let mut h2 = h.clone();
    luks1::add_key(&dev, &mut h2, &vk, NEW, Some(1000), 1, None).unwrap();
    let with_new = dev.contents();
    let log = logged(&with_new, |d| luks1::kill_slot(d, &mut h2, 1).unwrap());
    for_each_crash_state(&with_new, &log, |what, img| {
        let d = MemoryDevice::from_vec("crashed", img.to_vec());
        let h = luks1::read(&d).unwrap_or_else(|e| panic!("{what}: header: {e}"));
        assert!(luks1::unlock(&d, &h, OLD, None).is_ok(), "{what}");
    });
}

fn luks2_base() -> (Vec<u8>, luks2::Luks2Header, VolumeKey) {
    let mem = MemoryDevice::new("disk", 3 << 20);
    let p = FormatParams {
        pbkdf: fast_pbkdf(),
        keyslots_size: Some(1 << 20),
        data_offset: Some(2 << 20),
        ..FormatParams::default()
    };
    let (h, vk) = luks2::format(&mem, 3 << 20, &p, OLD).unwrap();
    (mem.contents(), h, vk)
}

/// The LUKS2 invariant in one crash state: keyslot `new_slot` opens with NEW when the header
/// lists it.
fn luks2_opens(what: &str, img: &[u8], vk: &[u8], new_slot: u32) {
    let d = MemoryDevice::from_vec("crashed", img.to_vec());
    let h = copies::read(&d)
        .unwrap_or_else(|e| panic!("{what}: header: {e}"))
        .header;
    let (_, got) = keyslot::unlock(&d, &h, OLD, None, keyslot::Segment::Default)
        .unwrap_or_else(|e| panic!("{what}: the old passphrase: {e}"));
    assert_eq!(&got[..], vk, "{what}");
    if h.metadata.keyslots.contains_key(&new_slot) {
        let (_, got) = keyslot::unlock(&d, &h, NEW, Some(new_slot), keyslot::Segment::Default)
            .unwrap_or_else(|e| {
                panic!("{what}: keyslot {new_slot} is listed but does not open: {e}")
            });
        assert_eq!(&got[..], vk, "{what}");
    }
}

#[test]
fn luks2_add_key_and_kill_survive_a_power_cut_anywhere() {
    let (base, h, vk) = luks2_base();
    let mut h1 = h.clone();
    let log = logged(&base, |d| {
        keyslot::add(d, &mut h1, &vk, NEW, &fast_pbkdf(), None, None).unwrap();
    });
    for_each_crash_state(&base, &log, |what, img| luks2_opens(what, img, &vk, 1));
    let dev = MemoryDevice::from_vec("disk", base);
    let mut h2 = h.clone();
    keyslot::add(&dev, &mut h2, &vk, NEW, &fast_pbkdf(), None, None).unwrap();
    let with_new = dev.contents();
    let log = logged(&with_new, |d| keyslot::kill(d, &mut h2, 1).unwrap());
    for_each_crash_state(&with_new, &log, |what, img| {
        let d = MemoryDevice::from_vec("crashed", img.to_vec());
        let h = copies::read(&d)
            .unwrap_or_else(|e| panic!("{what}: header: {e}"))
            .header;
        assert!(
            keyslot::unlock(&d, &h, OLD, None, keyslot::Segment::Default).is_ok(),
            "{what}"
        );
    });
}
