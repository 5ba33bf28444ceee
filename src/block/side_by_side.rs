//! Work on the parts of one request side by side: the calling thread and the
//! [helpers](super::helpers), each taking the next part as it finishes one. The AEAD target and
//! dm-integrity's hashed tags split a large request this way, whether its parts are slices of
//! one buffer or the pieces a journal lends for a write in place.

use crate::block::{BlockError, Result, TaggedPiece};

/// `work` on every one of `jobs` (more of them than `threads`), taken in order by the calling
/// thread and up to `threads - 1` [helpers](super::helpers), each taking the next job as it
/// finishes one: a core that the rest of the process (a journal's write-back, another
/// request) keeps busy takes fewer, so no thread waits long for the last part. The results in
/// order; a job whose thread panicked gives `None`.
pub fn share<T: Send, R: Send>(
    jobs: Vec<T>,
    threads: usize,
    work: &(dyn Fn(T) -> R + Sync),
) -> Vec<Option<R>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let n = jobs.len();
    let jobs: Vec<Mutex<Option<T>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let take = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(job) = jobs.get(i) else { break };
        let job = job.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            let r = work(job);
            *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        }
    };
    super::helpers::alongside(threads.min(n).saturating_sub(1), &take);
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}

/// Shares per thread a request is cut into by [`in_shares`]: each thread takes the next as it
/// finishes one, so a helper that wakes late or is busy elsewhere leaves little for the others
/// to wait on.
const SHARES_PER_THREAD: usize = 4;

/// `buf`, whole units of `unit` bytes, cut into four shares per thread and
/// `work(first unit of the share, share)` run on each by `threads` threads (see [`share`]): a
/// large read whose every share is read and checked by the thread that takes it. The results
/// in order, a share whose thread panicked failing as an I/O error of `device` at byte
/// `offset`.
pub fn in_shares<R: Send>(
    buf: &mut [u8],
    unit: usize,
    threads: usize,
    (device, offset): (&str, u64),
    work: &(dyn Fn(usize, &mut [u8]) -> Result<R> + Sync),
) -> Vec<Result<R>> {
    let per = (buf.len() / unit)
        .div_ceil(threads.max(1) * SHARES_PER_THREAD)
        .max(1)
        * unit;
    let jobs: Vec<_> = buf.chunks_mut(per).enumerate().collect();
    share(jobs, threads, &|(i, s): (usize, &mut [u8])| {
        work(i * per / unit, s)
    })
    .into_iter()
    .map(|r| {
        r.unwrap_or_else(|| {
            Err(BlockError::Io {
                device: device.to_string(),
                offset,
                source: std::io::Error::other("a hashing thread panicked"),
            })
        })
    })
    .collect()
}

/// Smallest part of a request worth handing to another thread: 256 KiB of SHA-256 take some
/// 100 us, waking a helper asleep between requests some tens.
const PART_MIN: usize = 256 << 10;

/// How many threads a request of `bytes` whose every byte is hashed is worked on: one per
/// core, each with at least 256 KiB; one for small requests (as the reads at open,
/// before a daemon forks, where it must have no threads), where the hand-off would cost more
/// than it saves.
pub fn parts_for(bytes: usize) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (bytes / PART_MIN).clamp(1, cores)
}

/// A run of whole sectors of a piece: its byte offset on the device, its data and its tags.
pub type Span<'a> = (u64, &'a mut [u8], &'a mut [u8]);

