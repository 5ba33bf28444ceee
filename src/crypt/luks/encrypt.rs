//! `reencrypt --encrypt` with a detached header: a plaintext device gets a new LUKS2 header
//! file that says "in encryption, nothing encrypted yet"; the run then encrypts the data in
//! place ([`super::LuksVolume::reencrypt_run`]). cryptsetup formats the header, then rewrites
//! it for the reencryption, so a crash between the two leaves a header that claims
//! ciphertext over plaintext. Here the header is made in memory and written once: the
//! keyslots area first, the two header copies last.

use super::{LuksError, LuksVolume};
use crate::block::{BlockDevice, Claim, MemoryDevice};
use crate::crypt::luks2::header::MAGIC_PRIMARY;
use crate::crypt::luks2::json::MAX_KEYSLOTS_SIZE;
use crate::crypt::luks2::reencrypt::{self, datashift, InitParams, ReencryptState};
use crate::crypt::luks2::{self as luks2, FormatParams};
use std::path::Path;

/// Whether `dev` starts with a LUKS header (cryptsetup's `check_luks_device`).
fn is_luks(dev: &dyn BlockDevice) -> bool {
    let mut magic = [0u8; 6];
    dev.size() >= 6 && dev.read_at(&mut magic, 0).is_ok() && &magic == MAGIC_PRIMARY
}

/// cryptsetup's refusal to encrypt what already holds a LUKS header.
fn already(p: &Path) -> LuksError {
    LuksError::Invalid(format!(
        "Device {} is already LUKS device. Aborting operation.",
        p.display()
    ))
}

/// The plaintext device, writable and claimed whole, refused when it holds a LUKS header.
fn open_plain(device: &Path) -> Result<(crate::block::FileDevice, Claim), LuksError> {
    let data = crate::block::open_backing(device, false, false)?;
    let claim = Claim::take(data.file(), device, 0, 0, true)?;
    if is_luks(&data) {
        return Err(already(device));
    }
    Ok((data, claim))
}

/// Put the plaintext `device` into encryption with a new header in the file `header`
/// (created owner-only; an existing one must not hold a LUKS header): keyslot 0 for `pass`
/// under a new volume key of `format`'s cipher, and the reencryption metadata of mode
/// `encrypt`. Nothing of the data is written.
pub fn encrypt_init(
    device: &Path,
    header: &Path,
    format: &FormatParams,
    pass: &[u8],
    params: &InitParams,
) -> Result<(), LuksError> {
    encrypt_detached(
        device,
        header,
        format.clone(),
        pass,
        params,
        |mem, h, size, key, ip| reencrypt::init_encrypt(mem, h, size, key, ip),
    )
}

/// The metadata copy size cryptsetup 2.6.1 gives a `--reduce-device-size` header (its
/// "missing default here").
const REDUCE_METADATA_SIZE: u64 = 16 << 10;

/// Put the plaintext `device` into encryption in place under a new header in the file
/// `header`, as cryptsetup 2.6.1 does for `reencrypt --encrypt --reduce-device-size reduce
/// --header`: the header is `reduce` bytes (two 16 KiB metadata copies, the rest keyslots
/// area; none of the device is given up), the data stays at 0 and is encrypted backward one
/// `reduce`-byte hotzone at a time (resilience `datashift`, see
/// [`datashift::init_encrypt_in_place`]). Nothing is written when a check fails.
pub fn encrypt_init_in_place(
    device: &Path,
    header: &Path,
    reduce: u64,
    format: &FormatParams,
    pass: &[u8],
    params: &InitParams,
) -> Result<(), LuksError> {
    let keyslots = reduce.checked_sub(2 * REDUCE_METADATA_SIZE);
    let Some(keyslots) = keyslots.filter(|k| k % 4096 == 0 && *k <= MAX_KEYSLOTS_SIZE) else {
        return Err(LuksError::Invalid(
            "Unsupported LUKS2 metadata size options.".into(),
        ));
    };
    let mut p = format.clone();
    p.metadata_size = REDUCE_METADATA_SIZE;
    // Zero is cryptsetup's "not set": the default keyslots area (a 16 MiB header).
    p.keyslots_size = Some(keyslots);
    let name = device.display().to_string();
    encrypt_detached(device, header, p, pass, params, |mem, h, size, key, ip| {
        datashift::init_encrypt_in_place(mem, h, &name, size, reduce, key, ip)
    })
}

