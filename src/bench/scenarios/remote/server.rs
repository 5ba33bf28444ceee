//! The benchmark's HTTP server: files served by byte range on 127.0.0.1, every request held
//! for a fixed delay before it is answered, standing in for the round trip to object storage.
//!
//! HTTP/1.1 with kept-alive connections, one thread per connection (so each client gets the
//! parallelism of its own connections, as from a real store), `HEAD` (length, a strong ETag,
//! `Accept-Ranges: bytes`, which QEMU's curl driver insists on), `GET` of one range (`206` with
//! `Content-Range`) or of the whole file, `If-Match` (`412` on a mismatch). Nothing else: it
//! serves the benchmark's own clients. The files are read with `pread` (they are in RAM), and
//! the server counts requests and body bytes, so the table can say what each client asked for.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Requests and body bytes served so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests answered (any status).
    pub requests: AtomicU64,
    /// Body bytes sent.
    pub bytes: AtomicU64,
}

struct Shared {
    files: HashMap<String, (File, u64, String)>,
    delay: Mutex<Duration>,
    stop: AtomicBool,
    counters: Counters,
    conns: Mutex<Vec<TcpStream>>,
}

/// A running server; stopped (connections shut, threads joined) on drop.
pub struct RangeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl RangeServer {
    /// Serves each `(url path, file)` (paths like `/data.img`) on a free port of 127.0.0.1.
    pub fn start(files: &[(String, PathBuf)], delay: Duration) -> std::io::Result<RangeServer> {
        let mut map = HashMap::new();
        for (path, file) in files {
            let f = File::open(file)?;
            let meta = f.metadata()?;
            // Strong ETag from what identifies this content for the run: inode, length, mtime.
            use std::os::unix::fs::MetadataExt;
            let etag = format!(
                "\"{:x}-{:x}-{:x}\"",
                meta.ino(),
                meta.len(),
                meta.mtime_nsec()
            );
            map.insert(path.clone(), (f, meta.len(), etag));
        }
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            files: map,
            delay: Mutex::new(delay),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            conns: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("bench-http".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(RangeServer {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the delay added to each request from now on.
    pub fn set_delay(&self, delay: Duration) {
        *self.shared.delay.lock().unwrap_or_else(|e| e.into_inner()) = delay;
    }

    /// Requests and body bytes served so far.
    pub fn counters(&self) -> (u64, u64) {
        let c = &self.shared.counters;
        (
            c.requests.load(Ordering::Relaxed),
            c.bytes.load(Ordering::Relaxed),
        )
    }
}

impl Drop for RangeServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        for c in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        if let Ok(c) = conn.try_clone() {
            shared
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(c);
        }
        let s = shared.clone();
        let _ = std::thread::Builder::new()
            .name("bench-http-conn".into())
            .spawn(move || {
                let _ = serve(conn, &s);
            });
    }
}

/// One parsed request.
struct Request {
    method: String,
    path: String,
    range: Option<String>,
    if_match: Option<String>,
    close: bool,
}

fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();
    let http10 = parts.next() == Some("HTTP/1.0");
    let mut req = Request {
        method,
        path,
        range: None,
        if_match: None,
        close: http10,
    };
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            return Ok(Some(req));
        }
        if let Some((k, v)) = h.split_once(':') {
            let v = v.trim().to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => req.range = Some(v),
                "if-match" => req.if_match = Some(v),
                "connection" => req.close = v.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
    }
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` of a `len`-byte file as `(start, end exclusive)`;
/// `None` when unsatisfiable.
fn parse_range(spec: &str, len: u64) -> Option<(u64, u64)> {
    let spec = spec.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        (len.saturating_sub(n), len)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            len
        } else {
            b.parse::<u64>().ok()?.saturating_add(1).min(len)
        };
        (start, end)
    };
    (start < end).then_some((start, end))
}

fn serve(conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    let mut buf = vec![0u8; 1 << 20];
    while let Some(req) = read_request(&mut reader)? {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let delay = *shared.delay.lock().unwrap_or_else(|e| e.into_inner());
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        let keep_alive = answer(&req, &mut out, &mut buf, shared)?;
        if req.close || !keep_alive {
            break;
        }
    }
    // Closed now, not when the server stops: the stop list holds a clone of the socket.
    let _ = out.shutdown(Shutdown::Both);
    Ok(())
}

/// Answers one request; `false` when the connection must close.
fn answer(
    req: &Request,
    out: &mut TcpStream,
    buf: &mut [u8],
    shared: &Shared,
) -> std::io::Result<bool> {
    let keep = if req.close { "close" } else { "keep-alive" };
    let empty = |out: &mut TcpStream, status: &str, extra: &str| {
        write!(
            out,
            "HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: {keep}\r\n\r\n"
        )
    };
    let Some((file, len, etag)) = shared.files.get(&req.path) else {
        empty(out, "404 Not Found", "")?;
        return Ok(true);
    };
    let head = req.method == "HEAD";
    if !head && req.method != "GET" {
        empty(out, "405 Method Not Allowed", "")?;
        return Ok(false);
    }
    if req.if_match.as_ref().is_some_and(|m| m != "*" && m != etag) {
        empty(out, "412 Precondition Failed", "")?;
        return Ok(true);
    }
    let (status, start, end) = match req.range.as_deref().filter(|_| !head) {
        None => ("200 OK", 0, *len),
        Some(spec) => match parse_range(spec, *len) {
            Some((s, e)) => ("206 Partial Content", s, e),
            None => {
                empty(
                    out,
                    "416 Range Not Satisfiable",
                    &format!("Content-Range: bytes */{len}\r\n"),
                )?;
                return Ok(true);
            }
        },
    };
    let mut head_text = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\nETag: {etag}\r\n\
         Content-Type: application/octet-stream\r\nConnection: {keep}\r\n",
        end - start
    );
    if status.starts_with("206") {
        head_text.push_str(&format!(
            "Content-Range: bytes {start}-{}/{len}\r\n",
            end - 1
        ));
    }
    head_text.push_str("\r\n");
    out.write_all(head_text.as_bytes())?;
    if !head {
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], at)?;
            out.write_all(&buf[..n])?;
            at += n as u64;
        }
        shared
            .counters
            .bytes
            .fetch_add(end - start, Ordering::Relaxed);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-99", 1000), Some((0, 100)));
        assert_eq!(parse_range("bytes=900-", 1000), Some((900, 1000)));
        assert_eq!(parse_range("bytes=-10", 1000), Some((990, 1000)));
        assert_eq!(parse_range("bytes=990-5000", 1000), Some((990, 1000)));
        assert_eq!(parse_range("bytes=1000-", 1000), None);
        assert_eq!(parse_range("items=0-1", 1000), None);
    }

    #[test]
    fn serves_head_ranges_and_if_match_with_the_delay() {
        let dir = std::env::temp_dir().join(format!("dmkit-rangesrv-{}", std::process::id()));
        std::fs::write(&dir, (0..=255u8).cycle().take(10000).collect::<Vec<u8>>()).unwrap();
        let srv = RangeServer::start(&[("/x.img".into(), dir.clone())], Duration::from_millis(20))
            .unwrap();
        let mut c = TcpStream::connect(srv.addr).unwrap();
        let t = std::time::Instant::now();
        c.write_all(b"HEAD /x.img HTTP/1.1\r\nHost: h\r\n\r\nGET /x.img HTTP/1.1\r\nRange: bytes=256-259\r\nHost: h\r\n\r\nGET /x.img HTTP/1.1\r\nIf-Match: \"nope\"\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = Vec::new();
        c.read_to_end(&mut text).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(60));
        let text = String::from_utf8_lossy(&text);
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "Content-Range: bytes 256-259/10000\r\n\r\n\u{0}\u{1}\u{2}\u{3}HTTP/1.1 412"
            ),
            "{text}"
        );
        assert_eq!(srv.counters(), (3, 4));
        drop(srv);
        std::fs::remove_file(&dir).unwrap();
    }
}
