//! A reencryption cut at every write: from every state a power cut can leave (each prefix of
//! the writes, any subset of the unflushed ones), resuming finishes it and every sector reads
//! back the original plaintext under the new key.

use super::engine::{unlock_keys, Run};
use super::parallel::Keyed;
use super::{init, InitParams, NewKeyslot, ReencryptState, Resilience, RunOptions, RunOutcome};
use crate::block::{for_each_crash_state, BlockDevice, FaultyDevice, LoggedOp, MemoryDevice};
use crate::crypt::cipher::{new_sector_cipher, CipherSpec};
use crate::crypt::crash_tests::fast_pbkdf;
use crate::crypt::luks::LuksError;
use crate::crypt::luks2::keyslot;
use crate::crypt::luks2::{copies, format, FormatParams};

const PASS: &[u8] = b"old passphrase";
const DATA_OFFSET: u64 = 2 << 20;
const DATA: usize = 192 << 10;
const HOTZONE: u64 = 64 << 10;

fn plaintext() -> Vec<u8> {
    (0..DATA).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// The data of `img` decrypted with the key its segment 0 opens with PASS.
fn read_plain(img: &[u8]) -> Vec<u8> {
    let d = MemoryDevice::from_vec("check", img.to_vec());
    let h = copies::read(&d).expect("header").header;
    assert!(
        ReencryptState::read(&h.metadata).unwrap().is_none(),
        "still in reencryption"
    );
    let (_, vk) = keyslot::unlock(&d, &h, PASS, None, keyslot::Segment::Default).expect("unlock");
    let s = &h.metadata.segments[&0];
    let k = Keyed {
        cipher: new_sector_cipher(&CipherSpec::parse(&s.encryption).unwrap(), &vk).unwrap(),
        sector_size: s.sector_size as usize,
        iv_base: s.iv_tweak,
    };
    let mut buf = vec![0u8; DATA];
    d.read_at(&mut buf, s.offset).unwrap();
    k.run(&mut buf, 0, true);
    buf
}

/// A formatted device holding `plaintext()`, put into reencryption with `resilience`.
fn started(resilience: Resilience, cipher: &str, key_size: usize, ss: u32) -> Vec<u8> {
    let mem = MemoryDevice::new("disk", DATA_OFFSET as usize + DATA);
    let p = FormatParams {
        pbkdf: fast_pbkdf(),
        keyslots_size: Some(1 << 20),
        data_offset: Some(DATA_OFFSET),
        sector_size: Some(512),
        ..FormatParams::default()
    };
    let (mut h, vk) = format(&mem, mem.size(), &p, PASS).unwrap();
    let k = Keyed {
        cipher: new_sector_cipher(&CipherSpec::parse("aes-xts-plain64").unwrap(), &vk).unwrap(),
        sector_size: 512,
        iv_base: 0,
    };
    let mut data = plaintext();
    k.run(&mut data, 0, false);
    mem.write_at(&data, DATA_OFFSET).unwrap();
    let ip = InitParams {
        cipher: cipher.into(),
        key_size,
        sector_size: ss,
        resilience,
        pbkdf: None,
        io_block: 4096,
        hash: "sha256".into(),
        benchmark_digest: false,
        new_key: Default::default(),
        device_size: None,
    };
    let slots = [NewKeyslot {
        old: 0,
        passphrase: PASS,
    }];
    init(&mem, &mut h, mem.size(), &slots, &ip).unwrap();
    assert_eq!(read_plain_any(&mem.contents()).len(), DATA);
    mem.contents()
}

/// Run the reencryption on `d` to its end (or to its first error).
fn run_on(d: &dyn BlockDevice) -> Result<RunOutcome, crate::crypt::luks::LuksError> {
    let mut h = copies::read(d)?.header;
    let st = ReencryptState::read(&h.metadata)?.expect("in reencryption");
    let keys = unlock_keys(d, &h, &st, PASS, None)?;
    let opts = RunOptions {
        max_hotzone: Some(HOTZONE),
        io_block: 4096,
        device_size: None,
    };
    Run::new(d, d, &mut h, &keys)?.run(&opts, &mut |_| true)
}

/// Any state's header parses (used as a sanity check of the started image).
fn read_plain_any(img: &[u8]) -> Vec<u8> {
    let d = MemoryDevice::from_vec("any", img.to_vec());
    copies::read(&d).expect("header");
    vec![0; DATA]
}

fn cut_everywhere(resilience: Resilience, cipher: &str, key_size: usize, ss: u32) {
    let base = started(resilience, cipher, key_size, ss);
    cut_and_resume(&base, read_plain);
}

/// Run the reencryption started in `base` to its end, logging every write; then from every
/// state a cut at a write can leave, resume it: `read` of the result is the plaintext each
/// time. Returns the image of the uninterrupted run.
fn cut_and_resume(base: &[u8], read: fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let dev = FaultyDevice::new(MemoryDevice::from_vec("disk", base.to_vec()));
    dev.start_log();
    assert_eq!(run_on(&dev).unwrap(), RunOutcome::Finished);
    let log = dev.take_log();
    let done = dev.inner().contents();
    assert!(read(&done) == plaintext());
    let writes = log
        .iter()
        .filter(|o| matches!(o, LoggedOp::Write { .. }))
        .count();
    assert!(writes > 10, "{writes} writes");
    let mut states = 0;
    for_each_crash_state(base, &log, |what, img| {
        states += 1;
        let d = MemoryDevice::from_vec("crashed", img.to_vec());
        let h = copies::read(&d)
            .unwrap_or_else(|e| panic!("{what}: header: {e}"))
            .header;
        if ReencryptState::read(&h.metadata).unwrap().is_some() {
            let r = run_on(&d).unwrap_or_else(|e| panic!("{what}: resume: {e}"));
            assert_eq!(r, RunOutcome::Finished, "{what}");
        }
        assert!(
            read(&d.contents()) == plaintext(),
            "{what}: plaintext differs"
        );
    });
    assert!(states > writes, "{states} states");
    done
}

#[test]
fn checksum_survives_a_cut_at_every_write() {
    cut_everywhere(
        Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: 0,
        },
        "aes-xts-plain64",
        64,
        4096,
    );
}

