//! JSON as cryptsetup reads and writes it: through json-c 0.16 (Debian 12's libjson-c5).
//!
//! cryptsetup hands the whole JSON area to json-c's tokener in its lenient (non-strict) mode,
//! and what that tokener accepts is part of the on-disk format in practice: single-quoted
//! strings, comments, trailing commas, case-insensitive `true`/`null`/`NaN`/`Infinity`,
//! unpaired `\ud800` escapes (turned into U+FFFD), bytes that are not UTF-8, integers beyond 64
//! bits (clamped), duplicate keys (the last value wins, at the first key's place). A strict
//! parser refuses headers cryptsetup opens, so this module follows the tokener's rules, and
//! keeps strings as bytes and objects in insertion order, as json-c does.
//!
//! Nesting is limited to json-c's default depth of 32, so no input recurses deeper than that.

use std::borrow::Cow;

/// json-c's default nesting limit (`JSON_TOKENER_DEFAULT_DEPTH`).
pub const MAX_DEPTH: usize = 32;

/// A JSON value as json-c holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null` (json-c stores no object for it).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits in an i64 (json-c clamps larger negative ones to `i64::MIN`).
    Int(i64),
    /// A positive integer above `i64::MAX` (clamped to `u64::MAX`).
    UInt(u64),
    /// A number with a fraction or exponent (or NaN / Infinity): its value and the text json-c
    /// writes back for it (the source spelling).
    Double(f64, Vec<u8>),
    /// A string, as bytes (json-c checks no UTF-8; `\u0000` puts a NUL inside).
    Str(Vec<u8>),
    /// An array.
    Array(Vec<Value>),
    /// An object: keys in insertion order, each key once.
    Object(Object),
}

/// A JSON object: (key, value) pairs in the order json-c iterates them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object(pub Vec<(Vec<u8>, Value)>);

impl Object {
    /// The value of `key` (`json_object_object_get_ex`).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|(k, _)| k == key.as_bytes())
            .map(|(_, v)| v)
    }

    /// Adds `key`, or replaces its value in place when it exists (`json_object_object_add`).
    pub fn insert(&mut self, key: Vec<u8>, value: Value) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the object has no members.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Members in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Value)> {
        self.0.iter().map(|(k, v)| (k.as_slice(), v))
    }
}

/// Up to the first NUL, as C code sees a string.
pub fn c_str(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

impl Value {
    /// The object, if this is one.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A member of an object (`None` for other values).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object().and_then(|o| o.get(key))
    }

    /// Whether json-c calls this `json_type_int`.
    pub fn is_int(&self) -> bool {
        matches!(self, Value::Int(_) | Value::UInt(_))
    }

    /// The string bytes (full length), if this is a string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// `json_object_get_string`: a string's bytes up to its first NUL, any other value as
    /// json-c prints it by default, `None` for null.
    pub fn get_string(&self) -> Option<Cow<'_, [u8]>> {
        match self {
            Value::Null => None,
            Value::Str(s) => Some(Cow::Borrowed(c_str(s))),
            other => Some(Cow::Owned(other.to_json(Style::Spaced))),
        }
    }

    /// `json_object_get_int64`.
    pub fn get_int64(&self) -> i64 {
        match self {
            Value::Int(n) => *n,
            Value::UInt(_) => i64::MAX,
            Value::Bool(b) => *b as i64,
            Value::Double(d, _) => {
                if d.is_nan() {
                    // C's conversion of NaN; x86-64 yields this value.
                    i64::MIN
                } else {
                    // Rust's `as` saturates, as json-c's explicit checks do.
                    *d as i64
                }
            }
            Value::Str(s) => parse_c_int64(c_str(s)).unwrap_or(0),
            _ => 0,
        }
    }

    /// `json_object_get_int`: the 64-bit value clamped to 32 bits.
    pub fn get_int(&self) -> i32 {
        match self {
            Value::Double(d, _) if d.is_nan() => i32::MIN,
            Value::Double(d, _) => *d as i32,
            _ => self.get_int64().clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        }
    }

    /// The value as json-c writes it with the given style.
    pub fn to_json(&self, style: Style) -> Vec<u8> {
        let mut out = Vec::new();
        write_value(&mut out, self, style);
        out
    }
}

