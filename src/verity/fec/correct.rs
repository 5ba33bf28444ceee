//! Rebuilding one covered block from its round of codewords with the kernel's decoding rules
//! (`verity_fec_decode` in `dm-verity-fec.c`, 6.1): the round's 255 − roots blocks and its
//! parity are read, every codeword is decoded, and the target block is taken from the
//! corrected words.
//!
//! - First pass: errors alone (no erasures). A block that cannot be read is zeros.
//! - Second pass, when the first fails or its result does not hash to what the tree expects:
//!   erasures, found in position order (`fec_read_bufs`): a block that cannot be read, and a
//!   *data* block whose digest fails against the tree; hash-tree blocks are never checked, and
//!   blocks past the covered area are zeros, never erasures. The search stops once roots + 1
//!   erasures are found (the kernel's `neras <= roots` test).
//! - A codeword fails when its syndrome is non-zero and it has more erasures than roots or
//!   more damage than 2·errors + erasures ≤ roots ([`Rs::decode`]); one failed codeword fails
//!   the block. Either pass's result counts only if it hashes to the expected digest.

use super::rs::{Rs, NN};
use super::{FecError, FecGeometry, FecInput};
use crate::block::BlockDevice;

/// Reads rounds and corrects blocks of one FEC area.
pub struct Corrector<'a> {
    rs: Rs,
    geometry: FecGeometry,
    inputs: Vec<FecInput<'a>>,
    fec: &'a dyn BlockDevice,
    fec_offset: u64,
    /// Covered blocks on the data device (the first ones); the rest are hash blocks.
    data_blocks: u64,
}

/// A round read whole: its blocks (zeros past the covered area and where a read failed),
/// the positions that could not be read, and its parity.
struct Round {
    blocks: Vec<u8>,
    unreadable: Vec<usize>,
    parity: Vec<u8>,
}

/// Whether covered data block `index`, read as the bytes given, fails its digest against the
/// tree (`fec_is_erasure`); false when its expected digest cannot be had (the kernel then
/// does not mark it).
pub type IsBad<'f> = &'f dyn Fn(u64, &[u8]) -> bool;

impl<'a> Corrector<'a> {
    /// A corrector of the area `geometry` over `inputs`, whose parity is at `fec_offset` of
    /// `fec`.
    pub fn new(
        geometry: FecGeometry,
        inputs: Vec<FecInput<'a>>,
        fec: &'a dyn BlockDevice,
        fec_offset: u64,
    ) -> Result<Corrector<'a>, FecError> {
        let rs = Rs::new(geometry.roots).ok_or(FecError::Roots(geometry.roots))?;
        let data_blocks = inputs
            .first()
            .map_or(0, |i| i.len / u64::from(geometry.block_size));
        Ok(Corrector {
            data_blocks,
            rs,
            geometry,
            inputs,
            fec,
            fec_offset,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &FecGeometry {
        &self.geometry
    }

    /// The round of covered block `block` and its position among the round's blocks (`block`
    /// below [`FecGeometry::blocks`]).
    pub fn place(&self, block: u64) -> (u64, usize) {
        (
            block % self.geometry.rounds,
            (block / self.geometry.rounds) as usize,
        )
    }

    /// The FEC area blocks whose parity differs from the parity of the covered area read
    /// from `data` and `hash` instead of the corrector's own devices (a view with corrected
    /// blocks in place); see [`super::encode::damaged_parity`].
    pub fn damaged_parity(
        &self,
        data: &dyn BlockDevice,
        hash: &dyn BlockDevice,
    ) -> Result<Vec<u64>, FecError> {
        let inputs = self.inputs_over(data, hash);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        super::encode::damaged_parity(&inputs, &self.geometry, self.fec, self.fec_offset, threads)
    }

    /// Compute the whole FEC area again from `data` and `hash` (a verified view) and write it
    /// over the stored one.
    pub fn rewrite_parity(
        &self,
        data: &dyn BlockDevice,
        hash: &dyn BlockDevice,
        fec: &dyn BlockDevice,
    ) -> Result<(), FecError> {
        let inputs = self.inputs_over(data, hash);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        super::encode::encode(&inputs, &self.geometry, fec, self.fec_offset, threads)?;
        Ok(fec.flush()?)
    }

    /// The same corrector reading its covered ranges from `data` and `hash` (views with
    /// corrected blocks in place) instead of its devices.
    pub fn over<'b>(
        &'b self,
        data: &'b dyn BlockDevice,
        hash: &'b dyn BlockDevice,
    ) -> Corrector<'b> {
        Corrector {
            rs: Rs::new(self.geometry.roots).expect("roots checked by new"),
            geometry: self.geometry,
            inputs: self.inputs_over(data, hash),
            fec: self.fec,
            fec_offset: self.fec_offset,
            data_blocks: self.data_blocks,
        }
    }

