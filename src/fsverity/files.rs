//! Digests of many files at once, on all cores ([`digest_files`]).
//!
//! Small files are read whole, one `read(2)` each, into a per-thread batch buffer at block
//! boundaries; a full batch is hashed level by level with one multi-buffer call per level for
//! all its files (their blocks share the salt prefix), then one call for all their
//! descriptors. Larger files are hashed from a mapping, their level 0 split across cores (see
//! [`super::source`]). Buffers belong to the thread and are reused: no allocation per file
//! beyond the results themselves. A file costs `openat`, `statx`, `read` and `close`.

use std::cell::RefCell;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::build::{build_tree, tree_buffer, BlockHasher, Built};
use super::descriptor::Descriptor;
use super::digest::{FileDigest, FsVerityParams};
use super::geometry::TreeGeometry;
use super::mapped::Mapping;
use super::merkle::MerkleTree;
use super::source::{read_error, Source};
use super::FsVerityError;

/// Bytes of file data a batch holds before it is hashed (at least 16 blocks).
const BATCH_BYTES: usize = 512 << 10;
/// Files up to this size go through a batch; larger ones are hashed on their own.
const SMALL_MAX: u64 = (BATCH_BYTES / 2) as u64;
/// Most files one parallel task takes in turn (fewer when there are few files, so that they
/// still spread over the cores).
const TASK_FILES: usize = 64;

/// Computes the fs-verity digest (and, with `keep_tree`, the Merkle tree) of every file in
/// `paths`, calling `each(i, result)` once for `paths[i]`.
///
/// The calls come from several threads and in no particular order; a file that cannot be
/// read, is not a regular file or changes while it is read gives an error naming it, and the
/// others go on. With invalid parameters every file gets the parameter error.
///
/// Runs on rayon's global thread pool (starting it if needed) when there is more than one
/// file or a large one, and may map files (installing the SIGBUS handler of
/// `super::mapped`): do not call it before `export::open` forks.
///
/// ```no_run
/// use dmkit::fsverity::{digest_files, FsVerityParams};
/// use std::path::PathBuf;
/// use std::sync::Mutex;
///
/// let paths: Vec<PathBuf> = vec!["a".into(), "b".into()];
/// // One slot per file: results arrive in any order, from any thread.
/// let results = Mutex::new((0..paths.len()).map(|_| None).collect::<Vec<_>>());
/// digest_files(&paths, &FsVerityParams::default(), true, |i, r| {
///     results.lock().unwrap()[i] = Some(r);
/// });
/// for (path, r) in paths.iter().zip(results.into_inner().unwrap()) {
///     let t = r.expect("every file is reported").expect("readable");
///     // `sha256:<hex>`, the tree (`--out-merkle-tree`), the descriptor (`--out-descriptor`).
///     println!("{} {} {} {}", t.digest, path.display(), t.tree.len(), t.descriptor_bytes().len());
/// }
/// ```
pub fn digest_files<F>(paths: &[PathBuf], params: &FsVerityParams, keep_tree: bool, each: F)
where
    F: Fn(usize, Result<MerkleTree, FsVerityError>) + Sync,
{
    if params.validate().is_err() {
        for i in 0..paths.len() {
            each(i, Err(params.validate().unwrap_err()));
        }
        return;
    }
    let ctx = Ctx {
        params,
        hasher: BlockHasher::new(params),
        keep_tree,
        each: &each,
    };
    if paths.len() <= 1 {
        return ctx.run(0, paths);
    }
    let per_task = (paths.len() / (4 * rayon::current_num_threads())).clamp(1, TASK_FILES);
    paths
        .par_chunks(per_task)
        .enumerate()
        .for_each(|(t, chunk)| ctx.run(t * per_task, chunk));
}

