//! The manifest of a sealed tree: every node of a directory tree with its metadata, and for
//! each regular file its size and fs-verity digest.
//!
//! It is JSON, one entry per line, written in one canonical form (so the same tree seals to the
//! same bytes, and a signature covers exactly what is served):
//!
//! ```text
//! {"format":"dmkit-fsverity-manifest","version":1,"hash_algorithm":"sha256","block_size":4096,"salt":"",
//! "entries":[
//! {"path":".","type":"dir","mode":"0755","uid":0,"gid":0,"mtime":1700000000},
//! {"path":"bin","type":"dir","mode":"0755","uid":0,"gid":0,"mtime":1700000000},
//! {"path":"bin/tool","type":"file","mode":"0755","uid":0,"gid":0,"mtime":1700000000,"size":1234,"digest":"9f51…"},
//! {"path":"lib","type":"symlink","mode":"0777","uid":0,"gid":0,"mtime":1700000000,"target":"usr/lib"}
//! ]}
//! ```
//!
//! The root (`"."`) comes first, then every other path in byte order, each after its parent
//! directory. Paths are relative, `/`-separated, UTF-8, without `.` or `..` components. The
//! parser checks all of that and every field's range: a manifest is input from wherever it was
//! stored, and nothing in it is trusted until it has passed.

use super::SealError;
use crate::fsverity::descriptor::MAX_SALT_SIZE;
use crate::fsverity::digest::{FsVerityParams, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use crate::hash::HashAlgorithm;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;

/// The `format` field.
pub const FORMAT: &str = "dmkit-fsverity-manifest";
/// The `version` field this code writes and reads.
pub const VERSION: u32 = 1;
/// The root's path in the manifest.
pub const ROOT_PATH: &str = ".";
/// Longest name of one path component (NAME_MAX).
pub const MAX_NAME: usize = 255;
/// Longest path (PATH_MAX without its NUL), and longest symlink target.
pub const MAX_PATH: usize = 4095;

/// What kind of node an entry is, with what that kind carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file: its size and fs-verity digest.
    File {
        /// Size in bytes.
        size: u64,
        /// fs-verity digest (the hash of its descriptor).
        digest: Vec<u8>,
    },
    /// A symbolic link and its target.
    Symlink {
        /// The target, as readlink(2) gives it.
        target: String,
    },
    /// A character device.
    CharDevice {
        /// Its device number (`st_rdev`).
        rdev: u64,
    },
    /// A block device.
    BlockDevice {
        /// Its device number (`st_rdev`).
        rdev: u64,
    },
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
}

impl EntryKind {
    /// The manifest's name of the kind.
    pub fn name(&self) -> &'static str {
        match self {
            EntryKind::Dir => "dir",
            EntryKind::File { .. } => "file",
            EntryKind::Symlink { .. } => "symlink",
            EntryKind::CharDevice { .. } => "char",
            EntryKind::BlockDevice { .. } => "block",
            EntryKind::Fifo => "fifo",
            EntryKind::Socket => "socket",
        }
    }
}

/// One node of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative path, `/`-separated; [`ROOT_PATH`] for the root.
    pub path: String,
    /// The kind and its data.
    pub kind: EntryKind,
    /// Permission bits, set-user-ID, set-group-ID and sticky included (`st_mode & 07777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

/// A sealed tree's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The Merkle tree parameters every file was measured with.
    pub params: FsVerityParams,
    /// The root first, then every other node in byte order of its path.
    pub entries: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    format: String,
    version: u32,
    hash_algorithm: String,
    block_size: u32,
    salt: String,
    entries: Vec<RawEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    path: String,
    #[serde(rename = "type")]
    kind: String,
    mode: String,
    uid: u32,
    gid: u32,
    mtime: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rdev: Option<u64>,
}

impl RawEntry {
    fn from_entry(e: &Entry) -> RawEntry {
        let mut r = RawEntry {
            path: e.path.clone(),
            kind: e.kind.name().to_string(),
            mode: format!("{:04o}", e.mode),
            uid: e.uid,
            gid: e.gid,
            mtime: e.mtime,
            size: None,
            digest: None,
            target: None,
            rdev: None,
        };
        match &e.kind {
            EntryKind::File { size, digest } => {
                r.size = Some(*size);
                r.digest = Some(hex::encode(digest));
            }
            EntryKind::Symlink { target } => r.target = Some(target.clone()),
            EntryKind::CharDevice { rdev } | EntryKind::BlockDevice { rdev } => {
                r.rdev = Some(*rdev)
            }
            EntryKind::Dir | EntryKind::Fifo | EntryKind::Socket => {}
        }
        r
    }
}

