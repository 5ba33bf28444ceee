//! LUKS2 keyslots: unlock the volume key with a passphrase (KDF -> decrypt the area -> AF
//! merge -> digest check), store it under a new passphrase, and destroy a keyslot.

use super::digest;
use super::header::Luks2Header;
use super::json::{Af, Area, Keyslot};
use crate::block::BlockDevice;
use crate::crypt::luks::af;
use crate::crypt::luks::area;
use crate::crypt::luks::kdf::{benchmark_argon2, benchmark_pbkdf2, Argon2Variant, Kdf};
use crate::crypt::luks::{LuksError, VolumeKey, MAX_KEYSLOTS, SALT_SIZE, STRIPES};
use crate::crypt::secret::SecretBytes;

/// Which KDF a new keyslot gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PbkdfKind {
    /// PBKDF2 (LUKS1's only KDF).
    Pbkdf2,
    /// Argon2i.
    Argon2i,
    /// Argon2id (cryptsetup's LUKS2 default).
    Argon2id,
}

/// How to choose the KDF parameters of a new keyslot (cryptsetup's `--pbkdf*` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PbkdfParams {
    /// The KDF.
    pub kind: PbkdfKind,
    /// Hash for PBKDF2, the AF splitter and the digest.
    pub hash: String,
    /// Target unlock time in milliseconds (`--iter-time`), used when not forced.
    pub iter_time_ms: u32,
    /// Exact iterations (PBKDF2) or passes (Argon2), skipping the benchmark.
    pub force_iterations: Option<u32>,
    /// Argon2 memory in KiB (`--pbkdf-memory`).
    pub memory_kib: u32,
    /// Argon2 lanes (`--pbkdf-parallel`).
    pub parallel: u32,
}

impl PbkdfParams {
    /// The defaults of a new keyslot for `--pbkdf KDF` (`None`: argon2id, or pbkdf2 on LUKS1,
    /// whose only KDF it is) and `--hash HASH`, as cryptsetup chooses them; an unknown KDF or
    /// hash, or a KDF LUKS1 cannot store, is refused.
    pub fn choose(kdf: Option<&str>, hash: &str, luks1: bool) -> Result<PbkdfParams, LuksError> {
        let kind = match kdf {
            None if luks1 => PbkdfKind::Pbkdf2,
            None | Some("argon2id") => PbkdfKind::Argon2id,
            Some("argon2i") => PbkdfKind::Argon2i,
            Some("pbkdf2") => PbkdfKind::Pbkdf2,
            Some(o) => {
                return Err(LuksError::Invalid(format!(
                    "--pbkdf: unknown KDF {o:?} (argon2id, argon2i, pbkdf2)"
                )))
            }
        };
        if luks1 && kind != PbkdfKind::Pbkdf2 {
            return Err(LuksError::Invalid(
                "LUKS1 supports only --pbkdf pbkdf2".into(),
            ));
        }
        crate::crypt::luks::af::message_digest(hash)
            .map_err(|_| LuksError::Invalid(format!("--hash: unknown hash {hash:?}")))?;
        Ok(PbkdfParams {
            kind,
            hash: hash.to_string(),
            ..PbkdfParams::default()
        })
    }
}

impl Default for PbkdfParams {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        PbkdfParams {
            kind: PbkdfKind::Argon2id,
            hash: "sha256".into(),
            iter_time_ms: 2000,
            force_iterations: None,
            memory_kib: default_memory_kib(),
            parallel: cpus.min(4),
        }
    }
}

/// cryptsetup's default Argon2 memory: 1 GiB, but at most half of the physical memory.
fn default_memory_kib() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let half = if pages > 0 && page > 0 {
        (pages as u64 * page as u64 / 2048) as u32
    } else {
        u32::MAX
    };
    half.clamp(32 * 1024, 1024 * 1024)
}

impl PbkdfParams {
    /// KDF parameters for a key of `key_len` bytes: forced, or benchmarked for the target time.
    pub fn make_kdf(&self, key_len: usize) -> Result<Kdf, LuksError> {
        let mut salt = vec![0u8; SALT_SIZE];
        getrandom::getrandom(&mut salt)
            .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
        let variant = match self.kind {
            PbkdfKind::Pbkdf2 => {
                let iterations = match self.force_iterations {
                    Some(n) => n.max(1),
                    None => benchmark_pbkdf2(&self.hash, key_len, self.iter_time_ms)?,
                };
                return Ok(Kdf::Pbkdf2 {
                    hash: self.hash.clone(),
                    iterations,
                    salt,
                });
            }
            PbkdfKind::Argon2i => Argon2Variant::I,
            PbkdfKind::Argon2id => Argon2Variant::Id,
        };
        let cpus = self
            .parallel
            .clamp(1, crate::crypt::luks::kdf::MAX_ARGON2_CPUS);
        let memory = self
            .memory_kib
            .clamp(8 * cpus, crate::crypt::luks::kdf::MAX_ARGON2_MEMORY_KIB);
        let (time, memory) = match self.force_iterations {
            Some(t) => (t.max(1), memory),
            None => benchmark_argon2(variant, memory, cpus, key_len, self.iter_time_ms)?,
        };
        Ok(Kdf::Argon2 {
            variant,
            time,
            memory,
            cpus,
            salt,
        })
    }
}