/// The digest of one file: [`digest_files`] on one path, on the calling thread unless the
/// file is large.
pub(crate) fn digest_one(
    path: &Path,
    params: &FsVerityParams,
    keep_tree: bool,
) -> Result<MerkleTree, FsVerityError> {
    let result = std::sync::Mutex::new(None);
    digest_files(&[path.to_path_buf()], params, keep_tree, |_, r| {
        *result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    result
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .expect("digest_files reports every file")
}

type Each<'a> = &'a (dyn Fn(usize, Result<MerkleTree, FsVerityError>) + Sync);

struct Ctx<'a> {
    params: &'a FsVerityParams,
    hasher: BlockHasher,
    keep_tree: bool,
    each: Each<'a>,
}

impl Ctx<'_> {
    /// Digests `paths`, the first being number `first`, on this thread (large files on all).
    fn run(&self, first: usize, paths: &[PathBuf]) {
        let mut batch = BATCHES.with(|b| b.borrow_mut().pop()).unwrap_or_default();
        for (k, path) in paths.iter().enumerate() {
            let index = first + k;
            let r = open_regular(path).and_then(|(file, meta)| {
                if meta.len() <= SMALL_MAX {
                    batch.add(self, index, path, file, meta.len())
                } else {
                    // Nested parallel work may run another task on this thread meanwhile;
                    // it takes its own batch.
                    self.large(path, &file, &meta).map(Some)
                }
            });
            match r {
                Ok(None) => {}
                Ok(Some(t)) => (self.each)(index, Ok(t)),
                Err(e) => (self.each)(index, Err(e)),
            }
        }
        batch.flush(self);
        BATCHES.with(|b| b.borrow_mut().push(batch));
    }

    /// A file too large for a batch: level 0 on all cores, from a mapping if possible.
    fn large(
        &self,
        path: &Path,
        file: &File,
        meta: &Metadata,
    ) -> Result<MerkleTree, FsVerityError> {
        let size = meta.len();
        let geometry = TreeGeometry::new(size, self.params)?;
        let source = match Mapping::new(file, size) {
            Some(m) => Source::Mapped(m),
            None => Source::File(file),
        };
        let built = build_tree(&geometry, &self.hasher, self.keep_tree, |first, out| {
            source.hash_level0(&self.hasher, size, first, out, path)
        })?;
        let faulted = matches!(&source, Source::Mapped(m) if m.faulted());
        let after = file.metadata().map_err(|e| read_error(path, e))?;
        if faulted || after.len() != size || !same_mtime(meta, &after) {
            return Err(changed(path));
        }
        Ok(finish(self.params, size, built))
    }
}

/// The tree and digest of a file of `size` bytes from its built tree.
pub(crate) fn finish(params: &FsVerityParams, size: u64, built: Built) -> MerkleTree {
    let descriptor = descriptor(params, size, built.root_hash);
    let digest = descriptor.digest();
    MerkleTree {
        digest: FileDigest { descriptor, digest },
        tree: built.tree,
    }
}

fn descriptor(params: &FsVerityParams, size: u64, root_hash: Vec<u8>) -> Descriptor {
    Descriptor {
        hash: params.hash,
        log_blocksize: params.block_size.trailing_zeros() as u8,
        data_size: size,
        root_hash,
        salt: params.salt.clone(),
    }
}

fn same_mtime(a: &Metadata, b: &Metadata) -> bool {
    (a.mtime(), a.mtime_nsec()) == (b.mtime(), b.mtime_nsec())
}

fn changed(path: &Path) -> FsVerityError {
    FsVerityError::Io {
        path: path.to_path_buf(),
        reason: "the file changed while it was read".into(),
    }
}

/// Opens `path` for reading if it is a regular file. A FIFO is opened without blocking and
/// then refused, never waited on.
pub(crate) fn open_regular(path: &Path) -> Result<(File, Metadata), FsVerityError> {
    let io = |e: std::io::Error| FsVerityError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(FsVerityError::NotRegularFile(path.to_path_buf()));
    }
    Ok((file, meta))
}

thread_local! {
    /// This thread's batches (a stack, for tasks nested while one waits).
    static BATCHES: RefCell<Vec<Batch>> = const { RefCell::new(Vec::new()) };
}

/// Small files read but not hashed yet, and the buffers to hash them.
#[derive(Default)]
struct Batch {
    /// File data, each file from a block boundary, its last block zero-padded.
    data: Vec<u8>,
    /// Bytes of `data` in use (whole blocks).
    used: usize,
    files: Vec<Pending>,
    /// Hashes of the current level, all files after one another.
    level: Vec<u8>,
    /// The current level's blocks of the files not done yet.
    stage: Vec<u8>,
    /// Each file's hashes in `level`: (offset, count).
    spans: Vec<(usize, u64)>,
    /// The descriptors, then their hashes.
    descriptors: Vec<u8>,
    digests: Vec<u8>,
}

struct Pending {
    index: usize,
    size: u64,
    /// First byte in `data`.
    offset: usize,
    root: Vec<u8>,
    tree: Vec<u8>,
    geometry: Option<TreeGeometry>,
}

