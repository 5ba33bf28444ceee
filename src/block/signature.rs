//! What a device already holds: the magic numbers of the common filesystems, of LUKS, dm-verity
//! and dm-integrity superblocks, and of partition tables, named as `blkid -p` names them
//! (its `TYPE` and `PTTYPE`), so a destructive command can say what it is about to overwrite, as
//! cryptsetup's `tools_detect_signatures` does.
//!
//! The probe reads at most [`HEAD_LEN`] bytes at the start of the region plus eight bytes at
//! each place a LUKS2 secondary header may sit, and looks only at fixed offsets inside what it
//! read: a short or hostile device gives fewer findings, never a panic or a large read.
//! Lengths stored on disk are never followed.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bytes at the start of a region the probe reads: enough for a btrfs superblock (64 KiB in)
/// and for a swap signature on a 64 KiB page.
pub const HEAD_LEN: usize = 68 * 1024;

/// Where LUKS2 puts its secondary header (after a primary of 16 KiB ... 4 MiB), as blkid
/// checks them. Those inside [`HEAD_LEN`] are seen in the head.
const LUKS2_SECONDARY: [u64; 9] = [
    0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000, 0x100000, 0x200000, 0x400000,
];

/// What kind of signature was found: cryptsetup words its warning after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureKind {
    /// A filesystem or a LUKS/verity/integrity header (blkid's `TYPE`).
    Superblock,
    /// A partition table (blkid's `PTTYPE`).
    PartitionTable,
}

/// One signature found on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    /// blkid's name for it: `ext4`, `vfat`, `crypto_LUKS`, `DM_verity_hash`, `gpt`, ...
    pub name: &'static str,
    /// Superblock or partition table.
    pub kind: SignatureKind,
}

impl Signature {
    fn superblock(name: &'static str) -> Self {
        Signature {
            name,
            kind: SignatureKind::Superblock,
        }
    }
    fn table(name: &'static str) -> Self {
        Signature {
            name,
            kind: SignatureKind::PartitionTable,
        }
    }
}

/// `len` bytes at `off` of `b`, or `None` when `b` is shorter.
fn at(b: &[u8], off: usize, len: usize) -> Option<&[u8]> {
    b.get(off..off.checked_add(len)?)
}

fn has(b: &[u8], off: usize, magic: &[u8]) -> bool {
    at(b, off, magic.len()) == Some(magic)
}

fn le16(b: &[u8], off: usize) -> Option<u16> {
    at(b, off, 2).map(|s| u16::from_le_bytes([s[0], s[1]]))
}