#[test]
fn journal_survives_a_cut_at_every_write() {
    cut_everywhere(Resilience::Journal, "aes-cbc-essiv:sha256", 32, 512);
}

#[test]
fn none_reencrypts_in_one_go() {
    let base = started(Resilience::None, "aes-xts-plain64", 32, 512);
    let d = MemoryDevice::from_vec("disk", base);
    assert_eq!(run_on(&d).unwrap(), RunOutcome::Finished);
    assert_eq!(read_plain(&d.contents()), plaintext());
}

#[test]
fn a_stopped_run_resumes() {
    let base = started(Resilience::Journal, "aes-xts-plain64", 64, 512);
    let d = MemoryDevice::from_vec("disk", base);
    let mut h = copies::read(&d).unwrap().header;
    let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
    let keys = unlock_keys(&d, &h, &st, PASS, None).unwrap();
    let opts = RunOptions {
        max_hotzone: Some(HOTZONE),
        io_block: 4096,
        device_size: None,
    };
    let mut calls = 0;
    let r = Run::new(&d, &d, &mut h, &keys)
        .unwrap()
        .run(&opts, &mut |_| {
            calls += 1;
            calls < 2
        })
        .unwrap();
    assert_eq!(r, RunOutcome::Stopped);
    assert_eq!(run_on(&d).unwrap(), RunOutcome::Finished);
    assert_eq!(read_plain(&d.contents()), plaintext());
}

#[test]
fn a_wrong_passphrase_changes_nothing() {
    let base = started(Resilience::Journal, "aes-xts-plain64", 64, 512);
    let d = MemoryDevice::from_vec("disk", base.clone());
    let h = copies::read(&d).unwrap().header;
    let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
    assert!(unlock_keys(&d, &h, &st, b"wrong", None).is_err());
    assert!(d.contents() == base);
}

