//! Compressed EROFS images made by the real mkfs.erofs with every setting dmkit offers (and
//! the layouts erofs-utils 1.5 can make besides: legacy full indexes, ztailpacking), read back
//! byte for byte; and damaged ones, which fail only the file that uses the damage.

use super::format::Layout;
use super::Erofs;
use crate::image::mkfs::{find_program, EROFS_HINTS};
use crate::image::read::{FsReader, NodeId, ReadError, Source};
use std::process::Command;

/// `n` incompressible bytes.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    crate::verity::tests::random_bytes(n, seed)
}

/// Compressible text of `n` bytes.
fn text(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    let mut i = 0u64;
    while v.len() < n {
        v.extend_from_slice(format!("line {i} of some text, {} words\n", i % 17).as_bytes());
        i += 1;
    }
    v.truncate(n);
    v
}

/// The files of the test tree: path and contents.
fn files() -> Vec<(&'static str, Vec<u8>)> {
    let mut mixed = Vec::new();
    for k in 0..12 {
        mixed.extend(text(8192 + k * 100));
        mixed.extend(noise(k as u64 + 7, 8192 - k * 50));
    }
    vec![
        ("text.txt", text(300_000)),
        ("random.bin", noise(1, 12 * 4096 + 123)),
        ("mixed.bin", mixed),
        ("zeros.bin", vec![0; 2 << 20]),
        ("small.txt", b"hello ".repeat(20)),
        ("tail.txt", text(3 * 4096 + 2000)),
        ("lib/libx.so.1", text(50_000)),
        ("bin/tool", text(70_000)),
        ("empty", Vec::new()),
    ]
}

fn lookup(fs: &Erofs, path: &str) -> NodeId {
    let mut node = fs.root();
    for part in path.split('/') {
        node = fs
            .read_dir(node)
            .unwrap()
            .into_iter()
            .find(|e| e.name == part.as_bytes())
            .unwrap_or_else(|| panic!("{path}: no {part}"))
            .node;
    }
    node
}

