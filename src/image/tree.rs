//! What a source tree holds, counted once before building: files, directories, bytes and the
//! blocks and inodes an ext4 file system needs for it.

use super::ImageError;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Counts of a tree (hard links counted once).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TreeStats {
    /// Regular files.
    pub files: u64,
    /// Directories (the top one included).
    pub dirs: u64,
    /// Symbolic links, devices, FIFOs and sockets.
    pub other: u64,
    /// Bytes in regular files.
    pub bytes: u64,
    /// 4 KiB blocks the regular files' data fills.
    pub data_blocks: u64,
    /// Directory entries over all directories (for directory block estimates).
    pub entries: u64,
}

impl TreeStats {
    /// Walk `dir` (never following symbolic links).
    pub fn scan(dir: &Path) -> Result<TreeStats, ImageError> {
        let meta = std::fs::symlink_metadata(dir).map_err(|e| {
            ImageError::Invalid(format!("{}: cannot use as a tree: {e}", dir.display()))
        })?;
        if !meta.is_dir() {
            return Err(ImageError::Invalid(format!(
                "{}: not a directory",
                dir.display()
            )));
        }
        let mut s = TreeStats {
            dirs: 1,
            ..TreeStats::default()
        };
        let mut seen = HashSet::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let rd = std::fs::read_dir(&d)
                .map_err(|e| ImageError::Invalid(format!("{}: cannot read: {e}", d.display())))?;
            for entry in rd {
                let entry = entry.map_err(|e| {
                    ImageError::Invalid(format!("{}: cannot read: {e}", d.display()))
                })?;
                s.entries += 1;
                let path = entry.path();
                let m = std::fs::symlink_metadata(&path).map_err(|e| {
                    ImageError::Invalid(format!("{}: cannot stat: {e}", path.display()))
                })?;
                if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                    continue;
                }
                if m.is_dir() {
                    s.dirs += 1;
                    stack.push(path);
                } else if m.is_file() {
                    s.files += 1;
                    s.bytes += m.len();
                    s.data_blocks += m.len().div_ceil(4096);
                } else {
                    s.other += 1;
                }
            }
        }
        Ok(s)
    }

    /// Inodes the tree takes.
    pub fn inodes(&self) -> u64 {
        self.files + self.dirs + self.other
    }

    /// A size for an ext4 file system holding the tree: data, directory blocks, inode tables
    /// (256 bytes per inode, with a quarter spare), the journal mke2fs picks, and 10% slack.
    pub fn ext4_size_estimate(&self) -> u64 {
        let dir_blocks = self.dirs + self.entries * 32 / 4096;
        let inodes = self.ext4_inodes();
        let raw = (self.data_blocks + dir_blocks) * 4096 + inodes * 256;
        let with_slack = raw + raw / 10 + (16 << 20);
        // ext2fs_default_journal_size: 16 MiB up to 1 GiB of blocks, 64 MiB up to 16 GiB...
        let journal = match with_slack >> 12 {
            0..=262_143 => 16 << 20,
            262_144..=524_287 => 32 << 20,
            524_288..=4_194_303 => 64 << 20,
            _ => 256 << 20,
        };
        (with_slack + journal).div_ceil(1 << 20) << 20
    }

    /// Inodes to ask mke2fs for: the tree's, a quarter spare, and room for lost+found.
    pub fn ext4_inodes(&self) -> u64 {
        let n = self.inodes();
        n + n / 4 + 64
    }
}