fn le32(b: &[u8], off: usize) -> Option<u32> {
    at(b, off, 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// LUKS1 or LUKS2 primary header at 0, or a LUKS2 secondary header in the head.
fn luks(head: &[u8]) -> bool {
    has(head, 0, b"LUKS\xba\xbe")
        || LUKS2_SECONDARY
            .iter()
            .any(|&off| luks2_secondary(at(head, off as usize, 8).unwrap_or(&[])))
}

/// Whether `b` (eight bytes read at one of the secondary header offsets) starts a LUKS2
/// secondary header: its magic and version 2.
pub fn luks2_secondary(b: &[u8]) -> bool {
    has(b, 0, b"SKUL\xba\xbe\x00\x02")
}

/// ext2, ext3, ext4 (or an external ext journal) by blkid's rules: the magic at 1080, then
/// the feature flags say which.
fn ext(head: &[u8]) -> Option<&'static str> {
    const SB: usize = 1024;
    if le16(head, SB + 0x38)? != 0xEF53 {
        return None;
    }
    let compat = le32(head, SB + 0x5C)?;
    let incompat = le32(head, SB + 0x60)?;
    let ro_compat = le32(head, SB + 0x64)?;
    const HAS_JOURNAL: u32 = 0x4;
    const JOURNAL_DEV: u32 = 0x8;
    // What ext3 understands (FILETYPE, RECOVER, META_BG; SPARSE_SUPER, LARGE_FILE, BTREE_DIR):
    // anything more makes it ext4.
    const EXT3_INCOMPAT: u32 = 0x2 | 0x4 | 0x10;
    const EXT3_RO_COMPAT: u32 = 0x1 | 0x2 | 0x4;
    Some(if incompat & JOURNAL_DEV != 0 {
        "jbd"
    } else if incompat & !EXT3_INCOMPAT != 0 || ro_compat & !EXT3_RO_COMPAT != 0 {
        "ext4"
    } else if compat & HAS_JOURNAL != 0 {
        "ext3"
    } else {
        "ext2"
    })
}

/// A FAT boot sector: one of FAT's type strings and a sane BIOS parameter block (blkid checks
/// the same fields before it says vfat).
fn vfat(head: &[u8]) -> bool {
    let named = [b"FAT12   ".as_slice(), b"FAT16   ", b"FAT     ", b"MSDOS"]
        .iter()
        .any(|m| has(head, 0x36, m))
        || [b"FAT32   ".as_slice(), b"MSWIN"]
            .iter()
            .any(|m| has(head, 0x52, m));
    if !named {
        return false;
    }
    let sector = le16(head, 11).unwrap_or(0);
    let per_cluster = head.get(13).copied().unwrap_or(0);
    let fats = head.get(16).copied().unwrap_or(0);
    matches!(sector, 512 | 1024 | 2048 | 4096) && per_cluster.is_power_of_two() && fats > 0
}

/// A swap area: its signature at the end of the first page, for any page size up to 64 KiB.
fn swap(head: &[u8]) -> bool {
    [4096usize, 8192, 16384, 32768, 65536]
        .iter()
        .any(|page| has(head, page - 10, b"SWAPSPACE2") || has(head, page - 10, b"SWAP-SPACE"))
}

/// A DOS (MBR) partition table: the boot signature, four entries whose boot flags are 0 or
/// 0x80, and at least one partition. Called only when no filesystem claimed sector 0.
fn mbr(head: &[u8]) -> bool {
    if !has(head, 510, b"\x55\xaa") {
        return false;
    }
    let entries: Vec<&[u8]> = (0..4).filter_map(|i| at(head, 446 + 16 * i, 16)).collect();
    entries.len() == 4
        && entries.iter().all(|e| e[0] == 0 || e[0] == 0x80)
        && entries.iter().any(|e| e[4] != 0)
}

/// Every signature in `head`, the first bytes of a region (any length: what is cut off is
/// simply not found). Superblocks first, then partition tables.
pub fn probe_head(head: &[u8]) -> Vec<Signature> {
    let mut found = Vec::new();
    let mut push = |name| found.push(Signature::superblock(name));
    if luks(head) {
        push("crypto_LUKS");
    }
    if has(head, 0, b"verity\0\0") {
        push("DM_verity_hash");
    }
    if has(head, 0, b"integrt\0") {
        push("DM_integrity");
    }
    if let Some(name) = ext(head) {
        push(name);
    }
    if has(head, 0, b"XFSB") {
        push("xfs");
    }
    if has(head, 0x10040, b"_BHRfS_M") {
        push("btrfs");
    }
    let fat = vfat(head);
    if fat {
        push("vfat");
    }
    if swap(head) {
        push("swap");
    }
    if has(head, 0, b"hsqs") {
        push("squashfs");
    }
    if le32(head, 1024) == Some(0xE0F5_E1E2) {
        push("erofs");
    }
    if has(head, 0x8001, b"CD001") {
        push("iso9660");
    }
    // A GPT header in LBA 1, for 512- or 4096-byte sectors; its protective MBR is not a DOS
    // table of its own. A FAT boot sector ends with the same 0x55AA as an MBR.
    if has(head, 512, b"EFI PART") || has(head, 4096, b"EFI PART") {
        found.push(Signature::table("gpt"));
    } else if !fat && mbr(head) {
        found.push(Signature::table("dos"));
    }
    found
}

/// Every signature in `file` from byte `offset` on (a region of a device: a verity hash area
/// may start past the data). A region that is missing or empty holds none.
pub fn probe_file(file: &File, offset: u64) -> io::Result<Vec<Signature>> {
    let mut head = vec![0u8; HEAD_LEN];
    let n = read_full(file, &mut head, offset)?;
    head.truncate(n);
    let mut found = probe_head(&head);
    let seen_luks = found.iter().any(|s| s.name == "crypto_LUKS");
    if !seen_luks {
        for &off in LUKS2_SECONDARY.iter().filter(|&&o| o >= HEAD_LEN as u64) {
            let mut magic = [0u8; 8];
            let Some(pos) = offset.checked_add(off) else {
                break;
            };
            if read_full(file, &mut magic, pos)? == magic.len() && luks2_secondary(&magic) {
                found.insert(0, Signature::superblock("crypto_LUKS"));
                break;
            }
        }
    }
    Ok(found)
}

/// Read into `buf` at `offset` until it is full or the file ends; the bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // pread(2) takes a signed offset: past it there is nothing to read.
        let Some(pos) = offset
            .checked_add(done as u64)
            .filter(|&p| i64::try_from(p).is_ok())
        else {
            break;
        };
        match file.read_at(&mut buf[done..], pos) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(head: &[u8]) -> Vec<&'static str> {
        probe_head(head).iter().map(|s| s.name).collect()
    }

    fn with(len: usize, writes: &[(usize, &[u8])]) -> Vec<u8> {
        let mut b = vec![0u8; len];
        for (off, bytes) in writes {
            b[*off..off + bytes.len()].copy_from_slice(bytes);
        }
        b
    }

    #[test]
    fn zeros_and_empty_hold_nothing() {
        assert!(probe_head(&[]).is_empty());
        assert!(probe_head(&vec![0u8; HEAD_LEN]).is_empty());
    }

    #[test]
    fn headers_at_offset_zero() {
        assert_eq!(
            names(&with(4096, &[(0, b"LUKS\xba\xbe\0\x02")])),
            ["crypto_LUKS"]
        );
        assert_eq!(
            names(&with(4096, &[(0, b"verity\0\0")])),
            ["DM_verity_hash"]
        );
        assert_eq!(names(&with(4096, &[(0, b"integrt\0")])), ["DM_integrity"]);
        assert_eq!(names(&with(4096, &[(0, b"XFSB")])), ["xfs"]);
        assert_eq!(names(&with(4096, &[(0, b"hsqs")])), ["squashfs"]);
        assert_eq!(names(&with(0x10048, &[(0x10040, b"_BHRfS_M")])), ["btrfs"]);
        assert_eq!(names(&with(0x8006, &[(0x8001, b"CD001")])), ["iso9660"]);
    }

    #[test]
    fn a_luks2_secondary_header_alone_is_luks() {
        let b = with(0x8008, &[(0x8000, b"SKUL\xba\xbe\0\x02")]);
        assert_eq!(names(&b), ["crypto_LUKS"]);
        // Another version is not LUKS2's.
        let b = with(0x8008, &[(0x8000, b"SKUL\xba\xbe\0\x03")]);
        assert!(names(&b).is_empty());
    }

    #[test]
    fn ext_flavours_follow_the_feature_flags() {
        let sb = |compat: u32, incompat: u32, ro: u32| {
            with(
                2048,
                &[
                    (1024 + 0x38, &0xEF53u16.to_le_bytes()),
                    (1024 + 0x5C, &compat.to_le_bytes()),
                    (1024 + 0x60, &incompat.to_le_bytes()),
                    (1024 + 0x64, &ro.to_le_bytes()),
                ],
            )
        };
        assert_eq!(names(&sb(0, 0x2, 0x3)), ["ext2"]);
        assert_eq!(names(&sb(0x4, 0x2, 0x3)), ["ext3"]);
        assert_eq!(names(&sb(0x4, 0x2 | 0x40, 0x3)), ["ext4"]);
        assert_eq!(names(&sb(0, 0x8, 0)), ["jbd"]);
    }

    #[test]
    fn swap_on_any_page_size() {
        for page in [4096usize, 65536] {
            let b = with(HEAD_LEN, &[(page - 10, b"SWAPSPACE2")]);
            assert_eq!(names(&b), ["swap"], "page {page}");
        }
    }

    #[test]
    fn partition_tables() {
        let mut entry = [0u8; 16];
        entry[4] = 0x83;
        let dos = with(512, &[(446, &entry), (510, b"\x55\xaa")]);
        assert_eq!(probe_head(&dos), [Signature::table("dos")]);
        // A bad boot flag, or no partition at all: not a table.
        let mut bad = entry;
        bad[0] = 0x12;
        assert!(names(&with(512, &[(446, &bad), (510, b"\x55\xaa")])).is_empty());
        assert!(names(&with(512, &[(510, b"\x55\xaa")])).is_empty());
        let mut protective = entry;
        protective[4] = 0xEE;
        let gpt = with(
            1024,
            &[(446, &protective), (510, b"\x55\xaa"), (512, b"EFI PART")],
        );
        assert_eq!(probe_head(&gpt), [Signature::table("gpt")]);
    }

    #[test]
    fn a_fat_boot_sector_is_not_also_a_dos_table() {
        let mut b = with(
            512,
            &[
                (0x36, b"FAT16   "),
                (11, &512u16.to_le_bytes()),
                (510, b"\x55\xaa"),
            ],
        );
        b[13] = 4;
        b[16] = 2;
        b[446 + 4] = 0x06;
        assert_eq!(names(&b), ["vfat"]);
        // An impossible sector size is not FAT.
        b[11] = 3;
        assert_eq!(names(&b), ["dos"]);
    }

    #[test]
    fn every_cut_of_a_signature_is_safe() {
        // Truncated anywhere, each signature's bytes give a subset of the findings.
        let full = with(
            HEAD_LEN,
            &[
                (1024 + 0x38, &0xEF53u16.to_le_bytes()),
                (0x10040, b"_BHRfS_M"),
                (0x8001, b"CD001"),
                (4086, b"SWAPSPACE2"),
                (510, b"\x55\xaa"),
            ],
        );
        for cut in (0..HEAD_LEN).step_by(7) {
            let _ = probe_head(&full[..cut]);
        }
        assert_eq!(names(&full), ["ext2", "btrfs", "swap", "iso9660"]);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut b = vec![0u8; HEAD_LEN];
        for round in 0..64 {
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            let _ = probe_head(&b[..HEAD_LEN - round * 997]);
        }
    }

    #[test]
    fn probe_file_reads_a_region_and_far_luks2_secondaries() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0u8; 0x100000]).unwrap();
        f.write_all(b"SKUL\xba\xbe\0\x02").unwrap();
        f.write_all(&vec![0u8; 4096]).unwrap();
        f.write_all(b"verity\0\0").unwrap();
        assert_eq!(
            probe_file(&f, 0).unwrap(),
            [Signature::superblock("crypto_LUKS")]
        );
        assert_eq!(
            probe_file(&f, 0x100000 + 8 + 4096).unwrap(),
            [Signature::superblock("DM_verity_hash")]
        );
        assert!(probe_file(&f, u64::MAX - 4).unwrap().is_empty());
    }
}
