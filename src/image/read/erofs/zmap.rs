//! Compressed EROFS files: from a byte position to the extent that holds it (the kernel's
//! `fs/erofs/zmap.c`, erofs-utils' `lib/zmap.c`).
//!
//! A compressed file is cut into logical clusters (lclusters, one block each with the images
//! erofs-utils 1.5 makes). Each has an index after the inode: HEAD (a compressed extent starts
//! in it, at `clusterofs`, its data at `blkaddr`), PLAIN (the same, stored uncompressed) or
//! NONHEAD (inside an extent that started earlier; with big pclusters the first NONHEAD after
//! a HEAD holds the pcluster's block count, CBLKCNT). Indexes are either full (legacy, 8 bytes
//! each) or compacted (packs of two 16-bit or sixteen 14-bit entries followed by one block
//! address, from which each HEAD's address is counted). With ztailpacking the last extent's
//! compressed bytes sit inline right after the indexes.
//!
//! Walking between lclusters here goes one lcluster at a time (not by the NONHEAD deltas) and
//! never further than [`MAX_EXTENT`], so a corrupt index costs a bounded number of reads and
//! ends in [`ReadError::Corrupt`] naming the inode.

use super::super::{ReadError, Result, Source};
use super::format::{Inode, Layout, Superblock};

/// Largest decompressed extent read (bytes). erofs-utils 1.5 compresses from a queue of at most
/// 2 × 3000 KiB, so its extents stay under 6 MiB; this bounds both the walk over indexes and
/// the memory one decompressed extent takes.
pub const MAX_EXTENT: u64 = 8 << 20;
/// Largest physical cluster (`Z_EROFS_PCLUSTER_MAX_SIZE`).
pub const MAX_PCLUSTER: u64 = 1 << 20;

/// Superblock feature: compressed data ends its blocks (leading zeros pad it).
pub const FEATURE_LZ4_0PADDING: u32 = 0x1;
const FEATURE_BIG_PCLUSTER: u32 = 0x2;
const FEATURE_ZTAILPACKING: u32 = 0x10;

const ADVISE_COMPACTED_2B: u16 = 0x1;
const ADVISE_BIG_PCLUSTER_1: u16 = 0x2;
const ADVISE_BIG_PCLUSTER_2: u16 = 0x4;
const ADVISE_INLINE_PCLUSTER: u16 = 0x8;
/// Advice bits this reader knows; later ones (interlaced plain pclusters, fragments) come
/// from erofs-utils 1.6 and are refused per file.
const ADVISE_KNOWN: u16 = 0xf;

const CBLKCNT: u16 = 1 << 11;

/// The type of one lcluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Head,
    NonHead,
}

/// One decoded lcluster index.
#[derive(Debug, Clone, Copy)]
struct Lcluster {
    kind: Kind,
    /// HEAD/PLAIN: where in the lcluster the extent starts.
    clusterofs: u64,
    /// HEAD/PLAIN: the pcluster's first block.
    blk: u64,
    /// NONHEAD: the pcluster's block count, when this is the CBLKCNT entry.
    cblkcnt: Option<u64>,
    /// The byte after this index's pack (where ztailpacking's inline data starts).
    next_pack: u64,
}

/// How an extent's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// LZ4 block data.
    Lz4,
    /// Uncompressed, from the start of the pcluster.
    Plain,
}

/// One extent: decompressed bytes `la..la + llen` of the file come from `plen` bytes at `pa`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First byte of the file it holds.
    pub la: u64,
    /// Its decompressed length.
    pub llen: u64,
    /// Where its stored bytes start on the device.
    pub pa: u64,
    /// How many bytes are stored.
    pub plen: u64,
    /// How they are stored.
    pub codec: Codec,
    /// Stored inline after the inode (ztailpacking): not block-aligned, no padding.
    pub inline: bool,
}

/// The map header and what follows from it.
pub struct ZMap<'a> {
    src: &'a Source,
    sb: &'a Superblock,
    i: &'a Inode,
    advise: u16,
    lbits: u32,
    idata_size: u64,
    /// Where the indexes start.
    ibase: u64,
    /// Number of lclusters.
    total: u64,
}

