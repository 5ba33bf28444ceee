//! The three file system builders and their settings: the real `mkfs.erofs`, `mksquashfs` and
//! `mkfs.ext4 -d`, told to be reproducible (every timestamp fixed, UUIDs and hash seeds from
//! the image's seed), with the compression settings of SEEDS.md seed 001.
//!
//! This file only decides command lines; running them is [`super::build`]'s job.

use super::ImageError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A read-only root file system type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    /// EROFS (`mkfs.erofs`, erofs-utils).
    Erofs,
    /// SquashFS (`mksquashfs`, squashfs-tools).
    Squashfs,
    /// ext4 (`mkfs.ext4 -d`, e2fsprogs).
    Ext4,
}

impl FsKind {
    /// Parse `erofs`, `squashfs` or `ext4`.
    pub fn parse(s: &str) -> Result<FsKind, ImageError> {
        match s {
            "erofs" => Ok(FsKind::Erofs),
            "squashfs" => Ok(FsKind::Squashfs),
            "ext4" => Ok(FsKind::Ext4),
            _ => Err(ImageError::Invalid(format!(
                "--fs: unsupported file system {s:?} (erofs, squashfs or ext4)"
            ))),
        }
    }

    /// The name, as `mount -t` spells it.
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Erofs => "erofs",
            FsKind::Squashfs => "squashfs",
            FsKind::Ext4 => "ext4",
        }
    }

    /// The program that builds it.
    pub fn program(self) -> &'static str {
        match self {
            FsKind::Erofs => "mkfs.erofs",
            FsKind::Squashfs => "mksquashfs",
            FsKind::Ext4 => "mkfs.ext4",
        }
    }

    /// The Debian package shipping [`FsKind::program`].
    pub fn package(self) -> &'static str {
        match self {
            FsKind::Erofs => "erofs-utils",
            FsKind::Squashfs => "squashfs-tools",
            FsKind::Ext4 => "e2fsprogs",
        }
    }

    /// Which file system `data` (its first 4 KiB or more) holds, by magic number.
    pub fn probe(data: &[u8]) -> Option<FsKind> {
        let le32 = |o: usize| {
            data.get(o..o + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        if data.get(0..4) == Some(b"hsqs") {
            Some(FsKind::Squashfs)
        } else if le32(1024) == Some(0xE0F5_E1E2) {
            Some(FsKind::Erofs)
        } else if data.get(1080..1082) == Some(&[0x53, 0xEF]) {
            Some(FsKind::Ext4)
        } else {
            None
        }
    }
}

/// A compression setting of seed 001's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compression {
    /// The name given to `--compress` (normalized).
    pub name: String,
    /// The options it stands for.
    pub args: Vec<String>,
    /// EROFS: a compressor the tool must offer (`lz4hc`, `lzma`).
    pub needs_compressor: Option<&'static str>,
    /// EROFS: extended options that need erofs-utils 1.6 (1.5 ignores them silently).
    pub needs_erofs_1_6: bool,
    /// EROFS: write the per-file hints file and pass it.
    pub hints: bool,
}

/// The pcluster sizes of the EROFS hints preset, by path pattern (the shape of erofs-utils'
/// docs/compress-hints.example: shared objects small for random access, the rest larger).
pub const EROFS_HINTS: &str = "4096 .*\\.so(\\.[0-9.]+)?$\n32768 (s)?bin/.*$\n16384 .*\n";

/// The `--compress` names each file system takes, for messages.
pub fn compress_names(kind: FsKind) -> &'static str {
    match kind {
        FsKind::Squashfs => "none, gzip (default), lz4hc, lz4, xz, lzo, zstd",
        FsKind::Erofs => {
            "none (default), lz4, lz4hc[,LEVEL], lzma[,LEVEL], big-pcluster, hints, well-compressed"
        }
        FsKind::Ext4 => "none",
    }
}

