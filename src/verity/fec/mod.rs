//! dm-verity forward error correction: Reed-Solomon parity over the data and the hash tree,
//! stored beside them, as veritysetup writes it and the kernel's `dm-verity-fec.c` reads it.
//!
//! The verity superblock has no FEC fields, so the FEC device, its offset and the number of
//! parity bytes per codeword (`roots`) are given on every command, as with veritysetup.
//! [`FecGeometry`] is what they imply (the blocks covered and the rounds of codewords),
//! [`rs`] the code, [`encode`] the area veritysetup's `format --fec-device` writes, and
//! [`write`](mod@write) puts it in its file.

pub mod correct;
pub mod encode;
pub mod repair;
pub mod rs;
pub mod source;
pub mod write;

use super::params::VerityParams;
use crate::block::{BlockDevice, BlockError, ClaimError, OpenError};

/// veritysetup's default number of parity bytes per codeword.
pub const DEFAULT_ROOTS: u8 = 2;

/// What can go wrong computing or reading FEC; each names the option or device at fault.
#[derive(Debug, thiserror::Error)]
pub enum FecError {
    /// `--fec-roots` outside 2..=24.
    #[error("--fec-roots: {0} parity bytes per codeword is not supported (2 to 24)")]
    Roots(u8),
    /// FEC needs one block size for data and hashes.
    #[error("--fec-device: data block size {data} and hash block size {hash} differ; FEC needs them equal")]
    BlockSizes {
        /// Data block size.
        data: u32,
        /// Hash block size.
        hash: u32,
    },
    /// `--fec-offset` not a multiple of 512.
    #[error("--fec-offset: {0} is not a multiple of 512")]
    Offset(u64),
    /// The FEC area would end past the largest byte offset.
    #[error("--fec-offset: a FEC area of {size} bytes at byte {offset} ends past the largest device offset")]
    OffsetRange {
        /// The FEC offset.
        offset: u64,
        /// The area's size.
        size: u64,
    },
    /// The FEC area would overlap the hash area or the data in the same file.
    #[error(
        "--fec-offset: the FEC area at byte {offset} overlaps the {what} ending at byte {end}"
    )]
    Overlap {
        /// The FEC offset.
        offset: u64,
        /// "hash area" or "data area".
        what: &'static str,
        /// Where that area ends.
        end: u64,
    },
    /// I/O on a device.
    #[error(transparent)]
    Io(#[from] BlockError),
    /// The FEC file could not be created, opened or extended.
    #[error("{}: cannot {what} the FEC device: {source}", path.display())]
    File {
        /// The FEC file.
        path: std::path::PathBuf,
        /// "create" or "extend".
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The FEC file could not be opened as a device.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The FEC area is in use by another device.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The FEC device is shorter than the area the parameters need.
    #[error("{device}: FEC device is truncated: {have} bytes, the FEC area needs {need}")]
    Truncated {
        /// The FEC device.
        device: String,
        /// Its size.
        have: u64,
        /// Bytes needed.
        need: u64,
    },
    /// A worker thread panicked.
    #[error("FEC: a worker thread failed")]
    Worker,
}

impl FecError {
    /// veritysetup's exit code: 4 for a FEC file that cannot be opened or created, 5 for one
    /// in use, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            FecError::File { .. } => 4,
            FecError::Open(e) => e.exit_code(),
            FecError::Claim(ClaimError::Busy { .. }) => 5,
            _ => 1,
        }
    }
}

/// One part of the area FEC covers: `len` bytes at `start` of `device`.
#[derive(Clone, Copy)]
pub struct FecInput<'a> {
    /// The device.
    pub device: &'a dyn BlockDevice,
    /// First byte covered.
    pub start: u64,
    /// Bytes covered.
    pub len: u64,
}

/// The shape of a FEC area (`fec_context` in cryptsetup, `dm_verity_fec` in the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FecGeometry {
    /// Parity bytes per codeword.
    pub roots: u8,
    /// Block size (data and hash block sizes are equal with FEC).
    pub block_size: u32,
    /// Blocks covered: the data blocks, then the hash device's blocks from the first one
    /// after the superblock to its end (or to the FEC area when it shares the hash device).
    pub blocks: u64,
    /// Rounds of `block_size` codewords: blocks / (255 − roots), rounded up.
    pub rounds: u64,
}

