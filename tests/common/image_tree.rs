//! A small root file system tree for the image tests (tests/image.rs, tests/kernel_image.rs),
//! and what a tree holds, to compare one with its image mounted.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The file [`make_tree`] makes large enough to corrupt alone (1.5 MiB of random bytes).
pub const BIG_FILE: &str = "data/big.bin";

/// A small root tree: text and random files, an empty file and directory, a symbolic link,
/// a hard link, odd modes, and one larger file (the corruption target).
pub fn make_tree(dir: &Path) {
    let w = |rel: &str, data: &[u8], mode: u32| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    w("etc/hostname", b"dmkit-image-test\n", 0o644);
    w(
        "etc/os-release",
        b"ID=dmkit\nPRETTY_NAME=\"dmkit test root\"\n",
        0o644,
    );
    w("etc/shadow", b"root:*:19000:0:99999:7:::\n", 0o640);
    w("etc/empty", b"", 0o644);
    w("usr/bin/tool", &super::rng::bytes(1, 200 << 10), 0o755);
    let text: Vec<u8> = (0..300u32 << 10)
        .map(|i| b"abcdefgh ijklmnop\n"[(i % 18) as usize])
        .collect();
    w("usr/lib/libtext.so.1", &text, 0o644);
    for i in 0..40 {
        w(
            &format!("usr/share/many/f{i:02}"),
            format!("small file {i}\n").repeat(i + 1).as_bytes(),
            0o644,
        );
    }
    w(BIG_FILE, &super::rng::bytes(2, 1536 << 10), 0o600);
    std::fs::create_dir_all(dir.join("var/empty")).unwrap();
    std::fs::set_permissions(
        dir.join("var/empty"),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
    std::fs::hard_link(dir.join("usr/bin/tool"), dir.join("usr/bin/tool-link")).unwrap();
}

/// What a tree holds, by relative path: type, permission bits, owner, and the content's
/// SHA-256 (files) or the target (symbolic links).
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    snapshot_skipping(root, None)
}

/// [`snapshot`], with `skip` listed but not read.
pub fn snapshot_skipping(root: &Path, skip: Option<&Path>) -> BTreeMap<PathBuf, String> {
    use sha2::Digest;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if Some(rel.as_path()) == skip {
                "not read".to_string()
            } else if m.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else if m.is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else {
                let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                format!("file {}", hex::encode(sha2::Sha256::digest(data)))
            };
            let line = format!("{what} {:o} {}:{}", m.mode() & 0o7777, m.uid(), m.gid());
            out.insert(rel, line);
        }
    }
    out
}

/// A workspace holding [`make_tree`]'s tree at `tree`: what every image test starts from.
pub fn tree_workspace() -> (super::run::Workspace, PathBuf) {
    let ws = super::run::Workspace::new();
    let tree = ws.path("tree");
    make_tree(&tree);
    (ws, tree)
}

/// (offset, size) of the partition of type `ty` in `dmkit image inspect --json`.
pub fn partition(inspect: &serde_json::Value, ty: &str) -> (u64, u64) {
    let p = inspect["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == ty)
        .unwrap_or_else(|| panic!("no {ty} partition: {inspect}"));
    (p["offset"].as_u64().unwrap(), p["size"].as_u64().unwrap())
}

/// Whether systemd-dissect cannot run here: not installed, or `/` is not a mount point (a
/// chroot), where the private mount namespace it reads an image in cannot be made.
pub fn dissect_missing() -> bool {
    if super::env::tool_missing("systemd-dissect", "systemd-container") {
        return true;
    }
    super::env::private_mounts_missing("systemd-dissect")
}

/// `systemd-dissect --json=short IMAGE [--root-hash=H]`.
pub fn dissect(img: &Path, root_hash: Option<&str>) -> std::process::Output {
    let mut args = vec!["--json=short".to_string()];
    if let Some(h) = root_hash {
        args.push(format!("--root-hash={h}"));
    }
    args.push(img.to_str().expect("UTF-8 path").to_string());
    super::run::output("systemd-dissect", &args)
}

/// [`dissect`]'s JSON, asserting that systemd-dissect succeeded.
pub fn dissect_ok(img: &Path, root_hash: Option<&str>) -> serde_json::Value {
    let out = dissect(img, root_hash);
    assert!(
        out.status.success(),
        "systemd-dissect {}: {}",
        img.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
