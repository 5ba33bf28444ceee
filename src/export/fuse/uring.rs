//! FUSE over io_uring: one ring queue per CPU, each served inline by a thread pinned to that
//! CPU (Documentation/filesystems/fuse/fuse-io-uring.rst).
//!
//! Each queue thread owns an io_uring (128-byte SQEs: the FUSE command lives in the SQE) and
//! `DEPTH` entries, each a header buffer (`fuse_uring_req_header`: in/out header, the opcode's
//! fixed arguments, the entry's commit id and payload size) and a page-aligned payload buffer as
//! large as the largest request. `FUSE_IO_URING_CMD_REGISTER` hands an entry to the kernel;
//! its completion is a request, written into the entry's buffers; the answer goes back in the
//! same buffers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also asks for the next
//! request. No read or write system call per request, and the answers of every request one
//! wake-up brought go back in one `io_uring_enter`.
//!
//! The kernel puts a request on the queue of the CPU its issuer runs on, so the thread pinned to
//! that CPU serves it without a cross-CPU hand-off. It uses the ring only once every possible
//! CPU has a registered queue; until then, and for FORGETs and interrupts always, requests come
//! through `/dev/fuse`.
//!
//! Memory the kernel writes lives as long as any of its commands may: a queue's thread returns
//! (and frees its buffers) only once every entry's command has come back with a final error,
//! which unmounting (the connection's abort) or the end of the process brings.

use super::proto::*;
use super::request::{InHeader, Request};
use super::session::{dispatch, Answer, Call, Filesystem, Reply, Shared};
use super::transport::{possible_cpus, Transport};
use crate::codec::{self, Reader, SliceWriter};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

/// Ring entries per queue: the requests of one CPU its thread takes in one wake-up.
pub(super) const DEPTH: usize = 8;

/// `fuse_uring_req_header`'s parts.
const IN_OUT: usize = 128;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 32;

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// A payload buffer: the largest request, and room for a READ of that size that does not
/// start on a block boundary to be read whole.
const PAYLOAD: usize = MAX_WRITE + 2 * PAGE;

/// `struct fuse_uring_req_header`.
#[repr(C, align(64))]
struct Header {
    /// `fuse_in_header` in, `fuse_out_header` out.
    in_out: [u8; IN_OUT],
    /// The opcode's fixed arguments (`fuse_read_in`, ...).
    op_in: [u8; OP_IN],
    /// `fuse_uring_ent_in_out`: flags, commit id, payload size.
    ent: [u8; ENT_IN_OUT],
}

/// One ring entry. Its buffers are written by the kernel while its command is in flight; they
/// are only touched here between the command's completion and the next command.
struct Entry {
    header: *mut Header,
    payload: *mut u8,
    /// Header and payload, as the kernel reads them at REGISTER.
    iov: [libc::iovec; 2],
    /// The command in flight (or last sent).
    cmd: u32,
    /// The request being answered (`ent.commit_id`).
    commit_id: u64,
}

/// One CPU's queue, owned by the thread pinned to that CPU.
struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Box<[Entry]>,
    /// Entries whose command is with the kernel (or whose request is being served).
    alive: usize,
    /// Completions taken from the ring and not handled yet.
    done: Vec<(u64, i32)>,
    // The memory behind `entries`' pointers; dropped last.
    _headers: Box<[Header]>,
    _payloads: Vec<AlignedBuf>,
}

