//! Per-thread scratch bytes for the tags of one request, so that the serving path allocates
//! and zeroes nothing per request (a 1 MiB request of 32-byte tags needs 64 KiB of computed
//! tags, 128 KiB with the stored ones beside them).

use std::cell::RefCell;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` with `len` bytes of this thread's scratch (a fresh buffer when the scratch is in
/// use further up this thread's stack). The bytes hold whatever the last user left: `f`
/// must write before it reads.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0);
            }
            f(&mut v[..len])
        }
        Err(_) => f(&mut vec![0u8; len]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_users_get_separate_buffers() {
        with_scratch(16, |a| {
            a.fill(1);
            with_scratch(8, |b| {
                b.fill(2);
                assert_eq!(b.len(), 8);
            });
            assert!(a.iter().all(|&x| x == 1));
        });
        with_scratch(32, |a| assert_eq!(a.len(), 32));
    }
}
