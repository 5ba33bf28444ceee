//! Fix every inode time of an ext4 image `mkfs.ext4 -d` just made.
//!
//! `mke2fs -d` copies each file's access, change and modification times from the tree (and
//! e2fsprogs 1.47.0 has no option to override them), so two builds of the same tree differ
//! wherever the tree was read or copied in between. This pass sets the four inode times (and
//! their nanosecond fields) of every in-use inode to one value and rewrites the inode checksum,
//! as the kernel computes it (`ext4_inode_csum`), when the file system has `metadata_csum`.
//! `e2fsck -fn` accepts the result.

use crate::codec::{Reader, SliceWriter};
use std::fs::File;
use std::os::unix::fs::FileExt;

const SB: u64 = 1024;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_CSUM_SEED: u32 = 0x2000;
const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
const BG_INODE_UNINIT: u16 = 0x1;
const EXT4_EA_INODE_FL: u32 = 0x0020_0000;
const GOOD_OLD_INODE_SIZE: usize = 128;

/// The kernel's `ext4_chksum`: the raw CRC-32C register update (no inversions).
fn chksum(crc: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!crc, data)
}

/// The little-endian field `what` at byte `o` of `b`; past the end is an error naming it.
fn le16(b: &[u8], o: usize, what: &'static str) -> Result<u16, String> {
    Reader::at(b, o, what)
        .and_then(|mut r| r.u16_le(what))
        .map_err(|e| e.to_string())
}

/// As [`le16`], 32 bits.
fn le32(b: &[u8], o: usize, what: &'static str) -> Result<u32, String> {
    Reader::at(b, o, what)
        .and_then(|mut r| r.u32_le(what))
        .map_err(|e| e.to_string())
}

/// Write the little-endian field `what` at byte `o` of `b`.
fn put(b: &mut [u8], o: usize, v: &[u8], what: &'static str) -> Result<(), String> {
    SliceWriter::new(b)
        .seek(o, what)
        .and_then(|w| w.bytes(v, what))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn read(f: &File, len: usize, off: u64, what: &str) -> Result<Vec<u8>, String> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off)
        .map_err(|e| format!("{what} at byte {off}: {e}"))?;
    Ok(b)
}

/// What was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    /// Inodes rewritten.
    pub inodes: u64,
    /// Superblocks rewritten (the primary and the backups).
    pub superblocks: u64,
}

