//! The CPU work of a hotzone spread over all cores: re-keying sectors (old key off, new key
//! on) and hashing blocks for the checksum resilience. Each thread takes a contiguous piece,
//! cut at a multiple of the largest unit, so the work is bounded by the disk, not one core.

use crate::crypt::cipher::SectorCipher;
use crate::crypt::luks::hash::LuksHash;
use crate::crypt::luks::LuksError;

/// A sector cipher with the geometry of its segment: IVs in 512-byte units from `iv_base` at
/// the segment's byte 0 (LUKS2 never uses large-sector IVs).
pub struct Keyed {
    /// The cipher.
    pub cipher: Box<dyn SectorCipher>,
    /// Encryption sector size.
    pub sector_size: usize,
    /// IV of the segment's first byte, in 512-byte units.
    pub iv_base: u64,
}

impl Keyed {
    /// Decrypt (or encrypt) `buf`, which starts at byte `offset` of the segment.
    pub fn run(&self, buf: &mut [u8], offset: u64, decrypt: bool) {
        let ss = self.sector_size;
        let step = (ss / 512) as u64;
        let first = self.iv_base + (offset >> 9);
        if step == 1 {
            // 512-byte sectors: consecutive IVs, one call.
            if decrypt {
                self.cipher.decrypt(buf, first, ss)
            } else {
                self.cipher.encrypt(buf, first, ss)
            }
            return;
        }
        for (i, s) in buf.chunks_exact_mut(ss).enumerate() {
            let iv = first + i as u64 * step;
            if decrypt {
                self.cipher.decrypt(s, iv, ss)
            } else {
                self.cipher.encrypt(s, iv, ss)
            }
        }
    }
}

/// The cores to use, asked once: `available_parallelism` reads the cgroup's CPU quota from
/// /proc and /sys on every call (three opens), twice per hotzone otherwise.
fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Pieces of `len` bytes cut at multiples of `unit`, one per thread.
fn piece_len(len: usize, unit: usize) -> usize {
    let per = len.div_ceil(threads());
    per.div_ceil(unit).max(1) * unit
}

/// Run `f(offset, piece)` on pieces of `buf` (cut at multiples of `unit`, one per thread,
/// `offset` where the piece starts in `buf`) at once; the pieces' results in order. The
/// first piece runs on the calling thread: a hotzone has two such passes, and a thread
/// started costs tens of microseconds and a wake-up, each pass.
pub fn pieces<T: Send>(
    buf: &mut [u8],
    unit: usize,
    f: impl Fn(usize, &mut [u8]) -> Result<T, LuksError> + Sync,
) -> Result<Vec<T>, LuksError> {
    let piece = piece_len(buf.len(), unit);
    let f = &f;
    std::thread::scope(|s| {
        let mut chunks = buf.chunks_mut(piece).enumerate();
        let first = chunks.next();
        let handles: Vec<_> = chunks
            .map(|(i, chunk)| s.spawn(move || f(i * piece, chunk)))
            .collect();
        let first = first.map(|(_, chunk)| f(0, chunk));
        first
            .into_iter()
            .chain(handles.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(LuksError::Crypto("a worker thread panicked".into())))
            }))
            .collect()
    })
}

/// The unit the pieces of a hotzone are cut at: whole sectors of both keys.
pub fn unit(old: Option<&Keyed>, new: Option<&Keyed>) -> usize {
    old.map_or(512, |k| k.sector_size)
        .max(new.map_or(512, |k| k.sector_size))
}

/// Re-key `buf` (old ciphertext at byte `offset` of the device's data) in place: decrypt with
/// `old` (`None`: it is plaintext), encrypt with `new` (`None`: leave it plaintext). Each
/// piece is decrypted and encrypted by the same thread before the next, so `buf` never
/// holds the plaintext of more than what one thread works on.
pub fn rekey(buf: &mut [u8], offset: u64, old: Option<&Keyed>, new: Option<&Keyed>) {
    let _ = pieces(buf, unit(old, new), |at, chunk| {
        rekey_piece(chunk, offset + at as u64, old, new);
        Ok(())
    });
}

