//! One remote object read by byte ranges, its identity pinned at open.

use std::fmt;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ureq::http::Response;
use ureq::Body;

use super::client::HttpClient;
use super::fetch::{send, sort_io};
use super::options::HttpOptions;
use super::reply::{content_range, header, one_line, reason};
use super::retry::{with_retries, Attempt};
use crate::remote::{Method, ObjectIdentity, RangeSource, RemoteError, RemoteStats, RequestTarget};

/// An object on an HTTP(S) server or S3 store, read by `Range` requests; thread-safe (several
/// reads in flight share the client's kept-alive connections).
pub struct HttpObject {
    client: HttpClient,
    target: Box<dyn RequestTarget>,
    name: String,
    identity: ObjectIdentity,
    /// `Last-Modified` at open: compared instead when the server gives no ETag.
    last_modified: Option<String>,
    requests: AtomicU64,
    bytes: AtomicU64,
    retries: AtomicU64,
}

/// What a successful `HEAD` or probe pinned.
struct Pin {
    identity: ObjectIdentity,
    last_modified: Option<String>,
}

fn pin(resp: &Response<Body>, len: u64) -> Pin {
    Pin {
        identity: ObjectIdentity {
            len,
            etag: header(resp, "etag").map(str::to_string),
            version: header(resp, "x-amz-version-id").map(str::to_string),
        },
        last_modified: header(resp, "last-modified").map(str::to_string),
    }
}

