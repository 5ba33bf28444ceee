//! One dm-verity parameter set, as veritysetup and `dmkit verity` both take it.

/// A dm-verity parameter set: hash, block sizes, data size, salt, format, superblock and where
/// the hash area is.
#[derive(Debug, Clone)]
pub struct VerityCase {
    /// A name for the case's files (`NAME.data`, `NAME.hash`, ...).
    pub name: String,
    /// `sha1`, `sha256` or `sha512`.
    pub hash: &'static str,
    pub data_block_size: u64,
    pub hash_block_size: u64,
    /// Size of the data in bytes (a partial last block is not covered).
    pub data_size: u64,
    /// Hex, or "-" for none.
    pub salt: String,
    /// `--format`: 0 (Chrome OS) or 1.
    pub hash_type: u32,
    pub superblock: bool,
    /// Hash area inside the data file at this offset (the data blocks are then given
    /// explicitly).
    pub hash_offset: Option<u64>,
}

impl VerityCase {
    /// Whole data blocks covered.
    pub fn data_blocks(&self) -> u64 {
        self.data_size / self.data_block_size
    }

    /// Size of one digest of `hash` in bytes.
    pub fn digest_size(&self) -> u64 {
        match self.hash {
            "sha1" => 20,
            "sha256" => 32,
            "sha512" => 64,
            h => panic!("no digest size for {h}"),
        }
    }

    /// Options both tools take for format (and for verify and open without a superblock).
    pub fn tree_options(&self) -> Vec<String> {
        let mut o = vec![
            format!("--hash={}", self.hash),
            format!("--data-block-size={}", self.data_block_size),
            format!("--hash-block-size={}", self.hash_block_size),
            format!("--salt={}", self.salt),
            format!("--format={}", self.hash_type),
        ];
        if !self.superblock {
            o.push("--no-superblock".into());
        }
        if let Some(off) = self.hash_offset {
            o.push(format!("--hash-offset={off}"));
            o.push(format!("--data-blocks={}", self.data_blocks()));
        }
        o
    }

    /// Options both tools take for verify and open: with a superblock only where it is.
    pub fn open_options(&self) -> Vec<String> {
        if self.superblock {
            match self.hash_offset {
                Some(off) => vec![format!("--hash-offset={off}")],
                None => vec![],
            }
        } else {
            self.tree_options()
        }
    }
}
