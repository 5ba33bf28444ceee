//! Where a file named on the command line lives: a local path, an `http(s)://` URL, or an
//! `s3://bucket/key` object (whose request target the S3 module makes, with its endpoint and
//! credentials).

use std::fmt;
use std::path::PathBuf;

use super::target::display_name;

/// A file argument, parsed.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A local file or device (also `file:///path`).
    Local(PathBuf),
    /// An `http://` or `https://` URL, as given (it may carry a presigned query: never shown).
    Http(String),
    /// An object in an S3 bucket.
    S3 {
        /// The bucket.
        bucket: String,
        /// The object key (everything after the bucket's `/`, as given).
        key: String,
    },
}

/// A file argument that names no usable location, in one line (without the URL's secrets).
#[derive(Debug, thiserror::Error)]
#[error("{arg}: {what}")]
pub struct LocationError {
    /// The argument, without credentials or query.
    pub arg: String,
    /// What is wrong.
    pub what: String,
}

/// Whether `b` is a valid S3 bucket name (3 to 63 of `a-z 0-9 . -`, starting and ending with a
/// letter or digit); dots and dashes are checked by the store.
fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && b.starts_with(|c: char| c.is_ascii_alphanumeric())
        && b.ends_with(|c: char| c.is_ascii_alphanumeric())
}

impl Location {
    /// Parses a file argument: `http://`, `https://` and `s3://` (schemes in any case) are
    /// remote, `file://` and anything without `scheme://` is a local path; another scheme is
    /// refused rather than taken for a file name.
    pub fn parse(arg: &str) -> Result<Location, LocationError> {
        let fail = |what: &str| LocationError {
            arg: display_name(arg),
            what: what.to_string(),
        };
        let Some((scheme, rest)) = arg.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(arg)));
        };
        // `./a://b` or `dir/x://y` are paths: a scheme is letters, digits, `+ - .` only.
        let is_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if !is_scheme {
            return Ok(Location::Local(PathBuf::from(arg)));
        }
        match scheme.to_ascii_lowercase().as_str() {
            "http" | "https" => {
                let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
                let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                if host.is_empty() || host.starts_with(':') {
                    return Err(fail("the URL has no host"));
                }
                if rest.contains(char::is_whitespace) {
                    return Err(fail("the URL contains white space (percent-encode it)"));
                }
                Ok(Location::Http(arg.to_string()))
            }
            "s3" => {
                let Some((bucket, key)) = rest.split_once('/') else {
                    return Err(fail("an S3 location is s3://BUCKET/KEY (no key given)"));
                };
                if !valid_bucket(bucket) {
                    return Err(fail(
                        "not a valid S3 bucket name (3 to 63 of a-z, 0-9, '.', '-')",
                    ));
                }
                if key.is_empty() {
                    return Err(fail("an S3 location is s3://BUCKET/KEY (no key given)"));
                }
                Ok(Location::S3 {
                    bucket: bucket.to_string(),
                    key: key.to_string(),
                })
            }
            "file" => {
                if !rest.starts_with('/') {
                    return Err(fail("a file URL is file:///absolute/path"));
                }
                Ok(Location::Local(PathBuf::from(rest)))
            }
            _ => Err(fail(&format!(
                "unknown scheme '{scheme}' (a local path, http://, https:// or s3://)"
            ))),
        }
    }

    /// Whether the file is remote (HTTP or S3).
    pub fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }

    /// The name for messages: a URL without credentials or query; the path as given.
    pub fn display_name(&self) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            Location::Http(url) => display_name(url),
            Location::S3 { bucket, key } => format!("s3://{bucket}/{key}"),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_name())
    }
}

/// Shows [`Location::display_name`], so a presigned URL's signature never reaches a log.
impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({})", self.display_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_urls_and_s3() {
        let p = |s: &str| Location::parse(s).unwrap();
        assert_eq!(p("disk.img"), Location::Local("disk.img".into()));
        assert_eq!(p("./a://b"), Location::Local("./a://b".into()));
        assert_eq!(p("file:///srv/x.img"), Location::Local("/srv/x.img".into()));
        assert_eq!(
            p("HTTPS://h:8443/a.img?sig=1"),
            Location::Http("HTTPS://h:8443/a.img?sig=1".into())
        );
        assert_eq!(
            p("s3://my-bucket/dir/root.img"),
            Location::S3 {
                bucket: "my-bucket".into(),
                key: "dir/root.img".into()
            }
        );
        let e = |s: &str| Location::parse(s).unwrap_err().to_string();
        assert!(e("s3://bucket").contains("no key"));
        assert!(e("s3://bucket/").contains("no key"));
        assert!(e("s3://B_/k").contains("bucket name"));
        assert!(e("ftp://h/x").contains("unknown scheme"));
        assert!(e("https:///x").contains("no host"));
        let secret = e("https://user:pw@/x?X-Amz-Signature=s");
        assert!(
            !secret.contains("pw") && !secret.contains("Signature"),
            "{secret}"
        );
        let debug = format!("{:?}", p("https://h/x?X-Amz-Signature=s"));
        assert!(!debug.contains("Signature"), "{debug}");
    }
}
