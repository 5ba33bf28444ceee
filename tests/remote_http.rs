//! The HTTP(S) transport against nginx on 127.0.0.1 (issue 28): ranges read back identical to
//! the file over HTTP and HTTPS (a CA made in the test), from several threads at once; an
//! untrusted certificate refused in one line; a client certificate where one is required; a
//! changed file failing closed through nginx's own `If-Match` check.

mod common;

use common::nginx::Nginx;
use common::rng::SplitMix64;
use dmkit::remote::{HttpClient, HttpObject, HttpOptions, RangeSource, RemoteError, TlsOptions};
use std::time::Duration;

/// 3 MiB and a few bytes, so ranges end at odd places.
const SIZE: usize = 3 * 1024 * 1024 + 12_345;

fn options(tls: TlsOptions) -> HttpOptions {
    HttpOptions {
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
        tls,
        ..HttpOptions::default()
    }
}

fn trusting(nginx: &Nginx) -> TlsOptions {
    TlsOptions {
        ca_file: Some(nginx.ca.clone()),
        ..TlsOptions::default()
    }
}

/// Reads `count` random ranges (first and last bytes included) from `obj`, each compared with
/// `data`.
fn check_ranges(obj: &HttpObject, data: &[u8], seed: u64, count: usize) {
    let mut rng = SplitMix64(seed);
    let len = data.len() as u64;
    let mut ranges = vec![(0, 1), (len - 1, 1), (0, len), (len - 4096, 4096)];
    for _ in 0..count {
        let n = 1 + rng.below(256 * 1024).min(len - 1);
        ranges.push((rng.below(len - n + 1), n));
    }
    for (off, n) in ranges {
        let mut buf = vec![0u8; n as usize];
        obj.read_range(off, &mut buf)
            .unwrap_or_else(|e| panic!("bytes {off}+{n}: {e}"));
        assert!(
            buf == data[off as usize..(off + n) as usize],
            "bytes {off}+{n} differ"
        );
    }
}

#[test]
fn ranges_over_http_and_https_match_the_file() {
    let Some(nginx) = Nginx::start() else { return };
    let data = common::rng::bytes(28, SIZE);
    nginx.put("disk.img", &data);
    for url in [nginx.http_url("disk.img"), nginx.https_url("disk.img")] {
        let client = HttpClient::new(&options(trusting(&nginx))).unwrap();
        let obj = client.open_url(&url).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(obj.identity().len, SIZE as u64);
        assert!(obj.identity().etag.is_some(), "nginx gives an ETag");
        assert_eq!(obj.name(), url);
        check_ranges(&obj, &data, 1, 100);
        // Several readers at once through the client's pool.
        std::thread::scope(|s| {
            for t in 0..6 {
                let (obj, data) = (&obj, &data);
                s.spawn(move || check_ranges(obj, data, 100 + t, 30));
            }
        });
        let st = obj.stats();
        assert_eq!(st.requests, 104 + 6 * 34, "{st:?}");
        assert_eq!(st.retries, 0, "{st:?}");
        assert!(st.bytes_fetched > SIZE as u64, "{st:?}");
        // Past the end: refused without a request.
        let mut b = [0u8; 2];
        assert!(matches!(
            obj.read_range(SIZE as u64 - 1, &mut b),
            Err(RemoteError::OutOfRange { .. })
        ));
        assert_eq!(obj.stats().requests, st.requests);
    }
}

#[test]
fn a_changed_file_fails_closed_through_if_match() {
    let Some(nginx) = Nginx::start() else { return };
    let data = common::rng::bytes(7, 1 << 20);
    let path = nginx.put("changing.img", &data);
    let obj = HttpObject::open(
        Box::new(dmkit::remote::FixedUrl::new(
            &nginx.http_url("changing.img"),
        )),
        &options(TlsOptions::default()),
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    obj.read_range(4096, &mut buf).unwrap();
    assert!(buf == data[4096..8192]);
    // Same length, other bytes, another modification time: nginx's ETag changes.
    let mut other = data.clone();
    other[5000] ^= 1;
    std::fs::write(&path, &other).unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(3600))
        .unwrap();
    drop(f);
    let e = obj.read_range(4096, &mut buf).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("changing.img") && msg.contains("412"), "{msg}");
    assert_eq!(obj.stats().retries, 0, "a changed object is never retried");
}

