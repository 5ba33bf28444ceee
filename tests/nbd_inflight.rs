//! Requests in flight on one NBD connection: a device that waits on a network (here a memory
//! device that sleeps in every read and says it blocks on a network) serves N READs of one
//! connection in about one delay, with the right data under the right cookies; a FLUSH is
//! answered after the READs before it; a DISC drains what is in flight; a device error answers
//! its own request only. A local device (the same, saying it does not block on a network) keeps
//! the inline path: one read at a time.

mod common;

use common::nbd::{self, Client};
use dmkit::block::{BlockDevice, BlockError, MemoryDevice, Result};
use dmkit::export::nbd::{NbdConfig, NbdServer};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DELAY: Duration = Duration::from_millis(300);
/// Reads of block 100 fail as a corrupt verity block would.
const BAD_BLOCK: u64 = 100;

/// A read-only memory device whose every read takes [`DELAY`], counting reads at once.
struct Slow {
    inner: MemoryDevice,
    network: bool,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Slow {
    fn new(bytes: Vec<u8>, network: bool) -> Slow {
        Slow {
            inner: MemoryDevice::from_vec("slow", bytes).into_read_only(),
            network,
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        }
    }
}

impl BlockDevice for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn logical_block_size(&self) -> u32 {
        4096
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        std::thread::sleep(DELAY);
        self.now.fetch_sub(1, Ordering::SeqCst);
        if offset / 4096 <= BAD_BLOCK && (offset + buf.len() as u64) / 4096 > BAD_BLOCK {
            return Err(BlockError::Corrupt {
                device: "slow".into(),
                what: "data",
                block: BAD_BLOCK,
            });
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn blocks_on_network(&self) -> bool {
        self.network
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 4096 * 31 + i * 7) as u8).collect()
}

fn serve(dir: &Path, dev: Arc<Slow>) -> (NbdServer, std::path::PathBuf) {
    let sock = dir.join("nbd.sock");
    let cfg = NbdConfig::new(&format!("unix:{}", sock.display()), None, false, 4).unwrap();
    let server = NbdServer::serve_device(cfg, "slow", dev).unwrap();
    (server, sock)
}

/// Send READs of 4 KiB at `blocks` at once; the replies by cookie, and the time taken.
fn reads(c: &mut Client, blocks: &[u64]) -> (HashMap<u64, (u64, nbd::Reply)>, Duration) {
    let t = Instant::now();
    let cookies: Vec<(u64, u64)> = blocks
        .iter()
        .map(|&b| (c.send(nbd::READ, 0, b * 4096, 4096, &[]), b))
        .collect();
    let mut got = HashMap::new();
    for _ in &cookies {
        let r = c.reply().expect("a reply");
        let block = cookies
            .iter()
            .find(|(k, _)| *k == r.cookie)
            .unwrap_or_else(|| panic!("a reply to cookie {} never sent", r.cookie))
            .1;
        assert!(got.insert(r.cookie, (block, r)).is_none(), "two replies");
    }
    (got, t.elapsed())
}

#[test]
fn a_network_device_serves_a_connections_reads_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1 << 20);
    let dev = Arc::new(Slow::new(data.clone(), true));
    let (mut server, sock) = serve(dir.path(), dev.clone());
    let mut c = Client::connect(&sock).unwrap();

    // 8 reads at once, one of them failing: about one delay, not eight.
    let blocks = [3, 250, 7, BAD_BLOCK, 0, 255, 128, 64];
    let (got, took) = reads(&mut c, &blocks);
    assert_eq!(dev.most.load(Ordering::SeqCst), blocks.len());
    assert!(
        took < DELAY * 3,
        "{} reads took {took:?} with {DELAY:?} each",
        blocks.len()
    );
    for (block, r) in got.values() {
        if *block == BAD_BLOCK {
            assert_eq!(r.error, nbd::EIO, "{r:?}");
            assert_eq!(r.message, "data block 100 is corrupted");
        } else {
            let at = (*block * 4096) as usize;
            assert_eq!(r.error, 0, "block {block}: {}", r.message);
            assert!(r.data == data[at..at + 4096], "block {block}: wrong data");
        }
    }

    // A FLUSH is answered after every READ sent before it.
    let before: Vec<u64> = (10..14)
        .map(|b| c.send(nbd::READ, 0, b * 4096, 4096, &[]))
        .collect();
    let flush = c.send(nbd::FLUSH, 0, 0, 0, &[]);
    let order: Vec<u64> = (0..5).map(|_| c.reply().unwrap().cookie).collect();
    assert_eq!(order[4], flush, "{order:?}");
    assert!(before.iter().all(|k| order[..4].contains(k)), "{order:?}");

    // A refused request is answered too, and the connection goes on.
    let (k, r) = (c.send(nbd::READ, 0, 1 << 20, 4096, &[]), c.reply().unwrap());
    assert_eq!((r.cookie, r.error), (k, nbd::EINVAL));

    // DISC: what is in flight is answered, then the server closes the connection.
    let sent: Vec<u64> = (20..24)
        .map(|b| c.send(nbd::READ, 0, b * 4096, 4096, &[]))
        .collect();
    c.send(nbd::DISC, 0, 0, 0, &[]);
    let mut answered: Vec<u64> = (0..4).map(|_| c.reply().unwrap().cookie).collect();
    answered.sort_unstable();
    assert_eq!(answered, sent);
    let mut rest = Vec::new();
    use std::io::Read;
    assert_eq!(c.s.read_to_end(&mut rest).unwrap(), 0, "bytes after DISC");

    server.stop(Duration::from_secs(5));
    let t = server.totals();
    assert_eq!((t.io_errors, t.corruptions), (1, 1));
    assert_eq!(t.bytes_read, 4096 * (7 + 4 + 4));
}

#[test]
fn a_local_device_keeps_the_inline_path() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(256 << 10);
    let dev = Arc::new(Slow::new(data.clone(), false));
    let (mut server, sock) = serve(dir.path(), dev.clone());
    let mut c = Client::connect(&sock).unwrap();
    let blocks = [1, 2, 3];
    let (got, took) = reads(&mut c, &blocks);
    assert_eq!(dev.most.load(Ordering::SeqCst), 1);
    assert!(took >= DELAY * 3, "{took:?}");
    for (block, r) in got.values() {
        let at = (*block * 4096) as usize;
        assert!(
            r.error == 0 && r.data == data[at..at + 4096],
            "block {block}"
        );
    }
    c.disconnect();
    server.stop(Duration::from_secs(5));
}
