//! `s3://bucket/key`: an object in S3 or an S3-compatible store, each request signed afresh.
//!
//! [`S3Target`] is a [`RequestTarget`]: before every `HEAD` and `GET` the HTTP transport asks
//! it for a URL, and it presigns one with AWS Signature Version 4 (rusty-s3, sans-IO) valid for
//! [`PRESIGN_SECONDS`]. Only the `host` header is signed (the payload is not, as for every
//! presigned URL), so the transport's own `Range` and `If-Match` headers go along unsigned, as
//! S3 and its compatibles accept. A session token travels in the signed query
//! (`X-Amz-Security-Token`). The URL carries the signature: it is never logged, and messages name
//! the object as `s3://bucket/key`.
//!
//! Endpoint: `--s3-endpoint URL` (or `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`) for an
//! S3-compatible store, addressed path-style (`URL/bucket/key`, which works with IP addresses
//! and any bucket name); else AWS at `https://s3.REGION.amazonaws.com`, virtual-hosted style
//! (`https://bucket.s3...`) unless the bucket name has dots (TLS wildcards match one label), then
//! path-style. Region: `AWS_REGION`, else `AWS_DEFAULT_REGION`, else `us-east-1`.

use rusty_s3::{Bucket, UrlStyle};

use super::credentials::{self, CredentialsError, Env, S3Credentials};
use super::{Method, PreparedRequest, RemoteError, RequestTarget};

/// Validity of each presigned request: it is used at once, so a short one; long enough for a
/// client clock a few minutes off (S3 checks `X-Amz-Date + X-Amz-Expires` against its clock).
pub const PRESIGN_SECONDS: u64 = 300;

/// The region when none is configured (the AWS SDKs' global default).
pub const DEFAULT_REGION: &str = "us-east-1";

/// Where the object is and how to reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct S3Options {
    /// `--s3-endpoint`: an S3-compatible store's base URL (`http://127.0.0.1:9000`); `None`
    /// for the environment's `AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL`, else AWS.
    pub endpoint: Option<String>,
    /// The region; `None` for `AWS_REGION`/`AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
}

/// Why an S3 target could not be made.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// No usable credentials (see [`credentials`]).
    #[error("{name}: {source}")]
    Credentials {
        /// The object, `s3://bucket/key`.
        name: String,
        /// Why.
        #[source]
        source: CredentialsError,
    },
    /// The bucket, key or endpoint cannot form a request URL.
    #[error("{name}: {what}")]
    Invalid {
        /// The object, `s3://bucket/key`.
        name: String,
        /// What is wrong.
        what: String,
    },
}

/// An S3 object as a [`RequestTarget`] whose every request is presigned afresh.
pub struct S3Target {
    bucket: Bucket,
    key: String,
    credentials: S3Credentials,
    display: String,
}

impl std::fmt::Debug for S3Target {
    /// The object and the credentials' id and origin; never a secret or a signed URL.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Target")
            .field("object", &self.display)
            .field("endpoint", &self.bucket.base_url().as_str())
            .field("region", &self.bucket.region())
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl S3Target {
    /// The target for `bucket`/`key` with the given credentials.
    pub fn new(
        bucket: &str,
        key: &str,
        options: &S3Options,
        credentials: S3Credentials,
        env: &dyn Env,
    ) -> Result<Self, S3Error> {
        let display = format!("s3://{bucket}/{key}");
        let invalid = |what: String| S3Error::Invalid {
            name: display.clone(),
            what,
        };
        check_bucket(bucket).map_err(|w| invalid(w.into()))?;
        check_key(key).map_err(|w| invalid(w.into()))?;
        let region = options
            .region
            .clone()
            .or_else(|| env.var("AWS_REGION"))
            .or_else(|| env.var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        let endpoint = options
            .endpoint
            .clone()
            .or_else(|| env.var("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env.var("AWS_ENDPOINT_URL"));
        let (endpoint, style) = match endpoint {
            Some(e) => (e, UrlStyle::Path),
            None if bucket.contains('.') => (aws_endpoint(&region), UrlStyle::Path),
            None => (aws_endpoint(&region), UrlStyle::VirtualHost),
        };
        let url: url::Url = endpoint
            .parse()
            .map_err(|e| invalid(format!("endpoint {endpoint}: {e}")))?;
        if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
            return Err(invalid(format!(
                "endpoint {}: no user, password or query in an endpoint (credentials come from \
                 the environment or files)",
                super::target::display_name(&endpoint)
            )));
        }
        let bucket = Bucket::new(url, style, bucket.to_string(), region)
            .map_err(|e| invalid(format!("endpoint {endpoint}: {e:?}")))?;
        Ok(Self {
            bucket,
            key: key.to_string(),
            credentials,
            display,
        })
    }

    /// The target for `bucket`/`key` with the credentials of the process's environment, its
    /// systemd credentials or the shared credentials file (see [`credentials`]).
    pub fn from_env(bucket: &str, key: &str, options: &S3Options) -> Result<Self, S3Error> {
        let env = credentials::ProcessEnv;
        let creds = credentials::load(&env).map_err(|source| S3Error::Credentials {
            name: format!("s3://{bucket}/{key}"),
            source,
        })?;
        Self::new(bucket, key, options, creds, &env)
    }

    /// The unsigned URL of the object (for messages and tests; carries nothing secret).
    pub fn object_url(&self) -> url::Url {
        self.bucket.object_url(&self.key)
    }

    /// The region requests are signed for.
    pub fn region(&self) -> &str {
        self.bucket.region()
    }

    /// A URL for `method` presigned at `now` (seconds since the epoch).
    fn presign(&self, method: Method, now: jiff::Timestamp) -> url::Url {
        let m = match method {
            Method::Head => rusty_s3::Method::Head,
            Method::Get => rusty_s3::Method::Get,
        };
        let c = &self.credentials;
        rusty_s3::signing::sign(
            &now,
            m,
            self.object_url(),
            c.access_key_id(),
            c.secret_access_key(),
            c.session_token(),
            self.bucket.region(),
            PRESIGN_SECONDS,
            std::iter::empty(),
            std::iter::empty(),
        )
    }
}

impl RequestTarget for S3Target {
    fn display_name(&self) -> &str {
        &self.display
    }

    fn prepare(&self, method: Method) -> Result<PreparedRequest, RemoteError> {
        Ok(PreparedRequest {
            url: self.presign(method, jiff::Timestamp::now()).into(),
            headers: Vec::new(),
        })
    }
}

fn aws_endpoint(region: &str) -> String {
    format!("https://s3.{region}.amazonaws.com")
}

/// S3's bucket naming rules, loosely (3 to 63 characters of lowercase letters, digits, `.`,
/// `-`, and `_` for older buckets and compatibles), so a name cannot change the URL's path.
fn check_bucket(b: &str) -> Result<(), &'static str> {
    if !(3..=63).contains(&b.len()) {
        return Err("a bucket name has 3 to 63 characters");
    }
    if !b
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'-' | b'_'))
    {
        return Err("a bucket name has only lowercase letters, digits, '.', '-' and '_'");
    }
    Ok(())
}

