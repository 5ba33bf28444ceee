//! Sending one request and sorting its failures: transient ones (timeouts, dropped or refused
//! connections) are retried, the rest are final. Messages name the object by its display name:
//! the URL sent (which may carry a signature) and its headers never appear in them.

use std::io;

use ureq::http::Response;
use ureq::{Agent, Body, ResponseExt};

use super::reply::one_line;
use super::retry::Attempt;
use crate::remote::{Method, PreparedRequest, RemoteError};

/// Sends `req` as a `method` request, with `Range: bytes=FIRST-LAST` and `If-Match: ETAG` when
/// given. Any answer (whatever its status) is returned; failing to get one is sorted.
pub(super) fn send(
    agent: &Agent,
    name: &str,
    req: PreparedRequest,
    method: Method,
    range: Option<(u64, u64)>,
    if_match: Option<&str>,
) -> Result<Response<Body>, Attempt> {
    let PreparedRequest { url, headers } = req;
    let mut builder = match method {
        Method::Head => agent.head(&url),
        Method::Get => agent.get(&url),
    };
    for (k, v) in &headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    // A range must come as the object's own bytes, never re-encoded.
    builder = builder.header("Accept-Encoding", "identity");
    if let Some((first, last)) = range {
        builder = builder.header("Range", format!("bytes={first}-{last}"));
    }
    if let Some(etag) = if_match {
        builder = builder.header("If-Match", etag);
    }
    let resp = builder.call().map_err(|e| sort(name, e))?;
    // A redirect may not take an https object to plain http.
    let was_tls = url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    if was_tls && resp.get_uri().scheme_str() != Some("https") {
        return Err(Attempt::Fail(RemoteError::Protocol {
            url: name.to_string(),
            what: "redirected from https to plain http".into(),
        }));
    }
    Ok(resp)
}

fn io_error(name: &str, kind: io::ErrorKind, what: String) -> RemoteError {
    RemoteError::Io {
        url: name.to_string(),
        source: io::Error::new(kind, what),
    }
}

/// The one line a TLS failure is reported with.
fn tls_line(e: &impl std::fmt::Display) -> String {
    let s = e.to_string();
    if s.contains("certificate verify failed") {
        // OpenSSL puts the verify result last, in parentheses.
        let why = s
            .rsplit_once('(')
            .map_or("verify failed", |(_, r)| r.trim_end_matches(')'));
        format!("TLS: the server's certificate is not trusted ({why}); name its CA with --ca-file")
    } else {
        format!("TLS: {}", one_line(&s))
    }
}

/// Sorts a failure to get an answer (or a body) from the client.
pub(super) fn sort(name: &str, e: ureq::Error) -> Attempt {
    use io::ErrorKind as K;
    let retry = |kind, what: String| Attempt::Retry(io_error(name, kind, what), None);
    let fail = |kind, what: String| Attempt::Fail(io_error(name, kind, what));
    match e {
        ureq::Error::Io(e) => sort_io(name, e),
        ureq::Error::Timeout(t) => retry(K::TimedOut, format!("timed out ({t})")),
        ureq::Error::ConnectionFailed => retry(K::ConnectionRefused, "could not connect".into()),
        ureq::Error::HostNotFound => fail(K::NotFound, "host not found".into()),
        ureq::Error::NativeTls(e) => fail(K::Other, tls_line(&e)),
        ureq::Error::Tls(e) => fail(K::Other, format!("TLS: {e}")),
        ureq::Error::Protocol(e) => Attempt::Fail(RemoteError::Protocol {
            url: name.to_string(),
            what: format!("HTTP protocol error: {}", one_line(&e.to_string())),
        }),
        ureq::Error::TooManyRedirects | ureq::Error::RedirectFailed => {
            Attempt::Fail(RemoteError::Protocol {
                url: name.to_string(),
                what: "redirects that do not end (or cannot be followed)".into(),
            })
        }
        // The URL itself is not shown: it may carry a signature.
        ureq::Error::BadUri(_) | ureq::Error::Http(_) => {
            fail(K::InvalidInput, "not a valid URL".into())
        }
        other => fail(K::Other, one_line(&other.to_string())),
    }
}

/// Sorts an I/O failure: timeouts and dropped connections are transient.
pub(super) fn sort_io(name: &str, e: io::Error) -> Attempt {
    use io::ErrorKind as K;
    if e.get_ref().is_some_and(|i| i.is::<ureq::Error>()) {
        let inner = e
            .into_inner()
            .and_then(|i| i.downcast::<ureq::Error>().ok());
        if let Some(inner) = inner {
            return sort(name, *inner);
        }
        return Attempt::Fail(io_error(name, K::Other, "client error".into()));
    }
    let what = match e.kind() {
        K::TimedOut | K::WouldBlock => "timed out".to_string(),
        K::UnexpectedEof => "the server closed the connection mid-answer".to_string(),
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::NotConnected => {
            format!("connection dropped ({e})")
        }
        _ => return Attempt::Fail(io_error(name, e.kind(), one_line(&e.to_string()))),
    };
    let kind = if e.kind() == K::WouldBlock {
        K::TimedOut
    } else {
        e.kind()
    };
    Attempt::Retry(io_error(name, kind, what), None)
}
