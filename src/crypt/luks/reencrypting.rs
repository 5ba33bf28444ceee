//! The device a served LUKS2 volume is while its server reencrypts it online
//! ([`Reencrypting`]): each request split at the boundary between rewritten and old data,
//! each piece through the view of its side (the new key or plaintext, the old key, or the
//! moved first segment of a decryption moving the data down); a request touching the hotzone
//! waits until it is committed, and the hotzone waits for the requests in flight on it, so no
//! request sees a mix.

use crate::block::{check_range, BlockDevice, BlockError, Result as BlockResult};
use crate::crypt::luks2::reencrypt::Hotzones;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

/// Where the boundary and the hotzone are, and the requests in flight.
#[derive(Default)]
struct Zone {
    /// The boundary between old and new data (see [`Layout`]).
    boundary: u64,
    /// The hotzone being rewritten, `[start, end)`.
    hot: Option<(u64, u64)>,
    /// The hotzone failed: its content is uncertain, requests touching it fail.
    failed: bool,
    next: u64,
    inflight: BTreeMap<u64, (u64, u64)>,
}

fn overlaps((s, e): (u64, u64), start: u64, end: u64) -> bool {
    s < end && start < e
}

/// How the data splits at the boundary `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// A re-key: the new data below `b`, the old from it on.
    Forward,
    /// A decryption with a detached header: the old data below `b`, the plaintext from it on.
    Backward,
    /// A decryption moving the data down by the old data offset: below the given length the
    /// moved first segment (old key, at the device's start), the plaintext at its new place
    /// up to `b`, the old data (still at its old place) from `b` on; once `b` is 0 (the moved
    /// segment, the last hotzone, is done), plaintext throughout.
    Moved(u64),
}

/// Which view serves a piece of a request.
#[derive(Clone, Copy)]
enum Side {
    New,
    Old,
    Moved,
}

impl Layout {
    /// The pieces of a device of `size` bytes, `[start, end)` each with its view, when the
    /// boundary is `b`.
    fn pieces(self, b: u64, size: u64) -> [(u64, u64, Side); 3] {
        match self {
            Layout::Forward => [
                (0, b, Side::New),
                (b, size, Side::Old),
                (size, size, Side::New),
            ],
            Layout::Backward => [
                (0, b, Side::Old),
                (b, size, Side::New),
                (size, size, Side::New),
            ],
            Layout::Moved(_) if b == 0 => [
                (0, size, Side::New),
                (size, size, Side::New),
                (size, size, Side::New),
            ],
            Layout::Moved(m) => [(0, m, Side::Moved), (m, b, Side::New), (b, size, Side::Old)],
        }
    }

    /// Whether everything is rewritten when the boundary is `b`.
    fn finished(self, b: u64, size: u64) -> bool {
        match self {
            Layout::Forward => b >= size,
            Layout::Backward | Layout::Moved(_) => b == 0,
        }
    }

    /// Bytes rewritten when the boundary is `b`.
    fn done(self, b: u64, size: u64) -> u64 {
        match self {
            Layout::Forward => b,
            Layout::Backward => size - b,
            Layout::Moved(_) if b == 0 => size,
            Layout::Moved(m) => b.saturating_sub(m),
        }
    }
}

/// The views of the old key: the old data, and the moved first segment of [`Layout::Moved`].
pub(super) struct OldViews {
    /// The old data at its place.
    pub old: Arc<dyn BlockDevice>,
    /// The moved first segment ([`Layout::Moved`] only).
    pub moved: Option<Arc<dyn BlockDevice>>,
}

/// The device served during an online reencryption (see the module documentation).
pub(super) struct Reencrypting {
    name: String,
    size: u64,
    block: u32,
    read_only: bool,
    layout: Layout,
    new: Arc<dyn BlockDevice>,
    /// The old key's views; dropped (its key schedule with them) once everything is rewritten.
    old: RwLock<Option<OldViews>>,
    zone: Mutex<Zone>,
    moved: Condvar,
}