/// `strtoll` on a C string as json-c's `json_parse_int64` uses it: leading whitespace and a
/// sign, as many digits as follow, clamped on overflow; `None` when no digit was read.
fn parse_c_int64(s: &[u8]) -> Option<i64> {
    let t: &[u8] = {
        let start = s
            .iter()
            .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
            .unwrap_or(s.len());
        &s[start..]
    };
    let (neg, digits) = match t.first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let n = digits.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    let mut v: i128 = 0;
    for &c in &digits[..n] {
        v = (v * 10 + (c - b'0') as i128).min(1 << 64);
    }
    let v = if neg { -v } else { v };
    Some(v.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

/// How [`Value::to_json`] lays out its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE`: what cryptsetup writes to
    /// disk, and what its JSON size check measures.
    Plain,
    /// `JSON_C_TO_STRING_SPACED`: json-c's default, what `json_object_get_string` returns for
    /// a value that is not a string.
    Spaced,
}

fn write_str(out: &mut Vec<u8>, s: &[u8], style: Style) {
    out.push(b'"');
    for &c in s {
        match c {
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' if style == Style::Spaced => out.extend_from_slice(b"\\/"),
            c if c < b' ' => out.extend_from_slice(format!("\\u{c:04x}").as_bytes()),
            c => out.push(c),
        }
    }
    out.push(b'"');
}

fn write_value(out: &mut Vec<u8>, v: &Value, style: Style) {
    let spaced = style == Style::Spaced;
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::UInt(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::Double(_, text) => out.extend_from_slice(text),
        Value::Str(s) => write_str(out, s, style),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if spaced {
                    out.push(b' ');
                }
                write_value(out, x, style);
            }
            out.extend_from_slice(if spaced { b" ]" } else { b"]" });
        }
        Value::Object(o) => {
            out.push(b'{');
            for (i, (k, x)) in o.0.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if spaced {
                    out.push(b' ');
                }
                write_str(out, k, style);
                out.extend_from_slice(if spaced { b": " } else { b":" });
                write_value(out, x, style);
            }
            out.extend_from_slice(if spaced { b" }" } else { b"}" });
        }
    }
}

/// Why the tokener gave up, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// Byte offset in the area.
    pub offset: usize,
    /// What was expected.
    pub what: &'static str,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.what, self.offset)
    }
}

/// Parse a JSON area the way cryptsetup's `parse_json_len` does: one value from the start of
/// `area`, then whitespace and comments. Returns the value and json-c's `char_offset`, the
/// offset where parsing stopped (cryptsetup requires only NULs from there on).
pub fn parse_area(area: &[u8]) -> Result<(Value, usize), ParseError> {
    let mut p = Parser { b: area, pos: 0 };
    // Leading whitespace and comments; a comment cut short here is an error.
    if p.skip_ws(false)? {
        return Err(p.err("JSON text before any value"));
    }
    let v = p.value(0)?;
    p.skip_ws(true)?;
    Ok((v, p.pos))
}

struct Parser<'a> {
    b: &'a [u8],
    pos: usize,
}

const REPLACEMENT: &[u8] = "\u{fffd}".as_bytes();