/// Build the tree with `args` (None: mkfs.erofs is missing and CI is not set).
fn build(args: &[&str]) -> Option<(tempfile::TempDir, Vec<u8>)> {
    let Some(mkfs) = find_program("mkfs.erofs") else {
        assert!(std::env::var_os("CI").is_none(), "mkfs.erofs is missing");
        return None;
    };
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("tree");
    for (p, data) in files() {
        let p = tree.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    std::fs::write(d.path().join("hints"), EROFS_HINTS).unwrap();
    let img = d.path().join("img");
    let out = Command::new(mkfs)
        .args(["-T0", "--quiet"])
        .args(
            args.iter()
                .map(|a| a.replace("HINTS", &d.path().join("hints").to_string_lossy())),
        )
        .arg(&img)
        .arg(&tree)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs.erofs {args:?}: {out:?}");
    let bytes = std::fs::read(&img).unwrap();
    Some((d, bytes))
}

/// What a check saw: layouts, and extents stored plain, inline, in big pclusters.
#[derive(Default, Debug)]
struct Seen {
    layouts: Vec<Layout>,
    plain: bool,
    inline: bool,
    big: bool,
}

/// Every file reads back whole and in odd pieces; returns what it used.
fn check(bytes: Vec<u8>, args: &[&str]) -> Seen {
    let fs = Erofs::open(Source::from_vec(bytes)).unwrap();
    let mut seen = Seen::default();
    for (p, want) in files() {
        let node = lookup(&fs, p);
        let i = fs.inode(node).unwrap();
        seen.layouts.push(i.layout);
        if i.compressed() {
            let z = super::zmap::ZMap::new(&fs.src, &fs.sb, &i).unwrap();
            let mut pos = 0;
            while pos < i.size {
                let x = z.extent(pos).unwrap();
                seen.plain |= x.codec == super::zmap::Codec::Plain;
                seen.inline |= x.inline;
                seen.big |= x.plen > 4096;
                pos = x.la + x.llen;
            }
        }
        assert_eq!(
            fs.stat(node).unwrap().size,
            want.len() as u64,
            "{args:?} {p}"
        );
        for piece in [1 << 20, 7001, 4096] {
            let mut got = Vec::new();
            let mut buf = vec![0u8; piece];
            loop {
                let n = fs.read(node, got.len() as u64, &mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(
                got == want,
                "{args:?} {p}: content differs (pieces of {piece})"
            );
        }
        // Reads starting anywhere (the extent found from its middle, backwards).
        for off in [want.len() / 3, want.len().saturating_sub(1), 4095, 4097] {
            if off < want.len() {
                let mut b = [0u8; 100];
                let n = fs.read(node, off as u64, &mut b).unwrap();
                assert_eq!(
                    &b[..n],
                    &want[off..(off + 100).min(want.len())],
                    "{args:?} {p} @{off}"
                );
            }
        }
    }
    seen
}

#[test]
fn compressed_images_read_back() {
    let settings: &[&[&str]] = &[
        // dmkit's presets (src/image/mkfs.rs): lz4, lz4hc[,LEVEL], big-pcluster, hints.
        &["-zlz4"],
        &["-zlz4hc"],
        &["-zlz4hc,12"],
        &["-zlz4hc", "-C65536"],
        &["--compress-hints=HINTS", "-zlz4hc,12"],
        // What erofs-utils 1.5 makes besides: ztailpacking, full (legacy) indexes.
        &["-zlz4hc", "-Eztailpacking"],
        &["-zlz4hc", "-C16384", "-Eztailpacking"],
        &["-zlz4hc", "-Elegacy-compress"],
    ];
    for args in settings {
        let Some((_d, bytes)) = build(args) else {
            return;
        };
        let seen = check(bytes, args);
        let want = if args.contains(&"-Elegacy-compress") {
            Layout::CompressedFull
        } else {
            Layout::CompressedCompact
        };
        assert!(seen.layouts.contains(&want), "{args:?}: {seen:?}");
        let ztail = args.contains(&"-Eztailpacking");
        assert_eq!(seen.inline, ztail, "{args:?}: {seen:?}");
        let big = args
            .iter()
            .any(|a| a.starts_with("-C") || a.starts_with("--compress-hints"));
        assert_eq!(seen.big, big, "{args:?}: {seen:?}");
        // mixed.bin's noise does not fit 4 KiB pclusters: PLAIN ones (larger pclusters may
        // take the mix whole, and wholly incompressible files are stored flat).
        assert!(seen.plain || big, "{args:?}: {seen:?}");
    }
}

#[test]
fn legacy_lz4_without_0padding_is_refused_per_file() {
    let Some((_d, bytes)) = build(&["-zlz4", "-Elegacy-compress"]) else {
        return;
    };
    let fs = Erofs::open(Source::from_vec(bytes)).unwrap();
    let node = lookup(&fs, "text.txt");
    let e = fs.read(node, 0, &mut [0u8; 10]).unwrap_err();
    assert!(matches!(e, ReadError::Unsupported(_)), "{e}");
    // Files kept uncompressed still read.
    let node = lookup(&fs, "small.txt");
    assert_eq!(fs.read(node, 0, &mut [0u8; 10]).unwrap(), 10);
}

/// Damage inside one file's compressed data fails that file (Corrupt, naming its inode) and
/// no other; damage anywhere never panics.
#[test]
fn damage_fails_only_its_file() {
    let Some((_d, bytes)) = build(&["-zlz4hc", "-C65536"]) else {
        return;
    };
    let fs = Erofs::open(Source::from_vec(bytes.clone())).unwrap();
    let node = lookup(&fs, "text.txt");
    let i = fs.inode(node).unwrap();
    let x = super::zmap::ZMap::new(&fs.src, &fs.sb, &i)
        .unwrap()
        .extent(0)
        .unwrap();
    assert!(x.plen > 4096, "big pcluster expected: {x:?}");
    let mut bad = bytes.clone();
    for b in &mut bad[(x.pa + x.plen - 200) as usize..(x.pa + x.plen) as usize] {
        *b ^= 0x5a;
    }
    let fs = Erofs::open(Source::from_vec(bad)).unwrap();
    let mut sink = Vec::new();
    let e = fs.copy_to(lookup(&fs, "text.txt"), &mut sink).unwrap_err();
    assert!(e.to_string().contains(&format!("inode {node}")), "{e}");
    for (p, want) in files() {
        if p != "text.txt" {
            let mut got = Vec::new();
            fs.copy_to(lookup(&fs, p), &mut got).unwrap();
            assert!(got == want, "{p}");
        }
    }
    // Every byte of the index area and inode flipped in turn: errors, never a panic.
    let start = i.offset as usize;
    for k in start..start + 256 {
        let mut bad = bytes.clone();
        bad[k] ^= 0xff;
        if let Ok(fs) = Erofs::open(Source::from_vec(bad)) {
            let _ = fs.copy_to(node, &mut std::io::sink());
        }
    }
}
