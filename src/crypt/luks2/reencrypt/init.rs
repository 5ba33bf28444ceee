//! Putting a LUKS2 device into reencryption (`reencrypt_init` and the keyslot part of
//! cryptsetup's `reencrypt_luks2_init`): a new volume key in new keyslots bound to no segment
//! (one per old keyslot whose passphrase is given), then, in one header write, the backup
//! segments, the reencrypt keyslot, its digest and the requirement flag. Until that write
//! the device is an ordinary LUKS2 device with extra keyslots; after it, it is in
//! reencryption with nothing of its data changed yet.

use super::area;
use super::engine::commit;
use super::layout::{crypt, flagged, linear};
use super::state::{Direction, Mode, ReencryptState, Resilience};
use super::verify;
use crate::block::BlockDevice;
use crate::crypt::cipher::{random_key, CipherSpec};
use crate::crypt::luks::kdf::Kdf;
use crate::crypt::luks::{LuksError, MAX_KEYSLOTS};
use crate::crypt::luks2::header::Luks2Header;
use crate::crypt::luks2::keyslot::{self, PbkdfKind, PbkdfParams};
use crate::crypt::luks2::{activate, digest};

/// What the reencryption changes to, and how it is protected.
#[derive(Debug, Clone)]
pub struct InitParams {
    /// The new data cipher ("aes-xts-plain64").
    pub cipher: String,
    /// The new volume key's size, bytes.
    pub key_size: usize,
    /// The new encryption sector size.
    pub sector_size: u32,
    /// Resilience: a checksum's block size is chosen here (the alignment), whatever is given.
    pub resilience: Resilience,
    /// KDF of the new keyslots; `None` copies each old keyslot's (cryptsetup's default).
    pub pbkdf: Option<PbkdfParams>,
    /// The data device's I/O block, bytes (cryptsetup aligns hotzones to it).
    pub io_block: u64,
    /// Hash of the digests (cryptsetup's `--hash`, "sha256").
    pub hash: String,
    /// Benchmark the digests' PBKDF2 iterations (false when KDF iterations are forced, as
    /// cryptsetup does).
    pub benchmark_digest: bool,
    /// Where a re-key's new volume key comes from (encryption and decryption ignore it).
    pub new_key: NewKey,
    /// Reencrypt only this many bytes of data (`--device-size`); `None`: all of it.
    pub device_size: Option<u64>,
}

/// Where the new volume key of a re-key comes from.
#[derive(Debug, Clone, Default)]
pub enum NewKey {
    /// A random key (cryptsetup's default).
    #[default]
    Random,
    /// This key (`--volume-key-file`); when it is the current volume key, as [`NewKey::Keep`].
    Given(crate::crypt::luks::VolumeKey),
    /// The volume key stays (`--keep-key`): only the cipher or the sector size changes, and
    /// no keyslot is added.
    Keep,
}

/// An old keyslot whose passphrase also protects the new key.
pub struct NewKeyslot<'a> {
    /// The old keyslot.
    pub old: u32,
    /// Its passphrase.
    pub passphrase: &'a [u8],
}

/// The KDF of a new keyslot that copies `kdf` without a benchmark.
fn copy_kdf(kdf: &Kdf, hash: &str) -> PbkdfParams {
    match kdf {
        Kdf::Pbkdf2 {
            hash: h,
            iterations,
            ..
        } => PbkdfParams {
            kind: PbkdfKind::Pbkdf2,
            hash: h.clone(),
            force_iterations: Some(*iterations),
            ..PbkdfParams::default()
        },
        Kdf::Argon2 {
            variant,
            time,
            memory,
            cpus,
            ..
        } => PbkdfParams {
            kind: match variant {
                crate::crypt::luks::kdf::Argon2Variant::I => PbkdfKind::Argon2i,
                crate::crypt::luks::kdf::Argon2Variant::Id => PbkdfKind::Argon2id,
            },
            hash: hash.to_string(),
            force_iterations: Some(*time),
            memory_kib: *memory,
            parallel: *cpus,
            ..PbkdfParams::default()
        },
    }
}