/// Through a file in RAM (the data and journal mapped in memory) and a file on disk (reads,
/// writes and started writeback): every mode finishes with the original plaintext.
#[test]
fn file_devices_in_ram_and_on_disk() {
    use crate::block::{FileDevice, OpenOptions};
    let modes = || {
        [
            Resilience::Checksum {
                hash: "sha256".into(),
                sector_size: 0,
            },
            Resilience::Journal,
            Resilience::None,
        ]
    };
    let dirs = [std::path::PathBuf::from("/dev/shm"), std::env::temp_dir()];
    for dir in dirs.iter().filter(|d| d.is_dir()) {
        for (i, r) in modes().into_iter().enumerate() {
            let path = dir.join(format!("dmkit-reencrypt-test-{}-{i}", std::process::id()));
            std::fs::write(&path, started(r.clone(), "aes-xts-plain64", 64, 4096)).unwrap();
            let d = FileDevice::open(&path, OpenOptions::default()).unwrap();
            let out = run_on(&d);
            drop(d);
            let img = std::fs::read(&path).unwrap();
            let _ = std::fs::remove_file(&path);
            assert_eq!(
                out.unwrap(),
                RunOutcome::Finished,
                "{r:?} in {}",
                dir.display()
            );
            assert!(
                read_plain(&img) == plaintext(),
                "{r:?} in {}",
                dir.display()
            );
        }
    }
}

/// The data of a finished encryption or decryption: segment 0 decrypted with the key PASS
/// unlocks, or read as it is when it is linear.
fn read_final(img: &[u8]) -> Vec<u8> {
    let d = MemoryDevice::from_vec("check", img.to_vec());
    let h = copies::read(&d).expect("header").header;
    assert!(
        ReencryptState::read(&h.metadata).unwrap().is_none(),
        "still in reencryption"
    );
    let s = &h.metadata.segments[&0];
    assert_eq!(
        h.metadata.segments.len(),
        1,
        "one data segment left: {:?}",
        h.metadata.segments
    );
    if s.kind == "linear" {
        // A cut inside the teardown may leave keyslots of the old key (see engine.rs).
        let mut buf = vec![0u8; DATA];
        d.read_at(&mut buf, s.offset).unwrap();
        return buf;
    }
    read_plain(img)
}

/// `plaintext()` on a device whose header (data at DATA_OFFSET, as a detached one would be)
/// is put into encryption (`encrypt`) or, once formatted, into decryption.
fn started_one_key(encrypt: bool, resilience: Resilience) -> Vec<u8> {
    let mem = MemoryDevice::new("disk", DATA_OFFSET as usize + DATA);
    let p = FormatParams {
        pbkdf: fast_pbkdf(),
        keyslots_size: Some(1 << 20),
        data_offset: Some(DATA_OFFSET),
        sector_size: Some(if encrypt { 512 } else { 4096 }),
        ..FormatParams::default()
    };
    let (mut h, vk) = format(&mem, mem.size(), &p, PASS).unwrap();
    let mut data = plaintext();
    if !encrypt {
        let s = &h.metadata.segments[&0];
        let k = Keyed {
            cipher: new_sector_cipher(&CipherSpec::parse(&s.encryption).unwrap(), &vk).unwrap(),
            sector_size: s.sector_size as usize,
            iv_base: 0,
        };
        k.run(&mut data, 0, false);
    }
    mem.write_at(&data, DATA_OFFSET).unwrap();
    let ip = InitParams {
        cipher: String::new(),
        key_size: 0,
        sector_size: 512,
        resilience,
        pbkdf: None,
        io_block: 4096,
        hash: "sha256".into(),
        benchmark_digest: false,
        new_key: Default::default(),
        device_size: None,
    };
    if encrypt {
        super::init_encrypt(&mem, &mut h, mem.size(), &vk, &ip).unwrap();
    } else {
        super::init_decrypt(&mem, &mut h, mem.size(), PASS, None, &ip).unwrap();
    }
    mem.contents()
}

