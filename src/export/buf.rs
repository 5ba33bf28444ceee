//! The page-aligned I/O buffer every exporter reads into and assembles writes in, so that an
//! `O_DIRECT` backend can use it as is.

/// The alignment of [`AlignedBuf`]: a page.
pub(crate) const PAGE: usize = 4096;

/// A heap buffer with a page-aligned window that grows on demand (never shrinks).
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    /// A buffer with an aligned window of `len` bytes.
    pub(crate) fn new(len: usize) -> Self {
        let raw = vec![0u8; len + PAGE];
        let off = raw.as_ptr().align_offset(PAGE);
        AlignedBuf { raw, off, len }
    }

    /// Make the window at least `len` bytes long (its contents are lost when it grows).
    pub(crate) fn ensure(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
    }

    /// Give the memory back when the window grew beyond `max` (to a window of `max`).
    pub(crate) fn cap(&mut self, max: usize) {
        if self.len > max {
            *self = AlignedBuf::new(max);
        }
    }

    /// The first `len` bytes of the window, grown if needed.
    pub(crate) fn get(&mut self, len: usize) -> &mut [u8] {
        self.ensure(len);
        &mut self.raw[self.off..self.off + len]
    }

    /// The whole window.
    pub(crate) fn all(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }

    /// The whole window, read-only.
    pub(crate) fn as_slice(&self) -> &[u8] {
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
