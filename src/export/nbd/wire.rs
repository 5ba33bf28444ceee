//! The byte stream to one client, buffered both ways so that a client with many requests in
//! flight costs few system calls: one `recv` brings in every request header already sent, and
//! the replies to them go out together, in one `send`, when the server runs out of buffered
//! requests (it never waits for input with replies unsent). Large read replies go out directly
//! from the buffer the data was read into (`sendmsg` of header and data, no copy).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Bytes of client input read ahead.
const IN_BUFFER: usize = 256 << 10;
/// Replies queued before they are sent even though more requests are buffered.
const OUT_FLUSH: usize = 256 << 10;
/// Replies at most this large are queued (copied); larger ones are sent in place.
const QUEUE_MAX: usize = 64 << 10;

/// A byte stream to a client: a socket, or TLS over one.
pub trait Stream: Read + Write + Send {
    /// Write every byte of `parts`, in order (by default one part after the other).
    fn write_parts(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        for p in parts {
            self.write_all(p)?;
        }
        Ok(())
    }

    /// End the session cleanly where the stream has a way to (TLS: `close_notify`).
    fn close(&mut self) {}

    /// Whether [`Stream::send_file`] works on this stream (a plain socket: yes; TLS: no, the
    /// bytes must be encrypted in userspace).
    fn can_send_file(&self) -> bool {
        false
    }

