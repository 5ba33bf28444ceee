//! The `fec_header` that says where an image's FEC parity is, as AOSP's libfec writes and
//! reads it (`system/extras/libfec/include/fec/io.h`, `fec_open.cpp`): 60 packed
//! little-endian bytes — magic `0xFECFECFE`, version 0, size 60, roots, fec_size, inp_size,
//! SHA-256 of the parity — at the start of the last 4096-byte block of the verity partition,
//! with a backup copy in that block's last 60 bytes, the rest of the block zero.
//!
//! The verity superblock has no FEC fields (veritysetup takes the FEC options on every
//! command), so the header is what tells `image open` that parity is there, with how many
//! roots. The partition is laid out as libfec lays out a file: the input (superblock and hash
//! tree), then `fec_size` bytes of parity, then the header block. One difference is forced by
//! dm-verity: the parity covers what veritysetup's and the kernel's FEC cover — the data
//! blocks of the root partition, then this partition's hash blocks after the superblock up to
//! the parity — so `inp_size` is that covered size (and `fec_size` is `rounds × roots × 4096`
//! of it, as libfec checks), while the parity starts right before the header block rather than
//! at `inp_size`.
//!
//! Nothing here is trusted: every field is checked against the verity superblock and the
//! partition before a byte of parity is read through it.

use crate::block::BlockDevice;
use crate::codec::{Reader, Writer};
use crate::verity::fec::{FecGeometry, FecOptions};
use crate::verity::{TreeLayout, VerityParams};
use sha2::Digest;

/// `FEC_MAGIC`.
pub const MAGIC: u32 = 0xFECF_ECFE;
/// `FEC_VERSION`.
pub const VERSION: u32 = 0;
/// `sizeof(struct fec_header)`: the struct is packed.
pub const HEADER_SIZE: usize = 60;
/// `FEC_BLOCKSIZE`: the header block, and the only block size the header describes.
pub const BLOCK: u64 = 4096;

/// The fields of a `fec_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FecHeader {
    /// Parity bytes per codeword.
    pub roots: u32,
    /// Bytes of parity.
    pub fec_size: u32,
    /// Bytes of input the parity covers.
    pub inp_size: u64,
    /// SHA-256 of the parity.
    pub hash: [u8; 32],
}

impl FecHeader {
    /// The 4096-byte header block: the header at its start and again at its end.
    pub fn block(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(HEADER_SIZE);
        w.u32_le(MAGIC)
            .u32_le(VERSION)
            .u32_le(HEADER_SIZE as u32)
            .u32_le(self.roots)
            .u32_le(self.fec_size)
            .u64_le(self.inp_size)
            .bytes(&self.hash);
        let h = w.into_inner();
        let mut b = vec![0u8; BLOCK as usize];
        b[..HEADER_SIZE].copy_from_slice(&h);
        b[BLOCK as usize - HEADER_SIZE..].copy_from_slice(&h);
        b
    }

    /// Parse one copy: `Ok(None)` without the magic (no header there), an error naming the
    /// field for a header libfec would reject (version, size).
    pub fn parse(b: &[u8]) -> Result<Option<FecHeader>, String> {
        let mut r = Reader::new(b);
        let e = |e: crate::codec::Error| e.to_string();
        if r.u32_le("magic").map_err(e)? != MAGIC {
            return Ok(None);
        }
        let version = r.u32_le("version").map_err(e)?;
        if version != VERSION {
            return Err(format!("version: {version} (only {VERSION} is known)"));
        }
        let size = r.u32_le("size").map_err(e)?;
        if size != HEADER_SIZE as u32 {
            return Err(format!(
                "size: {size} (a fec_header has {HEADER_SIZE} bytes)"
            ));
        }
        Ok(Some(FecHeader {
            roots: r.u32_le("roots").map_err(e)?,
            fec_size: r.u32_le("fec_size").map_err(e)?,
            inp_size: r.u64_le("inp_size").map_err(e)?,
            hash: r.array("hash").map_err(e)?,
        }))
    }
}

