//! What a header in reencryption says: the reencrypt keyslot's parameters, the backup
//! segments and their digests, and whether a hotzone was left `in-reencryption`.

use crate::crypt::luks::LuksError;
use crate::crypt::luks2::json::{Metadata, Segment};
use serde_json::Value;

/// What the reencryption does (the keyslot's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Old key to new key.
    Reencrypt,
    /// Plaintext to a key.
    Encrypt,
    /// A key to plaintext.
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

/// How a hotzone is protected against a crash (the reencrypt keyslot's area `type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resilience {
    /// Hashes of the hotzone's old ciphertext, one per `block` bytes, with `hash`.
    Checksum {
        /// Hash name ("sha256").
        hash: String,
        /// Bytes per hashed block (the area's `sector_size`).
        block: u32,
    },
    /// A copy of the hotzone's old ciphertext.
    Journal,
    /// Nothing: a crash inside a hotzone loses it.
    None,
}

impl Resilience {
    /// The area type word.
    pub fn word(&self) -> &'static str {
        match self {
            Resilience::Checksum { .. } => "checksum",
            Resilience::Journal => "journal",
            Resilience::None => "none",
        }
    }
}

/// The reencryption state of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The reencrypt keyslot.
    pub keyslot: u32,
    /// Its mode.
    pub mode: Mode,
    /// `true` for "forward".
    pub forward: bool,
    /// The protection area: byte offset and length in the header device.
    pub area: (u64, u64),
    /// How hotzones are protected.
    pub resilience: Resilience,
    /// The `backup-previous` segment: the device before, with the old key (on disk until
    /// the reencryption ends).
    pub previous: u32,
    /// The `backup-final` segment (the device after).
    pub last: u32,
    /// Digest of the old key: the one bound to `backup-previous` (`None` only in
    /// metadata cryptsetup would refuse too).
    pub digest_old: Option<u32>,
    /// Digest of the new key (bound to `backup-final`).
    pub digest_new: Option<u32>,
    /// The segment flagged `in-reencryption`: a hotzone a crash interrupted.
    pub in_reencryption: Option<u32>,
    /// The version of the `online-reencrypt-vN` requirement.
    pub version: u8,
}

/// Whether `seg` carries flag `flag`.
pub fn has_flag(seg: &Segment, flag: &str) -> bool {
    seg.flags.iter().any(|f| f == flag)
}

/// The id of the first segment flagged `flag`.
pub fn segment_by_flag(m: &Metadata, flag: &str) -> Option<u32> {
    m.segments
        .iter()
        .find(|(_, s)| has_flag(s, flag))
        .map(|(&i, _)| i)
}

/// The version of the online-reencryption requirement, if the header has one.
pub fn requirement_version(m: &Metadata) -> Option<u8> {
    m.config.requirements.iter().find_map(|r| {
        if r == "online-reencrypt" {
            Some(1)
        } else {
            r.strip_prefix("online-reencrypt-v")?.parse().ok()
        }
    })
}

fn corrupt(what: String) -> LuksError {
    LuksError::Invalid(format!("reencryption metadata: {what}"))
}

impl State {
    /// The state of `m`, `None` when it is not in reencryption.
    pub fn read(m: &Metadata) -> Result<Option<State>, LuksError> {
        let Some(version) = requirement_version(m) else {
            return Ok(None);
        };
        let (&keyslot, ks) = m
            .keyslots
            .iter()
            .find(|(_, k)| k.kind == "reencrypt")
            .ok_or_else(|| corrupt("no reencrypt keyslot".into()))?;
        let raw = &ks.raw;
        let text = |o: &serde_json::Map<String, Value>, k: &str| -> Result<String, LuksError> {
            o.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| corrupt(format!("keyslot {keyslot}: no {k:?}")))
        };
        let mode = match text(raw, "mode")?.as_str() {
            "reencrypt" => Mode::Reencrypt,
            "encrypt" => Mode::Encrypt,
            "decrypt" => Mode::Decrypt,
            o => return Err(corrupt(format!("keyslot {keyslot}: mode {o:?}"))),
        };
        let forward = text(raw, "direction")? == "forward";
        let area = raw
            .get("area")
            .and_then(Value::as_object)
            .ok_or_else(|| corrupt(format!("keyslot {keyslot}: no area")))?;
        let resilience = match text(area, "type")?.as_str() {
            "checksum" => Resilience::Checksum {
                hash: text(area, "hash")?,
                block: area
                    .get("sector_size")
                    .and_then(Value::as_u64)
                    .and_then(|b| u32::try_from(b).ok())
                    .filter(|b| *b >= 512 && b.is_power_of_two())
                    .ok_or_else(|| corrupt(format!("keyslot {keyslot}: bad sector_size")))?,
            },
            "journal" => Resilience::Journal,
            "none" => Resilience::None,
            o => {
                return Err(LuksError::Unsupported(format!(
                    "reencryption with {o:?} resilience"
                )))
            }
        };
        let previous = segment_by_flag(m, "backup-previous")
            .ok_or_else(|| corrupt("no backup-previous segment".into()))?;
        let last = segment_by_flag(m, "backup-final")
            .ok_or_else(|| corrupt("no backup-final segment".into()))?;
        let digest_of = |s: u32| m.segment_digest(s).map(|(i, _)| i);
        Ok(Some(State {
            keyslot,
            mode,
            forward,
            area: (ks.area.offset, ks.area.size),
            resilience,
            previous,
            last,
            digest_old: digest_of(previous),
            digest_new: digest_of(last),
            in_reencryption: segment_by_flag(m, "in-reencryption"),
            version,
        }))
    }
}
