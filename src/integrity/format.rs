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
//! Where the storage can zero a range without a transfer (fallocate `ZERO_RANGE` on a file,
//! `BLKZEROOUT` on a block device), the stream is zeroed that way first and only the journal
//! and the tag runs are written: the same bytes on disk, a fraction of the writes.
//!
//! Without wipe only the superblock area and the journal are written, as the kernel does.

use super::error::{IntegrityError, Result};
use super::geometry::{FormatLayout, Geometry, GeometryOptions};
use super::journal_layout::empty_journal;
use super::superblock::{
    Superblock, SALT_SIZE, SB_FLAG_FIXED_HMAC, SB_FLAG_FIXED_PADDING, SB_SECTORS,
};
use super::tags::{hashing_threads, TagAlgorithm, TagHasher};
use crate::block::aligned::AlignedBuf;
use crate::block::BlockDevice;
use zeroize::Zeroizing;

/// Bytes written per chunk.
pub const CHUNK_BYTES: usize = 8 << 20;
/// Chunk writes in flight at once.
pub const IN_FLIGHT: usize = 4;
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
    /// Size in bytes of a separate data device (integritysetup's `--data-device`): the
    /// device formatted then holds only the superblock, the journal and the tags.
    pub data_device_bytes: Option<u64>,
    /// No internal hash: the tags come from the layer above (LUKS2 `--integrity`), so
    /// `algorithm` and `key` are unused, `tag_size` is required, there is no salt (the kernel
    /// draws one only for an internal or journal MAC with `fix_hmac`), and wiping is the
    /// upper layer's job.
    pub external_tags: bool,
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
            data_device_bytes: None,
            external_tags: false,
        }
    }

    /// What cryptsetup's `INTEGRITY_format` has the kernel write under a LUKS2 segment with
    /// integrity: `tag_size` bytes of tag from dm-crypt per `sector_size` block, the kernel's
    /// default journal, interleave and buffer, `fix_padding`, no wipe.
    pub fn external_tags(tag_size: u16, sector_size: u32) -> FormatParams {
        FormatParams {
            tag_size: Some(tag_size),
            sector_size,
            wipe: false,
            external_tags: true,
            ..FormatParams::new(TagAlgorithm::Crc32c)
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
    /// The tagger (with the salt); `None` with external tags.
    pub hasher: Option<TagHasher>,
    /// Whether the data is wiped.
    pub wipe: bool,
    /// Size of the device holding the metadata when the data is on a separate device.
    meta_device_bytes: Option<u64>,
}

impl FormatPlan {
    /// Bytes the format writes: on the device, the superblock and the journal, and with
    /// wipe up to the last data sector (or, with a separate data device, the last tag, to a
    /// 4 KiB boundary); plus, with wipe, the provided sectors of a separate data device.
    pub fn bytes_to_write(&self) -> u64 {
        self.stream_bytes() + self.data_device_zero_bytes()
    }

    /// Bytes of the front-to-back stream written to the device.
    fn stream_bytes(&self) -> u64 {
        let g = &self.geometry;
        if !self.wipe {
            return g.initial_sectors() * 512;
        }
        if g.has_meta_device() {
            let end = g.initial_sectors() * 512 + g.provided_blocks() * u64::from(g.tag_size());
            let meta = self.meta_device_bytes.unwrap_or(end);
            return end
                .div_ceil(ALIGN as u64)
                .saturating_mul(ALIGN as u64)
                .min(meta);
        }
        let last = g.area(g.areas() - 1);
        (last.data_start + last.data_sectors) * 512
    }

    /// Bytes zeroed on a separate data device.
    fn data_device_zero_bytes(&self) -> u64 {
        if self.wipe && self.geometry.has_meta_device() {
            self.geometry.provided_data_sectors() * 512
        } else {
            0
        }
    }
}

/// Decide the superblock for a device of `device_bytes` bytes (with a separate data device:
/// the metadata device): refused (nothing written) when an option is out of range, the key
/// does not suit the algorithm, or the layout does not fit.
pub fn plan(p: &FormatParams, device_bytes: u64) -> Result<FormatPlan> {
    let meta = p.data_device_bytes.map(|_| device_bytes / 512);
    let data_sectors = p.data_device_bytes.unwrap_or(device_bytes) / 512;
    let buffer_sectors = if p.buffer_sectors == 0 {
        super::geometry::DEFAULT_BUFFER_SECTORS
    } else {
        p.buffer_sectors
    };
    let tag_size = match p.tag_size {
        Some(0) => return Err(IntegrityError::option("--tag-size", "must not be 0")),
        Some(t) => t,
        None if p.external_tags => {
            return Err(IntegrityError::option(
                "--tag-size",
                "is required without internal hash",
            ))
        }
        None => p.algorithm.digest_size() as u16,
    };
    if p.external_tags && p.wipe {
        return Err(IntegrityError::option(
            "--wipe",
            "without internal hash, the layer that owns the tags initialises the data",
        ));
    }
    let fields = Geometry::for_format(
        &FormatLayout {
            tag_size,
            sector_size: p.sector_size,
            journal_sectors: p.journal_sectors,
            interleave_sectors: p.interleave_sectors,
            // The kernel sets fix_padding only where there are metadata runs to pad.
            fixed_padding: meta.is_none(),
            journal_mac: false,
            buffer_sectors,
            meta_device_sectors: meta,
        },
        data_sectors,
    )?;
    let salt = match p.salt {
        _ if p.external_tags => [0u8; SALT_SIZE],
        Some(s) => s,
        None => {
            let mut s = [0u8; SALT_SIZE];
            getrandom::getrandom(&mut s).map_err(|e| {
                IntegrityError::Geometry(format!("cannot get random bytes for the salt: {e}"))
            })?;
            s
        }
    };
    let hmac_flag = if p.external_tags {
        0
    } else {
        SB_FLAG_FIXED_HMAC
    };
    let flags = if meta.is_some() {
        hmac_flag
    } else {
        SB_FLAG_FIXED_PADDING | hmac_flag
    };
    let mut sb = Superblock {
        version: Superblock::version_for(flags, p.bitmap_mode, meta.is_some()),
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
        buffer_sectors,
        meta_device_sectors: meta,
    };
    let geometry = Geometry::new(&sb, data_sectors, &opts)?;
    sb.log2_blocks_per_bitmap_bit = geometry.log2_blocks_per_bitmap_bit(p.sectors_per_bit);
    let hasher = if p.external_tags {
        None
    } else {
        Some(TagHasher::new(
            p.algorithm,
            p.key.as_deref().map(|k| &k[..]),
            Some(salt),
            usize::from(tag_size),
            p.sector_size as usize,
        )?)
    };
    Ok(FormatPlan {
        superblock: sb,
        geometry,
        hasher,
        wipe: p.wipe,
        meta_device_bytes: p.data_device_bytes.map(|_| device_bytes),
    })
}

/// A 4 KiB-aligned chunk buffer (for `O_DIRECT`), zero but for the `dirty` ranges: a chunk is
/// mostly zeros, and clearing only what the last fill wrote saves a memset of the whole device.
struct ChunkBuf {
    buf: AlignedBuf,
    dirty: Vec<(usize, usize)>,
}

impl ChunkBuf {
    fn new(len: usize) -> ChunkBuf {
        ChunkBuf {
            buf: AlignedBuf::new(len),
            dirty: Vec::new(),
        }
    }
    fn slice(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.buf.len());
        self.buf.get(len)
    }
    /// Zero what the last fill wrote; the whole window is zero afterwards.
    fn clear(&mut self) {
        let all = self.buf.all();
        let len = all.len();
        for (a, b) in std::mem::take(&mut self.dirty) {
            all[a.min(len)..b.min(len)].fill(0);
        }
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

/// Fill the first `len` bytes of `chunk` with the device bytes at `[start, start + len)`: the
/// journal where it lies, the tags of zero blocks where they lie, zero everywhere else (the
/// superblock area too: it is written last).
fn fill_chunk(
    plan: &FormatPlan,
    journal: &[u8],
    zeros: &[u8],
    start: u64,
    chunk: &mut ChunkBuf,
    len: usize,
    threads: usize,
) {
    let g = &plan.geometry;
    chunk.clear();
    let mut dirty = Vec::new();
    let buf = chunk.slice(len);
    let end = start + buf.len() as u64;
    // Journal bytes.
    let js = g.journal_start_sector() * 512;
    let je = js + journal.len() as u64;
    if start < je && end > js {
        let a = start.max(js);
        let b = end.min(je);
        buf[(a - start) as usize..(b - start) as usize]
            .copy_from_slice(&journal[(a - js) as usize..(b - js) as usize]);
        dirty.push(((a - start) as usize, (b - start) as usize));
    }
    if let (true, Some(h)) = (plan.wipe, &plan.hasher) {
        fill_tags(plan, h, zeros, start, buf, &mut dirty, threads);
    }
    chunk.dirty = dirty;
}

/// The tags of zero blocks that lie in `buf` (device bytes from `start`); the ranges written
/// go to `dirty`.
fn fill_tags(
    plan: &FormatPlan,
    hasher: &TagHasher,
    zeros: &[u8],
    start: u64,
    buf: &mut [u8],
    dirty: &mut Vec<(usize, usize)>,
    threads: usize,
) {
    let g = &plan.geometry;
    let end = start + buf.len() as u64;
    // Tags: the areas whose tag bytes intersect the chunk hold consecutive logical blocks.
    let ts = u64::from(g.tag_size());
    let spb = u64::from(g.sectors_per_block());
    let init = g.initial_sectors() * 512;
    if end <= init {
        return;
    }
    // With a metadata device all tags are one run after the journal: one area.
    let (first_area, last_area) = if g.has_meta_device() {
        (0, 0)
    } else {
        let period = (g.interleave_sectors() + g.metadata_run_sectors()) * 512;
        let first = start.saturating_sub(init) / period;
        (first, ((end - 1 - init) / period).min(g.areas() - 1))
    };
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
    zero_tags(hasher, zeros, l0, total as usize, &mut tags, threads);
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
        dirty.push(((a - start) as usize, (b - start) as usize));
    }
}

/// Write the format `plan` describes to `dev` (and zero the separate data device `data`
/// when the plan has one); `progress(done, total)` is called after each chunk. The
/// superblock area is written last, after a flush, and flushed again.
pub fn write(
    dev: &dyn BlockDevice,
    data: Option<&dyn BlockDevice>,
    plan: &FormatPlan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let total = plan.bytes_to_write();
    let stream = plan.stream_bytes();
    let zero_bytes = plan.data_device_zero_bytes();
    if stream > dev.size() {
        return Err(IntegrityError::Geometry(format!(
            "{}: the layout needs {stream} bytes, the device has {}",
            dev.name(),
            dev.size()
        )));
    }
    let data = match (plan.geometry.has_meta_device(), data) {
        (true, Some(d)) => Some(d),
        (false, None) => None,
        (true, None) => {
            return Err(IntegrityError::Geometry(
                "the plan has a separate data device and none was given".into(),
            ))
        }
        (false, Some(d)) => {
            return Err(IntegrityError::Geometry(format!(
                "{}: the plan has no separate data device",
                d.name()
            )))
        }
    };
    if let Some(d) = data {
        if zero_bytes > d.size() {
            return Err(IntegrityError::Geometry(format!(
                "{}: {zero_bytes} data bytes, the device has {}",
                d.name(),
                d.size()
            )));
        }
    }
    // With wipe the stream is almost all zeros. Where the storage zeroes a range without a
    // transfer (fallocate ZERO_RANGE on a file, BLKZEROOUT on a block device) the whole stream
    // is zeroed first and only the journal and the tag runs are written: the bytes on disk
    // are the same, the device does not carry gigabytes of zeros. Elsewhere every byte is
    // written.
    let zeroed = plan.wipe && dev.write_zeroes(0, stream).is_ok();
    let journal = empty_journal(&plan.geometry);
    let zeros = vec![0u8; ZERO_BUF];
    let threads = hashing_threads();
    let mut spare: Vec<ChunkBuf> = Vec::new();
    std::thread::scope(|s| -> Result<()> {
        // Up to IN_FLIGHT chunk writes at once (each on its own scoped thread), while the
        // next chunk is filled: a deeper queue keeps the device busy.
        let mut pending: std::collections::VecDeque<
            std::thread::ScopedJoinHandle<'_, Result<(ChunkBuf, u64)>>,
        > = std::collections::VecDeque::new();
        let mut offset = 0u64;
        while offset < stream {
            let len = (stream - offset).min(CHUNK_BYTES as u64) as usize;
            let mut buf = spare.pop().unwrap_or_else(|| ChunkBuf::new(CHUNK_BYTES));
            fill_chunk(plan, &journal, &zeros, offset, &mut buf, len, threads);
            if pending.len() >= IN_FLIGHT {
                if let Some(h) = pending.pop_front() {
                    let (b, end) = join(h)?;
                    spare.push(b);
                    progress(end, total);
                }
            }
            let at = offset;
            pending.push_back(s.spawn(move || {
                if zeroed {
                    let ranges = aligned_ranges(&buf.dirty, len);
                    let data = buf.slice(len);
                    for (a, b) in ranges {
                        dev.write_at(&data[a..b], at + a as u64)?;
                    }
                } else {
                    dev.write_at(buf.slice(len), at)?;
                }
                Ok((buf, at + len as u64))
            }));
            offset += len as u64;
        }
        while let Some(h) = pending.pop_front() {
            let (_, end) = join(h)?;
            progress(end, total);
        }
        Ok(())
    })?;
    if let Some(d) = data {
        // The data device: zeros only, without a transfer where it can, else in chunks with
        // the writes in flight as above.
        let zeroed = d.write_zeroes(0, zero_bytes).is_ok();
        let zero_bytes = if zeroed { 0 } else { zero_bytes };
        let mut zero = AlignedBuf::new(CHUNK_BYTES);
        let zero = &*zero.all();
        std::thread::scope(|s| -> Result<()> {
            let mut pending = std::collections::VecDeque::new();
            let mut offset = 0u64;
            while offset < zero_bytes {
                let len = (zero_bytes - offset).min(CHUNK_BYTES as u64) as usize;
                if pending.len() >= IN_FLIGHT {
                    if let Some(h) = pending.pop_front() {
                        let end: u64 = join(h)?;
                        progress(stream + end, total);
                    }
                }
                let at = offset;
                pending.push_back(s.spawn(move || -> Result<u64> {
                    d.write_at(&zero[..len], at)?;
                    Ok(at + len as u64)
                }));
                offset += len as u64;
            }
            while let Some(h) = pending.pop_front() {
                let end = join(h)?;
                progress(stream + end, total);
            }
            Ok(())
        })?;
        d.flush()?;
    }
    dev.flush()?;
    let mut sb_area = AlignedBuf::new((SB_SECTORS * 512) as usize);
    let area = sb_area.all();
    area[..512].copy_from_slice(&plan.superblock.encode());
    dev.write_at(area, 0)?;
    dev.flush()?;
    Ok(())
}

/// The `dirty` ranges of a chunk of `len` bytes, sorted, widened to [`ALIGN`] (the chunk is
/// zero around them, so the wider range writes the same bytes; `O_DIRECT` needs the
/// alignment) and merged where they touch.
fn aligned_ranges(dirty: &[(usize, usize)], len: usize) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = dirty
        .iter()
        .filter(|(a, b)| a < b)
        .map(|&(a, b)| {
            (
                a / ALIGN * ALIGN,
                b.div_ceil(ALIGN).saturating_mul(ALIGN).min(len),
            )
        })
        .collect();
    v.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    match h.join() {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn aligned_ranges_widen_sort_and_merge() {
        assert_eq!(
            aligned_ranges(&[(9000, 9100), (10, 20), (4096, 5000), (0, 0)], 10000),
            vec![(0, 10000)]
        );
        assert_eq!(
            aligned_ranges(&[(20000, 20010), (10, 20)], 1 << 20),
            vec![(0, 4096), (16384, 20480)]
        );
        assert!(aligned_ranges(&[], 4096).is_empty());
    }

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
            write(&dev, None, &plan, &mut |_, _| {}).unwrap();
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
                plan.hasher.as_ref().unwrap().tag(l, &zero, &mut t);
                let o = g.tag_byte_offset(l) as usize;
                assert_eq!(&img[o..o + tsz], &t[..], "{alg} block {b}");
            }
            let js = (g.journal_start_sector() * 512) as usize;
            let j = empty_journal(g);
            assert_eq!(&img[js..js + j.len()], &j[..]);
        }
    }
}
