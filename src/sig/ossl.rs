//! OpenSSL errors as one line of text.

use openssl::error::ErrorStack;

/// OpenSSL's error stack as one line: the distinct reasons, in order.
pub(crate) fn ossl_reason(e: &ErrorStack) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut nested_seen = false;
    for err in e.errors() {
        let reason = err.reason().unwrap_or("unknown error");
        if reason == "nested asn1 error" {
            // The ASN.1 decoder reports the whole path outwards; the innermost field says
            // enough, and is attached to the error before it.
            if !nested_seen {
                nested_seen = true;
                if let (Some(last), Some(data)) = (parts.last_mut(), err.data()) {
                    if !data.is_empty() {
                        last.push_str(" (");
                        last.push_str(data);
                        last.push(')');
                    }
                }
            }
            continue;
        }
        let mut s = reason.to_string();
        if let Some(data) = err.data() {
            if !data.is_empty() {
                s.push_str(" (");
                s.push_str(data);
                s.push(')');
            }
        }
        if !parts.contains(&s) {
            parts.push(s);
        }
    }
    let line = if parts.is_empty() {
        "unknown OpenSSL error".to_string()
    } else {
        parts.join("; ")
    };
    one_line(&line)
}

/// Replaces control characters so a message stays on one line.
pub(crate) fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