/// What both detached-header encryptions share: the plaintext device claimed, the header
/// formatted in memory with `p` (data offset 0), `init` putting it into encryption, then the
/// file written whole.
fn encrypt_detached(
    device: &Path,
    header: &Path,
    mut p: FormatParams,
    pass: &[u8],
    params: &InitParams,
    init: impl FnOnce(
        &MemoryDevice,
        &mut luks2::header::Luks2Header,
        u64,
        &[u8],
        &InitParams,
    ) -> Result<u32, LuksError>,
) -> Result<(), LuksError> {
    let (data, _claim) = open_plain(device)?;
    if header.exists() {
        let h = crate::block::open_backing(header, true, false)?;
        if is_luks(&h) {
            return Err(already(header));
        }
    }
    p.detached = true;
    p.data_offset = Some(0);
    let (keyslots_size, _) = luks2::format::layout(&p)?;
    let need = 2 * p.metadata_size + keyslots_size;
    let mem = MemoryDevice::new("header", need as usize);
    let data_size = data.size();
    let prepared = luks2::format::prepare(&mem, data_size, &p)?;
    let (mut h, key) = luks2::format::write(&mem, prepared, &p, pass).map_err(no_space)?;
    let mut ip = params.clone();
    ip.io_block = super::reencrypt::io_block(&data);
    init(&mem, &mut h, data_size, &key, &ip)?;
    drop(key);
    write_header_file(header, &mem.contents(), 2 * p.metadata_size)
}

/// cryptsetup's words when keyslot 0 does not fit the keyslots area.
fn no_space(e: LuksError) -> LuksError {
    match e {
        LuksError::Invalid(m) if m.contains("keyslot") => {
            LuksError::Invalid("No space for new keyslot.".into())
        }
        e => e,
    }
}

/// Put the plaintext `device` into encryption in place with its header at its start
/// (`reencrypt --encrypt --reduce-device-size reduce`, cryptsetup's moved first segment): the
/// header is made in memory with the data offset half the reduction (the shift), the
/// plaintext's first shift bytes are copied to the device's end and flushed, then the header
/// is written over them: the keyslots area first, then the secondary header copy, the primary
/// last, each flushed (a crash before the primary leaves the secondary, which readers fall
/// back to). Nothing is written when a check fails.
pub fn encrypt_init_shift(
    device: &Path,
    reduce: u64,
    format: &FormatParams,
    pass: &[u8],
    params: &InitParams,
) -> Result<(), LuksError> {
    let (data, _claim) = open_plain(device)?;
    // cryptsetup: the data offset is half the reduction in whole sectors, and so is the shift.
    let shift = reduce / 1024 * 512;
    let mut p = format.clone();
    p.detached = true;
    p.data_offset = Some(shift);
    let (keyslots_size, _) = luks2::format::layout(&p)?;
    let copies = 2 * p.metadata_size;
    let mem = MemoryDevice::new("header", (copies + keyslots_size) as usize);
    let data_size = data.size();
    let prepared = luks2::format::prepare(&mem, data_size, &p)?;
    let (mut h, key) = luks2::format::write(&mem, prepared, &p, pass).map_err(no_space)?;
    let mut ip = params.clone();
    ip.io_block = super::reencrypt::io_block(&data);
    let name = device.display().to_string();
    datashift::init_encrypt(&mem, &mut h, &name, data_size, shift, &key, &ip)?;
    drop(key);
    let st = ReencryptState::read(&h.metadata)?
        .ok_or_else(|| LuksError::Invalid("reencryption state lost".into()))?;
    datashift::move_first_segment(&data, &st)?;
    let image = mem.contents();
    let md = p.metadata_size as usize;
    data.write_at(&image[2 * md..], 2 * md as u64)?;
    data.flush()?;
    data.write_at(&image[md..2 * md], md as u64)?;
    data.flush()?;
    data.write_at(&image[..md], 0)?;
    data.flush()?;
    Ok(())
}

