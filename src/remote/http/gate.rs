//! A counting gate: at most N requests of a client in flight at once, so the pool's kept-alive
//! connections are reused rather than multiplied by readers.

use std::sync::{Condvar, Mutex};

/// Up to `limit` holders at once; more wait.
#[derive(Debug)]
pub(super) struct Gate {
    limit: usize,
    held: Mutex<usize>,
    freed: Condvar,
}

/// One place in the gate, given back when dropped.
pub(super) struct Pass<'a>(&'a Gate);

impl Gate {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            held: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits for a place.
    pub(super) fn enter(&self) -> Pass<'_> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while *held >= self.limit {
            held = self.freed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        *held += 1;
        Pass(self)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut held = self.0.held.lock().unwrap_or_else(|e| e.into_inner());
        *held -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn never_more_than_the_limit_inside() {
        let gate = Gate::new(2);
        let inside = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let _pass = gate.enter();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }
}