impl HttpObject {
    /// Opens the object `target` names with a client of its own made from `options`.
    /// Several objects of one stack should share one [`HttpClient`] instead
    /// ([`HttpClient::open`]).
    pub fn open(
        target: Box<dyn RequestTarget>,
        options: &HttpOptions,
    ) -> Result<Self, RemoteError> {
        let client = HttpClient::new(options).map_err(|e| RemoteError::Io {
            url: e.path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.what),
        })?;
        Self::open_with(client, target)
    }

    pub(super) fn open_with(
        client: HttpClient,
        target: Box<dyn RequestTarget>,
    ) -> Result<Self, RemoteError> {
        let mut object = Self {
            client,
            name: target.display_name().to_string(),
            target,
            identity: ObjectIdentity::default(),
            last_modified: None,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        };
        let policy = &object.client.options().retry;
        let pinned = match with_retries(policy, || object.retried(), || object.head())? {
            Some(pinned) => pinned,
            None => with_retries(policy, || object.retried(), || object.probe())?,
        };
        object.identity = pinned.identity;
        object.last_modified = pinned.last_modified;
        Ok(object)
    }

    /// The client this object reads through.
    pub fn client(&self) -> &HttpClient {
        &self.client
    }

    fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    fn protocol(&self, what: String) -> Attempt {
        Attempt::Fail(RemoteError::Protocol {
            url: self.name.clone(),
            what,
        })
    }

    fn changed(&self, what: String) -> Attempt {
        Attempt::Fail(RemoteError::Changed {
            url: self.name.clone(),
            what,
        })
    }

    fn request(
        &self,
        method: Method,
        range: Option<(u64, u64)>,
        if_match: Option<&str>,
    ) -> Result<Response<Body>, Attempt> {
        let req = self.target.prepare(method).map_err(Attempt::Fail)?;
        if method == Method::Get {
            self.requests.fetch_add(1, Ordering::Relaxed);
        }
        send(
            self.client.agent(),
            &self.name,
            req,
            method,
            range,
            if_match,
        )
    }

    /// An error status as an attempt's failure: 401/403 denied; 408, 429 and 5xx transient
    /// (after the server's `Retry-After`, bounded by the policy); the rest final.
    fn status_error(&self, resp: Response<Body>) -> Attempt {
        let status = resp.status().as_u16();
        let retry_after = header(&resp, "retry-after")
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let what = reason(resp);
        let url = self.name.clone();
        match status {
            401 | 403 => Attempt::Fail(RemoteError::Denied { url, what }),
            408 | 429 | 500..=599 => {
                Attempt::Retry(RemoteError::Status { url, status, what }, retry_after)
            }
            _ => Attempt::Fail(RemoteError::Status { url, status, what }),
        }
    }

    /// `HEAD`: the pinned identity, or `None` when the server refused it or gave no length
    /// (then a ranged `GET` probes, and reports a refusal with the server's reason).
    fn head(&self) -> Result<Option<Pin>, Attempt> {
        let resp = self.request(Method::Head, None, None)?;
        match resp.status().as_u16() {
            200 => Ok(header(&resp, "content-length")
                .and_then(|l| l.trim().parse().ok())
                .map(|len| pin(&resp, len))),
            408 | 429 | 500..=599 => Err(self.status_error(resp)),
            _ => Ok(None),
        }
    }

    /// `GET` of byte 0: the length from `Content-Range` (a 416 with `bytes */0`: empty).
    fn probe(&self) -> Result<Pin, Attempt> {
        let _pass = self.client.gate().enter();
        let resp = self.request(Method::Get, Some((0, 0)), None)?;
        let status = resp.status().as_u16();
        let range = header(&resp, "content-range").and_then(content_range);
        match (status, range) {
            (206, Some(r)) if r.range == Some((0, 0)) && r.total.is_some() => {
                let pinned = pin(&resp, r.total.unwrap_or(0));
                let mut byte = Vec::with_capacity(2);
                let got = resp
                    .into_body()
                    .into_reader()
                    .take(2)
                    .read_to_end(&mut byte)
                    .map_err(|e| sort_io(&self.name, e))?;
                self.bytes.fetch_add(got as u64, Ordering::Relaxed);
                if got != 1 {
                    return Err(
                        self.protocol(format!("a {got}-byte body for byte 0 of the object"))
                    );
                }
                Ok(pinned)
            }
            (206, _) => Err(self.protocol(
                "a 206 to a request for byte 0 without a Content-Range naming it and the \
                 object's length"
                    .into(),
            )),
            (416, Some(r)) if r.total == Some(0) => Ok(pin(&resp, 0)),
            (200, _) => Err(self.protocol(
                "the server does not serve byte ranges (HTTP 200 to a range request)".into(),
            )),
            _ => Err(self.status_error(resp)),
        }
    }

    /// `If-Match` for the pinned ETag. A weak ETag (`W/"..."`) never matches `If-Match`
    /// (strong comparison), so it is compared in each answer instead.
    fn if_match(&self) -> Option<&str> {
        self.identity
            .etag
            .as_deref()
            .filter(|e| !e.starts_with("W/"))
    }

    /// Whether the answer is still from the object pinned at open (ETag, version, or
    /// `Last-Modified` when there is no ETag).
    fn check_same(&self, resp: &Response<Body>) -> Result<(), Attempt> {
        let pinned = &self.identity;
        let pairs = [
            ("ETag", pinned.etag.as_deref(), header(resp, "etag")),
            (
                "version",
                pinned.version.as_deref(),
                header(resp, "x-amz-version-id"),
            ),
            (
                "Last-Modified",
                self.last_modified
                    .as_deref()
                    .filter(|_| pinned.etag.is_none()),
                header(resp, "last-modified"),
            ),
        ];
        for (what, was, now) in pairs {
            if let (Some(was), Some(now)) = (was, now) {
                if was != now {
                    return Err(self.changed(format!(
                        "{what} {} at open, now {}",
                        one_line(was),
                        one_line(now)
                    )));
                }
            }
        }
        Ok(())
    }

    /// One `GET` of `buf.len()` bytes at `offset` into `buf`.
    fn fetch(&self, offset: u64, buf: &mut [u8]) -> Result<(), Attempt> {
        let len = self.identity.len;
        let n = buf.len() as u64;
        let last = offset + n - 1;
        let _pass = self.client.gate().enter();
        let resp = self.request(Method::Get, Some((offset, last)), self.if_match())?;
        let range_header = header(&resp, "content-range").map(str::to_string);
        let range = range_header.as_deref().and_then(content_range);
        match resp.status().as_u16() {
            206 => {}
            200 => {
                return Err(self.protocol(format!(
                    "HTTP 200 (the whole object) to a request for bytes {offset}-{last}: the \
                     server ignored the range"
                )))
            }
            412 => {
                return Err(self.changed(format!(
                    "the server refused If-Match {} (HTTP 412)",
                    self.identity.etag.as_deref().unwrap_or("")
                )))
            }
            416 => {
                if let Some(now) = range.and_then(|r| r.total).filter(|&t| t != len) {
                    return Err(self.changed(format!("length {len} at open, now {now}")));
                }
                return Err(self.protocol(format!(
                    "HTTP 416 (range not satisfiable) for bytes {offset}-{last} of the \
                     {len}-byte object pinned at open"
                )));
            }
            _ => return Err(self.status_error(resp)),
        }
        self.check_same(&resp)?;
        let shown = one_line(range_header.as_deref().unwrap_or("(none)"));
        let Some(range) = range else {
            return Err(self.protocol(format!(
                "a 206 for bytes {offset}-{last} with Content-Range {shown}"
            )));
        };
        if let Some(now) = range.total.filter(|&t| t != len) {
            return Err(self.changed(format!("length {len} at open, now {now}")));
        }
        if range.range != Some((offset, last)) {
            return Err(self.protocol(format!(
                "Content-Range {shown} does not match the request for bytes {offset}-{last}"
            )));
        }
        if let Some(enc) = header(&resp, "content-encoding").filter(|e| *e != "identity") {
            return Err(self.protocol(format!(
                "a range sent with Content-Encoding {}",
                one_line(enc)
            )));
        }
        if let Some(cl) = header(&resp, "content-length").and_then(|l| l.trim().parse::<u64>().ok())
        {
            if cl != n {
                let which = if cl < n { "short" } else { "long" };
                return Err(self.protocol(format!(
                    "{which} body: Content-Length {cl} for the {n} bytes {offset}-{last}"
                )));
            }
        }
        self.read_body(resp, offset, buf)
    }

    /// Reads exactly `buf.len()` body bytes into `buf` (never more: a longer body is refused).
    fn read_body(&self, resp: Response<Body>, offset: u64, buf: &mut [u8]) -> Result<(), Attempt> {
        let n = buf.len();
        let last = offset + n as u64 - 1;
        let mut reader = resp.into_body().into_reader();
        let mut got = 0;
        let dropped = |got: usize, e: std::io::Error| match sort_io(&self.name, e) {
            Attempt::Retry(RemoteError::Io { url, source }, hint) => Attempt::Retry(
                RemoteError::Io {
                    url,
                    source: std::io::Error::new(
                        source.kind(),
                        format!("{source} (body of bytes {offset}-{last} cut after {got} of {n})"),
                    ),
                },
                hint,
            ),
            other => other,
        };
        while got < n {
            match reader.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(self.protocol(format!(
                        "short body: {got} of the {n} bytes {offset}-{last}"
                    )))
                }
                Ok(k) => {
                    got += k;
                    self.bytes.fetch_add(k as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(dropped(got, e)),
            }
        }
        let mut more = [0u8; 1];
        match reader.read(&mut more) {
            Ok(0) => Ok(()),
            Ok(_) => Err(self.protocol(format!(
                "long body: more than the {n} bytes {offset}-{last}"
            ))),
            Err(e) => Err(dropped(got, e)),
        }
    }
}

impl RangeSource for HttpObject {
    fn read_range(&self, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        RemoteError::check_within(&self.name, offset, buf.len(), self.identity.len)?;
        if buf.is_empty() {
            return Ok(());
        }
        let policy = &self.client.options().retry;
        with_retries(policy, || self.retried(), || self.fetch(offset, buf))
    }

    fn stats(&self) -> RemoteStats {
        RemoteStats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_fetched: self.bytes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }

    fn identity(&self) -> &ObjectIdentity {
        &self.identity
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for HttpObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpObject")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}
