//! `reencrypt --encrypt --reduce-device-size` with the header at the start of the device, as
//! cryptsetup 2.6 does it (`encrypt_luks2_init` with `CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT`,
//! `reencrypt_set_encrypt_segments`, `reencrypt_make_hot_segments_encrypt_shift`,
//! `_enc_create_segments_shift_after`, `reencrypt_offset_backward_moved`).
//!
//! The device's last `reduce` bytes are given up; half of them, the shift `S`, becomes the
//! header and keyslots area. The plaintext's first `S` bytes (where the header goes) are
//! copied first to the device's last `S` bytes (the "moved" segment), then the header is
//! written over them. The data then moves forward by `S` while it is encrypted, from the end
//! backward, a hotzone of `S` bytes at a time: a hotzone's new place never overlaps its old
//! one, so a crash mid-hotzone leaves the old plaintext readable where it was (resilience
//! `datashift`) and recovery simply does the hotzone again. The moved first segment goes
//! last, from its copy; the copy is wiped at the end.
//!
//! Layout, `D` bytes in all, `P = D - 2S` bytes of plaintext:
//! `[header S][plaintext S..P]...[moved copy of plaintext 0..S]` becomes
//! `[header S][ciphertext of 0..P][wiped]`.
//!
//! With a detached header (`--header`, [`init_encrypt_in_place`]) cryptsetup 2.6.1 takes the
//! same option and writes the same kind of metadata, but nothing moves: the shift is the whole
//! reduction, the data stays at 0 and each hotzone is encrypted where it lies, backward. No
//! copy of a hotzone exists while it is rewritten, so a run cut inside one cannot be
//! recovered by anyone (cryptsetup 2.6.1's repair fills it with the plaintext found one shift
//! before it); dmkit refuses such a state instead of guessing. A run stopped between hotzones
//! resumes in either tool. The last hotzone's closing header write drops the reencryption
//! metadata: cryptsetup 2.6.1 encrypts a second time a device left with every byte encrypted
//! and the metadata still there (its own runs cut before their teardown leave that state;
//! dmkit finishes it by dropping the metadata).

use super::engine::{commit, drop_metadata, keyed, Keys, Progress, RunOutcome};
use super::init::{check_aligned, only_segment, seal};
use super::layout::{crypt, flagged, linear};
use super::parallel::{self, Keyed};
use super::state::{data_segments, Direction, Mode, ReencryptState, Resilience};
use super::{verify, InitParams};
use crate::block::aligned::AlignedBuf;
use crate::block::BlockDevice;
use crate::crypt::luks::LuksError;
use crate::crypt::luks2::header::Luks2Header;
use crate::crypt::luks2::json::{Metadata, Segment};
use std::collections::BTreeMap;

fn invalid(s: String) -> LuksError {
    LuksError::Invalid(s)
}

/// Put the plaintext device `data` (`device_size` bytes) into encryption with a data shift of
/// `shift` bytes: `h` is the header just formatted in memory on `mem` (its data offset the
/// shift, keyslot 0 bound to `key`). In `h` (written to `mem`, not to `data`), the data
/// becomes the linear segments of the plaintext as it will lie once the first segment is
/// moved, with `backup-moved-segment`, `backup-previous`, `backup-final`, the reencrypt
/// keyslot (mode `encrypt`, `backward`, resilience `datashift`) and its digest over `key`.
/// Nothing is written to the data device: [`move_first_segment`] and the header placement
/// follow. Returns the reencrypt keyslot.
pub fn init_encrypt(
    mem: &dyn BlockDevice,
    h: &mut Luks2Header,
    data_name: &str,
    device_size: u64,
    shift: u64,
    key: &[u8],
    p: &InitParams,
) -> Result<u32, LuksError> {
    let seg0 = only_segment(mem, h)?;
    let data_offset = seg0.offset;
    let too_small = || invalid(format!("Device {data_name} is too small."));
    let data_size = device_size
        .checked_sub(data_offset)
        .filter(|&s| s > 0)
        .ok_or_else(too_small)?;
    check_aligned(device_size, data_offset, seg0.sector_size)?;
    if data_size < shift {
        return Err(too_small());
    }
    if shift < data_offset {
        return Err(invalid(format!(
            "Data shift ({} sectors) is less than future data offset ({} sectors).",
            shift >> 9,
            data_offset >> 9
        )));
    }
    check_shift(shift, seg0.sector_size)?;
    // `reencrypt_set_encrypt_segments`: [future header (shift)][second data segment][gap
    // (shift)][first data segment (shift)].
    let plain = data_size - shift;
    if plain == 0 {
        return Err(too_small());
    }
    let first = plain.min(shift);
    let digest_new = segment0_digest(h)?;
    let mut next = h.clone();
    let m = &mut next.metadata;
    m.segments.clear();
    m.segments.insert(0, linear(data_size, Some(first), &[]));
    if plain > shift {
        m.segments
            .insert(1, linear(shift, Some(plain - shift), &[]));
    }
    let n = m.segments.len() as u32;
    let moved = flagged(&m.segments[&0], "backup-moved-segment");
    m.segments.insert(n, moved);
    m.segments
        .insert(n + 1, linear(0, Some(plain), &["backup-previous"]));
    m.segments.insert(n + 2, flagged(&seg0, "backup-final"));
    seal_encrypt(
        mem,
        h,
        next,
        n + 2,
        digest_new,
        key,
        seg0.sector_size,
        shift,
        p,
    )
}

