//! Rebuilding one covered block from its round of codewords, as the kernel's
//! `verity_fec_decode` does: the round's 255 − roots blocks and its parity are read, every
//! codeword is decoded, and the target block is taken from the corrected words. Errors alone
//! are tried first; then, with the blocks already known to be bad marked as erasures (each
//! counts half an error), as the kernel retries with erasures.

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
}

/// A round read whole: its blocks (zeros past the covered area) and its parity.
struct Round {
    blocks: Vec<u8>,
    parity: Vec<u8>,
}

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
        Ok(Corrector {
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
        for (i, b) in blocks.chunks_exact_mut(bs).enumerate() {
            let index = i as u64 * g.rounds + round;
            if index < g.blocks {
                super::encode::read_covered(&self.inputs, index * g.block_size as u64, b)?;
            }
        }
        let mut parity = vec![0u8; bs * self.rs.roots()];
        // The offset comes from the command line: past the end of the address space the read
        // fails as out of range instead of wrapping.
        let at = (round.saturating_mul(parity.len() as u64)).saturating_add(self.fec_offset);
        self.fec.read_at(&mut parity, at)?;
        Ok(Round { blocks, parity })
    }

    /// Covered block `block` rebuilt from its round, with the round's blocks in `bad` (covered
    /// indexes, the target among them or not) as erasures. `None` when a codeword is beyond
    /// repair. The second value counts the symbols corrected in the round's codewords.
    pub fn correct(&self, block: u64, bad: &[u64]) -> Result<Option<(Vec<u8>, usize)>, FecError> {
        // A block FEC does not cover has no round (with none covered, no rounds at all).
        if block >= self.geometry.blocks {
            return Ok(None);
        }
        let (round, target) = self.place(block);
        let r = self.read_round(round)?;
        let bs = self.geometry.block_size as usize;
        let rsn = self.rs.data_len();
        let roots = self.rs.roots();
        let mut erasures: Vec<usize> = bad
            .iter()
            .filter(|&&b| b < self.geometry.blocks && self.place(b).0 == round)
            .map(|&b| self.place(b).1)
            .collect();
        erasures.sort_unstable();
        erasures.dedup();
        if erasures.len() > roots {
            return Ok(None);
        }
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
}
