//! A small scripted HTTP/1.1 server on 127.0.0.1 for the transport's fault tests: it serves one
//! object honestly (HEAD, ranged GET, `If-Match` → 412, keep-alive) unless the test's script
//! says to misbehave for a request: a 200 instead of a 206, a short body, a 416, a wrong
//! Content-Range, an error status, a connection cut mid-body or closed, a stall.
//!
//! One thread accepts, one thread serves each connection; every request is logged for the
//! test to inspect. Dropping the server stops accepting; a connection's thread ends when its
//! client goes away, after a stall, or after 10 s of silence.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One request as the server read it.
#[derive(Clone, Debug)]
pub struct Request {
    /// `HEAD` or `GET`.
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The `Range: bytes=FIRST-LAST` asked for.
    pub range: Option<(u64, u64)>,
    /// How many GETs came before this request.
    pub gets: usize,
}

impl Request {
    /// A header's value (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is a GET of a range.
    pub fn is_range_get(&self) -> bool {
        self.method == "GET" && self.range.is_some()
    }
}

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Serve honestly: HEAD 200, GET 206 of the range, 412 when `If-Match` differs.
    Serve,
    /// Serve the range but ignore `If-Match` (a server without preconditions).
    ServeIgnoringIfMatch,
    /// A 200 with the whole object to a range request.
    Whole,
    /// A 206 whose Content-Range names the range asked for, with one byte less of body (and
    /// a Content-Length saying so).
    ShortBody,
    /// A 206 with the full Content-Length whose body stops halfway: the connection is closed.
    CutBody,
    /// A 206 whose Content-Range (and body) starts one byte later than asked.
    ShiftedRange,
    /// `416 Range Not Satisfiable` with `Content-Range: bytes */LEN`.
    NotSatisfiable,
    /// This status with a small body (S3-style XML when `xml` holds a code and message).
    Status(u16, Option<(String, String)>),
    /// Read the request, answer nothing for this long, then close.
    Stall(Duration),
    /// Close the connection without an answer.
    Close,
}

/// The object being served and its ETag.
struct Object {
    data: Vec<u8>,
    etag: String,
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

/// A running scripted server.
pub struct FaultServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    object: Arc<Mutex<Object>>,
    log: Arc<Mutex<Vec<Request>>>,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl FaultServer {
    /// Serves `data` (ETag `"v1"`), asking `script` what to do with each request.
    pub fn start(
        data: Vec<u8>,
        script: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let object = Arc::new(Mutex::new(Object {
            data,
            etag: "\"v1\"".to_string(),
        }));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let gets = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (o, l, st, acc) = (object.clone(), log.clone(), stop.clone(), accepted.clone());
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                acc.fetch_add(1, Ordering::SeqCst);
                let (o, l, sc, g) = (o.clone(), l.clone(), script.clone(), gets.clone());
                std::thread::spawn(move || serve(conn, &o, &l, &*sc, &g));
            }
        });
        Self {
            port,
            object,
            log,
            accepted,
            stop,
            accept: Some(accept),
        }
    }

    /// `http://127.0.0.1:PORT/object`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/object", self.port)
    }

    /// Replaces the object's ETag (the object "changed"; its bytes stay).
    pub fn set_etag(&self, etag: &str) {
        self.object.lock().unwrap().etag = etag.to_string();
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// A request's method, target and headers.
type Head = (String, String, Vec<(String, String)>);

/// Reads one request's head; `None` when the client closed or went silent.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Head> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Some((method, target, headers))
}

fn parse_range(v: &str) -> Option<(u64, u64)> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Serves the requests of one connection until it closes or a reply closes it.
fn serve(
    conn: TcpStream,
    object: &Mutex<Object>,
    log: &Mutex<Vec<Request>>,
    script: &Script,
    gets: &AtomicUsize,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    // Head and body go out in two writes: without this, Nagle holds the body until the client
    // acknowledges the head, which it delays (40 ms a request).
    let _ = conn.set_nodelay(true);
    let mut out = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    while let Some((method, target, headers)) = read_request(&mut reader) {
        let range = headers
            .iter()
            .find(|(k, _)| k == "range")
            .and_then(|(_, v)| parse_range(v));
        let n = if method == "GET" {
            gets.fetch_add(1, Ordering::SeqCst)
        } else {
            gets.load(Ordering::SeqCst)
        };
        let req = Request {
            method,
            target,
            headers,
            range,
            gets: n,
        };
        log.lock().unwrap().push(req.clone());
        let reply = script(&req);
        let (data, etag) = {
            let o = object.lock().unwrap();
            (o.data.clone(), o.etag.clone())
        };
        if !answer(&mut out, &req, reply, &data, &etag) {
            return;
        }
    }
}

