//! A copy whose destination bypasses the CPU caches (non-temporal stores): for data written
//! once and not read back soon, such as a reencryption's journal. Ordinary stores first read
//! every destination line into the cache (read-for-ownership) and evict the source from it;
//! streamed stores do neither, so a copy moves two bytes per byte, not three, and the source
//! stays cached for whoever reads it next.

/// Copy `src` into `dst` (same length) with non-temporal stores where the CPU has them,
/// then fence, so the bytes are ordered before any later store (a header commit).
pub fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of x86_64; the lengths are equal (checked above).
        unsafe { x86::stream_copy(dst, src) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// # Safety
    /// `dst.len() == src.len()`.
    pub unsafe fn stream_copy(dst: &mut [u8], src: &[u8]) {
        // The unaligned head of `dst` is copied plainly, then 64-byte lines are streamed,
        // then the tail.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) / 64 * 64;
        let (d, s) = (dst[head..].as_mut_ptr(), src[head..].as_ptr());
        let mut i = 0;
        while i < body {
            // SAFETY: `i + 64 <= body`, within both slices past `head`; `d + i` is
            // 16-byte aligned.
            unsafe {
                let s = s.add(i) as *const __m128i;
                let d = d.add(i) as *mut __m128i;
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            i += 64;
        }
        let done = head + body;
        dst[done..].copy_from_slice(&src[done..]);
        // SAFETY: a fence has no preconditions.
        unsafe { _mm_sfence() };
    }
}

#[cfg(test)]
mod tests {
    use super::stream_copy;

    #[test]
    fn copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..20 {
            for len in [0, 1, 15, 16, 63, 64, 65, 200, 4096, 4900 - off] {
                let mut dst = vec![0u8; 5000];
                stream_copy(&mut dst[off..off + len], &src[..len]);
                assert_eq!(&dst[off..off + len], &src[..len], "off {off} len {len}");
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
