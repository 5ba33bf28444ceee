//! Internal-hash tags as the kernel's `integrity_sector_checksum()` computes them:
//!
//! ```text
//! tag(sector, data) = H([salt if FIXED_HMAC] || le64(sector) || data)
//! ```
//!
//! truncated to the tag size, or zero-padded when the digest is shorter. `sector` is the
//! logical 512-byte sector of the block's start; `data` is the whole block.
//!
//! The hashes are the kernel crypto API's: `crc32c` (Castagnoli, the usual seed ~0 and final
//! inversion, stored little-endian), `crc32` (the kernel's `crc32` shash: IEEE polynomial,
//! reflected, seed 0 and no final inversion, stored little-endian), `sha1`, `sha256`,
//! `sha512`, and `hmac(sha1|sha256|sha512)` with a key. [`TagHasher::tag_blocks`] tags many
//! consecutive blocks at once (SHA-256 and HMAC-SHA-256 multi-buffer, CRC32C in hardware);
//! [`TagHasher::tag_blocks_parallel`] splits a batch over threads.

use super::error::{IntegrityError, Result};
use super::superblock::SALT_SIZE;
use crate::block::{side_by_side, TaggedPiece};
use sha2::Digest;
use zeroize::Zeroizing;

/// An internal-hash algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagAlgorithm {
    /// CRC-32C (4-byte digest), integritysetup's default.
    Crc32c,
    /// The kernel's CRC-32 (4 bytes; seed 0, no final xor).
    Crc32,
    /// SHA-1 (20 bytes).
    Sha1,
    /// SHA-256 (32 bytes).
    Sha256,
    /// SHA-512 (64 bytes).
    Sha512,
    /// HMAC-SHA-1 (20 bytes, keyed).
    HmacSha1,
    /// HMAC-SHA-256 (32 bytes, keyed).
    HmacSha256,
    /// HMAC-SHA-512 (64 bytes, keyed).
    HmacSha512,
}

impl TagAlgorithm {
    /// Every algorithm.
    pub const ALL: [TagAlgorithm; 8] = [
        TagAlgorithm::Crc32c,
        TagAlgorithm::Crc32,
        TagAlgorithm::Sha1,
        TagAlgorithm::Sha256,
        TagAlgorithm::Sha512,
        TagAlgorithm::HmacSha1,
        TagAlgorithm::HmacSha256,
        TagAlgorithm::HmacSha512,
    ];

    /// Parse a name as integritysetup (`hmac-sha256`) or the kernel (`hmac(sha256)`) spells it.
    pub fn from_name(name: &str) -> Option<TagAlgorithm> {
        let n = name.to_ascii_lowercase();
        TagAlgorithm::ALL
            .into_iter()
            .find(|a| a.name() == n || a.kernel_name() == n)
    }

    /// The name integritysetup takes (`--integrity`).
    pub fn name(self) -> &'static str {
        match self {
            TagAlgorithm::Crc32c => "crc32c",
            TagAlgorithm::Crc32 => "crc32",
            TagAlgorithm::Sha1 => "sha1",
            TagAlgorithm::Sha256 => "sha256",
            TagAlgorithm::Sha512 => "sha512",
            TagAlgorithm::HmacSha1 => "hmac-sha1",
            TagAlgorithm::HmacSha256 => "hmac-sha256",
            TagAlgorithm::HmacSha512 => "hmac-sha512",
        }
    }

    /// The kernel crypto API's name (the `internal_hash:` table argument).
    pub fn kernel_name(self) -> &'static str {
        match self {
            TagAlgorithm::HmacSha1 => "hmac(sha1)",
            TagAlgorithm::HmacSha256 => "hmac(sha256)",
            TagAlgorithm::HmacSha512 => "hmac(sha512)",
            other => other.name(),
        }
    }

    /// Digest size in bytes (the default tag size).
    pub fn digest_size(self) -> usize {
        match self {
            TagAlgorithm::Crc32c | TagAlgorithm::Crc32 => 4,
            TagAlgorithm::Sha1 | TagAlgorithm::HmacSha1 => 20,
            TagAlgorithm::Sha256 | TagAlgorithm::HmacSha256 => 32,
            TagAlgorithm::Sha512 | TagAlgorithm::HmacSha512 => 64,
        }
    }

    /// Whether the algorithm takes a key.
    pub fn keyed(self) -> bool {
        matches!(
            self,
            TagAlgorithm::HmacSha1 | TagAlgorithm::HmacSha256 | TagAlgorithm::HmacSha512
        )
    }
}