/// Put the plaintext device (`device_size` bytes, named `data_name`) into encryption in place
/// under the detached header `h` just formatted in memory on `mem` (data offset 0, keyslot 0
/// bound to `key`), as cryptsetup 2.6.1 does for `--encrypt --reduce-device-size S --header`
/// (`reencrypt_set_encrypt_segments` with a data shift and no moved segment): one linear
/// segment over the whole device, `backup-previous` the same, `backup-final` the dynamic
/// crypt segment at 0, and the reencrypt keyslot (mode `encrypt`, `backward`, resilience
/// `datashift` of `shift` bytes). Nothing is written to the data device. Returns the
/// reencrypt keyslot.
pub fn init_encrypt_in_place(
    mem: &dyn BlockDevice,
    h: &mut Luks2Header,
    data_name: &str,
    device_size: u64,
    shift: u64,
    key: &[u8],
    p: &InitParams,
) -> Result<u32, LuksError> {
    let seg0 = only_segment(mem, h)?;
    check_aligned(device_size, seg0.offset, seg0.sector_size)?;
    if seg0.offset != 0 {
        return Err(invalid(format!(
            "{data_name}: an in-place encryption needs the data at offset 0, not {}",
            seg0.offset
        )));
    }
    // cryptsetup refuses a device smaller than the shift here, after formatting the header.
    if device_size < shift {
        return Err(invalid(
            "Failed to initialize LUKS2 reencryption in metadata.".into(),
        ));
    }
    check_shift(shift, seg0.sector_size)?;
    let digest_new = segment0_digest(h)?;
    let mut next = h.clone();
    let m = &mut next.metadata;
    m.segments.clear();
    m.segments.insert(0, linear(0, Some(device_size), &[]));
    m.segments
        .insert(1, linear(0, Some(device_size), &["backup-previous"]));
    m.segments.insert(2, flagged(&seg0, "backup-final"));
    seal_encrypt(mem, h, next, 2, digest_new, key, seg0.sector_size, shift, p)
}

/// cryptsetup's refusal of a data shift that is not a whole number of encryption sectors.
fn check_shift(shift: u64, sector_size: u32) -> Result<(), LuksError> {
    if shift == 0 || !shift.is_multiple_of(u64::from(sector_size)) {
        return Err(invalid(format!(
            "Data shift value is not aligned to encryption sector size ({sector_size} bytes)."
        )));
    }
    Ok(())
}

/// The digest that segment 0 (the new key's) is bound to.
fn segment0_digest(h: &Luks2Header) -> Result<u32, LuksError> {
    h.metadata
        .segment_digest(0)
        .map(|(i, _)| i)
        .ok_or_else(|| invalid("no digest for segment 0".into()))
}