/// `pieces` cut at sector boundaries into `parts` groups of about the same number of sectors
/// (`ss` bytes of data and `ts` of tags each), in order.
pub fn split_pieces<'a>(
    pieces: &'a mut [TaggedPiece<'_>],
    parts: usize,
    ss: usize,
    ts: usize,
) -> Vec<Vec<Span<'a>>> {
    let total: usize = pieces.iter().map(|p| p.data.len() / ss).sum();
    let per = total.div_ceil(parts.max(1)).max(1);
    let mut groups: Vec<Vec<Span<'a>>> = vec![Vec::new()];
    let mut room = per;
    for p in pieces.iter_mut() {
        let (mut at, mut data, mut tags) = (p.offset, &mut *p.data, &mut *p.tags);
        while !data.is_empty() {
            if room == 0 {
                groups.push(Vec::new());
                room = per;
            }
            let take = (data.len() / ss).min(room);
            let (d, d_rest) = data.split_at_mut(take * ss);
            let (t, t_rest) = tags.split_at_mut(take * ts);
            groups
                .last_mut()
                .expect("one group at least")
                .push((at, d, t));
            (data, tags) = (d_rest, t_rest);
            at += (take * ss) as u64;
            room -= take;
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every unit is handed to exactly one share, which is told its first unit; the results
    /// come back in order; a share whose thread panicked is an I/O error of the request.
    #[test]
    fn shares_cover_every_unit_once_and_a_panic_is_an_io_error() {
        for (units, threads) in [
            (0usize, 2usize),
            (1, 2),
            (37, 1),
            (37, 2),
            (2048, 3),
            (9, 8),
        ] {
            let mut buf = vec![0u8; units * 8];
            let out = in_shares(&mut buf, 8, threads, ("d", 0), &|k, s| {
                for (i, unit) in s.chunks_exact_mut(8).enumerate() {
                    unit.copy_from_slice(&((k + i) as u64 + 1).to_le_bytes());
                }
                Ok(k)
            });
            let firsts: Vec<usize> = out.into_iter().map(|r| r.unwrap()).collect();
            assert!(
                firsts.windows(2).all(|w| w[0] < w[1]),
                "{units}/{threads}: in order"
            );
            for (i, unit) in buf.chunks_exact(8).enumerate() {
                assert_eq!(
                    unit,
                    ((i as u64) + 1).to_le_bytes(),
                    "{units}/{threads}: unit {i}"
                );
            }
        }
        // A panic on a helper (the caller's own panics unwind, see `share`): the caller
        // lingers in its first share so that the helper takes some.
        let caller = std::thread::current().id();
        let mine = std::sync::Mutex::new(Vec::new());
        let mut buf = vec![0u8; 64 * 8];
        let out = in_shares(&mut buf, 8, 2, ("dev", 4096), &|k, _| {
            if std::thread::current().id() != caller {
                panic!("a share's thread dies");
            }
            if k == 0 {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            mine.lock().unwrap().push(k);
            Ok(())
        });
        let mine = mine.into_inner().unwrap();
        let per = 64 / (2 * SHARES_PER_THREAD);
        if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
            assert!(mine.len() < out.len(), "the helper took no share");
        }
        for (i, r) in out.iter().enumerate() {
            if mine.contains(&(i * per)) {
                assert!(r.is_ok(), "share {i}");
            } else {
                assert!(
                    matches!(r, Err(BlockError::Io { device, offset: 4096, .. }) if device == "dev"),
                    "share {i}: {r:?}"
                );
            }
        }
    }

    /// Every sector lands in exactly one group, in order, with its own tags; the groups are
    /// as even as whole sectors allow.
    #[test]
    fn pieces_split_evenly_at_sector_boundaries() {
        let (ss, ts) = (512, 32);
        for sizes in [&[7usize, 3, 9][..], &[1], &[16], &[5, 5], &[2, 1, 1, 1, 6]] {
            for parts in 1..=4 {
                let mut data: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n * ss]).collect();
                let mut tags: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n * ts]).collect();
                let mut offset = 4096;
                let mut pieces: Vec<TaggedPiece> = data
                    .iter_mut()
                    .zip(tags.iter_mut())
                    .map(|(d, t)| {
                        let p = TaggedPiece {
                            offset,
                            data: d,
                            tags: t,
                        };
                        offset += p.data.len() as u64;
                        p
                    })
                    .collect();
                let groups = split_pieces(&mut pieces, parts, ss, ts);
                let total: usize = sizes.iter().sum();
                let per = total.div_ceil(parts);
                let mut next = 4096;
                for (g, group) in groups.iter().enumerate() {
                    let n: usize = group.iter().map(|s| s.1.len() / ss).sum();
                    assert!(n <= per, "{sizes:?} in {parts}: group {g} has {n} > {per}");
                    for (at, d, t) in group {
                        assert_eq!(*at, next, "{sizes:?} in {parts}: out of order");
                        assert_eq!(d.len() / ss, t.len() / ts, "tags follow the data");
                        next += d.len() as u64;
                    }
                }
                assert_eq!(next, 4096 + (total * ss) as u64, "{sizes:?}: all sectors");
                assert_eq!(groups.len(), total.div_ceil(per), "{sizes:?} in {parts}");
            }
        }
    }

    #[test]
    fn jobs_run_in_order_on_any_thread() {
        for threads in 0..4 {
            let out = share((0..37u32).collect(), threads, &|x| x * 3);
            assert_eq!(out, (0..37).map(|x| Some(x * 3)).collect::<Vec<_>>());
        }
    }
}
