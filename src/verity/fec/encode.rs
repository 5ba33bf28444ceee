//! Computing the FEC area of a verity device, byte-identical to `veritysetup format
//! --fec-device` (`FEC_process_inputs` in cryptsetup's `lib/verity/verity_fec.c`).
//!
//! The covered area is the data blocks followed by the hash area (after the superblock), seen
//! as one sequence of `blocks` blocks padded with zero blocks to `rounds × rsn` (rsn = 255 −
//! roots). Codeword `(n, b)` of round `n` takes byte `b` of blocks `n, rounds + n, 2·rounds +
//! n, ...`: the interleaving spreads each codeword over blocks far apart, so one unreadable
//! block costs every codeword only one symbol. Round `n` stores `block_size` codewords'
//! parity, `roots` bytes each, at `n × block_size × roots` in the FEC area.
//!
//! Rounds are independent, so threads take runs of consecutive rounds; for each of the rsn
//! columns a run needs consecutive blocks, read in one call.

use super::rs::Rs;
use super::{FecError, FecGeometry, FecInput};
use crate::block::BlockDevice;

/// Rounds one thread encodes per pass: its blocks of one column are read in one call.
const ROUNDS_PER_PASS: u64 = 32;

/// Read `buf.len()` bytes at `offset` of the covered area (the inputs back to back, zeros
/// after them).
pub(super) fn read_covered(
    inputs: &[FecInput<'_>],
    mut offset: u64,
    buf: &mut [u8],
) -> Result<(), FecError> {
    let mut done = 0;
    for input in inputs {
        if done == buf.len() {
            break;
        }
        if offset >= input.len {
            offset -= input.len;
            continue;
        }
        let n = ((input.len - offset) as usize).min(buf.len() - done);
        input
            .device
            .read_at(&mut buf[done..done + n], input.start + offset)?;
        done += n;
        offset = 0;
    }
    buf[done..].fill(0);
    Ok(())
}

/// Encode rounds `first..first + count` into `out` (`count × block_size × roots` bytes).
fn encode_rounds(
    rs: &Rs,
    g: &FecGeometry,
    inputs: &[FecInput<'_>],
    first: u64,
    count: u64,
    out: &mut [u8],
) -> Result<(), FecError> {
    let bs = g.block_size as usize;
    let roots = rs.roots();
    let count_usize = count as usize;
    let mut blocks = vec![0u8; count_usize * bs];
    let mut registers = vec![0u8; count_usize * roots * bs];
    let mut heads = vec![0usize; count_usize];
    for i in 0..rs.data_len() as u64 {
        read_covered(
            inputs,
            (i * g.rounds + first) * u64::from(g.block_size),
            &mut blocks,
        )?;
        for (r, block) in blocks.chunks_exact(bs).enumerate() {
            let regs = &mut registers[r * roots * bs..][..roots * bs];
            heads[r] = rs.feed_column(regs, bs, heads[r], block);
        }
    }
    for (r, parity) in out.chunks_exact_mut(roots * bs).enumerate() {
        rs.parity_out(
            &registers[r * roots * bs..][..roots * bs],
            bs,
            heads[r],
            parity,
        );
    }
    Ok(())
}

/// What receives a run of rounds' parity: the first round's number and the bytes.
type ParitySink<'a> = dyn Fn(u64, &[u8]) -> Result<(), FecError> + Sync + 'a;

/// Compute the parity of every round of `inputs` on `threads` threads, handing each run of
/// rounds to `sink(first_round, parity)`; runs are disjoint, in no particular order.
fn for_each_pass(
    inputs: &[FecInput<'_>],
    g: &FecGeometry,
    threads: usize,
    sink: &ParitySink<'_>,
) -> Result<(), FecError> {
    let rs = Rs::new(g.roots).ok_or(FecError::Roots(g.roots))?;
    let round_bytes = g.block_size as u64 * u64::from(g.roots);
    let threads = threads.clamp(1, 64) as u64;
    // Passes of ROUNDS_PER_PASS rounds each; thread t takes every threads-th pass.
    let passes = g.rounds.div_ceil(ROUNDS_PER_PASS);
    std::thread::scope(|s| -> Result<(), FecError> {
        let workers: Vec<_> = (0..threads.min(passes))
            .map(|t| {
                let rs = &rs;
                s.spawn(move || -> Result<(), FecError> {
                    let mut out = Vec::new();
                    let mut pass = t;
                    while pass < passes {
                        let first = pass * ROUNDS_PER_PASS;
                        let count = ROUNDS_PER_PASS.min(g.rounds - first);
                        out.resize((count * round_bytes) as usize, 0);
                        encode_rounds(rs, g, inputs, first, count, &mut out)?;
                        sink(first, &out)?;
                        pass += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| FecError::Worker)??;
        }
        Ok(())
    })
}

/// Compute the FEC area of `inputs` and write it to `fec` at byte `fec_offset`, on `threads`
/// threads. Returns the bytes written.
pub fn encode(
    inputs: &[FecInput<'_>],
    g: &FecGeometry,
    fec: &dyn BlockDevice,
    fec_offset: u64,
    threads: usize,
) -> Result<u64, FecError> {
    let round_bytes = g.block_size as u64 * u64::from(g.roots);
    for_each_pass(inputs, g, threads, &|first, parity| {
        Ok(fec.write_at(parity, fec_offset + first * round_bytes)?)
    })?;
    Ok(g.rounds * round_bytes)
}

/// The blocks of the FEC area (in block-size units from `fec_offset`) whose stored parity
/// differs from the parity of `inputs`, sorted: damage to the FEC area itself. Meaningful only
/// when `inputs` verified.
pub fn damaged_parity(
    inputs: &[FecInput<'_>],
    g: &FecGeometry,
    fec: &dyn BlockDevice,
    fec_offset: u64,
    threads: usize,
) -> Result<Vec<u64>, FecError> {
    let round_bytes = g.block_size as u64 * u64::from(g.roots);
    let bs = g.block_size as usize;
    let found = std::sync::Mutex::new(Vec::new());
    for_each_pass(inputs, g, threads, &|first, parity| {
        let mut stored = vec![0u8; parity.len()];
        fec.read_at(&mut stored, fec_offset + first * round_bytes)?;
        let at = first * round_bytes / bs as u64;
        let bad: Vec<u64> = stored
            .chunks(bs)
            .zip(parity.chunks(bs))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| at + i as u64)
            .collect();
        found.lock().unwrap_or_else(|e| e.into_inner()).extend(bad);
        Ok(())
    })?;
    let mut v = found.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_unstable();
    Ok(v)
}