impl Parser<'_> {
    fn err(&self, what: &'static str) -> ParseError {
        ParseError {
            offset: self.pos,
            what,
        }
    }

    /// The current byte; the end of the area reads as NUL, which no rule accepts.
    fn peek(&self) -> u8 {
        self.b.get(self.pos).copied().unwrap_or(0)
    }

    fn at_end(&self) -> bool {
        self.pos >= self.b.len()
    }

    /// Skip whitespace and comments (json-c's `eatws` state). `after_top` is set after the
    /// top-level value: there a comment cut short by a NUL still ends parsing successfully
    /// (json-c's end-of-input check looks at the state below the comment), one past the NUL;
    /// the end of the area is an error only inside a comment. Returns whether a comment was
    /// cut short by a NUL (only possible when `after_top`).
    fn skip_ws(&mut self, after_top: bool) -> Result<bool, ParseError> {
        loop {
            match self.peek() {
                b' ' | b'\t' | b'\n' | b'\r' if !self.at_end() => self.pos += 1,
                b'/' if !self.at_end() => {
                    self.pos += 1;
                    match self.peek() {
                        b'*' if !self.at_end() => {
                            self.pos += 1;
                            if self.block_comment(after_top)? {
                                return Ok(true);
                            }
                        }
                        b'/' if !self.at_end() => {
                            self.pos += 1;
                            loop {
                                if self.at_end() {
                                    return Err(self.err("end of area inside a comment"));
                                }
                                match self.b[self.pos] {
                                    b'\n' => break,
                                    0 if after_top => {
                                        self.pos += 1;
                                        return Ok(true);
                                    }
                                    0 => return Err(self.err("NUL inside a comment")),
                                    _ => self.pos += 1,
                                }
                            }
                        }
                        _ => return Err(self.err("'/' that starts no comment")),
                    }
                }
                _ => return Ok(false),
            }
        }
    }

    /// A `/* */` comment after its opening. json-c consumes the byte after every `*`, so
    /// `**/` does not close the comment. Returns whether a NUL cut it short.
    fn block_comment(&mut self, after_top: bool) -> Result<bool, ParseError> {
        loop {
            if self.at_end() {
                return Err(self.err("end of area inside a comment"));
            }
            let c = self.b[self.pos];
            self.pos += 1;
            match c {
                0 if after_top => return Ok(true),
                0 => return Err(self.err("NUL inside a comment")),
                b'*' => {
                    if self.at_end() {
                        return Err(self.err("end of area inside a comment"));
                    }
                    let d = self.b[self.pos];
                    self.pos += 1;
                    match d {
                        b'/' => return Ok(false),
                        0 if after_top => return Ok(true),
                        0 => return Err(self.err("NUL inside a comment")),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        match self.peek() {
            b'{' => {
                self.pos += 1;
                self.object(depth)
            }
            b'[' => {
                self.pos += 1;
                self.array(depth)
            }
            q @ (b'"' | b'\'') => {
                self.pos += 1;
                Ok(Value::Str(self.string(q)?))
            }
            b'0'..=b'9' | b'-' => self.number(depth),
            b't' | b'T' | b'f' | b'F' => self.boolean(),
            b'n' | b'N' => self.null_or_nan(),
            b'i' | b'I' => self.infinity(false),
            _ => Err(self.err("a JSON value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        let mut o = Object::default();
        self.skip_ws(false)?;
        loop {
            // Here after '{' or ',': json-c takes '}' in both places (a trailing comma).
            match self.peek() {
                b'}' if !self.at_end() => {
                    self.pos += 1;
                    return Ok(Value::Object(o));
                }
                q @ (b'"' | b'\'') if !self.at_end() => {
                    self.pos += 1;
                    let mut key = self.string(q)?;
                    // The key is strdup()ed: it ends at its first NUL.
                    key.truncate(c_str(&key).len());
                    self.skip_ws(false)?;
                    if self.peek() != b':' || self.at_end() {
                        return Err(self.err("':' after an object key"));
                    }
                    self.pos += 1;
                    self.skip_ws(false)?;
                    if depth + 1 >= MAX_DEPTH {
                        return Err(self.err("JSON nested deeper than 32 levels"));
                    }
                    let v = self.value(depth + 1)?;
                    o.insert(key, v);
                    self.skip_ws(false)?;
                    match self.peek() {
                        b'}' if !self.at_end() => {
                            self.pos += 1;
                            return Ok(Value::Object(o));
                        }
                        b',' if !self.at_end() => {
                            self.pos += 1;
                            self.skip_ws(false)?;
                        }
                        _ => return Err(self.err("',' or '}' in an object")),
                    }
                }
                _ => return Err(self.err("an object key")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        let mut a = Vec::new();
        self.skip_ws(false)?;
        loop {
            if self.peek() == b']' && !self.at_end() {
                self.pos += 1;
                return Ok(Value::Array(a));
            }
            if depth + 1 >= MAX_DEPTH {
                return Err(self.err("JSON nested deeper than 32 levels"));
            }
            a.push(self.value(depth + 1)?);
            self.skip_ws(false)?;
            match self.peek() {
                b']' if !self.at_end() => {
                    self.pos += 1;
                    return Ok(Value::Array(a));
                }
                b',' if !self.at_end() => {
                    self.pos += 1;
                    self.skip_ws(false)?;
                }
                _ => return Err(self.err("',' or ']' in an array")),
            }
        }
    }

    /// A string after its opening quote `q`, up to the same quote.
    fn string(&mut self, q: u8) -> Result<Vec<u8>, ParseError> {
        let mut s = Vec::new();
        loop {
            if self.at_end() {
                return Err(self.err("end of area inside a string"));
            }
            let c = self.b[self.pos];
            self.pos += 1;
            match c {
                0 => return Err(self.err("NUL inside a string")),
                c if c == q => return Ok(s),
                b'\\' => self.escape(&mut s)?,
                c => s.push(c),
            }
        }
    }

    /// One escape after its backslash.
    fn escape(&mut self, s: &mut Vec<u8>) -> Result<(), ParseError> {
        if self.at_end() {
            return Err(self.err("end of area inside a string"));
        }
        let c = self.b[self.pos];
        self.pos += 1;
        match c {
            b'"' | b'\\' | b'/' => s.push(c),
            b'b' => s.push(8),
            b'n' => s.push(b'\n'),
            b'r' => s.push(b'\r'),
            b't' => s.push(b'\t'),
            b'f' => s.push(12),
            b'u' => self.unicode(s)?,
            _ => return Err(self.err("a valid string escape")),
        }
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let c = self.peek();
            let d = (c as char)
                .to_digit(16)
                .filter(|_| !self.at_end())
                .ok_or_else(|| self.err("four hex digits after \\u"))?;
            v = v << 4 | d;
            self.pos += 1;
        }
        Ok(v)
    }

    /// `\uXXXX` after its `u`, with json-c's treatment of surrogates: a pair makes one code
    /// point, anything unpaired becomes U+FFFD.
    fn unicode(&mut self, s: &mut Vec<u8>) -> Result<(), ParseError> {
        let mut u = self.hex4()?;
        loop {
            if (u & 0xFC00) == 0xDC00 {
                s.extend_from_slice(REPLACEMENT);
                return Ok(());
            }
            if (u & 0xFC00) != 0xD800 {
                push_utf8(s, u);
                return Ok(());
            }
            // A high surrogate: only "\u" + a low surrogate completes it.
            if self.peek() != b'\\' || self.at_end() {
                s.extend_from_slice(REPLACEMENT);
                return Ok(());
            }
            self.pos += 1;
            if self.peek() != b'u' || self.at_end() {
                // The backslash starts an ordinary escape.
                s.extend_from_slice(REPLACEMENT);
                return self.escape(s);
            }
            self.pos += 1;
            let next = self.hex4()?;
            if (next & 0xFC00) == 0xDC00 {
                push_utf8(s, (((u & 0x3FF) << 10) | (next & 0x3FF)) + 0x10000);
                return Ok(());
            }
            s.extend_from_slice(REPLACEMENT);
            u = next;
        }
    }

    fn number(&mut self, depth: usize) -> Result<Value, ParseError> {
        let start = self.pos;
        let (mut is_double, mut is_exp) = (false, false);
        let (mut neg_ok, mut pos_ok) = (true, false);
        while !self.at_end() {
            let c = self.b[self.pos];
            let ok = c.is_ascii_digit()
                || (!is_exp && (c == b'e' || c == b'E'))
                || (neg_ok && c == b'-')
                || (pos_ok && c == b'+')
                || (!is_double && c == b'.');
            if !ok {
                break;
            }
            neg_ok = false;
            pos_ok = false;
            match c {
                b'.' => {
                    is_double = true;
                    neg_ok = true;
                    pos_ok = true;
                }
                b'e' | b'E' => {
                    is_exp = true;
                    is_double = true;
                    neg_ok = true;
                    pos_ok = true;
                }
                _ => {}
            }
            self.pos += 1;
        }
        if self.at_end() {
            return Err(self.err("end of area inside a number"));
        }
        let c = self.b[self.pos];
        if depth > 0
            && !matches!(
                c,
                b',' | b']' | b'}' | b'/' | b'I' | b'i' | b' ' | b'\t' | b'\n' | b'\r'
            )
        {
            return Err(self.err("a character that may follow a number"));
        }
        let mut text = self.b[start..self.pos].to_vec();
        if text == b"-" && matches!(c, b'I' | b'i') {
            return self.infinity(true);
        }
        if is_double {
            // json-c trims a dangling exponent or sign ("123e+" reads as 123).
            while text.len() > 1 && matches!(text.last(), Some(b'e' | b'E' | b'-' | b'+')) {
                text.pop();
            }
            return match parse_strtod_whole(&text) {
                Some(d) => Ok(Value::Double(d, text)),
                None => Err(self.err("a number")),
            };
        }
        let digits = text.strip_prefix(b"-").unwrap_or(&text);
        if digits.is_empty() {
            return Err(self.err("a number"));
        }
        let mut v: u128 = 0;
        for &d in digits {
            v = (v * 10 + (d - b'0') as u128).min(1 << 70);
        }
        Ok(if text[0] == b'-' {
            Value::Int(if v > i64::MAX as u128 + 1 {
                i64::MIN
            } else {
                (v as i128).wrapping_neg() as i64
            })
        } else if v <= i64::MAX as u128 {
            Value::Int(v as i64)
        } else {
            Value::UInt(v.min(u64::MAX as u128) as u64)
        })
    }

    /// "true"/"false", any case: decided once the word's length is read; the next byte is
    /// left for the caller.
    fn boolean(&mut self) -> Result<Value, ParseError> {
        for (word, v) in [(&b"true"[..], true), (&b"false"[..], false)] {
            let end = self.pos + word.len();
            if end < self.b.len() && self.b[self.pos..end].eq_ignore_ascii_case(word) {
                self.pos = end;
                return Ok(Value::Bool(v));
            }
        }
        Err(self.err("true or false"))
    }

    /// "null" or "NaN", any case.
    fn null_or_nan(&mut self) -> Result<Value, ParseError> {
        let end = self.pos + 4;
        if end < self.b.len() && self.b[self.pos..end].eq_ignore_ascii_case(b"null") {
            self.pos = end;
            return Ok(Value::Null);
        }
        let end = self.pos + 3;
        if end < self.b.len() && self.b[self.pos..end].eq_ignore_ascii_case(b"nan") {
            self.pos = end;
            return Ok(Value::Double(f64::NAN, b"NaN".to_vec()));
        }
        Err(self.err("null or NaN"))
    }

    /// "Infinity", any case, after an optional '-' already read.
    fn infinity(&mut self, negative: bool) -> Result<Value, ParseError> {
        let end = self.pos + 8;
        if end < self.b.len() && self.b[self.pos..end].eq_ignore_ascii_case(b"infinity") {
            self.pos = end;
            return Ok(if negative {
                Value::Double(f64::NEG_INFINITY, b"-Infinity".to_vec())
            } else {
                Value::Double(f64::INFINITY, b"Infinity".to_vec())
            });
        }
        Err(self.err("Infinity"))
    }
}

fn push_utf8(s: &mut Vec<u8>, u: u32) {
    let ch = char::from_u32(u).expect("not a surrogate, below 0x110000");
    let mut buf = [0u8; 4];
    s.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
}

/// `strtod` that must consume all of `text`: `-?digits[.digits][e[+-]digits]` shapes (the
/// scanner above allows only these characters).
fn parse_strtod_whole(text: &[u8]) -> Option<f64> {
    let t = text
        .strip_prefix(b"-")
        .or_else(|| text.strip_prefix(b"+"))
        .unwrap_or(text);
    let mantissa_end = t
        .iter()
        .position(|&c| c == b'e' || c == b'E')
        .unwrap_or(t.len());
    let (m, e) = t.split_at(mantissa_end);
    let (int, frac) = match m.iter().position(|&c| c == b'.') {
        Some(i) => (&m[..i], &m[i + 1..]),
        None => (m, &m[..0]),
    };
    let all_digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if !all_digits(int) || !all_digits(frac) || (int.is_empty() && frac.is_empty()) {
        return None;
    }
    if let Some(exp) = e.get(1..) {
        let digits = exp
            .strip_prefix(b"-")
            .or_else(|| exp.strip_prefix(b"+"))
            .unwrap_or(exp);
        if digits.is_empty() || !all_digits(digits) {
            return None;
        }
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<(Value, usize), ParseError> {
        let mut area = s.as_bytes().to_vec();
        area.extend_from_slice(&[0; 8]);
        parse_area(&area)
    }

    #[test]
    fn json_c_leniencies() {
        let (v, end) = parse("{'a':TRUE,\"b\":[1,2,],\"c\":nUll,/* x */\"d\":-5,}").unwrap();
        assert_eq!(end, 45);
        let o = v.as_object().unwrap();
        assert_eq!(o.get("a"), Some(&Value::Bool(true)));
        assert_eq!(o.get("c"), Some(&Value::Null));
        assert_eq!(o.get("d"), Some(&Value::Int(-5)));
        assert_eq!(o.get("b").unwrap().as_array().unwrap().len(), 2);
    }

    #[test]
    fn duplicate_keys_keep_the_first_place() {
        let (v, _) = parse(r#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(v.to_json(Style::Plain), br#"{"a":3,"b":2}"#);
    }

    #[test]
    fn surrogates_and_numbers() {
        let (v, _) =
            parse(r#"{"s":"\ud800x","t":"\ud83d\ude00","n":99999999999999999999999}"#).unwrap();
        assert_eq!(
            v.get("s").unwrap().as_bytes().unwrap(),
            "\u{fffd}x".as_bytes()
        );
        assert_eq!(v.get("t").unwrap().as_bytes().unwrap(), "😀".as_bytes());
        assert_eq!(v.get("n"), Some(&Value::UInt(u64::MAX)));
        let (v, _) = parse(r#"{"d":1.50e+}"#).unwrap();
        assert_eq!(v.to_json(Style::Plain), br#"{"d":1.50}"#);
    }

    #[test]
    fn where_parsing_stops() {
        // Whitespace after the value is consumed; the first byte after it is where it stops.
        assert_eq!(parse("{}  ").unwrap().1, 4);
        assert_eq!(parse("{}x").unwrap().1, 2);
        // A comment cut short by the NUL padding ends one past that NUL.
        assert_eq!(parse("{}/* open").unwrap().1, 10);
        assert!(parse("{\"a\":\"x\0\"}").is_err());
        assert!(parse_area(b"{}").is_ok());
        assert!(parse_area(b"{\"a\":1").is_err());
        assert!(parse("{\"a\":1x}").is_err());
        assert!(parse(&"[".repeat(40)).is_err());
        assert!(parse(&format!("{}{}", "[".repeat(31), "]".repeat(31))).is_ok());
        assert!(parse(&format!("{}1{}", "[".repeat(32), "]".repeat(32))).is_err());
    }
}