/// The end of both encryption set-ups: only the new digest stays bound, to the `backup-final`
/// segment `final_seg`, and the metadata `next` is sealed with the reencrypt keyslot (mode
/// `encrypt`, `backward`, resilience `datashift` of `shift` bytes).
#[allow(clippy::too_many_arguments)]
fn seal_encrypt(
    mem: &dyn BlockDevice,
    h: &mut Luks2Header,
    mut next: Luks2Header,
    final_seg: u32,
    digest_new: u32,
    key: &[u8],
    sector_size: u32,
    shift: u64,
    p: &InitParams,
) -> Result<u32, LuksError> {
    let m = &mut next.metadata;
    for d in m.digests.values_mut() {
        d.segments.clear();
    }
    if let Some(d) = m.digests.get_mut(&digest_new) {
        d.segments.push(final_seg);
    }
    let keys = verify::KeysByDigest::from([(digest_new, key)]);
    let ip = InitParams {
        resilience: Resilience::Datashift,
        ..p.clone()
    };
    seal(
        mem,
        h,
        next,
        Mode::Encrypt,
        Direction::Backward,
        &keys,
        (512, sector_size),
        shift,
        &ip,
    )
}

/// Copy the plaintext's first segment to its `backup-moved-segment` place (`reencrypt_move_data`)
/// and make it durable: this must precede the header written over it.
pub fn move_first_segment(data: &dyn BlockDevice, st: &ReencryptState) -> Result<(), LuksError> {
    let moved = st
        .moved
        .as_ref()
        .ok_or_else(|| invalid("reencryption metadata: no moved segment".into()))?;
    let len = moved.size.filter(|&l| l > 0 && l <= st.keyslot.shift);
    let len = len.ok_or_else(|| invalid("reencryption metadata: bad moved segment".into()))?;
    let mut buf = AlignedBuf::new(len as usize);
    let from = st.previous.offset;
    data.read_at(buf.all(), from)?;
    data.write_at(buf.all(), moved.offset)?;
    data.flush()?;
    Ok(())
}

/// Whether `st` is an encryption with a moved first segment, which [`run`] does.
pub fn is_moved_encryption(st: &ReencryptState) -> bool {
    st.moved.is_some() && is_backward_shift_encryption(st)
}

/// Whether `st` is an encryption with a data shift and no moved segment (the data encrypted
/// where it lies under a detached header), which [`run`] does too.
pub fn is_in_place_encryption(st: &ReencryptState) -> bool {
    st.moved.is_none() && is_backward_shift_encryption(st) && st.fin.offset == 0
}

fn is_backward_shift_encryption(st: &ReencryptState) -> bool {
    st.keyslot.mode == Mode::Encrypt
        && st.keyslot.direction == Direction::Backward
        && st.keyslot.resilience == Resilience::Datashift
}

/// A datashift encryption under way.
struct Shift<'a> {
    hdr_dev: &'a dyn BlockDevice,
    data_dev: &'a dyn BlockDevice,
    st: ReencryptState,
    new: Keyed,
    /// Where the encrypted data starts (the `backup-final` offset).
    data_offset: u64,
    shift: u64,
    /// The copy of the first segment; `None` for an encryption in place.
    moved: Option<Segment>,
}

fn size_of(s: &Segment) -> Result<u64, LuksError> {
    s.size
        .ok_or_else(|| invalid("reencryption metadata: a linear segment without size".into()))
}

