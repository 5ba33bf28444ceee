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

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Pieces of `len` bytes cut at multiples of `unit`, one per thread.
fn piece_len(len: usize, unit: usize) -> usize {
    let per = len.div_ceil(threads());
    per.div_ceil(unit).max(1) * unit
}

/// Re-key `buf` (old ciphertext at byte `offset` of the device's data) in place: decrypt with
/// `old` (`None`: it is plaintext), encrypt with `new` (`None`: leave it plaintext).
pub fn rekey(buf: &mut [u8], offset: u64, old: Option<&Keyed>, new: Option<&Keyed>) {
    let unit = old
        .map_or(512, |k| k.sector_size)
        .max(new.map_or(512, |k| k.sector_size));
    let piece = piece_len(buf.len(), unit);
    std::thread::scope(|s| {
        for (i, chunk) in buf.chunks_mut(piece).enumerate() {
            let at = offset + (i * piece) as u64;
            s.spawn(move || {
                if let Some(k) = old {
                    k.run(chunk, at, true);
                }
                if let Some(k) = new {
                    k.run(chunk, at, false);
                }
            });
        }
    });
}

/// The hash `md` of every `block` bytes of `buf`, concatenated (cryptsetup's checksums: one
/// hash per block, each from a fresh context).
pub fn checksums(buf: &[u8], block: usize, md: LuksHash) -> Result<Vec<u8>, LuksError> {
    let size = md.size();
    let mut out = vec![0u8; buf.len() / block * size];
    let piece = piece_len(buf.len(), block);
    let results: Vec<Result<(), LuksError>> = std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks(piece)
            .zip(out.chunks_mut(piece / block * size))
            .map(|(data, sums)| {
                s.spawn(move || {
                    for (d, o) in data.chunks_exact(block).zip(sums.chunks_exact_mut(size)) {
                        md.digest_into(&[d], o)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(LuksError::Crypto("hash thread panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect::<Result<(), _>>()?;
    Ok(out)
}
