//! Formatting a dm-integrity device in userspace: what the kernel writes on its first
//! activation (`initialize_superblock()`, `init_journal()`), plus what `integritysetup format`
//! leaves after its wipe (every provided sector zero with the valid tag of a zero block).
//!
//! The device is written front to back as one stream of large, 4 KiB-aligned chunks
//! (superblock area, journal, then each area's metadata run and data): the tags of a chunk
//! are computed on all cores while the previous chunk is being written. The superblock goes
//! last, after a flush: a format cut short leaves a zeroed superblock, never a valid one over
//! half-written tags.
//!
//! Without wipe only the superblock area and the journal are written, as the kernel does.

use super::error::{IntegrityError, Result};
use super::geometry::{FormatLayout, Geometry, GeometryOptions};
use super::journal_layout::empty_journal;
use super::superblock::{
    Superblock, SALT_SIZE, SB_FLAG_FIXED_HMAC, SB_FLAG_FIXED_PADDING, SB_SECTORS,
};
use super::tags::{hashing_threads, TagAlgorithm, TagHasher};
use crate::block::BlockDevice;
use zeroize::Zeroizing;

/// Bytes written per chunk.
pub const CHUNK_BYTES: usize = 32 << 20;
/// Alignment of chunk buffers and offsets (what `O_DIRECT` needs).
pub const ALIGN: usize = 4096;

/// What to format, as integritysetup's options say it.
#[derive(Debug, Clone)]
pub struct FormatParams {
    /// Internal hash (`--integrity`).
    pub algorithm: TagAlgorithm,
    /// Key of the HMACs (`--integrity-key-file`).
    pub key: Option<Zeroizing<Vec<u8>>>,
    /// Tag size (`--tag-size`; default: the digest size).
    pub tag_size: Option<u16>,
    /// Sector size (`--sector-size`, 512..=4096).
    pub sector_size: u32,
    /// `--interleave-sectors` (0: the kernel's default).
    pub interleave_sectors: u32,
    /// Journal size in 512-byte sectors (`--journal-size` / 512; 0: the kernel's default).
    pub journal_sectors: u32,
    /// `--buffer-sectors` (0: the kernel's default of 128).
    pub buffer_sectors: u32,
    /// `--bitmap-sectors-per-bit` (the bitmap granularity recorded in the superblock).
    pub sectors_per_bit: Option<u64>,
    /// Bitmap mode (`-B`).
    pub bitmap_mode: bool,
    /// Pin the salt (default: 16 random bytes).
    pub salt: Option<[u8; SALT_SIZE]>,
    /// Zero every provided sector and write its tag (integritysetup's default wipe).
    pub wipe: bool,
}

impl FormatParams {
    /// integritysetup's defaults for `algorithm`.
    pub fn new(algorithm: TagAlgorithm) -> FormatParams {
        FormatParams {
            algorithm,
            key: None,
            tag_size: None,
            sector_size: 512,
            interleave_sectors: 0,
            journal_sectors: 0,
            buffer_sectors: 0,
            sectors_per_bit: None,
            bitmap_mode: false,
            salt: None,
            wipe: true,
        }
    }
}

/// The superblock, layout and tagger of a format, decided before anything is written.
#[derive(Debug)]
pub struct FormatPlan {
    /// The superblock to write.
    pub superblock: Superblock,
    /// Its layout on the device.
    pub geometry: Geometry,
    /// The tagger (with the salt).
    pub hasher: TagHasher,
    /// Whether the data is wiped.
    pub wipe: bool,
}

impl FormatPlan {
    /// Bytes the format writes (superblock and journal; with wipe, up to the last data
    /// sector).
    pub fn bytes_to_write(&self) -> u64 {
        if self.wipe {
            self.end_sector() * 512
        } else {
            self.geometry.initial_sectors() * 512
        }
    }

    fn end_sector(&self) -> u64 {
        let g = &self.geometry;
        let last = g.area(g.areas() - 1);
        last.data_start + last.data_sectors
    }
}