fn corrupt(nid: u64, what: impl std::fmt::Display) -> ReadError {
    ReadError::Corrupt(format!("inode {nid}: {what}"))
}

/// An index's 2-bit type (the bits above `clusterofs` in compacted entries).
fn kind_of(t: u32) -> Option<Kind> {
    match t & 3 {
        0 => Some(Kind::Plain),
        1 => Some(Kind::Head),
        2 => Some(Kind::NonHead),
        _ => None,
    }
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

impl<'a> ZMap<'a> {
    /// Read the map header of compressed inode `i`.
    pub fn new(src: &'a Source, sb: &'a Superblock, i: &'a Inode) -> Result<ZMap<'a>> {
        let nid = i.nid;
        // Keeps every lcluster position arithmetic far from overflow.
        if i.size > 1 << 48 {
            return Err(corrupt(nid, format!("compressed file of {} bytes", i.size)));
        }
        let hpos = i.tail_offset().next_multiple_of(8);
        let legacy = i.layout == Layout::CompressedFull;
        // Legacy images without big pclusters or ztailpacking have no map header: LZ4, one
        // block per lcluster.
        let (advise, alg, cbits, idata_size) =
            if legacy && sb.feature_incompat & (FEATURE_BIG_PCLUSTER | FEATURE_ZTAILPACKING) == 0 {
                (0, 0, 0, 0)
            } else {
                let mut h = [0u8; 8];
                src.read_exact_at(&mut h, hpos)?;
                (le16(&h, 4), h[6] & 15, h[7] & 7, u64::from(le16(&h, 2)))
            };
        match alg {
            0 => {}
            1 => {
                return Err(ReadError::Unsupported(format!(
                    "inode {nid}: LZMA-compressed EROFS data (dmkit's reader decodes LZ4 only)"
                )))
            }
            a => return Err(corrupt(nid, format!("unknown compression algorithm {a}"))),
        }
        if advise & !ADVISE_KNOWN != 0 {
            return Err(ReadError::Unsupported(format!(
                "inode {nid}: EROFS compression advice {:#x} (interlaced or fragment \
                 pclusters, from erofs-utils 1.6) is not read",
                advise & !ADVISE_KNOWN
            )));
        }
        let lbits = u32::from(sb.blkszbits) + u32::from(cbits);
        let ibase = if legacy { hpos + 16 } else { hpos + 8 };
        if !legacy {
            // Compacted entries hold clusterofs in lbits bits beside a 2-bit type in 16 (or 14)
            // bits; big pcluster advice must agree between the two halves.
            if lbits > 14 {
                return Err(ReadError::Unsupported(format!(
                    "inode {nid}: compacted indexes with 2^{lbits}-byte lclusters"
                )));
            }
            if (advise & ADVISE_BIG_PCLUSTER_1 == 0) != (advise & ADVISE_BIG_PCLUSTER_2 == 0) {
                return Err(corrupt(
                    nid,
                    "big pcluster advice of the two index halves differ",
                ));
            }
        }
        let total = i.size.div_ceil(1 << lbits);
        Ok(ZMap {
            src,
            sb,
            i,
            advise,
            lbits,
            idata_size,
            ibase,
            total,
        })
    }

    fn nid(&self) -> u64 {
        self.i.nid
    }

    fn big(&self) -> bool {
        self.advise & ADVISE_BIG_PCLUSTER_1 != 0
    }

    fn lcluster(&self, lcn: u64) -> Result<Lcluster> {
        if lcn >= self.total {
            return Err(corrupt(
                self.nid(),
                format!("lcluster {lcn} past the end ({} lclusters)", self.total),
            ));
        }
        if self.i.layout == Layout::CompressedFull {
            self.legacy(lcn)
        } else {
            self.compacted(lcn)
        }
    }

    fn legacy(&self, lcn: u64) -> Result<Lcluster> {
        let pos = self.ibase + lcn * 8;
        let mut d = [0u8; 8];
        self.src.read_exact_at(&mut d, pos)?;
        let kind = kind_of(u32::from(le16(&d, 0)))
            .ok_or_else(|| corrupt(self.nid(), format!("lcluster {lcn}: index type 3")))?;
        let d0 = le16(&d, 4);
        let cblkcnt =
            (kind == Kind::NonHead && d0 & CBLKCNT != 0).then_some(u64::from(d0 & !CBLKCNT));
        if cblkcnt.is_some() && !self.big() {
            return Err(corrupt(
                self.nid(),
                format!("lcluster {lcn}: CBLKCNT without big pclusters"),
            ));
        }
        Ok(Lcluster {
            kind,
            clusterofs: u64::from(le16(&d, 2)),
            blk: u64::from(le32(&d, 4)),
            cblkcnt,
            next_pack: pos + 8,
        })
    }

    fn compacted(&self, lcn: u64) -> Result<Lcluster> {
        let nid = self.nid();
        let initial4 = ((32 - self.ibase % 32) / 4) % 8;
        let n2 = if self.advise & ADVISE_COMPACTED_2B != 0 && initial4 < self.total {
            (self.total - initial4) / 16 * 16
        } else {
            0
        };
        let (pos, shift) = if lcn < initial4 {
            (self.ibase + lcn * 4, 2)
        } else if lcn - initial4 < n2 {
            if self.lbits != 12 {
                return Err(corrupt(
                    nid,
                    "2-byte compacted indexes need 4 KiB lclusters",
                ));
            }
            (self.ibase + initial4 * 4 + (lcn - initial4) * 2, 1)
        } else {
            (
                self.ibase + initial4 * 4 + n2 * 2 + (lcn - initial4 - n2) * 4,
                2,
            )
        };
        let vcnt: usize = if shift == 2 { 2 } else { 16 };
        let packsize = (vcnt << shift) as u64;
        let base = pos / packsize * packsize;
        let mut pack = [0u8; 32];
        let pack = &mut pack[..packsize as usize];
        self.src.read_exact_at(pack, base)?;
        let encodebits = (packsize as usize - 4) * 8 / vcnt;
        let lomask = (1u32 << self.lbits) - 1;
        let decode = |j: usize| -> Result<(u32, Kind)> {
            let bit = encodebits * j;
            let mut w = [0u8; 4];
            let n = (packsize as usize - bit / 8).min(4);
            w[..n].copy_from_slice(&pack[bit / 8..bit / 8 + n]);
            let v = u32::from_le_bytes(w) >> (bit & 7);
            let kind = kind_of(v >> self.lbits).ok_or_else(|| {
                corrupt(nid, format!("lcluster index type 3 near lcluster {lcn}"))
            })?;
            Ok((v & lomask, kind))
        };
        let i = ((pos - base) >> shift) as usize;
        let next_pack = base + packsize;
        let (lo, kind) = decode(i)?;
        if kind == Kind::NonHead {
            let cblkcnt =
                (lo & u32::from(CBLKCNT) != 0).then_some(u64::from(lo & !u32::from(CBLKCNT)));
            if cblkcnt.is_some() && !self.big() {
                return Err(corrupt(
                    nid,
                    format!("lcluster {lcn}: CBLKCNT without big pclusters"),
                ));
            }
            return Ok(Lcluster {
                kind,
                clusterofs: 1 << self.lbits,
                blk: 0,
                cblkcnt,
                next_pack,
            });
        }
        // A HEAD's block: the pack's address plus the blocks of the pclusters before it in the
        // pack (one each, or their CBLKCNT with big pclusters).
        let mut nblk: u64 = if self.big() { 0 } else { 1 };
        let mut j = i as isize;
        while j > 0 {
            j -= 1;
            let (lo, k) = decode(j as usize)?;
            if !self.big() {
                if k == Kind::NonHead {
                    j -= lo as isize;
                }
                if j >= 0 {
                    nblk += 1;
                }
            } else if k == Kind::NonHead {
                if lo & u32::from(CBLKCNT) != 0 {
                    j -= 1;
                    nblk += u64::from(lo & !u32::from(CBLKCNT));
                } else if lo <= 1 {
                    return Err(corrupt(
                        nid,
                        format!("lcluster {lcn}: bad distance in its pack"),
                    ));
                } else {
                    j -= lo as isize - 2;
                }
            } else {
                nblk += 1;
            }
        }
        let blk = u64::from(le32(pack, packsize as usize - 4)) + nblk;
        Ok(Lcluster {
            kind,
            clusterofs: u64::from(lo),
            blk,
            cblkcnt: None,
            next_pack,
        })
    }

    /// The head lcluster of the extent holding byte `pos`: its number and index.
    fn head_of(&self, pos: u64) -> Result<(u64, Lcluster)> {
        let mut lcn = pos >> self.lbits;
        let l = self.lcluster(lcn)?;
        if l.kind != Kind::NonHead && pos & ((1 << self.lbits) - 1) >= l.clusterofs {
            return Ok((lcn, l));
        }
        let steps = MAX_EXTENT >> self.lbits;
        for _ in 0..=steps {
            if lcn == 0 {
                break;
            }
            lcn -= 1;
            let l = self.lcluster(lcn)?;
            if l.kind != Kind::NonHead {
                return Ok((lcn, l));
            }
        }
        Err(corrupt(
            self.nid(),
            format!("no head lcluster for byte {pos} within {MAX_EXTENT} bytes before it"),
        ))
    }

    /// The end of the extent whose head is lcluster `head`: the next head's start, or the
    /// file's end.
    fn end_of(&self, head: u64) -> Result<u64> {
        let steps = MAX_EXTENT >> self.lbits;
        for lcn in head + 1..=head + 1 + steps {
            if lcn << self.lbits >= self.i.size {
                return Ok(self.i.size);
            }
            let l = self.lcluster(lcn)?;
            if l.kind != Kind::NonHead {
                return Ok((lcn << self.lbits) + l.clusterofs.min(1 << self.lbits));
            }
        }
        Err(corrupt(
            self.nid(),
            format!("extent from lcluster {head} runs over {MAX_EXTENT} bytes"),
        ))
    }

    /// The extent holding byte `pos` (< the file's size).
    pub fn extent(&self, pos: u64) -> Result<Extent> {
        let nid = self.nid();
        let bs = self.sb.block_size();
        let (hlcn, h) = self.head_of(pos)?;
        let la = (hlcn << self.lbits) + h.clusterofs;
        let end = self.end_of(hlcn)?;
        if end <= pos || la > pos {
            return Err(corrupt(
                nid,
                format!("extent {la}..{end} does not hold byte {pos}"),
            ));
        }
        let llen = end - la;
        if llen > MAX_EXTENT {
            return Err(corrupt(nid, format!("extent of {llen} bytes")));
        }
        let codec = if h.kind == Kind::Plain {
            Codec::Plain
        } else {
            Codec::Lz4
        };
        if self.advise & ADVISE_INLINE_PCLUSTER != 0 {
            // The tail extent (holding the last byte) is inline after the last index's pack.
            let last = (self.i.size - 1) >> self.lbits;
            let (thead, _) = self.head_of(self.i.size - 1)?;
            if thead == hlcn {
                let pa = self.lcluster(last)?.next_pack;
                let plen = self.idata_size;
                if plen == 0 || pa % bs + plen > bs {
                    return Err(corrupt(
                        nid,
                        format!("inline pcluster of {plen} bytes at byte {pa} crosses its block"),
                    ));
                }
                return Ok(Extent {
                    la,
                    llen,
                    pa,
                    plen,
                    codec,
                    inline: true,
                });
            }
        }
        let blocks = if codec == Codec::Plain || !self.big() || hlcn + 1 >= self.total {
            1
        } else {
            let n = self.lcluster(hlcn + 1)?;
            match (n.kind, n.cblkcnt) {
                (Kind::NonHead, Some(c)) => c,
                (Kind::NonHead, None) => {
                    return Err(corrupt(
                        nid,
                        format!("lcluster {}: no CBLKCNT after the head", hlcn + 1),
                    ))
                }
                _ => 1,
            }
        };
        let plen = blocks << self.lbits;
        if blocks == 0 || plen > MAX_PCLUSTER {
            return Err(corrupt(nid, format!("pcluster of {blocks} lclusters")));
        }
        let pa = h
            .blk
            .checked_mul(bs)
            .filter(|&a| a.checked_add(plen).is_some_and(|e| e <= self.src.size()))
            .ok_or_else(|| {
                corrupt(
                    nid,
                    format!("pcluster at block {} is outside the file system", h.blk),
                )
            })?;
        Ok(Extent {
            la,
            llen,
            pa,
            plen,
            codec,
            inline: false,
        })
    }
}