/// Set the times of every in-use inode of the ext4 image in `f` to `time`.
pub fn fix_times(f: &File, time: u32) -> Result<Fixed, String> {
    let sb = read(f, 1024, SB, "superblock")?;
    if le16(&sb, 0x38, "s_magic")? != 0xEF53 {
        return Err("not an ext4 file system (no magic 0xEF53)".into());
    }
    let log = le32(&sb, 0x18, "s_log_block_size")?;
    if log > 6 {
        return Err(format!("s_log_block_size {log} is out of range"));
    }
    let block = 1024u64 << log;
    let incompat = le32(&sb, 0x60, "s_feature_incompat")?;
    let ro_compat = le32(&sb, 0x64, "s_feature_ro_compat")?;
    let inode_size = if le32(&sb, 0x4C, "s_rev_level")? == 0 {
        GOOD_OLD_INODE_SIZE
    } else {
        le16(&sb, 0x58, "s_inode_size")? as usize
    };
    if inode_size < GOOD_OLD_INODE_SIZE
        || !inode_size.is_power_of_two()
        || inode_size as u64 > block
    {
        return Err(format!("s_inode_size {inode_size} is out of range"));
    }
    let ipg = le32(&sb, 0x28, "s_inodes_per_group")? as u64;
    let bpg = le32(&sb, 0x20, "s_blocks_per_group")? as u64;
    let first_data_block = le32(&sb, 0x14, "s_first_data_block")? as u64;
    let mut blocks = le32(&sb, 0x04, "s_blocks_count_lo")? as u64;
    let desc_size = if incompat & INCOMPAT_64BIT != 0 {
        blocks |= (le32(&sb, 0x150, "s_blocks_count_hi")? as u64) << 32;
        le16(&sb, 0xFE, "s_desc_size")? as u64
    } else {
        32
    };
    if ipg == 0 || bpg == 0 || !(32..=1024).contains(&desc_size) || ipg > block * 8 {
        return Err("superblock group geometry is out of range".into());
    }
    let groups = blocks.saturating_sub(first_data_block).div_ceil(bpg);
    let file_len = f.metadata().map_err(|e| e.to_string())?.len();
    if groups.saturating_mul(desc_size) > file_len || blocks.saturating_mul(block) > file_len {
        return Err(format!(
            "the superblock describes {blocks} blocks of {block} bytes, the file has {file_len} bytes"
        ));
    }
    let csum = ro_compat & RO_COMPAT_METADATA_CSUM != 0;
    let fs_seed = if incompat & INCOMPAT_CSUM_SEED != 0 {
        le32(&sb, 0x270, "s_checksum_seed")?
    } else {
        chksum(!0, &sb[0x68..0x78])
    };
    let gdt = read(
        f,
        (groups * desc_size) as usize,
        (first_data_block + 1) * block,
        "group descriptors",
    )?;
    let mut fixed = 0u64;
    for g in 0..groups {
        let d = Reader::at(&gdt, (g * desc_size) as usize, "group descriptor")
            .and_then(|mut r| r.take(desc_size as usize, "group descriptor"))
            .map_err(|e| e.to_string())?;
        if le16(d, 0x12, "bg_flags")? & BG_INODE_UNINIT != 0 {
            continue;
        }
        let hi = |o: usize, what| -> Result<u64, String> {
            Ok(if desc_size >= 64 {
                (le32(d, o, what)? as u64) << 32
            } else {
                0
            })
        };
        let bitmap_block =
            le32(d, 0x04, "bg_inode_bitmap_lo")? as u64 | hi(0x24, "bg_inode_bitmap_hi")?;
        let table_block =
            le32(d, 0x08, "bg_inode_table_lo")? as u64 | hi(0x28, "bg_inode_table_hi")?;
        let bitmap = read(
            f,
            ipg.div_ceil(8) as usize,
            bitmap_block * block,
            "inode bitmap",
        )?;
        let table_bytes = ipg as usize * inode_size;
        let mut table = read(f, table_bytes, table_block * block, "inode table")?;
        let mut dirty = false;
        for i in 0..ipg as usize {
            if bitmap[i / 8] & (1 << (i % 8)) == 0 {
                continue;
            }
            let raw = &mut table[i * inode_size..(i + 1) * inode_size];
            // xattr value inodes keep a hash and a refcount in their time fields; reserved
            // inodes mke2fs never filled in stay all zero.
            let untouched = le16(raw, 0, "i_mode")? == 0 && raw[0x08..0x14].iter().all(|&b| b == 0);
            if le32(raw, 0x20, "i_flags")? & EXT4_EA_INODE_FL != 0 || untouched {
                continue;
            }
            let ino = g * ipg + i as u64 + 1;
            set_times(raw, inode_size, time)?;
            if csum {
                set_checksum(raw, inode_size, fs_seed, ino as u32)?;
            }
            dirty = true;
            fixed += 1;
        }
        if dirty {
            f.write_all_at(&table, table_block * block)
                .map_err(|e| format!("inode table of group {g}: {e}"))?;
        }
    }
    let superblocks = fix_superblocks(f, &sb, groups, bpg, first_data_block, block, time)?;
    Ok(Fixed {
        inodes: fixed,
        superblocks,
    })
}

/// Whether group `g` holds a backup superblock.
fn has_backup(sb: &[u8], g: u64) -> Result<bool, String> {
    const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
    const COMPAT_SPARSE_SUPER2: u32 = 0x200;
    if g == 0 {
        return Ok(true);
    }
    if le32(sb, 0x5C, "s_feature_compat")? & COMPAT_SPARSE_SUPER2 != 0 {
        return Ok(g == le32(sb, 0x24C, "s_backup_bgs[0]")? as u64
            || g == le32(sb, 0x250, "s_backup_bgs[1]")? as u64);
    }
    if le32(sb, 0x64, "s_feature_ro_compat")? & RO_COMPAT_SPARSE_SUPER == 0 || g == 1 {
        return Ok(true);
    }
    Ok([3u64, 5, 7].iter().any(|&b| {
        let mut p = b;
        while p < g {
            p *= b;
        }
        p == g
    }))
}

