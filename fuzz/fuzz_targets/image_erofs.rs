//! Arbitrary bytes as an EROFS file system read by dmkit's own reader: opening, walking the
//! whole tree as `image mtree` does (every directory, stat, symlink, xattr list and file read)
//! never panics, hangs or allocates without bound, whatever the superblock, inodes, directory
//! blocks, chunk tables and xattr areas say (loops, oversized lengths, truncation).
//!
//! The seed is a small image from mkfs.erofs (files, a directory, a symlink, a hard link, an
//! xattr, an inline tail); the fuzzer mutates its fields.

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
