//! `reencrypt --decrypt --header NEWFILE` of a device whose LUKS2 header is at its start, as
//! cryptsetup 2.6 does it (`decrypt_luks2_datashift_init`, `reencrypt_decrypt_with_datashift_init`,
//! `reencrypt_set_decrypt_shift_segments`, `reencrypt_make_hot_segments_decrypt_shift`,
//! `_dec_create_segments_shift_after`, `reencrypt_offset_forward_moved`).
//!
//! The header goes to the file NEWFILE and the plaintext moves down by the data offset `S`
//! (the shift) while it is decrypted, so the device ends up plaintext from byte 0. The first
//! `M` bytes of ciphertext (`M` = the shift, at most 20 MiB, or `--hotzone-size`) are copied
//! to the device's start before the header file says "in decryption" (the moved segment, a
//! crypt segment at offset 0); the header copies on the device are wiped with them. Then the
//! rest walks forward, `S` bytes at a time: each hotzone's ciphertext is read `S` bytes
//! further on than where its plaintext goes, so a crash leaves it where it was (resilience
//! `datashift`) and recovery decrypts it again. The moved segment goes last, in place,
//! protected by the secondary resilience (`datashift-checksum`: a hash of each block of its
//! ciphertext in the reencrypt keyslot's area; `datashift-journal`: a copy of it). The last
//! `S` bytes of the device, old ciphertext, are wiped with random bytes at the end.
//!
//! Layout, `D` bytes of data after the header (`S` bytes):
//! `[header S][ciphertext of 0..D]` becomes `[plaintext 0..D][wiped S]`.
//!
//! The header file's requirement is `online-reencrypt-v3`, as cryptsetup marks this mode.

use super::engine::{commit, drop_metadata, keyed, Hotzones, Keys, Progress, RunOutcome};
use super::init::{check_aligned, only_segment, seal};
use super::layout::{crypt, flagged, linear};
use super::parallel::{self, Keyed};
use super::state::{data_segments, Direction, Mode, ReencryptState, Resilience};
use super::{verify, InitParams};
use crate::block::BlockDevice;
use crate::crypt::luks::{LuksError, MAX_KEYSLOTS};
use crate::crypt::luks2::header::Luks2Header;
use crate::crypt::luks2::json::{Metadata, Segment};
use crate::crypt::luks2::keyslot;
use std::collections::BTreeMap;
use zeroize::Zeroizing;

fn invalid(s: String) -> LuksError {
    LuksError::Invalid(s)
}

/// Whether `st` is a decryption with a moved first segment, which [`run`] does.
pub fn is_moved_decryption(st: &ReencryptState) -> bool {
    st.moved.is_some()
        && st.keyslot.mode == Mode::Decrypt
        && st.keyslot.direction == Direction::Forward
        && matches!(
            st.keyslot.resilience,
            Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal
        )
}

/// What [`init`] needs beyond the header.
pub struct DecryptShift<'a> {
    /// The data device's name, for messages.
    pub data_name: &'a str,
    /// The data device's size, bytes (header included).
    pub device_size: u64,
    /// The passphrase.
    pub pass: &'a [u8],
    /// Unlock with this keyslot only.
    pub slot: Option<u32>,
    /// The moved segment's length (`--hotzone-size`); `None`: the shift, at most 20 MiB.
    pub moved: Option<u64>,
}