/// Where the hash tree of `p` ends in its partition (superblock included), rounded up to a
/// 4096-byte block: where `image build --fec` puts the parity.
pub fn tree_end(p: &VerityParams) -> Result<u64, String> {
    let l = TreeLayout::new(p).map_err(|e| e.to_string())?;
    Ok(l.new_file_size().div_ceil(BLOCK) * BLOCK)
}

/// The FEC geometry of parity at `offset` of a verity partition holding the tree of `p`.
pub fn geometry(p: &VerityParams, roots: u8, offset: u64) -> Result<FecGeometry, String> {
    let first = crate::verity::fec::hash_offset_block(p);
    let blocks = p.data_blocks + (offset / u64::from(p.hash_block_size)).saturating_sub(first);
    FecGeometry::new(roots, p.data_block_size, blocks).map_err(|e| e.to_string())
}

/// The header describing `parity` made with `g` (over `g.blocks` blocks of 4096 bytes).
pub fn for_parity(g: &FecGeometry, parity: &[u8]) -> Result<FecHeader, String> {
    let fec_size = u32::try_from(parity.len()).map_err(|_| {
        format!(
            "--fec-roots {}: {} bytes of parity, more than a fec_header can describe (4 GiB)",
            g.roots,
            parity.len()
        )
    })?;
    Ok(FecHeader {
        roots: u32::from(g.roots),
        fec_size,
        inp_size: g.blocks * u64::from(g.block_size),
        hash: sha2::Sha256::digest(parity).into(),
    })
}

/// The parity a checked header describes, in its verity partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFec {
    /// Where the parity is and its roots (offset from the partition's start).
    pub options: FecOptions,
    /// The header's fields.
    pub header: FecHeader,
    /// Whether the parity's SHA-256 matches the header (a mismatch is damage in the parity:
    /// corrections are still checked against the tree, so it is still used).
    pub parity_intact: bool,
    /// The backup copy was used: the primary is damaged (why).
    pub primary_damaged: Option<String>,
}

/// What the last block of a verity partition holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// No fec_header; `trailing` bytes follow the hash tree all the same (0 for an image built
    /// without `--fec`).
    None {
        /// Bytes between the end of the tree (4096-aligned) and the end of the partition.
        trailing: u64,
    },
    /// A valid header.
    Fec(StoredFec),
}

/// Check `h` against the tree of `p` in a partition of `size` bytes; the parity's offset.
fn check(h: &FecHeader, p: &VerityParams, size: u64) -> Result<u64, String> {
    if u64::from(p.data_block_size) != BLOCK || u64::from(p.hash_block_size) != BLOCK {
        return Err(format!(
            "the verity superblock has {}-byte data and {}-byte hash blocks; a fec_header \
             describes parity over 4096-byte blocks",
            p.data_block_size, p.hash_block_size
        ));
    }
    if !(2..=24).contains(&h.roots) {
        return Err(format!(
            "roots: {} (dm-verity takes 2 to 24 parity bytes per codeword)",
            h.roots
        ));
    }
    let fec_size = u64::from(h.fec_size);
    if fec_size == 0 || fec_size % BLOCK != 0 || fec_size % u64::from(h.roots) != 0 {
        return Err(format!(
            "fec_size: {} is not a non-zero multiple of 4096 and of roots {}",
            h.fec_size, h.roots
        ));
    }
    let end = tree_end(p)?;
    let Some(start) = size
        .checked_sub(BLOCK)
        .and_then(|s| s.checked_sub(fec_size))
        .filter(|s| *s >= end)
    else {
        return Err(format!(
            "fec_size: {} bytes of parity do not fit between the hash tree (ending at byte \
             {end}) and the header block of this {size}-byte partition",
            h.fec_size
        ));
    };
    let g = geometry(p, h.roots as u8, start)?;
    let covered = g.blocks * BLOCK;
    if h.inp_size != covered {
        return Err(format!(
            "inp_size: {} is not the {covered} bytes the parity at byte {start} covers ({} data \
             blocks and the hash blocks before it)",
            h.inp_size, p.data_blocks
        ));
    }
    if fec_size != g.parity_bytes() {
        return Err(format!(
            "fec_size: {} is not the {} bytes of parity {} roots give over {covered} bytes",
            h.fec_size,
            g.parity_bytes(),
            h.roots
        ));
    }
    Ok(start)
}

