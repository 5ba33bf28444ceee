//! The HTTP transport against a server that misbehaves on purpose (tests/common/http_faults.rs,
//! on 127.0.0.1): each fault either recovers (by retry) or fails with one clear line naming
//! the object, never passes wrong data as good, and never hangs past the configured timeout.
//!
//! A flipped byte is NOT caught here: the transport does not verify; the verity layer above it
//! checks every block.

mod common;

use common::http_faults::{FaultServer, Reply, Request};
use dmkit::remote::{FixedUrl, HttpObject, HttpOptions, RangeSource, RemoteError, RetryPolicy};
use std::time::{Duration, Instant};

const SIZE: usize = 256 * 1024 + 77;

fn data() -> Vec<u8> {
    common::rng::bytes(2828, SIZE)
}

/// One-second read timeout, three quick retries.
fn options() -> HttpOptions {
    HttpOptions {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_retries: 3,
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_total: Duration::from_secs(10),
        },
        ..HttpOptions::default()
    }
}

fn open(server: &FaultServer) -> HttpObject {
    HttpObject::open(Box::new(FixedUrl::new(&server.url())), &options())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Serves honestly except range GETs, which get `reply(get number)`.
fn on_gets(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> FaultServer {
    FaultServer::start(data(), move |r: &Request| {
        if r.is_range_get() {
            reply(r.gets)
        } else {
            Reply::Serve
        }
    })
}

/// Reads bytes 1000..5096 of `obj`.
fn read(obj: &HttpObject) -> Result<Vec<u8>, RemoteError> {
    let mut buf = vec![0u8; 4096];
    obj.read_range(1000, &mut buf).map(|()| buf)
}

/// The error of a read, checked to be one line naming the object.
fn failure(obj: &HttpObject, server: &FaultServer) -> RemoteError {
    let e = read(obj).expect_err("the read must fail");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&server.url()) && !msg.contains('\n'),
        "{msg}"
    );
    e
}

#[test]
fn ranges_carry_if_match_and_read_back() {
    let server = on_gets(|_| Reply::Serve);
    let obj = open(&server);
    assert_eq!(obj.identity().len, SIZE as u64);
    assert_eq!(obj.identity().etag.as_deref(), Some("\"v1\""));
    assert!(read(&obj).unwrap() == data()[1000..5096]);
    let reqs = server.requests();
    assert_eq!(reqs[0].method, "HEAD");
    let get = &reqs[1];
    assert_eq!(get.header("range"), Some("bytes=1000-5095"));
    assert_eq!(get.header("if-match"), Some("\"v1\""));
    assert_eq!(get.header("accept-encoding"), Some("identity"));
    // Kept alive: twenty more reads, one after another, on the same connection.
    for _ in 0..20 {
        read(&obj).unwrap();
    }
    assert_eq!(server.connections(), 1);
}

/// Every range GET answered with `reply`: refused as a protocol error saying `says`, not
/// retried (the server would answer the same).
fn refused_as_protocol(reply: Reply, says: &str) {
    let server = on_gets(move |_| reply.clone());
    let obj = open(&server);
    let e = failure(&obj, &server);
    assert!(matches!(e, RemoteError::Protocol { .. }), "{e}");
    assert!(e.to_string().contains(says), "{e}");
    assert_eq!(obj.stats().retries, 0);
}

/// A 200 instead of a 206, a short body, a 416, a Content-Range not asked for.
#[test]
fn protocol_violations_are_refused() {
    refused_as_protocol(Reply::Whole, "HTTP 200");
    refused_as_protocol(Reply::ShortBody, "short body");
    refused_as_protocol(Reply::NotSatisfiable, "416");
    refused_as_protocol(Reply::ShiftedRange, "does not match");
}

#[test]
fn an_etag_changed_mid_run_fails_closed() {
    // A server honouring If-Match answers 412; one ignoring it still says the new ETag, which
    // is compared.
    for (reply, says) in [
        (Reply::Serve, "412"),
        (
            Reply::ServeIgnoringIfMatch,
            "ETag \"v1\" at open, now \"v2\"",
        ),
    ] {
        let server = on_gets(move |_| reply.clone());
        let obj = open(&server);
        read(&obj).unwrap();
        server.set_etag("\"v2\"");
        let e = failure(&obj, &server);
        assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert_eq!(obj.stats().retries, 0, "a changed object is never retried");
    }
}