/// Most key material one keyslot may hold (a 512-byte key split 65536 ways is 32 MiB).
const MAX_MATERIAL: u64 = 256 << 20;

/// Bytes the split volume key takes, rounded up to whole sectors.
fn material_len(key_size: u32, stripes: u32) -> u64 {
    af::split_sectors_bytes(key_size as u64, stripes)
}

/// Try `passphrase` on keyslot `id`: `Ok(None)` when it is the wrong passphrase.
fn try_slot(
    dev: &dyn BlockDevice,
    h: &Luks2Header,
    id: u32,
    k: &Keyslot,
    passphrase: &[u8],
) -> Result<Option<VolumeKey>, LuksError> {
    let corrupt = |what: String| LuksError::Corrupt {
        device: dev.name().to_string(),
        what,
    };
    if let Some(p) = &k.problem {
        // cryptsetup stops at a keyslot it cannot use instead of trying the next one.
        return Err(LuksError::Unsupported(format!("keyslot {id}: {p}")));
    }
    let (Some(af_p), Some(kdf)) = (&k.af, &k.kdf) else {
        return Ok(None);
    };
    let Some((_, d)) = h.metadata.keyslot_digest(id) else {
        return Ok(None);
    };
    let len = material_len(k.key_size, af_p.stripes);
    // cryptsetup reads the key material from the area's offset whatever the area's stated
    // size; it must lie on the device, and dmkit bounds what one keyslot may make it read.
    if k.area.offset.saturating_add(len) > dev.size() || len > MAX_MATERIAL {
        return Err(corrupt(format!(
            "keyslot {id}: {len} bytes of key material at {} do not fit in the device ({} bytes) or in {MAX_MATERIAL} bytes",
            k.area.offset,
            dev.size()
        )));
    }
    let in_slot = |e: LuksError| e.in_keyslot(dev.name(), id);
    let key = kdf
        .derive(passphrase, k.area.key_size as usize)
        .map_err(in_slot)?;
    let mut material = SecretBytes::zeroed(len as usize);
    dev.read_at(&mut material, k.area.offset)?;
    area::crypt(&k.area.encryption, &key, &mut material, false).map_err(in_slot)?;
    let vk =
        af::merge(&material, k.key_size as usize, af_p.stripes, &af_p.hash).map_err(in_slot)?;
    Ok(digest::verify(d, &vk)?.then_some(vk))
}

/// Which keys [`unlock`] may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Only a key that opens the default segment (activation, `--dump-volume-key`).
    Default,
    /// Any key a keyslot holds, bound or not (`test-passphrase -S N`, like cryptsetup's
    /// `CRYPT_ACTIVATE_ALLOW_UNBOUND_KEY`).
    Any,
}

/// Why one keyslot did not open (cryptsetup's -EPERM and -ENOENT).
enum Miss {
    /// Wrong passphrase.
    Wrong,
    /// The keyslot cannot give the wanted key (unbound, or not a passphrase keyslot).
    Unusable,
}

/// Try keyslot `id` for `segment`.
fn open_one(
    dev: &dyn BlockDevice,
    h: &Luks2Header,
    id: u32,
    k: &Keyslot,
    passphrase: &[u8],
    segment: Segment,
) -> Result<Result<VolumeKey, Miss>, LuksError> {
    let m = &h.metadata;
    if k.kind != "luks2" {
        return Ok(Err(Miss::Unusable));
    }
    let Some((kd, _)) = m.keyslot_digest(id) else {
        return Ok(Err(Miss::Unusable));
    };
    if segment == Segment::Default && m.segment_digest(0).map(|(i, _)| i) != Some(kd) {
        return Ok(Err(Miss::Unusable));
    }
    Ok(try_slot(dev, h, id, k, passphrase)?.ok_or(Miss::Wrong))
}

