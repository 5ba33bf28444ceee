//! The FEC area behind a verified device: when a block's digest fails on read, it is rebuilt
//! from its round with the kernel's rules ([`Corrector::decode`]: errors alone, then with the
//! round's bad data blocks as erasures) and served only if its digest then matches what the
//! tree expects.

use super::correct::{Corrector, IsBad};
use super::{hash_offset_block, layout, FecError, FecGeometry, FecInput, FecOptions};
use crate::block::BlockDevice;
use crate::verity::VerityParams;
use std::sync::Arc;

/// A FEC area opened for a verified device.
pub struct FecSource {
    device: Arc<dyn BlockDevice>,
    geometry: FecGeometry,
    offset: u64,
    /// Bytes of data covered.
    data_len: u64,
    /// The covered part of the hash device: first byte and length.
    hash_range: (u64, u64),
    /// The first covered hash block (absolute, in hash-block units).
    first_hash_block: u64,
}

impl FecSource {
    /// The FEC area of `p` in `device` at `opts.offset`, over `data` and `hash`; `fec_in_hash`
    /// when it shares the hash file.
    pub fn new(
        p: &VerityParams,
        opts: &FecOptions,
        device: Arc<dyn BlockDevice>,
        data: &dyn BlockDevice,
        hash: &dyn BlockDevice,
        fec_in_hash: bool,
    ) -> Result<FecSource, FecError> {
        let (geometry, inputs) = layout(p, opts, data, hash, fec_in_hash, false)?;
        let hash_range = inputs.get(1).map_or((0, 0), |i| (i.start, i.len));
        let need = opts.offset + geometry.parity_bytes();
        if device.size() < need {
            return Err(FecError::Truncated {
                device: device.name().to_string(),
                have: device.size(),
                need,
            });
        }
        Ok(FecSource {
            device,
            geometry,
            offset: opts.offset,
            data_len: p.data_size(),
            hash_range,
            first_hash_block: hash_offset_block(p),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &FecGeometry {
        &self.geometry
    }

    /// The covered index of data block `block`.
    pub fn data_index(&self, block: u64) -> u64 {
        block
    }

    /// The covered index of hash block `abs` (absolute), if FEC covers it.
    pub fn hash_index(&self, abs: u64) -> Option<u64> {
        let data_blocks = self.data_len / u64::from(self.geometry.block_size);
        (abs >= self.first_hash_block).then(|| data_blocks + abs - self.first_hash_block)
    }

    /// Covered block `index` rebuilt from its round, if one of the kernel's two passes gives
    /// bytes that `check` accepts (their digest is the one the tree expects); `is_bad` tells
    /// the erasure pass which of the round's data blocks fail their digest. `hash` is the
    /// hash device as the kernel's FEC sees it (with the hash blocks already corrected).
    pub fn rebuild(
        &self,
        data: &dyn BlockDevice,
        hash: &dyn BlockDevice,
        index: u64,
        is_bad: IsBad<'_>,
        check: impl Fn(&[u8]) -> bool,
    ) -> Result<Option<Vec<u8>>, FecError> {
        let mut inputs = vec![FecInput {
            device: data,
            start: 0,
            len: self.data_len,
        }];
        if self.hash_range.1 > 0 {
            inputs.push(FecInput {
                device: hash,
                start: self.hash_range.0,
                len: self.hash_range.1,
            });
        }
        let c = Corrector::new(self.geometry, inputs, &*self.device, self.offset)?;
        Ok(c.decode(index, is_bad, &check)?.map(|(bytes, _)| bytes))
    }
}
