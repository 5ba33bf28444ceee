//! Multi-buffer SHA-256 for [`super::hash_blocks`].
//!
//! On x86_64 the batch is handed to the `tape-sha256` crate, which hashes independent
//! messages in lockstep, one per SIMD lane: 16 lanes (or two interlaced 16-lane waves) on
//! AVX-512, 8 on AVX2, four interleaved streams on SHA-NI. It picks the kernel at run time
//! from CPUID, feeds `prefix || block || suffix` straight from the caller's buffers (only
//! the blocks straddling the prefix, the suffix and the padding are staged), and sends
//! ragged remainders of a batch to SHA-NI when the CPU has it.
//!
//! When no such kernel exists (an x86_64 without AVX2 and SHA-NI, or any other
//! architecture) [`available`] is false and the caller keeps to the `sha2` loop.

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::sync::OnceLock;

    use tape_sha256::Message;

    /// Messages handed to the library per call: a multiple of every lane width it uses
    /// (32 for the interlaced AVX-512 kernel), small enough to sit on the stack.
    const CHUNK: usize = 64;

    /// Backing for empty prefixes and suffixes: see [`readable`].
    static EMPTY: [u8; 1] = [0];

    /// `s`, or an empty slice at a readable address when `s` is empty. `tape-sha256` compares
    /// every message's prefix with the first one's through `memcmp`, whose AVX-512 version
    /// reads with a fault-suppressing masked load even for zero bytes; at the dangling address
    /// of an ordinary empty slice (page 0, unmapped) each suppressed fault costs a microcode
    /// assist: about 7% of the time of hashing 4 KiB blocks without a salt.
    fn readable(s: &[u8]) -> &[u8] {
        if s.is_empty() {
            &EMPTY[..0]
        } else {
            s
        }
    }

    /// The kernel `tape-sha256` selected for this CPU.
    pub(crate) fn backend() -> &'static str {
        tape_sha256::backend()
    }

    /// True when the selected kernel is a SIMD or SHA-NI one. Its portable kernels are no
    /// faster than `sha2`, so those are left to the caller's `sha2` loop.
    pub(crate) fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| !backend().starts_with("portable"))
    }

    /// Hash every `block_size` block of `blocks` as `SHA-256(prefix || block || suffix)`
    /// into `out`, 32 bytes per block.
    pub(crate) fn hash_blocks(
        prefix: &[u8],
        suffix: &[u8],
        blocks: &[u8],
        block_size: usize,
        out: &mut [u8],
    ) {
        debug_assert_eq!(blocks.len() / block_size * 32, out.len());
        let (prefix, suffix) = (readable(prefix), readable(suffix));
        let mut msgs = [Message::new(&[]); CHUNK];
        let mut digests = [[0u8; 32]; CHUNK];
        for (chunk, out) in blocks
            .chunks(CHUNK.saturating_mul(block_size))
            .zip(out.chunks_mut(CHUNK * 32))
        {
            let n = out.len() / 32;
            for (m, body) in msgs.iter_mut().zip(chunk.chunks_exact(block_size)) {
                *m = Message {
                    prefix,
                    body,
                    tail: suffix,
                };
            }
            tape_sha256::hash_messages(&msgs[..n], &mut digests[..n]);
            for (o, d) in out.chunks_exact_mut(32).zip(&digests) {
                o.copy_from_slice(d);
            }
        }
    }

    /// Hash message `i` as `SHA-256(prefixes[i] || blocks[i])`: each block with its own
    /// prefix of `prefix_len` bytes (`prefixes` holds them one after another).
    pub(crate) fn hash_prefixed_blocks(
        prefixes: &[u8],
        prefix_len: usize,
        blocks: &[u8],
        block_size: usize,
        out: &mut [u8],
    ) {
        debug_assert_eq!(blocks.len() / block_size * 32, out.len());
        let mut msgs = [Message::new(&[]); CHUNK];
        let mut digests = [[0u8; 32]; CHUNK];
        for ((chunk, pre), out) in blocks
            .chunks(CHUNK.saturating_mul(block_size))
            .zip(prefixes.chunks(CHUNK.saturating_mul(prefix_len.max(1))))
            .zip(out.chunks_mut(CHUNK * 32))
        {
            let n = out.len() / 32;
            for (i, (m, body)) in msgs
                .iter_mut()
                .zip(chunk.chunks_exact(block_size))
                .enumerate()
            {
                *m = Message {
                    prefix: &pre[i * prefix_len..(i + 1) * prefix_len],
                    body,
                    tail: readable(&[]),
                };
            }
            tape_sha256::hash_messages(&msgs[..n], &mut digests[..n]);
            for (o, d) in out.chunks_exact_mut(32).zip(&digests) {
                o.copy_from_slice(d);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub(crate) fn backend() -> &'static str {
        "sha2"
    }

    pub(crate) fn available() -> bool {
        false
    }

    pub(crate) fn hash_blocks(
        _prefix: &[u8],
        _suffix: &[u8],
        _blocks: &[u8],
        _block_size: usize,
        _out: &mut [u8],
    ) {
        unreachable!("no multi-buffer SHA-256 on this architecture")
    }

    pub(crate) fn hash_prefixed_blocks(
        _prefixes: &[u8],
        _prefix_len: usize,
        _blocks: &[u8],
        _block_size: usize,
        _out: &mut [u8],
    ) {
        unreachable!("no multi-buffer SHA-256 on this architecture")
    }
}

pub(super) use imp::{available, backend, hash_blocks, hash_prefixed_blocks};

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    /// The fast path itself (not the dispatch around it) against `sha2`, including
    /// batches of one and blocks that start at odd addresses.
    #[test]
    fn fast_path_matches_sha2() {
        if !available() {
            return;
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..(40 * 1024 + 3))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let salt: Vec<u8> = data[..256].iter().map(|b| b ^ 0xa5).collect();
        for align in [0usize, 1, 3] {
            for bs in [64usize, 100, 1024] {
                for n in [0usize, 1, 2, 17, 33, 40] {
                    let blocks = &data[align..align + n * bs];
                    for (plen, slen) in [(0, 0), (32, 0), (0, 32), (55, 9), (256, 256)] {
                        let (prefix, suffix) = (&salt[..plen], &salt[256 - slen..]);
                        let mut out = vec![0u8; 32 * n];
                        hash_blocks(prefix, suffix, blocks, bs, &mut out);
                        let digests = out.chunks_exact(32);
                        for (i, (b, d)) in blocks.chunks_exact(bs).zip(digests).enumerate() {
                            let mut h = sha2::Sha256::new();
                            h.update(prefix);
                            h.update(b);
                            h.update(suffix);
                            assert_eq!(
                                d[..],
                                h.finalize()[..],
                                "align {align} bs {bs} n {n} block {i} prefix {plen} \
                                 suffix {slen}"
                            );
                        }
                    }
                }
            }
        }
    }
}
