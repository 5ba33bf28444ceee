//! Arbitrary bytes as an EROFS file system read by dmkit's own reader: opening, walking the
//! whole tree as `image mtree` does (every directory, stat, symlink, xattr list and file read)
//! never panics, hangs or allocates without bound, whatever the superblock, inodes, directory
//! blocks, chunk tables and xattr areas say (loops, oversized lengths, truncation).
//!
//! The seeds are small images from mkfs.erofs: small-tree (files, a directory, a symlink, a
//! hard link, an xattr, an inline tail) and compressed ones (text, text with noise, a symlink):
//! compressed-lz4 (`-zlz4`, 4 KiB pclusters, PLAIN ones among them), compressed-ztail
//! (`-zlz4hc -C16384 -Eztailpacking`: big pclusters, compacted indexes, inline tails) and
//! compressed-legacy (`-zlz4hc -Elegacy-compress`: full indexes); the fuzzer mutates their
//! fields, index entries and compressed bytes included.

#![no_main]

use dmkit::image::read::{erofs::Erofs, walk, FsReader, Source};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > 1 << 20 {
        return;
    }
    let Ok(fs) = Erofs::open(Source::from_vec(data.to_vec())) else {
        return;
    };
    let root = fs.root();
    let _ = walk::mtree(&fs, root, "/", &mut std::io::sink());
    let _ = walk::list(&fs, root, "/");
});
