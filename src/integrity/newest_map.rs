//! Which journal entry holds the newest version of each logical block (the kernel's
//! `journal_tree`), kept as runs: a write of n consecutive blocks fills n consecutive journal
//! entries, so it is one run here instead of n tree nodes. A write of 1 MiB is one insertion
//! and its write-back one removal per journal section, where a map of single blocks did 2,048
//! of each (it showed in profiles of mode J as a quarter of the writer's time).

use std::collections::BTreeMap;

/// Blocks `[start, start + len)` are newest at positions `[pos, pos + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    len: u64,
    pos: u32,
}

/// Logical block -> journal position of its newest entry.
#[derive(Debug, Default, Clone)]
pub struct NewestMap {
    /// Keyed by the first block of each run; runs never overlap.
    runs: BTreeMap<u64, Run>,
}

impl NewestMap {
    /// Whether no block is in the journal.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The newest position of `block`, if it is in the journal.
    pub fn get(&self, block: u64) -> Option<u32> {
        let (&start, run) = self.runs.range(..=block).next_back()?;
        (block < start + run.len).then(|| run.pos + (block - start) as u32)
    }

    /// Whether blocks `[block, block + len)` are all newest at `[pos, pos + len)`.
    pub fn maps_run(&self, block: u64, len: u64, pos: u32) -> bool {
        let Some((&start, run)) = self.runs.range(..=block).next_back() else {
            return false;
        };
        block + len <= start + run.len && u64::from(run.pos) + (block - start) == u64::from(pos)
    }

    /// The parts of blocks `[block, block + len)` that are in the journal, in block order, as
    /// (first block, blocks, position of the first).
    pub fn overlapping(&self, block: u64, len: u64) -> Vec<(u64, u64, u32)> {
        let end = block + len;
        let mut out = Vec::new();
        let before = self.runs.range(..block).next_back();
        let from = before.filter(|(&s, r)| s + r.len > block);
        for (&start, run) in from.into_iter().chain(self.runs.range(block..end)) {
            let s = start.max(block);
            let e = (start + run.len).min(end);
            out.push((s, e - s, run.pos + (s - start) as u32));
        }
        out
    }

    /// Record blocks `[block, block + len)` as newest at `[pos, pos + len)` (positions must not
    /// wrap around the end of the journal: split such a write in two).
    pub fn insert(&mut self, block: u64, len: u64, pos: u32) {
        if len == 0 {
            return;
        }
        self.cut(block, len, |_, _| true);
        // A sequential writer appends: extend the run it continues.
        if let Some((&start, run)) = self.runs.range_mut(..block).next_back() {
            if start + run.len == block && u64::from(run.pos) + run.len == u64::from(pos) {
                run.len += len;
                return;
            }
        }
        self.runs.insert(block, Run { len, pos });
    }

    /// Forget those of blocks `[block, block + len)` whose newest position is still
    /// `[pos, pos + len)` (after their write-back; newer entries stay).
    pub fn remove_run(&mut self, block: u64, len: u64, pos: u32) {
        let shift = i128::from(pos) - i128::from(block);
        self.cut(block, len, |start, run| {
            i128::from(run.pos) - i128::from(start) == shift
        });
    }

