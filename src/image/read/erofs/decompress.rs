//! Decompressing one EROFS extent (the kernel's `fs/erofs/decompressor.c`): LZ4 block data
//! (with the 0PADDING feature the compressed bytes end their pcluster and leading zeros pad
//! them) or a PLAIN pcluster (the extent's bytes from the pcluster's start). A small cache
//! keeps the last extents decompressed, since reads of a file come in pieces smaller than an
//! extent.

use super::super::{ReadError, Result, Source};
use super::zmap::{Codec, Extent, FEATURE_LZ4_0PADDING};
use std::sync::{Arc, Mutex};

/// Decompressed extents kept: with [`super::zmap::MAX_EXTENT`] each, at most 32 MiB.
const CACHED: usize = 4;

/// One cached extent: inode, first byte, bytes.
type Cached = (u64, u64, Arc<Vec<u8>>);

/// The extents decompressed last, by (inode, first byte).
#[derive(Default)]
pub struct ExtentCache {
    entries: Mutex<Vec<Cached>>,
}

impl ExtentCache {
    /// The cached extent of inode `nid` that holds byte `pos`: its first byte and its bytes.
    pub fn find(&self, nid: u64, pos: u64) -> Option<(u64, Arc<Vec<u8>>)> {
        let e = self.entries.lock().expect("extent cache lock");
        e.iter()
            .find(|(n, la, d)| *n == nid && *la <= pos && pos - la < d.len() as u64)
            .map(|(_, la, d)| (*la, d.clone()))
    }

    /// Keep `data`, the extent of inode `nid` starting at byte `la`.
    pub fn insert(&self, nid: u64, la: u64, data: Arc<Vec<u8>>) {
        let mut e = self.entries.lock().expect("extent cache lock");
        if e.len() >= CACHED {
            e.remove(0);
        }
        e.push((nid, la, data));
    }
}

/// The decompressed bytes of extent `x` of inode `nid`, read through `src`. A read error of a
/// pcluster block (a verity failure) fails only the extents using that block.
pub fn extent(
    src: &Source,
    features: u32,
    block_size: u64,
    nid: u64,
    x: &Extent,
) -> Result<Vec<u8>> {
    let corrupt = |what: String| ReadError::Corrupt(format!("inode {nid}: {what}"));
    let input = src.read_vec(x.pa, x.plen, super::zmap::MAX_PCLUSTER)?;
    let llen = x.llen as usize;
    match x.codec {
        Codec::Plain => {
            if x.llen > x.plen || (!x.inline && x.plen > block_size) {
                return Err(corrupt(format!(
                    "uncompressed extent of {} bytes in a pcluster of {}",
                    x.llen, x.plen
                )));
            }
            Ok(input[..llen].to_vec())
        }
        Codec::Lz4 => {
            if features & FEATURE_LZ4_0PADDING == 0 {
                // Without 0PADDING the data starts the pcluster with garbage after it, which
                // needs a decoder that stops at the output's end; erofs-utils sets 0PADDING
                // for every compressed image since 1.3 unless told `-E legacy-compress`.
                return Err(ReadError::Unsupported(format!(
                    "inode {nid}: LZ4 EROFS data without the 0PADDING feature (made with \
                     -E legacy-compress) is not read"
                )));
            }
            // Leading zeros within the first block pad the compressed bytes to their end.
            let first = (block_size as usize).min(input.len());
            let margin = input[..first].iter().take_while(|&&b| b == 0).count();
            if margin >= input.len() {
                return Err(corrupt(format!(
                    "compressed pcluster at byte {} is all zeros",
                    x.pa
                )));
            }
            let mut out = vec![0u8; llen];
            match lz4_flex::block::decompress_into(&input[margin..], &mut out) {
                Ok(n) if n == llen => Ok(out),
                Ok(n) => Err(corrupt(format!(
                    "LZ4 pcluster at byte {} gives {n} bytes, the extent has {llen}",
                    x.pa
                ))),
                Err(e) => Err(corrupt(format!(
                    "LZ4 pcluster at byte {} does not decompress: {e}",
                    x.pa
                ))),
            }
        }
    }
}
