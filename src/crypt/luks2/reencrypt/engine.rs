//! The hotzone loop (`crypt_reencrypt_run` and `reencrypt_step`), offline, in cryptsetup's
//! commit order:
//!
//! 1. the segments with the hotzone flagged `in-reencryption` are set in memory;
//! 2. the hotzone's old ciphertext is read;
//! 3. its protection is stored (checksum: one hash per block; journal: the ciphertext itself)
//!    and flushed, then the header saying "this hotzone is being rewritten" is written;
//! 4. the hotzone is re-keyed on all cores and written, and the data flushed;
//! 5. the header saying "done up to here" is written; the last hotzone's is the teardown's
//!    header write, which drops the metadata too (online, the server serves that hotzone
//!    only after it).
//!
//! Without resilience (`none`) steps 3 and 5 are skipped, as cryptsetup does, and the
//! header is written once, when the loop ends or is stopped.

use super::layout::Ends;
use super::parallel::{self, Keyed};
use super::state::{data_segments, is_backup, Mode, ReencryptState, Resilience};
use super::verify::KeysByDigest;
use super::{area, recover, verify};
use crate::block::aligned::AlignedBuf;
use crate::block::stream_copy::stream_copy;
use crate::block::BlockDevice;
use crate::crypt::cipher::{new_sector_cipher, CipherSpec};
use crate::crypt::luks::{LuksError, VolumeKey};
use crate::crypt::luks2::header::Luks2Header;
use crate::crypt::luks2::json::{Metadata, Segment};
use crate::crypt::luks2::keyslot;

/// How far a reencryption is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of data in all.
    pub size: u64,
    /// Bytes reencrypted.
    pub done: u64,
}

/// Options of a run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Largest hotzone (`--hotzone-size`), bytes; `None` as large as the protection allows.
    pub max_hotzone: Option<u64>,
    /// The data device's I/O block (cryptsetup aligns hotzones to it), bytes.
    pub io_block: u64,
    /// Reencrypt only this many bytes of data (`--device-size`, cryptsetup's fixed size
    /// mode); `None`: to the device's end, or to the end the segments record after a crash.
    pub device_size: Option<u64>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The whole device uses the new key and the reencryption metadata is gone.
    Finished,
    /// Stopped on request; the metadata says where to resume.
    Stopped,
}

/// The old and new volume keys of a reencryption (`None` for a plaintext end: the old one
/// when encrypting, the new one when decrypting).
pub struct Keys {
    /// Key of the `backup-previous` segment.
    pub old: Option<VolumeKey>,
    /// Key of the `backup-final` segment.
    pub new: Option<VolumeKey>,
}

/// Unlock both keys of a reencryption with `pass` (`LUKS2_keyslot_open_all_segments`):
/// for each key, keyslot `slot` when it holds that key, else every keyslot that does.
pub fn unlock_keys(
    dev: &dyn BlockDevice,
    h: &Luks2Header,
    st: &ReencryptState,
    pass: &[u8],
    slot: Option<u32>,
) -> Result<Keys, LuksError> {
    let m = &h.metadata;
    let open = |digest: Option<u32>| -> Result<Option<VolumeKey>, LuksError> {
        let Some(digest) = digest else {
            return Ok(None);
        };
        let mut ids: Vec<u32> = m
            .digests
            .get(&digest)
            .map(|d| d.keyslots.clone())
            .unwrap_or_default();
        if let Some(s) = slot.filter(|s| ids.contains(s)) {
            ids = vec![s];
        }
        let mut err = LuksError::NoUsableKeyslot;
        for id in ids {
            match keyslot::unlock(dev, h, pass, Some(id), keyslot::Segment::Any) {
                Ok((_, k)) => return Ok(Some(k)),
                Err(e @ (LuksError::WrongPassphrase | LuksError::NoUsableKeyslot)) => err = e,
                Err(e) => return Err(e),
            }
        }
        Err(err)
    };
    Ok(Keys {
        old: open(st.digest_old)?,
        new: open(st.digest_new)?,
    })
}