    /// Unmap blocks `[block, block + len)` from the runs `select(start, run)` picks,
    /// splitting runs that reach past either end.
    fn cut(&mut self, block: u64, len: u64, select: impl Fn(u64, Run) -> bool) {
        let end = block + len;
        let mut hits: Vec<(u64, Run)> = Vec::new();
        if let Some((&start, &run)) = self.runs.range(..block).next_back() {
            if start + run.len > block {
                hits.push((start, run));
            }
        }
        hits.extend(self.runs.range(block..end).map(|(&s, &r)| (s, r)));
        for (start, run) in hits {
            if !select(start, run) {
                continue;
            }
            self.runs.remove(&start);
            if start < block {
                self.runs.insert(
                    start,
                    Run {
                        len: block - start,
                        pos: run.pos,
                    },
                );
            }
            let run_end = start + run.len;
            if run_end > end {
                self.runs.insert(
                    end,
                    Run {
                        len: run_end - end,
                        pos: run.pos + (end - start) as u32,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NewestMap;
    use std::collections::HashMap;

    /// A small deterministic generator (xorshift), so failures replay.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn check(map: &NewestMap, model: &HashMap<u64, u32>, blocks: u64) {
        for b in 0..blocks {
            assert_eq!(map.get(b), model.get(&b).copied(), "block {b}");
        }
        for (first, len) in [(0, blocks), (3, 17), (50, 1), (100, 64)] {
            let mut seen = HashMap::new();
            let mut last_end = first;
            for (b, n, p) in map.overlapping(first, len) {
                assert!(b >= last_end && b + n <= first + len && n > 0);
                last_end = b + n;
                for k in 0..n {
                    seen.insert(b + k, p + k as u32);
                }
            }
            let want: HashMap<u64, u32> = model
                .iter()
                .filter(|(&b, _)| b >= first && b < first + len)
                .map(|(&b, &p)| (b, p))
                .collect();
            assert_eq!(seen, want);
        }
        assert_eq!(map.is_empty(), model.is_empty());
    }

    #[test]
    fn matches_a_map_of_single_blocks_under_random_writes_and_writebacks() {
        for seed in 1..40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut map = NewestMap::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut next_pos = 0u32;
            let mut written: Vec<(u64, u64, u32)> = Vec::new();
            for _ in 0..300 {
                if rng.next(3) > 0 || written.is_empty() {
                    let block = rng.next(200);
                    let most = if rng.next(2) == 0 { 4 } else { 40 };
                    let len = 1 + rng.next(most);
                    map.insert(block, len, next_pos);
                    for k in 0..len {
                        model.insert(block + k, next_pos + k as u32);
                    }
                    written.push((block, len, next_pos));
                    next_pos += len as u32 + rng.next(2) as u32;
                } else {
                    // Write back a piece of the oldest write still listed.
                    let (block, len, pos) = written.remove(0);
                    let skip = rng.next(len);
                    let (b, l, p) = (block + skip, len - skip, pos + skip as u32);
                    let exact = (0..l).all(|k| model.get(&(b + k)) == Some(&(p + k as u32)));
                    assert_eq!(map.maps_run(b, l, p), exact);
                    map.remove_run(b, l, p);
                    for k in 0..l {
                        if model.get(&(b + k)) == Some(&(p + k as u32)) {
                            model.remove(&(b + k));
                        }
                    }
                }
                check(&map, &model, 260);
            }
        }
    }

    #[test]
    fn sequential_writes_stay_one_run() {
        let mut map = NewestMap::default();
        for k in 0..100u64 {
            map.insert(k * 8, 8, (k * 8) as u32);
        }
        assert_eq!(map.runs.len(), 1);
        assert!(map.maps_run(0, 800, 0));
        assert_eq!(map.get(799), Some(799));
        assert_eq!(map.get(800), None);
        map.remove_run(0, 400, 0);
        assert_eq!(map.get(399), None);
        assert_eq!(map.get(400), Some(400));
        assert_eq!(map.runs.len(), 1);
    }

    #[test]
    fn an_overwrite_splits_the_run_and_survives_the_older_write_back() {
        let mut map = NewestMap::default();
        map.insert(0, 10, 0);
        map.insert(4, 2, 50);
        assert_eq!(map.get(3), Some(3));
        assert_eq!(map.get(4), Some(50));
        assert_eq!(map.get(6), Some(6));
        assert!(!map.maps_run(0, 10, 0));
        map.remove_run(0, 10, 0);
        assert_eq!(map.get(0), None);
        assert_eq!(map.get(5), Some(51));
        assert_eq!(map.get(9), None);
    }
}