/// Put the LUKS2 header `h`, a copy of the attached header of a device (on `mem`, the bytes
/// a header backup holds), into decryption with the data moving down by its offset: segment
/// 0 becomes the moved first part of the ciphertext (crypt at offset 0), the rest stays where
/// it is, with `backup-moved-segment`, `backup-previous` (the crypt segment as it was) and a
/// linear `backup-final` at 0, the reencrypt keyslot (mode `decrypt`, `forward`, resilience
/// `datashift-checksum` or `datashift-journal` as `p` says) and its digest over the volume
/// key. Only `mem` is written: the caller exports the header and moves the data. Returns the
/// reencrypt keyslot.
pub fn init(
    mem: &dyn BlockDevice,
    h: &mut Luks2Header,
    d: &DecryptShift<'_>,
    p: &InitParams,
) -> Result<u32, LuksError> {
    let seg0 = only_segment(mem, h)?;
    let shift = seg0.offset;
    let too_small = || invalid(format!("Device {} is too small.", d.data_name));
    if shift == 0 {
        return Err(LuksError::Unsupported(
            "decryption with a data shift of a device whose data starts at 0".into(),
        ));
    }
    let data_size = d
        .device_size
        .checked_sub(shift)
        .filter(|&s| s > 0)
        .ok_or_else(too_small)?;
    check_aligned(d.device_size, shift, seg0.sector_size)?;
    if !matches!(
        p.resilience,
        Resilience::DatashiftChecksum { .. } | Resilience::DatashiftJournal
    ) {
        return Err(invalid(
            "Requested --resilience option cannot be applied to current reencryption operation."
                .into(),
        ));
    }
    if d.moved.is_some_and(|m| m > shift) {
        return Err(invalid(
            "Moved segment size can not be greater than data shift value.".into(),
        ));
    }
    let moved = d
        .moved
        .filter(|&m| m > 0)
        .unwrap_or_else(|| shift.min(super::DEFAULT_NONE_HOTZONE))
        .min(data_size);
    let (_, key) = keyslot::unlock(mem, h, d.pass, d.slot, keyslot::Segment::Default)?;
    let digest_old = h
        .metadata
        .segment_digest(0)
        .map(|(i, _)| i)
        .ok_or_else(|| invalid("no digest for segment 0".into()))?;
    if MAX_KEYSLOTS as usize <= h.metadata.keyslots.len() {
        return Err(invalid("All key slots full.".into()));
    }
    // `reencrypt_set_decrypt_shift_segments`: [ciphertext moved to 0 (M)][the rest where it is].
    let (cipher, ss, iv) = (&seg0.encryption, seg0.sector_size, seg0.iv_tweak);
    let mut next = h.clone();
    let m = &mut next.metadata;
    m.segments.clear();
    let first = crypt(0, Some(moved), iv, cipher, ss, &[]);
    m.segments.insert(0, first.clone());
    if data_size > moved {
        let rest = crypt(shift + moved, None, iv + (moved >> 9), cipher, ss, &[]);
        m.segments.insert(1, rest);
    }
    // `reencrypt_make_backup_segments`: moved, previous, final.
    let n = m.segments.len() as u32;
    m.segments
        .insert(n, flagged(&first, "backup-moved-segment"));
    m.segments.insert(
        n + 1,
        crypt(shift, None, iv, cipher, ss, &["backup-previous"]),
    );
    m.segments.insert(n + 2, linear(0, None, &["backup-final"]));
    for dg in m.digests.values_mut() {
        dg.segments.clear();
    }
    if let Some(dg) = m.digests.get_mut(&digest_old) {
        dg.segments.extend(0..n + 2);
    }
    let keys = verify::KeysByDigest::from([(digest_old, &key[..])]);
    let ks = seal(
        mem,
        h,
        next,
        Mode::Decrypt,
        Direction::Forward,
        &keys,
        (ss, 512),
        shift,
        p,
    )?;
    let st = ReencryptState::read(&h.metadata)?
        .ok_or_else(|| invalid("reencryption state lost".into()))?;
    let (_, area_len) = st.area();
    let (block, room) = match &st.keyslot.resilience {
        Resilience::DatashiftChecksum { hash, sector_size } => {
            let size = crate::crypt::luks::af::message_digest(hash)?.size() as u64;
            let block = u64::from(*sector_size);
            (block, area_len / size * block)
        }
        _ => (512, area_len),
    };
    if moved > room {
        return Err(invalid(format!(
            "Moved segment too large. Requested size {moved}, available space for: {room}."
        )));
    }
    if !moved.is_multiple_of(block) {
        return Err(invalid(format!(
            "Hotzone size must be multiple of calculated zone alignment ({block} bytes)."
        )));
    }
    Ok(ks)
}