/// Keyslot ids in the order cryptsetup tries them (the order of the JSON object as read, ids
/// as `atoi` reads them) with their priority as json-c reads it (absent: normal).
fn try_order(h: &Luks2Header) -> Vec<(u32, i32)> {
    let from_disk = h
        .raw
        .as_ref()
        .and_then(|r| r.json.get("keyslots")?.as_object().cloned());
    match from_disk {
        Some(o) => o
            .iter()
            .map(|(k, v)| {
                let p = v.get("priority").map_or(1, super::jsonc::Value::get_int);
                (super::validate::atoi(k) as u32, p)
            })
            .collect(),
        None => h
            .metadata
            .keyslots
            .iter()
            .map(|(&id, k)| (id, k.priority.map_or(1, |p| p as i32)))
            .collect(),
    }
}

/// Unlock a volume key with `passphrase`, trying keyslot `slot` only, or every keyslot the
/// way cryptsetup does: the preferred ones first, then the normal ones, ignored ones never.
/// Returns the keyslot that opened. When none does, the last keyslot tried decides the
/// error: a wrong passphrase ([`LuksError::WrongPassphrase`]) or no usable keyslot.
pub fn unlock(
    dev: &dyn BlockDevice,
    h: &Luks2Header,
    passphrase: &[u8],
    slot: Option<u32>,
    segment: Segment,
) -> Result<(u32, VolumeKey), LuksError> {
    let r = unlock_slots(dev, h, passphrase, slot, segment);
    // The KDF and the AF merge ran in frames below this one.
    crate::crypt::secret::burn_stack();
    r
}

fn unlock_slots(
    dev: &dyn BlockDevice,
    h: &Luks2Header,
    passphrase: &[u8],
    slot: Option<u32>,
    segment: Segment,
) -> Result<(u32, VolumeKey), LuksError> {
    let m = &h.metadata;
    let miss = |r: Miss| match r {
        Miss::Wrong => LuksError::WrongPassphrase,
        Miss::Unusable => LuksError::NoUsableKeyslot,
    };
    if let Some(s) = slot {
        let k = m
            .keyslots
            .get(&s)
            .ok_or_else(|| LuksError::Invalid(format!("keyslot {s} is not active")))?;
        return open_one(dev, h, s, k, passphrase, segment)?
            .map(|vk| (s, vk))
            .map_err(miss);
    }
    let order = try_order(h);
    let mut prefer_wrong = false;
    for priority in [2, 1] {
        let mut last = Miss::Unusable;
        for &(id, p) in &order {
            if p != priority {
                continue;
            }
            let Some(k) = m.keyslots.get(&id) else {
                last = Miss::Unusable;
                continue;
            };
            match open_one(dev, h, id, k, passphrase, segment)? {
                Ok(vk) => return Ok((id, vk)),
                Err(r) => last = r,
            }
        }
        if priority == 2 {
            prefer_wrong = matches!(last, Miss::Wrong);
        } else if prefer_wrong && matches!(last, Miss::Unusable) {
            // cryptsetup prefers "wrong passphrase" from a preferred keyslot to "no entry".
            last = Miss::Wrong;
        }
        if priority == 1 {
            return Err(miss(last));
        }
    }
    unreachable!("the loop returns on its last pass")
}

/// Whether `vk` is the volume key of segment 0.
pub fn check_volume_key(h: &Luks2Header, vk: &[u8]) -> Result<bool, LuksError> {
    match h.metadata.segment_digest(0) {
        Some((_, d)) => digest::verify(d, vk),
        None => Ok(false),
    }
}

/// The first 4096-aligned free range of `size` bytes in the keyslots area.
fn free_area(h: &Luks2Header, size: u64) -> Option<u64> {
    let mut used: Vec<(u64, u64)> = h
        .metadata
        .keyslots
        .values()
        .map(|k| (k.area.offset, k.area.offset + k.area.size))
        .collect();
    used.sort();
    let end = h.metadata_end();
    let mut at = 2 * h.hdr_size;
    for (s, e) in used {
        if at + size <= s {
            return Some(at);
        }
        at = at.max(e.div_ceil(4096) * 4096);
    }
    (at + size <= end).then_some(at)
}

