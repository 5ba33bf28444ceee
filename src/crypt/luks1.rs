//! LUKS1, on-disk compatible with cryptsetup and QEMU: the 592-byte big-endian header, eight
//! PBKDF2 keyslots with AF-split key material, and the PBKDF2 master key digest.
//!
//! The AF splitter, PBKDF2 and keyslot area encryption are shared with [`super::luks2`].

use super::luks2::dump::hex_lines;
use super::luks2::keyslot::wipe;
use crate::block::BlockDevice;
use crate::codec::{self, Reader, SliceWriter};
use crate::crypt::luks::kdf::{benchmark_pbkdf2, pbkdf2, MIN_PBKDF2_ITERATIONS};
use crate::crypt::luks::{af, area, LuksError, VolumeKey, SALT_SIZE, STRIPES};
use crate::crypt::secret::SecretBytes;
use std::fmt::Write;
use subtle::ConstantTimeEq;

/// Size of the header on disk.
pub const HEADER_SIZE: usize = 592;
/// Number of keyslots.
pub const NUM_KEYSLOTS: usize = 8;
/// `active` value of a keyslot in use.
pub const KEY_ENABLED: u32 = 0x00AC_71F3;
/// `active` value of a free keyslot.
pub const KEY_DISABLED: u32 = 0x0000_DEAD;
const DIGEST_SIZE: usize = 20;
const SECTOR: u64 = 512;

/// A LUKS1 keyslot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Luks1Keyslot {
    /// Whether it holds a key.
    pub active: bool,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: [u8; 32],
    /// Start of the key material, in 512-byte sectors.
    pub key_material_offset: u32,
    /// AF stripes.
    pub stripes: u32,
}

/// The LUKS1 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Luks1Header {
    /// "aes".
    pub cipher_name: String,
    /// "xts-plain64", "cbc-essiv:sha256".
    pub cipher_mode: String,
    /// PBKDF2 and AF hash.
    pub hash_spec: String,
    /// Start of the data, in 512-byte sectors.
    pub payload_offset: u32,
    /// Volume key bytes.
    pub key_bytes: u32,
    /// PBKDF2 of the volume key.
    pub mk_digest: [u8; 20],
    /// Its salt.
    pub mk_digest_salt: [u8; 32],
    /// Its iterations.
    pub mk_digest_iterations: u32,
    /// UUID text.
    pub uuid: String,
    /// The eight keyslots.
    pub keyslots: [Luks1Keyslot; NUM_KEYSLOTS],
    /// The 592 header bytes as read (empty for a header made here): the dump prints the text
    /// fields from them byte for byte, as cryptsetup does.
    pub raw: Vec<u8>,
}