/// Set the superblock times (write, check, creation) of the primary and every backup
/// superblock, and their checksums: mke2fs takes `E2FSPROGS_FAKE_TIME=0` as no fake time.
fn fix_superblocks(
    f: &File,
    primary: &[u8],
    groups: u64,
    bpg: u64,
    first_data_block: u64,
    block: u64,
    time: u32,
) -> Result<u64, String> {
    let csum = le32(primary, 0x64, "s_feature_ro_compat")? & RO_COMPAT_METADATA_CSUM != 0;
    let mut n = 0;
    for g in 0..groups {
        if !has_backup(primary, g)? {
            continue;
        }
        let off = if g == 0 {
            SB
        } else {
            (g * bpg + first_data_block) * block
        };
        let mut sb = read(f, 1024, off, "superblock")?;
        if le16(&sb, 0x38, "s_magic")? != 0xEF53 {
            continue;
        }
        // s_wtime, s_lastcheck, s_mkfs_time and their _hi bytes (s_mtime stays 0: never mounted).
        for (o, what) in [
            (0x30, "s_wtime"),
            (0x40, "s_lastcheck"),
            (0x108, "s_mkfs_time"),
        ] {
            put(&mut sb, o, &time.to_le_bytes(), what)?;
        }
        for (o, what) in [
            (0x274, "s_wtime_hi"),
            (0x276, "s_lastcheck_hi"),
            (0x277, "s_mkfs_time_hi"),
        ] {
            put(&mut sb, o, &[0], what)?;
        }
        if csum {
            let c = chksum(!0, &sb[..0x3FC]);
            put(&mut sb, 0x3FC, &c.to_le_bytes(), "s_checksum")?;
        }
        f.write_all_at(&sb, off)
            .map_err(|e| format!("superblock of group {g}: {e}"))?;
        n += 1;
    }
    Ok(n)
}

/// Whether the 4-byte field at `off` lies inside the inode's extra space.
fn fits(raw: &[u8], inode_size: usize, off: usize, len: usize) -> Result<bool, String> {
    Ok(inode_size > GOOD_OLD_INODE_SIZE
        && off + len <= GOOD_OLD_INODE_SIZE + le16(raw, 0x80, "i_extra_isize")? as usize
        && off + len <= inode_size)
}

fn set_times(raw: &mut [u8], inode_size: usize, time: u32) -> Result<(), String> {
    for (off, what) in [(0x08, "i_atime"), (0x0C, "i_ctime"), (0x10, "i_mtime")] {
        put(raw, off, &time.to_le_bytes(), what)?;
    }
    for (off, v, what) in [
        (0x84, 0, "i_ctime_extra"),
        (0x88, 0, "i_mtime_extra"),
        (0x8C, 0, "i_atime_extra"),
        (0x90, time, "i_crtime"),
        (0x94, 0, "i_crtime_extra"),
    ] {
        if fits(raw, inode_size, off, 4)? {
            put(raw, off, &u32::to_le_bytes(v), what)?;
        }
    }
    Ok(())
}

fn set_checksum(raw: &mut [u8], inode_size: usize, fs_seed: u32, ino: u32) -> Result<(), String> {
    let gen = &raw[0x64..0x68];
    let seed = chksum(chksum(fs_seed, &ino.to_le_bytes()), gen);
    let has_hi = fits(raw, inode_size, 0x82, 2)?;
    let mut c = chksum(seed, &raw[..0x7C]);
    c = chksum(c, &[0, 0]);
    c = chksum(c, &raw[0x7E..GOOD_OLD_INODE_SIZE]);
    if inode_size > GOOD_OLD_INODE_SIZE {
        c = chksum(c, &raw[GOOD_OLD_INODE_SIZE..0x82]);
        let mut rest = 0x82;
        if has_hi {
            c = chksum(c, &[0, 0]);
            rest = 0x84;
        }
        c = chksum(c, &raw[rest..inode_size]);
    }
    put(raw, 0x7C, &(c as u16).to_le_bytes(), "i_checksum_lo")?;
    if has_hi {
        put(
            raw,
            0x82,
            &((c >> 16) as u16).to_le_bytes(),
            "i_checksum_hi",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_crc_matches_the_kernel_convention() {
        // crc32c("123456789") with seed ~0 and final inversion is 0xE3069283; the raw
        // register update is its complement.
        assert_eq!(!chksum(!0, b"123456789"), 0xE306_9283);
    }
}
