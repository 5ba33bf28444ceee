//! Where a request for an object goes: a fixed URL, or one signed afresh for each request (S3).
//! The HTTP transport asks its [`RequestTarget`] before every request, so a signature never
//! outlives its validity and credentials stay with the target.

use super::RemoteError;

/// The two requests a transport sends for an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `HEAD`, at open, to pin the length and ETag.
    Head,
    /// `GET` of a byte range.
    Get,
}

/// One request, ready to send: the URL (may carry a presigned query) and extra headers (for
/// example `x-amz-security-token`). The transport adds `Range` and `If-Match` itself.
pub struct PreparedRequest {
    /// The full URL, possibly with a signature in its query: never logged.
    pub url: String,
    /// Extra headers, possibly secret: never logged.
    pub headers: Vec<(String, String)>,
}

/// Makes the request for each `HEAD` or `GET` of one object.
pub trait RequestTarget: Send + Sync {
    /// The object's name for messages: no credentials, no query.
    fn display_name(&self) -> &str;
    /// The request to send now.
    fn prepare(&self, method: Method) -> Result<PreparedRequest, RemoteError>;
}

/// A plain `http://` or `https://` URL (a presigned URL given by the user is one too).
pub struct FixedUrl {
    url: String,
    display: String,
}

impl FixedUrl {
    /// A target always sending to `url`; messages name it without its query and userinfo.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            display: display_name(url),
        }
    }
}

impl RequestTarget for FixedUrl {
    fn display_name(&self) -> &str {
        &self.display
    }

    fn prepare(&self, _method: Method) -> Result<PreparedRequest, RemoteError> {
        Ok(PreparedRequest {
            url: self.url.clone(),
            headers: Vec::new(),
        })
    }
}

/// `url` without its query, fragment and `user:password@`, for messages.
pub fn display_name(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let url = &url[..cut];
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_carry_no_secrets() {
        assert_eq!(
            display_name("https://user:pw@example.com:8443/a/b.img?X-Amz-Signature=abc#x"),
            "https://example.com:8443/a/b.img"
        );
        assert_eq!(display_name("http://h/x"), "http://h/x");
        let t = FixedUrl::new("https://h/x?sig=1");
        assert_eq!(t.display_name(), "https://h/x");
        assert_eq!(t.prepare(Method::Get).unwrap().url, "https://h/x?sig=1");
    }
}
