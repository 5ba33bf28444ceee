//! The segments of a device in reencryption, as cryptsetup computes them for a forward
//! reencryption (`reencrypt_make_hot_segments_forward`, `..._post_segments_forward`,
//! `reencrypt_assign_segments`): before a hotzone is written, the hotzone is a segment of its
//! own flagged `in-reencryption` (bound to both keys); after, it joins the new-key segment in
//! front of it. The backup segments follow with the next free ids.
//!
//! Encryption and decryption (`reencrypt_assign_segments_simple`) have one key only: the
//! plaintext side is `linear` segments, and every `crypt` segment, the backups included, is
//! bound to that key's digest.

use super::state::{Mode, ReencryptState};
use crate::crypt::luks2::json::{Metadata, Segment};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The raw JSON of a new segment: its `flags`, when it has any (the typed fields are
/// serialized from the segment itself).
fn raw_flags(flags: &[&str]) -> Map<String, Value> {
    let mut raw = Map::new();
    if !flags.is_empty() {
        raw.insert("flags".into(), Value::from(flags.to_vec()));
    }
    raw
}

/// A `crypt` segment as cryptsetup creates one (`json_segment_create_crypt`).
pub fn crypt(
    offset: u64,
    size: Option<u64>,
    iv_tweak: u64,
    cipher: &str,
    sector_size: u32,
    flags: &[&str],
) -> Segment {
    let raw = raw_flags(flags);
    Segment {
        kind: "crypt".into(),
        offset,
        size,
        iv_tweak,
        encryption: cipher.into(),
        sector_size,
        flags: flags.iter().map(|f| f.to_string()).collect(),
        raw,
        problem: None,
    }
}

/// A `linear` segment as cryptsetup creates one (`json_segment_create_linear`).
pub fn linear(offset: u64, size: Option<u64>, flags: &[&str]) -> Segment {
    let raw = raw_flags(flags);
    Segment {
        kind: "linear".into(),
        offset,
        size,
        iv_tweak: 0,
        encryption: String::new(),
        sector_size: 0,
        flags: flags.iter().map(|f| f.to_string()).collect(),
        raw,
        problem: None,
    }
}

/// `seg` with `flag` added (`LUKS2_segment_set_flag`).
pub fn flagged(seg: &Segment, flag: &str) -> Segment {
    let mut s = seg.clone();
    s.flags.push(flag.into());
    s.raw.insert("flags".into(), Value::from(s.flags.clone()));
    s
}

/// The two ends of a reencryption: the device as it was and as it will be.
pub struct Ends {
    /// The `backup-previous` segment.
    pub previous: Segment,
    /// The `backup-final` segment.
    pub last: Segment,
    /// What changes: the key (both ends encrypted), or plaintext to ciphertext and back.
    pub mode: Mode,
    /// From the start to the end (the new data in front), or from the end (new data behind).
    pub forward: bool,
    /// Digest of the old key (`None`: the old end is plaintext).
    pub digest_old: Option<u32>,
    /// Digest of the new key (`None`: the new end is plaintext).
    pub digest_new: Option<u32>,
    /// Bytes of data the segments cover (to the device's end, or `--device-size`).
    pub device_size: u64,
    /// `--device-size` (cryptsetup's fixed size mode): the segment after the hotzone ends at
    /// `device_size` rather than with the device.
    pub fixed: bool,
}

impl Ends {
    /// The ends recorded in `st` (in place): `None` when an end that must be encrypted has no
    /// digest, or a plaintext end has one, or a re-key walks backward (cryptsetup walks
    /// backward only to decrypt or to encrypt with a data shift).
    pub fn read(st: &ReencryptState, device_size: u64) -> Option<Ends> {
        if !st.forward() && st.keyslot.mode == Mode::Reencrypt {
            return None;
        }
        let keyed = |s: &Segment, d: Option<u32>| (s.kind == "crypt") == d.is_some();
        if !keyed(&st.previous, st.digest_old) || !keyed(&st.fin, st.digest_new) {
            return None;
        }
        let ok = match st.keyslot.mode {
            Mode::Reencrypt => st.digest_old.is_some() && st.digest_new.is_some(),
            Mode::Encrypt => st.digest_old.is_none() && st.digest_new.is_some(),
            Mode::Decrypt => st.digest_old.is_some() && st.digest_new.is_none(),
        };
        ok.then(|| Ends {
            previous: st.previous.clone(),
            last: st.fin.clone(),
            mode: st.keyslot.mode,
            forward: st.forward(),
            digest_old: st.digest_old,
            digest_new: st.digest_new,
            device_size,
            fixed: false,
        })
    }

    /// The part from byte `offset` on (`size` bytes, or to the end) of `end`, a backup
    /// segment: its cipher and sector size, its IVs (or plaintext, when it is linear).
    fn part(end: &Segment, offset: u64, size: Option<u64>, flags: &[&str]) -> Segment {
        if end.kind == "linear" {
            return linear(end.offset + offset, size, flags);
        }
        crypt(
            end.offset + offset,
            size,
            end.iv_tweak + (offset >> 9),
            &end.encryption,
            end.sector_size,
            flags,
        )
    }

    fn new_seg(&self, offset: u64, size: Option<u64>, flags: &[&str]) -> Segment {
        Self::part(&self.last, offset, size, flags)
    }

    fn old_seg(&self, offset: u64, size: Option<u64>) -> Segment {
        Self::part(&self.previous, offset, size, &[])
    }

    /// The segments while the hotzone `offset..offset + length` is rewritten, and the id of
    /// the one in reencryption.
    pub fn hot(&self, offset: u64, length: u64) -> (BTreeMap<u32, Segment>, u32) {
        let mut segs = BTreeMap::new();
        if !self.forward {
            // `reencrypt_make_hot_segments_backward`: old data in front, new data behind.
            if offset > 0 {
                segs.insert(0, self.old_seg(0, Some(offset)));
            }
            let rseg = segs.len() as u32;
            segs.insert(
                rseg,
                self.new_seg(offset, Some(length), &["in-reencryption"]),
            );
            if offset + length < self.device_size {
                let rest = self.rest(offset + length);
                segs.insert(rseg + 1, self.new_seg(offset + length, rest, &[]));
            }
            return (segs, rseg);
        }
        if offset > 0 {
            segs.insert(0, self.new_seg(0, Some(offset), &[]));
        }
        let rseg = segs.len() as u32;
        segs.insert(
            rseg,
            self.new_seg(offset, Some(length), &["in-reencryption"]),
        );
        if offset + length < self.device_size {
            let rest = self.rest(offset + length);
            segs.insert(rseg + 1, self.old_seg(offset + length, rest));
        }
        (segs, rseg)
    }

    /// The size of a segment from `from` to the end: to `device_size` in the fixed size mode,
    /// else dynamic.
    fn rest(&self, from: u64) -> Option<u64> {
        self.fixed.then(|| self.device_size - from)
    }

    /// The segments once the data is rewritten up to `boundary`: forward, `0..boundary` is
    /// new; backward, `boundary..` is.
    pub fn post(&self, boundary: u64) -> BTreeMap<u32, Segment> {
        let mut segs = BTreeMap::new();
        if !self.forward {
            if boundary > 0 {
                segs.insert(0, self.old_seg(0, Some(boundary)));
            }
            let n = segs.len() as u32;
            // `reencrypt_make_post_segments_backward`: sized only while old data is in front.
            let size = self.rest(boundary).filter(|_| boundary > 0);
            segs.insert(n, self.new_seg(boundary, size, &[]));
            return segs;
        }
        let done = boundary;
        let rest = done < self.device_size;
        // The new data is dynamic again once no old data is left behind it, fixed size mode
        // or not (`reencrypt_make_post_segments_forward`).
        segs.insert(0, self.new_seg(0, rest.then_some(done), &[]));
        if rest {
            segs.insert(1, self.old_seg(done, self.rest(done)));
        }
        segs
    }

    /// Make `segs` the header's segments, the backups after them, and bind each to its key's
    /// digest as cryptsetup does. `rseg` is the segment in reencryption, if any.
    pub fn install(&self, m: &mut Metadata, segs: BTreeMap<u32, Segment>, rseg: Option<u32>) {
        for d in m.digests.values_mut() {
            d.segments.clear();
        }
        let count = segs.len() as u32;
        let bind = |m: &mut Metadata, seg: u32, digest: Option<u32>| {
            if let Some(d) = digest.and_then(|d| m.digests.get_mut(&d)) {
                if !d.segments.contains(&seg) {
                    d.segments.push(seg);
                }
            }
        };
        m.segments = segs;
        // The backups take the next ids (`LUKS2_segment_first_unused_id`).
        let backups = |m: &mut Metadata| {
            let prev = count;
            m.segments
                .insert(prev, flagged_as(&self.previous, "backup-previous"));
            bind(m, prev, self.digest_old);
            m.segments
                .insert(prev + 1, flagged_as(&self.last, "backup-final"));
            bind(m, prev + 1, self.digest_new);
        };
        if self.mode != Mode::Reencrypt {
            // One key: the backups first, then every crypt segment, as cryptsetup binds them.
            let key = self.digest_new.or(self.digest_old);
            backups(m);
            let crypt: Vec<u32> = (0..count)
                .filter(|i| m.segments.get(i).is_some_and(|s| s.kind == "crypt"))
                .collect();
            for i in crypt {
                bind(m, i, key);
            }
            return;
        }
        match rseg {
            Some(r) => {
                bind(m, r, self.digest_new);
                bind(m, r, self.digest_old);
                if r > 0 {
                    bind(m, 0, self.digest_new);
                }
                if count > r + 1 {
                    bind(m, r + 1, self.digest_old);
                }
            }
            None => {
                bind(m, 0, self.digest_new);
                if count > 1 {
                    bind(m, 1, self.digest_old);
                }
            }
        }
        backups(m);
    }
}

/// A backup segment as stored: the flag exactly once.
fn flagged_as(seg: &Segment, flag: &str) -> Segment {
    if seg.flags.iter().any(|f| f == flag) {
        seg.clone()
    } else {
        flagged(seg, flag)
    }
}
