//! The LUKS2 binary header (4096 bytes, big-endian) and the pair of header copies: the
//! primary at offset 0 and the secondary right after it, each followed by its JSON area and
//! covered by a checksum over both with the checksum field zeroed.

use super::json::Metadata;
use crate::block::BlockDevice;
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

pub(super) const OFF_VERSION: usize = 6;
pub(super) const OFF_HDR_SIZE: usize = 8;
pub(super) const OFF_SEQID: usize = 16;
pub(super) const OFF_LABEL: usize = 24;
pub(super) const OFF_CSUM_ALG: usize = 72;
pub(super) const OFF_SALT: usize = 104;
pub(super) const OFF_UUID: usize = 168;
pub(super) const OFF_SUBSYSTEM: usize = 208;
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

fn put_text(dst: &mut [u8], s: &str, what: &str) -> Result<(), LuksError> {
    if s.len() >= dst.len() || s.as_bytes().contains(&0) {
        return Err(LuksError::Invalid(format!(
            "{what} {s:?} is longer than {} bytes",
            dst.len() - 1
        )));
    }
    dst[..s.len()].copy_from_slice(s.as_bytes());
    Ok(())
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
    zeroed[OFF_CSUM..OFF_CSUM + CSUM_LEN].fill(0);
    let mut h = Hasher::new(md).map_err(e)?;
    h.update(&zeroed).map_err(e)?;
    h.update(json_area).map_err(e)?;
    Ok(h.finish().map_err(e)?.to_vec())
}

pub(super) fn be64(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Whether the first bytes of a device look like a LUKS header of any version, and which.
pub fn luks_version(first: &[u8]) -> Option<u16> {
    if first.len() < 8 || &first[..6] != MAGIC_PRIMARY {
        return None;
    }
    Some(u16::from_be_bytes([first[6], first[7]]))
}

impl Luks2Header {
    /// The binary header of one copy, checksum included.
    fn encode_copy(&self, offset: u64, json_area: &[u8]) -> Result<Vec<u8>, LuksError> {
        let mut b = vec![0u8; BINARY_SIZE];
        b[..6].copy_from_slice(if offset == 0 {
            MAGIC_PRIMARY
        } else {
            MAGIC_SECONDARY
        });
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&2u16.to_be_bytes());
        b[OFF_HDR_SIZE..OFF_HDR_SIZE + 8].copy_from_slice(&self.hdr_size.to_be_bytes());
        b[OFF_SEQID..OFF_SEQID + 8].copy_from_slice(&self.seqid.to_be_bytes());
        put_text(
            &mut b[OFF_LABEL..OFF_LABEL + LABEL_LEN],
            &self.label,
            "label",
        )?;
        put_text(
            &mut b[OFF_CSUM_ALG..OFF_CSUM_ALG + CSUM_ALG_LEN],
            &self.checksum_alg,
            "checksum algorithm",
        )?;
        getrandom::getrandom(&mut b[OFF_SALT..OFF_SALT + 64])
            .map_err(|e| LuksError::Crypto(format!("random source: {e}")))?;
        put_text(&mut b[OFF_UUID..OFF_UUID + UUID_LEN], &self.uuid, "uuid")?;
        put_text(
            &mut b[OFF_SUBSYSTEM..OFF_SUBSYSTEM + LABEL_LEN],
            &self.subsystem,
            "subsystem",
        )?;
        b[OFF_HDR_OFFSET..OFF_HDR_OFFSET + 8].copy_from_slice(&offset.to_be_bytes());
        let md = checksum_md(&self.checksum_alg).map_err(LuksError::Unsupported)?;
        let sum = checksum(md, &b, json_area)?;
        b[OFF_CSUM..OFF_CSUM + sum.len()].copy_from_slice(&sum);
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
        self.seqid += 1;
        let bytes = self.encode()?;
        let h = self.hdr_size as usize;
        // Secondary first: if we are cut short, the primary still holds the previous,
        // consistent metadata and a reader falls back cleanly.
        dev.write_at(&bytes[h..], h as u64)?;
        dev.flush()?;
        dev.write_at(&bytes[..h], 0)?;
        dev.flush()?;
        Ok(())
    }

    /// Bytes at the start of the device taken by the headers and the keyslots area.
    pub fn metadata_end(&self) -> u64 {
        2 * self.hdr_size + self.metadata.config.keyslots_size
    }
}