/// Set `sqe->len`, which the io-uring crate leaves at 0 for `UringCmd80` and FUSE's REGISTER
/// needs (the number of iovecs at `addr`).
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is `repr(C)`, 128 bytes of plain integers (the kernel's
    // `io_uring_sqe` and its 64-byte extension): every byte pattern is valid, and `len` is the
    // u32 at offset 24 of the ABI.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl Queue {
    /// A ring with `depth` entries for queue `qid` of the connection `fd`.
    fn new(fd: RawFd, qid: usize, depth: usize) -> io::Result<Queue> {
        let qid = u16::try_from(qid)
            .map_err(|_| io::Error::other(format!("queue {qid}: too many CPUs")))?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * depth as u32)
            .build(depth as u32)?;
        // A fixed file: no descriptor lookup per command.
        ring.submitter().register_files(&[fd])?;
        let mut headers: Box<[Header]> = (0..depth)
            .map(|_| Header {
                in_out: [0; IN_OUT],
                op_in: [0; OP_IN],
                ent: [0; ENT_IN_OUT],
            })
            .collect();
        let mut payloads: Vec<AlignedBuf> = (0..depth).map(|_| AlignedBuf::new(PAYLOAD)).collect();
        let entries: Box<[Entry]> = headers
            .iter_mut()
            .zip(payloads.iter_mut())
            .map(|(h, p)| {
                let payload = p.all();
                Entry {
                    header: h as *mut Header,
                    payload: payload.as_mut_ptr(),
                    iov: [
                        libc::iovec {
                            iov_base: (h as *mut Header).cast(),
                            iov_len: std::mem::size_of::<Header>(),
                        },
                        libc::iovec {
                            iov_base: payload.as_mut_ptr().cast(),
                            iov_len: payload.len(),
                        },
                    ],
                    cmd: CMD_REGISTER,
                    commit_id: 0,
                }
            })
            .collect();
        Ok(Queue {
            qid,
            ring,
            entries,
            alive: 0,
            done: Vec::with_capacity(2 * depth),
            _headers: headers,
            _payloads: payloads,
        })
    }

    /// Queue command `cmd` for entry `i`.
    fn push(&mut self, i: usize, cmd: u32) {
        let e = &mut self.entries[i];
        e.cmd = cmd;
        let mut req = [0u8; 80];
        // struct fuse_uring_cmd_req: flags, commit_id, qid.
        if cmd == CMD_COMMIT_AND_FETCH {
            req[8..16].copy_from_slice(&e.commit_id.to_ne_bytes());
        }
        req[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let mut op = opcode::UringCmd80::new(types::Fixed(0), cmd).cmd(req);
        if cmd == CMD_REGISTER {
            op = op.addr(Some(e.iov.as_ptr() as u64));
        }
        let mut sqe = op.build().user_data(i as u64);
        if cmd == CMD_REGISTER {
            sqe = with_len(sqe, 2);
        }
        loop {
            // SAFETY: the SQE points at this entry's iovecs and, through them, its buffers;
            // all live in `self` until every command has come back (see the module docs).
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            // Cannot happen (one command per entry, as many SQEs as entries); be safe anyway.
            let _ = self.ring.submit();
        }
    }

    /// Take every completion the ring holds.
    fn reap(&mut self) {
        for c in self.ring.completion() {
            self.done.push((c.user_data(), c.result()));
        }
    }

    /// Hand every entry to the kernel. Registration errors come back at once; requests that
    /// arrive meanwhile are kept for [`Queue::serve`].
    fn register(&mut self) -> Result<(), String> {
        for i in 0..self.entries.len() {
            self.push(i, CMD_REGISTER);
        }
        self.alive = self.entries.len();
        if let Err(e) = self.ring.submit() {
            // Nothing was taken: nothing is in flight.
            self.alive = 0;
            return Err(format!("io_uring_enter: {e}"));
        }
        self.reap();
        let mut first = None;
        let entries = &self.entries;
        let mut dead = 0;
        self.done.retain(|&(i, res)| {
            let failed = res < 0 && entries.get(i as usize).map(|e| e.cmd) == Some(CMD_REGISTER);
            if failed {
                dead += 1;
                first.get_or_insert(res);
            }
            !failed
        });
        self.alive -= dead;
        match first {
            None => Ok(()),
            Some(res) => Err(format!(
                "queue {}: FUSE_IO_URING_CMD_REGISTER: {}",
                self.qid,
                io::Error::from_raw_os_error(-res)
            )),
        }
    }

    /// Serve requests until every entry has come back for good.
    fn serve<F: Filesystem>(&mut self, shared: &Arc<Shared<F>>, ctr: usize) {
        let mut scratch = shared.fs.scratch();
        let mut args: Vec<u8> = Vec::with_capacity(OP_IN + MAX_ARGS);
        let mut logged = 0u32;
        let mut done = Vec::with_capacity(self.done.capacity());
        loop {
            std::mem::swap(&mut done, &mut self.done);
            for (i, res) in done.drain(..) {
                let i = i as usize;
                if i >= self.entries.len() {
                    continue;
                }
                if res >= 0 {
                    self.answer(i, shared, &mut scratch, &mut args, ctr);
                    self.push(i, CMD_COMMIT_AND_FETCH);
                    continue;
                }
                match -res {
                    libc::EINTR | libc::EAGAIN => {
                        let cmd = self.entries[i].cmd;
                        self.push(i, cmd);
                    }
                    // The connection ended (unmount, abort) or the ring is going away.
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                        self.alive -= 1
                    }
                    e if self.entries[i].cmd == CMD_COMMIT_AND_FETCH => {
                        // The kernel no longer waited for that answer (the request was
                        // aborted): the entry is stuck on its side; give it a new one.
                        if logged < 10 {
                            logged += 1;
                            eprintln!(
                                "dmkit: fuse: queue {}: an answer was refused ({}); entry registered again",
                                self.qid,
                                io::Error::from_raw_os_error(e)
                            );
                        }
                        self.push(i, CMD_REGISTER);
                    }
                    e => {
                        eprintln!(
                            "dmkit: fuse: queue {}: an entry failed: {}",
                            self.qid,
                            io::Error::from_raw_os_error(e)
                        );
                        self.alive -= 1;
                    }
                }
            }
            if self.alive == 0 {
                return;
            }
            // Sends every answer queued above and sleeps until the next request.
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // EBUSY: completions to take first; EINTR: a signal.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    eprintln!("dmkit: fuse: queue {}: io_uring_enter: {e}", self.qid);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            self.reap();
        }
    }

    /// Serve the request entry `i` holds and write the answer into its buffers.
    fn answer<F: Filesystem>(
        &mut self,
        i: usize,
        shared: &Arc<Shared<F>>,
        scratch: &mut F::Scratch,
        args: &mut Vec<u8>,
        ctr: usize,
    ) {
        let e = &mut self.entries[i];
        // SAFETY: the entry's command completed: until the next one, the kernel does not touch
        // its buffers, and nothing else refers to them. Both were allocated with these sizes
        // and live as long as `self`.
        let (hdr, payload) = unsafe {
            (
                &mut *e.header,
                std::slice::from_raw_parts_mut(e.payload, PAYLOAD),
            )
        };
        // Both parts are fixed-size arrays longer than what is read from them.
        let h = InHeader::decode(&hdr.in_out).expect("the in/out part holds an in-header");
        let (commit_id, size) = ent_in(&hdr.ent).expect("the entry part holds its fields");
        let unique = h.unique;
        e.commit_id = commit_id;
        let size = (size as usize).min(PAYLOAD);
        // The in-header's length counts the fixed arguments and the payload.
        let op_len = (h.len as usize).saturating_sub(IN_HEADER + size).min(OP_IN);
        let counters = &shared.counters[ctr.min(shared.counters.len() - 1)];
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let answer = if h.opcode == FUSE_WRITE {
            let req = Call {
                nodeid: h.nodeid,
                op: Request::decode(h.opcode, &hdr.op_in[..op_len], &payload[..size]),
                counters,
            };
            dispatch(shared, &req, scratch, Reply::ring(unique, None))
        } else {
            // Names and other variable arguments follow the fixed ones in the payload.
            args.clear();
            args.extend_from_slice(&hdr.op_in[..op_len]);
            args.extend_from_slice(&payload[..size.min(MAX_ARGS)]);
            let req = Call {
                nodeid: h.nodeid,
                op: Request::decode(h.opcode, args, &[]),
                counters,
            };
            dispatch(shared, &req, scratch, Reply::ring(unique, Some(payload)))
        };
        // Requests that expect no answer do not come through the ring.
        let a = answer.unwrap_or(Answer {
            error: libc::ENOSYS,
            len: 0,
            staged: None,
        });
        let n = if a.error == 0 { a.len } else { 0 };
        if let Some(st) = a.staged {
            payload[..n].copy_from_slice(&st[..n]);
        }
        // fuse_out_header, and the payload size in the entry part.
        let out = |hdr: &mut Header| -> Result<(), codec::Error> {
            SliceWriter::new(&mut hdr.in_out)
                .u32_ne((OUT_HEADER + n) as u32)?
                .u32_ne(-a.error as u32)?
                .u64_ne(unique)?;
            SliceWriter::new(&mut hdr.ent)
                .seek(16, "payload_sz")?
                .u32_ne(n as u32)?;
            Ok(())
        };
        out(hdr).expect("the header parts hold the answer's fields");
    }
}