impl std::fmt::Display for TagAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernel's `crc32` shash over `parts`: reflected IEEE CRC, register seeded with 0 and
/// returned without the final inversion.
pub fn kernel_crc32(parts: &[&[u8]]) -> u32 {
    // crc32fast keeps the inverted register; an initial value of !0 is a raw register of 0,
    // and inverting its result undoes its final inversion.
    let mut h = crc32fast::Hasher::new_with_initial(!0);
    for p in parts {
        h.update(p);
    }
    !h.finalize()
}

/// Standard CRC-32C over `parts` (the kernel's `crc32c` shash, seed ~0, final inversion).
pub fn crc32c(parts: &[&[u8]]) -> u32 {
    parts.iter().fold(0, |c, p| crc32c::crc32c_append(c, p))
}

/// Computes tags for one volume: algorithm, key, salt, tag size and block size.
pub struct TagHasher {
    alg: TagAlgorithm,
    /// HMAC-SHA-256: the key's inner and outer pad states, compressed once here.
    hmac256: Option<crate::hash::HmacSha256State>,
    /// HMAC-SHA-512: likewise.
    hmac512: Option<crate::hash::HmacSha512State>,
    key: Zeroizing<Vec<u8>>,
    salt: Option<[u8; SALT_SIZE]>,
    tag_size: usize,
    block_size: usize,
    /// CRC-32C of the salt (the state every tag starts from).
    crc_seed: u32,
}

impl std::fmt::Debug for TagHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagHasher")
            .field("alg", &self.alg)
            .field("key", &format_args!("<{} bytes>", self.key.len()))
            .field("salted", &self.salt.is_some())
            .field("tag_size", &self.tag_size)
            .field("block_size", &self.block_size)
            .finish()
    }
}

/// Whether [`crc32c_lanes`] can run here (SSE 4.2).
fn crc32c_lanes_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// CRC-32C registers (not inverted), each started at `seed`, over le64(sector) then one
/// block, for the `L` consecutive blocks of `bs` bytes at the start of `data`, block `l` at
/// sector `first + l * step`, interleaved: the `crc32` instruction has a latency of three
/// cycles, so a block's CRC alone is latency-bound, and eight independent streams keep the
/// unit busy (measured on Zen 5: 8 lanes 25 us/MiB, 4 lanes 30, 1 lane about 75).
///
/// # Safety
/// SSE 4.2 must be available. (Lengths are checked: `data` holds at least `L` blocks and
/// `bs` is a multiple of 8.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_lanes<const L: usize>(
    data: &[u8],
    bs: usize,
    seed: u32,
    first: u64,
    step: u64,
) -> [u32; L] {
    use std::arch::x86_64::_mm_crc32_u64;
    assert!(bs.is_multiple_of(8) && data.len() >= L * bs, "whole blocks");
    let mut r = [u64::from(seed); L];
    for (l, reg) in r.iter_mut().enumerate() {
        *reg = _mm_crc32_u64(*reg, first + l as u64 * step);
    }
    let base = data.as_ptr();
    let mut off = 0;
    while off < bs {
        for (l, reg) in r.iter_mut().enumerate() {
            // SAFETY: l * bs + off + 8 <= L * bs <= data.len(), checked above.
            let word = unsafe { base.add(l * bs + off).cast::<u64>().read_unaligned() };
            *reg = _mm_crc32_u64(*reg, u64::from_le(word));
        }
        off += 8;
    }
    r.map(|x| x as u32)
}

/// Blocks per call of the multi-buffer kernels (bounded stack staging of prefixes).
const BATCH: usize = 64;