/// A text field as cryptsetup reads it: its last byte forced to NUL, then up to the first NUL.
fn text(b: &[u8]) -> String {
    let b = &b[..b.len() - 1];
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Write `s` as a NUL-padded text field of `len` bytes (at least one NUL).
fn put(w: &mut SliceWriter<'_>, s: &str, len: usize, what: &'static str) -> Result<(), LuksError> {
    if s.len() >= len {
        return Err(LuksError::Invalid(format!("{what} {s:?} is too long")));
    }
    w.bytes(s.as_bytes(), what)
        .and_then(|w| w.zeros(len - s.len(), what))
        .map_err(no_room)?;
    Ok(())
}

/// A field that does not fit the header (the layout is fixed: a bug, reported, not a panic).
fn no_room(e: codec::Error) -> LuksError {
    LuksError::Invalid(format!("LUKS1 header: {e}"))
}

/// The fields of a 592-byte header in their on-disk order, unchecked, with its version.
fn decode(b: &[u8]) -> Result<(u16, Luks1Header), codec::Error> {
    let mut r = Reader::new(&b[..HEADER_SIZE.min(b.len())]);
    r.skip(6, "magic")?;
    let version = r.u16_be("version")?;
    let cipher_name = text(r.take(32, "cipher name")?);
    let cipher_mode = text(r.take(32, "cipher mode")?);
    let hash_spec = text(r.take(32, "hash")?);
    let payload_offset = r.u32_be("payload offset")?;
    let key_bytes = r.u32_be("key bytes")?;
    let mk_digest = r.array("mk digest")?;
    let mk_digest_salt = r.array("mk digest salt")?;
    let mk_digest_iterations = r.u32_be("mk digest iterations")?;
    let uuid = text(r.take(40, "uuid")?);
    let mut keyslot = || -> Result<Luks1Keyslot, codec::Error> {
        Ok(Luks1Keyslot {
            // Any other state is an invalid keyslot, which no passphrase opens.
            active: r.u32_be("keyslot state")? == KEY_ENABLED,
            iterations: r.u32_be("keyslot iterations")?,
            salt: r.array("keyslot salt")?,
            key_material_offset: r.u32_be("keyslot key material offset")?,
            stripes: r.u32_be("keyslot stripes")?,
        })
    };
    let keyslots = [
        keyslot()?,
        keyslot()?,
        keyslot()?,
        keyslot()?,
        keyslot()?,
        keyslot()?,
        keyslot()?,
        keyslot()?,
    ];
    let h = Luks1Header {
        cipher_name,
        cipher_mode,
        hash_spec,
        payload_offset,
        key_bytes,
        mk_digest,
        mk_digest_salt,
        mk_digest_iterations,
        uuid,
        keyslots,
        raw: b[..HEADER_SIZE].to_vec(),
    };
    Ok((version, h))
}

impl Luks1Header {
    /// Parse the first 592 bytes of a device with cryptsetup's rules
    /// (`_check_and_convert_hdr`): version 1, a hash usable for PBKDF2, and every keyslot
    /// (in use or not) within the header area and apart from the others.
    pub fn parse(b: &[u8]) -> Result<Luks1Header, String> {
        if b.len() < HEADER_SIZE || &b[..6] != super::luks2::header::MAGIC_PRIMARY {
            return Err("no LUKS header magic".into());
        }
        let (version, h) = decode(b).map_err(|e| e.to_string())?;
        if version != 1 {
            return Err(format!("LUKS version {version}, not 1"));
        }
        let hash_spec = &h.hash_spec;
        let usable = af::message_digest(hash_spec).is_ok_and(|md| md.size() >= DIGEST_SIZE);
        if !usable {
            return Err(format!("hash {hash_spec:?} is not supported"));
        }
        h.check_keyslots()?;
        Ok(h)
    }

    /// Sectors of one keyslot's key material (cryptsetup's `AF_split_sectors`).
    fn slot_sectors(&self) -> u64 {
        (self.key_bytes as u64 * STRIPES as u64).div_ceil(SECTOR)
    }

    /// Keyslot ids by key material offset.
    fn by_offset(&self) -> [usize; NUM_KEYSLOTS] {
        let mut ids: [usize; NUM_KEYSLOTS] = std::array::from_fn(|i| i);
        // Stable, as cryptsetup's insertion sort.
        ids.sort_by_key(|&i| self.keyslots[i].key_material_offset);
        ids
    }

    /// `LUKS_check_keyslots`: every keyslot has 4000 stripes, starts after the header, ends
    /// before the data (unless the data offset is 0: a detached header), and no two overlap.
    fn check_keyslots(&self) -> Result<(), String> {
        let per = self.slot_sectors();
        let payload = self.payload_offset as u64;
        let invalid = |i: usize, why: String| Err(format!("LUKS keyslot {i} is invalid: {why}"));
        for (i, k) in self.keyslots.iter().enumerate() {
            let off = k.key_material_offset as u64;
            if k.stripes != STRIPES {
                return invalid(i, format!("{} stripes, not {STRIPES}", k.stripes));
            }
            if off * SECTOR < HEADER_SIZE as u64 {
                return invalid(
                    i,
                    format!("key material at sector {off} overlaps the header"),
                );
            }
            if payload == 0 {
                continue;
            }
            if payload <= off || payload < off + per {
                return invalid(
                    i,
                    format!("key material at sector {off} (+{per}) reaches the data at sector {payload}"),
                );
            }
        }
        let ids = self.by_offset();
        for w in ids.windows(2) {
            let (prev, next) = (&self.keyslots[w[0]], &self.keyslots[w[1]]);
            if (next.key_material_offset as u64) < prev.key_material_offset as u64 + per {
                return invalid(w[0], format!("its key material overlaps keyslot {}", w[1]));
            }
        }
        Ok(())
    }

    /// `LUKS_check_device_size`: the header device holds every keyslot's key material.
    pub fn check_device(&self, size: u64) -> Result<(), String> {
        if self.key_bytes == 0 {
            return Err("key size is 0".into());
        }
        let last = self.keyslots[self.by_offset()[NUM_KEYSLOTS - 1]].key_material_offset as u64;
        let need = (last + self.slot_sectors()) * SECTOR;
        if need > size {
            return Err(format!(
                "the device ({size} bytes) is too small: LUKS1 requires at least {need} bytes (truncated?)"
            ));
        }
        Ok(())
    }

    /// The 592 header bytes.
    pub fn encode(&self) -> Result<Vec<u8>, LuksError> {
        let mut b = vec![0u8; HEADER_SIZE];
        let mut w = SliceWriter::new(&mut b);
        w.bytes(super::luks2::header::MAGIC_PRIMARY, "magic")
            .and_then(|w| w.u16_be(1))
            .map_err(no_room)?;
        put(&mut w, &self.cipher_name, 32, "cipher name")?;
        put(&mut w, &self.cipher_mode, 32, "cipher mode")?;
        put(&mut w, &self.hash_spec, 32, "hash")?;
        w.u32_be(self.payload_offset)
            .and_then(|w| w.u32_be(self.key_bytes))
            .and_then(|w| w.bytes(&self.mk_digest, "mk digest"))
            .and_then(|w| w.bytes(&self.mk_digest_salt, "mk digest salt"))
            .and_then(|w| w.u32_be(self.mk_digest_iterations))
            .map_err(no_room)?;
        put(&mut w, &self.uuid, 40, "uuid")?;
        for k in &self.keyslots {
            let state = if k.active { KEY_ENABLED } else { KEY_DISABLED };
            w.u32_be(state)
                .and_then(|w| w.u32_be(k.iterations))
                .and_then(|w| w.bytes(&k.salt, "keyslot salt"))
                .and_then(|w| w.u32_be(k.key_material_offset))
                .and_then(|w| w.u32_be(k.stripes))
                .map_err(no_room)?;
        }
        Ok(b)
    }

    /// dm-crypt's cipher string: "aes-xts-plain64".
    pub fn cipher(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }

    /// Bytes of key material of keyslot `k`.
    fn material_len(&self, k: &Luks1Keyslot) -> u64 {
        af::split_sectors_bytes(self.key_bytes as u64, k.stripes)
    }

    /// Whether `vk` is the volume key (constant-time compare).
    pub fn check_volume_key(&self, vk: &[u8]) -> Result<bool, LuksError> {
        let mut d = [0u8; DIGEST_SIZE];
        pbkdf2(
            &self.hash_spec,
            vk,
            &self.mk_digest_salt,
            self.mk_digest_iterations,
            &mut d,
        )?;
        Ok(bool::from(d.ct_eq(&self.mk_digest)))
    }
}

/// Read and check the LUKS1 header of `dev` (the device itself, or a detached header file).
pub fn read(dev: &dyn BlockDevice) -> Result<Luks1Header, LuksError> {
    let corrupt = |what: String| LuksError::Corrupt {
        device: dev.name().to_string(),
        what,
    };
    if dev.size() < HEADER_SIZE as u64 {
        return Err(LuksError::NotLuks {
            device: dev.name().to_string(),
        });
    }
    let mut b = vec![0u8; HEADER_SIZE];
    dev.read_at(&mut b, 0)?;
    if &b[..6] != super::luks2::header::MAGIC_PRIMARY {
        return Err(LuksError::NotLuks {
            device: dev.name().to_string(),
        });
    }
    let h = Luks1Header::parse(&b).map_err(|e| corrupt(format!("LUKS1 header: {e}")))?;
    h.check_device(dev.size())
        .map_err(|e| corrupt(format!("LUKS1 header: {e}")))?;
    Ok(h)
}

/// Unlock the volume key with `passphrase` (keyslot `slot` only, or every active one).
pub fn unlock(
    dev: &dyn BlockDevice,
    h: &Luks1Header,
    passphrase: &[u8],
    slot: Option<u32>,
) -> Result<(u32, VolumeKey), LuksError> {
    let r = unlock_slots(dev, h, passphrase, slot);
    // The KDF and the AF merge ran in frames below this one.
    crate::crypt::secret::burn_stack();
    r
}

fn unlock_slots(
    dev: &dyn BlockDevice,
    h: &Luks1Header,
    passphrase: &[u8],
    slot: Option<u32>,
) -> Result<(u32, VolumeKey), LuksError> {
    let cipher = h.cipher();
    // As cryptsetup's LUKS_open_key_with_hdr: a keyslot not in use is "no entry", a wrong
    // passphrase is reported only when some keyslot was tried, other errors stop at once.
    let mut tried = false;
    for (i, k) in h.keyslots.iter().enumerate() {
        if slot.is_some_and(|s| s as usize != i) || !k.active {
            continue;
        }
        tried = true;
        let mut key = SecretBytes::zeroed(h.key_bytes as usize);
        pbkdf2(&h.hash_spec, passphrase, &k.salt, k.iterations, &mut key)?;
        let mut material = SecretBytes::zeroed(h.material_len(k) as usize);
        dev.read_at(&mut material, k.key_material_offset as u64 * SECTOR)?;
        area::crypt(&cipher, &key, &mut material, false)?;
        let vk = af::merge(&material, h.key_bytes as usize, k.stripes, &h.hash_spec)?;
        if h.check_volume_key(&vk)? {
            return Ok((i as u32, vk));
        }
    }
    if let Some(s) = slot.filter(|&s| s as usize >= NUM_KEYSLOTS) {
        return Err(LuksError::Invalid(format!(
            "keyslot {s} is out of range 0..7"
        )));
    }
    Err(if tried {
        LuksError::WrongPassphrase
    } else {
        LuksError::NoUsableKeyslot
    })
}

/// Sectors one keyslot's material takes, aligned to 4 KiB as cryptsetup lays them out.
fn slot_sectors(key_bytes: u32) -> u32 {
    let s = af::split_sectors_bytes(key_bytes as u64, STRIPES) / SECTOR;
    (s as u32).div_ceil(8) * 8
}

/// Store `vk` in keyslot `slot` (or the first free one) under `passphrase` with PBKDF2
/// (`iterations`, or benchmarked for `iter_time_ms`); writes the material, flushes, then writes
/// the header, so a power cut leaves the old header or a complete new keyslot.
pub fn add_key(
    dev: &dyn BlockDevice,
    h: &mut Luks1Header,
    vk: &[u8],
    passphrase: &[u8],
    iterations: Option<u32>,
    iter_time_ms: u32,
    slot: Option<u32>,
) -> Result<u32, LuksError> {
    let i = match slot {
        Some(s) if s as usize >= NUM_KEYSLOTS => {
            return Err(LuksError::Invalid(format!(
                "keyslot {s} is out of range 0..7"
            )))
        }
        Some(s) if h.keyslots[s as usize].active => {
            return Err(LuksError::Invalid(format!("keyslot {s} is already in use")))
        }
        Some(s) => s as usize,
        None => h
            .keyslots
            .iter()
            .position(|k| !k.active)
            .ok_or_else(|| LuksError::Invalid("all 8 keyslots are in use".into()))?,
    };
    let iterations = match iterations {
        Some(n) => n.max(1),
        None => benchmark_pbkdf2(&h.hash_spec, h.key_bytes as usize, iter_time_ms)?,
    };
    let mut salt = [0u8; SALT_SIZE];
    getrandom::getrandom(&mut salt)
        .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
    let k = &mut h.keyslots[i];
    k.iterations = iterations;
    k.salt = salt;
    k.stripes = STRIPES;
    let k = k.clone();
    let mut key = SecretBytes::zeroed(h.key_bytes as usize);
    pbkdf2(&h.hash_spec, passphrase, &salt, iterations, &mut key)?;
    let split = af::split(vk, STRIPES, &h.hash_spec)?;
    let mut material = SecretBytes::zeroed(h.material_len(&k) as usize);
    material[..split.len()].copy_from_slice(&split);
    area::crypt(&h.cipher(), &key, &mut material, true)?;
    let at = k.key_material_offset as u64 * SECTOR;
    if at + material.len() as u64 > dev.size() {
        return Err(LuksError::Invalid(format!(
            "keyslot {i} material lies beyond the end of {}",
            dev.name()
        )));
    }
    // The material must be durable before the header that points to it (cryptsetup syncs in
    // between too): otherwise a power cut can leave an active keyslot with no key behind it.
    dev.write_at(&material, at)?;
    dev.flush()?;
    h.keyslots[i].active = true;
    dev.write_at(&h.encode()?, 0)?;
    dev.flush()?;
    Ok(i as u32)
}

/// Disable keyslot `slot` and wipe its key material.
pub fn kill_slot(dev: &dyn BlockDevice, h: &mut Luks1Header, slot: u32) -> Result<(), LuksError> {
    let i = slot as usize;
    if i >= NUM_KEYSLOTS || !h.keyslots[i].active {
        return Err(LuksError::Invalid(format!("keyslot {slot} is not active")));
    }
    let k = h.keyslots[i].clone();
    wipe(
        dev,
        k.key_material_offset as u64 * SECTOR,
        h.material_len(&k),
    )?;
    h.keyslots[i].active = false;
    h.keyslots[i].iterations = 0;
    h.keyslots[i].salt = [0; 32];
    dev.write_at(&h.encode()?, 0)?;
    dev.flush()?;
    Ok(())
}

/// Where a LUKS1 volume's data starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// On the header's own device: at this sector (`--offset`), or by default aligned to
    /// 1 MiB after the keyslots.
    Attached(Option<u32>),
    /// On another device (a detached `--header`): at this sector of it, 0 by default. The
    /// header device holds only the header and keyslots.
    Detached(u32),
}

