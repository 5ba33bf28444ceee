//! The reencryption digest (cryptsetup's `luks2_reencrypt_digest.c`): a PBKDF2 digest, bound
//! to the reencrypt keyslot, over both volume keys, the keyslot's parameters and the backup
//! segments, serialized byte for byte as cryptsetup does. Metadata changed by someone who does
//! not hold the keys no longer matches, and cryptsetup refuses to resume it ("Reencryption
//! metadata is invalid."). The one serializer, for the engine (create, check on resume) and
//! the activation of a device in reencryption.

use super::state::ReencryptState;
use crate::crypt::luks::LuksError;
use crate::crypt::luks2::digest;
use crate::crypt::luks2::json::Metadata;
use crate::crypt::secret::SecretBytes;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The unlocked volume keys of a reencryption, by the id of the digest each matches.
pub type KeysByDigest<'a> = BTreeMap<u32, &'a [u8]>;

/// Longest string field cryptsetup serializes.
const MAX_STR: usize = 64;

/// How one field is serialized (`struct jtype`).
#[derive(Clone, Copy)]
enum Field {
    /// A string, its bytes.
    Str,
    /// A decimal string, as a big-endian u64.
    U64,
    /// A segment size: "dynamic" as its bytes, else a big-endian u64.
    Size,
    /// A JSON integer, as a big-endian u32.
    U32,
}

fn field(out: &mut Vec<u8>, o: &Map<String, Value>, key: &str, kind: Field) -> Option<()> {
    let v = o.get(key)?;
    match kind {
        Field::Str => {
            let s = v.as_str()?;
            let s = s.split('\0').next().unwrap_or_default();
            if s.is_empty() || s.len() > MAX_STR {
                return None;
            }
            out.extend_from_slice(s.as_bytes());
        }
        Field::U64 => out.extend_from_slice(&v.as_str()?.parse::<u64>().ok()?.to_be_bytes()),
        Field::Size => {
            let s = v.as_str()?;
            if s == "dynamic" {
                out.extend_from_slice(b"dynamic");
            } else {
                out.extend_from_slice(&s.parse::<u64>().ok()?.to_be_bytes());
            }
        }
        Field::U32 => out.extend_from_slice(&u32::try_from(v.as_u64()?).ok()?.to_be_bytes()),
    }
    Some(())
}

fn fields(out: &mut Vec<u8>, list: &[(&Map<String, Value>, &str, Field)]) -> Option<()> {
    list.iter().try_for_each(|(o, k, f)| field(out, o, k, *f))
}

fn segment(out: &mut Vec<u8>, seg: &Value) -> Option<()> {
    let o = seg.as_object()?;
    match o.get("type")?.as_str()? {
        "crypt" => fields(
            out,
            &[
                (o, "type", Field::Str),
                (o, "offset", Field::U64),
                (o, "size", Field::Size),
                (o, "iv_tweak", Field::U64),
                (o, "encryption", Field::Str),
                (o, "sector_size", Field::U32),
            ],
        ),
        "linear" => fields(
            out,
            &[
                (o, "type", Field::Str),
                (o, "offset", Field::U64),
                (o, "size", Field::Size),
            ],
        ),
        _ => None,
    }
}

fn keyslot(out: &mut Vec<u8>, ks: &Map<String, Value>) -> Option<()> {
    let area = ks.get("area")?.as_object()?;
    let kind = area.get("type")?.as_str()?;
    let mut list = vec![
        (ks, "mode", Field::Str),
        (ks, "direction", Field::Str),
        (area, "type", Field::Str),
        (area, "offset", Field::U64),
        (area, "size", Field::U64),
    ];
    match kind {
        "datashift-checksum" => list.extend([
            (area, "hash", Field::Str),
            (area, "sector_size", Field::U32),
            (area, "shift_size", Field::U64),
        ]),
        "datashift" | "datashift-journal" => list.push((area, "shift_size", Field::U64)),
        "checksum" => list.extend([
            (area, "hash", Field::Str),
            (area, "sector_size", Field::U32),
        ]),
        _ => {}
    }
    fields(out, &list)
}

/// The bytes the digest covers (`reencrypt_assembly_verification_data`): the version, the
/// keys of [`ReencryptState::digests`] in order, the reencrypt keyslot's parameters, then the
/// backup segments (`backup-previous`, `backup-final`, `backup-moved-segment`).
pub fn verification_data(
    m: &Metadata,
    st: &ReencryptState,
    keys: &KeysByDigest<'_>,
) -> Result<SecretBytes, LuksError> {
    let bad = || LuksError::Invalid("reencryption metadata cannot be serialized".into());
    let mut out = zeroize::Zeroizing::new(Vec::with_capacity(256));
    out.push(0x76);
    out.push(0x30 + st.version);
    let needed = st.digests();
    if needed.is_empty() {
        return Err(bad());
    }
    for d in needed {
        let k = keys.get(&d).ok_or_else(|| {
            LuksError::Invalid(format!("reencryption: key of digest {d} not unlocked"))
        })?;
        out.extend_from_slice(k);
    }
    keyslot(
        &mut out,
        &m.keyslots.get(&st.keyslot.id).ok_or_else(bad)?.raw,
    )
    .ok_or_else(bad)?;
    for s in [Some(&st.previous), Some(&st.fin), st.moved.as_ref()]
        .into_iter()
        .flatten()
    {
        segment(&mut out, &s.to_value()).ok_or_else(bad)?;
    }
    Ok(SecretBytes::from_slice(&out))
}

/// Bind a new reencryption digest to the reencrypt keyslot (dropping its old one), as
/// `LUKS2_keyslot_reencrypt_digest_create` does. `benchmark` as for the volume key digest.
pub fn create(
    m: &mut Metadata,
    st: &ReencryptState,
    keys: &KeysByDigest<'_>,
    hash: &str,
    benchmark: bool,
) -> Result<(), LuksError> {
    let d = verification_data(m, st, keys)?;
    let mut dg = digest::create(&d, hash, benchmark)?;
    dg.segments.clear();
    dg.keyslots = vec![st.keyslot.id];
    for x in m.digests.values_mut() {
        x.keyslots.retain(|&k| k != st.keyslot.id);
    }
    let id = (0..crate::crypt::luks::MAX_KEYSLOTS)
        .find(|i| !m.digests.contains_key(i))
        .ok_or_else(|| LuksError::Invalid("no free digest id".into()))?;
    m.digests.insert(id, dg);
    Ok(())
}

/// `LUKS2_reencrypt_digest_verify`: the reencryption parameters are the ones the holder of
/// the volume keys wrote (a header edited by someone without the keys is refused, and so is
/// the version 1 metadata cryptsetup wants repaired first).
pub fn check(m: &Metadata, st: &ReencryptState, keys: &KeysByDigest<'_>) -> Result<(), LuksError> {
    let invalid = || LuksError::Invalid("Reencryption metadata is invalid.".into());
    if st.version < 2 {
        return Err(invalid());
    }
    let (_, d) = m.keyslot_digest(st.keyslot.id).ok_or_else(invalid)?;
    let bytes = verification_data(m, st, keys)?;
    if digest::verify(d, &bytes)? {
        Ok(())
    } else {
        Err(invalid())
    }
}