impl TagHasher {
    /// A hasher for `alg` (`key` for the HMACs, none otherwise), `salt` when the superblock
    /// has `SB_FLAG_FIXED_HMAC`, tags of `tag_size` bytes over blocks of `block_size` bytes.
    pub fn new(
        alg: TagAlgorithm,
        key: Option<&[u8]>,
        salt: Option<[u8; SALT_SIZE]>,
        tag_size: usize,
        block_size: usize,
    ) -> Result<TagHasher> {
        if tag_size == 0 {
            return Err(IntegrityError::option("--tag-size", "must not be 0"));
        }
        if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
            return Err(IntegrityError::option(
                "--sector-size",
                format!("{block_size} is not a power of two in 512..4096"),
            ));
        }
        let key = match (alg.keyed(), key) {
            (true, Some(k)) if !k.is_empty() => Zeroizing::new(k.to_vec()),
            (true, _) => {
                return Err(IntegrityError::Key(format!(
                    "--integrity-key-file: {alg} needs a key"
                )))
            }
            (false, Some(_)) => {
                return Err(IntegrityError::Key(format!(
                    "--integrity-key-file: {alg} takes no key"
                )))
            }
            (false, None) => Zeroizing::new(Vec::new()),
        };
        let hmac256 =
            (alg == TagAlgorithm::HmacSha256).then(|| crate::hash::HmacSha256State::new(&key));
        let hmac512 =
            (alg == TagAlgorithm::HmacSha512).then(|| crate::hash::HmacSha512State::new(&key));
        let crc_seed = match salt {
            Some(s) if alg == TagAlgorithm::Crc32c => crc32c(&[&s]),
            _ => 0,
        };
        Ok(TagHasher {
            alg,
            hmac256,
            hmac512,
            key,
            salt,
            tag_size,
            block_size,
            crc_seed,
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> TagAlgorithm {
        self.alg
    }
    /// Tag size in bytes.
    pub fn tag_size(&self) -> usize {
        self.tag_size
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn prefix(&self, sector: u64) -> ([u8; SALT_SIZE + 8], usize) {
        let mut p = [0u8; SALT_SIZE + 8];
        match &self.salt {
            Some(s) => {
                p[..SALT_SIZE].copy_from_slice(s);
                p[SALT_SIZE..].copy_from_slice(&sector.to_le_bytes());
                (p, SALT_SIZE + 8)
            }
            None => {
                p[..8].copy_from_slice(&sector.to_le_bytes());
                (p, 8)
            }
        }
    }

    fn put(&self, digest: &[u8], out: &mut [u8]) {
        let n = digest.len().min(self.tag_size);
        out[..n].copy_from_slice(&digest[..n]);
        out[n..self.tag_size].fill(0);
    }

    /// The tag of the block `data` (one block) at logical sector `sector`, into `out`
    /// (`tag_size` bytes).
    ///
    /// Panics when `data` is not one block or `out` is shorter than a tag (a caller's bug,
    /// never input data).
    pub fn tag(&self, sector: u64, data: &[u8], out: &mut [u8]) {
        assert_eq!(data.len(), self.block_size, "one block");
        assert!(out.len() >= self.tag_size);
        let (p, plen) = self.prefix(sector);
        let prefix = &p[..plen];
        match self.alg {
            TagAlgorithm::Crc32c => {
                let c = crc32c::crc32c_append(
                    crc32c::crc32c_append(self.crc_seed, &sector.to_le_bytes()),
                    data,
                );
                self.put(&c.to_le_bytes(), out)
            }
            TagAlgorithm::Crc32 => self.put(&kernel_crc32(&[prefix, data]).to_le_bytes(), out),
            TagAlgorithm::Sha1 => self.put(&digest::<sha1::Sha1>(prefix, data), out),
            TagAlgorithm::Sha256 => self.put(&digest::<sha2::Sha256>(prefix, data), out),
            TagAlgorithm::Sha512 => self.put(&digest::<sha2::Sha512>(prefix, data), out),
            TagAlgorithm::HmacSha1 => {
                self.put(&hmac::<sha1::Sha1>(64, &self.key, prefix, data), out)
            }
            TagAlgorithm::HmacSha256 => match &self.hmac256 {
                Some(k) => self.put(&k.mac(&[prefix, data]), out),
                None => unreachable!("an HMAC-SHA-256 hasher has its key states"),
            },
            TagAlgorithm::HmacSha512 => match &self.hmac512 {
                Some(k) => self.put(&k.mac(&[prefix, data]), out),
                None => unreachable!("an HMAC-SHA-512 hasher has its key states"),
            },
        }
    }

    /// Tags of consecutive blocks: `data` holds whole blocks, the first at logical sector
    /// `first_sector`, the next at `first_sector + block_size / 512`, ...; their tags go one
    /// after another into `out` (`tag_size` bytes each).
    ///
    /// Panics when `data` is not whole blocks or `out` not one tag per block.
    pub fn tag_blocks(&self, first_sector: u64, data: &[u8], out: &mut [u8]) {
        let bs = self.block_size;
        let ts = self.tag_size;
        assert!(data.len().is_multiple_of(bs), "whole blocks");
        let n = data.len() / bs;
        assert_eq!(out.len(), n * ts, "one tag per block");
        let step = (bs / 512) as u64;
        match self.alg {
            TagAlgorithm::HmacSha256 => self.sha256_batches(first_sector, data, out),
            TagAlgorithm::Sha256 if n >= 2 => self.sha256_batches(first_sector, data, out),
            TagAlgorithm::Crc32c if n >= 2 && crc32c_lanes_available() => {
                self.crc32c_interleaved(first_sector, data, out)
            }
            _ => {
                for (i, (block, tag)) in data
                    .chunks_exact(bs)
                    .zip(out.chunks_exact_mut(ts))
                    .enumerate()
                {
                    self.tag(first_sector + i as u64 * step, block, tag);
                }
            }
        }
    }

    /// CRC-32C of eight (then four, then one) blocks at a time, interleaved
    /// ([`crc32c_lanes`]).
    #[cfg(target_arch = "x86_64")]
    fn crc32c_interleaved(&self, first_sector: u64, data: &[u8], out: &mut [u8]) {
        let bs = self.block_size;
        let ts = self.tag_size;
        let step = (bs / 512) as u64;
        let seed = !self.crc_seed;
        let n = data.len() / bs;
        let mut i = 0;
        while i < n {
            let d = &data[i * bs..];
            let s = first_sector + i as u64 * step;
            let t = &mut out[i * ts..];
            // SAFETY: the caller checked crc32c_lanes_available() (SSE 4.2).
            let lanes = match n - i {
                8.. => self.put_crcs(&unsafe { crc32c_lanes::<8>(d, bs, seed, s, step) }, t),
                4.. => self.put_crcs(&unsafe { crc32c_lanes::<4>(d, bs, seed, s, step) }, t),
                _ => self.put_crcs(&unsafe { crc32c_lanes::<1>(d, bs, seed, s, step) }, t),
            };
            i += lanes;
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn crc32c_interleaved(&self, _: u64, _: &[u8], _: &mut [u8]) {
        unreachable!("crc32c_lanes_available() is false off x86_64")
    }

    /// Store the tags of CRC registers `regs` (inverted as the final step) at the start of
    /// `out`; returns how many.
    fn put_crcs(&self, regs: &[u32], out: &mut [u8]) -> usize {
        let ts = self.tag_size;
        for (r, tag) in regs.iter().zip(out.chunks_exact_mut(ts)) {
            self.put(&(!r).to_le_bytes(), tag);
        }
        regs.len()
    }

    /// SHA-256 and HMAC-SHA-256 through the multi-buffer kernels, a batch of blocks at a
    /// time: the per-block prefix (salt, sector) is staged, HMAC tags start from the key's
    /// pad states.
    fn sha256_batches(&self, first_sector: u64, data: &[u8], out: &mut [u8]) {
        let bs = self.block_size;
        let ts = self.tag_size;
        let step = (bs / 512) as u64;
        let (_, plen) = self.prefix(0);
        let mut prefixes = [0u8; BATCH * (SALT_SIZE + 8)];
        let mut digests = [0u8; BATCH * 32];
        for (b, (chunk, tags)) in data
            .chunks(BATCH * bs)
            .zip(out.chunks_mut(BATCH * ts))
            .enumerate()
        {
            let n = chunk.len() / bs;
            for (i, dst) in prefixes.chunks_exact_mut(plen).take(n).enumerate() {
                let (p, _) = self.prefix(first_sector + (b * BATCH + i) as u64 * step);
                dst.copy_from_slice(&p[..plen]);
            }
            let (prefixes, digests) = (&prefixes[..n * plen], &mut digests[..n * 32]);
            match &self.hmac256 {
                Some(k) => {
                    crate::hash::hmac_sha256_prefixed_blocks(k, prefixes, plen, chunk, bs, digests)
                }
                None => crate::hash::sha256_prefixed_blocks(prefixes, plen, chunk, bs, digests),
            }
            for (d, t) in digests.chunks_exact(32).zip(tags.chunks_exact_mut(ts)) {
                self.put(d, t);
            }
        }
    }

    /// [`tag_blocks`](TagHasher::tag_blocks) for one request of the serving path: a large
    /// request of a hash tag (SHA, HMAC) is split in parts of at least 256 KiB hashed at once
    /// by this thread and the [helpers](crate::block::helpers) (started once per process, not
    /// per request), so a 1 MiB read is not bound by one core; CRC tags and small requests stay
    /// on the caller's thread, where the hand-off would cost more than it saves.
    pub fn tag_blocks_pooled(&self, first_sector: u64, data: &[u8], out: &mut [u8]) {
        let bs = self.block_size;
        let ts = self.tag_size;
        let n = data.len() / bs;
        let parts = self.parallel_parts(data.len());
        if parts < 2 {
            return self.tag_blocks(first_sector, data, out);
        }
        let per = n.div_ceil(parts);
        let step = (bs / 512) as u64;
        let jobs: Vec<_> = data
            .chunks(per * bs)
            .zip(out.chunks_mut(per * ts))
            .enumerate()
            .map(|(i, (d, o))| (first_sector + (i * per) as u64 * step, d, o))
            .collect();
        let done = side_by_side::share(jobs, parts, &|(first, d, o)| self.tag_blocks(first, d, o));
        // A part whose thread panicked has no tags: fail as that thread did, as rayon's
        // scope did, rather than hand back tags never computed.
        assert!(done.iter().all(Option::is_some), "a tag thread panicked");
    }

    /// How many threads a request of `bytes` is tagged on: one per core, each with at least
    /// 256 KiB, for a hash tag (SHA, HMAC); one for CRC tags and small requests (as the reads
    /// at open, before a daemon forks, where it must have no threads), where the hand-off
    /// would cost more than it saves.
    pub fn parallel_parts(&self, bytes: usize) -> usize {
        let cheap = matches!(self.alg, TagAlgorithm::Crc32c | TagAlgorithm::Crc32);
        if cheap {
            return 1;
        }
        side_by_side::parts_for(bytes)
    }

    /// Fill the `pieces` a journal lends for a write of `src` at byte `offset`: each piece's
    /// data copied from `src` and its tags computed from that copy while it is in the cache,
    /// the pieces split over the cores as [`tag_blocks_pooled`](TagHasher::tag_blocks_pooled)
    /// splits a request.
    pub fn fill_pieces(&self, src: &[u8], offset: u64, pieces: &mut [TaggedPiece<'_>]) {
        // Split by what this call fills: the journal may hand a write's pieces over in more
        // than one call, one of them a single section.
        let parts = self.parallel_parts(pieces.iter().map(|p| p.data.len()).sum());
        // Four shares per core, each core taking the next as it finishes one.
        let (bs, ts) = (self.block_size, self.tag_size);
        let groups = side_by_side::split_pieces(pieces, parts * 4, bs, ts);
        side_by_side::share(groups, parts, &|group| {
            for (at, data, tags) in group {
                let from = (at - offset) as usize;
                data.copy_from_slice(&src[from..from + data.len()]);
                self.tag_blocks(at / 512, data, tags);
            }
        });
    }

    /// [`tag_blocks`](TagHasher::tag_blocks) split into `threads` contiguous parts hashed at
    /// once (scoped threads, no queues).
    pub fn tag_blocks_parallel(
        &self,
        first_sector: u64,
        data: &[u8],
        out: &mut [u8],
        threads: usize,
    ) {
        let bs = self.block_size;
        let ts = self.tag_size;
        let n = data.len() / bs;
        let threads = threads.clamp(1, n.max(1));
        if threads == 1 || n < 64 {
            return self.tag_blocks(first_sector, data, out);
        }
        let per = n.div_ceil(threads);
        let step = (bs / 512) as u64;
        std::thread::scope(|s| {
            for (i, (d, o)) in data
                .chunks(per * bs)
                .zip(out.chunks_mut(per * ts))
                .enumerate()
            {
                let first = first_sector + (i * per) as u64 * step;
                s.spawn(move || self.tag_blocks(first, d, o));
            }
        });
    }
}

fn digest<D: Digest>(prefix: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = D::new();
    h.update(prefix);
    h.update(data);
    h.finalize().to_vec()
}

/// HMAC (RFC 2104) over `D` with an input block of `block` bytes: a key longer than a block
/// is hashed first, as the kernel's `hmac()` template does.
fn hmac<D: Digest>(block: usize, key: &[u8], prefix: &[u8], data: &[u8]) -> Vec<u8> {
    let mut k = Zeroizing::new(vec![0u8; block]);
    if key.len() > block {
        let d = D::digest(key);
        k[..d.len()].copy_from_slice(&d);
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = D::new();
    let ipad: Zeroizing<Vec<u8>> = Zeroizing::new(k.iter().map(|b| b ^ 0x36).collect());
    inner.update(&ipad[..]);
    inner.update(prefix);
    inner.update(data);
    let inner = inner.finalize();
    let mut outer = D::new();
    let opad: Zeroizing<Vec<u8>> = Zeroizing::new(k.iter().map(|b| b ^ 0x5c).collect());
    outer.update(&opad[..]);
    outer.update(&inner);
    outer.finalize().to_vec()
}

/// The number of threads to hash on: the CPUs this process may run on.
pub fn hashing_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_definitions() {
        // CRC-32C check value.
        assert_eq!(crc32c(&[b"123456789"]), 0xe306_9283);
        // The kernel's crc32: a plain bitwise reflected CRC, register 0, no final xor.
        let mut reg = 0u32;
        for &b in b"123456789" {
            reg ^= u32::from(b);
            for _ in 0..8 {
                reg = if reg & 1 != 0 {
                    (reg >> 1) ^ 0xedb8_8320
                } else {
                    reg >> 1
                };
            }
        }
        assert_eq!(kernel_crc32(&[b"1234", b"56789"]), reg);
        assert_eq!(kernel_crc32(&[&[0u8; 64]]), 0);
    }

    /// Pieces filled on the cores (a request large enough to split, pieces of ragged sizes)
    /// hold the source's bytes and the tags `tag_blocks` gives the whole request.
    #[test]
    fn filled_pieces_equal_the_whole_request_tagged() {
        let bs = 512;
        let src: Vec<u8> = (0..bs * 2300).map(|i| (i * 13 % 253) as u8).collect();
        for alg in [
            TagAlgorithm::Crc32c,
            TagAlgorithm::HmacSha256,
            TagAlgorithm::Sha256,
        ] {
            let key: Option<&[u8]> = alg.keyed().then_some(b"0123456789abcdef".as_slice());
            let h = TagHasher::new(alg, key, None, alg.digest_size().min(32), bs).unwrap();
            let ts = h.tag_size();
            let mut want = vec![0u8; src.len() / bs * ts];
            h.tag_blocks(40, &src, &mut want);
            let sizes = [1usize, 700, 3, 1100, 496];
            let mut data: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n * bs]).collect();
            let mut tags: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n * ts]).collect();
            let mut at = 40 * 512;
            let mut pieces: Vec<TaggedPiece> = data
                .iter_mut()
                .zip(tags.iter_mut())
                .map(|(d, t)| {
                    let p = TaggedPiece {
                        offset: at,
                        data: d,
                        tags: t,
                    };
                    at += p.data.len() as u64;
                    p
                })
                .collect();
            h.fill_pieces(&src, 40 * 512, &mut pieces);
            assert!(data.concat() == src, "{alg}: data");
            assert!(tags.concat() == want, "{alg}: tags");
        }
    }

    #[test]
    fn batch_equals_single() {
        let data: Vec<u8> = (0..4096 * 70).map(|i| (i * 31 % 251) as u8).collect();
        let salt = Some(*b"saltsaltsaltsalt");
        for alg in TagAlgorithm::ALL {
            let key: Option<&[u8]> = if alg.keyed() {
                Some(b"0123456789abcdef")
            } else {
                None
            };
            for (ts, bs) in [(4, 512), (32, 4096), (3, 1024), (64, 512)] {
                let h = TagHasher::new(alg, key, salt, ts, bs).unwrap();
                let n = data.len() / bs;
                let mut batch = vec![0u8; n * ts];
                h.tag_blocks_parallel(1000, &data, &mut batch, 3);
                for i in 0..n {
                    let mut one = vec![0u8; ts];
                    h.tag(
                        1000 + (i * bs / 512) as u64,
                        &data[i * bs..(i + 1) * bs],
                        &mut one,
                    );
                    assert_eq!(
                        &batch[i * ts..(i + 1) * ts],
                        &one[..],
                        "{alg} ts {ts} bs {bs} block {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn hmac_multibuffer_matches_crate() {
        let data = vec![7u8; 512 * 5];
        for key_len in [1usize, 32, 64, 65, 100] {
            let key = vec![0x4b; key_len];
            let h = TagHasher::new(TagAlgorithm::HmacSha256, Some(&key), None, 32, 512).unwrap();
            let mut batch = vec![0u8; 5 * 32];
            h.tag_blocks(8, &data, &mut batch);
            for i in 0..5u64 {
                let want = hmac::<sha2::Sha256>(64, &key, &(8 + i).to_le_bytes(), &data[..512]);
                assert_eq!(&batch[i as usize * 32..][..32], &want[..], "key {key_len}");
            }
        }
    }

    /// Tags the Debian 6.1 kernel wrote: the guest formatted 8 MiB images with integritysetup
    /// 2.6.1 (`fix_hmac`, random salt), wrote 64 KiB of `byte i = (7 i + 3) mod 256` through
    /// the mapping, and the host read the salt and the tags of the first and last block.
    #[test]
    fn kernel_vectors() {
        let pat: Vec<u8> = (0..65536u32).map(|i| ((i * 7 + 3) % 256) as u8).collect();
        let key = [b'K'; 32];
        let cases = [
            (
                "crc32c",
                "0f7c461215ed4ecc739171a7a61d0f74",
                4,
                512,
                "b69b67f2",
                127,
                "ea5498f0",
            ),
            (
                "crc32",
                "28f44f0ba6b5c572c129a11f9e2b68fa",
                4,
                512,
                "b3270071",
                127,
                "11bdc3e6",
            ),
            (
                "sha1",
                "047eb9280b9ec4207f4da6098b6c2a59",
                20,
                512,
                "976d4198049e104cc0d78e5b5d2275cdde4e67ca",
                127,
                "702f401602f0419e5026ddd652a9e94c30ab2091",
            ),
            (
                "sha256",
                "4b2e748c2a17f806d375d3fc928f7ee0",
                32,
                4096,
                "c84052cbbae22a2b43dc53cbc329cef02c9991b3c80aeaeb56b33f61a00b210d",
                120,
                "5c8ee67b7b9d8a08d0d7d4bba46804edaf2e13fd17aba44ad55a899478c8b147",
            ),
            (
                "hmac-sha256",
                "b71413a442716f0e8e57af9f8da84793",
                32,
                512,
                "0ba9f7affbe72f4bb12e6357bfd1d88c3d6344765dddf37bf083e7c6222bf9a5",
                127,
                "05bfc6bd9313d0cb4ceea752963f2786803eee32b78d9954d32612a3c9642ab0",
            ),
            (
                "crc32",
                "3ba215de3598361512ffd3f49a09bb14",
                8,
                1024,
                "fc57deb600000000",
                126,
                "271de74400000000",
            ),
        ];
        for (alg, salt, ts, bs, first, last_sector, last) in cases {
            let alg = TagAlgorithm::from_name(alg).unwrap();
            let mut s = [0u8; 16];
            s.copy_from_slice(&hex::decode(salt).unwrap());
            let key = alg.keyed().then_some(&key[..]);
            let h = TagHasher::new(alg, key, Some(s), ts, bs).unwrap();
            let mut t = vec![0u8; ts];
            h.tag(0, &pat[..bs], &mut t);
            assert_eq!(hex::encode(&t), first, "{alg} sector 0");
            let off = last_sector as usize * 512;
            h.tag(last_sector, &pat[off..off + bs], &mut t);
            assert_eq!(hex::encode(&t), last, "{alg} sector {last_sector}");
            // The batch agrees.
            let mut all = vec![0u8; 65536 / bs * ts];
            h.tag_blocks(0, &pat, &mut all);
            assert_eq!(hex::encode(&all[..ts]), first);
            assert_eq!(hex::encode(&all[all.len() - ts..]), last);
        }
    }

    #[test]
    fn hmac_rfc4231_case_2() {
        assert_eq!(
            hex::encode(hmac::<sha2::Sha256>(
                64,
                b"Jefe",
                b"what do ya want ",
                b"for nothing?"
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn keys_are_checked() {
        assert!(TagHasher::new(TagAlgorithm::HmacSha256, None, None, 32, 512).is_err());
        assert!(TagHasher::new(TagAlgorithm::Sha256, Some(b"k"), None, 32, 512).is_err());
        assert!(TagHasher::new(TagAlgorithm::Crc32c, None, None, 4, 513).is_err());
        assert_eq!(
            TagAlgorithm::from_name("hmac(sha256)"),
            Some(TagAlgorithm::HmacSha256)
        );
        assert_eq!(
            TagAlgorithm::from_name("HMAC-SHA256"),
            Some(TagAlgorithm::HmacSha256)
        );
    }
}
