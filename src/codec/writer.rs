//! [`Writer`] (appending to a `Vec<u8>`) and [`SliceWriter`] (into a fixed slice at offsets).

use super::{Error, Side};

/// Appends encoded fields to a growing buffer; it cannot fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writer {
    buf: Vec<u8>,
}

/// Integer writers for a writer type: `grow` ones return `&mut Self`, `fixed` ones a `Result`.
macro_rules! ints {
    ($wrap:ident; $($(#[$doc:meta])* $name:ident: $t:ty = $from:ident, $to:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(&mut self, v: $t) -> ints!(@ret $wrap) {
            ints!(@put $wrap, self, &v.$to(), stringify!($name))
        }
    )*};
    (@ret grow) => { &mut Self };
    (@ret fixed) => { Result<&mut Self, Error> };
    (@put grow, $s:ident, $b:expr, $what:expr) => { $s.bytes($b) };
    (@put fixed, $s:ident, $b:expr, $what:expr) => { $s.bytes($b, $what) };
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    /// Append raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    /// Append `n` zero bytes.
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.buf.resize(self.buf.len() + n, 0);
        self
    }

    /// Append one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    int_kinds!(ints { grow; });

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Drop what was written after the first `len` bytes (undo a field that did not fit).
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// What was written.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The buffer.
    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }
}

/// Writes fields into a fixed slice at a cursor, as a header is filled in at its offsets; a
/// write past the end is an [`Error::NoRoom`] and writes nothing.
#[derive(Debug)]
pub struct SliceWriter<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> SliceWriter<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceWriter { buf, at: 0 }
    }

    /// Move the cursor to byte `pos` (at most the end).
    pub fn seek(&mut self, pos: usize, what: &'static str) -> Result<&mut Self, Error> {
        Side::Write.check(what, pos, self.buf.len())?;
        self.at = pos;
        Ok(self)
    }

    /// Write raw bytes at the cursor.
    pub fn bytes(&mut self, b: &[u8], what: &'static str) -> Result<&mut Self, Error> {
        Side::Write.check(what, b.len(), self.left())?;
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
        Ok(self)
    }

    /// Write `n` zero bytes at the cursor.
    pub fn zeros(&mut self, n: usize, what: &'static str) -> Result<&mut Self, Error> {
        Side::Write.check(what, n, self.left())?;
        self.buf[self.at..self.at + n].fill(0);
        self.at += n;
        Ok(self)
    }

    /// Write one byte at the cursor.
    pub fn u8(&mut self, v: u8) -> Result<&mut Self, Error> {
        self.bytes(&[v], "u8")
    }

    int_kinds!(ints { fixed; });

    /// Bytes between the cursor and the end.
    pub fn left(&self) -> usize {
        self.buf.len() - self.at
    }

    /// The cursor.
    pub fn pos(&self) -> usize {
        self.at
    }
}