/// `fuse_uring_ent_in_out`: flags, commit id, payload size; the commit id and the size.
fn ent_in(ent: &[u8]) -> Result<(u64, u32), codec::Error> {
    let mut r = Reader::new(ent);
    r.skip(8, "flags")?;
    Ok((r.u64_ne("commit_id")?, r.u32_ne("payload_sz")?))
}

/// Pin the calling thread to `cpu`.
fn pin(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks `cpu`; sched_setaffinity reads
    // the set for the duration of the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Open once, by the INIT handler: go (register and serve) or stop.
struct Gate {
    go: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Gate {
    fn open(&self, go: bool) {
        let mut g = self.go.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(go);
            self.cv.notify_all();
        }
    }

    fn wait(&self) -> bool {
        let mut g = self.go.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(go) = *g {
                return go;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What a queue thread tells the INIT handler.
enum Report {
    /// Its ring and buffers are ready (or why not).
    Ready(usize, Result<(), String>),
    /// Its entries are registered with the kernel (or why not).
    Registered(Result<(), String>),
}

/// Queue threads with their rings set up, waiting for INIT's answer before they register.
pub(super) struct Prepared {
    queues: usize,
    gate: Arc<Gate>,
    reports: mpsc::Receiver<Report>,
}

/// Start one thread per possible CPU, each pinned to its CPU with its ring set up; returns
/// once all are ready, or the first failure (the threads then end).
pub(super) fn prepare<F: Filesystem>(shared: &Arc<Shared<F>>) -> Result<Prepared, String> {
    let queues = possible_cpus().map_err(|e| e.to_string())?;
    let gate = Arc::new(Gate {
        go: Mutex::new(None),
        cv: Condvar::new(),
    });
    let (tx, rx) = mpsc::channel();
    let prepared = Prepared {
        queues,
        gate: gate.clone(),
        reports: rx,
    };
    for q in 0..queues {
        let (sh, g, tx) = (shared.clone(), gate.clone(), tx.clone());
        shared.thread_starting();
        let spawned = std::thread::Builder::new()
            .name(format!("fuse-ring-{q}"))
            .spawn(move || queue_thread(sh, q, g, tx));
        match spawned {
            Ok(h) => shared
                .ring_threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(h),
            Err(e) => {
                shared.thread_done();
                // Dropping `prepared` stops the threads already started.
                return Err(format!("cannot start a ring thread: {e}"));
            }
        }
    }
    drop(tx);
    let mut first = None;
    for _ in 0..queues {
        match prepared.reports.recv() {
            Ok(Report::Ready(q, Err(e))) => {
                first.get_or_insert(format!("queue {q}: {e}"));
            }
            Ok(_) => {}
            Err(_) => {
                first.get_or_insert("a ring thread ended early".to_string());
                break;
            }
        }
    }
    match first {
        None => Ok(prepared),
        Some(e) => Err(e),
    }
}

impl Prepared {
    /// Let the queues register (the kernel has processed INIT's answer); returns the transport
    /// once every queue has, or the first failure (the kernel then falls back to `/dev/fuse`).
    pub fn register(self) -> Result<Transport, String> {
        self.gate.open(true);
        let mut first = None;
        for _ in 0..self.queues {
            match self.reports.recv() {
                Ok(Report::Registered(Err(e))) => {
                    first.get_or_insert(e);
                }
                Ok(_) => {}
                Err(_) => {
                    first.get_or_insert("a ring thread ended early".to_string());
                    break;
                }
            }
        }
        match first {
            None => Ok(Transport::IoUring {
                queues: self.queues,
                depth: DEPTH,
            }),
            Some(e) => Err(e),
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // Not registered: the threads end without having sent anything.
        self.gate.open(false);
    }
}

/// One queue's thread: pin, set up, wait for the gate, register, serve.
fn queue_thread<F: Filesystem>(
    shared: Arc<Shared<F>>,
    q: usize,
    gate: Arc<Gate>,
    tx: mpsc::Sender<Report>,
) {
    // Not fatal: the queue then still serves its CPU's requests, from elsewhere.
    if let Err(e) = pin(q) {
        eprintln!("dmkit: fuse: queue {q}: cannot pin to CPU {q}: {e}");
    }
    let mut queue = match Queue::new(shared.master.as_raw_fd(), q, DEPTH) {
        Ok(queue) => {
            let _ = tx.send(Report::Ready(q, Ok(())));
            queue
        }
        Err(e) => {
            let _ = tx.send(Report::Ready(q, Err(format!("io_uring setup: {e}"))));
            return shared.thread_done();
        }
    };
    if gate.wait() {
        let _ = tx.send(Report::Registered(queue.register()));
        drop(tx);
        let ctr = shared.threads() + q;
        queue.serve(&shared, ctr);
    }
    drop(queue);
    shared.thread_done();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_command_layout() {
        let iov = 0x1234_5678_9abc_def0u64;
        let mut req = [0u8; 80];
        req[16..18].copy_from_slice(&7u16.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fixed(0), CMD_REGISTER)
            .cmd(req)
            .addr(Some(iov))
            .build()
            .user_data(3);
        let sqe = with_len(sqe, 2);
        // SAFETY: as in `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        // The kernel's io_uring_sqe: opcode 46 (URING_CMD), fixed file, addr at 16, len at 24,
        // user_data at 32, cmd_op at 8, the 80-byte command from 48.
        assert_eq!(raw[0], 46);
        assert_ne!(raw[1] & 1, 0, "IOSQE_FIXED_FILE");
        assert_eq!(u32::from_ne_bytes(raw[8..12].try_into().unwrap()), 1);
        assert_eq!(u64::from_ne_bytes(raw[16..24].try_into().unwrap()), iov);
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        assert_eq!(u64::from_ne_bytes(raw[32..40].try_into().unwrap()), 3);
        assert_eq!(&raw[48 + 16..48 + 18], &7u16.to_ne_bytes());
        assert_eq!(std::mem::size_of::<Header>(), 320);
        assert!(std::mem::size_of::<Header>() >= IN_OUT + OP_IN + ENT_IN_OUT);
    }
}