/// [`cut_everywhere`] of an encryption or decryption.
fn cut_everywhere_one_key(encrypt: bool, resilience: Resilience) {
    let base = started_one_key(encrypt, resilience);
    let done = cut_and_resume(&base, read_final);
    let h = copies::read(&MemoryDevice::from_vec("done", done))
        .unwrap()
        .header;
    // As cryptsetup leaves them: a decrypted device keeps no keyslot (nor digest).
    assert_eq!(h.metadata.keyslots.is_empty(), !encrypt);
    assert_eq!(h.metadata.digests.is_empty(), !encrypt);
}

#[test]
fn encryption_survives_a_cut_at_every_write() {
    cut_everywhere_one_key(
        true,
        Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: 0,
        },
    );
    cut_everywhere_one_key(true, Resilience::Journal);
}

#[test]
fn decryption_survives_a_cut_at_every_write() {
    cut_everywhere_one_key(
        false,
        Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: 0,
        },
    );
    cut_everywhere_one_key(false, Resilience::Journal);
}

#[test]
fn encryption_and_decryption_without_resilience() {
    for encrypt in [true, false] {
        let d = MemoryDevice::from_vec("disk", started_one_key(encrypt, Resilience::None));
        assert_eq!(run_on(&d).unwrap(), RunOutcome::Finished);
        assert!(
            read_final(&d.contents()) == plaintext(),
            "encrypt {encrypt}"
        );
    }
}

/// A decryption of `base` run to its end, and `base`'s header in decryption with its data
/// segments replaced by the finished ones and its digests bound to the crypt segments left
/// (none but the backups): the header cryptsetup's teardown starts from. The finished device,
/// that header (not written) and its reencryption state.
fn decrypted_under_header_in_decryption(
    base: &[u8],
) -> (
    MemoryDevice,
    crate::crypt::luks2::header::Luks2Header,
    ReencryptState,
) {
    let done = MemoryDevice::from_vec("done", base.to_vec());
    assert_eq!(run_on(&done).unwrap(), RunOutcome::Finished);
    let finished = copies::read(&done).unwrap().header;
    let mut h = copies::read(&MemoryDevice::from_vec("base", base.to_vec()))
        .unwrap()
        .header;
    let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
    let m = &mut h.metadata;
    m.segments.retain(|_, s| super::state::is_backup(s));
    for (id, s) in &finished.metadata.segments {
        assert!(m.segments.insert(*id, s.clone()).is_none(), "segment {id}");
    }
    let keyed: Vec<u32> = (m.segments.iter())
        .filter(|(_, s)| s.kind != "linear")
        .map(|(&id, _)| id)
        .collect();
    for d in m.digests.values_mut() {
        d.segments.retain(|s| keyed.contains(s));
    }
    (done, h, st)
}

/// A decryption as cryptsetup 2.6.1 leaves it when killed in its teardown between destroying
/// the old key's keyslots and dropping the metadata: every byte decrypted, the metadata still
/// there, no keyslot. It is finished without a key, and a wrong passphrase changes nothing
/// before that (none is asked for), where unlocking would fail.
#[test]
fn a_decryption_killed_after_its_keyslots_went_finishes_without_a_key() {
    // The header in decryption, its data segments replaced by the finished one and the old
    // key's keyslots destroyed, over the decrypted data.
    let (done, mut h, st) =
        decrypted_under_header_in_decryption(&started_one_key(false, Resilience::Journal));
    let m = &mut h.metadata;
    let old: Vec<u32> = m
        .keyslots
        .keys()
        .copied()
        .filter(|&k| k != st.keyslot.id)
        .collect();
    assert!(!old.is_empty());
    for k in &old {
        m.keyslots.remove(k);
    }
    for d in m.digests.values_mut() {
        d.keyslots.retain(|k| !old.contains(k));
    }
    let dev = MemoryDevice::from_vec("killed", done.contents());
    super::engine::commit(&dev, &mut h).unwrap();
    let mut h = copies::read(&dev).unwrap().header;
    let st = ReencryptState::read(&h.metadata)
        .unwrap()
        .expect("left in reencryption");
    let failed = unlock_keys(&dev, &h, &st, PASS, None)
        .err()
        .expect("no keyslot left to unlock");
    assert!(matches!(failed, LuksError::NoUsableKeyslot), "{failed}");
    assert!(super::engine::finish_keyless_decryption(&dev, &mut h, &st, &failed).unwrap());
    assert!(read_final(&dev.contents()) == plaintext());
    // Not for a device that still has a keyslot, nor one with data left to decrypt.
    let mut h = copies::read(&MemoryDevice::from_vec(
        "again",
        started_one_key(false, Resilience::Journal),
    ))
    .unwrap()
    .header;
    let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
    let untouched = MemoryDevice::from_vec("untouched", vec![0u8; 4096]);
    let failed = LuksError::WrongPassphrase;
    assert!(!super::engine::finish_keyless_decryption(&untouched, &mut h, &st, &failed).unwrap());
}

