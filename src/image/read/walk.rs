//! What the rootless image commands do with a reader: walk the tree (pre-order, names sorted
//! by bytes, as systemd's `recurse_dir` with `RECURSE_DIR_SORT`), list it, print it as
//! `systemd-dissect --mtree` does, copy it out, and read a file. A file that cannot be read
//! (a block that fails verification) is reported with its path and the walk goes on; the
//! caller turns the failures into the exit code.

use super::{FileKind, FsReader, NodeId, ReadError, Stat};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::Write;

/// A path that failed, and why.
#[derive(Debug)]
pub struct Failure {
    /// The path in the image (`/`-rooted).
    pub path: String,
    /// What went wrong.
    pub error: ReadError,
}

impl Failure {
    /// Whether it is a failed verification (a block that does not match the tree).
    pub fn verification(&self) -> bool {
        matches!(self.error, ReadError::Io(_))
    }
}

/// One node met by [`walk`].
pub struct Item<'a> {
    /// Its path relative to where the walk started ("" for the start).
    pub rel: &'a [u8],
    /// Its attributes.
    pub stat: &'a Stat,
}

/// Visit `start` (at `start_path`) and everything below it, depth first, directories before
/// their entries, entries sorted by name; a directory whose visit fails is not entered. A
/// directory met twice (a loop, or a directory hard
/// link) is reported and not entered again, so any image ends the walk.
pub fn walk(
    fs: &dyn FsReader,
    start: NodeId,
    start_path: &str,
    visit: &mut dyn FnMut(&Item<'_>) -> Result<(), ReadError>,
) -> Vec<Failure> {
    let mut failures = Vec::new();
    let mut seen = HashSet::new();
    let full = |rel: &[u8]| -> String {
        let base = start_path.trim_end_matches('/');
        if rel.is_empty() {
            if base.is_empty() {
                "/".into()
            } else {
                base.to_string()
            }
        } else {
            format!("{base}/{}", String::from_utf8_lossy(rel))
        }
    };
    // (node, relative path): a stack, so a deep tree never overflows ours.
    let mut stack: Vec<(NodeId, Vec<u8>)> = vec![(start, Vec::new())];
    while let Some((node, rel)) = stack.pop() {
        let stat = match fs.stat(node) {
            Ok(s) => s,
            Err(error) => {
                failures.push(Failure {
                    path: full(&rel),
                    error,
                });
                continue;
            }
        };
        if stat.kind == FileKind::Dir && !seen.insert(node) {
            failures.push(Failure {
                path: full(&rel),
                error: ReadError::Corrupt("directory loop (a directory met twice)".into()),
            });
            continue;
        }
        if let Err(error) = visit(&Item {
            rel: &rel,
            stat: &stat,
        }) {
            failures.push(Failure {
                path: full(&rel),
                error,
            });
        }
        if stat.kind != FileKind::Dir {
            continue;
        }
        match fs.read_dir(node) {
            Ok(entries) => {
                for e in entries.into_iter().rev() {
                    let mut p = rel.clone();
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&e.name);
                    stack.push((e.node, p));
                }
            }
            Err(error) => failures.push(Failure {
                path: full(&rel),
                error,
            }),
        }
    }
    failures
}

/// systemd's `xescape(s, WHITESPACE COMMENTS GLOB_CHARS)`: control bytes, bytes from 0x7f up,
/// backslash, whitespace, `#;` and `*?[` as `\xNN`.
pub fn xescape(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s {
        if !(b' '..0x7f).contains(&c) || b"\\ \t\n\r#;*?[".contains(&c) {
            out.push_str(&format!("\\x{c:02x}"));
        } else {
            out.push(c as char);
        }
    }
    out
}