/// Copy the moved segment's ciphertext from its place (`backup-previous`, the old data
/// offset) to the device's start (`reencrypt_move_data`) and make it durable. It must precede
/// the header that says it is there.
pub fn move_first_segment(data: &dyn BlockDevice, st: &ReencryptState) -> Result<(), LuksError> {
    let moved = st
        .moved
        .as_ref()
        .ok_or_else(|| invalid("reencryption metadata: no moved segment".into()))?;
    let len = moved
        .size
        .filter(|&l| l > 0 && l <= st.keyslot.shift)
        .ok_or_else(|| invalid("reencryption metadata: bad moved segment".into()))?;
    let mut buf = crate::block::aligned::AlignedBuf::new(len as usize);
    data.read_at(buf.all(), st.previous.offset)?;
    data.write_at(buf.all(), moved.offset)?;
    data.flush()?;
    Ok(())
}

/// A decryption with a moved first segment under way.
struct Shift<'a> {
    hdr_dev: &'a dyn BlockDevice,
    data_dev: &'a dyn BlockDevice,
    st: ReencryptState,
    old: Keyed,
    /// Where the plaintext goes (the `backup-final` offset, 0).
    data_offset: u64,
    shift: u64,
    moved: Segment,
    /// Its length (`M`).
    moved_len: u64,
    /// Bytes of data (`D`).
    size: u64,
    /// `--device-size` was given: the old segment after the hotzone has a size.
    fixed: bool,
}