impl Shift<'_> {
    /// Make `segs` the header's segments, then the backups (`backup-previous`,
    /// `backup-final`, `backup-moved-segment`, next free ids), the new key's digest bound
    /// to the final backup and every crypt segment (`reencrypt_assign_segments_simple`).
    fn install(&self, m: &mut Metadata, segs: Vec<Segment>) {
        for d in m.digests.values_mut() {
            d.segments.clear();
        }
        let n = segs.len() as u32;
        m.segments = segs
            .into_iter()
            .enumerate()
            .map(|(i, s)| (i as u32, s))
            .collect::<BTreeMap<_, _>>();
        m.segments.insert(n, self.st.previous.clone());
        m.segments.insert(n + 1, self.st.fin.clone());
        if let Some(moved) = &self.moved {
            m.segments.insert(n + 2, moved.clone());
        }
        let Some(d) = self.st.digest_new.and_then(|d| m.digests.get_mut(&d)) else {
            return;
        };
        d.segments.push(n + 1);
        for (&i, s) in &m.segments {
            if i < n && s.kind == "crypt" {
                d.segments.push(i);
            }
        }
    }

    /// The next hotzone (`reencrypt_offset_backward_moved`): the last `shift` bytes of the
    /// plaintext not counting the moved first segment, or what is left of it, and the moved
    /// segment itself last (offset 0). `None` when no plaintext is left.
    ///
    /// In place, the part of the plaintext beyond a whole number of shifts goes first, then a
    /// shift at a time: every boundary a run stops at then leaves a multiple of the shift,
    /// which cryptsetup 2.6.1 resumes (its own order, the last shift first, stops with "Failed
    /// to update reencryption context." once less than a shift is left, on a device of one to
    /// two shifts; dmkit finishes such a state too).
    fn next(&self, segs: &[Segment]) -> Result<Option<(u64, u64)>, LuksError> {
        let mut linear = 0;
        for s in segs.iter().filter(|s| s.kind == "linear") {
            linear += size_of(s)?;
        }
        if linear == 0 {
            return Ok(None);
        }
        let s = self.shift;
        if self.moved.is_none() {
            let part = match linear % s {
                0 => s,
                r => r,
            };
            return Ok(Some((linear - part, part)));
        }
        if segs.len() == 1 {
            return Ok(Some((0, s)));
        }
        if linear < s {
            return Err(invalid(format!(
                "reencryption metadata: {linear} bytes of plaintext left, less than the shift"
            )));
        }
        let rest = linear - s;
        Ok(Some(if rest > 0 && rest < s {
            (s, rest)
        } else {
            (rest, s)
        }))
    }

    /// The segments while the hotzone `offset..offset + length` is rewritten, and the index of
    /// the one in reencryption (`reencrypt_make_hot_segments_encrypt_shift`).
    fn hot(
        &self,
        segs: &[Segment],
        offset: u64,
        length: u64,
    ) -> Result<(Vec<Segment>, usize), LuksError> {
        let crypt_seg = segs.iter().position(|s| s.kind == "crypt");
        let sg = segs
            .iter()
            .rposition(|s| s.kind == "linear")
            .ok_or_else(|| invalid("reencryption metadata: no plaintext segment".into()))?;
        let mut hot: Vec<Segment> = segs[..sg].to_vec();
        let size = size_of(&segs[sg])?;
        if size > length {
            let mut shrunk = segs[sg].clone();
            shrunk.size = Some(size - length);
            hot.push(shrunk);
        }
        let fin = &self.st.fin;
        hot.push(crypt(
            self.data_offset + offset,
            Some(length),
            offset >> 9,
            &fin.encryption,
            fin.sector_size,
            &["in-reencryption"],
        ));
        let r = hot.len() - 1;
        if let Some(c) = crypt_seg {
            hot.push(segs[c].clone());
        }
        Ok((hot, r))
    }

    /// The segments once the hotzone `r` of `hot` is written (`_enc_create_segments_shift_after`):
    /// it joins the encrypted segment behind it, which is "dynamic" once it is the only one.
    fn post(&self, hot: &[Segment], r: usize, offset: u64, length: u64) -> Vec<Segment> {
        let mut post: Vec<Segment> = hot[..r].to_vec();
        let mut joined = match hot.get(r + 1) {
            Some(behind) => {
                let mut s = behind.clone();
                s.offset = self.data_offset + offset;
                s.iv_tweak = offset >> 9;
                // A dynamic segment (in place) stays dynamic.
                s.size = s.size.map(|n| n + length);
                s
            }
            None => {
                let h = &hot[r];
                // In place the encrypted part runs to the device's end ("dynamic"), as
                // cryptsetup writes it.
                crypt(
                    h.offset,
                    self.moved.as_ref().map(|_| length),
                    h.iv_tweak,
                    &h.encryption,
                    h.sector_size,
                    &[],
                )
            }
        };
        if r == 0 {
            joined.size = None;
        }
        post.push(joined);
        post
    }

    /// Encrypt the hotzone `offset..offset + length` from where its plaintext lies now (the
    /// moved copy for the first segment, else its old place) to its new place, durably.
    fn write_zone(&self, buf: &mut [u8], offset: u64) -> Result<(), LuksError> {
        let from = match &self.moved {
            Some(moved) if offset == 0 => moved.offset,
            _ => self.st.previous.offset + offset,
        };
        self.data_dev.read_at(buf, from)?;
        parallel::rekey(buf, offset, None, Some(&self.new));
        self.data_dev.write_at(buf, self.data_offset + offset)?;
        self.data_dev.flush()?;
        Ok(())
    }

    /// One hotzone in cryptsetup's order: the header saying it is in reencryption (the old
    /// plaintext stays where it was: nothing else protects it), the data, the header saying
    /// it is done.
    fn step(
        &self,
        h: &mut Luks2Header,
        buf: &mut [u8],
        offset: u64,
        length: u64,
    ) -> Result<(), LuksError> {
        let segs = data_segments(&h.metadata);
        let (hot, r) = self.hot(&segs, offset, length)?;
        self.install(&mut h.metadata, hot.clone());
        commit(self.hdr_dev, h)?;
        self.write_zone(&mut buf[..length as usize], offset)?;
        self.done(h, self.post(&hot, r, offset, length))
    }

    /// Commit `post`, the segments after a hotzone. In place, after the last one (no
    /// plaintext left) the teardown's header write is that commit instead: cryptsetup commits
    /// the last hotzone's segments first, and 2.6.1 resumes that state (its own runs cut there
    /// included) at progress 0 and encrypts the whole device a second time, reporting success.
    /// The header write puts the secondary copy first, so a cut inside it leaves either the
    /// hotzone open (which dmkit refuses, see [`Shift::recover`]) or the metadata dropped.
    /// With a moved segment the two stay apart: the moved copy, plaintext, is wiped between
    /// them (an open hotzone would read it), and cryptsetup refuses that state without
    /// writing ("Failed to set device segments").
    fn done(&self, h: &mut Luks2Header, post: Vec<Segment>) -> Result<(), LuksError> {
        let last = self.moved.is_none() && post.iter().all(|s| s.kind == "crypt");
        self.install(&mut h.metadata, post);
        if last {
            self.teardown(h)
        } else {
            commit(self.hdr_dev, h)
        }
    }

    /// Finish a hotzone a crash left `in-reencryption` (`reencrypt_recover_segment`,
    /// datashift): its plaintext is still at its old place, so it is encrypted again.
    fn recover(&self, h: &mut Luks2Header, r: usize) -> Result<(), LuksError> {
        let (hot, offset, length) = interrupted(&h.metadata, r, self.data_offset, self.shift)?;
        if self.moved.is_none() {
            return Err(invalid(format!(
                "{}: bytes {offset}..{} were being encrypted in place when the run stopped; an encryption with --reduce-device-size and --header keeps no copy of them, so they cannot be recovered (restore them from a backup; cryptsetup's repair would fill them with the plaintext from {} bytes before).",
                self.data_dev.name(),
                offset + length,
                self.shift
            )));
        }
        let mut buf = zeroize::Zeroizing::new(vec![0u8; length as usize]);
        self.write_zone(&mut buf, offset)?;
        self.done(h, self.post(&hot, r, offset, length))
    }

    /// The end (`reencrypt_teardown_ok`): the moved copy of the first segment wiped with
    /// random bytes, the keyslots area sized to the data offset, then the reencryption
    /// metadata dropped in one header write.
    fn teardown(&self, h: &mut Luks2Header) -> Result<(), LuksError> {
        let Some(moved) = &self.moved else {
            return drop_metadata(self.hdr_dev, h, &self.st);
        };
        let len = moved.size.unwrap_or(0);
        let mut chunk = vec![0u8; (1u64 << 20).min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            getrandom::getrandom(&mut chunk[..n])
                .map_err(|e| LuksError::Crypto(format!("random wipe: {e}")))?;
            self.data_dev.write_at(&chunk[..n], moved.offset + done)?;
            done += n as u64;
        }
        self.data_dev.flush()?;
        if self.data_offset > 0 {
            h.metadata.config.keyslots_size = self.data_offset - 2 * h.hdr_size;
        }
        drop_metadata(self.hdr_dev, h, &self.st)
    }
}