fn head(status: &str, fields: &[(&str, String)]) -> Vec<u8> {
    let mut h = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in fields {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h.into_bytes()
}

/// Writes the reply; `false` when the connection is to be closed.
fn answer(out: &mut TcpStream, req: &Request, reply: Reply, data: &[u8], etag: &str) -> bool {
    let len = data.len() as u64;
    let ok_range = req.range.filter(|&(a, b)| a <= b && b < len);
    let send = |out: &mut TcpStream, h: Vec<u8>, body: &[u8]| {
        out.write_all(&h).is_ok() && (req.method == "HEAD" || out.write_all(body).is_ok())
    };
    let partial = |out: &mut TcpStream, a: u64, b: u64, body_len: u64| {
        let h = head(
            "206 Partial Content",
            &[
                ("Content-Range", format!("bytes {a}-{b}/{len}")),
                ("Content-Length", body_len.to_string()),
                ("ETag", etag.to_string()),
            ],
        );
        let end = (a + body_len).min(len);
        send(out, h, &data[a as usize..end as usize])
    };
    match reply {
        Reply::Serve | Reply::ServeIgnoringIfMatch => {
            if req.method == "HEAD" || req.range.is_none() {
                let h = head(
                    "200 OK",
                    &[
                        ("Content-Length", len.to_string()),
                        ("ETag", etag.to_string()),
                    ],
                );
                return send(out, h, data);
            }
            let precondition = matches!(reply, Reply::Serve);
            if precondition && req.header("if-match").is_some_and(|m| m != etag) {
                let body = b"precondition failed";
                let h = head(
                    "412 Precondition Failed",
                    &[("Content-Length", body.len().to_string())],
                );
                return send(out, h, body);
            }
            match ok_range {
                Some((a, b)) => partial(out, a, b, b - a + 1),
                None => answer(out, req, Reply::NotSatisfiable, data, etag),
            }
        }
        Reply::Whole => {
            let h = head(
                "200 OK",
                &[
                    ("Content-Length", len.to_string()),
                    ("ETag", etag.to_string()),
                ],
            );
            send(out, h, data)
        }
        Reply::ShortBody => {
            let (a, b) = ok_range.expect("a valid range");
            partial(out, a, b, b - a)
        }
        Reply::ShiftedRange => {
            let (a, b) = ok_range.expect("a valid range");
            let (a, b) = (a + 1, (b + 1).min(len - 1));
            partial(out, a, b, b - a + 1)
        }
        Reply::CutBody => {
            let (a, b) = ok_range.expect("a valid range");
            let h = head(
                "206 Partial Content",
                &[
                    ("Content-Range", format!("bytes {a}-{b}/{len}")),
                    ("Content-Length", (b - a + 1).to_string()),
                    ("ETag", etag.to_string()),
                ],
            );
            let n = b - a + 1;
            let half = a + n / 2;
            let _ = out.write_all(&h);
            let _ = out.write_all(&data[a as usize..half as usize]);
            let _ = out.flush();
            let _ = out.shutdown(std::net::Shutdown::Both);
            false
        }
        Reply::NotSatisfiable => {
            let h = head(
                "416 Range Not Satisfiable",
                &[
                    ("Content-Range", format!("bytes */{len}")),
                    ("Content-Length", "0".into()),
                ],
            );
            send(out, h, b"")
        }
        Reply::Status(code, xml) => {
            let body = match xml {
                Some((c, m)) => format!(
                    "<?xml version=\"1.0\"?><Error><Code>{c}</Code><Message>{m}</Message></Error>"
                ),
                None => format!("status {code}"),
            };
            let h = head(
                &format!("{code} Scripted"),
                &[("Content-Length", body.len().to_string())],
            );
            send(out, h, body.as_bytes())
        }
        Reply::Stall(d) => {
            std::thread::sleep(d);
            false
        }
        Reply::Close => false,
    }
}
