//! `image validate`: read every data block of the root partition through the verified path
//! (each block hashed up the tree to the checked root hash, FEC-corrected where parity is
//! stored), and name the blocks that do not verify.

use crate::block::BlockDevice;

/// What a full read found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Validation {
    /// Blocks read.
    pub blocks: u64,
    /// The block size.
    pub block_size: u64,
    /// Blocks that failed verification (the first 64).
    pub bad_blocks: Vec<u64>,
    /// How many failed in all.
    pub bad_count: u64,
}

/// Read all of `dev` in `block_size` blocks, 1 MiB at a time; a failed chunk is read again
/// block by block to find which blocks fail.
pub fn read_all(dev: &dyn BlockDevice, block_size: u64) -> Validation {
    let size = dev.size();
    let chunk = (1u64 << 20).max(block_size) / block_size * block_size;
    let mut buf = vec![0u8; chunk as usize];
    let mut v = Validation {
        blocks: size / block_size,
        block_size,
        bad_blocks: Vec::new(),
        bad_count: 0,
    };
    let mut off = 0;
    while off + block_size <= size {
        let len = chunk.min((size - off) / block_size * block_size);
        if dev.read_at(&mut buf[..len as usize], off).is_err() {
            for b in (off..off + len).step_by(block_size as usize) {
                if dev.read_at(&mut buf[..block_size as usize], b).is_err() {
                    v.bad_count += 1;
                    if v.bad_blocks.len() < 64 {
                        v.bad_blocks.push(b / block_size);
                    }
                }
            }
        }
        off += len;
    }
    v
}