    /// Send `len` bytes of `file` from `offset` without reading them into userspace
    /// (`sendfile(2)`: the page cache straight to the socket).
    fn send_file(&mut self, file: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<()> {
        let _ = (file, offset, len);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    /// A second handle that writes to the same connection, so that replies can be sent from
    /// other threads while this one waits for requests (a plain socket: a duplicate of its
    /// descriptor). `None`, the default, where the stream cannot be split (TLS keeps one
    /// session state for both directions; the in-memory test stream).
    fn try_clone_writer(&self) -> Option<Socket> {
        None
    }
}

/// A connected socket (TCP or Unix), read with `recv` and written with `sendmsg` and
/// `MSG_NOSIGNAL`: a client that went away is an error, never a SIGPIPE.
#[derive(Debug)]
pub struct Socket(pub OwnedFd);

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: recv(2) into a buffer we own, for at most its length.
            let n = unsafe { libc::recv(self.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send_iov(&[buf])
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Socket {
    /// One `sendmsg` of as much of `parts` as the socket takes; returns the bytes sent.
    fn send_iov(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
        let mut iov: Vec<libc::iovec> = parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        if iov.is_empty() {
            return Ok(0);
        }
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        loop {
            // SAFETY: the iovecs point into buffers that outlive the call; the kernel only
            // reads them.
            let n = unsafe { libc::sendmsg(self.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Stream for Socket {
    fn can_send_file(&self) -> bool {
        true
    }

    fn try_clone_writer(&self) -> Option<Socket> {
        self.0.try_clone().ok().map(Socket)
    }

    fn send_file(&mut self, file: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<()> {
        let mut off = offset as libc::off_t;
        let mut left = len;
        while left > 0 {
            // SAFETY: sendfile(2) between two descriptors we hold, with a valid offset pointer.
            let n = unsafe { libc::sendfile(self.as_raw_fd(), file.as_raw_fd(), &mut off, left) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ended before the reply did",
                ));
            }
            left -= n as usize;
        }
        Ok(())
    }

    fn write_parts(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut sent = self.send_iov(parts)?;
        if sent == total {
            return Ok(());
        }
        // A short send (a full socket buffer): the rest, part by part.
        for p in parts {
            if sent >= p.len() {
                sent -= p.len();
                continue;
            }
            self.write_all(&p[sent..])?;
            sent = 0;
        }
        Ok(())
    }
}

/// A client connection's buffered stream; see the module documentation.
pub struct Wire<S> {
    stream: S,
    input: Box<[u8]>,
    pos: usize,
    end: usize,
    out: Vec<u8>,
}

impl<S: Stream> Wire<S> {
    /// Buffer `stream`.
    pub fn new(stream: S) -> Wire<S> {
        Wire {
            stream,
            input: vec![0u8; IN_BUFFER].into_boxed_slice(),
            pos: 0,
            end: 0,
            out: Vec::new(),
        }
    }

    /// The stream, to change its options (timeouts).
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// The stream, mutably.
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The stream, with nothing buffered either way (for STARTTLS: TLS takes over the
    /// socket); `None` when the client sent bytes it should not have yet.
    pub fn into_stream(mut self) -> io::Result<Option<S>> {
        self.flush()?;
        Ok((self.pos == self.end).then_some(self.stream))
    }

    /// Whether client bytes are buffered (the next read will not wait).
    pub fn has_input(&self) -> bool {
        self.pos < self.end
    }

    /// Fill the empty input buffer with one read; `false` at the end of the stream. Replies
    /// still queued are sent first: the client may be waiting for them before it sends more.
    fn fill(&mut self) -> io::Result<bool> {
        self.flush()?;
        self.pos = 0;
        self.end = 0;
        let n = loop {
            match self.stream.read(&mut self.input) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        self.end = n;
        Ok(n > 0)
    }

    /// Read exactly `buf.len()` bytes; the end of the stream is `UnexpectedEof`.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            if self.pos == self.end {
                let rest = buf.len() - done;
                if rest >= IN_BUFFER / 2 {
                    // A large payload goes straight to its buffer.
                    self.flush()?;
                    let n = self.stream.read(&mut buf[done..])?;
                    if n == 0 {
                        return Err(eof());
                    }
                    done += n;
                    continue;
                }
                if !self.fill()? {
                    return Err(eof());
                }
            }
            let n = (self.end - self.pos).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&self.input[self.pos..self.pos + n]);
            self.pos += n;
            done += n;
        }
        Ok(())
    }

    /// Read a message header of `buf.len()` bytes; `Ok(false)` when the stream ends cleanly
    /// before its first byte (the client hung up between messages).
    pub fn read_header(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        if self.pos == self.end && !self.fill()? {
            return Ok(false);
        }
        self.read_exact(buf).map(|()| true)
    }

    /// Read and drop `n` bytes (the payload of a refused write).
    pub fn skip(&mut self, mut n: u64) -> io::Result<()> {
        while n > 0 {
            if self.pos == self.end && !self.fill()? {
                return Err(eof());
            }
            let k = ((self.end - self.pos) as u64).min(n);
            self.pos += k as usize;
            n -= k;
        }
        Ok(())
    }

    /// Send `parts` as one message: queued when small (sent with the next batch, or before
    /// the next wait for input), sent at once from where they are when large.
    pub fn send(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total <= QUEUE_MAX {
            for p in parts {
                self.out.extend_from_slice(p);
            }
            if self.out.len() >= OUT_FLUSH {
                self.flush()?;
            }
            return Ok(());
        }
        self.flush()?;
        self.stream.write_parts(parts)?;
        self.stream.flush()
    }

    /// Whether [`Wire::send_file`] works here.
    pub fn can_send_file(&self) -> bool {
        self.stream.can_send_file()
    }

    /// Send `header` then `len` bytes of `file` from `offset` (see [`Stream::send_file`]),
    /// after what is queued. A failure after the header leaves the stream mid-reply: the
    /// connection must end.
    pub fn send_file(
        &mut self,
        header: &[&[u8]],
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> io::Result<()> {
        for p in header {
            self.out.extend_from_slice(p);
        }
        self.flush()?;
        self.stream.send_file(file, offset, len)
    }

    /// Send what is queued and end the session (see [`Stream::close`]).
    pub fn close(&mut self) {
        let _ = self.flush();
        self.stream.close();
    }

    /// Send whatever is queued.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            let out = std::mem::take(&mut self.out);
            let r = self.stream.write_parts(&[&out]);
            self.out = out;
            self.out.clear();
            r?;
        }
        self.stream.flush()
    }
}

fn eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the client closed the connection",
    )
}

/// An in-memory client for tests and fuzzing: reads come from `input`, writes go to
/// `output`.
#[derive(Debug, Default)]
pub struct MemoryStream {
    /// What the client sends.
    pub input: io::Cursor<Vec<u8>>,
    /// What the server sent.
    pub output: Vec<u8>,
}

impl MemoryStream {
    /// A client that sends `input` and then hangs up.
    pub fn new(input: Vec<u8>) -> MemoryStream {
        MemoryStream {
            input: io::Cursor::new(input),
            output: Vec::new(),
        }
    }
}

impl Read for MemoryStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for MemoryStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for MemoryStream {}

impl<S: Read + Write + Send> Stream for openssl::ssl::SslStream<S> {
    fn close(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_refills_and_skips() {
        let data: Vec<u8> = (0..(IN_BUFFER * 2 + 100)).map(|i| i as u8).collect();
        let mut w = Wire::new(MemoryStream::new(data.clone()));
        let mut a = [0u8; 10];
        assert!(w.read_header(&mut a).unwrap());
        assert_eq!(&a[..], &data[..10]);
        let mut big = vec![0u8; IN_BUFFER];
        w.read_exact(&mut big).unwrap();
        assert_eq!(&big[..], &data[10..10 + IN_BUFFER]);
        w.skip(IN_BUFFER as u64).unwrap();
        let mut rest = [0u8; 90];
        w.read_exact(&mut rest).unwrap();
        assert_eq!(&rest[..], &data[10 + 2 * IN_BUFFER..]);
        assert!(!w.read_header(&mut a).unwrap());
        assert!(w.skip(1).is_err());
    }

    #[test]
    fn small_replies_wait_for_the_next_read_large_ones_go_at_once() {
        let mut w = Wire::new(MemoryStream::new(vec![1, 2, 3]));
        w.send(&[b"ab", b"cd"]).unwrap();
        assert!(w.stream().output.is_empty());
        let mut b = [0u8; 1];
        w.read_exact(&mut b).unwrap();
        assert_eq!(w.stream().output, b"abcd");
        // Bytes 2 and 3 are buffered: the next reply waits.
        w.send(&[b"e"]).unwrap();
        assert_eq!(w.stream().output, b"abcd");
        let big = vec![7u8; QUEUE_MAX + 1];
        w.send(&[b"f", &big]).unwrap();
        assert_eq!(w.stream().output.len(), 4 + 1 + 1 + big.len());
        assert!(w.has_input());
        assert!(w.into_stream().unwrap().is_none());
    }
}
