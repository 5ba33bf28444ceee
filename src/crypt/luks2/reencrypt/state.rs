//! The state of a LUKS2 reencryption as cryptsetup (2.4 .. 2.7) keeps it in the metadata: the
//! `online-reencrypt-vN` requirement, the `reencrypt` keyslot (mode, direction, resilience
//! area), the data segments in use (one of them flagged `in-reencryption` while a hotzone is
//! being rewritten), the `backup-previous` / `backup-final` / `backup-moved-segment` copies of
//! the old and new segment parameters, and the digest that binds all of it to the volume keys
//! (`luks2_reencrypt_digest.c`, serialized in `verify.rs`). Read-only: the one parser of that
//! metadata, for the engine (init, resume, recovery) and the activation (`reencrypt_open.rs`).

use crate::crypt::luks::LuksError;
use crate::crypt::luks2::json::{Metadata, Segment};
use serde_json::{Map, Value};

/// What cryptsetup's `LUKS2_reencrypt_status` says of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// No reencryption requirement.
    None,
    /// Reencryption in progress, no hotzone open: every segment is what it says.
    Clean,
    /// A hotzone was being rewritten when the process stopped: it needs recovery from the
    /// resilience data before the device may be used.
    Crash,
}

/// The `mode` of the reencrypt keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Old key/cipher to new.
    Reencrypt,
    /// Plain (linear) to encrypted.
    Encrypt,
    /// Encrypted to plain (linear).
    Decrypt,
}

impl Mode {
    /// The keyslot's word.
    pub fn word(self) -> &'static str {
        match self {
            Mode::Reencrypt => "reencrypt",
            Mode::Encrypt => "encrypt",
            Mode::Decrypt => "decrypt",
        }
    }
}

/// The `direction` of the reencrypt keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the start of the device to its end.
    Forward,
    /// From the end to the start.
    Backward,
}

/// How a hotzone is protected (the reencrypt keyslot's `area.type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resilience {
    /// Nothing: a crash mid-hotzone loses it (metadata is written only between hotzones).
    None,
    /// A hash of every `sector_size` block of the old ciphertext in the area.
    Checksum {
        /// Hash name ("sha256").
        hash: String,
        /// Block size the hashes cover.
        sector_size: u32,
    },
    /// The old ciphertext of the whole hotzone copied into the area.
    Journal,
    /// The data moves by `shift` bytes: the old copy stays readable where it was.
    Datashift,
    /// Datashift for the moved first segment, checksums for the rest (cryptsetup 2.5+).
    DatashiftChecksum {
        /// Hash name.
        hash: String,
        /// Block size the hashes cover.
        sector_size: u32,
    },
    /// Datashift for the moved first segment, journal for the rest.
    DatashiftJournal,
}

impl Direction {
    /// The keyslot's word.
    pub fn word(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        }
    }
}

impl Resilience {
    /// The area type word.
    pub fn word(&self) -> &'static str {
        match self {
            Resilience::None => "none",
            Resilience::Checksum { .. } => "checksum",
            Resilience::Journal => "journal",
            Resilience::Datashift => "datashift",
            Resilience::DatashiftChecksum { .. } => "datashift-checksum",
            Resilience::DatashiftJournal => "datashift-journal",
        }
    }
}

/// The reencrypt keyslot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReencryptKeyslot {
    /// Its id.
    pub id: u32,
    /// Mode.
    pub mode: Mode,
    /// Direction.
    pub direction: Direction,
    /// Resilience.
    pub resilience: Resilience,
    /// `area.type` as written.
    pub area_type: String,
    /// Resilience area offset in the header device, bytes.
    pub area_offset: u64,
    /// Resilience area size, bytes.
    pub area_size: u64,
    /// `area.shift_size`: bytes the data moves (datashift modes), else 0.
    pub shift: u64,
}

/// Everything of a header in reencryption that its readers need.
#[derive(Debug, Clone, PartialEq)]
pub struct ReencryptState {
    /// The requirement version (1 for plain `online-reencrypt`, 2, 3).
    pub version: u8,
    /// Clean or crash.
    pub status: Status,
    /// The reencrypt keyslot.
    pub keyslot: ReencryptKeyslot,
    /// The segments in use, ids 0.. in order (backups excluded).
    pub segments: Vec<Segment>,
    /// Index in `segments` of the one flagged `in-reencryption`.
    pub hot: Option<usize>,
    /// The `backup-previous` segment (old parameters).
    pub previous: Segment,
    /// Its id.
    pub previous_id: u32,
    /// The `backup-final` segment (new parameters).
    pub fin: Segment,
    /// Its id.
    pub fin_id: u32,
    /// The `backup-moved-segment`, when the first segment moves (datashift).
    pub moved: Option<Segment>,
    /// Digest of the old volume key (none when encrypting a plain device).
    pub digest_old: Option<u32>,
    /// Digest of the new volume key (none when decrypting).
    pub digest_new: Option<u32>,
}