/// Decide the superblock for a device of `device_bytes` bytes: refused (nothing written)
/// when an option is out of range, the key does not suit the algorithm, or the layout does
/// not fit.
pub fn plan(p: &FormatParams, device_bytes: u64) -> Result<FormatPlan> {
    let tag_size = match p.tag_size {
        Some(0) => return Err(IntegrityError::option("--tag-size", "must not be 0")),
        Some(t) => t,
        None => p.algorithm.digest_size() as u16,
    };
    let fields = Geometry::for_format(
        &FormatLayout {
            tag_size,
            sector_size: p.sector_size,
            journal_sectors: p.journal_sectors,
            interleave_sectors: p.interleave_sectors,
            fixed_padding: true,
            journal_mac: false,
            buffer_sectors: p.buffer_sectors,
            meta_device_sectors: None,
        },
        device_bytes / 512,
    )?;
    let salt = match p.salt {
        Some(s) => s,
        None => {
            let mut s = [0u8; SALT_SIZE];
            getrandom::getrandom(&mut s).map_err(|e| {
                IntegrityError::Geometry(format!("cannot get random bytes for the salt: {e}"))
            })?;
            s
        }
    };
    let flags = SB_FLAG_FIXED_PADDING | SB_FLAG_FIXED_HMAC;
    let mut sb = Superblock {
        version: Superblock::version_for(flags, p.bitmap_mode, false),
        log2_interleave_sectors: fields.log2_interleave_sectors,
        integrity_tag_size: tag_size,
        journal_sections: fields.journal_sections,
        provided_data_sectors: fields.provided_data_sectors,
        flags,
        log2_sectors_per_block: fields.log2_sectors_per_block,
        log2_blocks_per_bitmap_bit: 0,
        recalc_sector: 0,
        transaction_id: 0,
        salt,
    };
    let opts = GeometryOptions {
        buffer_sectors: if p.buffer_sectors == 0 {
            super::geometry::DEFAULT_BUFFER_SECTORS
        } else {
            p.buffer_sectors
        },
        meta_device_sectors: None,
    };
    let geometry = Geometry::new(&sb, device_bytes / 512, &opts)?;
    sb.log2_blocks_per_bitmap_bit = geometry.log2_blocks_per_bitmap_bit(p.sectors_per_bit);
    let hasher = TagHasher::new(
        p.algorithm,
        p.key.as_deref().map(|k| &k[..]),
        Some(salt),
        usize::from(tag_size),
        p.sector_size as usize,
    )?;
    Ok(FormatPlan {
        superblock: sb,
        geometry,
        hasher,
        wipe: p.wipe,
    })
}

/// A heap buffer with a 4 KiB-aligned window (for `O_DIRECT`).
struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN];
        let off = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        AlignedBuf { raw, off, len }
    }
    fn slice(&mut self, len: usize) -> &mut [u8] {
        &mut self.raw[self.off..self.off + len.min(self.len)]
    }
}

/// Zero blocks tagged per call: the shared zero buffer's size.
const ZERO_BUF: usize = 256 << 10;

/// Tags of `n` zero blocks, the first at block `first_block`, into `out`, on `threads`
/// threads (each a contiguous part, hashed against one shared zero buffer).
fn zero_tags(
    h: &TagHasher,
    zeros: &[u8],
    first_block: u64,
    n: usize,
    out: &mut [u8],
    threads: usize,
) {
    let ts = h.tag_size();
    let bs = h.block_size();
    let spb = (bs / 512) as u64;
    let per_call = zeros.len() / bs;
    let run = |first: u64, out: &mut [u8]| {
        for (i, o) in out.chunks_mut(per_call * ts).enumerate() {
            let k = o.len() / ts;
            h.tag_blocks((first + (i * per_call) as u64) * spb, &zeros[..k * bs], o);
        }
    };
    let threads = threads.clamp(1, n.div_ceil(64).max(1));
    if threads == 1 {
        run(first_block, &mut out[..n * ts]);
        return;
    }
    let part = n.div_ceil(threads);
    std::thread::scope(|s| {
        for (i, o) in out[..n * ts].chunks_mut(part * ts).enumerate() {
            let run = &run;
            s.spawn(move || run(first_block + (i * part) as u64, o));
        }
    });
}

/// Fill `buf` with the device bytes at `[start, start + buf.len())`: the journal where it
/// lies, the tags of zero blocks where they lie, zero everywhere else (the superblock area
/// too: it is written last).
fn fill_chunk(
    plan: &FormatPlan,
    journal: &[u8],
    zeros: &[u8],
    start: u64,
    buf: &mut [u8],
    threads: usize,
) {
    let g = &plan.geometry;
    buf.fill(0);
    let end = start + buf.len() as u64;
    // Journal bytes.
    let js = g.journal_start_sector() * 512;
    let je = js + journal.len() as u64;
    if start < je && end > js {
        let a = start.max(js);
        let b = end.min(je);
        buf[(a - start) as usize..(b - start) as usize]
            .copy_from_slice(&journal[(a - js) as usize..(b - js) as usize]);
    }
    if !plan.wipe {
        return;
    }
    // Tags: the areas whose tag bytes intersect the chunk hold consecutive logical blocks.
    let ts = u64::from(g.tag_size());
    let spb = u64::from(g.sectors_per_block());
    let init = g.initial_sectors() * 512;
    if end <= init {
        return;
    }
    let period = (g.interleave_sectors() + g.metadata_run_sectors()) * 512;
    let first_area = start.saturating_sub(init) / period;
    let last_area = ((end - 1 - init) / period).min(g.areas() - 1);
    // (area, first block in area, blocks) of every intersection.
    let mut pieces = Vec::new();
    for a in first_area..=last_area {
        let area = g.area(a);
        let t0 = area.metadata_start * 512;
        let blocks = area.data_sectors / spb;
        let t1 = t0 + blocks * ts;
        if t1 <= start || t0 >= end {
            continue;
        }
        let k0 = (start.max(t0) - t0) / ts;
        let k1 = (end.min(t1) - t0).div_ceil(ts);
        pieces.push((area, k0, k1 - k0));
    }
    let Some(&(first, k0, _)) = pieces.first() else {
        return;
    };
    let l0 = first.first_logical / spb + k0;
    let total: u64 = pieces.iter().map(|p| p.2).sum();
    let mut tags = vec![0u8; (total * ts) as usize];
    zero_tags(&plan.hasher, zeros, l0, total as usize, &mut tags, threads);
    let mut pos = 0usize;
    for (area, k0, n) in pieces {
        let t0 = area.metadata_start * 512 + k0 * ts;
        let bytes = &tags[pos..pos + (n * ts) as usize];
        pos += bytes.len();
        // Clip to the chunk (a tag may straddle its edges).
        let a = t0.max(start);
        let b = (t0 + n * ts).min(end);
        buf[(a - start) as usize..(b - start) as usize]
            .copy_from_slice(&bytes[(a - t0) as usize..(b - t0) as usize]);
    }
}