/// The SHA-256 of regular file `node`'s contents.
pub fn sha256(fs: &dyn FsReader, node: NodeId) -> Result<[u8; 32], ReadError> {
    struct H(Sha256);
    impl Write for H {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = H(Sha256::new());
    fs.copy_to(node, &mut h)?;
    Ok(h.0.finalize().into())
}

/// Print the tree below `start` as `systemd-dissect --mtree` does (no colours): one line per
/// node, `./path` (directories with a trailing `/`), type, mode (not for symlinks), uid, gid,
/// and for regular files their size and, when not empty, `sha256sum=`; `link=` for symlinks,
/// `device=linux,MAJOR,MINOR` for devices. A file that cannot be read keeps its line without
/// the checksum (as systemd does) and is reported.
pub fn mtree(
    fs: &dyn FsReader,
    start: NodeId,
    start_path: &str,
    out: &mut dyn Write,
) -> std::io::Result<Vec<Failure>> {
    let mut write_err = None;
    let failures = walk(fs, start, start_path, &mut |it| {
        let mut line = String::from(".");
        if !it.rel.is_empty() {
            line.push('/');
            line.push_str(&xescape(it.rel));
        }
        let s = it.stat;
        if s.kind == FileKind::Dir {
            line.push('/');
        }
        let ty = match s.kind {
            FileKind::Dir => "dir",
            FileKind::File => "file",
            FileKind::Link => "link",
            FileKind::Fifo => "fifo",
            FileKind::Block => "block",
            FileKind::Char => "char",
            FileKind::Socket => "socket",
        };
        line.push_str(&format!(" type={ty}"));
        if s.kind != FileKind::Link {
            line.push_str(&format!(" mode={:04o}", s.perm & 0o777));
        }
        line.push_str(&format!(" uid={} gid={}", s.uid, s.gid));
        let mut result = Ok(());
        if s.kind == FileKind::File {
            line.push_str(&format!(" size={}", s.size));
            if s.size > 0 {
                match sha256(fs, s.ino) {
                    Ok(h) => line.push_str(&format!(" sha256sum={}", hex::encode(h))),
                    Err(e) => result = Err(e),
                }
            }
        }
        if s.kind == FileKind::Link {
            match fs.readlink(s.ino) {
                Ok(t) => line.push_str(&format!(" link={}", xescape(&t))),
                Err(e) => result = Err(e),
            }
        }
        if matches!(s.kind, FileKind::Block | FileKind::Char) {
            let (ma, mi) = s.rdev_parts();
            line.push_str(&format!(" device=linux,{ma},{mi}"));
        }
        line.push('\n');
        if write_err.is_none() {
            if let Err(e) = out.write_all(line.as_bytes()) {
                write_err = Some(e);
            }
        }
        result
    });
    match write_err {
        Some(e) => Err(e),
        None => Ok(failures),
    }
}

/// One node as `image ls --json` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    /// The path in the image (`/`-rooted; bytes that are not UTF-8 replaced).
    pub path: String,
    /// The node's kind.
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Permission bits, octal.
    pub mode: String,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (regular files and symlinks; 0 for devices).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Hard links, as recorded (see the reader's notes).
    pub nlink: u32,
    /// A symlink's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// A device's major and minor numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<(u32, u32)>,
    /// The names of its extended attributes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<String>,
}

/// Everything at and below `start`, for `image ls`.
pub fn list(fs: &dyn FsReader, start: NodeId, start_path: &str) -> (Vec<Listed>, Vec<Failure>) {
    let mut out = Vec::new();
    let base = start_path.trim_end_matches('/').to_string();
    let failures = walk(fs, start, start_path, &mut |it| {
        let s = it.stat;
        let path = if it.rel.is_empty() {
            if base.is_empty() {
                "/".to_string()
            } else {
                base.clone()
            }
        } else {
            format!("{base}/{}", String::from_utf8_lossy(it.rel))
        };
        let link = match s.kind {
            FileKind::Link => Some(String::from_utf8_lossy(&fs.readlink(s.ino)?).into_owned()),
            _ => None,
        };
        let xattrs = fs
            .xattrs(s.ino)?
            .into_iter()
            .map(|(n, _)| String::from_utf8_lossy(&n).into_owned())
            .collect();
        out.push(Listed {
            path,
            kind: s.kind,
            mode: format!("{:04o}", s.perm),
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            mtime: s.mtime,
            nlink: s.nlink,
            link,
            device: matches!(s.kind, FileKind::Block | FileKind::Char).then(|| s.rdev_parts()),
            xattrs,
        });
        Ok(())
    });
    (out, failures)
}

/// What [`copy_out`] did besides copying.
#[derive(Debug, Default)]
pub struct CopyReport {
    /// Nodes created.
    pub copied: u64,
    /// What could not be reproduced and was skipped or simplified (devices without root,
    /// xattrs the destination refused), one line each.
    pub notes: Vec<String>,
}

/// Copy `start` (at `start_path` in the image) to `dest`, which must not exist: regular
/// files, directories, symlinks, hard links (nodes with the same id and a link count above
/// one), FIFOs; device nodes only as root (skipped with a note otherwise); modes, times and
/// xattrs (those the destination refuses are noted), and ownership as root. A file that
/// cannot be read is removed again and reported; the rest of the tree is still copied.
pub fn copy_out(
    fs: &dyn FsReader,
    start: NodeId,
    start_path: &str,
    dest: &std::path::Path,
) -> (CopyReport, Vec<Failure>) {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let root = unsafe { libc::geteuid() } == 0;
    let mut report = CopyReport::default();
    let mut links: HashMap<NodeId, std::path::PathBuf> = HashMap::new();
    // Directories get their final mode and times after their contents are written.
    let mut dirs: Vec<(std::path::PathBuf, Stat)> = Vec::new();
    let mut failures = walk(fs, start, start_path, &mut |it| {
        let s = it.stat;
        let target = if it.rel.is_empty() {
            dest.to_path_buf()
        } else {
            dest.join(OsStr::from_bytes(it.rel))
        };
        let werr = |e: std::io::Error| ReadError::Write(format!("{}: {e}", target.display()));
        if s.kind != FileKind::Dir && s.nlink > 1 {
            if let Some(first) = links.get(&s.ino) {
                std::fs::hard_link(first, &target).map_err(werr)?;
                report.copied += 1;
                return Ok(());
            }
            links.insert(s.ino, target.clone());
        }
        match s.kind {
            FileKind::Dir => {
                std::fs::create_dir(&target).map_err(werr)?;
                dirs.push((target.clone(), s.clone()));
                copy_xattrs(fs, s.ino, &target, &mut report.notes)?;
                report.copied += 1;
                return Ok(());
            }
            FileKind::File => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(werr)?;
                let mut w = Sparse {
                    f: &mut f,
                    pos: 0,
                    hole: false,
                };
                let r = fs.copy_to(s.ino, &mut w).and_then(|_| w.finish());
                if let Err(e) = r {
                    drop(f);
                    let _ = std::fs::remove_file(&target);
                    links.remove(&s.ino);
                    return Err(e);
                }
            }
            FileKind::Link => {
                let t = fs.readlink(s.ino)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&t), &target).map_err(werr)?;
            }
            FileKind::Fifo | FileKind::Char | FileKind::Block => {
                if s.kind != FileKind::Fifo && !root {
                    report.notes.push(format!(
                        "{}: device node skipped (creating devices needs root)",
                        target.display()
                    ));
                    return Ok(());
                }
                let c = cpath(&target)?;
                // SAFETY: c is a valid NUL-terminated path.
                if unsafe { libc::mknod(c.as_ptr(), s.mode(), s.rdev as libc::dev_t) } != 0 {
                    return Err(werr(std::io::Error::last_os_error()));
                }
            }
            FileKind::Socket => {
                report
                    .notes
                    .push(format!("{}: socket skipped", target.display()));
                return Ok(());
            }
        }
        copy_xattrs(fs, s.ino, &target, &mut report.notes)?;
        set_attrs(&target, s, root).map_err(werr)?;
        report.copied += 1;
        Ok(())
    });
    for (d, s) in dirs.iter().rev() {
        if let Err(e) = set_attrs(d, s, root) {
            failures.push(Failure {
                path: d.display().to_string(),
                error: ReadError::Write(format!("{}: {e}", d.display())),
            });
        }
    }
    (report, failures)
}

