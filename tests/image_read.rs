//! The rootless image readers (`dmkit image ls|cat|copy-from|mtree|validate`), checked against
//! the kernel: for an image of each file system dmkit builds, from a tree holding files of many
//! sizes (empty, one byte, around a block, sparse), directories, short and long symlinks, a hard
//! link, a device node, a FIFO, xattrs and a 255-byte name,
//!
//! - `image mtree` prints what `systemd-dissect --mtree` would print of the partition mounted
//!   by the kernel (computed here from the mount, in its format);
//! - `image ls --json` names the same nodes with the same types, sizes, modes and link targets;
//! - `image copy-from`, run as `nobody` on an image `nobody` can read, gives a tree identical to
//!   the mount (contents, modes, times, symlinks; hard links and xattrs where the reader has
//!   them), and `image validate`/`cat` work as `nobody` too;
//! - a flipped byte in one file's data fails that file alone, naming the image and the path;
//! - the same holds for the SquashFS and ext4 images Debian's systemd-repart makes of that tree.
//!
//! Needs root (kernel mounts, setpriv), loop devices and the mkfs tools: skipped with a reason
//! outside CI, a failure in CI.

mod common;

use common::env::{is_root, loop_missing, missing, tool_missing};
use common::image_tree::partition;
use common::run::{ok, output, Workspace};
use common::xor_byte;
use serde_json::Value;
use sha2::Digest;
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const DMKIT: &str = common::DMKIT;

/// The longest name the file system's builder takes: 255 bytes (NAME_MAX), but 254 for
/// erofs-utils 1.5's mkfs.erofs, which fails on a 255-byte name ("Could not format the
/// device: No such file or directory").
fn long_name(fs: &str) -> String {
    "L".repeat(if fs == "erofs" { 254 } else { 255 })
}

