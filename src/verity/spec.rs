//! Tree parameters as a user gives them (veritysetup's options), turned into [`VerityParams`]
//! for a data device: what `format` uses, and `verify`/`open` without a superblock.

use super::VerityParams;
use crate::block::BlockDevice;
use crate::hash::HashAlgorithm;

/// Tree parameters before they meet a data device: the data block count may be left to the
/// device's size and the salt to a default.
#[derive(Debug, Clone)]
pub struct TreeSpec {
    /// Hash algorithm name: sha256, sha1 or sha512.
    pub hash: String,
    /// Block size on the data device.
    pub data_block_size: u32,
    /// Block size on the hash device.
    pub hash_block_size: u32,
    /// Number of data blocks (None: all complete blocks of the data device).
    pub data_blocks: Option<u64>,
    /// Byte offset of the hash area (superblock first) in the hash device.
    pub hash_offset: u64,
    /// Salt as hex, or `-` for none (None: the caller's default).
    pub salt: Option<String>,
    /// Hash type: 1 (normal) or 0 (original Chrome OS).
    pub hash_type: u32,
    /// Whether a superblock is written and read.
    pub superblock: bool,
}

impl Default for TreeSpec {
    /// veritysetup's defaults: sha256, 4096-byte blocks, hash type 1, a superblock at 0.
    fn default() -> Self {
        TreeSpec {
            hash: "sha256".to_string(),
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: None,
            hash_offset: 0,
            salt: None,
            hash_type: 1,
            superblock: true,
        }
    }
}

/// Parse a salt given as hex (`-`: none); at most 256 bytes, as the superblock holds.
pub fn parse_salt(s: &str) -> Result<Vec<u8>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    let salt = hex::decode(s).map_err(|_| format!("--salt: {s:?} is not a hex string"))?;
    if salt.len() > 256 {
        return Err(format!("--salt: {} bytes is longer than 256", salt.len()));
    }
    Ok(salt)
}

impl TreeSpec {
    /// The parameters for `data` (the UUID left zero): `default_salt` unless a salt is given,
    /// the data block count checked against (or taken from) the device's size. The error is
    /// the message naming the option or device at fault.
    pub fn params(
        &self,
        data: &dyn BlockDevice,
        default_salt: Vec<u8>,
    ) -> Result<VerityParams, String> {
        let hash = HashAlgorithm::from_name(&self.hash)
            .ok_or_else(|| format!("--hash: unsupported hash algorithm {:?}", self.hash))?;
        let salt = match &self.salt {
            Some(s) => parse_salt(s)?,
            None => default_salt,
        };
        let dbs = self.data_block_size as u64;
        let available = data.size().checked_div(dbs).unwrap_or(0);
        let data_blocks = match self.data_blocks {
            Some(n) if n > available => {
                return Err(format!(
                    "{}: data device is too small: --data-blocks {n} of {dbs} bytes needs {} bytes, it has {}",
                    data.name(),
                    n.saturating_mul(dbs),
                    data.size()
                ))
            }
            Some(n) => n,
            None => available,
        };
        if data_blocks == 0 {
            return Err(format!(
                "{}: data device is too small: {} bytes hold no complete {dbs}-byte data block",
                data.name(),
                data.size()
            ));
        }
        let p = VerityParams {
            hash,
            hash_type: self.hash_type,
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks,
            hash_offset: self.hash_offset,
            salt,
            uuid: [0; 16],
            superblock: self.superblock,
        };
        p.validate().map_err(|e| e.to_string())?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salt_parsing() {
        assert_eq!(parse_salt("-").unwrap(), Vec::<u8>::new());
        assert_eq!(parse_salt("0aff").unwrap(), vec![0x0a, 0xff]);
        assert!(parse_salt("xyz").is_err());
        assert!(parse_salt(&"00".repeat(257)).is_err());
    }
}
