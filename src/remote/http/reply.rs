//! Reading what a server answered: headers, `Content-Range`, and the reason of an error status
//! (an S3 error code from the XML body, an HTML page's title, or the reason phrase).

use std::io::Read;

use ureq::http::Response;
use ureq::Body;

/// A header's value, when present and text.
pub(super) fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// A `Content-Range` header: `bytes FIRST-LAST/TOTAL` (`*` total: unknown) or `bytes */TOTAL`
/// (a 416's).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ContentRange {
    /// First and last byte sent, when a range was sent.
    pub range: Option<(u64, u64)>,
    /// The object's length, when given.
    pub total: Option<u64>,
}

/// Parses a `Content-Range` value; `None` when it is not one.
pub(super) fn content_range(value: &str) -> Option<ContentRange> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    let range = match range.trim() {
        "*" => None,
        r => {
            let (a, b) = r.split_once('-')?;
            let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
            if b < a {
                return None;
            }
            Some((a, b))
        }
    };
    Some(ContentRange { range, total })
}

/// `s` on one line, printable, at most 200 characters (what a server says goes into messages).
pub(super) fn one_line(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match s.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s,
    }
}

/// The text between `<tag>` and `</tag>` in `body`, if any.
fn element<'a>(body: &'a str, tag: &str) -> Option<&'a str> {
    let start = body.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = body[start..].find(&format!("</{tag}>"))? + start;
    Some(body[start..end].trim()).filter(|s| !s.is_empty())
}

/// Why the server answered `resp` with an error status, in one line: `Code: Message` of an S3
/// XML error, the `<title>` of an HTML page, or the status's reason phrase. Reads at most 8 KiB
/// of the body.
pub(super) fn reason(resp: Response<Body>) -> String {
    let status = resp.status();
    let phrase = status.canonical_reason().unwrap_or("").to_string();
    let mut body = Vec::new();
    // A failed read leaves what came: the reason phrase stands in.
    let _ = resp
        .into_body()
        .into_reader()
        .take(8192)
        .read_to_end(&mut body);
    let body = String::from_utf8_lossy(&body);
    let said = match (element(&body, "Code"), element(&body, "Message")) {
        (Some(code), Some(msg)) => format!("{code}: {msg}"),
        (Some(code), None) => code.to_string(),
        _ => match element(&body, "title") {
            // nginx titles its pages "400 Bad Request": the status is printed already.
            Some(t) => t
                .strip_prefix(status.as_str())
                .map_or(t, str::trim_start)
                .to_string(),
            None => phrase,
        },
    };
    one_line(&said)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse() {
        assert_eq!(
            content_range("bytes 0-99/1000"),
            Some(ContentRange {
                range: Some((0, 99)),
                total: Some(1000)
            })
        );
        assert_eq!(
            content_range("bytes */1000"),
            Some(ContentRange {
                range: None,
                total: Some(1000)
            })
        );
        assert_eq!(content_range("bytes 5-4/10"), None);
        assert_eq!(content_range("items 0-1/2"), None);
        assert_eq!(content_range("bytes 0-1"), None);
    }

    #[test]
    fn reasons_are_one_short_line() {
        assert_eq!(one_line("a\r\nb\t c"), "a b c");
        assert_eq!(one_line(&"x".repeat(300)).len(), 203);
        let xml = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
        assert_eq!(element(xml, "Code"), Some("AccessDenied"));
        assert_eq!(
            element("<html><title>403 Forbidden</title>", "title"),
            Some("403 Forbidden")
        );
    }
}
