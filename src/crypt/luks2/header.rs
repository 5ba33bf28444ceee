//! The LUKS2 binary header (4096 bytes, big-endian) and the pair of header copies: the
//! primary at offset 0 and the secondary right after it, each followed by its JSON area and
//! covered by a checksum over both with the checksum field zeroed.

use super::json::Metadata;
use super::jsonc::c_str;
use crate::block::BlockDevice;
use crate::codec::{self, Reader, SliceWriter};
use crate::crypt::luks::LuksError;
use openssl::hash::{Hasher, MessageDigest};

/// Magic of the primary header.
pub const MAGIC_PRIMARY: &[u8; 6] = b"LUKS\xba\xbe";
/// Magic of the secondary header.
pub const MAGIC_SECONDARY: &[u8; 6] = b"SKUL\xba\xbe";
/// Size of the binary part of a header.
pub const BINARY_SIZE: usize = 4096;
/// Header sizes (binary + JSON area) LUKS2 allows; also where a secondary copy may sit.
pub const HEADER_SIZES: [u64; 9] = [
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
];

pub(super) const OFF_HDR_SIZE: usize = 8;
pub(super) const OFF_HDR_OFFSET: usize = 256;
pub(super) const OFF_CSUM: usize = 448;
pub(super) const LABEL_LEN: usize = 48;
pub(super) const CSUM_ALG_LEN: usize = 32;
pub(super) const UUID_LEN: usize = 40;
pub(super) const CSUM_LEN: usize = 64;

/// A LUKS2 header: the fields of the binary header both copies share, and the metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Luks2Header {
    /// Size of one header copy: binary header + JSON area (16 KiB .. 4 MiB).
    pub hdr_size: u64,
    /// Sequence id, incremented on every update (cryptsetup's "Epoch").
    pub seqid: u64,
    /// Label (up to 47 bytes).
    pub label: String,
    /// Subsystem (up to 47 bytes).
    pub subsystem: String,
    /// UUID text.
    pub uuid: String,
    /// Checksum algorithm ("sha256").
    pub checksum_alg: String,
    /// The JSON metadata.
    pub metadata: Metadata,
    /// The copy as read from disk (`None` for a header made here): what `dump` prints.
    pub raw: Option<RawCopy>,
}

/// What a header copy held on disk, byte for byte where cryptsetup prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawCopy {
    /// The metadata as json-c parsed it (after cryptsetup's in-memory repair).
    pub json: super::jsonc::Value,
    /// Label field up to its NUL (or its last byte, which cryptsetup forces to NUL).
    pub label: Vec<u8>,
    /// Subsystem field, the same way.
    pub subsystem: Vec<u8>,
    /// UUID field, the same way.
    pub uuid: Vec<u8>,
}

/// A header as read from a device, and what the reader had to say about it.
#[derive(Debug)]
pub struct LoadedHeader {
    /// The header in use.
    pub header: Luks2Header,
    /// Set when one copy was corrupt or out of date and the other one was used.
    pub warning: Option<String>,
}

/// Write `s` as a NUL-padded text field of `len` bytes (at least one NUL, none inside).
fn put_text(
    w: &mut SliceWriter<'_>,
    s: &str,
    len: usize,
    what: &'static str,
) -> Result<(), LuksError> {
    if s.len() >= len || s.as_bytes().contains(&0) {
        return Err(LuksError::Invalid(format!(
            "{what} {s:?} is longer than {} bytes",
            len - 1
        )));
    }
    w.bytes(s.as_bytes(), what)
        .and_then(|w| w.zeros(len - s.len(), what))
        .map_err(no_room)?;
    Ok(())
}

/// A field that does not fit the binary header (its layout is fixed: a bug, reported).
fn no_room(e: codec::Error) -> LuksError {
    LuksError::Invalid(format!("LUKS2 binary header: {e}"))
}

/// The fields of one binary header as stored, in on-disk order (text fields raw, NULs and
/// all: the checksum algorithm is read whole, the others with their last byte forced to NUL,
/// as cryptsetup reads each).
#[derive(Debug, Clone)]
pub(super) struct Binary {
    pub magic: [u8; 6],
    pub version: u16,
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: [u8; LABEL_LEN],
    pub checksum_alg: [u8; CSUM_ALG_LEN],
    pub uuid: [u8; UUID_LEN],
    pub subsystem: [u8; LABEL_LEN],
    pub hdr_offset: u64,
}

impl Binary {
    /// Decode the start of a binary header (at least [`OFF_CSUM`] bytes).
    pub fn decode(bin: &[u8]) -> Result<Binary, codec::Error> {
        let mut r = Reader::new(bin);
        let magic = r.array("magic")?;
        let version = r.u16_be("version")?;
        let hdr_size = r.u64_be("hdr_size")?;
        let seqid = r.u64_be("seqid")?;
        let label = r.array("label")?;
        let checksum_alg = r.array("checksum_alg")?;
        r.skip(64, "salt")?;
        let uuid = r.array("uuid")?;
        let subsystem = r.array("subsystem")?;
        let hdr_offset = r.u64_be("hdr_offset")?;
        Ok(Binary {
            magic,
            version,
            hdr_size,
            seqid,
            label,
            checksum_alg,
            uuid,
            subsystem,
            hdr_offset,
        })
    }

    /// A text field as cryptsetup uses it: its last byte forced to NUL, up to the first NUL.
    pub fn text(field: &[u8]) -> Vec<u8> {
        c_str(&field[..field.len().saturating_sub(1)]).to_vec()
    }
}