impl Compression {
    /// Parse `--compress` for `kind` (`None`: the file system's default).
    pub fn parse(kind: FsKind, s: Option<&str>) -> Result<Compression, ImageError> {
        let c = |name: &str, args: &[&str]| Compression {
            name: name.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            needs_compressor: None,
            needs_erofs_1_6: false,
            hints: false,
        };
        let unsupported = || {
            ImageError::Invalid(format!(
                "--compress: unsupported compressor {:?} for {} (one of: {})",
                s.unwrap_or_default(),
                kind.name(),
                compress_names(kind)
            ))
        };
        let level = |alg: &'static str, rest: Option<&str>, max: u32| -> Result<_, ImageError> {
            let mut x = c(alg, &[]);
            x.needs_compressor = Some(alg);
            match rest {
                None => x.args.push(format!("-z{alg}")),
                Some(l) => {
                    let n: u32 = l.parse().map_err(|_| unsupported())?;
                    if n > max {
                        return Err(ImageError::Invalid(format!(
                            "--compress: {alg} level {n} is out of range (0 to {max})"
                        )));
                    }
                    x.name = format!("{alg},{n}");
                    x.args.push(format!("-z{alg},{n}"));
                }
            }
            Ok(x)
        };
        match kind {
            FsKind::Squashfs => Ok(match s.unwrap_or("gzip") {
                "none" => c("none", &["-noD", "-noI", "-noX", "-noF"]),
                "gzip" => c("gzip", &["-comp", "gzip"]),
                "lz4hc" => c("lz4hc", &["-comp", "lz4", "-Xhc"]),
                "lz4" => c("lz4", &["-comp", "lz4"]),
                "xz" => c("xz", &["-comp", "xz"]),
                "lzo" => c("lzo", &["-comp", "lzo"]),
                "zstd" => c("zstd", &["-comp", "zstd"]),
                _ => return Err(unsupported()),
            }),
            FsKind::Erofs => {
                let s = s.unwrap_or("none");
                let (alg, rest) = match s.split_once(',') {
                    Some((a, r)) => (a, Some(r)),
                    None => (s, None),
                };
                match (alg, rest) {
                    ("none", None) => Ok(c("none", &[])),
                    ("lz4", None) => {
                        let mut x = c("lz4", &["-zlz4"]);
                        x.needs_compressor = Some("lz4");
                        Ok(x)
                    }
                    ("lz4hc", r) => level("lz4hc", r, 12),
                    ("lzma", r) => level("lzma", r, 109),
                    ("big-pcluster", None) => {
                        let mut x = c("big-pcluster", &["-zlz4hc", "-C65536"]);
                        x.needs_compressor = Some("lz4hc");
                        Ok(x)
                    }
                    ("hints", None) => {
                        let mut x = c("hints", &["-zlz4hc,12"]);
                        x.needs_compressor = Some("lz4hc");
                        x.hints = true;
                        Ok(x)
                    }
                    ("well-compressed", None) => {
                        let mut x = c(
                            "well-compressed",
                            &[
                                "-C1048576",
                                "-Eztailpacking",
                                "-Eall-fragments",
                                "-Ededupe",
                                "-zlz4hc,12",
                            ],
                        );
                        x.needs_compressor = Some("lz4hc");
                        x.needs_erofs_1_6 = true;
                        Ok(x)
                    }
                    _ => Err(unsupported()),
                }
            }
            FsKind::Ext4 => match s {
                None | Some("none") => Ok(c("none", &[])),
                Some(_) => Err(ImageError::Invalid(
                    "--compress: ext4 does not compress (give none or leave --compress out; \
                     compressors are for erofs and squashfs)"
                        .into(),
                )),
            },
        }
    }
}

/// The full path of `program` on `PATH` (and the sbin directories, which a non-root `PATH`
/// may lack).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The program for `kind`, or an error naming the package to install.
pub fn require_program(kind: FsKind) -> Result<PathBuf, ImageError> {
    find_program(kind.program()).ok_or_else(|| {
        ImageError::Missing(format!(
            "{} is not installed: building {} images needs it (apt-get install {})",
            kind.program(),
            kind.name(),
            kind.package()
        ))
    })
}

/// What one mkfs run needs besides the tree and the output.
#[derive(Debug, Clone)]
pub struct MkfsSettings {
    /// The file system.
    pub kind: FsKind,
    /// Its compression.
    pub compression: Compression,
    /// The timestamp every inode and the superblock get (seconds since the epoch).
    pub timestamp: u32,
    /// The file system UUID (EROFS, ext4; SquashFS has none).
    pub fs_uuid: [u8; 16],
    /// ext4: the directory hash seed.
    pub hash_seed: [u8; 16],
    /// ext4: the size of the file system to make, and the inodes it needs at least.
    pub ext4_size: u64,
    /// ext4: inodes to reserve.
    pub ext4_inodes: u64,
    /// EROFS: where the hints file is (with the `hints` preset).
    pub hints_file: Option<PathBuf>,
}

