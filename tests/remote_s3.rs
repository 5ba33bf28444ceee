//! `s3://` objects against a real S3-compatible server that checks SigV4 signatures (s3s-fs,
//! started on 127.0.0.1 by each test, see tests/common/s3.rs).
//!
//! - the requests [`S3Target`] presigns are accepted, with the `Range` and `If-Match` headers a
//!   transport adds unsigned; a wrong secret key or a wrong access key id is refused by the
//!   server (403 with its S3 error code), and missing credentials are refused before any request;
//! - through the HTTP transport (`HttpObject` over an `S3Target`): HEAD pins length and ETag,
//!   ranges read back identical to the file, a wrong key is one clear line.

mod common;

use std::process::Command;
use std::time::Duration;

use common::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use dmkit::crypt::secret::SecretBytes;
use dmkit::remote::credentials::S3Credentials;
use dmkit::remote::s3::{S3Options, S3Target};
use dmkit::remote::{HttpObject, HttpOptions, Method, RangeSource, RemoteError, RequestTarget};

const BUCKET: &str = "images";

fn creds(id: &str, secret: &str) -> S3Credentials {
    S3Credentials::new(id, SecretBytes::from_slice(secret.as_bytes()), None, "test").unwrap()
}

fn target(srv: &S3Server, key: &str, c: S3Credentials) -> S3Target {
    let o = S3Options {
        endpoint: Some(srv.endpoint()),
        region: Some("us-east-1".into()),
    };
    let env: &[(&str, &str)] = &[];
    S3Target::new(BUCKET, key, &o, c, &env).unwrap()
}

/// `curl` of the presigned request: (status, headers, body).
fn curl(t: &S3Target, method: Method, headers: &[&str]) -> (u16, String, Vec<u8>) {
    let req = t.prepare(method).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hdr = dir.path().join("h");
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "-", "-D"]).arg(&hdr);
    if method == Method::Head {
        cmd.arg("-I");
    }
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(&req.url).output().expect("curl");
    assert!(out.status.success(), "curl failed: {out:?}");
    let head = std::fs::read_to_string(&hdr).unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head, out.stdout)
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

fn data(len: usize) -> Vec<u8> {
    common::rng::bytes(0x53, len)
}

#[test]
fn presigned_head_and_ranges_are_accepted_with_unsigned_range_and_if_match() {
    if common::env::tools_missing(&[("curl", "curl")]) {
        return;
    }
    let Some(srv) = S3Server::start() else { return };
    let bytes = data(3 << 20);
    srv.put(BUCKET, "os/root.img", &bytes);
    let t = target(&srv, "os/root.img", creds(ACCESS_KEY, SECRET_KEY));

    let (status, head, _) = curl(&t, Method::Head, &[]);
    assert_eq!(status, 200, "{head}");
    assert_eq!(header(&head, "content-length").as_deref(), Some("3145728"));
    let etag = header(&head, "etag").expect("an ETag");

    let range = "Range: bytes=1048576-1052671";
    let if_match = format!("If-Match: {etag}");
    let (status, head, body) = curl(&t, Method::Get, &[range, &if_match]);
    assert_eq!(status, 206, "{head}");
    assert_eq!(body, &bytes[1048576..1052672]);
    // A GET signed for HEAD is refused: each method is signed on its own.
    let head_url = t.prepare(Method::Head).unwrap().url;
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &head_url])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
}

#[test]
fn wrong_secret_or_unknown_key_id_is_refused_by_the_server() {
    if common::env::tools_missing(&[("curl", "curl")]) {
        return;
    }
    let Some(srv) = S3Server::start() else { return };
    srv.put(BUCKET, "k.img", &data(8192));
    for (id, secret, code) in [
        (ACCESS_KEY, "not-the-secret", "SignatureDoesNotMatch"),
        ("AKIDUNKNOWN", SECRET_KEY, ""),
    ] {
        let t = target(&srv, "k.img", creds(id, secret));
        let (status, head, body) = curl(&t, Method::Get, &["Range: bytes=0-4095"]);
        assert_eq!(status, 403, "{head}");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(code), "{body}");
    }
}

#[test]
fn missing_credentials_are_refused_before_any_request() {
    let Some(srv) = S3Server::start() else { return };
    let o = S3Options {
        endpoint: Some(srv.endpoint()),
        region: None,
    };
    // from_env reads the process environment: run it in a child with nothing set.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "from_env_child", "--nocapture", "--ignored"])
        .env_clear()
        .env("DMKIT_S3_TEST_ENDPOINT", srv.endpoint())
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "s3://images/k.img: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        ),
        "{text}"
    );
    let _ = o;
}

/// Run by [`missing_credentials_are_refused_before_any_request`] in a clean environment.
#[test]
#[ignore]
fn from_env_child() {
    let o = S3Options {
        endpoint: std::env::var("DMKIT_S3_TEST_ENDPOINT").ok(),
        region: None,
    };
    match S3Target::from_env(BUCKET, "k.img", &o) {
        Ok(t) => println!("unexpected: {t:?}"),
        Err(e) => println!("{e}"),
    }
}

fn http_options() -> HttpOptions {
    HttpOptions {
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(10),
        ..HttpOptions::default()
    }
}