/// Start reencrypting the device whose header `h` is on `dev` and whose data lives on a
/// device of `data_size` bytes: add the new keyslots for `slots`, then write the reencryption
/// metadata. Returns the reencrypt keyslot. Nothing is written when a check fails; keyslots
/// added before a later failure are removed again.
pub fn init(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    data_size: u64,
    slots: &[NewKeyslot<'_>],
    p: &InitParams,
) -> Result<u32, LuksError> {
    let invalid = |s: String| LuksError::Invalid(s);
    let seg0 = only_segment(dev, h)?;
    let spec = CipherSpec::parse(&p.cipher).map_err(|e| {
        invalid(format!(
            "Unable to use cipher specification {}: {e}",
            p.cipher
        ))
    })?;
    spec.check_key_size(p.key_size)
        .map_err(|e| invalid(format!("--key-size: {e}")))?;
    if !(512..=4096).contains(&p.sector_size) || !p.sector_size.is_power_of_two() {
        return Err(invalid("Unsupported encryption sector size.".into()));
    }
    let data = data_bytes(data_size, seg0.offset, p.device_size)?;
    check_aligned(data, 0, p.sector_size.max(seg0.sector_size))?;
    if slots.is_empty() {
        return Err(invalid("no keyslot to reencrypt".into()));
    }
    let keep = keeps_key(h, &p.new_key)?;
    if keep && p.cipher == seg0.encryption && p.sector_size == seg0.sector_size {
        return Err(invalid(
            "No data segment parameters changed. Reencryption aborted.".into(),
        ));
    }
    // With the key kept only the reencrypt keyslot is added, and one passphrase unlocks.
    let slots = if keep { &slots[..1] } else { slots };
    let free = (0..MAX_KEYSLOTS)
        .filter(|i| !h.metadata.keyslots.contains_key(i))
        .count();
    let added = if keep { 0 } else { slots.len() };
    if free < added + 1 {
        return Err(invalid("Not enough free keyslots for reencryption.".into()));
    }
    // Every given passphrase must open its keyslot, and all to the data segment's key.
    let mut old_key = None;
    for s in slots {
        let (_, k) = keyslot::unlock(dev, h, s.passphrase, Some(s.old), keyslot::Segment::Default)?;
        old_key.get_or_insert(k);
    }
    let old_key = old_key.expect("slots is not empty");
    let digest_old = h
        .metadata
        .segment_digest(0)
        .map(|(i, _)| i)
        .ok_or_else(|| invalid("no digest for segment 0".into()))?;
    if keep {
        if old_key.len() != p.key_size {
            return Err(invalid(format!(
                "Unable to use cipher specification {} with the kept {}-bit volume key.",
                p.cipher,
                old_key.len() * 8
            )));
        }
        // Both ends under the one key: the backups bound to its digest, no new keyslot.
        let keys = (&old_key[..], &old_key[..]);
        return write_metadata(dev, h, &seg0, (digest_old, digest_old), keys, p);
    }
    let new_key = match &p.new_key {
        NewKey::Given(k) => k.clone(),
        _ => random_key(p.key_size).map_err(|e| LuksError::Crypto(e.to_string()))?,
    };
    if new_key.len() != p.key_size {
        return Err(invalid(format!(
            "the given volume key has {} bytes, the new cipher takes {}",
            new_key.len(),
            p.key_size
        )));
    }
    let mut nd = digest::create(&new_key, &p.hash, p.benchmark_digest)?;
    nd.segments.clear();
    let digest_new = (0..MAX_KEYSLOTS)
        .find(|i| !h.metadata.digests.contains_key(i))
        .ok_or_else(|| invalid("no free digest id".into()))?;
    h.metadata.digests.insert(digest_new, nd);
    let mut added = Vec::new();
    let result = (|| {
        for s in slots {
            let params = match &p.pbkdf {
                Some(x) => x.clone(),
                None => match h.metadata.keyslots.get(&s.old).and_then(|k| k.kdf.as_ref()) {
                    Some(kdf) => copy_kdf(kdf, &p.hash),
                    None => PbkdfParams::default(),
                },
            };
            let id = keyslot::add(
                dev,
                h,
                &new_key,
                s.passphrase,
                &params,
                None,
                Some(digest_new),
            )?;
            added.push(id);
        }
        let keys = (&old_key[..], &new_key[..]);
        write_metadata(dev, h, &seg0, (digest_old, digest_new), keys, p)
    })();
    if result.is_err() {
        // Back to an ordinary device: the keyslots of a key no segment will use go.
        for id in added {
            let _ = keyslot::kill(dev, h, id);
        }
    }
    result
}

/// Whether a re-key keeps the volume key: `--keep-key`, or a given key that is the current
/// one (cryptsetup's `crypt_volume_key_verify` on `--volume-key-file`).
pub fn keeps_key(h: &Luks2Header, new_key: &NewKey) -> Result<bool, LuksError> {
    match new_key {
        NewKey::Keep => Ok(true),
        NewKey::Given(k) => keyslot::check_volume_key(h, k),
        NewKey::Random => Ok(false),
    }
}

/// The backup segments of a re-key (`reencrypt_make_backup_segments`), the reencrypt keyslot
/// and its digest over `keys` (old, new), the keys' digests `digests` (old, new; the same
/// one when the key is kept), in the one header write.
fn write_metadata(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    seg0: &crate::crypt::luks2::json::Segment,
    (digest_old, digest_new): (u32, u32),
    (old_key, new_key): (&[u8], &[u8]),
    p: &InitParams,
) -> Result<u32, LuksError> {
    let mut next = h.clone();
    let m = &mut next.metadata;
    let first = m.segments.len() as u32;
    m.segments.insert(first, flagged(seg0, "backup-previous"));
    m.segments.insert(
        first + 1,
        crypt(
            seg0.offset,
            None,
            0,
            &p.cipher,
            p.sector_size,
            &["backup-final"],
        ),
    );
    for (id, d) in [(digest_old, first), (digest_new, first + 1)] {
        if let Some(x) = m.digests.get_mut(&id) {
            x.segments.push(d);
        }
    }
    let mut keys = verify::KeysByDigest::from([(digest_old, old_key)]);
    keys.entry(digest_new).or_insert(new_key);
    let sectors = (seg0.sector_size, p.sector_size);
    seal(
        dev,
        h,
        next,
        Mode::Reencrypt,
        Direction::Forward,
        &keys,
        sectors,
        0,
        p,
    )
}

/// The rest of the one header write that puts a device into reencryption: `next` has its
/// segments (data and backups) bound to their digests; the reencrypt keyslot (in the largest
/// free gap, the checksum block the hotzone alignment of both `sectors` sizes; a data shift
/// of `shift` bytes needs no area and takes the first free 4096 bytes, as
/// `reenc_keyslot_alloc` does), the requirement and the digest over `keys` are added, and the
/// header is committed.
#[allow(clippy::too_many_arguments)]
pub(super) fn seal(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    mut next: Luks2Header,
    mode: Mode,
    direction: Direction,
    keys: &verify::KeysByDigest<'_>,
    sectors: (u32, u32),
    shift: u64,
    p: &InitParams,
) -> Result<u32, LuksError> {
    let alignment = p
        .io_block
        .max(u64::from(sectors.0))
        .max(u64::from(sectors.1))
        .max(512);
    let resilience = match &p.resilience {
        Resilience::Checksum { hash, .. } | Resilience::DatashiftChecksum { hash, .. } => {
            let size = crate::crypt::luks::af::message_digest(hash)
                .map_err(|_| {
                    LuksError::Invalid(format!("Hash algorithm {hash} is not available."))
                })?
                .size();
            if hash.is_empty() || hash.len() > 31 || size == 0 {
                return Err(LuksError::Invalid(format!(
                    "Hash algorithm {hash} is not available."
                )));
            }
            let (hash, sector_size) = (hash.clone(), alignment as u32);
            if let Resilience::Checksum { .. } = p.resilience {
                Resilience::Checksum { hash, sector_size }
            } else {
                Resilience::DatashiftChecksum { hash, sector_size }
            }
        }
        other => other.clone(),
    };
    let no_space = || LuksError::Invalid("Not enough space in header keyslot area.".into());
    let gap = if resilience == Resilience::Datashift {
        let at = crate::crypt::luks2::keyslot::free_area(&next, 4096).ok_or_else(no_space)?;
        (at, 4096)
    } else {
        area::max_gap(&next).ok_or_else(no_space)?
    };
    let ks = (0..MAX_KEYSLOTS)
        .find(|i| !next.metadata.keyslots.contains_key(i))
        .ok_or_else(|| LuksError::Invalid("All key slots full.".into()))?;
    let m = &mut next.metadata;
    m.keyslots
        .insert(ks, area::keyslot(mode, direction, &resilience, gap, shift));
    // cryptsetup marks a decryption that moves the data with its own version.
    let moved = m
        .segments
        .values()
        .any(|s| s.flags.iter().any(|f| f == "backup-moved-segment"));
    let version = if mode == Mode::Decrypt && moved {
        super::DECRYPT_SHIFT_REQ_VERSION
    } else {
        super::REQ_VERSION
    };
    m.config.requirements = vec![format!("online-reencrypt-v{version}")];
    let st = ReencryptState::read(m)?
        .ok_or_else(|| LuksError::Invalid("reencryption state lost".into()))?;
    verify::create(m, &st, keys, &p.hash, p.benchmark_digest)?;
    // The only header write of the initialization: the device is in reencryption from here.
    commit(dev, &mut next)?;
    *h = next;
    Ok(ks)
}

/// The one data segment of a header `h` about to be put into reencryption: it must have no
/// reencryption yet, no unmet requirement, and exactly one crypt segment without integrity.
pub(super) fn only_segment(
    dev: &dyn BlockDevice,
    h: &Luks2Header,
) -> Result<crate::crypt::luks2::json::Segment, LuksError> {
    if ReencryptState::read(&h.metadata)?.is_some() {
        return Err(LuksError::Invalid(
            "LUKS2 reencryption already initialized in metadata.".into(),
        ));
    }
    activate::check_requirements(h, dev.name())?;
    let seg0 = match (h.metadata.segments.len(), h.metadata.segments.get(&0)) {
        (1, Some(s)) if s.kind == "crypt" => s.clone(),
        _ => {
            return Err(LuksError::Unsupported(
                "reencryption of a device whose data is not one crypt segment".into(),
            ))
        }
    };
    if seg0.integrity_type().is_some() {
        return Err(LuksError::Invalid(
            "Reencryption of device with integrity profile is not supported.".into(),
        ));
    }
    Ok(seg0)
}

/// The bytes of data a reencryption covers on a device of `data_size` bytes whose data
/// starts at `offset`: all of them, or `device_size` (`--device-size`) when it fits.
pub(super) fn data_bytes(
    data_size: u64,
    offset: u64,
    device_size: Option<u64>,
) -> Result<u64, LuksError> {
    let data = data_size.saturating_sub(offset);
    match device_size {
        Some(d) if d > data => Err(LuksError::Invalid(
            "Reduced data size is larger than real device size.".into(),
        )),
        Some(d) => Ok(d),
        None => Ok(data),
    }
}

/// `data_size` bytes of a device whose data starts at `offset`: some, and whole sectors of
/// `sector` bytes.
pub(super) fn check_aligned(data_size: u64, offset: u64, sector: u32) -> Result<(), LuksError> {
    let data = data_size.saturating_sub(offset);
    if data == 0 || !data.is_multiple_of(u64::from(sector)) {
        return Err(LuksError::Invalid(format!(
            "Data device is not aligned to encryption sector size ({sector} bytes)."
        )));
    }
    Ok(())
}

/// Put a plaintext device into encryption (`reencrypt --encrypt` with a detached header):
/// `h` is the header just formatted for it on `dev` (its segment 0 the crypt segment the data
/// will have, keyslot(s) bound to the key `key`). In one header write, its data becomes one
/// linear segment (the plaintext as it is), backed by a linear `backup-previous` and the
/// crypt `backup-final`, with the reencrypt keyslot (mode `encrypt`, forward) and its digest
/// over the new key only. Returns the reencrypt keyslot.
pub fn init_encrypt(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    data_size: u64,
    key: &[u8],
    p: &InitParams,
) -> Result<u32, LuksError> {
    let seg0 = only_segment(dev, h)?;
    let data = data_bytes(data_size, seg0.offset, p.device_size)?;
    check_aligned(data, 0, seg0.sector_size)?;
    let digest_new = h
        .metadata
        .segment_digest(0)
        .map(|(i, _)| i)
        .ok_or_else(|| LuksError::Invalid("no digest for segment 0".into()))?;
    let mut next = h.clone();
    let m = &mut next.metadata;
    m.segments.clear();
    m.segments.insert(0, linear(seg0.offset, None, &[]));
    m.segments
        .insert(1, linear(seg0.offset, None, &["backup-previous"]));
    m.segments.insert(2, flagged(&seg0, "backup-final"));
    for d in m.digests.values_mut() {
        d.segments.clear();
    }
    if let Some(d) = m.digests.get_mut(&digest_new) {
        d.segments.push(2);
    }
    let keys = verify::KeysByDigest::from([(digest_new, key)]);
    let sectors = (512, seg0.sector_size);
    seal(
        dev,
        h,
        next,
        Mode::Encrypt,
        Direction::Forward,
        &keys,
        sectors,
        0,
        p,
    )
}

/// Put a LUKS2 device whose header is detached (data at offset 0) into decryption
/// (`reencrypt --decrypt`): the key `pass` unlocks (keyslot `slot` when given) stays the only
/// one; in one header write a crypt `backup-previous` (the segment as it is) and a linear
/// `backup-final` are added with the reencrypt keyslot (mode `decrypt`, backward, as
/// cryptsetup walks a decryption without data shift) and its digest over the old key.
/// Returns the reencrypt keyslot.
pub fn init_decrypt(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    data_size: u64,
    pass: &[u8],
    slot: Option<u32>,
    p: &InitParams,
) -> Result<u32, LuksError> {
    let seg0 = only_segment(dev, h)?;
    let data = data_bytes(data_size, seg0.offset, p.device_size)?;
    check_aligned(data, 0, seg0.sector_size)?;
    let (_, key) = keyslot::unlock(dev, h, pass, slot, keyslot::Segment::Default)?;
    let digest_old = h
        .metadata
        .segment_digest(0)
        .map(|(i, _)| i)
        .ok_or_else(|| LuksError::Invalid("no digest for segment 0".into()))?;
    if MAX_KEYSLOTS as usize <= h.metadata.keyslots.len() {
        return Err(LuksError::Invalid("All key slots full.".into()));
    }
    let mut next = h.clone();
    let m = &mut next.metadata;
    let first = m.segments.len() as u32;
    m.segments.insert(first, flagged(&seg0, "backup-previous"));
    m.segments
        .insert(first + 1, linear(seg0.offset, None, &["backup-final"]));
    if let Some(d) = m.digests.get_mut(&digest_old) {
        d.segments.push(first);
    }
    let keys = verify::KeysByDigest::from([(digest_old, &key[..])]);
    let sectors = (seg0.sector_size, 512);
    seal(
        dev,
        h,
        next,
        Mode::Decrypt,
        Direction::Backward,
        &keys,
        sectors,
        0,
        p,
    )
}
