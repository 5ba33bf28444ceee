//! Base64 as cryptsetup decodes it (its own decoder, taken from systemd): white space — and a
//! NUL, which its `strchr` test also matches — may appear anywhere, padding only at the end of
//! the last group, and the unused bits of a padded group must be zero.

fn sextet(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some((c - b'A') as u32),
        b'a'..=b'z' => Some((c - b'a') as u32 + 26),
        b'0'..=b'9' => Some((c - b'0') as u32 + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0)
}

/// One symbol: `Ok(None)` at the end, `Ok(Some(64))` for '=' padding.
fn next(s: &[u8], i: &mut usize) -> Result<Option<u32>, ()> {
    while *i < s.len() && is_space(s[*i]) {
        *i += 1;
    }
    if *i == s.len() {
        return Ok(None);
    }
    let c = s[*i];
    *i += 1;
    while *i < s.len() && is_space(s[*i]) {
        *i += 1;
    }
    if c == b'=' {
        return Ok(Some(64));
    }
    sextet(c).map(Some).ok_or(())
}

/// Decode `s`, or `None` where cryptsetup's decoder fails.
pub fn decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3 + 3);
    let mut i = 0;
    loop {
        let Some(a) = next(s, &mut i).ok()? else {
            return Some(out);
        };
        let b = next(s, &mut i).ok()??;
        let c = next(s, &mut i).ok()??;
        let d = next(s, &mut i).ok()??;
        if a == 64 || b == 64 {
            return None;
        }
        if c == 64 {
            if d != 64 || b & 15 != 0 || i < s.len() {
                return None;
            }
            out.push((a << 2 | b >> 4) as u8);
            return Some(out);
        }
        if d == 64 {
            if c & 3 != 0 || i < s.len() {
                return None;
            }
            out.push((a << 2 | b >> 4) as u8);
            out.push(((b << 4 | c >> 2) & 0xff) as u8);
            return Some(out);
        }
        out.push((a << 2 | b >> 4) as u8);
        out.push(((b << 4 | c >> 2) & 0xff) as u8);
        out.push(((c << 6 | d) & 0xff) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn cryptsetups_rules() {
        assert_eq!(decode(b"c2FsdA==").unwrap(), b"salt");
        assert_eq!(decode(b" c2Fs\ndA= =\0").unwrap(), b"salt");
        assert_eq!(decode(b"").unwrap(), b"");
        assert!(decode(b"c2FsdA=").is_none());
        assert!(decode(b"c2FsdB==").is_none());
        assert!(decode(b"c2FsdA==x").is_none());
    }
}