/// The segments of `m`, where a crash left segment `r` `in-reencryption` in a data shift of
/// `shift` bytes with the data from `data_offset`: the segments, the hotzone's offset in the
/// data and its length (at most the shift; offset 0, the moved segment, exactly when `r` is 0).
pub(super) fn interrupted(
    m: &Metadata,
    r: usize,
    data_offset: u64,
    shift: u64,
) -> Result<(Vec<Segment>, u64, u64), LuksError> {
    let hot = data_segments(m);
    let seg = &hot[r];
    let offset = seg
        .offset
        .checked_sub(data_offset)
        .ok_or_else(|| invalid("reencryption metadata: hotzone before the data".into()))?;
    let length = seg
        .size
        .filter(|&l| l > 0 && l <= shift)
        .ok_or_else(|| invalid("reencryption metadata: bad hotzone size".into()))?;
    if (offset == 0) != (r == 0) {
        return Err(invalid(
            "reencryption metadata: hotzone and moved segment disagree".into(),
        ));
    }
    Ok((hot, offset, length))
}

/// Run (or resume) the encryption with a moved first segment whose header `h` is on
/// `hdr_dev` to its end, or until `progress` returns `false`. `keys` holds the new key.
pub fn run(
    hdr_dev: &dyn BlockDevice,
    data_dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    keys: &Keys,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<RunOutcome, LuksError> {
    let st = ReencryptState::read(&h.metadata)?
        .ok_or_else(|| invalid("Device not marked for LUKS2 reencryption.".into()))?;
    verify::check(&h.metadata, &st, &keys.by_digest(&st))?;
    if !is_moved_encryption(&st) && !is_in_place_encryption(&st) {
        return Err(LuksError::Unsupported(format!(
            "a {} reencryption ({}, {} resilience) with a moved segment",
            st.keyslot.mode.word(),
            st.keyslot.direction.word(),
            st.keyslot.resilience.word()
        )));
    }
    let new = keyed(&st.fin, keys.new.as_ref())?
        .ok_or_else(|| invalid("reencryption metadata: the final segment is not crypt".into()))?;
    let moved = st.moved.clone();
    let size = st.previous.size.unwrap_or(0);
    let run = Shift {
        hdr_dev,
        data_dev,
        data_offset: st.fin.offset,
        shift: st.keyslot.shift,
        new,
        moved,
        st,
    };
    let end = match &run.moved {
        Some(m) => m.offset.checked_add(m.size.unwrap_or(0)),
        None => run.st.previous.offset.checked_add(size),
    };
    let end = end.filter(|&e| e <= data_dev.size() && run.shift > 0);
    if end.is_none() || (run.moved.is_some() && run.st.fin.offset == 0) {
        return Err(invalid(format!("Device {} is too small.", data_dev.name())));
    }
    if let Some(r) = run.st.hot {
        run.recover(h, r)?;
    }
    let left = |h: &Luks2Header| -> Result<u64, LuksError> {
        let mut n = 0;
        for s in data_segments(&h.metadata)
            .iter()
            .filter(|s| s.kind == "linear")
        {
            n += size_of(s)?;
        }
        Ok(n)
    };
    let mut buf = zeroize::Zeroizing::new(vec![0u8; run.shift as usize]);
    loop {
        let segs = data_segments(&h.metadata);
        let Some((offset, length)) = run.next(&segs)? else {
            break;
        };
        let done = size.saturating_sub(left(h)?);
        if !progress(Progress { size, done }) {
            return Ok(RunOutcome::Stopped);
        }
        run.step(h, &mut buf, offset, length)?;
        if requirement_gone(h) {
            break;
        }
    }
    drop(buf);
    progress(Progress { size, done: size });
    if !requirement_gone(h) {
        // Every hotzone committed, the teardown not begun: a state cryptsetup leaves, and
        // dmkit's own runs with a moved segment.
        run.teardown(h)?;
    }
    Ok(RunOutcome::Finished)
}

/// The last hotzone's commit dropped the reencryption metadata (an encryption in place).
fn requirement_gone(h: &Luks2Header) -> bool {
    super::state::requirement_version(&h.metadata).is_none()
}