/// The tree every image of `fs` here is built from.
fn make_tree(t: &Path, fs: &str) {
    let w = |rel: &str, data: &[u8], mode: u32| {
        let p = t.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    w("empty", b"", 0o644);
    w("one", b"x", 0o600);
    for (i, n) in [4095usize, 4096, 4097, 200 << 10].into_iter().enumerate() {
        w(
            &format!("sizes/f{n}"),
            &common::rng::bytes(10 + i as u64, n),
            0o644,
        );
    }
    w("bin/tool", &common::rng::bytes(20, 70 << 10), 0o4755);
    // Compressible text, and text interleaved with noise: compressed EROFS stores these as
    // LZ4 extents and PLAIN (uncompressed) pclusters side by side.
    let text: Vec<u8> = (0..12_000u32)
        .flat_map(|i| format!("line {i}: some words {}\n", i % 13).into_bytes())
        .collect();
    w("text/log", &text, 0o644);
    let mixed: Vec<u8> = (0..16u64)
        .flat_map(|k| [text[..8192].to_vec(), common::rng::bytes(40 + k, 8192)].concat())
        .collect();
    w("text/mixed", &mixed, 0o644);
    w("with space #1", b"odd name\n", 0o644);
    w(&format!("deep/{}", long_name(fs)), b"long name\n", 0o640);
    // Sparse: 3 MiB with 8 KiB of data at 1 MiB.
    let sparse = t.join("sparse");
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(3 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &common::rng::bytes(30, 8192), 1 << 20).unwrap();
    std::fs::create_dir_all(t.join("emptydir")).unwrap();
    std::os::unix::fs::symlink("bin/tool", t.join("short-link")).unwrap();
    std::os::unix::fs::symlink("x/".repeat(60) + "target", t.join("long-link")).unwrap();
    std::fs::hard_link(t.join("bin/tool"), t.join("bin/tool-hard")).unwrap();
    let dev = std::ffi::CString::new(t.join("null").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; 1,3 is /dev/null's number.
    assert_eq!(
        unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) },
        0
    );
    let fifo = std::ffi::CString::new(t.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    for (rel, v) in [("one", &b"value"[..]), ("emptydir", &b"d"[..])] {
        let p = std::ffi::CString::new(t.join(rel).as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C strings and value buffer.
        let r = unsafe {
            libc::setxattr(
                p.as_ptr(),
                c"user.dmkit".as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0,
            )
        };
        assert_eq!(r, 0, "setxattr {rel}: {}", std::io::Error::last_os_error());
    }
}

/// systemd's xescape for the mtree paths.
fn xescape(s: &[u8]) -> String {
    s.iter()
        .map(|&c| {
            if !(b' '..0x7f).contains(&c) || b"\\ \t\n\r#;*?[".contains(&c) {
                format!("\\x{c:02x}")
            } else {
                (c as char).to_string()
            }
        })
        .collect()
}

/// What `systemd-dissect --mtree` prints of the tree at `root` (its mtree_print_item, without
/// colours): pre-order, entries sorted by name.
fn kernel_mtree(root: &Path) -> String {
    fn visit(root: &Path, rel: &Path, out: &mut String) {
        let p = root.join(rel);
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let mut line = if rel.as_os_str().is_empty() {
            ".".to_string()
        } else {
            format!("./{}", xescape(rel.as_os_str().as_bytes()))
        };
        let ty = if ft.is_dir() {
            line.push('/');
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "link"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_block_device() {
            "block"
        } else if ft.is_char_device() {
            "char"
        } else {
            "socket"
        };
        line += &format!(" type={ty}");
        if !ft.is_symlink() {
            line += &format!(" mode={:04o}", m.mode() & 0o777);
        }
        line += &format!(" uid={} gid={}", m.uid(), m.gid());
        if ft.is_file() {
            line += &format!(" size={}", m.len());
            if m.len() > 0 {
                let h = sha2::Sha256::digest(std::fs::read(&p).unwrap());
                line += &format!(" sha256sum={}", hex::encode(h));
            }
        }
        if ft.is_symlink() {
            line += &format!(
                " link={}",
                xescape(std::fs::read_link(&p).unwrap().as_os_str().as_bytes())
            );
        }
        if ft.is_char_device() || ft.is_block_device() {
            line += &format!(
                " device=linux,{},{}",
                libc::major(m.rdev()),
                libc::minor(m.rdev())
            );
        }
        out.push_str(&line);
        out.push('\n');
        if ft.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for n in names {
                visit(root, &rel.join(n), out);
            }
        }
    }
    let mut out = String::new();
    visit(root, Path::new(""), &mut out);
    out
}

/// What a tree holds for comparing copies: per path, type, mode, mtime, size, content hash or
/// link target, and user xattrs.
fn tree_state(root: &Path, xattrs: bool) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else if m.is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_file() {
                format!(
                    "file {}",
                    hex::encode(sha2::Sha256::digest(std::fs::read(&p).unwrap()))
                )
            } else {
                format!("special {:o}", m.mode() & 0o170000)
            };
            let mut line = format!("{what} {:o} mtime={}", m.mode() & 0o7777, m.mtime());
            if m.is_symlink() {
                line = format!("{what} mtime={}", m.mtime());
            }
            if xattrs && !m.is_symlink() {
                let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                let mut buf = [0u8; 64];
                // SAFETY: valid path and buffer.
                let n = unsafe {
                    libc::lgetxattr(
                        c.as_ptr(),
                        c"user.dmkit".as_ptr(),
                        buf.as_mut_ptr().cast(),
                        64,
                    )
                };
                if n >= 0 {
                    line += &format!(
                        " user.dmkit={}",
                        String::from_utf8_lossy(&buf[..n as usize])
                    );
                }
            }
            out.insert(p.strip_prefix(root).unwrap().to_path_buf(), line);
        }
    }
    out
}

/// The root partition of `img` mounted read-only by the kernel at `mnt`; unmounted on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn new(img: &Path, fs: &str, mnt: &Path) -> Mounted {
        let inspect: Value = serde_json::from_str(&ok(
            DMKIT,
            &["image", "inspect", "--json", img.to_str().unwrap()],
        ))
        .unwrap();
        let (off, size) = partition(&inspect, "root-x86-64");
        std::fs::create_dir_all(mnt).unwrap();
        let mut opts = format!("ro,loop,offset={off},sizelimit={size}");
        if fs == "ext4" {
            opts += ",noload";
        }
        ok(
            "mount",
            &[
                "-t",
                fs,
                "-o",
                &opts,
                img.to_str().unwrap(),
                mnt.to_str().unwrap(),
            ],
        );
        Mounted(mnt.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-d").arg(&self.0).status();
    }
}

