//! Level 0 of a large file's tree: the data blocks' hashes, computed on all cores from a
//! mapping of the file (or, when it cannot be mapped, from `pread` into per-thread buffers),
//! or on the calling thread from bytes in memory or a reader.

use std::cell::RefCell;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use super::build::BlockHasher;
use super::mapped::Mapping;
use super::FsVerityError;

/// Data one task hashes (and one `pread` reads).
const TASK_BYTES: usize = 1 << 20;
/// Below this many bytes a file is hashed on the calling thread: splitting would cost more
/// than it saves, and starts no thread pool.
pub(crate) const PARALLEL_MIN_BYTES: u64 = 4 << 20;

/// Where a file's bytes come from.
pub(crate) enum Source<'a> {
    /// In memory.
    Bytes(&'a [u8]),
    /// A mapping of the file (see [`Mapping`]).
    Mapped(Mapping),
    /// Read with `pread`.
    File(&'a File),
}

impl Source<'_> {
    /// Fills `out` with the hashes of data blocks `first..` of a file of `size` bytes (one
    /// per block), on all cores when there is enough of it.
    pub(crate) fn hash_level0(
        &self,
        hasher: &BlockHasher,
        size: u64,
        first: u64,
        out: &mut [u8],
        path: &Path,
    ) -> Result<(), FsVerityError> {
        let bs = hasher.block_size();
        let ds = hasher.digest_size();
        let task_blocks = (TASK_BYTES / bs).max(1);
        let task = |(t, out): (usize, &mut [u8])| {
            self.hash_range(hasher, size, first + (t * task_blocks) as u64, out, path)
        };
        let chunks = task_blocks * ds;
        if ((out.len() / ds) as u64).saturating_mul(bs as u64) < PARALLEL_MIN_BYTES {
            out.chunks_mut(chunks).enumerate().try_for_each(task)
        } else {
            out.par_chunks_mut(chunks).enumerate().try_for_each(task)
        }
    }

    fn hash_range(
        &self,
        hasher: &BlockHasher,
        size: u64,
        first: u64,
        out: &mut [u8],
        path: &Path,
    ) -> Result<(), FsVerityError> {
        let bs = hasher.block_size() as u64;
        let start = first * bs;
        let len = ((out.len() / hasher.digest_size()) as u64 * bs).min(size - start) as usize;
        match self {
            Source::Bytes(b) => hasher.data(&b[start as usize..][..len], out),
            Source::Mapped(m) => hasher.data(&m.bytes()[start as usize..][..len], out),
            Source::File(f) => with_buffer(len, |buf| {
                f.read_exact_at(buf, start)
                    .map_err(|e| read_error(path, e))?;
                hasher.data(buf, out);
                Ok::<_, FsVerityError>(())
            })?,
        }
        Ok(())
    }
}

/// Fills `out` with the hashes of the next `out.len() / digest_size` blocks read from
/// `reader`, of a file of `size` bytes of which `*done` were read already.
pub(crate) fn hash_level0_from_reader<R: Read>(
    reader: &mut R,
    hasher: &BlockHasher,
    size: u64,
    done: &mut u64,
    out: &mut [u8],
    path: &Path,
) -> Result<(), FsVerityError> {
    let bs = hasher.block_size();
    let ds = hasher.digest_size();
    let task_blocks = (TASK_BYTES / bs).max(1);
    for out in out.chunks_mut(task_blocks * ds) {
        let len = ((out.len() / ds * bs) as u64).min(size - *done) as usize;
        with_buffer(len, |buf| {
            reader.read_exact(buf).map_err(|e| read_error(path, e))?;
            hasher.data(buf, out);
            Ok::<_, FsVerityError>(())
        })?;
        *done += len as u64;
    }
    Ok(())
}

/// A read error, or the file ending before the size it had when opened.
pub(crate) fn read_error(path: &Path, e: std::io::Error) -> FsVerityError {
    FsVerityError::Io {
        path: path.to_path_buf(),
        reason: if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "the file shrank while it was read".to_string()
        } else {
            e.to_string()
        },
    }
}

thread_local! {
    /// Read buffers of this thread, reused from file to file (a stack: a task that waits for
    /// nested work may run another task on the same thread).
    static BUFFERS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a buffer of `len` bytes (contents unspecified) taken from this thread's
/// spare buffers.
pub(crate) fn with_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut buf = BUFFERS.with(|b| b.borrow_mut().pop()).unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let r = f(&mut buf[..len]);
    BUFFERS.with(|b| b.borrow_mut().push(buf));
    r
}
