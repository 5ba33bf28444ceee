//! A minimal NBD client for tests that must send what real clients never do: garbage, lies
//! about lengths, requests cut short, connections held open. It speaks fixed newstyle with
//! `NBD_OPT_STRUCTURED_REPLY` and `NBD_OPT_GO` over a Unix socket.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE: u32 = 0x6744_6698;
const STRUCTURED: u32 = 0x668e_33ef;

/// Command: read.
pub const READ: u16 = 0;
/// Command: write.
pub const WRITE: u16 = 1;
/// Command: disconnect.
pub const DISC: u16 = 2;
/// Command: flush.
pub const FLUSH: u16 = 3;
/// Command flag: FUA.
pub const FUA: u16 = 1;
/// NBD errors.
pub const EPERM: u32 = 1;
/// I/O error.
pub const EIO: u32 = 5;
/// Invalid argument.
pub const EINVAL: u32 = 22;
/// Too large.
pub const EOVERFLOW: u32 = 75;

/// A connected client in the transmission phase.
pub struct Client {
    /// The socket.
    pub s: UnixStream,
    /// The export's size.
    pub size: u64,
    /// The transmission flags.
    pub flags: u16,
    next: u64,
}

/// A reply: the error (0 on success) and, for reads, the data.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    /// The cookie.
    pub cookie: u64,
    /// NBD error number.
    pub error: u32,
    /// Data of a successful read.
    pub data: Vec<u8>,
    /// The message of an error chunk.
    pub message: String,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

fn read_n(s: &mut UnixStream, n: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// A raw connection with a 10 s timeout on both directions.
pub fn raw(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

impl Client {
    /// Connect, negotiate structured replies and enter transmission with `NBD_OPT_GO`.
    pub fn connect(socket: &Path) -> io::Result<Client> {
        let mut s = raw(socket);
        let greeting = read_n(&mut s, 18)?;
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        s.write_all(&3u32.to_be_bytes())?;
        let opt = |s: &mut UnixStream, code: u32, data: &[u8]| -> io::Result<()> {
            let mut m = IHAVEOPT.to_be_bytes().to_vec();
            m.extend_from_slice(&code.to_be_bytes());
            m.extend_from_slice(&(data.len() as u32).to_be_bytes());
            m.extend_from_slice(data);
            s.write_all(&m)
        };
        let reply = |s: &mut UnixStream| -> io::Result<(u32, Vec<u8>)> {
            let h = read_n(s, 20)?;
            let data = read_n(s, u32_at(&h, 16) as usize)?;
            Ok((u32_at(&h, 12), data))
        };
        opt(&mut s, 8, &[])?;
        assert_eq!(reply(&mut s)?.0, 1, "STRUCTURED_REPLY not acknowledged");
        opt(&mut s, 7, &[0, 0, 0, 0, 0, 0])?;
        let (mut size, mut flags) = (0, 0);
        loop {
            let (kind, data) = reply(&mut s)?;
            match kind {
                1 => break,
                3 if data[..2] == [0, 0] => {
                    size = u64_at(&data, 2);
                    flags = u16::from_be_bytes([data[10], data[11]]);
                }
                3 => {}
                e => {
                    return Err(io::Error::other(format!(
                        "GO refused ({e:#x}): {}",
                        String::from_utf8_lossy(&data)
                    )))
                }
            }
        }
        Ok(Client {
            s,
            size,
            flags,
            next: 1,
        })
    }

    /// Send a request (with `payload` after it, which may be shorter than `len` says);
    /// returns its cookie.
    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> u64 {
        let cookie = self.next;
        self.next += 1;
        let mut m = REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(payload);
        self.s.write_all(&m).expect("send a request");
        cookie
    }

    /// Read one whole reply (every chunk of a structured one).
    pub fn reply(&mut self) -> io::Result<Reply> {
        let mut r = Reply {
            cookie: 0,
            error: 0,
            data: Vec::new(),
            message: String::new(),
        };
        loop {
            let h = read_n(&mut self.s, 4)?;
            match u32_at(&h, 0) {
                SIMPLE => {
                    let rest = read_n(&mut self.s, 12)?;
                    r.error = u32_at(&rest, 0);
                    r.cookie = u64_at(&rest, 4);
                    return Ok(r);
                }
                STRUCTURED => {
                    let rest = read_n(&mut self.s, 16)?;
                    let flags = u16::from_be_bytes([rest[0], rest[1]]);
                    let kind = u16::from_be_bytes([rest[2], rest[3]]);
                    r.cookie = u64_at(&rest, 4);
                    let p = read_n(&mut self.s, u32_at(&rest, 12) as usize)?;
                    match kind {
                        1 => r.data.extend_from_slice(&p[8..]),
                        0 => {}
                        k if k & 0x8000 != 0 => {
                            r.error = u32_at(&p, 0);
                            let n = u16::from_be_bytes([p[4], p[5]]) as usize;
                            r.message = String::from_utf8_lossy(&p[6..6 + n]).into_owned();
                        }
                        k => panic!("unexpected chunk type {k}"),
                    }
                    if flags & 1 != 0 {
                        return Ok(r);
                    }
                }
                m => panic!("reply magic {m:#x}"),
            }
        }
    }

    /// Read `len` bytes at `offset`: the data, or the NBD error and its message.
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, (u32, String)> {
        let c = self.send(READ, 0, offset, len, &[]);
        let r = self.reply().expect("a reply");
        assert_eq!(r.cookie, c);
        if r.error == 0 {
            Ok(r.data)
        } else {
            Err((r.error, r.message))
        }
    }

    /// Write `data` at `offset` (FUA when asked); the NBD error on failure.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), u32> {
        let c = self.send(
            WRITE,
            if fua { FUA } else { 0 },
            offset,
            data.len() as u32,
            data,
        );
        self.done(c)
    }

    /// Flush; the NBD error on failure.
    pub fn flush(&mut self) -> Result<(), u32> {
        let c = self.send(FLUSH, 0, 0, 0, &[]);
        self.done(c)
    }

    fn done(&mut self, cookie: u64) -> Result<(), u32> {
        let r = self.reply().expect("a reply");
        assert_eq!(r.cookie, cookie);
        if r.error == 0 {
            Ok(())
        } else {
            Err(r.error)
        }
    }

    /// Leave cleanly.
    pub fn disconnect(mut self) {
        self.send(DISC, 0, 0, 0, &[]);
    }
}