/// `dmkit ARGS` as `nobody`.
fn as_nobody(args: &[&str]) -> std::process::Output {
    let mut all = vec!["--reuid=nobody", "--regid=nogroup", "--clear-groups", DMKIT];
    all.extend_from_slice(args);
    output("setpriv", &all)
}

fn prerequisites(fs: &str) -> bool {
    if !is_root() {
        return missing("not running as root (kernel mounts and setpriv need it)");
    }
    let (prog, pkg) = match fs {
        "erofs" => ("mkfs.erofs", "erofs-utils"),
        "squashfs" => ("mksquashfs", "squashfs-tools"),
        _ => ("mkfs.ext4", "e2fsprogs"),
    };
    tool_missing(prog, pkg) || tool_missing("setpriv", "util-linux") || loop_missing()
}

fn check_fs(fs: &str, compress: Option<&str>) {
    if prerequisites(fs) {
        return;
    }
    let ws = Workspace::new();
    let tree = ws.path("tree");
    make_tree(&tree, fs);
    let pub_dir = common::run::world_dir(&ws, "pub");
    let img = pub_dir.join(format!("{fs}.img"));
    let img_s = img.to_str().unwrap();
    let mut args = vec!["image", "build", "--fs", fs, "--timestamp", "1700000000"];
    if let Some(c) = compress {
        args.extend(["--compress", c]);
    }
    args.extend([tree.to_str().unwrap(), img_s]);
    ok(DMKIT, &args);
    agree(&ws, &pub_dir, &img, fs, true);
}