/// Why a path cannot be in a manifest, or `None` if it can.
pub fn path_problem(path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("empty path".into());
    }
    if path.len() > MAX_PATH {
        return Some(format!("path longer than {MAX_PATH} bytes"));
    }
    for comp in path.split('/') {
        match comp {
            "" => return Some("empty component (leading, trailing or double '/')".into()),
            "." | ".." => return Some(format!("'{comp}' component")),
            c if c.len() > MAX_NAME => {
                return Some(format!("component longer than {MAX_NAME} bytes"))
            }
            c if c.contains('\0') => return Some("NUL byte".into()),
            _ => {}
        }
    }
    None
}

/// The parent directory's path ([`ROOT_PATH`] for a top-level name).
pub fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[..i],
        None => ROOT_PATH,
    }
}

impl Manifest {
    /// The canonical bytes: the header on one line, one entry per line, a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let head = RawHeader {
            format: FORMAT.into(),
            version: VERSION,
            hash_algorithm: self.params.hash.name().into(),
            block_size: self.params.block_size,
            salt: hex::encode(&self.params.salt),
            entries: Vec::new(),
        };
        let mut out = serde_json::to_vec(&head).expect("a manifest header encodes");
        // `..."entries":[]}`: reopen the array and write one entry per line.
        out.truncate(out.len() - 2);
        out.extend_from_slice(b"\n");
        for (i, e) in self.entries.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"" } else { b",\n" });
            serde_json::to_writer(&mut out, &RawEntry::from_entry(e))
                .expect("a manifest entry encodes");
        }
        out.extend_from_slice(b"\n]}\n");
        out
    }

    /// Parse and check a manifest read from `name` (named in every error).
    pub fn parse(bytes: &[u8], name: &Path) -> Result<Manifest, SealError> {
        let bad = |field: String, why: String| SealError::BadManifest {
            path: name.to_path_buf(),
            field,
            reason: why,
        };
        let raw: RawHeader = serde_json::from_slice(bytes)
            .map_err(|e| bad("JSON".into(), format!("not a manifest: {e}")))?;
        if raw.format != FORMAT {
            return Err(bad(
                "format".into(),
                format!("{:?}, expected {FORMAT:?}", raw.format),
            ));
        }
        if raw.version != VERSION {
            return Err(bad(
                "version".into(),
                format!(
                    "{} is not supported (this dmkit reads {VERSION})",
                    raw.version
                ),
            ));
        }
        let hash = match HashAlgorithm::from_name(&raw.hash_algorithm) {
            Some(h @ (HashAlgorithm::Sha256 | HashAlgorithm::Sha512)) => h,
            _ => {
                return Err(bad(
                    "hash_algorithm".into(),
                    format!("{:?} is not sha256 or sha512", raw.hash_algorithm),
                ))
            }
        };
        if !raw.block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&raw.block_size)
        {
            return Err(bad(
                "block_size".into(),
                format!(
                    "{} is not a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}",
                    raw.block_size
                ),
            ));
        }
        let salt = hex::decode(&raw.salt)
            .ok()
            .filter(|s| s.len() <= MAX_SALT_SIZE)
            .ok_or_else(|| {
                bad(
                    "salt".into(),
                    format!("not hex of at most {MAX_SALT_SIZE} bytes"),
                )
            })?;
        let params = FsVerityParams {
            hash,
            block_size: raw.block_size,
            salt,
        };
        let mut entries = Vec::with_capacity(raw.entries.len());
        let mut dirs: HashSet<String> = HashSet::new();
        for (i, r) in raw.entries.into_iter().enumerate() {
            let field = |f: &str| format!("entries[{i}] ({:?}).{f}", r.path);
            let e = check_entry(&r, hash, i).map_err(|(f, why)| bad(field(&f), why))?;
            if i == 0 {
                if e.path != ROOT_PATH || e.kind != EntryKind::Dir {
                    return Err(bad(
                        format!("entries[0] ({:?})", e.path),
                        "the first entry must be the root directory \".\"".into(),
                    ));
                }
            } else {
                if let Some(prev) = entries.last().map(|p: &Entry| p.path.as_str()) {
                    if i > 1 && prev.as_bytes() >= e.path.as_bytes() {
                        return Err(bad(
                            field("path"),
                            format!("not after {prev:?}: entries must be in byte order, once each"),
                        ));
                    }
                }
                let parent = parent_of(&e.path);
                if !dirs.contains(parent) {
                    return Err(bad(
                        field("path"),
                        format!("its directory {parent:?} is not an earlier directory entry"),
                    ));
                }
            }
            if e.kind == EntryKind::Dir {
                dirs.insert(e.path.clone());
            }
            entries.push(e);
        }
        if entries.is_empty() {
            return Err(bad(
                "entries".into(),
                "empty: a manifest has at least the root".into(),
            ));
        }
        let m = Manifest { params, entries };
        // One spelling per manifest: its SHA-256 (what `--manifest-digest` pins) and its
        // signature then stand for the tree itself, not for one of its spellings.
        let canonical = m.to_bytes();
        if canonical != bytes {
            let at = canonical
                .iter()
                .zip(bytes)
                .position(|(a, b)| a != b)
                .unwrap_or(canonical.len().min(bytes.len()));
            let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
            return Err(bad(
                format!("line {line}"),
                "not written as dmkit writes manifests (one entry per line, fields in order, lowercase hex, no spaces)".into(),
            ));
        }
        Ok(m)
    }

    /// The regular files with their entry index.
    pub fn files(&self) -> impl Iterator<Item = (usize, &Entry, u64, &[u8])> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.kind {
                EntryKind::File { size, digest } => Some((i, e, *size, digest.as_slice())),
                _ => None,
            })
    }
}