impl Keys {
    /// Both keys by their digests in `st`.
    pub fn by_digest(&self, st: &ReencryptState) -> KeysByDigest<'_> {
        let mut k = KeysByDigest::new();
        if let (Some(d), Some(key)) = (st.digest_old, &self.old) {
            k.insert(d, &key[..]);
        }
        if let (Some(d), Some(key)) = (st.digest_new, &self.new) {
            k.entry(d).or_insert(&key[..]);
        }
        k
    }
}

/// Drop digests bound to nothing, then write both header copies (cryptsetup's
/// `LUKS2_hdr_write` erases unused digests the same way).
pub fn commit(dev: &dyn BlockDevice, h: &mut Luks2Header) -> Result<(), LuksError> {
    commit_unflushed(dev, h)?;
    dev.flush()?;
    Ok(())
}

/// [`commit`] with the primary copy left unflushed ([`Luks2Header::write_unflushed`]): a
/// hotzone's commits, whose primary copy becomes durable with the flush that follows anyway
/// (the data's, or the next hotzone's protection's).
fn commit_unflushed(dev: &dyn BlockDevice, h: &mut Luks2Header) -> Result<(), LuksError> {
    h.metadata
        .digests
        .retain(|_, d| !(d.keyslots.is_empty() && d.segments.is_empty()));
    h.write_unflushed(dev)
}

/// The cipher of a backup segment: `None` for a plaintext (linear) one.
pub(super) fn keyed(seg: &Segment, key: Option<&VolumeKey>) -> Result<Option<Keyed>, LuksError> {
    if seg.kind == "linear" {
        return Ok(None);
    }
    let key = key.ok_or_else(|| {
        LuksError::Invalid("Reencryption metadata is invalid (no key for a crypt segment).".into())
    })?;
    let spec =
        CipherSpec::parse(&seg.encryption).map_err(|e| LuksError::Unsupported(e.to_string()))?;
    Ok(Some(Keyed {
        cipher: new_sector_cipher(&spec, key).map_err(|e| LuksError::Unsupported(e.to_string()))?,
        sector_size: seg.sector_size as usize,
        iv_base: seg.iv_tweak,
    }))
}

/// What a run tells the server of a device it reencrypts while serving it (online), so that
/// no request sees a hotzone while it is rewritten. Offline runs have none. A boundary splits
/// the data: forward, the new key is below it and the old one from it on; backward (a
/// decryption with a detached header), the old key below and the new one (plaintext) above.
pub trait Hotzones {
    /// The hotzone loop starts with the boundary at `boundary` (after any recovery).
    fn start(&self, boundary: u64);
    /// `[offset, offset + len)` is about to be read: return once no request touches it, and
    /// hold new requests that do.
    fn enter(&self, offset: u64, len: u64);
    /// The hotzone entered last is rewritten, durable and committed (the last one only once
    /// the reencryption's metadata is dropped); the boundary is now
    /// `boundary` (its end forward, its start backward): held requests go on.
    fn leave(&self, boundary: u64);
}

/// A reencryption under way: the devices, the header, both keys as ciphers.
pub struct Run<'a> {
    /// The header device.
    pub hdr_dev: &'a dyn BlockDevice,
    /// The data device (the header device unless the header is detached).
    pub data_dev: &'a dyn BlockDevice,
    /// The header.
    pub h: &'a mut Luks2Header,
    /// The state read when the run began.
    pub st: ReencryptState,
    /// Both ends.
    pub ends: Ends,
    /// The old key (`None`: plaintext, when encrypting).
    pub old: Option<Keyed>,
    /// The new key (`None`: plaintext, when decrypting).
    pub new: Option<Keyed>,
    /// Byte offset of the data on the data device.
    pub data_offset: u64,
    /// Unmaps finished hotzones' mappings of the data (a file in RAM) on a thread of its own.
    reaper: Option<super::mapped::Reaper>,
    /// Online: no mapping (the server's own writes bypass it), hotzones gated.
    hooks: Option<&'a dyn Hotzones>,
    /// The journal area mapped in memory, when the header device is a file in RAM.
    journal: Option<super::mapped::Mapped>,
    /// The data read and written past the page cache, offline on a disk (`direct`).
    direct: Option<super::direct::DirectIo>,
    /// The journal written past the page cache, offline on a disk, as cryptsetup writes it:
    /// buffered, the flush after it had to write 16 MiB of dirty pages back first.
    journal_direct: Option<super::direct::DirectIo>,
    /// A hotzone commit's primary header copy is written but not flushed yet.
    unflushed: bool,
}