/// `img` (made by dmkit when `ours`, else by systemd-repart) read by dmkit as `nobody` agrees
/// with the kernel's mount of it.
fn agree(ws: &Workspace, pub_dir: &Path, img: &Path, fs: &str, ours: bool) {
    let img_s = img.to_str().unwrap();
    std::fs::set_permissions(img, std::fs::Permissions::from_mode(0o644)).unwrap();

    let mnt = Mounted::new(img, fs, &ws.path("mnt"));
    let want = kernel_mtree(&mnt.0);

    // mtree as nobody.
    let out = as_nobody(&["image", "mtree", img_s]);
    assert!(
        out.status.success(),
        "mtree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut got = String::from_utf8(out.stdout).unwrap();
    if fs == "ext4" {
        // ext4-view exposes no device numbers (docs/image.md): the only line allowed to differ.
        got = got.replace("device=linux,0,0", "device=linux,1,3");
    }
    assert_eq!(got, want, "{fs}: image mtree differs from the kernel mount");

    // ls --json: names, types, sizes, modes, link targets.
    let out = as_nobody(&["image", "ls", "--json", img_s]);
    assert!(
        out.status.success(),
        "ls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        listed.len(),
        want.lines().count(),
        "{fs}: ls lists every node once"
    );
    for e in &listed {
        let path = e["path"].as_str().unwrap();
        let p = mnt.0.join(path.trim_start_matches('/'));
        let m = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{fs}: {path}: {e}"));
        assert_eq!(
            e["mode"].as_str().unwrap(),
            format!("{:04o}", m.mode() & 0o7777),
            "{fs}: {path}"
        );
        if m.is_file() || m.is_symlink() {
            assert_eq!(e["size"].as_u64().unwrap(), m.len(), "{fs}: {path}");
        }
        if m.is_symlink() {
            assert_eq!(
                e["link"].as_str().unwrap(),
                std::fs::read_link(&p).unwrap().to_str().unwrap()
            );
        }
        assert_eq!(e["uid"].as_u64().unwrap(), u64::from(m.uid()));
        assert_eq!(e["mtime"].as_i64().unwrap(), m.mtime(), "{fs}: {path}");
    }
    if fs == "erofs" && ours {
        let one = listed.iter().find(|e| e["path"] == "/one").unwrap();
        assert_eq!(one["xattrs"], serde_json::json!(["user.dmkit"]));
    }

    // copy-from as nobody: identical to the mount but for what nobody cannot make.
    let dest = pub_dir.join("copy");
    let out = as_nobody(&["image", "copy-from", img_s, "/", dest.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "copy-from: {err}");
    let has_null = mnt.0.join("null").symlink_metadata().is_ok();
    assert_eq!(err.contains("null: device node skipped"), has_null, "{err}");
    let mut want_state = tree_state(&mnt.0, fs == "erofs");
    want_state.remove(Path::new("null"));
    if fs == "ext4" {
        want_state.remove(Path::new("lost+found"));
        std::fs::remove_dir(dest.join("lost+found")).unwrap();
    }
    assert_eq!(
        tree_state(&dest, fs == "erofs"),
        want_state,
        "{fs}: copy-from differs"
    );
    let sparse = std::fs::metadata(dest.join("sparse")).unwrap();
    // (systemd-repart's copy of the tree may have filled the holes in.)
    assert!(
        !ours || sparse.blocks() * 512 < 1 << 20,
        "{fs}: the sparse file was written out in full"
    );
    if fs == "erofs" && ours {
        let a = std::fs::metadata(dest.join("bin/tool")).unwrap();
        let b = std::fs::metadata(dest.join("bin/tool-hard")).unwrap();
        assert_eq!(
            a.ino(),
            b.ino(),
            "erofs: the hard link is one inode in the copy"
        );
    }
    // As root the device node is made too.
    let root_copy = ws.path("root-copy");
    if has_null {
        ok(
            DMKIT,
            &[
                "image",
                "copy-from",
                img_s,
                "/null",
                root_copy.to_str().unwrap(),
            ],
        );
        if fs != "ext4" {
            assert_eq!(
                std::fs::metadata(&root_copy).unwrap().rdev(),
                libc::makedev(1, 3)
            );
        }
    }

    // cat and validate as nobody.
    let out = as_nobody(&["image", "cat", img_s, "/sizes/f4097"]);
    assert!(out.status.success());
    assert_eq!(
        out.stdout,
        std::fs::read(mnt.0.join("sizes/f4097")).unwrap()
    );
    let out = as_nobody(&["image", "validate", "--json", img_s]);
    assert!(
        out.status.success(),
        "validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["bad_count"], 0);
}

#[test]
fn erofs_agrees_with_the_kernel() {
    check_fs("erofs", None);
}

/// Compressed EROFS (LZ4HC, 4 KiB pclusters, compacted indexes) read by dmkit's own reader.
#[test]
fn erofs_lz4hc_agrees_with_the_kernel() {
    check_fs("erofs", Some("lz4hc"));
}

/// Big pclusters (64 KiB, CBLKCNT in the indexes).
#[test]
fn erofs_big_pcluster_agrees_with_the_kernel() {
    check_fs("erofs", Some("big-pcluster"));
}

/// Per-path pcluster sizes from the hints file (4 KiB for shared objects, 32 KiB for bin/).
#[test]
fn erofs_hints_agrees_with_the_kernel() {
    check_fs("erofs", Some("hints"));
}

#[test]
fn squashfs_agrees_with_the_kernel() {
    check_fs("squashfs", Some("zstd"));
}

#[test]
fn ext4_agrees_with_the_kernel() {
    check_fs("ext4", None);
}

/// Debian 12's systemd-repart (252) makes a root partition of `fs` and its verity partitions
/// from the same tree; dmkit's readers agree with the kernel on that image too. (systemd-repart
/// 252 formats SquashFS and ext4 from a tree, not EROFS.)
fn check_repart(fs: &str) {
    if prerequisites(fs) || tool_missing("systemd-repart", "systemd") {
        return;
    }
    let ws = Workspace::new();
    let tree = ws.path("tree");
    make_tree(&tree, fs);
    let defs = ws.path("repart.d");
    std::fs::create_dir_all(&defs).unwrap();
    // ext4 is not sized from its contents by systemd-repart 252: give it room.
    let size = if fs == "ext4" {
        "SizeMinBytes=64M\n"
    } else {
        ""
    };
    std::fs::write(
        defs.join("10-root.conf"),
        format!(
            "[Partition]\nType=root\nFormat={fs}\nCopyFiles={}:/\nVerity=data\nVerityMatchKey=root\n{size}",
            tree.display()
        ),
    )
    .unwrap();
    std::fs::write(
        defs.join("20-verity.conf"),
        "[Partition]\nType=root-verity\nVerity=hash\nVerityMatchKey=root\n",
    )
    .unwrap();
    let pub_dir = common::run::world_dir(&ws, "pub");
    let img = pub_dir.join(format!("repart-{fs}.img"));
    let out = output(
        "systemd-repart",
        &[
            &format!("--definitions={}", defs.display()),
            "--empty=create",
            "--size=auto",
            "--dry-run=no",
            "--seed=5eedd44b-1e2a-4c3d-9b0f-6a27d13c8801",
            img.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("Failed to remount root directory as MS_SLAVE") {
        // systemd-repart populates ext4 in a private mount namespace, which a container whose
        // root is not a shared mount refuses: the machine lacks it, nothing to install.
        eprintln!("{fs}: skipped: systemd-repart cannot make its private mount namespace here");
        return;
    }
    assert!(out.status.success(), "systemd-repart: {err}");
    agree(&ws, &pub_dir, &img, fs, false);
}

#[test]
fn systemd_repart_squashfs_agrees_with_the_kernel() {
    check_repart("squashfs");
}

#[test]
fn systemd_repart_ext4_agrees_with_the_kernel() {
    check_repart("ext4");
}

/// A workspace with the tree at `tree` and its EROFS image at `e.img` (None: skipped).
fn erofs_image() -> Option<(Workspace, PathBuf, PathBuf)> {
    if prerequisites("erofs") {
        return None;
    }
    let ws = Workspace::new();
    let tree = ws.path("tree");
    make_tree(&tree, "erofs");
    let img = ws.path("e.img");
    let args = [
        "image",
        "build",
        "--fs",
        "erofs",
        tree.to_str().unwrap(),
        img.to_str().unwrap(),
    ];
    ok(DMKIT, &args);
    Some((ws, tree, img))
}

/// A flipped byte in the data of one file fails that file only (exit 2, the image and the path
/// named); every other file still reads, and validate names the block.
#[test]
fn a_corrupt_block_fails_only_its_file() {
    let Some((ws, tree, img)) = erofs_image() else {
        return;
    };
    let img_s = img.to_str().unwrap();
    let data = std::fs::read(&img).unwrap();
    let needle = std::fs::read(tree.join("sizes/f204800")).unwrap();
    let at = data
        .windows(64)
        .position(|w| w == &needle[100_000..100_064])
        .unwrap();
    xor_byte(&img, at as u64, 0x01);
    let out = output(DMKIT, &["image", "mtree", img_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{img_s}: /sizes/f204800: ")), "{err}");
    assert!(err.contains("1 path(s) could not be read"), "{err}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("sha256sum=").count(), 11, "{text}");
    let out = output(DMKIT, &["image", "cat", img_s, "/sizes/f204800"]);
    assert_eq!(out.status.code(), Some(2));
    let out = output(DMKIT, &["image", "cat", img_s, "/sizes/f4097"]);
    assert!(out.status.success());
    let out = output(DMKIT, &["image", "validate", img_s]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 block(s)"));
    let dest = ws.path("copy");
    let out = output(
        DMKIT,
        &["image", "copy-from", img_s, "/", dest.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !dest.join("sizes/f204800").exists(),
        "a file that failed is not left half-written"
    );
    assert!(dest.join("sizes/f4096").exists());
}

/// Paths that are not there, `..`, a directory given to cat: one line naming image and path.
#[test]
fn bad_paths_are_refused_in_one_line() {
    let Some((_ws, _tree, img)) = erofs_image() else {
        return;
    };
    let img_s = img.to_str().unwrap();
    for (args, code, text) in [
        (
            vec!["image", "cat", img_s, "/nope"],
            4,
            "/nope: no such file or directory",
        ),
        (
            vec!["image", "cat", img_s, "/sizes"],
            1,
            "/sizes: not a regular file",
        ),
        (
            vec!["image", "ls", img_s, "/one/x"],
            4,
            "/one/x: not a directory",
        ),
        (vec!["image", "ls", img_s, "/../etc"], 4, "`..`"),
    ] {
        let out = output(DMKIT, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(text) && err.contains(img_s), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
