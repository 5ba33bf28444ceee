//! The page-aligned I/O buffer for `O_DIRECT`: exporters read into it and assemble writes in
//! it, dm-integrity's format and check read and write their chunks through it, reencryption
//! re-keys its hotzones in it. One type, so alignment is decided once.

/// The alignment of [`AlignedBuf`]: a page.
pub const PAGE: usize = 4096;

/// A heap buffer with a page-aligned window that grows on demand (never shrinks).
pub struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    /// A buffer with an aligned window of `len` bytes.
    pub fn new(len: usize) -> Self {
        let raw = vec![0u8; len + PAGE];
        let off = raw.as_ptr().align_offset(PAGE);
        AlignedBuf { raw, off, len }
    }

    /// Make the window at least `len` bytes long (its contents are lost when it grows).
    pub fn ensure(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
    }

    /// Give the memory back when the window grew beyond `max` (to a window of `max`).
    pub fn cap(&mut self, max: usize) {
        if self.len > max {
            *self = AlignedBuf::new(max);
        }
    }

    /// The first `len` bytes of the window, grown if needed.
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        self.ensure(len);
        &mut self.raw[self.off..self.off + len]
    }

    /// The whole window.
    pub fn all(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }

    /// The window's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole window, read-only.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_aligned_and_grows() {
        let mut b = AlignedBuf::new(100);
        assert_eq!(b.all().as_ptr() as usize % PAGE, 0);
        assert_eq!(b.all().len(), 100);
        assert_eq!(b.get(10000).len(), 10000);
        assert_eq!(b.all().as_ptr() as usize % PAGE, 0);
        assert_eq!(b.as_slice().len(), 10000);
        b.cap(20000);
        assert_eq!(b.all().len(), 10000);
        b.cap(4096);
        assert_eq!(b.all().len(), 4096);
        assert_eq!(b.all().as_ptr() as usize % PAGE, 0);
    }
}