/// The sectors a LUKS1 header and its eight keyslots take for a `key_bytes` volume key (the
/// size cryptsetup gives a detached header file).
pub fn header_sectors(key_bytes: u32) -> u32 {
    8 + slot_sectors(key_bytes) * NUM_KEYSLOTS as u32
}

/// Format `dev` as LUKS1 with keyslot 0 opened by `passphrase`: cryptsetup's layout (keyslot
/// material 4 KiB aligned after the header, data where `payload` says). The volume key is
/// `given` (`--volume-key-file`), else a random one.
#[allow(clippy::too_many_arguments)]
pub fn format(
    dev: &dyn BlockDevice,
    cipher: &str,
    key_bytes: u32,
    hash: &str,
    uuid: &str,
    iterations: Option<u32>,
    iter_time_ms: u32,
    payload: Payload,
    passphrase: &[u8],
    given: Option<VolumeKey>,
) -> Result<(Luks1Header, VolumeKey), LuksError> {
    let (name, mode) = cipher
        .split_once('-')
        .ok_or_else(|| LuksError::Unsupported(format!("cipher {cipher:?}")))?;
    area::check(cipher, key_bytes as usize)?;
    af::message_digest(hash)?;
    let per = slot_sectors(key_bytes);
    let first = 8u32; // 4096 bytes: the header rounded up to the alignment
    let end = header_sectors(key_bytes);
    let (payload, detached) = match payload {
        Payload::Attached(p) => (p.unwrap_or(end.div_ceil(2048) * 2048), false),
        Payload::Detached(p) => (p, true),
    };
    if payload < end && !(detached && payload == 0) {
        // cryptsetup's LUKS_check_device_size words.
        return Err(LuksError::Invalid(
            "Data offset for LUKS header must be either 0 or higher than header size.".into(),
        ));
    }
    if detached && dev.size() < end as u64 * SECTOR {
        return Err(LuksError::Invalid(format!(
            "{} is too small for a LUKS1 header ({} bytes)",
            dev.name(),
            end as u64 * SECTOR
        )));
    }
    if !detached && dev.size() <= payload as u64 * SECTOR {
        return Err(LuksError::Invalid(format!(
            "{} is too small for a LUKS1 header and data at sector {payload}",
            dev.name()
        )));
    }
    let vk = match given {
        Some(k) if k.len() == key_bytes as usize => k,
        Some(k) => {
            return Err(LuksError::Invalid(format!(
                "volume key of {} bytes for a {key_bytes}-byte key",
                k.len()
            )))
        }
        None => {
            let mut vk = VolumeKey::new(vec![0u8; key_bytes as usize]);
            getrandom::getrandom(&mut vk)
                .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
            vk
        }
    };
    let mut mk_digest_salt = [0u8; 32];
    getrandom::getrandom(&mut mk_digest_salt)
        .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
    let mk_digest_iterations = match iterations {
        Some(_) => MIN_PBKDF2_ITERATIONS,
        None => benchmark_pbkdf2(hash, key_bytes as usize, iter_time_ms / 8)?,
    };
    let mut mk_digest = [0u8; DIGEST_SIZE];
    pbkdf2(
        hash,
        &vk,
        &mk_digest_salt,
        mk_digest_iterations,
        &mut mk_digest,
    )?;
    let keyslots = std::array::from_fn(|i| Luks1Keyslot {
        active: false,
        iterations: 0,
        salt: [0; 32],
        key_material_offset: first + per * i as u32,
        stripes: STRIPES,
    });
    let mut h = Luks1Header {
        cipher_name: name.into(),
        cipher_mode: mode.into(),
        hash_spec: hash.into(),
        payload_offset: payload,
        key_bytes,
        mk_digest,
        mk_digest_salt,
        mk_digest_iterations,
        uuid: uuid.into(),
        keyslots,
        raw: Vec::new(),
    };
    h.encode()?;
    wipe(dev, 0, end as u64 * SECTOR)?;
    add_key(
        dev,
        &mut h,
        &vk,
        passphrase,
        iterations,
        iter_time_ms,
        Some(0),
    )?;
    Ok((h, vk))
}