/// A writer that seeks over whole zero blocks (4096 bytes at 4096-aligned offsets) instead of
/// writing them, so sparse files stay sparse; [`Sparse::finish`] sets the length.
struct Sparse<'a> {
    f: &'a mut std::fs::File,
    pos: u64,
    hole: bool,
}

impl Sparse<'_> {
    fn finish(&mut self) -> Result<(), ReadError> {
        if self.hole {
            self.f
                .set_len(self.pos)
                .map_err(|e| ReadError::Write(e.to_string()))?;
        }
        Ok(())
    }
}

impl Write for Sparse<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        use std::io::{Seek, SeekFrom};
        let mut done = 0;
        while done < b.len() {
            let in_block = (4096 - self.pos % 4096) as usize;
            let n = in_block.min(b.len() - done);
            let part = &b[done..done + n];
            if n == 4096 && part.iter().all(|&c| c == 0) {
                self.f.seek(SeekFrom::Current(4096))?;
                self.hole = true;
            } else {
                self.f.write_all(part)?;
                self.hole = false;
            }
            done += n;
            self.pos += n as u64;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn cpath(p: &std::path::Path) -> Result<std::ffi::CString, ReadError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| ReadError::Write(format!("{}: NUL in path", p.display())))
}

/// Set the xattrs of `node` on `target` (not following symlinks); those the destination
/// refuses (trusted.* and security.* without privileges, a file system without xattrs) are
/// noted, not failures.
fn copy_xattrs(
    fs: &dyn FsReader,
    node: NodeId,
    target: &std::path::Path,
    notes: &mut Vec<String>,
) -> Result<(), ReadError> {
    let xattrs = fs.xattrs(node)?;
    if xattrs.is_empty() {
        return Ok(());
    }
    let c = cpath(target)?;
    for (name, value) in xattrs {
        let Ok(n) = std::ffi::CString::new(name.clone()) else {
            continue;
        };
        // SAFETY: valid C strings and a buffer of value.len() bytes.
        let r = unsafe {
            libc::lsetxattr(
                c.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if r != 0 {
            notes.push(format!(
                "{}: xattr {} not set: {}",
                target.display(),
                String::from_utf8_lossy(&name),
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Owner (as root), mode (not for symlinks) and times of `target`.
fn set_attrs(target: &std::path::Path, s: &Stat, root: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY (all three calls): c is a valid NUL-terminated path, times a 2-element array.
    if root {
        check(unsafe { libc::lchown(c.as_ptr(), s.uid, s.gid) })?;
    }
    if s.kind != FileKind::Link {
        check(unsafe { libc::chmod(c.as_ptr(), s.perm) })?;
    }
    let t = libc::timespec {
        tv_sec: s.mtime as libc::time_t,
        tv_nsec: i64::from(s.mtime_nsec) as _,
    };
    let times = [t, t];
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}