/// The command that builds `tree` into `out` (which, for ext4, must already be a file of
/// `ext4_size` bytes).
pub fn command(program: &Path, s: &MkfsSettings, tree: &Path, out: &Path) -> Command {
    use crate::verity::superblock::format_uuid;
    let mut cmd = Command::new(program);
    let t = s.timestamp.to_string();
    let mut args: Vec<OsString> = Vec::new();
    match s.kind {
        FsKind::Erofs => {
            args.push(format!("-T{t}").into());
            args.push(format!("-U{}", format_uuid(&s.fs_uuid)).into());
            args.push("--quiet".into());
            if let Some(h) = &s.hints_file {
                let mut a = OsString::from("--compress-hints=");
                a.push(h);
                args.push(a);
            }
            args.extend(s.compression.args.iter().map(OsString::from));
            args.push(out.into());
            args.push(tree.into());
        }
        FsKind::Squashfs => {
            args.push(tree.into());
            args.push(out.into());
            args.extend(
                [
                    "-noappend",
                    "-no-progress",
                    "-quiet",
                    "-reproducible",
                    "-mkfs-time",
                    &t,
                    "-all-time",
                    &t,
                ]
                .map(OsString::from),
            );
            args.extend(s.compression.args.iter().map(OsString::from));
        }
        FsKind::Ext4 => {
            // E2FSPROGS_FAKE_TIME fixes the superblock's times; the inode times come from the
            // tree and are fixed afterwards (see ext4_times).
            cmd.env("E2FSPROGS_FAKE_TIME", &t);
            args.extend(["-q", "-F", "-b", "4096", "-I", "256", "-m", "0"].map(OsString::from));
            args.push("-N".into());
            args.push(s.ext4_inodes.to_string().into());
            args.push("-U".into());
            args.push(format_uuid(&s.fs_uuid).into());
            args.push("-E".into());
            args.push(format!("hash_seed={},lazy_itable_init=0", format_uuid(&s.hash_seed)).into());
            args.push("-d".into());
            args.push(tree.into());
            args.push(out.into());
            args.push(format!("{}k", s.ext4_size / 1024).into());
        }
    }
    cmd.args(args);
    cmd
}

/// The compressors `mkfs.erofs --help` lists ("Available compressors are: lz4hc, lz4").
pub fn erofs_compressors(help: &str) -> Vec<String> {
    help.lines()
        .find_map(|l| l.trim().strip_prefix("Available compressors are:"))
        .map(|list| {
            list.split(',')
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The erofs-utils version from the first line a build prints ("mkfs.erofs 1.5").
pub fn erofs_version(output: &str) -> Option<(u32, u32)> {
    let v = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("mkfs.erofs "))?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_001_options() {
        let sq = |s| Compression::parse(FsKind::Squashfs, Some(s)).unwrap().args;
        assert_eq!(sq("none"), ["-noD", "-noI", "-noX", "-noF"]);
        assert_eq!(sq("lz4hc"), ["-comp", "lz4", "-Xhc"]);
        assert_eq!(sq("zstd"), ["-comp", "zstd"]);
        let er = |s| Compression::parse(FsKind::Erofs, Some(s)).unwrap();
        assert_eq!(er("lz4hc,12").args, ["-zlz4hc,12"]);
        assert_eq!(er("lzma").args, ["-zlzma"]);
        assert_eq!(er("big-pcluster").args, ["-zlz4hc", "-C65536"]);
        let w = er("well-compressed");
        assert!(w.needs_erofs_1_6);
        assert_eq!(w.args.last().unwrap(), "-zlz4hc,12");
        assert!(er("hints").hints);
        assert!(Compression::parse(FsKind::Erofs, Some("lz4hc,13")).is_err());
        let e = Compression::parse(FsKind::Squashfs, Some("brotli")).unwrap_err();
        assert!(
            e.to_string().contains("unsupported compressor \"brotli\""),
            "{e}"
        );
        assert!(Compression::parse(FsKind::Ext4, Some("gzip")).is_err());
        assert!(FsKind::parse("btrfs").is_err());
    }

    #[test]
    fn tool_output() {
        let help = "usage\n\nAvailable compressors are: lz4hc, lz4\n";
        assert_eq!(erofs_compressors(help), ["lz4hc", "lz4"]);
        assert_eq!(
            erofs_version("mkfs.erofs 1.5\nBuild completed."),
            Some((1, 5))
        );
        assert_eq!(erofs_version("mkfs.erofs 1.7.1-g1234"), Some((1, 7)));
        assert_eq!(erofs_version("nothing"), None);
    }

    #[test]
    fn probes_magic() {
        let mut b = vec![0u8; 4096];
        b[..4].copy_from_slice(b"hsqs");
        assert_eq!(FsKind::probe(&b), Some(FsKind::Squashfs));
        let mut b = vec![0u8; 4096];
        b[1024..1028].copy_from_slice(&0xE0F5_E1E2u32.to_le_bytes());
        assert_eq!(FsKind::probe(&b), Some(FsKind::Erofs));
        let mut b = vec![0u8; 4096];
        b[1080..1082].copy_from_slice(&[0x53, 0xEF]);
        assert_eq!(FsKind::probe(&b), Some(FsKind::Ext4));
        assert_eq!(FsKind::probe(&[0u8; 100]), None);
    }
}