/// A text field for the dump: from the header bytes as read (last byte forced to NUL, up to
/// the first NUL), or the parsed value for a header made here.
fn dump_field(h: &Luks1Header, range: std::ops::Range<usize>, parsed: &str) -> Vec<u8> {
    if h.raw.len() < HEADER_SIZE {
        return parsed.as_bytes().to_vec();
    }
    let f = &h.raw[range.start..range.end - 1];
    f[..f.iter().position(|&c| c == 0).unwrap_or(f.len())].to_vec()
}

/// The text of `cryptsetup luksDump` for a LUKS1 header, as bytes (text fields are printed as
/// they are on disk).
pub fn dump_text(h: &Luks1Header, device: &str) -> Vec<u8> {
    let mut o = Vec::new();
    let line = |o: &mut Vec<u8>, label: &str, v: &[u8]| {
        o.extend_from_slice(label.as_bytes());
        o.extend_from_slice(v);
        o.push(b'\n');
    };
    o.extend_from_slice(format!("LUKS header information for {device}\n\n").as_bytes());
    o.extend_from_slice(b"Version:       \t1\n");
    line(
        &mut o,
        "Cipher name:   \t",
        &dump_field(h, 8..40, &h.cipher_name),
    );
    line(
        &mut o,
        "Cipher mode:   \t",
        &dump_field(h, 40..72, &h.cipher_mode),
    );
    line(
        &mut o,
        "Hash spec:     \t",
        &dump_field(h, 72..104, &h.hash_spec),
    );
    let mut s = String::new();
    let _ = writeln!(s, "Payload offset:\t{}", h.payload_offset);
    let _ = writeln!(s, "MK bits:       \t{}", h.key_bytes.wrapping_mul(8));
    let _ = writeln!(
        s,
        "MK digest:     \t{}",
        h.mk_digest
            .iter()
            .map(|b| format!("{b:02x} "))
            .collect::<String>()
    );
    let _ = writeln!(
        s,
        "MK salt:       \t{}",
        hex_lines(&h.mk_digest_salt, "               \t")
    );
    let _ = writeln!(s, "MK iterations: \t{}", h.mk_digest_iterations);
    o.extend_from_slice(s.as_bytes());
    let uuid = dump_field(h, 168..208, &h.uuid);
    line(&mut o, "UUID:          \t", &uuid);
    o.push(b'\n');
    let mut s = String::new();
    for (i, k) in h.keyslots.iter().enumerate() {
        if !k.active {
            let _ = writeln!(s, "Key Slot {i}: DISABLED");
            continue;
        }
        let _ = writeln!(s, "Key Slot {i}: ENABLED");
        let _ = writeln!(s, "\tIterations:         \t{}", k.iterations);
        let _ = writeln!(
            s,
            "\tSalt:               \t{}",
            hex_lines(&k.salt, "\t                      \t")
        );
        let _ = writeln!(s, "\tKey material offset:\t{}", k.key_material_offset);
        let _ = writeln!(s, "\tAF stripes:            \t{}", k.stripes);
    }
    o.extend_from_slice(s.as_bytes());
    o
}

/// The header as JSON (`dump --json`), in LUKS1's own field names.
pub fn dump_json(h: &Luks1Header) -> serde_json::Value {
    let slots: Vec<serde_json::Value> = h
        .keyslots
        .iter()
        .enumerate()
        .map(|(i, k)| {
            serde_json::json!({
                "id": i, "active": k.active, "iterations": k.iterations, "salt": hex::encode(k.salt),
                "key_material_offset": k.key_material_offset, "stripes": k.stripes,
            })
        })
        .collect();
    serde_json::json!({
        "version": 1,
        "cipher_name": h.cipher_name,
        "cipher_mode": h.cipher_mode,
        "hash_spec": h.hash_spec,
        "payload_offset": h.payload_offset,
        "key_bytes": h.key_bytes,
        "mk_digest": hex::encode(h.mk_digest),
        "mk_digest_salt": hex::encode(h.mk_digest_salt),
        "mk_digest_iterations": h.mk_digest_iterations,
        "uuid": h.uuid,
        "keyslots": slots,
    })
}