#[test]
fn a_dropped_connection_recovers_by_retry() {
    for fault in [Reply::CutBody, Reply::Close] {
        let f = fault.clone();
        let server = on_gets(move |n| if n == 0 { f.clone() } else { Reply::Serve });
        let obj = open(&server);
        assert!(read(&obj).unwrap() == data()[1000..5096], "{fault:?}");
        assert_eq!(obj.stats().retries, 1, "{fault:?}");
        assert_eq!(obj.stats().requests, 2, "{fault:?}");
    }
    // Cut every time: fails after the retries, saying where the body was cut.
    let server = on_gets(|_| Reply::CutBody);
    let obj = open(&server);
    let e = failure(&obj, &server);
    assert!(matches!(e, RemoteError::Io { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("cut after 2048 of 4096") && msg.contains("after 3 retries"),
        "{msg}"
    );
    assert_eq!(obj.stats().retries, 3);
}

#[test]
fn a_503_then_success_recovers() {
    let server = on_gets(|n| {
        if n < 2 {
            Reply::Status(
                503,
                Some(("SlowDown".into(), "Please reduce your request rate.".into())),
            )
        } else {
            Reply::Serve
        }
    });
    let obj = open(&server);
    assert!(read(&obj).unwrap() == data()[1000..5096]);
    assert_eq!(obj.stats().retries, 2);
    // Always 503: the server's reason, after the retries.
    let server = on_gets(|_| Reply::Status(503, None));
    let obj = open(&server);
    let e = failure(&obj, &server);
    assert!(matches!(e, RemoteError::Status { status: 503, .. }), "{e}");
    assert!(e.to_string().ends_with("(after 3 retries)"), "{e}");
}

#[test]
fn a_stalled_server_times_out_within_the_bound() {
    let server = on_gets(|_| Reply::Stall(Duration::from_secs(20)));
    let obj = open(&server);
    let opts = options();
    let start = Instant::now();
    let e = failure(&obj, &server);
    let took = start.elapsed();
    assert!(
        matches!(&e, RemoteError::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
        "{e}"
    );
    assert!(e.to_string().contains("timed out"), "{e}");
    // Four attempts of one read timeout each, the backoffs between them, and slack.
    let bound = opts.read_timeout * (opts.retry.max_retries + 1)
        + opts.retry.max_backoff * opts.retry.max_retries
        + Duration::from_secs(2);
    assert!(took >= opts.read_timeout, "{took:?}");
    assert!(took < bound, "took {took:?}, bound {bound:?}");
    // A stall at open fails the open within the same bound.
    let server = FaultServer::start(data(), |_| Reply::Stall(Duration::from_secs(20)));
    let start = Instant::now();
    let e = HttpObject::open(Box::new(FixedUrl::new(&server.url())), &opts).unwrap_err();
    assert!(e.to_string().contains("timed out"), "{e}");
    assert!(start.elapsed() < bound, "{:?}", start.elapsed());
}

#[test]
fn access_denied_gives_the_servers_reason() {
    let server = FaultServer::start(data(), |_| {
        Reply::Status(403, Some(("AccessDenied".into(), "Access Denied".into())))
    });
    let e = HttpObject::open(Box::new(FixedUrl::new(&server.url())), &options()).unwrap_err();
    assert!(matches!(e, RemoteError::Denied { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: access denied: AccessDenied: Access Denied",
            server.url()
        )
    );
    // HEAD then the probing GET (which carries the reason), no retries.
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn a_refused_head_is_replaced_by_a_ranged_get() {
    let server = FaultServer::start(data(), |r: &Request| {
        if r.method == "HEAD" {
            Reply::Status(405, None)
        } else {
            Reply::Serve
        }
    });
    let obj = open(&server);
    assert_eq!(obj.identity().len, SIZE as u64);
    assert_eq!(obj.identity().etag.as_deref(), Some("\"v1\""));
    assert_eq!(server.requests()[1].header("range"), Some("bytes=0-0"));
    assert!(read(&obj).unwrap() == data()[1000..5096]);
}

#[test]
fn a_flipped_byte_is_not_detected_here() {
    // The server's copy differs from the original in one byte: the transport hands it over
    // as it came (the verity layer above rejects the block).
    let original = data();
    let mut served = original.clone();
    served[3000] ^= 0x40;
    let server = FaultServer::start(served.clone(), |_| Reply::Serve);
    let obj = open(&server);
    let got = read(&obj).unwrap();
    assert!(got == served[1000..5096]);
    assert!(got != original[1000..5096]);
}