/// Store `vk` in a new keyslot (`slot`, or the lowest free one) under `passphrase`: writes the
/// keyslot area, then the header. Returns the keyslot id. The keyslot is bound to digest
/// `digest` (which must check `vk`), or to the data segment's when `None`: a given digest is a
/// key no segment uses (yet), as cryptsetup's `CRYPT_VOLUME_KEY_NO_SEGMENT` keyslots during a
/// reencryption.
pub fn add(
    dev: &dyn BlockDevice,
    h: &mut Luks2Header,
    vk: &[u8],
    passphrase: &[u8],
    params: &PbkdfParams,
    slot: Option<u32>,
    digest: Option<u32>,
) -> Result<u32, LuksError> {
    let m = &h.metadata;
    let id = match slot {
        Some(s) if s >= MAX_KEYSLOTS => {
            return Err(LuksError::Invalid(format!(
                "keyslot {s} is out of range 0..{}",
                MAX_KEYSLOTS - 1
            )))
        }
        Some(s) if m.keyslots.contains_key(&s) => {
            return Err(LuksError::Invalid(format!("keyslot {s} is already in use")))
        }
        Some(s) => s,
        None => (0..MAX_KEYSLOTS)
            .find(|i| !m.keyslots.contains_key(i))
            .ok_or_else(|| LuksError::Invalid("all 32 keyslots are in use".into()))?,
    };
    // Keyslots use the data cipher when it suits a keyslot area, as cryptsetup does; never
    // an authenticated one (`LUKS2_keyslot_cipher_incompatible`: the area has no tags).
    let (encryption, area_key) = match m.segments.get(&0) {
        Some(s) if s.integrity_type().is_none() && area::check(&s.encryption, vk.len()).is_ok() => {
            (s.encryption.clone(), vk.len() as u32)
        }
        _ => ("aes-xts-plain64".to_string(), 64),
    };
    let key_size = vk.len() as u32;
    let size = material_len(key_size, STRIPES).div_ceil(4096) * 4096;
    let offset = free_area(h, size).ok_or_else(|| {
        LuksError::Invalid(format!("no room for a {size}-byte keyslot area in the keyslots area (use a larger --luks2-keyslots-size)"))
    })?;
    if offset + size > dev.size() {
        return Err(LuksError::Invalid(format!(
            "the keyslot area at {offset} lies beyond the end of {}",
            dev.name()
        )));
    }
    let kdf = params.make_kdf(area_key as usize)?;
    let key = kdf.derive(passphrase, area_key as usize)?;
    let split = af::split(vk, STRIPES, &params.hash)?;
    let mut material = SecretBytes::zeroed(size as usize);
    material[..split.len()].copy_from_slice(&split);
    area::crypt(&encryption, &key, &mut material, true)?;
    dev.write_at(&material, offset)?;
    dev.flush()?;
    let ks = Keyslot {
        kind: "luks2".into(),
        key_size,
        priority: None,
        area: Area {
            kind: "raw".into(),
            offset,
            size,
            encryption,
            key_size: area_key,
        },
        af: Some(Af {
            stripes: STRIPES,
            hash: params.hash.clone(),
        }),
        kdf: Some(kdf),
        raw: Default::default(),
        problem: None,
    };
    let m = &mut h.metadata;
    m.keyslots.insert(id, ks);
    let digest_id = match digest.or_else(|| m.segment_digest(0).map(|(i, _)| i)) {
        Some(i) => i,
        None => return Err(LuksError::Invalid("no digest for segment 0".into())),
    };
    let d = m
        .digests
        .get_mut(&digest_id)
        .ok_or_else(|| LuksError::Invalid(format!("no digest {digest_id}")))?;
    d.keyslots.push(id);
    d.keyslots.sort_unstable();
    h.write(dev)?;
    Ok(id)
}

/// Destroy keyslot `id`: overwrite its area, then drop it (and references to it) from the
/// metadata.
pub fn kill(dev: &dyn BlockDevice, h: &mut Luks2Header, id: u32) -> Result<(), LuksError> {
    let k = h
        .metadata
        .keyslots
        .get(&id)
        .ok_or_else(|| LuksError::Invalid(format!("keyslot {id} is not active")))?;
    let (offset, size) = (k.area.offset, k.area.size);
    if offset.saturating_add(size) <= dev.size() {
        wipe(dev, offset, size)?;
    }
    forget(h, id);
    h.write(dev)
}

/// Drop keyslot `id` and every reference to it (digests, tokens) from the metadata, in memory.
pub fn forget(h: &mut Luks2Header, id: u32) {
    let m = &mut h.metadata;
    m.keyslots.remove(&id);
    for d in m.digests.values_mut() {
        d.keyslots.retain(|&s| s != id);
    }
    let name = id.to_string();
    for t in m.tokens.values_mut() {
        if let Some(list) = t.get_mut("keyslots").and_then(|v| v.as_array_mut()) {
            list.retain(|v| v.as_str() != Some(name.as_str()));
        }
    }
}

/// Overwrite `[offset, offset + size)` with zeros, in pieces.
pub fn wipe(dev: &dyn BlockDevice, offset: u64, size: u64) -> Result<(), LuksError> {
    let zeros = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < size {
        let n = (size - done).min(zeros.len() as u64) as usize;
        dev.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    dev.flush()?;
    Ok(())
}