impl FecGeometry {
    /// The geometry for `blocks` covered blocks.
    pub fn new(roots: u8, block_size: u32, blocks: u64) -> Result<FecGeometry, FecError> {
        let rs = rs::Rs::new(roots).ok_or(FecError::Roots(roots))?;
        Ok(FecGeometry {
            roots,
            block_size,
            blocks,
            rounds: blocks.div_ceil(rs.data_len() as u64),
        })
    }

    /// Bytes of parity: `rounds × roots` blocks (`VERITY_FEC_RS_blocks`).
    pub fn parity_bytes(&self) -> u64 {
        // Saturating: a size past the address space is refused by [`layout`], not wrapped.
        self.rounds
            .saturating_mul(u64::from(self.roots))
            .saturating_mul(u64::from(self.block_size))
    }
}

/// The first hash-device block FEC covers: the one after the superblock
/// (`VERITY_hash_offset_block`).
pub fn hash_offset_block(p: &VerityParams) -> u64 {
    let bs = u64::from(p.hash_block_size);
    if p.superblock {
        (p.hash_offset + super::superblock::SUPERBLOCK_SIZE as u64).div_ceil(bs)
    } else {
        p.hash_offset / bs
    }
}

/// Where FEC goes and how strong it is, as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FecOptions {
    /// Parity bytes per codeword (`--fec-roots`).
    pub roots: u8,
    /// Byte offset of the FEC area in the FEC device (`--fec-offset`).
    pub offset: u64,
}

impl Default for FecOptions {
    fn default() -> Self {
        FecOptions {
            roots: DEFAULT_ROOTS,
            offset: 0,
        }
    }
}

/// The geometry and covered inputs of `p`'s FEC (`VERITY_FEC_blocks`, `VERITY_FEC_process`):
/// the data blocks of `data`, then `hash` from [`hash_offset_block`] to its end, or to the FEC
/// area when the FEC lives in the hash device (`fec_in_hash`).
pub fn layout<'a>(
    p: &VerityParams,
    opts: &FecOptions,
    data: &'a dyn BlockDevice,
    hash: &'a dyn BlockDevice,
    fec_in_hash: bool,
    fec_in_data: bool,
) -> Result<(FecGeometry, Vec<FecInput<'a>>), FecError> {
    if p.data_block_size != p.hash_block_size {
        return Err(FecError::BlockSizes {
            data: p.data_block_size,
            hash: p.hash_block_size,
        });
    }
    if !opts.offset.is_multiple_of(512) {
        return Err(FecError::Offset(opts.offset));
    }
    let bs = u64::from(p.hash_block_size);
    let first = hash_offset_block(p);
    if fec_in_data && p.data_size() > opts.offset {
        return Err(FecError::Overlap {
            offset: opts.offset,
            what: "data area",
            end: p.data_size(),
        });
    }
    let hash_end = if fec_in_hash {
        // veritysetup's check: the hash offset plus the tree's blocks (not counting the
        // superblock's block) must end by the FEC offset.
        let tree_end = super::params::TreeLayout::new(p)
            .map(|l| {
                p.hash_offset
                    .saturating_add(l.tree_blocks().saturating_mul(bs))
            })
            .unwrap_or(0);
        if tree_end > opts.offset {
            return Err(FecError::Overlap {
                offset: opts.offset,
                what: "hash area",
                end: tree_end,
            });
        }
        opts.offset / bs
    } else {
        hash.size() / bs
    };
    let hash_blocks = hash_end.saturating_sub(first);
    let geometry = FecGeometry::new(
        opts.roots,
        p.data_block_size,
        p.data_blocks.saturating_add(hash_blocks),
    )?;
    // Every user of the area adds its size to the offset: it must end in the address space.
    if opts.offset.checked_add(geometry.parity_bytes()).is_none()
        || geometry.parity_bytes() == u64::MAX
    {
        return Err(FecError::OffsetRange {
            offset: opts.offset,
            size: geometry.parity_bytes(),
        });
    }
    let mut inputs = vec![FecInput {
        device: data,
        start: 0,
        len: p.data_size(),
    }];
    if hash_blocks > 0 {
        inputs.push(FecInput {
            device: hash,
            start: first * bs,
            len: hash_blocks * bs,
        });
    }
    Ok((geometry, inputs))
}