/// Read and check the fec_header of the verity partition `part` (its whole extent) holding
/// the tree of `p`. An error names the field at fault (both copies' when both are bad).
pub fn find(part: &dyn BlockDevice, p: &VerityParams) -> Result<Found, String> {
    let size = part.size();
    let trailing = size.saturating_sub(tree_end(p)?);
    if size < 2 * BLOCK || !size.is_multiple_of(BLOCK) {
        return Ok(Found::None { trailing });
    }
    let mut block = vec![0u8; BLOCK as usize];
    part.read_at(&mut block, size - BLOCK)
        .map_err(|e| format!("fec_header: cannot read the last block: {e}"))?;
    let copies = [
        (size - BLOCK, &block[..HEADER_SIZE]),
        (
            size - HEADER_SIZE as u64,
            &block[BLOCK as usize - HEADER_SIZE..],
        ),
    ];
    let mut errors = Vec::new();
    for (i, (at, bytes)) in copies.into_iter().enumerate() {
        let checked = FecHeader::parse(bytes).and_then(|h| match h {
            None => Ok(None),
            Some(h) => check(&h, p, size).map(|start| Some((h, start))),
        });
        let why = match checked {
            Ok(Some((header, start))) => {
                let parity_intact = parity_hash(part, start, header.fec_size)? == header.hash;
                let primary_damaged = (i == 1).then(|| errors.join("; "));
                return Ok(Found::Fec(StoredFec {
                    options: FecOptions {
                        roots: header.roots as u8,
                        offset: start,
                    },
                    header,
                    parity_intact,
                    primary_damaged,
                }));
            }
            Ok(None) => "no magic 0xFECFECFE".to_string(),
            Err(e) => e,
        };
        let name = if i == 0 {
            "fec_header"
        } else {
            "its backup copy"
        };
        errors.push(format!("{name} at byte {at}: {why}"));
    }
    if errors.iter().all(|e| e.ends_with("no magic 0xFECFECFE")) {
        return Ok(Found::None { trailing });
    }
    Err(errors.join("; "))
}

/// SHA-256 of the `len` bytes of parity at `start` of `part`, read in 1 MiB pieces.
fn parity_hash(part: &dyn BlockDevice, start: u64, len: u32) -> Result<[u8; 32], String> {
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < u64::from(len) {
        let n = (u64::from(len) - done).min(buf.len() as u64) as usize;
        part.read_at(&mut buf[..n], start + done)
            .map_err(|e| format!("FEC parity: cannot read byte {}: {e}", start + done))?;
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_holds_two_copies_libfec_parses() {
        let h = FecHeader {
            roots: 2,
            fec_size: 8192,
            inp_size: 1 << 20,
            hash: [7; 32],
        };
        let b = h.block();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[..4], &[0xfe, 0xec, 0xcf, 0xfe]);
        assert_eq!(&b[8..12], &60u32.to_le_bytes());
        assert_eq!(b[..60], b[4036..]);
        assert!(b[60..4036].iter().all(|&x| x == 0));
        assert_eq!(FecHeader::parse(&b[..60]), Ok(Some(h)));
        assert_eq!(FecHeader::parse(&[0u8; 60]), Ok(None));
        let mut bad = b[..60].to_vec();
        bad[4] = 1;
        assert!(FecHeader::parse(&bad).unwrap_err().starts_with("version"));
        assert!(FecHeader::parse(&b[..20])
            .unwrap_err()
            .contains("truncated"));
    }
}