#[test]
fn an_untrusted_certificate_is_refused_in_one_line() {
    let Some(nginx) = Nginx::start() else { return };
    nginx.put("disk.img", b"0123456789");
    let client = HttpClient::new(&options(TlsOptions::default())).unwrap();
    let e = client.open_url(&nginx.https_url("disk.img")).unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(matches!(e, RemoteError::Io { .. }), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(msg.starts_with(&nginx.https_url("disk.img")), "{msg}");
    assert!(
        msg.contains("not trusted") && msg.contains("--ca-file"),
        "{msg}"
    );
}

#[test]
fn client_certificates_where_required() {
    let Some(nginx) = Nginx::start() else { return };
    let data = common::rng::bytes(9, 100_000);
    nginx.put("disk.img", &data);
    let url = nginx.mtls_url("disk.img");
    let with_cert = TlsOptions {
        ca_file: Some(nginx.ca.clone()),
        client_cert: Some(nginx.client_cert.clone()),
        client_key: Some(nginx.client_key.clone()),
    };
    let obj = HttpClient::new(&options(with_cert))
        .unwrap()
        .open_url(&url)
        .unwrap_or_else(|e| panic!("{e}"));
    check_ranges(&obj, &data, 3, 20);
    // The key as SEC1 (`BEGIN EC PRIVATE KEY`) works too.
    let sec1 = nginx.dir.path().join("client-sec1.key");
    common::pki::openssl_ok(&[
        "ec",
        "-in",
        nginx.client_key.to_str().unwrap(),
        "-out",
        sec1.to_str().unwrap(),
    ]);
    assert!(std::fs::read_to_string(&sec1)
        .unwrap()
        .contains("BEGIN EC PRIVATE KEY"));
    let obj = HttpClient::new(&options(TlsOptions {
        ca_file: Some(nginx.ca.clone()),
        client_cert: Some(nginx.client_cert.clone()),
        client_key: Some(sec1),
    }))
    .unwrap()
    .open_url(&url)
    .unwrap_or_else(|e| panic!("{e}"));
    check_ranges(&obj, &data, 4, 5);

    let e = HttpClient::new(&options(trusting(&nginx)))
        .unwrap()
        .open_url(&url)
        .unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(!msg.contains('\n') && msg.starts_with(&url), "{msg}");
    assert!(msg.contains("certificate"), "{msg}");
}

#[test]
fn missing_objects_and_secrets_in_urls() {
    let Some(nginx) = Nginx::start() else { return };
    let data = common::rng::bytes(5, 10_000);
    nginx.put("disk.img", &data);
    let client = HttpClient::new(&options(TlsOptions::default())).unwrap();
    // A presigned-style query is sent, but never shown.
    let obj = client
        .open_url(&format!(
            "{}?X-Amz-Signature=sekrit",
            nginx.http_url("disk.img")
        ))
        .unwrap();
    assert_eq!(obj.name(), nginx.http_url("disk.img"));
    check_ranges(&obj, &data, 4, 10);
    let e = client
        .open_url(&format!(
            "{}?X-Amz-Signature=sekrit",
            nginx.http_url("absent.img")
        ))
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, RemoteError::Status { status: 404, .. }),
        "{msg}"
    );
    assert!(!msg.contains("sekrit"), "{msg}");
    assert_eq!(
        msg,
        format!("{}: HTTP 404 Not Found", nginx.http_url("absent.img"))
    );
    // A CA file that is not one is named.
    let junk = nginx.put("junk.pem", b"junk");
    let e = HttpClient::new(&options(TlsOptions {
        ca_file: Some(junk.clone()),
        ..TlsOptions::default()
    }))
    .unwrap_err();
    assert!(
        e.to_string().starts_with(&junk.display().to_string()),
        "{e}"
    );
}