    /// The corrector's covered ranges, read from `data` and `hash` instead of its devices.
    fn inputs_over<'b>(
        &self,
        data: &'b dyn BlockDevice,
        hash: &'b dyn BlockDevice,
    ) -> Vec<FecInput<'b>> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, input)| FecInput {
                device: if i == 0 { data } else { hash },
                start: input.start,
                len: input.len,
            })
            .collect()
    }

    fn read_round(&self, round: u64) -> Result<Round, FecError> {
        let g = &self.geometry;
        let bs = g.block_size as usize;
        let mut blocks = vec![0u8; self.rs.data_len() * bs];
        let mut unreadable = Vec::new();
        for (i, b) in blocks.chunks_exact_mut(bs).enumerate() {
            let index = i as u64 * g.rounds + round;
            if index < g.blocks
                && super::encode::read_covered(&self.inputs, index * g.block_size as u64, b)
                    .is_err()
            {
                // The kernel decodes on with the block as zeros ("assume the block is
                // corrupted"), an erasure in the second pass.
                b.fill(0);
                unreadable.push(i);
            }
        }
        let mut parity = vec![0u8; bs * self.rs.roots()];
        // The offset comes from the command line: past the end of the address space the read
        // fails as out of range instead of wrapping.
        let at = (round.saturating_mul(parity.len() as u64)).saturating_add(self.fec_offset);
        self.fec.read_at(&mut parity, at)?;
        Ok(Round {
            blocks,
            unreadable,
            parity,
        })
    }

    /// The erasures of round `round` as the kernel's `fec_read_bufs` finds them: see the
    /// module docs.
    fn erasures(&self, r: &Round, round: u64, is_bad: IsBad<'_>) -> Vec<usize> {
        let g = &self.geometry;
        let bs = g.block_size as usize;
        let cap = self.rs.roots();
        let mut out = Vec::new();
        for i in 0..self.rs.data_len() {
            let index = i as u64 * g.rounds + round;
            if index >= g.blocks {
                continue;
            }
            if r.unreadable.contains(&i) {
                if out.len() <= cap {
                    out.push(i);
                }
                continue;
            }
            if index < self.data_blocks
                && out.len() <= cap
                && is_bad(index, &r.blocks[i * bs..(i + 1) * bs])
            {
                out.push(i);
            }
        }
        out
    }

    /// One pass of the kernel's `fec_decode_rsb` for covered block `block`: without erasures
    /// when `is_bad` is `None`, else with the erasures it finds (module docs). `None` when a
    /// codeword is beyond repair; the second value counts the symbols corrected.
    pub fn decode_pass(
        &self,
        block: u64,
        is_bad: Option<IsBad<'_>>,
    ) -> Result<Option<(Vec<u8>, usize)>, FecError> {
        // A block FEC does not cover has no round (with none covered, no rounds at all).
        if block >= self.geometry.blocks {
            return Ok(None);
        }
        let (round, target) = self.place(block);
        let r = self.read_round(round)?;
        let erasures = is_bad.map_or_else(Vec::new, |f| self.erasures(&r, round, f));
        let bs = self.geometry.block_size as usize;
        let rsn = self.rs.data_len();
        let roots = self.rs.roots();
        let mut out = vec![0u8; bs];
        let mut fixed = 0;
        let mut word = [0u8; NN];
        for (b, o) in out.iter_mut().enumerate() {
            for (i, w) in word[..rsn].iter_mut().enumerate() {
                *w = r.blocks[i * bs + b];
            }
            word[rsn..].copy_from_slice(&r.parity[b * roots..(b + 1) * roots]);
            match self.rs.decode(&mut word, &erasures) {
                Some(n) => fixed += n,
                None => return Ok(None),
            }
            *o = word[target];
        }
        Ok(Some((out, fixed)))
    }

    /// Covered block `block` rebuilt as the kernel's `verity_fec_decode` does: errors alone
    /// first, then with erasures (`is_bad` marks the round's bad data blocks); a pass counts
    /// only if `check` accepts its bytes (they hash to the digest the tree expects).
    pub fn decode(
        &self,
        block: u64,
        is_bad: IsBad<'_>,
        check: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Option<(Vec<u8>, usize)>, FecError> {
        for pass in [None, Some(is_bad)] {
            if let Some((bytes, n)) = self.decode_pass(block, pass)? {
                if check(&bytes) {
                    return Ok(Some((bytes, n)));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{Fault, FaultKind, FaultyDevice, MemoryDevice, OpKind};
    use crate::verity::tests::random_bytes;
    use std::cell::Cell;

    const BS: usize = 512;

    /// Covered data and hash blocks with their FEC area, and the original blocks.
    struct Area {
        data: MemoryDevice,
        hash: MemoryDevice,
        fec: MemoryDevice,
        geometry: FecGeometry,
        data_blocks: u64,
        orig: Vec<Vec<u8>>,
    }

    impl Area {
        /// `roots` with enough blocks for two rounds, the last `hash_blocks` on the hash
        /// device.
        fn new(roots: u8, hash_blocks: u64) -> Area {
            let rsn = 255 - u64::from(roots);
            let blocks = 2 * rsn;
            let data_blocks = blocks - hash_blocks;
            let bytes = random_bytes(blocks as usize * BS, u64::from(roots));
            let (d, h) = bytes.split_at(data_blocks as usize * BS);
            let data = MemoryDevice::from_vec("data", d.to_vec());
            let hash = MemoryDevice::from_vec("hash", h.to_vec());
            let geometry = FecGeometry::new(roots, BS as u32, blocks).unwrap();
            let fec = MemoryDevice::new("fec", geometry.parity_bytes() as usize);
            let inputs = Area::inputs_of(&data, &hash, data_blocks, hash_blocks);
            super::super::encode::encode(&inputs, &geometry, &fec, 0, 1).unwrap();
            let orig = bytes.chunks(BS).map(<[u8]>::to_vec).collect();
            Area {
                data,
                hash,
                fec,
                geometry,
                data_blocks,
                orig,
            }
        }

        fn inputs_of<'a>(
            data: &'a dyn BlockDevice,
            hash: &'a dyn BlockDevice,
            data_blocks: u64,
            hash_blocks: u64,
        ) -> Vec<FecInput<'a>> {
            vec![
                FecInput {
                    device: data,
                    start: 0,
                    len: data_blocks * BS as u64,
                },
                FecInput {
                    device: hash,
                    start: 0,
                    len: hash_blocks * BS as u64,
                },
            ]
        }

        fn corrector<'a>(&'a self, data: &'a dyn BlockDevice) -> Corrector<'a> {
            let hash_blocks = self.geometry.blocks - self.data_blocks;
            let inputs = Area::inputs_of(data, &self.hash, self.data_blocks, hash_blocks);
            Corrector::new(self.geometry, inputs, &self.fec, 0).unwrap()
        }

        /// Overwrite covered block `index` with noise.
        fn damage(&self, index: u64) {
            let noise = random_bytes(BS, 1000 + index);
            if index < self.data_blocks {
                self.data.write_at(&noise, index * BS as u64).unwrap();
            } else {
                let at = (index - self.data_blocks) * BS as u64;
                self.hash.write_at(&noise, at).unwrap();
            }
        }

        /// Covered block `i` of round `round`.
        fn at(&self, round: u64, i: u64) -> u64 {
            i * self.geometry.rounds + round
        }
    }

    /// The oracle the kernel uses (the block's digest against the tree), here the original.
    fn oracle(a: &Area) -> impl Fn(u64, &[u8]) -> bool + '_ {
        move |d, bytes| {
            assert!(d < a.data_blocks, "hash block {d} asked about");
            bytes != a.orig[d as usize]
        }
    }

    #[test]
    fn one_unknown_error_per_codeword_is_corrected_without_erasures() {
        let a = Area::new(2, 10);
        let (x, y) = (a.at(0, 3), a.at(1, 100));
        a.damage(x);
        a.damage(y);
        let c = a.corrector(&a.data);
        for b in [x, y] {
            let (bytes, n) = c.decode_pass(b, None).unwrap().expect("errors alone");
            assert_eq!(bytes, a.orig[b as usize]);
            assert!(n > 0);
        }
    }

    #[test]
    fn up_to_roots_bad_data_blocks_in_a_round_need_the_erasure_pass() {
        for roots in [2u8, 24] {
            let a = Area::new(roots, 10);
            let bad: Vec<u64> = (0..u64::from(roots)).map(|i| a.at(0, 2 * i + 1)).collect();
            for &b in &bad {
                a.damage(b);
            }
            let c = a.corrector(&a.data);
            let is_bad = oracle(&a);
            for &b in &bad {
                let first = c.decode_pass(b, None).unwrap();
                assert!(first.is_none_or(|(bytes, _)| bytes != a.orig[b as usize]));
                let (bytes, _) = c.decode_pass(b, Some(&is_bad)).unwrap().expect("erasures");
                assert_eq!(bytes, a.orig[b as usize], "roots {roots}, block {b}");
                let check = |x: &[u8]| x == a.orig[b as usize];
                assert!(c.decode(b, &is_bad, &check).unwrap().is_some());
            }
        }
    }

    #[test]
    fn more_bad_blocks_in_a_round_than_roots_give_eio() {
        for roots in [2u8, 24] {
            let a = Area::new(roots, 10);
            let bad: Vec<u64> = (0..=u64::from(roots)).map(|i| a.at(1, 2 * i)).collect();
            for &b in &bad {
                a.damage(b);
            }
            let c = a.corrector(&a.data);
            let is_bad = oracle(&a);
            for &b in &bad {
                let check = |x: &[u8]| x == a.orig[b as usize];
                assert!(
                    c.decode(b, &is_bad, &check).unwrap().is_none(),
                    "roots {roots}: {} bad blocks, block {b}",
                    bad.len()
                );
            }
            // The other round is untouched by it.
            let other = a.at(0, 5);
            a.damage(other);
            let check = |x: &[u8]| x == a.orig[other as usize];
            assert!(c.decode(other, &is_bad, &check).unwrap().is_some());
        }
    }

    #[test]
    fn hash_blocks_are_never_erasures() {
        // Round 0 holds data block at(0, 1) and a hash block: with two roots, one erasure
        // and one unknown error are beyond the code, as in the kernel.
        let a = Area::new(2, 10);
        let hash_block = a.at(0, 250);
        assert!(hash_block >= a.data_blocks);
        let data_block = a.at(0, 1);
        a.damage(hash_block);
        a.damage(data_block);
        let c = a.corrector(&a.data);
        let is_bad = oracle(&a);
        for b in [data_block, hash_block] {
            let check = |x: &[u8]| x == a.orig[b as usize];
            assert!(c.decode(b, &is_bad, &check).unwrap().is_none(), "block {b}");
        }
    }

    #[test]
    fn an_unreadable_block_is_an_erasure() {
        let a = Area::new(2, 10);
        let (lost, bad) = (a.at(1, 7), a.at(1, 9));
        a.damage(bad);
        let dev = FaultyDevice::new(MemoryDevice::from_vec("data", a.data.contents()));
        let at = lost * BS as u64;
        dev.arm(Fault {
            op: OpKind::Read,
            offset_range: Some((at, at + BS as u64)),
            nth: 0,
            kind: FaultKind::Fail,
            sticky: true,
        });
        let c = a.corrector(&dev);
        let is_bad = oracle(&a);
        // Zeros and noise: two unknown errors per codeword, then two erasures.
        assert!(c
            .decode_pass(bad, None)
            .unwrap()
            .is_none_or(|(b, _)| b != a.orig[bad as usize]));
        for b in [bad, lost] {
            let (bytes, _) = c.decode_pass(b, Some(&is_bad)).unwrap().expect("erasures");
            assert_eq!(bytes, a.orig[b as usize]);
        }
    }

    #[test]
    fn the_erasure_search_stops_at_roots_plus_one() {
        let a = Area::new(2, 10);
        for i in 0..6 {
            a.damage(a.at(0, 10 + i));
        }
        let c = a.corrector(&a.data);
        let marked = Cell::new(0);
        let is_bad = |d: u64, bytes: &[u8]| {
            let bad = bytes != a.orig[d as usize];
            marked.set(marked.get() + usize::from(bad));
            bad
        };
        assert!(c.decode_pass(a.at(0, 10), Some(&is_bad)).unwrap().is_none());
        assert_eq!(marked.get(), 3, "roots + 1 erasures, then no more lookups");
    }
}