/// Checks one raw entry; on failure, the field at fault and why.
fn check_entry(r: &RawEntry, hash: HashAlgorithm, index: usize) -> Result<Entry, (String, String)> {
    let fail = |f: &str, why: String| Err((f.to_string(), why));
    if !(index == 0 && r.path == ROOT_PATH) {
        if let Some(why) = path_problem(&r.path) {
            return fail("path", why);
        }
    }
    let mode = match u32::from_str_radix(&r.mode, 8) {
        Ok(m) if m <= 0o7777 && !r.mode.is_empty() && r.mode.len() <= 6 => m,
        _ => return fail("mode", format!("{:?} is not octal permission bits", r.mode)),
    };
    let none = |f: &str, present: bool| -> Result<(), (String, String)> {
        if present {
            Err((f.to_string(), format!("not allowed for a {}", r.kind)))
        } else {
            Ok(())
        }
    };
    let kind = match r.kind.as_str() {
        "file" => {
            let Some(size) = r.size else {
                return fail("size", "missing".into());
            };
            if size > i64::MAX as u64 {
                return fail("size", format!("{size} is beyond the largest file size"));
            }
            let digest = r
                .digest
                .as_deref()
                .and_then(|d| hex::decode(d).ok())
                .filter(|d| d.len() == hash.digest_size());
            let Some(digest) = digest else {
                return fail(
                    "digest",
                    format!(
                        "missing or not {} bytes of hex ({})",
                        hash.digest_size(),
                        hash.name()
                    ),
                );
            };
            none("target", r.target.is_some())?;
            none("rdev", r.rdev.is_some())?;
            EntryKind::File { size, digest }
        }
        "symlink" => {
            let target = match &r.target {
                Some(t) if !t.is_empty() && t.len() <= MAX_PATH && !t.contains('\0') => t.clone(),
                _ => {
                    return fail(
                        "target",
                        format!("missing, empty, NUL or longer than {MAX_PATH} bytes"),
                    )
                }
            };
            none("size", r.size.is_some())?;
            none("digest", r.digest.is_some())?;
            none("rdev", r.rdev.is_some())?;
            EntryKind::Symlink { target }
        }
        "char" | "block" => {
            let Some(rdev) = r.rdev else {
                return fail("rdev", "missing".into());
            };
            none("size", r.size.is_some())?;
            none("digest", r.digest.is_some())?;
            none("target", r.target.is_some())?;
            if r.kind == "char" {
                EntryKind::CharDevice { rdev }
            } else {
                EntryKind::BlockDevice { rdev }
            }
        }
        "dir" | "fifo" | "socket" => {
            none("size", r.size.is_some())?;
            none("digest", r.digest.is_some())?;
            none("target", r.target.is_some())?;
            none("rdev", r.rdev.is_some())?;
            match r.kind.as_str() {
                "dir" => EntryKind::Dir,
                "fifo" => EntryKind::Fifo,
                _ => EntryKind::Socket,
            }
        }
        other => {
            return fail(
                "type",
                format!("{other:?} is not one of dir, file, symlink, char, block, fifo, socket"),
            )
        }
    };
    Ok(Entry {
        path: r.path.clone(),
        kind,
        mode,
        uid: r.uid,
        gid: r.gid,
        mtime: r.mtime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode: 0o755,
            uid: 1,
            gid: 2,
            mtime: 1_700_000_000,
        }
    }

    fn sample() -> Manifest {
        Manifest {
            params: FsVerityParams::default(),
            entries: vec![
                entry(".", EntryKind::Dir),
                entry("-x", EntryKind::Fifo),
                entry("a", EntryKind::Dir),
                entry(
                    "a/f",
                    EntryKind::File {
                        size: 5,
                        digest: vec![7; 32],
                    },
                ),
                entry(
                    "a/l",
                    EntryKind::Symlink {
                        target: "../b c".into(),
                    },
                ),
                entry("a/n", EntryKind::CharDevice { rdev: 0x0103 }),
            ],
        }
    }

    fn parse(b: &[u8]) -> Result<Manifest, String> {
        Manifest::parse(b, Path::new("M")).map_err(|e| e.to_string())
    }

    #[test]
    fn round_trip_is_canonical() {
        let m = sample();
        let b = m.to_bytes();
        assert_eq!(parse(&b).unwrap(), m);
        assert_eq!(parse(&b).unwrap().to_bytes(), b);
        let text = String::from_utf8(b).unwrap();
        assert!(text.starts_with("{\"format\":\"dmkit-fsverity-manifest\",\"version\":1,"));
        assert_eq!(text.lines().count(), 2 + m.entries.len());
        assert!(text.contains(r#""mode":"0755""#));
    }

    /// Replace `from` by `to` in the canonical bytes and expect an error mentioning `want`.
    fn refused(from: &str, to: &str, want: &str) {
        let text = String::from_utf8(sample().to_bytes()).unwrap();
        assert!(text.contains(from), "{from}");
        let e = parse(text.replacen(from, to, 1).as_bytes()).unwrap_err();
        assert!(e.starts_with("M: "), "{e}");
        assert!(e.contains(want), "{from} -> {to}: {e}");
    }

    #[test]
    fn only_the_canonical_spelling_is_accepted() {
        refused(
            "\"type\":\"dir\"",
            "\"type\": \"dir\"",
            "not written as dmkit writes",
        );
        refused(
            "\"digest\":\"07",
            "\"digest\":\"0A",
            "not written as dmkit writes",
        );
        let text = String::from_utf8(sample().to_bytes()).unwrap();
        let e = parse(format!("{text}\n").as_bytes()).unwrap_err();
        assert!(e.contains("not written as dmkit writes"), "{e}");
    }

    #[test]
    fn every_field_is_checked() {
        refused("dmkit-fsverity-manifest", "other", "format");
        refused("\"version\":1", "\"version\":2", "version");
        refused("sha256", "sha1", "hash_algorithm");
        refused("4096", "4000", "block_size");
        refused("\"salt\":\"\"", "\"salt\":\"zz\"", "salt");
        refused("\"mode\":\"0755\"", "\"mode\":\"9\"", "mode");
        refused("\"mode\":\"0755\"", "\"mode\":\"17777\"", "mode");
        refused(&"07".repeat(32), "07", "digest");
        refused("\"size\":5", "\"size\":-1", "JSON");
        refused("\"size\":5,", "", "size");
        refused("\"type\":\"fifo\"", "\"type\":\"door\"", "type");
        refused("\"path\":\"a/f\"", "\"path\":\"a/../f\"", "'..' component");
        refused("\"path\":\"a/f\"", "\"path\":\"/a/f\"", "empty component");
        refused(
            "\"path\":\"a/f\"",
            "\"path\":\"b/f\"",
            "\"b\" is not an earlier directory",
        );
        refused("\"path\":\"a/l\"", "\"path\":\"a/f\"", "byte order");
        refused("\"path\":\".\"", "\"path\":\"r\"", "root directory");
        refused("\"target\":\"../b c\"", "\"target\":\"\"", "target");
        refused(",\"rdev\":259", "", "rdev");
        refused("\"uid\":1,", "\"uid\":1,\"extra\":0,", "unknown field");
        refused(
            "\"type\":\"fifo\"",
            "\"type\":\"fifo\",\"size\":1",
            "not allowed",
        );
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        let b = sample().to_bytes();
        for cut in [0, 1, 10, b.len() / 2, b.len() - 3] {
            assert!(parse(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert!(parse(b"\xff\xfe").is_err());
        assert!(parse(br#"{"format":"dmkit-fsverity-manifest","version":1,"hash_algorithm":"sha256","block_size":4096,"salt":"","entries":[]}"#)
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn paths() {
        assert!(path_problem("a/b.c/d").is_none());
        for bad in ["", "/", "a//b", "a/", ".", "a/./b", "..", "x\0y"] {
            assert!(path_problem(bad).is_some(), "{bad:?}");
        }
        assert!(path_problem(&"n".repeat(256)).is_some());
        assert_eq!(parent_of("a/b/c"), "a/b");
        assert_eq!(parent_of("a"), ".");
    }
}
