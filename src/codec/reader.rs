//! [`Reader`]: bounds-checked reads from a byte slice.

use super::{Error, Side};

/// A cursor over a byte slice. Every read is checked: past the end it is an
/// [`Error::Truncated`] naming the field, and the cursor does not move.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

/// One integer reader per kind (see `int_kinds!`), all through [`Reader::array`].
macro_rules! ints {
    ($($(#[$doc:meta])* $name:ident: $t:ty = $from:ident, $to:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(&mut self, what: &'static str) -> Result<$t, Error> {
            Ok(<$t>::$from(self.array(what)?))
        }
    )*};
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    /// A reader at byte `pos` of `buf` (for fixed layouts that name fields by offset).
    pub fn at(buf: &'a [u8], pos: usize, what: &'static str) -> Result<Self, Error> {
        let mut r = Reader::new(buf);
        r.seek(pos, what)?;
        Ok(r)
    }

    /// Move the cursor to byte `pos` (at most the end).
    pub fn seek(&mut self, pos: usize, what: &'static str) -> Result<&mut Self, Error> {
        Side::Read.check(what, pos, self.buf.len())?;
        self.at = pos;
        Ok(self)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Error> {
        Side::Read.check(what, n, self.left())?;
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    /// Step over `n` bytes.
    pub fn skip(&mut self, n: usize, what: &'static str) -> Result<&mut Self, Error> {
        self.take(n, what)?;
        Ok(self)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Error> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, Error> {
        Ok(self.take(1, what)?[0])
    }

    int_kinds!(ints {});

    /// Everything left; the cursor moves to the end.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.at..];
        self.at = self.buf.len();
        s
    }

    /// Bytes left to read.
    pub fn left(&self) -> usize {
        self.buf.len() - self.at
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.left() == 0
    }

    /// The cursor: bytes read (or skipped) so far.
    pub fn pos(&self) -> usize {
        self.at
    }
}
