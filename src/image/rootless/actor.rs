//! The userspace reader on a thread of its own, asked by the FUSE serving threads.
//!
//! Why a thread: the readers are not `Sync` (ext4-view shares its state through `Rc`, and the
//! ext4 reader numbers its nodes as it meets them, so one reader per serving thread would not
//! agree on node numbers), while the FUSE threads answer concurrently. The reader is opened on
//! this thread and never leaves it; each request carries its own answer channel. The thread
//! ends when the last [`ReaderHandle`] is dropped.

use crate::image::mkfs::FsKind;
use crate::image::read::{self, DirEntry, FsReader, NodeId, ReadError, Source, Stat};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

pub use crate::export::fuse::Xattrs;

enum Op {
    Root,
    Dir(NodeId),
    Stat(NodeId),
    Link(NodeId),
    Read(NodeId, u64, usize),
    Xattrs(NodeId),
}

enum Ans {
    Root(NodeId),
    Dir(read::Result<Vec<DirEntry>>),
    Stat(read::Result<Stat>),
    Bytes(read::Result<Vec<u8>>),
    Xattrs(read::Result<Xattrs>),
}

type Job = (Op, mpsc::SyncSender<Ans>);

/// Asks the reader thread; cheap to share between serving threads.
pub struct ReaderHandle {
    tx: Mutex<mpsc::Sender<Job>>,
    fs: &'static str,
}

fn gone() -> ReadError {
    ReadError::Io("the image reader thread is gone".into())
}

impl ReaderHandle {
    /// Start the thread and open the `kind` reader over `src` on it. Fails as the reader's
    /// open fails.
    pub fn start(kind: FsKind, src: Source) -> read::Result<Arc<ReaderHandle>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<read::Result<()>>(1);
        std::thread::Builder::new()
            .name("image-reader".into())
            .spawn(move || {
                let fs = match read::open_reader(kind, src) {
                    Ok(fs) => {
                        let _ = ready_tx.send(Ok(()));
                        fs
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for (op, reply) in rx {
                    let _ = reply.send(answer(&*fs, op));
                }
            })
            .map_err(|e| ReadError::Io(format!("cannot start the image reader thread: {e}")))?;
        ready_rx.recv().map_err(|_| gone())??;
        Ok(Arc::new(ReaderHandle {
            tx: Mutex::new(tx),
            fs: kind.name(),
        }))
    }

    fn ask(&self, op: Op) -> Option<Ans> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((op, reply))
            .ok()?;
        rx.recv().ok()
    }

    /// The file system's name.
    pub fn fs_name(&self) -> &'static str {
        self.fs
    }

    /// The root directory's node.
    pub fn root(&self) -> read::Result<NodeId> {
        match self.ask(Op::Root) {
            Some(Ans::Root(n)) => Ok(n),
            _ => Err(gone()),
        }
    }

    /// [`FsReader::read_dir`].
    pub fn read_dir(&self, node: NodeId) -> read::Result<Vec<DirEntry>> {
        match self.ask(Op::Dir(node)) {
            Some(Ans::Dir(r)) => r,
            _ => Err(gone()),
        }
    }

    /// [`FsReader::stat`].
    pub fn stat(&self, node: NodeId) -> read::Result<Stat> {
        match self.ask(Op::Stat(node)) {
            Some(Ans::Stat(r)) => r,
            _ => Err(gone()),
        }
    }

    /// [`FsReader::readlink`].
    pub fn readlink(&self, node: NodeId) -> read::Result<Vec<u8>> {
        match self.ask(Op::Link(node)) {
            Some(Ans::Bytes(r)) => r,
            _ => Err(gone()),
        }
    }

    /// Up to `len` bytes of file `node` from `offset` (short only at its end).
    pub fn read(&self, node: NodeId, offset: u64, len: usize) -> read::Result<Vec<u8>> {
        match self.ask(Op::Read(node, offset, len)) {
            Some(Ans::Bytes(r)) => r,
            _ => Err(gone()),
        }
    }

    /// [`FsReader::xattrs`].
    pub fn xattrs(&self, node: NodeId) -> read::Result<Xattrs> {
        match self.ask(Op::Xattrs(node)) {
            Some(Ans::Xattrs(r)) => r,
            _ => Err(gone()),
        }
    }
}

fn answer(fs: &dyn FsReader, op: Op) -> Ans {
    match op {
        Op::Root => Ans::Root(fs.root()),
        Op::Dir(n) => Ans::Dir(fs.read_dir(n)),
        Op::Stat(n) => Ans::Stat(fs.stat(n)),
        Op::Link(n) => Ans::Bytes(fs.readlink(n)),
        Op::Xattrs(n) => Ans::Xattrs(fs.xattrs(n)),
        Op::Read(n, offset, len) => {
            // Readers may return less than asked before the end: fill what they can.
            let mut buf = vec![0u8; len];
            let mut done = 0;
            while done < len {
                match fs.read(n, offset + done as u64, &mut buf[done..]) {
                    Ok(0) => break,
                    Ok(k) => done += k,
                    Err(e) => return Ans::Bytes(Err(e)),
                }
            }
            buf.truncate(done);
            Ans::Bytes(Ok(buf))
        }
    }
}