impl Shift<'_> {
    /// Make `segs` the header's segments, then the backups (`backup-previous`,
    /// `backup-final`, `backup-moved-segment`, next free ids), the old key's digest bound to
    /// the previous and moved backups, then to every crypt segment
    /// (`reencrypt_assign_segments_simple`, in its order).
    fn install(&self, m: &mut Metadata, segs: Vec<Segment>) {
        for d in m.digests.values_mut() {
            d.segments.clear();
        }
        let n = segs.len() as u32;
        let crypt_ids: Vec<u32> = segs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == "crypt")
            .map(|(i, _)| i as u32)
            .collect();
        m.segments = segs
            .into_iter()
            .enumerate()
            .map(|(i, s)| (i as u32, s))
            .collect::<BTreeMap<_, _>>();
        m.segments.insert(n, self.st.previous.clone());
        m.segments.insert(n + 1, self.st.fin.clone());
        m.segments.insert(n + 2, self.moved.clone());
        if let Some(d) = self.st.digest_old.and_then(|d| m.digests.get_mut(&d)) {
            d.segments.push(n);
            d.segments.push(n + 2);
            d.segments.extend(crypt_ids);
        }
    }

    /// The next hotzone (`reencrypt_offset_forward_moved`): the ciphertext after the last
    /// crypt segment's new place, `shift` bytes or what is left; the moved segment (offset 0)
    /// once it is the only crypt segment left. `None` when no ciphertext is left.
    fn next(&self, segs: &[Segment]) -> Result<Option<(u64, u64)>, LuksError> {
        match segs.iter().rposition(|s| s.kind == "crypt") {
            None => Ok(None),
            Some(0) => Ok(Some((0, self.moved_len))),
            Some(i) => {
                let o = segs[i]
                    .offset
                    .checked_sub(self.data_offset + self.shift)
                    .filter(|&o| o >= self.moved_len && o < self.size)
                    .ok_or_else(|| {
                        invalid("reencryption metadata: the old segment is out of place".into())
                    })?;
                Ok(Some((o, self.shift.min(self.size - o))))
            }
        }
    }

    /// The old (crypt) segment from data offset `at` to the end, still `shift` bytes on.
    fn old_after(&self, at: u64) -> Segment {
        let p = &self.st.previous;
        crypt(
            self.data_offset + self.shift + at,
            self.fixed.then(|| self.size - at),
            p.iv_tweak + (at >> 9),
            &p.encryption,
            p.sector_size,
            &[],
        )
    }

    /// The segments while the hotzone `offset..offset + length` is rewritten, and the index of
    /// the one in reencryption (`reencrypt_make_hot_segments_decrypt_shift`).
    fn hot(&self, segs: &[Segment], offset: u64, length: u64) -> (Vec<Segment>, usize) {
        let mut hot = Vec::new();
        if offset > 0 {
            hot.push(segs[0].clone());
            let done = offset - self.moved_len;
            if done > 0 {
                hot.push(linear(self.data_offset + self.moved_len, Some(done), &[]));
            }
        }
        let r = hot.len();
        hot.push(linear(
            self.data_offset + offset,
            Some(length),
            &["in-reencryption"],
        ));
        if offset == 0 {
            if let Some(rest) = segs.get(1) {
                hot.push(rest.clone());
            }
        } else if offset + length < self.size {
            hot.push(self.old_after(offset + length));
        }
        (hot, r)
    }

    /// The segments once the hotzone `r` of `hot` is written (`_dec_create_segments_shift_after`):
    /// plaintext from 0 once the moved segment is done, else the moved segment, the plaintext
    /// behind it grown by the hotzone, and the old segment after it.
    fn post(&self, hot: &[Segment], r: usize, offset: u64, length: u64) -> Vec<Segment> {
        if r == 0 {
            return vec![linear(self.data_offset, None, &[])];
        }
        let after = hot.get(r + 1);
        let done = offset + length - self.moved_len;
        let mut post = vec![hot[0].clone()];
        post.push(linear(
            self.data_offset + self.moved_len,
            after.is_some().then_some(done),
            &[],
        ));
        post.extend(after.cloned());
        post
    }

    /// The moved segment's protection: a hash of each block of its ciphertext, or a copy of
    /// it, in the reencrypt keyslot's area, durable before the header says it is rewritten.
    fn protect(&self, buf: &[u8]) -> Result<(), LuksError> {
        let (area, len) = self.st.area();
        let data: Vec<u8> = match &self.st.keyslot.resilience {
            Resilience::DatashiftChecksum { hash, sector_size } => {
                parallel::block_hashes(buf, *sector_size as usize, hash)?
            }
            _ => buf.to_vec(),
        };
        if data.len() as u64 > len {
            return Err(invalid(
                "the moved segment's protection does not fit the reencryption area".into(),
            ));
        }
        let data = Zeroizing::new(data);
        self.hdr_dev.write_at(&data, area)?;
        self.hdr_dev.flush()?;
        Ok(())
    }

    /// Decrypt `buf`, the ciphertext of data offset `offset`, and write it durably to its new
    /// place.
    fn write_plain(&self, buf: &mut [u8], offset: u64) -> Result<(), LuksError> {
        parallel::rekey(buf, offset, Some(&self.old), None);
        self.data_dev.write_at(buf, self.data_offset + offset)?;
        self.data_dev.flush()?;
        Ok(())
    }

    /// One hotzone in cryptsetup's order: the moved segment's protection (when it is the
    /// hotzone), the header saying the hotzone is in reencryption, the data, the header saying
    /// it is done.
    fn step(
        &self,
        h: &mut Luks2Header,
        buf: &mut [u8],
        offset: u64,
        length: u64,
    ) -> Result<(), LuksError> {
        let segs = data_segments(&h.metadata);
        let (hot, r) = self.hot(&segs, offset, length);
        self.install(&mut h.metadata, hot.clone());
        let buf = &mut buf[..length as usize];
        if offset == 0 {
            self.data_dev.read_at(buf, self.moved.offset)?;
            self.protect(buf)?;
        } else {
            self.data_dev
                .read_at(buf, self.st.previous.offset + offset)?;
        }
        commit(self.hdr_dev, h)?;
        self.write_plain(buf, offset)?;
        self.done(h, self.post(&hot, r, offset, length))
    }

    /// Commit `post`, the segments after a hotzone; after the last one (the moved segment)
    /// the teardown's header write is that commit instead. cryptsetup commits the last
    /// hotzone's segments first, and 2.6.1 cannot resume from there (it takes the plaintext
    /// for the moved segment's ciphertext and decrypts it again); this order never leaves
    /// that state behind, and a run here finishes it when cryptsetup does.
    fn done(&self, h: &mut Luks2Header, post: Vec<Segment>) -> Result<(), LuksError> {
        let last = post.iter().all(|s| s.kind == "linear");
        self.install(&mut h.metadata, post);
        if last {
            self.teardown(h)
        } else {
            commit(self.hdr_dev, h)
        }
    }

    /// Finish the hotzone `r` a crash left `in-reencryption` (`reencrypt_recover_segment`):
    /// elsewhere than the moved segment its ciphertext is still `shift` bytes on and is
    /// decrypted again; the moved segment is recovered in place from its checksums (a block
    /// whose bytes still hash as the old ciphertext is decrypted, any other is plaintext
    /// already) or its journal copy (`recover::hotzone`).
    fn recover(&self, h: &mut Luks2Header, r: usize) -> Result<(), LuksError> {
        let (hot, offset, length) =
            super::datashift::interrupted(&h.metadata, r, self.data_offset, self.shift)?;
        let seg = &hot[r];
        if offset + length > self.size || (offset == 0 && length != self.moved_len) {
            return Err(invalid(
                "reencryption metadata: the hotzone does not fit the data".into(),
            ));
        }
        if offset > 0 {
            let mut buf = Zeroizing::new(vec![0u8; length as usize]);
            self.data_dev
                .read_at(&mut buf, self.st.previous.offset + offset)?;
            self.write_plain(&mut buf, offset)?;
        } else {
            // In place, as any checksum or journal hotzone: the moved segment's secondary
            // resilience is what protects it.
            let resilience = match &self.st.keyslot.resilience {
                Resilience::DatashiftChecksum { hash, sector_size } => Resilience::Checksum {
                    hash: hash.clone(),
                    sector_size: *sector_size,
                },
                _ => Resilience::Journal,
            };
            let devices = super::recover::Devices {
                hdr_dev: self.hdr_dev,
                data_dev: self.data_dev,
                resilience: &resilience,
                area: self.st.area(),
                data_offset: self.data_offset,
                device_size: self.size,
                old: Some(&self.old),
                new: None,
            };
            super::recover::hotzone(&devices, seg)?;
        }
        self.done(h, self.post(&hot, r, offset, length))
    }

    /// The end (`reencrypt_teardown_ok`): the reencryption metadata dropped in one header
    /// write, the device's last `shift` bytes (old ciphertext) wiped with random bytes, then
    /// the keyslots of the old key destroyed one by one (the data needs no key any more).
    /// cryptsetup wipes first; a crash before the wipe here leaves ciphertext nobody needs.
    fn teardown(&self, h: &mut Luks2Header) -> Result<(), LuksError> {
        drop_metadata(self.hdr_dev, h, &self.st)?;
        let end = self.data_dev.size();
        let from = end.saturating_sub(self.shift);
        let mut chunk = vec![0u8; (1u64 << 20).min(end - from) as usize];
        let mut at = from;
        while at < end {
            let n = (end - at).min(chunk.len() as u64) as usize;
            getrandom::getrandom(&mut chunk[..n])
                .map_err(|e| LuksError::Crypto(format!("random wipe: {e}")))?;
            self.data_dev.write_at(&chunk[..n], at)?;
            at += n as u64;
        }
        self.data_dev.flush()?;
        match self.st.digest_old {
            Some(old) => super::engine::destroy_keyslots_of(self.hdr_dev, h, old),
            None => Ok(()),
        }
    }
}