/// Write `image` (a whole header: copies and keyslots area) to the file `path`, the part
/// from `copies` on first and flushed, then the header copies.
fn write_header_file(path: &Path, image: &[u8], copies: u64) -> Result<(), LuksError> {
    let io = |e: std::io::Error| LuksError::Invalid(format!("{}: {e}", path.display()));
    let f = match super::files::create_new(path, super::files::HEADER_MODE) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?,
        Err(e) => return Err(io(e)),
    };
    let _claim = Claim::take(&f, path, 0, 0, true)?;
    let meta = f.metadata().map_err(io)?;
    if meta.is_file() && meta.len() < image.len() as u64 {
        f.set_len(image.len() as u64).map_err(io)?;
    }
    let dev = crate::block::open_device(path, false, false)?;
    let copies = copies as usize;
    dev.write_at(&image[copies..], copies as u64)?;
    dev.flush()?;
    dev.write_at(&image[..copies], 0)?;
    dev.flush()?;
    Ok(())
}

impl LuksVolume {
    /// Put this volume, whose header is detached and whose data starts at 0, into
    /// decryption (`reencrypt --decrypt --init-only`) with `pass` (keyslot `slot` when
    /// given). Returns the reencrypt keyslot. cryptsetup 2.6 decrypts in place only with
    /// such a header; its refusal otherwise is kept.
    pub fn reencrypt_init_decrypt(
        &mut self,
        pass: &[u8],
        slot: Option<u32>,
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        self.init_decrypt_with(pass, slot, params, true)
    }

    /// [`LuksVolume::reencrypt_init_decrypt`] of a volume its server serves (and claims):
    /// only the header changes, the server decrypts the data online.
    pub fn reencrypt_init_decrypt_served(
        &mut self,
        pass: &[u8],
        slot: Option<u32>,
        params: &InitParams,
    ) -> Result<u32, LuksError> {
        self.init_decrypt_with(pass, slot, params, false)
    }

    fn init_decrypt_with(
        &mut self,
        pass: &[u8],
        slot: Option<u32>,
        params: &InitParams,
        claim: bool,
    ) -> Result<u32, LuksError> {
        let refuse = || {
            LuksError::Unsupported(
                "LUKS2 decryption is supported with detached header device only (with data offset set to 0).".into(),
            )
        };
        let super::Header::V2(h) = &self.header else {
            return Err(LuksError::Unsupported(
                "reencryption of a LUKS1 device (convert it to LUKS2 first)".into(),
            ));
        };
        if self.header_path.is_none() || h.metadata.segments.get(&0).is_none_or(|s| s.offset > 0) {
            return Err(refuse());
        }
        // Only its size is read: served, its block device is held exclusively already.
        let data = match claim {
            true => crate::block::open_backing(&self.device, false, false)?,
            false => crate::block::open_device(&self.device, true, false)?,
        };
        // Offline nothing may map or change the data meanwhile; a served volume's server
        // holds that claim itself.
        let _claim = match claim {
            true => Some(Claim::take(data.file(), &self.device, 0, 0, true)?),
            false => None,
        };
        let mut ip = params.clone();
        ip.io_block = super::reencrypt::io_block(&data);
        let super::Header::V2(h) = &mut self.header else {
            unreachable!("checked above")
        };
        reencrypt::init_decrypt(&self.dev, h, data.size(), pass, slot, &ip)
    }
}
