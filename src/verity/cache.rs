//! A bounded cache of verified hash blocks, sharded so concurrent readers rarely contend.
//!
//! Eviction is CLOCK (second chance) per shard: cheap, and it keeps the hot upper levels of
//! the tree, which every lookup touches, resident.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const SHARDS: usize = 16;

struct Entry {
    block: u64,
    data: Arc<[u8]>,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    slots: Vec<Entry>,
    index: HashMap<u64, usize>,
    hand: usize,
}

/// Verified hash blocks keyed by their absolute block number.
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

impl BlockCache {
    /// A cache holding at most about `capacity` blocks (at least one per shard).
    pub fn new(capacity: usize) -> Self {
        BlockCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, block: u64) -> std::sync::MutexGuard<'_, Shard> {
        // Neighbouring blocks go to different shards.
        self.shards[(block as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The cached block, if present.
    pub fn get(&self, block: u64) -> Option<Arc<[u8]>> {
        let mut s = self.shard(block);
        let slot = *s.index.get(&block)?;
        let e = &mut s.slots[slot];
        e.referenced = true;
        Some(e.data.clone())
    }

    /// Insert a verified block, evicting another if the shard is full.
    pub fn insert(&self, block: u64, data: Arc<[u8]>) {
        let per_shard = self.per_shard;
        let mut s = self.shard(block);
        if s.index.contains_key(&block) {
            return;
        }
        if s.slots.len() < per_shard {
            let slot = s.slots.len();
            s.slots.push(Entry {
                block,
                data,
                referenced: false,
            });
            s.index.insert(block, slot);
            return;
        }
        loop {
            let hand = s.hand;
            s.hand = (hand + 1) % s.slots.len();
            if s.slots[hand].referenced {
                s.slots[hand].referenced = false;
                continue;
            }
            let old = s.slots[hand].block;
            s.index.remove(&old);
            s.slots[hand] = Entry {
                block,
                data,
                referenced: false,
            };
            s.index.insert(block, hand);
            return;
        }
    }

    /// Number of cached blocks.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).slots.len())
            .sum()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_keeps_referenced() {
        let c = BlockCache::new(16); // one slot per shard
        let a: Arc<[u8]> = Arc::from(vec![1u8]);
        c.insert(0, a.clone());
        assert_eq!(c.get(0).as_deref(), Some(&[1u8][..]));
        c.insert(16, Arc::from(vec![2u8])); // same shard, evicts block 0 after second chance
        assert!(c.get(0).is_none());
        assert_eq!(c.get(16).as_deref(), Some(&[2u8][..]));
        for b in 0..1000 {
            c.insert(b, a.clone());
        }
        assert!(c.len() <= 16);
    }
}