/// Run (or resume) the decryption with a moved first segment whose header `h` is on
/// `hdr_dev` (the exported header file) to its end, or until `progress` returns `false`.
/// `keys` holds the old key. Online, `hooks` hears of every hotzone (see [`Hotzones`]): the
/// boundary is where the ciphertext still `shift` bytes on starts (the plaintext at its new
/// place runs from the moved segment's end to it), and 0 once the moved segment, the last
/// hotzone, is plaintext too.
pub fn run(
    hdr_dev: &dyn BlockDevice,
    data_dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    keys: &Keys,
    progress: &mut dyn FnMut(Progress) -> bool,
    hooks: Option<&dyn Hotzones>,
) -> Result<RunOutcome, LuksError> {
    let st = ReencryptState::read(&h.metadata)?
        .ok_or_else(|| invalid("Device not marked for LUKS2 reencryption.".into()))?;
    verify::check(&h.metadata, &st, &keys.by_digest(&st))?;
    if !is_moved_decryption(&st) {
        return Err(LuksError::Unsupported(format!(
            "a {} reencryption ({}, {} resilience) with a moved segment",
            st.keyslot.mode.word(),
            st.keyslot.direction.word(),
            st.keyslot.resilience.word()
        )));
    }
    let old = keyed(&st.previous, keys.old.as_ref())?.ok_or_else(|| {
        invalid("reencryption metadata: the previous segment is not crypt".into())
    })?;
    let moved = st.moved.clone().expect("checked by is_moved_decryption");
    let shift = st.keyslot.shift;
    let data_offset = st.fin.offset;
    let too_small = || invalid(format!("Device {} is too small.", data_dev.name()));
    let size = match st.previous.size {
        Some(s) => s,
        None => data_dev
            .size()
            .checked_sub(data_offset + shift)
            .ok_or_else(too_small)?,
    };
    let moved_len = moved.size.unwrap_or(0);
    if shift == 0
        || moved.offset != data_offset
        || moved_len == 0
        || moved_len > shift.min(size)
        || data_offset + shift + size > data_dev.size()
    {
        return Err(too_small());
    }
    let run = Shift {
        hdr_dev,
        data_dev,
        old,
        data_offset,
        shift,
        moved,
        moved_len,
        size,
        fixed: st.previous.size.is_some(),
        st,
    };
    if let Some(r) = run.st.hot {
        run.recover(h, r)?;
    }
    if requirement_gone(h) {
        if let Some(k) = hooks {
            k.start(0);
        }
        progress(Progress { size, done: size });
        return Ok(RunOutcome::Finished);
    }
    if let Some(k) = hooks {
        let boundary = match run.next(&data_segments(&h.metadata))? {
            None => 0,
            Some((0, _)) => size,
            Some((o, _)) => o,
        };
        k.start(boundary);
    }
    let mut buf = Zeroizing::new(vec![0u8; shift.min(size) as usize]);
    loop {
        let segs = data_segments(&h.metadata);
        let Some((offset, length)) = run.next(&segs)? else {
            break;
        };
        let done = if offset == 0 {
            size - moved_len
        } else {
            offset - moved_len
        };
        if !progress(Progress { size, done }) {
            return Ok(RunOutcome::Stopped);
        }
        if let Some(k) = hooks {
            k.enter(offset, length);
        }
        run.step(h, &mut buf, offset, length)?;
        if let Some(k) = hooks {
            k.leave(if offset == 0 { 0 } else { offset + length });
        }
        if requirement_gone(h) {
            break;
        }
    }
    drop(buf);
    if !requirement_gone(h) {
        // Every hotzone committed, the teardown not begun (a state cryptsetup leaves).
        run.teardown(h)?;
    }
    progress(Progress { size, done: size });
    Ok(RunOutcome::Finished)
}

/// The teardown dropped the reencryption metadata (the last hotzone was the moved segment).
fn requirement_gone(h: &Luks2Header) -> bool {
    super::state::requirement_version(&h.metadata).is_none()
}