/// Write the format `plan` describes to `dev`; `progress(done, total)` is called after each
/// chunk. The superblock area is written last, after a flush, and flushed again.
pub fn write(
    dev: &dyn BlockDevice,
    plan: &FormatPlan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let total = plan.bytes_to_write();
    if total > dev.size() {
        return Err(IntegrityError::Geometry(format!(
            "{}: the layout needs {total} bytes, the device has {}",
            dev.name(),
            dev.size()
        )));
    }
    let journal = empty_journal(&plan.geometry);
    let zeros = vec![0u8; ZERO_BUF];
    let threads = hashing_threads();
    let mut spare: Vec<AlignedBuf> = Vec::new();
    let mut done = 0u64;
    std::thread::scope(|s| -> Result<()> {
        let mut pending: Option<std::thread::ScopedJoinHandle<'_, Result<AlignedBuf>>> = None;
        let mut offset = 0u64;
        while offset < total {
            let len = (total - offset).min(CHUNK_BYTES as u64) as usize;
            let mut buf = spare.pop().unwrap_or_else(|| AlignedBuf::new(CHUNK_BYTES));
            fill_chunk(plan, &journal, &zeros, offset, buf.slice(len), threads);
            if let Some(h) = pending.take() {
                spare.push(join(h)?);
                progress(done, total);
            }
            let at = offset;
            pending = Some(s.spawn(move || {
                dev.write_at(buf.slice(len), at)?;
                Ok(buf)
            }));
            offset += len as u64;
            done = offset;
        }
        if let Some(h) = pending.take() {
            join(h)?;
        }
        progress(done, total);
        Ok(())
    })?;
    dev.flush()?;
    let mut sb_area = AlignedBuf::new((SB_SECTORS * 512) as usize);
    let area = sb_area.slice((SB_SECTORS * 512) as usize);
    area[..512].copy_from_slice(&plan.superblock.encode());
    dev.write_at(area, 0)?;
    dev.flush()?;
    Ok(())
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    match h.join() {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    #[test]
    fn wiped_device_has_valid_tags_everywhere() {
        for (alg, ss, il, ts) in [
            (TagAlgorithm::Crc32c, 512, 0, None),
            (TagAlgorithm::Sha256, 4096, 64, None),
            (TagAlgorithm::Crc32, 1024, 8, Some(3)),
        ] {
            let size = 6 << 20;
            let dev = MemoryDevice::new("mem", size);
            let mut p = FormatParams::new(alg);
            p.sector_size = ss;
            p.interleave_sectors = il;
            p.tag_size = ts;
            p.salt = Some([7; 16]);
            let plan = plan(&p, size as u64).unwrap();
            write(&dev, &plan, &mut |_, _| {}).unwrap();
            let mut img = vec![0u8; size];
            dev.read_at(&mut img, 0).unwrap();
            let sb = Superblock::parse(&img).unwrap();
            assert_eq!(sb, plan.superblock);
            let g = &plan.geometry;
            let zero = vec![0u8; ss as usize];
            let tsz = g.tag_size() as usize;
            let mut t = vec![0u8; tsz];
            for b in 0..g.provided_blocks() {
                let l = b * u64::from(g.sectors_per_block());
                plan.hasher.tag(l, &zero, &mut t);
                let o = g.tag_byte_offset(l) as usize;
                assert_eq!(&img[o..o + tsz], &t[..], "{alg} block {b}");
            }
            let js = (g.journal_start_sector() * 512) as usize;
            let j = empty_journal(g);
            assert_eq!(&img[js..js + j.len()], &j[..]);
        }
    }
}