/// The digest of a header checksum algorithm, as cryptsetup's OpenSSL backend finds it by
/// name.
pub(super) fn checksum_md(alg: &str) -> Result<MessageDigest, String> {
    MessageDigest::from_name(alg)
        .filter(|_| !alg.is_empty())
        .ok_or_else(|| format!("unsupported checksum algorithm {alg:?}"))
}

/// Checksum of a header copy: `binary` with the checksum field zeroed, then the JSON area.
pub(super) fn checksum(
    md: MessageDigest,
    binary: &[u8],
    json_area: &[u8],
) -> Result<Vec<u8>, LuksError> {
    let e = |e: openssl::error::ErrorStack| LuksError::Crypto(e.to_string());
    let mut zeroed = binary.to_vec();
    SliceWriter::new(&mut zeroed)
        .seek(OFF_CSUM, "csum")
        .and_then(|w| w.zeros(CSUM_LEN, "csum"))
        .map_err(no_room)?;
    let mut h = Hasher::new(md).map_err(e)?;
    h.update(&zeroed).map_err(e)?;
    h.update(json_area).map_err(e)?;
    Ok(h.finish().map_err(e)?.to_vec())
}

/// Whether the first bytes of a device look like a LUKS header of any version, and which.
pub fn luks_version(first: &[u8]) -> Option<u16> {
    let mut r = Reader::new(first);
    if r.take(6, "magic").ok()? != MAGIC_PRIMARY {
        return None;
    }
    r.u16_be("version").ok()
}

impl Luks2Header {
    /// The binary header of one copy, checksum included.
    fn encode_copy(&self, offset: u64, json_area: &[u8]) -> Result<Vec<u8>, LuksError> {
        let mut b = vec![0u8; BINARY_SIZE];
        let mut w = SliceWriter::new(&mut b);
        let magic = if offset == 0 {
            MAGIC_PRIMARY
        } else {
            MAGIC_SECONDARY
        };
        w.bytes(magic, "magic")
            .and_then(|w| w.u16_be(2))
            .and_then(|w| w.u64_be(self.hdr_size))
            .and_then(|w| w.u64_be(self.seqid))
            .map_err(no_room)?;
        put_text(&mut w, &self.label, LABEL_LEN, "label")?;
        put_text(
            &mut w,
            &self.checksum_alg,
            CSUM_ALG_LEN,
            "checksum algorithm",
        )?;
        let mut salt = [0u8; 64];
        getrandom::getrandom(&mut salt)
            .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
        w.bytes(&salt, "salt").map_err(no_room)?;
        put_text(&mut w, &self.uuid, UUID_LEN, "uuid")?;
        put_text(&mut w, &self.subsystem, LABEL_LEN, "subsystem")?;
        w.u64_be(offset).map_err(no_room)?;
        debug_assert_eq!(w.pos(), OFF_HDR_OFFSET + 8);
        let md = checksum_md(&self.checksum_alg).map_err(LuksError::Unsupported)?;
        let sum = checksum(md, &b, json_area)?;
        SliceWriter::new(&mut b)
            .seek(OFF_CSUM, "csum")
            .and_then(|w| w.bytes(&sum, "csum"))
            .map_err(no_room)?;
        Ok(b)
    }

    /// Both copies as bytes (primary then secondary, `2 * hdr_size`), for writing or backup.
    pub fn encode(&self) -> Result<Vec<u8>, LuksError> {
        self.metadata
            .validate(self.hdr_size)
            .map_err(LuksError::Invalid)?;
        let text = self.metadata.to_text();
        let json_size = (self.hdr_size as usize) - BINARY_SIZE;
        if text.len() >= json_size {
            return Err(LuksError::Invalid(format!(
                "JSON metadata of {} bytes does not fit in the {json_size}-byte JSON area (use a larger --luks2-metadata-size)",
                text.len()
            )));
        }
        let mut json = vec![0u8; json_size];
        json[..text.len()].copy_from_slice(text.as_bytes());
        let mut out = Vec::with_capacity(2 * self.hdr_size as usize);
        for offset in [0, self.hdr_size] {
            out.extend_from_slice(&self.encode_copy(offset, &json)?);
            out.extend_from_slice(&json);
        }
        Ok(out)
    }

    /// Bump the sequence id and write both copies to `dev`.
    pub fn write(&mut self, dev: &dyn BlockDevice) -> Result<(), LuksError> {
        self.write_unflushed(dev)?;
        dev.flush()?;
        Ok(())
    }

    /// [`Luks2Header::write`] without the flush after the primary copy. The secondary copy is
    /// flushed first and carries the higher sequence id, which every reader (cryptsetup too)
    /// takes over an older primary, so the new metadata is durable on return; the primary may
    /// become durable with the caller's next flush. The caller must flush `dev` before it
    /// writes the header again (a torn secondary copy must never meet a stale primary).
    pub fn write_unflushed(&mut self, dev: &dyn BlockDevice) -> Result<(), LuksError> {
        self.seqid += 1;
        let bytes = self.encode()?;
        let h = self.hdr_size as usize;
        // Secondary first: if we are cut short, the primary still holds the previous,
        // consistent metadata and a reader falls back cleanly.
        dev.write_at(&bytes[h..], h as u64)?;
        dev.flush()?;
        dev.write_at(&bytes[..h], 0)?;
        Ok(())
    }

    /// Bytes at the start of the device taken by the headers and the keyslots area.
    pub fn metadata_end(&self) -> u64 {
        2 * self.hdr_size + self.metadata.config.keyslots_size
    }
}