/// The reencryption requirement's version, if the header carries one cryptsetup knows.
pub fn requirement_version(m: &Metadata) -> Option<u8> {
    m.config.requirements.iter().find_map(|r| match r.as_str() {
        "online-reencrypt" => Some(1),
        "online-reencrypt-v2" => Some(2),
        "online-reencrypt-v3" => Some(3),
        _ => None,
    })
}

/// Mandatory requirements cryptsetup 2.6 does not know (it refuses every operation on them).
pub fn unknown_requirements(m: &Metadata) -> Vec<&str> {
    m.config
        .requirements
        .iter()
        .map(String::as_str)
        .filter(|r| {
            !matches!(
                *r,
                "offline-reencrypt"
                    | "online-reencrypt"
                    | "online-reencrypt-v2"
                    | "online-reencrypt-v3"
            )
        })
        .collect()
}

/// cryptsetup's `LUKS2_unmet_requirements(.., mask = 0)` refusal of an operation that changes
/// the header (keyslot add, UUID change, ...): its message, or `None` when there is no
/// requirement at all.
pub fn refuse_change(m: &Metadata) -> Option<LuksError> {
    if !unknown_requirements(m).is_empty() {
        return Some(LuksError::Invalid(
            "Unmet LUKS2 requirements detected.".into(),
        ));
    }
    if m.config
        .requirements
        .iter()
        .any(|r| r == "offline-reencrypt")
    {
        return Some(LuksError::Invalid(
            "Operation incompatible with device marked for legacy reencryption. Aborting.".into(),
        ));
    }
    if requirement_version(m).is_some() {
        return Some(LuksError::Invalid(
            "Operation incompatible with device marked for LUKS2 reencryption. Aborting.".into(),
        ));
    }
    None
}

/// `LUKS2_reencrypt_status`: no requirement, clean, or crashed mid-hotzone.
pub fn status(m: &Metadata) -> Status {
    if requirement_version(m).is_none() {
        return Status::None;
    }
    if m.segments
        .values()
        .any(|s| s.flags.iter().any(|f| f == "in-reencryption"))
    {
        Status::Crash
    } else {
        Status::Clean
    }
}

/// Whether `s` is a backup segment (`backup-previous`, `backup-final`,
/// `backup-moved-segment`), not one of the data's.
pub(super) fn is_backup(s: &Segment) -> bool {
    s.flags.iter().any(|f| f.starts_with("backup-"))
}

/// The data segments of `m`, backups left out.
pub(super) fn data_segments(m: &Metadata) -> Vec<Segment> {
    m.segments
        .values()
        .filter(|s| !is_backup(s))
        .cloned()
        .collect()
}

fn by_flag<'a>(m: &'a Metadata, flag: &str) -> Option<(u32, &'a Segment)> {
    m.segments
        .iter()
        .find(|(_, s)| s.flags.iter().any(|f| f == flag))
        .map(|(&i, s)| (i, s))
}

fn bad(what: String) -> LuksError {
    LuksError::Invalid(format!("LUKS2 reencryption metadata: {what}"))
}

fn field_str<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    o.get(key).and_then(Value::as_str)
}

fn field_u64(o: &Map<String, Value>, key: &str) -> Option<u64> {
    match o.get(key)? {
        Value::String(s) => s.parse().ok(),
        v => v.as_u64(),
    }
}