impl Batch {
    /// Reads a small file into the batch (hashing the batch first if it is full). Returns
    /// nothing: the file's result comes with the batch's.
    fn add(
        &mut self,
        ctx: &Ctx<'_>,
        index: usize,
        path: &Path,
        mut file: File,
        size: u64,
    ) -> Result<Option<MerkleTree>, FsVerityError> {
        let bs = ctx.hasher.block_size();
        let size_us = size as usize;
        let padded = size_us.div_ceil(bs) * bs;
        let capacity = BATCH_BYTES.max(16 * bs) + bs;
        if self.data.len() < capacity {
            self.data.resize(capacity, 0);
        }
        if self.used + padded + 1 > self.data.len() {
            self.flush(ctx);
        }
        // One byte more than the size: getting it means the file grew since fstat.
        let dst = &mut self.data[self.used..self.used + size_us + 1];
        let mut got = 0;
        while got < size_us {
            match file.read(&mut dst[got..]) {
                Ok(0) => return Err(read_error(path, std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_error(path, e)),
            }
        }
        if got > size_us {
            return Err(changed(path));
        }
        drop(file);
        self.data[self.used + size_us..self.used + padded].fill(0);
        let (tree, geometry) = if ctx.keep_tree && size > bs as u64 {
            let g = TreeGeometry::new(size, ctx.params)?;
            (tree_buffer(g.tree_size())?, Some(g))
        } else {
            (Vec::new(), None)
        };
        self.files.push(Pending {
            index,
            size,
            offset: self.used,
            root: Vec::new(),
            tree,
            geometry,
        });
        self.used += padded;
        Ok(None)
    }

    /// Hashes every file of the batch and reports them.
    fn flush(&mut self, ctx: &Ctx<'_>) {
        if self.files.is_empty() {
            return;
        }
        let bs = ctx.hasher.block_size();
        let ds = ctx.hasher.digest_size();
        self.level.resize(self.used / bs * ds, 0);
        ctx.hasher.blocks(
            &self.data[..self.used],
            &mut self.level[..self.used / bs * ds],
        );
        self.spans.clear();
        self.spans.extend(
            self.files
                .iter()
                .map(|f| (f.offset / bs * ds, f.size.div_ceil(bs as u64))),
        );
        // One level of every unfinished file per round, all in one multi-buffer call.
        let mut level = 0;
        loop {
            self.stage.clear();
            for (f, (at, count)) in self.files.iter_mut().zip(self.spans.iter_mut()) {
                match *count {
                    0 => {
                        if f.root.is_empty() {
                            f.root = vec![0; ds];
                        }
                        continue;
                    }
                    1 => {
                        f.root = self.level[*at..*at + ds].to_vec();
                        *count = 0;
                        continue;
                    }
                    _ => {}
                }
                let start = self.stage.len();
                self.stage
                    .extend_from_slice(&self.level[*at..*at + *count as usize * ds]);
                self.stage
                    .resize(start + (*count as usize * ds).div_ceil(bs) * bs, 0);
                if let Some(g) = &f.geometry {
                    let to = g.level_offset(level).expect("level in the tree") as usize;
                    let blocks = &self.stage[start..];
                    f.tree[to..to + blocks.len()].copy_from_slice(blocks);
                }
                *at = start / bs * ds;
                *count = ((self.stage.len() - start) / bs) as u64;
            }
            if self.stage.is_empty() {
                break;
            }
            let n = self.stage.len() / bs * ds;
            self.level.resize(n, 0);
            ctx.hasher.blocks(&self.stage, &mut self.level[..n]);
            level += 1;
        }
        // All descriptors in one call.
        self.descriptors.clear();
        let mut files = std::mem::take(&mut self.files);
        let descriptors: Vec<Descriptor> = files
            .iter_mut()
            .map(|f| descriptor(ctx.params, f.size, std::mem::take(&mut f.root)))
            .collect();
        for d in &descriptors {
            self.descriptors.extend_from_slice(&d.to_bytes());
        }
        self.digests.resize(files.len() * ds, 0);
        ctx.hasher
            .descriptors(&self.descriptors, &mut self.digests[..files.len() * ds]);
        for ((f, descriptor), digest) in files
            .drain(..)
            .zip(descriptors)
            .zip(self.digests.chunks_exact(ds))
        {
            let t = MerkleTree {
                digest: FileDigest {
                    descriptor,
                    digest: digest.to_vec(),
                },
                tree: f.tree,
            };
            (ctx.each)(f.index, Ok(t));
        }
        self.used = 0;
        // Keep the vector's capacity for the next batch.
        self.files = files;
    }
}
