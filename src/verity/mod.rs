//! dm-verity: a read-only device checked against a hash tree and a root hash, byte-compatible
//! with veritysetup and the kernel.
//!
//! Four faces, as every target: [`format()`] writes the tree (and superblock), [`verify`] checks
//! a device offline, [`superblock`] parses and dumps the metadata, and [`device::VerityDevice`]
//! verifies on read. [`sig`] checks and makes root-hash signatures.
//!
//! [`VerityVolume`] ([`volume`]) is the handle a program uses: it opens and claims the data and
//! hash files, formats, verifies and activates (see its module for an example).

pub mod cache;
pub mod data_cache;
pub mod device;
pub mod fec;
pub mod params;
pub mod sig;
pub mod spec;
pub mod store;
pub mod superblock;
pub mod tree;
pub mod volume;

pub use device::{VerityDevice, VerityOptions, VerityStats};
pub use params::{ParamsError, TreeLayout, VerityParams};
pub use spec::TreeSpec;
pub use superblock::{Superblock, SuperblockError};
pub use tree::VerifyReport;
pub use volume::VerityVolume;

use crate::block::{BlockDevice, BlockError};
use superblock::SUPERBLOCK_SIZE;

/// Errors of the verity layer; each names the device or option at fault.
#[derive(Debug, thiserror::Error)]
pub enum VerityError {
    /// Parameters that cannot describe a tree.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// The superblock could not be read.
    #[error("{device}: {source}")]
    Superblock {
        /// Hash device.
        device: String,
        /// What is wrong.
        source: SuperblockError,
    },
    /// I/O on a device.
    #[error(transparent)]
    Io(#[from] BlockError),
    /// The data device is smaller than the data blocks the tree covers.
    #[error("{device}: data device is too small: {have} bytes, {blocks} data blocks of {block_size} need {need}")]
    DataTooSmall {
        /// Data device.
        device: String,
        /// Its size.
        have: u64,
        /// Bytes needed.
        need: u64,
        /// Data blocks.
        blocks: u64,
        /// Data block size.
        block_size: u32,
    },
    /// The hash device is smaller than the tree.
    #[error("{device}: hash device is truncated: {have} bytes, the hash tree needs {need}")]
    HashTooSmall {
        /// Hash device.
        device: String,
        /// Its size.
        have: u64,
        /// Bytes needed.
        need: u64,
    },
    /// Data and hash areas overlap in one file.
    #[error("--hash-offset: hash area at byte {hash_offset} overlaps the data area ending at byte {data_end}")]
    Overlap {
        /// Start of the hash area.
        hash_offset: u64,
        /// End of the data area.
        data_end: u64,
    },
    /// The root hash argument is not hex of the right length.
    #[error("root hash: {0}")]
    RootHash(String),
}

/// Result type of the verity layer.
pub type Result<T> = std::result::Result<T, VerityError>;

/// Parse a hex root hash for `params`' algorithm.
pub fn parse_root_hash(text: &str, params: &VerityParams) -> Result<Vec<u8>> {
    let text = text.trim();
    let bytes = hex::decode(text)
        .map_err(|_| VerityError::RootHash(format!("{text:?} is not a hex string")))?;
    let want = params.hash.digest_size();
    if bytes.len() != want {
        return Err(VerityError::RootHash(format!(
            "{} bytes, {} needs {}",
            bytes.len(),
            params.hash,
            want
        )));
    }
    Ok(bytes)
}

/// Read the superblock at `hash_offset` of the hash device.
pub fn read_superblock(hash: &dyn BlockDevice, hash_offset: u64) -> Result<Superblock> {
    let sb_err = |source| VerityError::Superblock {
        device: hash.name().to_string(),
        source,
    };
    let have = hash.size().saturating_sub(hash_offset);
    if have < SUPERBLOCK_SIZE as u64 {
        return Err(sb_err(SuperblockError::Truncated(have as usize)));
    }
    let mut buf = [0u8; SUPERBLOCK_SIZE];
    hash.read_at(&mut buf, hash_offset)?;
    Superblock::parse(&buf).map_err(sb_err)
}

/// Check that the devices are large enough for `params`, and that data and hash areas do not
/// overlap when they share a file (`same_file`).
pub fn check_sizes(
    data: &dyn BlockDevice,
    hash: &dyn BlockDevice,
    params: &VerityParams,
    layout: &TreeLayout,
    same_file: bool,
) -> Result<()> {
    let need = params.data_size();
    if data.size() < need {
        return Err(VerityError::DataTooSmall {
            device: data.name().to_string(),
            have: data.size(),
            need,
            blocks: params.data_blocks,
            block_size: params.data_block_size,
        });
    }
    if same_file && need > params.hash_offset {
        return Err(VerityError::Overlap {
            hash_offset: params.hash_offset,
            data_end: need,
        });
    }
    let need = layout.required_hash_size();
    if hash.size() < need {
        return Err(VerityError::HashTooSmall {
            device: hash.name().to_string(),
            have: hash.size(),
            need,
        });
    }
    Ok(())
}

/// Build the tree over `data` and write it (and the superblock) to `hash`; returns the root
/// hash. The hash device must already be large enough (see [`TreeLayout::required_hash_size`]).
pub fn format(
    data: &dyn BlockDevice,
    hash: &dyn BlockDevice,
    params: &VerityParams,
    same_file: bool,
) -> Result<Vec<u8>> {
    params.validate()?;
    let layout = TreeLayout::new(params)?;
    check_sizes(data, hash, params, &layout, same_file)?;
    let tree = tree::build(data, params, &layout)?;
    tree::write(hash, &layout, &tree)?;
    if params.superblock {
        hash.write_at(&params.to_superblock().encode(), params.hash_offset)?;
    }
    hash.flush()?;
    Ok(tree.root)
}

/// Check every data and hash block against `root` offline.
pub fn verify(
    data: &dyn BlockDevice,
    hash: &dyn BlockDevice,
    params: &VerityParams,
    root: &[u8],
    same_file: bool,
) -> Result<VerifyReport> {
    params.validate()?;
    let layout = TreeLayout::new(params)?;
    check_sizes(data, hash, params, &layout, same_file)?;
    Ok(tree::verify(data, hash, params, &layout, root)?)
}

#[cfg(test)]
pub(crate) mod tests;