#[test]
fn http_object_over_s3_pins_length_and_etag_and_reads_ranges_identical() {
    let Some(srv) = S3Server::start() else { return };
    let bytes = data((3 << 20) + 12_345);
    srv.put(BUCKET, "os/root.img", &bytes);
    let t = target(&srv, "os/root.img", creds(ACCESS_KEY, SECRET_KEY));
    let obj = HttpObject::open(Box::new(t), &http_options()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(obj.name(), "s3://images/os/root.img");
    assert_eq!(obj.identity().len, bytes.len() as u64);
    assert!(obj.identity().etag.is_some(), "{:?}", obj.identity());
    let len = bytes.len() as u64;
    let mut x = 28u64;
    let mut ranges = vec![(0, 1), (len - 1, 1), (0, len), (len - 4096, 4096)];
    for _ in 0..40 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let n = 1 + (x >> 33) % (256 << 10);
        let off = (x >> 7) % (len - n + 1);
        ranges.push((off, n));
    }
    for (off, n) in ranges {
        let mut buf = vec![0u8; n as usize];
        obj.read_range(off, &mut buf)
            .unwrap_or_else(|e| panic!("bytes {off}+{n}: {e}"));
        assert!(
            buf == bytes[off as usize..(off + n) as usize],
            "bytes {off}+{n} differ"
        );
    }
    assert!(obj.stats().requests >= 44);

    // The object replaced behind the reader's back (same length): fails closed.
    let mut other = bytes.clone();
    other[0] ^= 1;
    srv.put(BUCKET, "os/root.img", &other);
    let mut buf = vec![0u8; 4096];
    let e = obj.read_range(0, &mut buf).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
    assert!(
        e.to_string().starts_with("s3://images/os/root.img: "),
        "{e}"
    );
}

#[test]
fn wrong_secret_key_is_denied_in_one_line_naming_the_server_code() {
    let Some(srv) = S3Server::start() else { return };
    srv.put(BUCKET, "k.img", &data(8192));
    let t = target(&srv, "k.img", creds(ACCESS_KEY, "not-the-secret"));
    let e = match HttpObject::open(Box::new(t), &http_options()) {
        Ok(_) => panic!("a wrong secret key was accepted"),
        Err(e) => e,
    };
    assert!(matches!(e, RemoteError::Denied { .. }), "{e:?}");
    let s = e.to_string();
    assert!(s.starts_with("s3://images/k.img: access denied: "), "{s}");
    assert!(s.contains("SignatureDoesNotMatch"), "{s}");
    assert!(
        !s.contains('\n') && !s.contains("X-Amz") && !s.contains("not-the-secret"),
        "{s}"
    );
}

/// `dmkit ARGS` in `run` with this server's keys (or a wrong secret) in the environment.
fn dmkit_s3(
    run: &common::run::RunDir,
    srv: &S3Server,
    secret: &str,
    args: &[&str],
) -> common::run::Run {
    let mut cmd = common::run::command(common::DMKIT, args, Some(run.path()));
    for (k, v) in srv.env() {
        let v = if k == "AWS_SECRET_ACCESS_KEY" {
            secret.to_string()
        } else {
            v
        };
        cmd.env(k, v);
    }
    let what = format!("dmkit {}", args.join(" "));
    common::run::Run::new(
        what,
        &common::run::output_within(&mut cmd, Duration::from_secs(120)),
    )
}

#[test]
fn signed_verity_image_opened_from_s3_reads_back_identical() {
    if common::env::fuse_missing() {
        return;
    }
    let Some(srv) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bytes = data(4 << 20);
    let (data_path, hash_path) = (dir.path().join("data.img"), dir.path().join("hash.img"));
    std::fs::write(&data_path, &bytes).unwrap();
    let out = common::run::ok(
        common::DMKIT,
        &[
            "verity",
            "format",
            data_path.to_str().unwrap(),
            hash_path.to_str().unwrap(),
        ],
    );
    let root = out
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|| panic!("no root hash in {out}"));
    let id = common::pki::make_ident(dir.path(), "signer", "/CN=s3 verity", common::pki::RSA);
    let sig = dmkit::verity::sig::sign_root_hash(&root, &id.key, &id.cert).unwrap();
    srv.put_file(BUCKET, "os/data.img", &data_path);
    srv.put_file(BUCKET, "os/hash.img", &hash_path);
    srv.put(BUCKET, "os/root.p7s", &sig);

    let run = common::run::RunDir::new();
    let endpoint = srv.endpoint();
    let cert = id.cert.to_str().unwrap();
    let open = |secret: &str, name: &str| {
        dmkit_s3(
            &run,
            &srv,
            secret,
            &[
                "verity",
                "open",
                "s3://images/os/data.img",
                name,
                "s3://images/os/hash.img",
                &root,
                "--root-hash-signature",
                "s3://images/os/root.p7s",
                "--root-hash-cert",
                cert,
                "--s3-endpoint",
                &endpoint,
                "--no-cache",
            ],
        )
    };
    run.track("s3v");
    open(SECRET_KEY, "s3v").assert_ok();
    let read = std::fs::read(run.path().join("s3v")).unwrap();
    assert!(read == bytes, "the image read from s3:// differs");
    run.close("s3v");

    // A wrong secret key: one line naming the object and the server's refusal, exit 2.
    let r = open("not-the-secret", "s3w");
    assert_eq!(r.code, Some(2), "{}", r.describe());
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("s3://images/os/") && err.contains("access denied"),
        "{err}"
    );
    assert!(err.contains("SignatureDoesNotMatch"), "{err}");
    assert!(
        !err.contains("not-the-secret") && !err.contains("X-Amz-"),
        "{err}"
    );
}