impl<'a> Run<'a> {
    /// Check the reencryption metadata with both keys and set up a run.
    pub fn new(
        hdr_dev: &'a dyn BlockDevice,
        data_dev: &'a dyn BlockDevice,
        h: &'a mut Luks2Header,
        keys: &Keys,
    ) -> Result<Run<'a>, LuksError> {
        let st = ReencryptState::read(&h.metadata)?.ok_or_else(|| {
            LuksError::Invalid("Device not marked for LUKS2 reencryption.".into())
        })?;
        verify::check(&h.metadata, &st, &keys.by_digest(&st))?;
        if !st.forward() && st.keyslot.mode == Mode::Reencrypt {
            return Err(LuksError::Unsupported(format!(
                "resuming a {} reencryption ({}); dmkit resumes a re-key forward only",
                st.keyslot.mode.word(),
                st.keyslot.direction.word()
            )));
        }
        if st.moved.is_some() || st.keyslot.shift != 0 {
            return Err(LuksError::Unsupported(format!(
                "a {} reencryption with {} resilience (data shift) here; dmkit runs a data \
                 shift offline, for an encryption with the header at the start only",
                st.keyslot.mode.word(),
                st.keyslot.resilience.word()
            )));
        }
        let data_offset = st.fin.offset;
        let device_size = data_dev
            .size()
            .checked_sub(data_offset)
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                LuksError::Invalid(format!("Device {} is too small.", data_dev.name()))
            })?;
        let ends = Ends::read(&st, device_size).ok_or_else(|| {
            LuksError::Invalid(format!(
                "reencryption metadata: backup segments do not match mode {}",
                st.keyslot.mode.word()
            ))
        })?;
        let old = keyed(&ends.previous, keys.old.as_ref())?;
        let new = keyed(&ends.last, keys.new.as_ref())?;
        Ok(Run {
            hdr_dev,
            data_dev,
            h,
            st,
            ends,
            old,
            new,
            data_offset,
            reaper: None,
            hooks: None,
            journal: None,
            direct: None,
            journal_direct: None,
            unflushed: false,
        })
    }

    /// Bytes of data.
    pub fn device_size(&self) -> u64 {
        self.ends.device_size
    }

    /// The boundary between new and old data, from a clean (not crashed) header: forward,
    /// the size of the new segment in front, or 0 (`_offset_forward`); backward, the size of
    /// the old segment in front, or the device's end (`_offset_backward`). `None` when the
    /// only segment is already the new one: the loop ended but teardown did not.
    fn resume_boundary(&self) -> Result<Option<u64>, LuksError> {
        let m = &self.h.metadata;
        let regular: Vec<(&u32, &Segment)> =
            m.segments.iter().filter(|(_, s)| !is_backup(s)).collect();
        let fresh = if self.ends.forward {
            0
        } else {
            self.ends.device_size
        };
        match regular.as_slice() {
            [(id, seg)] => {
                let d = m.segment_digest(**id).map(|(i, _)| i);
                let finished = d == self.ends.digest_new
                    && d != self.ends.digest_old
                    && seg.kind == self.ends.last.kind;
                Ok((!finished).then_some(fresh))
            }
            [(_, first), _] => first
                .size
                .filter(|&s| s > 0 && s < self.ends.device_size)
                .map(Some)
                .ok_or_else(|| {
                    LuksError::Invalid("reencryption metadata: bad first segment size".into())
                }),
            _ => Err(LuksError::Invalid(format!(
                "reencryption metadata: {} data segments",
                regular.len()
            ))),
        }
    }

    /// The hotzone alignment: the checksum block, or the largest of the I/O block and both
    /// sector sizes (`reencrypt_get_alignment`).
    fn alignment(&self, io_block: u64) -> u64 {
        match &self.st.keyslot.resilience {
            Resilience::Checksum { sector_size, .. } => u64::from(*sector_size),
            _ => io_block.max(parallel::unit(self.old.as_ref(), self.new.as_ref()) as u64),
        }
    }

    /// Run to the end (or until `progress` returns `false`), telling `hooks` of every hotzone:
    /// the server of a device reencrypted online gates its requests with them.
    pub fn run_gated(
        mut self,
        hooks: &'a dyn Hotzones,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<RunOutcome, LuksError> {
        self.hooks = Some(hooks);
        self.run(opts, progress)
    }

    /// Bytes rewritten when the new data ends (forward) or starts (backward) at `boundary`.
    fn done(&self, boundary: u64) -> u64 {
        if self.ends.forward {
            boundary
        } else {
            self.ends.device_size - boundary
        }
    }

    /// Run to the end (or until `progress` returns `false`).
    pub fn run(
        mut self,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<RunOutcome, LuksError> {
        self.fix_size(opts)?;
        let size = self.device_size();
        let forward = self.ends.forward;
        // Online: a re-key forward, or a decryption backward (a detached header; a data
        // shift is refused in `Run::new`), as cryptsetup 2.6 runs them.
        let online_ok = match self.st.keyslot.mode {
            Mode::Reencrypt => forward,
            Mode::Decrypt => !forward,
            Mode::Encrypt => false,
        };
        if self.hooks.is_some() && !online_ok {
            return Err(LuksError::Unsupported(format!(
                "online {} reencryption ({}); dmkit reencrypts online a re-key forward or a decryption backward only",
                self.st.keyslot.mode.word(),
                self.st.keyslot.direction.word()
            )));
        }
        let recovered = match self.st.hot_id() {
            Some(r) => {
                let seg = self.h.metadata.segments.get(&r).cloned().ok_or_else(|| {
                    LuksError::Invalid(format!("reencryption metadata: no segment {r}"))
                })?;
                let devices = recover::Devices {
                    hdr_dev: self.hdr_dev,
                    data_dev: self.data_dev,
                    resilience: &self.st.keyslot.resilience,
                    area: self.st.area(),
                    data_offset: self.data_offset,
                    device_size: size,
                    old: self.old.as_ref(),
                    new: self.new.as_ref(),
                };
                let (offset, length) = recover::hotzone(&devices, &seg)?;
                let boundary = if forward { offset + length } else { offset };
                let finished = if forward {
                    boundary >= size
                } else {
                    boundary == 0
                };
                // The hotzone joins the new data (when it was the last one, the teardown's
                // header write is the commit: it must not leave the hot layout behind).
                self.ends
                    .install(&mut self.h.metadata, self.ends.post(boundary), None);
                if !finished {
                    commit(self.hdr_dev, self.h)?;
                }
                Some(boundary).filter(|_| !finished)
            }
            None => self.resume_boundary()?,
        };
        let Some(mut boundary) = recovered else {
            if let Some(h) = self.hooks {
                h.start(if forward { size } else { 0 });
            }
            self.teardown()?;
            progress(Progress { size, done: size });
            return Ok(RunOutcome::Finished);
        };
        if let Some(h) = self.hooks {
            h.start(boundary);
        }
        let alignment = self.alignment(opts.io_block);
        if let Some(m) = opts.max_hotzone {
            if m % alignment != 0 {
                return Err(LuksError::Invalid(format!(
                    "Hotzone size must be multiple of calculated zone alignment ({alignment} bytes)."
                )));
            }
        }
        let max = area::hotzone_length(
            &self.st.keyslot.resilience,
            self.st.area().1,
            opts.max_hotzone,
            alignment,
        )?;
        let left = size - self.done(boundary);
        // Re-keyed in place, piece by piece: between hotzones the buffer holds ciphertext only,
        // so it needs no wiping (a 1 GiB wipe would cost as much as a hotzone's crypto).
        // Decrypting leaves plaintext in it, which is the device's content from then on.
        // Page-aligned, so a disk's hotzones can go past the page cache.
        let mut buf = AlignedBuf::new(max.min(left) as usize);
        if self.hooks.is_none() {
            self.direct = super::direct::DirectIo::new(
                self.data_dev,
                self.data_offset,
                self.ends.device_size,
            );
            if self.st.keyslot.resilience == Resilience::Journal {
                let (area, len) = self.st.area();
                self.journal_direct = super::direct::DirectIo::new(self.hdr_dev, area, len);
            }
        }
        let mut outcome = RunOutcome::Finished;
        // Online, the boundary after the last hotzone, told to the server after the teardown.
        let mut held = None;
        let hooks = self.hooks;
        let result = (|| {
            while self.done(boundary) < size {
                if !progress(Progress {
                    size,
                    done: self.done(boundary),
                }) {
                    outcome = RunOutcome::Stopped;
                    break;
                }
                let length = max.min(size - self.done(boundary));
                let offset = if forward { boundary } else { boundary - length };
                if let Some(h) = self.hooks {
                    h.enter(offset, length);
                }
                // The last hotzone's "done" commit is the teardown's header write: a state
                // with every byte rewritten and the metadata still there is one cryptsetup
                // 2.6.1 resumes from the first byte (its offset of a lone segment is 0
                // forward, the last hotzone backward), rewriting the device a second time.
                // Online the server may write a hotzone only once it is committed (a journal
                // recovery would overwrite those writes), so the last one is left only after
                // the teardown.
                let end = if forward { offset + length } else { offset };
                let last = self.done(end) == size;
                self.step(&mut buf.all()[..length as usize], offset, last)?;
                boundary = if forward { offset + length } else { offset };
                match self.hooks {
                    Some(_) if last => held = Some(boundary),
                    Some(h) => h.leave(boundary),
                    None => {}
                }
            }
            Ok::<(), LuksError>(())
        })();
        drop(buf);
        let settled = self.settle();
        result?;
        settled?;
        if self.st.keyslot.resilience == Resilience::None {
            // The one header write of a run without resilience, after the data it describes
            // is durable (cryptsetup does not flush the data here; a detached header could
            // then claim more than the disk holds).
            self.data_dev.flush()?;
            commit(self.hdr_dev, self.h)?;
        }
        if outcome == RunOutcome::Finished {
            progress(Progress { size, done: size });
            self.teardown()?;
        }
        if let (Some(h), Some(boundary)) = (hooks, held) {
            h.leave(boundary);
        }
        Ok(outcome)
    }

    /// The size a run covers (`reencrypt_load_by_passphrase`, `reencrypt_load_crashed`):
    /// `--device-size` when given, checked against what the segments record; after a crash,
    /// the size the segments record when none is dynamic; else the device's.
    fn fix_size(&mut self, opts: &RunOptions) -> Result<(), LuksError> {
        let (recorded, dynamic) = self
            .h
            .metadata
            .segments
            .values()
            .filter(|s| !is_backup(s))
            .fold((0u64, false), |(sum, dynamic), s| match s.size {
                Some(n) => (sum + n, dynamic),
                None => (sum, true),
            });
        let size = match opts.device_size {
            Some(r) => {
                let misaligned = |s: &Segment| {
                    s.kind == "crypt" && !r.is_multiple_of(u64::from(s.sector_size.max(512)))
                };
                if (recorded > 0 && r < recorded)
                    || r > self.ends.device_size
                    || (!dynamic && r != recorded)
                    || misaligned(&self.ends.previous)
                    || misaligned(&self.ends.last)
                {
                    return Err(LuksError::Invalid(
                        "Illegal device size requested in reencryption parameters.".into(),
                    ));
                }
                let alignment = self.alignment(opts.io_block);
                if !r.is_multiple_of(alignment) {
                    return Err(LuksError::Invalid(format!(
                        "Device size must be multiple of calculated zone alignment ({alignment} bytes)."
                    )));
                }
                r
            }
            None if self.st.hot_id().is_some() && !dynamic && recorded > 0 => {
                if recorded > self.ends.device_size {
                    return Err(LuksError::Invalid(format!(
                        "Device {} is too small.",
                        self.data_dev.name()
                    )));
                }
                recorded
            }
            None => return Ok(()),
        };
        if self.hooks.is_some() && size != self.ends.device_size {
            return Err(LuksError::Unsupported(
                "--device-size with an online reencryption (dmkit reencrypts what it serves whole)"
                    .into(),
            ));
        }
        self.ends.device_size = size;
        self.ends.fixed = true;
        Ok(())
    }

    /// Flush the header device if a hotzone commit's primary copy is not durable yet.
    fn settle(&mut self) -> Result<(), LuksError> {
        if std::mem::take(&mut self.unflushed) {
            self.hdr_dev.flush()?;
        }
        Ok(())
    }

    /// One hotzone, `buf.len()` bytes at `offset`, in cryptsetup's commit order. Reads,
    /// hashing, journal writes, re-keying and data writes each run on all cores, piece by
    /// piece; the header commits between them keep the order.
    /// The `last` hotzone is left `in-reencryption` on disk: the teardown's
    /// header write commits it.
    fn step(&mut self, buf: &mut [u8], offset: u64, last: bool) -> Result<(), LuksError> {
        let length = buf.len() as u64;
        let (segs, rseg) = self.ends.hot(offset, length);
        self.ends.install(&mut self.h.metadata, segs, Some(rseg));
        let at = self.data_offset + offset;
        // Offline, a data device in RAM is re-keyed in its page cache, through a mapping of
        // this hotzone (online, the server's own writes would bypass it).
        let mut window = None;
        if self.hooks.is_none() {
            window = super::mapped::Mapped::lazy(self.data_dev, at, length);
            if window.is_some() && self.reaper.is_none() {
                self.reaper = super::mapped::Reaper::start();
            }
        }
        let mapped = window.is_some();
        let buf: &mut [u8] = match &mut window {
            Some(w) => w.bytes(),
            None => buf,
        };
        let area = self.st.area().0;
        let (data_dev, hdr_dev) = (self.data_dev, self.hdr_dev);
        let res = &self.st.keyslot.resilience;
        let unit = match res {
            Resilience::Checksum { sector_size, .. } => *sector_size as usize,
            _ => parallel::unit(self.old.as_ref(), self.new.as_ref()),
        };
        // Direct requests need 4096-byte boundaries; 4096 is a multiple of every sector and
        // checksum block size.
        let direct = self.direct.as_ref().filter(|_| !mapped);
        let journal_direct = self.journal_direct.as_ref();
        let unit = if direct.is_some() {
            unit.max(4096)
        } else {
            unit
        };
        if *res == Resilience::Journal && self.journal.is_none() {
            self.journal = super::mapped::Mapped::new(hdr_dev, area, self.st.area().1);
        }
        // The journal's mapping by address: each thread copies its piece of the hotzone to
        // the same (disjoint) place in it.
        let journal = match (res, self.journal.as_mut()) {
            (Resilience::Journal, Some(j)) => Some(j.range(area, length).as_mut_ptr() as usize),
            _ => None,
        };
        // Each thread reads and hashes (or journals) its piece a sub-piece at a time, so the
        // disk reads ahead while the core hashes.
        let sums = parallel::pieces(buf, unit, |o, piece| {
            let mut sums = Vec::new();
            for (s, sub) in parallel::sub_pieces(piece, unit) {
                let o = o + s;
                if !mapped {
                    match direct.and_then(|d| d.read_at(sub, at + o as u64)) {
                        Some(r) => r?,
                        None => data_dev.read_at(sub, at + o as u64)?,
                    }
                }
                match (res, journal) {
                    (Resilience::Checksum { hash, sector_size }, _) => {
                        sums.extend(parallel::block_hashes(sub, *sector_size as usize, hash)?)
                    }
                    (Resilience::Journal, Some(j)) => {
                        // SAFETY: `j` is the start of `length` mapped bytes of the journal
                        // (mapped while `self.journal` lives, which outlives this call); this
                        // sub-piece's range `o..o + sub.len()` is within it and no other
                        // thread touches it.
                        let to = unsafe {
                            std::slice::from_raw_parts_mut((j as *mut u8).add(o), sub.len())
                        };
                        // The journal is read back only after a crash: streamed past the
                        // cache, which keeps the hotzone for its re-keying.
                        stream_copy(to, sub)
                    }
                    (Resilience::Journal, None) => {
                        match journal_direct.and_then(|d| d.write_at(sub, area + o as u64)) {
                            Some(r) => r?,
                            None => hdr_dev.write_at(sub, area + o as u64)?,
                        }
                    }
                    // A data shift is refused in `Run::new`.
                    _ => {}
                }
            }
            Ok(sums)
        })?;
        let protected = *res != Resilience::None;
        if protected {
            if let Resilience::Checksum { .. } = res {
                hdr_dev.write_at(&sums.concat(), area)?;
            }
            if let (Some(j), Some(_)) = (self.journal.as_mut(), journal) {
                j.sync(area, length)
                    .map_err(|e| LuksError::Invalid(format!("{}: {e}", hdr_dev.name())))?;
            }
            // This flush also makes durable the primary copy of the previous hotzone's last
            // commit: its flushed secondary copy already said that hotzone is done, so the
            // protection area was free to be overwritten before it.
            hdr_dev.flush()?;
            self.unflushed = false;
            commit_unflushed(hdr_dev, self.h)?;
            self.unflushed = true;
        }
        // Re-keyed and written a sub-piece at a time, writeback of each started at once: the
        // disk writes while the core re-keys the next, and the flush below has little left.
        let (old, new) = (self.old.as_ref(), self.new.as_ref());
        parallel::pieces(buf, unit, |o, piece| {
            let mut subs: Vec<_> = parallel::sub_pieces(piece, unit).collect();
            if mapped {
                // In memory, last bytes first: the cache still holds the end of what this
                // thread just journaled.
                subs.reverse();
            }
            for (s, sub) in subs {
                let o = o + s;
                parallel::rekey_piece(sub, offset + o as u64, old, new);
                if !mapped {
                    match direct.and_then(|d| d.write_at(sub, at + o as u64)) {
                        Some(r) => r?,
                        None => {
                            data_dev.write_at(sub, at + o as u64)?;
                            super::mapped::start_writeback(
                                data_dev,
                                at + o as u64,
                                sub.len() as u64,
                            );
                        }
                    }
                }
            }
            Ok(())
        })?;
        if let Some(w) = window.as_mut().filter(|_| protected) {
            w.sync(at, length)
                .map_err(|e| LuksError::Invalid(format!("{}: {e}", data_dev.name())))?;
        }
        if let (Some(w), Some(r)) = (window, &self.reaper) {
            r.retire(w);
        }
        if protected {
            // The data may be written while the "in reencryption" commit's primary copy is
            // unflushed (its secondary copy, flushed, says so); one flush covers both when the
            // header is on the data device.
            data_dev.flush()?;
            if std::ptr::addr_eq(hdr_dev, data_dev) {
                self.unflushed = false;
            } else {
                self.settle()?;
            }
        }
        let post = self.ends.post(if self.ends.forward {
            offset + length
        } else {
            offset
        });
        self.ends.install(&mut self.h.metadata, post, None);
        if protected && !last {
            commit_unflushed(hdr_dev, self.h)?;
            self.unflushed = true;
            if self.hooks.is_some() {
                // Online the server may write the header between hotzones: leave it settled.
                self.settle()?;
            }
        }
        Ok(())
    }

    /// The end of a finished reencryption (`reencrypt_teardown_ok`): backup segments, the
    /// requirement and the reencrypt keyslot dropped in one header write, then the keyslots
    /// of the old key destroyed one by one. cryptsetup destroys the old keyslots first; a
    /// crash between a keyslot's wipe and the header write after it then leaves a device in
    /// reencryption whose old key can no longer be unlocked, which nothing can resume. In
    /// this order every crash leaves a device that opens: in reencryption with both keys, or
    /// finished with at most some old-key keyslots left unbound (and no data under that key).
    fn teardown(self) -> Result<(), LuksError> {
        let Run {
            hdr_dev,
            h,
            st,
            ends,
            ..
        } = self;
        drop_metadata(hdr_dev, h, &st)?;
        match ends.digest_old.filter(|&d| Some(d) != ends.digest_new) {
            Some(digest_old) => destroy_keyslots_of(hdr_dev, h, digest_old),
            None => Ok(()),
        }
    }
}