/// Killed between the wipe of an old keyslot's area and the header write that drops it, the
/// keyslot is still listed but no passphrase opens it: finished without a key too, the
/// keyslots gone as cryptsetup's teardown leaves them. While the keyslot still opens, the
/// keyed run finishes it instead.
#[test]
fn a_decryption_killed_between_a_keyslot_wipe_and_its_header_write_finishes_without_a_key() {
    let base = started_one_key(
        false,
        Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: 0,
        },
    );
    let (done, mut h, st) = decrypted_under_header_in_decryption(&base);
    let m = &mut h.metadata;
    let old: Vec<(u64, u64)> = (m.keyslots.iter())
        .filter(|(&k, _)| k != st.keyslot.id)
        .map(|(_, k)| (k.area.offset, k.area.size))
        .collect();
    assert!(!old.is_empty());
    // The decrypted data under the header in decryption, the old keyslots' areas as they were
    // before the teardown wiped them.
    let dev = MemoryDevice::from_vec("killed", done.contents());
    for &(off, len) in &old {
        let (off, len) = (off as usize, len as usize);
        dev.write_at(&base[off..off + len], off as u64).unwrap();
    }
    super::engine::commit(&dev, &mut h).unwrap();
    // Every old keyslot still opens: left to the keyed run. Nor does an unlock that failed
    // for another reason than the key finish it: nothing written.
    let before = dev.contents();
    let mut h = copies::read(&dev).unwrap().header;
    let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
    assert!(unlock_keys(&dev, &h, &st, PASS, None).is_ok());
    let failed = LuksError::Invalid("a keyslot area out of the device".into());
    assert!(!super::engine::finish_keyless_decryption(&dev, &mut h, &st, &failed).unwrap());
    assert!(
        dev.contents() == before,
        "a device whose keyslot opens was written"
    );
    // Their areas wiped (cryptsetup writes random bytes over them), the entries still listed.
    for (off, len) in old {
        let noise: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
        dev.write_at(&noise, off).unwrap();
    }
    let mut h = copies::read(&dev).unwrap().header;
    let st = ReencryptState::read(&h.metadata).unwrap().unwrap();
    let failed = unlock_keys(&dev, &h, &st, PASS, None)
        .err()
        .expect("a wiped keyslot opens");
    assert!(matches!(failed, LuksError::WrongPassphrase), "{failed}");
    assert!(super::engine::finish_keyless_decryption(&dev, &mut h, &st, &failed).unwrap());
    let end = copies::read(&dev).unwrap().header;
    assert!(ReencryptState::read(&end.metadata).unwrap().is_none());
    assert!(
        end.metadata.keyslots.is_empty() && end.metadata.digests.is_empty(),
        "{:?} {:?}",
        end.metadata.keyslots.keys().collect::<Vec<_>>(),
        end.metadata.digests
    );
    assert!(read_final(&dev.contents()) == plaintext());
}
