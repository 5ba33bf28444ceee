//! The lower bound beside each row of `bench reencrypt`: what the storage of the directory
//! allows any tool that rewrites the data in place with the same protection, measured in the
//! same run. A reencryption moves `bytes` and waits for `barriers` flushes (per hotzone,
//! [`FLUSHES_PER_HOTZONE`]); so it takes at least `bytes / bandwidth + barriers x flush
//! latency`. On a disk the bytes are the data read and written once (checksum), plus written
//! once more into the journal (journal). In RAM the data can be re-keyed where it lies
//! (mapped), so only the journal's copy moves bytes. The cipher is left out: its bound is the
//! report's AES-XTS line, and dmkit's own AES-XTS runs faster than `openssl speed`'s.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bench::BenchError;
use crate::block::aligned::AlignedBuf;
use crate::crypt::luks2::reencrypt::{planned_hotzone, Resilience, FLUSHES_PER_HOTZONE};

/// Bytes written and read back to measure a directory's bandwidth.
const PROBE: usize = 256 << 20;
/// Request size of the probe (the engine's sub-piece).
const CHUNK: usize = 4 << 20;
/// Flushes timed for the latency.
const FLUSHES: usize = 32;

/// The storage of a directory as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Storage {
    /// Sequential bytes per second, writing then reading back (`O_DIRECT` off RAM).
    pub bytes_per_s: f64,
    /// Seconds of one flush (a 4 KiB write and `fdatasync`), mean of `FLUSHES`.
    pub flush_s: f64,
}

/// The bound of one mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    /// Hotzones of the run (cryptsetup's length for this image).
    pub hotzones: u64,
    /// Bytes read and written.
    pub bytes: u64,
    /// Flushes waited for.
    pub barriers: u64,
    /// `bytes / bandwidth + barriers x flush latency`, seconds.
    pub seconds: f64,
}

/// Measure `dir`: write [`PROBE`] bytes in [`CHUNK`]s and `fdatasync`, read them back, then
/// [`FLUSHES`] times a 4 KiB write and `fdatasync`. In RAM each byte is copied twice (into
/// the file, out of it): the rate is that of a memory copy.
pub fn measure(dir: &Path, in_ram: bool) -> Result<Storage, BenchError> {
    let path = dir.join("bound-probe");
    let r = probe(&path, in_ram);
    let _ = fs::remove_file(&path);
    r.map_err(|source| BenchError::Io {
        what: format!("measure the storage of {}", dir.display()),
        source,
    })
}

fn probe(path: &Path, in_ram: bool) -> io::Result<Storage> {
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create(true).truncate(false);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    let file = match open(!in_ram) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false)?,
        r => r?,
    };
    let mut buf = AlignedBuf::new(CHUNK);
    let chunk = buf.get(CHUNK);
    for (i, b) in chunk.iter_mut().enumerate() {
        *b = ((i * 2_654_435_761) >> 13) as u8;
    }
    let t = Instant::now();
    for i in 0..PROBE / CHUNK {
        file.write_all_at(chunk, (i * CHUNK) as u64)?;
    }
    file.sync_data()?;
    if !in_ram {
        // The read-back must come from the disk: drop what the buffered fallback cached.
        crate::bench::harness::process::evict_from_page_cache(path).ok();
    }
    for i in 0..PROBE / CHUNK {
        file.read_exact_at(chunk, (i * CHUNK) as u64)?;
    }
    let bytes_per_s = 2.0 * PROBE as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..FLUSHES {
        file.write_all_at(&chunk[..4096], (i * 4096) as u64)?;
        file.sync_data()?;
    }
    let flush_s = t.elapsed().as_secs_f64() / FLUSHES as f64;
    drop(File::open(path)?);
    Ok(Storage {
        bytes_per_s,
        flush_s,
    })
}

/// The hotzone length of a re-key of the LUKS2 image `image` with `resilience` (`checksum`
/// with sha256, `journal`, `none`), aligned to its data segment's sector.
pub fn hotzone(image: &Path, resilience: &str) -> Result<u64, BenchError> {
    use crate::block::{FileDevice, OpenOptions as DevOptions};
    let bad = |e: String| BenchError::Invalid(format!("{}: {e}", image.display()));
    let dev = FileDevice::open(
        image,
        DevOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(|e| bad(e.to_string()))?;
    let h = crate::crypt::luks2::copies::read(&dev)
        .map_err(|e| bad(e.to_string()))?
        .header;
    let sector = h
        .metadata
        .segments
        .values()
        .map(|s| u64::from(s.sector_size))
        .max()
        .unwrap_or(512)
        .max(512);
    let r = match resilience {
        "checksum" => Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: sector as u32,
        },
        "journal" => Resilience::Journal,
        _ => Resilience::None,
    };
    planned_hotzone(&h, &r, sector).map_err(|e| bad(e.to_string()))
}

/// The bound of re-keying `size` bytes with `resilience` in hotzones of `hotzone` bytes on
/// `storage`.
pub fn bound(resilience: &str, size: u64, hotzone: u64, storage: &Storage, in_ram: bool) -> Bound {
    let hotzones = size.div_ceil(hotzone.max(1));
    let (passes, barriers) = match resilience {
        "journal" => (3, hotzones * FLUSHES_PER_HOTZONE),
        "checksum" => (2, hotzones * FLUSHES_PER_HOTZONE),
        _ => (2, 1),
    };
    // In RAM only the journal's copy moves bytes (see the module's comment).
    let passes = if in_ram { passes - 2 } else { passes };
    let bytes = passes * size;
    Bound {
        hotzones,
        bytes,
        barriers,
        seconds: bytes as f64 / storage.bytes_per_s + barriers as f64 * storage.flush_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_moves_three_times_the_data_and_waits_four_flushes_a_hotzone() {
        let s = Storage {
            bytes_per_s: 1e9,
            flush_s: 1e-3,
        };
        let b = bound("journal", 1 << 30, 16 << 20, &s, false);
        assert_eq!((b.hotzones, b.bytes, b.barriers), (64, 3 << 30, 256));
        let io = 3.0 * (1u64 << 30) as f64 / 1e9 + 0.256;
        assert!((b.seconds - io).abs() < 1e-9);
        let r = bound("checksum", 1 << 30, 1 << 30, &s, true);
        assert_eq!((r.hotzones, r.bytes, r.barriers), (1, 0, 4));
        let j = bound("journal", 1 << 30, 16 << 20, &s, true);
        assert_eq!(j.bytes, 1 << 30, "in RAM the journal's copy only");
    }
}