/// Destroy the keyslots of digest `digest` one by one (each its own header write).
pub(super) fn destroy_keyslots_of(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    digest: u32,
) -> Result<(), LuksError> {
    let slots: Vec<u32> = h
        .metadata
        .digests
        .get(&digest)
        .map(|d| d.keyslots.clone())
        .unwrap_or_default();
    for id in slots {
        destroy_keyslot(dev, h, id)?;
    }
    Ok(())
}

/// The reencryption's metadata dropped in one header write (backup segments, requirement,
/// reencrypt keyslot), then the keyslot's area wiped.
pub(super) fn drop_metadata(
    hdr_dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    st: &ReencryptState,
) -> Result<(), LuksError> {
    let m: &mut Metadata = &mut h.metadata;
    m.segments.retain(|_, s| !is_backup(s));
    let live: Vec<u32> = m.segments.keys().copied().collect();
    for d in m.digests.values_mut() {
        d.segments.retain(|s| live.contains(s));
    }
    m.config
        .requirements
        .retain(|r| !r.starts_with("online-reencrypt"));
    m.keyslots.remove(&st.keyslot.id);
    for d in m.digests.values_mut() {
        d.keyslots.retain(|&k| k != st.keyslot.id);
    }
    commit(hdr_dev, h)?;
    let (off, len) = st.area();
    keyslot::wipe(hdr_dev, off, len)
}