impl ReencryptState {
    /// The reencryption state of `m`, `None` when it has no reencryption requirement.
    pub fn read(m: &Metadata) -> Result<Option<ReencryptState>, LuksError> {
        let Some(version) = requirement_version(m) else {
            return Ok(None);
        };
        let (id, k) = m
            .keyslots
            .iter()
            .find(|(_, k)| k.kind == "reencrypt")
            .map(|(&i, k)| (i, k))
            .ok_or_else(|| bad("no reencrypt keyslot".into()))?;
        let o = &k.raw;
        let mode = match field_str(o, "mode") {
            Some("reencrypt") => Mode::Reencrypt,
            Some("encrypt") => Mode::Encrypt,
            Some("decrypt") => Mode::Decrypt,
            other => return Err(bad(format!("keyslot {id}: mode {other:?}"))),
        };
        let direction = match field_str(o, "direction") {
            Some("forward") => Direction::Forward,
            Some("backward") => Direction::Backward,
            other => return Err(bad(format!("keyslot {id}: direction {other:?}"))),
        };
        let empty = Map::new();
        let a = o.get("area").and_then(Value::as_object).unwrap_or(&empty);
        let area_type = field_str(a, "type").unwrap_or_default().to_string();
        let checksum = || -> Result<(String, u32), LuksError> {
            let hash = field_str(a, "hash")
                .ok_or_else(|| bad(format!("keyslot {id}: checksum without hash")))?;
            let ss = a.get("sector_size").and_then(Value::as_u64).unwrap_or(0);
            if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
                return Err(bad(format!("keyslot {id}: checksum sector_size {ss}")));
            }
            Ok((hash.to_string(), ss as u32))
        };
        let resilience = match area_type.as_str() {
            "none" => Resilience::None,
            "journal" => Resilience::Journal,
            "datashift" => Resilience::Datashift,
            "datashift-journal" => Resilience::DatashiftJournal,
            "checksum" => {
                let (hash, sector_size) = checksum()?;
                Resilience::Checksum { hash, sector_size }
            }
            "datashift-checksum" => {
                let (hash, sector_size) = checksum()?;
                Resilience::DatashiftChecksum { hash, sector_size }
            }
            other => return Err(bad(format!("keyslot {id}: area type {other:?}"))),
        };
        let keyslot = ReencryptKeyslot {
            id,
            mode,
            direction,
            resilience,
            area_type,
            area_offset: k.area.offset,
            area_size: k.area.size,
            shift: field_u64(a, "shift_size").unwrap_or(0),
        };
        let mut segments = Vec::new();
        for (i, (&sid, s)) in m.segments.iter().filter(|(_, s)| !is_backup(s)).enumerate() {
            if sid as usize != i {
                return Err(bad(format!("segment ids are not 0..: {sid} at {i}")));
            }
            if let Some(p) = &s.problem {
                return Err(bad(format!("segment {sid}: {p}")));
            }
            if s.kind != "crypt" && s.kind != "linear" {
                return Err(bad(format!("segment {sid} of type {:?}", s.kind)));
            }
            segments.push(s.clone());
        }
        if segments.is_empty() {
            return Err(bad("no data segment".into()));
        }
        let hot = segments
            .iter()
            .position(|s| s.flags.iter().any(|f| f == "in-reencryption"));
        let previous = by_flag(m, "backup-previous");
        let fin = by_flag(m, "backup-final");
        let (Some((pid, previous)), Some((fid, fin))) = (previous, fin) else {
            return Err(bad("backup-previous or backup-final segment missing".into()));
        };
        let digest_of = |sid: u32| m.segment_digest(sid).map(|(d, _)| d);
        Ok(Some(ReencryptState {
            version,
            status: status(m),
            keyslot,
            segments,
            hot,
            previous: previous.clone(),
            previous_id: pid,
            fin: fin.clone(),
            fin_id: fid,
            moved: by_flag(m, "backup-moved-segment").map(|(_, s)| s.clone()),
            digest_old: digest_of(pid),
            digest_new: digest_of(fid),
        }))
    }

    /// Whether the reencryption walks the device from its start.
    pub fn forward(&self) -> bool {
        self.keyslot.direction == Direction::Forward
    }

    /// The resilience area: byte offset and length in the header device.
    pub fn area(&self) -> (u64, u64) {
        (self.keyslot.area_offset, self.keyslot.area_size)
    }

    /// The id of the segment a crash left `in-reencryption` (segment ids are `0..`).
    pub fn hot_id(&self) -> Option<u32> {
        self.hot.map(|i| i as u32)
    }

    /// The data offset the device size is measured from (`LUKS2_reencrypt_data_offset`):
    /// the new segment's offset, plus the shift while a forward datashift is clean.
    pub fn data_offset(&self) -> u64 {
        if self.status == Status::Clean {
            self.served_offset()
        } else {
            self.fin.offset
        }
    }

    /// Where the served device's size is measured from once any interrupted hotzone is
    /// recovered (cryptsetup activates after recovery, in the clean state): the new segment's
    /// offset, plus the shift of a forward datashift (the data still sits that far on).
    pub fn served_offset(&self) -> u64 {
        match self.keyslot.direction {
            Direction::Forward => self.fin.offset + self.keyslot.shift,
            Direction::Backward => self.fin.offset,
        }
    }

    /// The segments' extents on the served device: `(start, length)` for each of
    /// [`ReencryptState::segments`] on a device of `device_size` bytes, as
    /// `LUKS2_assembly_multisegment_dmd` lays them out ("dynamic" only as the last one).
    pub fn extents(&self, device_size: u64) -> Result<Vec<(u64, u64)>, LuksError> {
        let mut start = 0u64;
        let mut out = Vec::new();
        let n = self.segments.len();
        for (i, s) in self.segments.iter().enumerate() {
            let len = match s.size {
                Some(l) => l,
                None if i + 1 == n => device_size.saturating_sub(start),
                None => return Err(bad(format!("segment {i} is dynamic but not the last"))),
            };
            if len == 0 || start.checked_add(len).is_none_or(|e| e > device_size) {
                return Err(bad(format!(
                    "segment {i} ({start}+{len}) does not fit the {device_size}-byte device"
                )));
            }
            out.push((start, len));
            start += len;
        }
        Ok(out)
    }

    /// The digests whose keys an activation needs, in cryptsetup's order (old, then new).
    pub fn digests(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.digest_old.into_iter().collect();
        if let Some(n) = self.digest_new.filter(|&n| Some(n) != self.digest_old) {
            v.push(n);
        }
        v
    }
}
