//! Arbitrary bytes as an ext4 file system read through dmkit's reader: opening, walking the
//! whole tree as `image mtree` does (every directory, stat, symlink, xattr list and file read)
//! and listing it never panics, hangs or allocates without bound, whatever the superblock and
//! the tables say.
//!
//! The seed is a small image made by the real tool (files, a directory, a symlink, a hard
//! link); the fuzzer mutates its fields.

#![no_main]

use dmkit::image::read::{walk, FsReader, Source};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > 1 << 20 {
        return;
    }
    let Ok(fs) = dmkit::image::read::ext4::Ext4Reader::open(Source::from_vec(data.to_vec())) else {
        return;
    };
    let root = fs.root();
    let _ = walk::mtree(&fs, root, "/", &mut std::io::sink());
    let _ = walk::list(&fs, root, "/");
});