/// Finish a reencryption that cryptsetup left in its own teardown: every byte is under the
/// new key (one data segment, bound to the new key's digest, no hotzone open) but the old
/// key's keyslots are already destroyed, because cryptsetup destroys them before it drops the
/// metadata. Neither tool can unlock both keys any more, so neither can resume; what is left
/// is only to drop the metadata, which needs no data rewritten and so no old key. `pass` must
/// unlock the new key. `Ok(false)` when the header is not in that state.
pub fn finish_orphaned(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    st: &ReencryptState,
    pass: &[u8],
    slot: Option<u32>,
) -> Result<bool, LuksError> {
    let m = &h.metadata;
    let (Some(old), Some(new)) = (st.digest_old, st.digest_new) else {
        return Ok(false);
    };
    let old_slots = m.digests.get(&old).map_or(0, |d| d.keyslots.len());
    let data: Vec<u32> = m
        .segments
        .iter()
        .filter(|(_, s)| !is_backup(s))
        .map(|(&id, _)| id)
        .collect();
    let all_new =
        matches!(data.as_slice(), [only] if m.segment_digest(*only).map(|(d, _)| d) == Some(new));
    if old == new || old_slots > 0 || !all_new || st.hot.is_some() {
        return Ok(false);
    }
    keyslot::unlock(dev, h, pass, slot, keyslot::Segment::Digest(new))?;
    drop_metadata(dev, h, st)?;
    Ok(true)
}