/// What a thread decrypts and encrypts again before moving on: small enough to stay in its
/// core's cache between the two passes, so memory is read and written once, not twice.
const CACHED: usize = 64 << 10;

/// How much of its piece a thread reads (or writes) before hashing (or re-keying) it: the
/// disk works on the next sub-piece (readahead, writeback) while the core works on this one.
pub const SUB_PIECE: usize = 4 << 20;

/// [`rekey`] of one piece on this thread, [`CACHED`] bytes at a time.
pub fn rekey_piece(chunk: &mut [u8], at: u64, old: Option<&Keyed>, new: Option<&Keyed>) {
    let unit = unit(old, new);
    let step = CACHED.div_ceil(unit) * unit;
    // Last bytes first: the piece was just read (or journaled) front to back, so its end is
    // what the cache still holds.
    for (i, c) in chunk.chunks_mut(step).enumerate().rev() {
        let at = at + (i * step) as u64;
        if let Some(k) = old {
            k.run(c, at, true);
        }
        if let Some(k) = new {
            k.run(c, at, false);
        }
    }
}

/// The sub-pieces of `piece` ([`SUB_PIECE`] bytes, cut at a multiple of `unit`) with their
/// offsets in `piece`.
pub fn sub_pieces(
    piece: &mut [u8],
    unit: usize,
) -> impl DoubleEndedIterator<Item = (usize, &mut [u8])> {
    let step = SUB_PIECE.div_ceil(unit) * unit;
    piece
        .chunks_mut(step)
        .enumerate()
        .map(move |(i, c)| (i * step, c))
}

/// The hash `name` of every `block` bytes of `data`, concatenated (cryptsetup's checksums:
/// one hash per block, each from a fresh context); SHA-256 multi-buffer where the CPU can.
pub fn block_hashes(data: &[u8], block: usize, name: &str) -> Result<Vec<u8>, LuksError> {
    let md = LuksHash::by_name(name)?;
    let mut out = vec![0u8; data.len() / block * md.size()];
    match crate::hash::HashAlgorithm::from_name(name) {
        Some(alg) if alg.digest_size() == md.size() => {
            crate::hash::hash_blocks(alg, &[], &[], data, block, &mut out)
        }
        _ => {
            for (d, o) in data
                .chunks_exact(block)
                .zip(out.chunks_exact_mut(md.size()))
            {
                md.digest_into(&[d], o)?;
            }
        }
    }
    Ok(out)
}

/// [`block_hashes`] of all of `buf` on all cores.
pub fn checksums(buf: &mut [u8], block: usize, name: &str) -> Result<Vec<u8>, LuksError> {
    Ok(pieces(buf, block, |_, chunk| block_hashes(chunk, block, name))?.concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::cipher::{new_sector_cipher, CipherSpec};
    use crate::crypt::luks::VolumeKey;

    fn keyed(seed: u8, sector_size: usize, iv_base: u64) -> Keyed {
        let key = VolumeKey::new((0..64).map(|i| i as u8 ^ seed).collect());
        let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
        Keyed {
            cipher: new_sector_cipher(&spec, &key).unwrap(),
            sector_size,
            iv_base,
        }
    }

    /// Pieces over several threads, each worked on last chunk first, re-key every sector as
    /// one sector at a time does.
    #[test]
    fn rekey_in_pieces_and_chunks_matches_sector_by_sector() {
        let (old, new) = (keyed(1, 512, 7), keyed(2, 4096, 3));
        let len = 3 * CACHED + 5 * 4096;
        let offset = 8 << 20;
        let start: Vec<u8> = (0..len).map(|i| (i * 13 + i / 511) as u8).collect();
        let mut whole = start.clone();
        rekey(&mut whole, offset, Some(&old), Some(&new));
        let mut one = start.clone();
        for (i, s) in one.chunks_exact_mut(4096).enumerate() {
            let at = offset + (i * 4096) as u64;
            old.run(s, at, true);
            new.run(s, at, false);
        }
        assert!(whole == one, "re-keyed in pieces differs");
        assert!(whole != start);
    }
}
