//! The bound printed beside a benchmark's figure: the primitive alone (the tag function, the
//! cipher) on in-memory buffers, on one core and on all of them, measured in the same run, so
//! what a layer loses around its arithmetic is visible.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A primitive's throughput, bytes per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    /// One thread.
    pub one_core: f64,
    /// One thread per CPU this process may run on, all at once (their sum).
    pub all_cores: f64,
    /// How many threads `all_cores` ran.
    pub threads: usize,
}

impl Bound {
    /// "one / all" in MB/s (10^6 bytes), the cell the tables print.
    pub fn cell(&self) -> String {
        format!(
            "{:.0} / {:.0} ({}c)",
            self.one_core / 1e6,
            self.all_cores / 1e6,
            self.threads
        )
    }
}

/// Time `f` (processing `bytes` per call) for about `dur` after a warm-up of a tenth of it;
/// bytes per second.
pub fn rate(dur: Duration, bytes: usize, mut f: impl FnMut()) -> f64 {
    let warm = Instant::now();
    while warm.elapsed() < dur / 10 {
        f();
    }
    // Small calls in runs of 64 between clock reads (a read costs tens of ns).
    let per = if bytes < 65536 { 64 } else { 1 };
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..per {
            f();
        }
        n += per;
        let e = start.elapsed();
        if e >= dur {
            return n as f64 * bytes as f64 / e.as_secs_f64();
        }
    }
}

/// The CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Measure a primitive: `make` builds one worker (its own buffers) whose every call processes
/// `bytes`; it runs alone for `dur`, then one worker per core at once for `dur`.
pub fn measure<F: FnMut() + Send>(
    dur: Duration,
    bytes: usize,
    make: impl Fn() -> F + Sync,
) -> Bound {
    let one_core = rate(dur, bytes, make());
    let threads = cores();
    let all_cores = if threads == 1 {
        one_core
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    let f = make();
                    s.spawn(move || rate(dur, bytes, f))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        })
    };
    Bound {
        one_core,
        all_cores,
        threads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_trivial_primitive() {
        let b = measure(Duration::from_millis(20), 4096, || {
            let mut v = vec![0u8; 4096];
            move || {
                v[0] = v[0].wrapping_add(1);
                std::hint::black_box(&mut v);
            }
        });
        assert!(b.one_core > 0.0 && b.all_cores > 0.0 && b.threads >= 1);
        assert!(b.cell().contains(" / "));
    }
}