/// A decryption cryptsetup 2.6.1 was killed in during its teardown (`reencrypt_teardown_ok`
/// destroys the old key's keyslots, each its area wiped and then its entry dropped in a header
/// write, before the header write that drops the metadata), which `unlocked`, the failed
/// unlock of its key, shows: no hotzone flagged, every data segment plaintext, and no keyslot
/// left (`NoUsableKeyslot`), or only ones the passphrase does not open (`WrongPassphrase`:
/// killed between a keyslot's wipe and the header write after it, the entry stays over a wiped
/// area). cryptsetup cannot resume it; nothing in it needs a key any more (its data is
/// decrypted, its last bytes were wiped before the keyslots went), so the metadata is dropped
/// and the keyslots left destroyed, as cryptsetup's teardown would, without one. Returns
/// whether it was such a device.
pub fn finish_keyless_decryption(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    st: &ReencryptState,
    unlocked: &LuksError,
) -> Result<bool, LuksError> {
    let data = data_segments(&h.metadata);
    let plaintext = !data.is_empty() && data.iter().all(|s| s.kind == "linear");
    let no_key = matches!(
        unlocked,
        LuksError::WrongPassphrase | LuksError::NoUsableKeyslot
    );
    if st.keyslot.mode != Mode::Decrypt || st.hot.is_some() || !plaintext || !no_key {
        return Ok(false);
    }
    let left: Vec<u32> = h
        .metadata
        .keyslots
        .keys()
        .copied()
        .filter(|&id| id != st.keyslot.id)
        .collect();
    drop_metadata(dev, h, st)?;
    for id in left {
        destroy_keyslot(dev, h, id)?;
    }
    Ok(true)
}

/// Wipe keyslot `id`'s area, then drop it (and every reference to it) from the header, and
/// digests left bound to nothing with it (`crypt_keyslot_destroy`).
pub(super) fn destroy_keyslot(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    id: u32,
) -> Result<(), LuksError> {
    let Some(k) = h.metadata.keyslots.get(&id) else {
        return Ok(());
    };
    let (off, len) = (k.area.offset, k.area.size);
    if off.saturating_add(len) <= dev.size() {
        keyslot::wipe(dev, off, len)?;
    }
    keyslot::forget(h, id);
    commit(dev, h)
}
