//! Helper threads that sleep until a request hands them work, and go back to sleep as soon as
//! it is done. rayon's pool, used here before, spins (`sched_yield` in a loop) for a while
//! after each job in case another comes: on a server answering one large request after
//! another, that spinning was a sixth of dm-integrity's CPU per GB read, for no throughput.
//!
//! The calling thread always works too, and never waits for a helper that has not started:
//! [`alongside`] takes back the calls no helper picked up yet, so a helper kept busy by another
//! request costs this one nothing but its share of the work, which the caller then does.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// One call of a task by one helper, waiting in the queue.
struct Call {
    /// The task, its lifetime erased: [`alongside`] does not return before every call of it
    /// has either finished or been taken back out of the queue.
    task: *const (dyn Fn() + Sync),
    done: Arc<Latch>,
}

// SAFETY: `task` points to a `Sync` closure that outlives the call (see `Call::task`).
unsafe impl Send for Call {}

/// How many calls of one [`alongside`] are still queued or running.
struct Latch {
    left: Mutex<usize>,
    zero: Condvar,
}

impl Latch {
    fn count_down(&self, by: usize) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        *left -= by;
        if *left == 0 {
            self.zero.notify_all();
        }
    }

    fn wait(&self) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        while *left > 0 {
            left = self.zero.wait(left).unwrap_or_else(|e| e.into_inner());
        }
    }
}

struct Pool {
    queue: Mutex<std::collections::VecDeque<Call>>,
    work: Condvar,
    threads: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1);
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            queue: Mutex::new(Default::default()),
            work: Condvar::new(),
            threads,
        }));
        for i in 0..threads {
            // A helper that cannot be started leaves its share to the callers.
            let _ = std::thread::Builder::new()
                .name(format!("dmkit-helper-{i}"))
                .spawn(move || serve(pool));
        }
        pool
    })
}

fn serve(pool: &Pool) {
    loop {
        let call = {
            let mut q = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(c) = q.pop_front() {
                    break c;
                }
                q = pool.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        // SAFETY: the caller of `alongside` waits for this call before the task goes away.
        let task = unsafe { &*call.task };
        // A panic is the task's own to report (as a missing result); the helper lives on.
        let _ = catch_unwind(AssertUnwindSafe(task));
        call.done.count_down(1);
    }
}

/// Takes back the calls no helper started and waits for the others, also when the caller's
/// own call of the task unwinds.
struct Settle<'a> {
    pool: &'a Pool,
    done: Arc<Latch>,
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        let taken_back = {
            let mut q = self.pool.queue.lock().unwrap_or_else(|e| e.into_inner());
            let before = q.len();
            q.retain(|c| !Arc::ptr_eq(&c.done, &self.done));
            before - q.len()
        };
        if taken_back > 0 {
            self.done.count_down(taken_back);
        }
        self.done.wait();
    }
}

/// Call `task` on this thread and on up to `helpers` helper threads at once, and return once
/// every call has finished. `task` must share its work out itself (each call takes the next
/// part until none is left), since a helper may start late or not at all.
pub fn alongside(helpers: usize, task: &(dyn Fn() + Sync)) {
    let pool = pool();
    let helpers = helpers.min(pool.threads);
    if helpers == 0 {
        return task();
    }
    let done = Arc::new(Latch {
        left: Mutex::new(helpers),
        zero: Condvar::new(),
    });
    // SAFETY (of the lifetime erased here): `Settle` below, dropped before this function
    // returns or unwinds, takes every call of `task` out of the queue or waits for it.
    let erased: *const (dyn Fn() + Sync + '_) = task;
    let erased: *const (dyn Fn() + Sync) = unsafe { std::mem::transmute(erased) };
    {
        let mut q = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..helpers {
            q.push_back(Call {
                task: erased,
                done: done.clone(),
            });
        }
    }
    for _ in 0..helpers {
        pool.work.notify_one();
    }
    let _settle = Settle { pool, done };
    task();
}

#[cfg(test)]
mod tests {
    use super::alongside;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_part_is_done_once_whoever_takes_it() {
        for helpers in 0..4 {
            let next = AtomicUsize::new(0);
            let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            alongside(helpers, &|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(h) = hits.get(i) else { break };
                h.fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn callers_on_many_threads_at_once_each_finish() {
        std::thread::scope(|s| {
            for t in 0..8 {
                s.spawn(move || {
                    for round in 0..200 {
                        let sum = AtomicUsize::new(0);
                        let next = AtomicUsize::new(0);
                        alongside(1, &|| loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= 16 {
                                break;
                            }
                            sum.fetch_add(i + t + round, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 120 + 16 * (t + round));
                    }
                });
            }
        });
    }

    #[test]
    fn a_panic_in_the_callers_own_part_waits_for_the_helpers_first() {
        let started = AtomicUsize::new(0);
        let caller = std::thread::current().id();
        let r = std::panic::catch_unwind(|| {
            alongside(1, &|| {
                started.fetch_add(1, Ordering::SeqCst);
                if std::thread::current().id() == caller {
                    panic!("the caller's own call fails");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            })
        });
        assert!(r.is_err());
        // Returned (unwound) only once the helper's call, if it started, was over.
        let after = started.load(Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(started.load(Ordering::SeqCst), after);
    }
}
