//! The dm-verity superblock as veritysetup writes it: 512 bytes, little-endian, at the start
//! of the hash area. The kernel never reads it; veritysetup does, to learn the parameters.
//!
//! ```text
//! 0   signature "verity\0\0"   8   version (1)        12  hash_type       16  uuid[16]
//! 32  algorithm[32]            64  data_block_size    68  hash_block_size 72  data_blocks
//! 80  salt_size (u16)          82  pad[6]             88  salt[256]       344 pad[168]
//! ```

use crate::hash::HashAlgorithm;

/// Size of the superblock on disk.
pub const SUPERBLOCK_SIZE: usize = 512;
/// The signature at offset 0.
pub const SIGNATURE: &[u8; 8] = b"verity\0\0";
/// The only superblock version veritysetup writes.
pub const VERSION: u32 = 1;
/// The largest salt the superblock holds.
pub const MAX_SALT_SIZE: usize = 256;

/// The parsed superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Hash type: 0 (Chrome OS, salt after data) or 1 (salt before data, padded digests).
    pub hash_type: u32,
    /// Volume UUID.
    pub uuid: [u8; 16],
    /// Hash algorithm.
    pub algorithm: HashAlgorithm,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Number of data blocks covered.
    pub data_blocks: u64,
    /// Salt.
    pub salt: Vec<u8>,
}

/// Why a superblock was refused; each names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    /// Fewer than 512 bytes.
    #[error("superblock is truncated ({0} bytes, need 512)")]
    Truncated(usize),
    /// Wrong signature.
    #[error("signature: not a verity superblock (no \"verity\" signature)")]
    Signature,
    /// Unsupported version.
    #[error("version: unsupported superblock version {0}")]
    Version(u32),
    /// Unsupported hash type.
    #[error("hash_type: unsupported hash type {0}")]
    HashType(u32),
    /// Unknown or unsupported algorithm.
    #[error("algorithm: unsupported hash algorithm {0:?}")]
    Algorithm(String),
    /// Block size not a power of two in 512..=65536 (data) or too small for a digest.
    #[error("{field}: invalid block size {value}")]
    BlockSize {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// Zero data blocks.
    #[error("data_blocks: must not be zero")]
    DataBlocks,
    /// Salt longer than 256 bytes.
    #[error("salt_size: {0} exceeds 256")]
    SaltSize(u16),
}

/// Whether `size` is a valid verity block size: a power of two in 512..=65536.
pub fn valid_block_size(size: u32) -> bool {
    size.is_power_of_two() && (512..=65536).contains(&size)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

impl Superblock {
    /// Parse and validate 512 bytes. Never trusts a length: the salt size is checked before use.
    pub fn parse(bytes: &[u8]) -> Result<Self, SuperblockError> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(SuperblockError::Truncated(bytes.len()));
        }
        let b = &bytes[..SUPERBLOCK_SIZE];
        if &b[0..8] != SIGNATURE {
            return Err(SuperblockError::Signature);
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(SuperblockError::Version(version));
        }
        let hash_type = u32_at(b, 12);
        if hash_type > 1 {
            return Err(SuperblockError::HashType(hash_type));
        }
        let uuid: [u8; 16] = b[16..32].try_into().expect("16 bytes");
        let alg_raw = &b[32..64];
        let alg_len = alg_raw
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(alg_raw.len());
        let alg_name = String::from_utf8_lossy(&alg_raw[..alg_len]).into_owned();
        let algorithm =
            HashAlgorithm::from_name(&alg_name).ok_or(SuperblockError::Algorithm(alg_name))?;
        let data_block_size = u32_at(b, 64);
        if !valid_block_size(data_block_size) {
            return Err(SuperblockError::BlockSize {
                field: "data_block_size",
                value: data_block_size,
            });
        }
        let hash_block_size = u32_at(b, 68);
        if !valid_block_size(hash_block_size) {
            return Err(SuperblockError::BlockSize {
                field: "hash_block_size",
                value: hash_block_size,
            });
        }
        let data_blocks = u64::from_le_bytes(b[72..80].try_into().expect("8 bytes"));
        if data_blocks == 0 {
            return Err(SuperblockError::DataBlocks);
        }
        let salt_size = u16::from_le_bytes([b[80], b[81]]);
        if salt_size as usize > MAX_SALT_SIZE {
            return Err(SuperblockError::SaltSize(salt_size));
        }
        let salt = b[88..88 + salt_size as usize].to_vec();
        Ok(Superblock {
            hash_type,
            uuid,
            algorithm,
            data_block_size,
            hash_block_size,
            data_blocks,
            salt,
        })
    }

    /// Encode as the 512 bytes veritysetup writes (unused bytes zero).
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        assert!(
            self.salt.len() <= MAX_SALT_SIZE,
            "salt checked by the caller"
        );
        let mut b = [0u8; SUPERBLOCK_SIZE];
        b[0..8].copy_from_slice(SIGNATURE);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.hash_type.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        let name = self.algorithm.name().as_bytes();
        b[32..32 + name.len()].copy_from_slice(name);
        b[64..68].copy_from_slice(&self.data_block_size.to_le_bytes());
        b[68..72].copy_from_slice(&self.hash_block_size.to_le_bytes());
        b[72..80].copy_from_slice(&self.data_blocks.to_le_bytes());
        b[80..82].copy_from_slice(&(self.salt.len() as u16).to_le_bytes());
        b[88..88 + self.salt.len()].copy_from_slice(&self.salt);
        b
    }
}

/// Format a UUID as lowercase 8-4-4-4-12.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h = hex::encode(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Parse a UUID in 8-4-4-4-12 form (or 32 hex digits).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if groups.len() != 1 && lens != [8, 4, 4, 4, 12] {
        return None;
    }
    let compact: String = groups.concat();
    if compact.len() != 32 {
        return None;
    }
    let v = hex::decode(compact).ok()?;
    v.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            hash_type: 1,
            uuid: [0xab; 16],
            algorithm: HashAlgorithm::Sha256,
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: 1234,
            salt: vec![1, 2, 3],
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(&b[0..6], b"verity");
        assert_eq!(&b[32..38], b"sha256");
        assert_eq!(b[80], 3);
        assert_eq!(&b[88..91], &[1, 2, 3]);
        assert_eq!(Superblock::parse(&b).unwrap(), sb);
    }

    #[test]
    fn refuses_bad_fields() {
        let good = sample().encode();
        let mut b = good;
        b[0] = b'x';
        assert_eq!(Superblock::parse(&b), Err(SuperblockError::Signature));
        let mut b = good;
        b[80..82].copy_from_slice(&300u16.to_le_bytes());
        assert_eq!(Superblock::parse(&b), Err(SuperblockError::SaltSize(300)));
        let mut b = good;
        b[64..68].copy_from_slice(&4095u32.to_le_bytes());
        assert!(matches!(
            Superblock::parse(&b),
            Err(SuperblockError::BlockSize { .. })
        ));
        let mut b = good;
        b[32..64].fill(0);
        b[32..35].copy_from_slice(b"md5");
        assert!(matches!(
            Superblock::parse(&b),
            Err(SuperblockError::Algorithm(_))
        ));
        assert_eq!(
            Superblock::parse(&good[..100]),
            Err(SuperblockError::Truncated(100))
        );
    }

    #[test]
    fn uuid_text() {
        let u = parse_uuid("a60c98d2-ae9b-4865-bfcb-b4e3ace11033").unwrap();
        assert_eq!(format_uuid(&u), "a60c98d2-ae9b-4865-bfcb-b4e3ace11033");
        assert!(parse_uuid("a60c98d2-ae9b").is_none());
    }
}
