//! Capped logging of per-request errors.
//!
//! A reader that retries a corrupt block thousands of times must not write thousands of log
//! lines: like the kernel's rate-limited `DMERR_LIMIT`, each kind of error is logged the first
//! [`LogCap::limit`] times, then once more to say that further ones are only counted. The
//! counters in `status` keep the full numbers.

use std::sync::atomic::{AtomicU64, Ordering};

/// Lines logged per kind of error before the rest are only counted.
pub const DEFAULT_LIMIT: u64 = 100;

/// A capped stream of log lines to stderr (a server's log file).
#[derive(Debug)]
pub struct LogCap {
    what: &'static str,
    limit: u64,
    seen: AtomicU64,
}

impl LogCap {
    /// A cap of `limit` lines for errors described as `what` ("I/O errors", "corruptions").
    pub const fn new(what: &'static str, limit: u64) -> Self {
        LogCap {
            what,
            limit,
            seen: AtomicU64::new(0),
        }
    }

    /// The number of lines written before the rest are only counted.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Log the line `line` makes, unless the cap is reached (then `line` is not even called).
    pub fn log(&self, line: impl FnOnce() -> String) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if n < self.limit {
            eprintln!("dmkit: {}", line());
        } else if n == self.limit {
            eprintln!(
                "dmkit: more than {} {}: further ones are only counted (see `dmkit status`)",
                self.limit, self.what
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_up_to_the_limit_then_only_counts() {
        let cap = LogCap::new("corruptions", 3);
        let mut made = 0;
        for _ in 0..10 {
            cap.log(|| {
                made += 1;
                "x".into()
            });
        }
        assert_eq!(made, 3);
    }
}