/// Keys a URL cannot carry unchanged (see rusty-s3's `Bucket` on object keys): empty, or with a
/// `.` or `..` path segment.
fn check_key(k: &str) -> Result<(), &'static str> {
    if k.is_empty() {
        return Err("no object key after the bucket");
    }
    if k.split('/').any(|s| s == "." || s == "..") {
        return Err("an object key with a '.' or '..' segment cannot be addressed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::secret::SecretBytes;

    fn creds(token: Option<&str>) -> S3Credentials {
        S3Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            SecretBytes::from_slice(b"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
            token.map(|t| SecretBytes::from_slice(t.as_bytes())),
            "test",
        )
        .unwrap()
    }

    #[test]
    fn custom_endpoint_is_path_style_and_signs_each_method() {
        let env: &[(&str, &str)] = &[("AWS_REGION", "eu-west-1")];
        let o = S3Options {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: None,
        };
        let t = S3Target::new("images", "os/root.img", &o, creds(None), &env).unwrap();
        assert_eq!(t.display_name(), "s3://images/os/root.img");
        assert_eq!(t.region(), "eu-west-1");
        let at = jiff::Timestamp::from_second(1_369_353_600).unwrap();
        let head = t.presign(Method::Head, at).to_string();
        let get = t.presign(Method::Get, at).to_string();
        assert!(
            head.starts_with("http://127.0.0.1:9000/images/os/root.img?X-Amz-Algorithm="),
            "{head}"
        );
        assert!(head.contains("X-Amz-Expires=300&"), "{head}");
        assert!(head.contains("%2Feu-west-1%2Fs3%2Faws4_request"), "{head}");
        assert_ne!(head, get, "HEAD and GET carry different signatures");
        assert!(!head.contains("wJalr") && !format!("{t:?}").contains("wJalr"));
    }

    #[test]
    fn aws_matches_the_documented_presigned_example() {
        // AWS's SigV4 query-auth example (GET examplebucket/test.txt, 24 May 2013, 86400 s),
        // with our 300 s expiry: checked against rusty-s3's own vector for the host style.
        let env: &[(&str, &str)] = &[];
        let t = S3Target::new(
            "examplebucket",
            "test.txt",
            &S3Options::default(),
            creds(None),
            &env,
        )
        .unwrap();
        assert_eq!(
            t.object_url().as_str(),
            "https://examplebucket.s3.us-east-1.amazonaws.com/test.txt"
        );
        // Dotted buckets go path-style, so the certificate matches.
        let t = S3Target::new("a.b.c", "k", &S3Options::default(), creds(None), &env).unwrap();
        assert_eq!(
            t.object_url().as_str(),
            "https://s3.us-east-1.amazonaws.com/a.b.c/k"
        );
    }

    #[test]
    fn session_token_goes_in_the_signed_query() {
        let env: &[(&str, &str)] = &[("AWS_ENDPOINT_URL", "http://localhost:1")];
        let t = S3Target::new("bkt", "k", &S3Options::default(), creds(Some("TOK")), &env).unwrap();
        let u = t.prepare(Method::Get).unwrap().url;
        assert!(u.starts_with("http://localhost:1/bkt/k?"), "{u}");
        assert!(u.contains("X-Amz-Security-Token=TOK"), "{u}");
    }

    #[test]
    fn bad_names_and_endpoints_are_refused() {
        let env: &[(&str, &str)] = &[];
        let o = S3Options::default();
        for (b, k) in [("B", "k"), ("ab", "k"), ("bkt", ""), ("bkt", "a/../b")] {
            let e = S3Target::new(b, k, &o, creds(None), &env).unwrap_err();
            assert!(e.to_string().starts_with(&format!("s3://{b}/{k}: ")), "{e}");
        }
        let o = S3Options {
            endpoint: Some("http://user:pw@h:1".into()),
            region: None,
        };
        let e = S3Target::new("bkt", "k", &o, creds(None), &env)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw"), "{e}");
    }
}
