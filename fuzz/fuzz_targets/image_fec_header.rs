//! Arbitrary bytes as the last block of an image's verity partition (the libfec fec_header
//! and its backup copy): parsing never panics, a header that parses writes back to a block
//! that parses to it, and checking it against a verity tree never panics whatever its sizes.

#![no_main]

use dmkit::block::MemoryDevice;
use dmkit::hash::HashAlgorithm;
use dmkit::image::fecheader::{find, FecHeader, BLOCK};
use dmkit::verity::VerityParams;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(h)) = FecHeader::parse(data) {
        let block = h.block();
        assert_eq!(FecHeader::parse(&block).unwrap(), Some(h));
        assert_eq!(FecHeader::parse(&block[block.len() - 60..]).unwrap(), Some(h));
    }
    // A partition of a few blocks ending with the input as its last block, over a tree of
    // up to 1000 data blocks (the first byte picks how many).
    let blocks = data.first().map_or(1, |b| u64::from(*b) * 4 + 1);
    let params = VerityParams {
        hash: HashAlgorithm::Sha256,
        hash_type: 1,
        data_block_size: 4096,
        hash_block_size: 4096,
        data_blocks: blocks,
        hash_offset: 0,
        salt: vec![0; 32],
        uuid: [0; 16],
        superblock: true,
    };
    let mut part = vec![0u8; (4 * BLOCK) as usize];
    let tail = data.len().min(BLOCK as usize);
    let start = part.len() - BLOCK as usize;
    part[start..start + tail].copy_from_slice(&data[..tail]);
    let dev = MemoryDevice::from_vec("verity partition", part);
    let _ = find(&dev, &params);
});