impl Reencrypting {
    /// The device `name` of `size` bytes in blocks of `block` bytes, split as `layout` says
    /// between `new` and `old`, nothing rewritten until the run's loop starts and says where
    /// the boundary is.
    pub fn new(
        name: &str,
        size: u64,
        block: u32,
        layout: Layout,
        new: Arc<dyn BlockDevice>,
        old: OldViews,
    ) -> Reencrypting {
        let boundary = match layout {
            Layout::Forward => 0,
            Layout::Backward => size,
            Layout::Moved(m) => m,
        };
        Reencrypting {
            name: name.to_string(),
            size,
            block,
            read_only: false,
            layout,
            new,
            old: RwLock::new(Some(old)),
            zone: Mutex::new(Zone {
                boundary,
                ..Zone::default()
            }),
            moved: Condvar::new(),
        }
    }

    fn zone(&self) -> MutexGuard<'_, Zone> {
        self.zone.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Zone>) -> MutexGuard<'a, Zone> {
        self.moved.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f(device, offset on it, offset in the request, length)` over
    /// `[offset, offset + len)`, each side of the boundary with its own view.
    fn io(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&dyn BlockDevice, u64, usize, usize) -> BlockResult<()>,
    ) -> BlockResult<()> {
        check_range(&self.name, offset, len as usize, self.size)?;
        let end = offset + len;
        let (id, boundary) = {
            let mut z = self.zone();
            while z.hot.is_some_and(|h| overlaps(h, offset, end)) {
                if z.failed {
                    return Err(BlockError::Io {
                        device: self.name.clone(),
                        offset,
                        source: std::io::Error::other("the reencryption hotzone failed"),
                    });
                }
                z = self.wait(z);
            }
            let id = z.next;
            z.next += 1;
            z.inflight.insert(id, (offset, end));
            (id, z.boundary)
        };
        let r = (|| {
            let old = |side: Side| {
                let views = self.old.read().unwrap_or_else(|e| e.into_inner());
                let view = views.as_ref().and_then(|v| match side {
                    Side::Moved => v.moved.clone(),
                    _ => Some(v.old.clone()),
                });
                view.ok_or_else(|| BlockError::Io {
                    device: self.name.clone(),
                    offset,
                    source: std::io::Error::other("no old key on the old side of the boundary"),
                })
            };
            // Every view maps the device's byte `x` at its own `x`.
            for (start, stop, side) in self.layout.pieces(boundary, self.size) {
                let (s, e) = (offset.max(start), end.min(stop));
                if s >= e {
                    continue;
                }
                let (from, n) = ((s - offset) as usize, (e - s) as usize);
                match side {
                    Side::New => f(self.new.as_ref(), s, from, n)?,
                    _ => f(old(side)?.as_ref(), s, from, n)?,
                }
            }
            Ok(())
        })();
        self.zone().inflight.remove(&id);
        self.moved.notify_all();
        r
    }

    /// The run failed inside a hotzone: requests touching it fail from now on.
    pub fn fail(&self) {
        self.zone().failed = true;
        self.moved.notify_all();
    }

    /// Bytes rewritten.
    pub fn done(&self) -> u64 {
        let b = self.zone().boundary;
        self.layout.done(b, self.size)
    }
}

impl Hotzones for Reencrypting {
    fn start(&self, boundary: u64) {
        self.zone().boundary = boundary;
    }

    fn enter(&self, offset: u64, len: u64) {
        let end = offset + len;
        let mut z = self.zone();
        z.hot = Some((offset, end));
        while z.inflight.values().any(|&r| overlaps(r, offset, end)) {
            z = self.wait(z);
        }
    }

    fn leave(&self, boundary: u64) {
        {
            let mut z = self.zone();
            z.boundary = boundary;
            z.hot = None;
        }
        self.moved.notify_all();
        if self.layout.finished(boundary, self.size) {
            *self.old.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

impl BlockDevice for Reencrypting {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        self.block
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<()> {
        self.io(offset, buf.len() as u64, |d, at, from, n| {
            d.read_at(&mut buf[from..from + n], at)
        })
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        self.io(offset, buf.len() as u64, |d, at, from, n| {
            d.write_at(&buf[from..from + n], at)
        })
    }
    fn flush(&self) -> BlockResult<()> {
        // Both views write the same backing file: one flush covers both.
        self.new.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.io(offset, len, |d, at, _, n| d.discard(at, n as u64))
    }
}
