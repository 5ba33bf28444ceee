//! The cache index: which data block each slot of the `data` file holds, in least recently used
//! order, and its on-disk form (a header, the entries, a SHA-256 of both), checked entirely
//! when loaded so a damaged index is dropped whole instead of trusted in part.

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};

const MAGIC: &[u8; 8] = b"dmkrc\x00\x00\x01";

/// Blocks by slot, with their use order.
pub struct Index {
    block_size: u32,
    slots: u64,
    /// block → (slot, last use).
    by_block: HashMap<u64, (u64, u64)>,
    /// last use → block: the least recently used first.
    by_use: BTreeMap<u64, u64>,
    /// Slots given up by removed blocks.
    free: Vec<u64>,
    /// Slots never used yet start here.
    next_slot: u64,
    tick: u64,
}

impl Index {
    /// An empty index of `slots` slots.
    pub fn new(block_size: u32, slots: u64) -> Self {
        Index {
            block_size,
            slots,
            by_block: HashMap::new(),
            by_use: BTreeMap::new(),
            free: Vec::new(),
            next_slot: 0,
            tick: 0,
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.by_block.len()
    }

    /// (block, slot), least recently used first.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        self.by_use
            .values()
            .map(|b| (*b, self.by_block[b].0))
            .collect()
    }

    /// The slot of `block`, now marked most recently used.
    pub fn touch(&mut self, block: u64) -> Option<u64> {
        let tick = self.tick + 1;
        let (slot, used) = self.by_block.get_mut(&block)?;
        self.by_use.remove(used);
        *used = tick;
        self.by_use.insert(tick, block);
        self.tick = tick;
        Some(*slot)
    }

    /// A slot for `block` (its own if held), evicting the least recently used block when
    /// every slot is taken; returns the slot and whether a block was evicted.
    pub fn assign(&mut self, block: u64) -> (u64, bool) {
        if let Some(slot) = self.touch(block) {
            return (slot, false);
        }
        let (slot, evicted) = if let Some(slot) = self.free.pop() {
            (slot, false)
        } else if self.next_slot < self.slots {
            self.next_slot += 1;
            (self.next_slot - 1, false)
        } else {
            let (_, old) = self.by_use.pop_first().expect("a full index holds a block");
            let (slot, _) = self.by_block.remove(&old).expect("indexed");
            (slot, true)
        };
        self.tick += 1;
        self.by_block.insert(block, (slot, self.tick));
        self.by_use.insert(self.tick, block);
        (slot, evicted)
    }

    /// Forget `block`; whether it was held.
    pub fn remove(&mut self, block: u64) -> bool {
        let Some((slot, used)) = self.by_block.remove(&block) else {
            return false;
        };
        self.by_use.remove(&used);
        self.free.push(slot);
        true
    }

    /// The on-disk form.
    pub fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.len() * 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.block_size as u64).to_le_bytes());
        out.extend_from_slice(&self.slots.to_le_bytes());
        for (block, slot) in self.entries() {
            out.extend_from_slice(&block.to_le_bytes());
            out.extend_from_slice(&slot.to_le_bytes());
        }
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// Parse an index saved for `block_size` and `slots`: `None` unless every byte checks
    /// out (magic, sizes, checksum, slots in range and distinct, blocks distinct).
    pub fn parse(bytes: &[u8], block_size: u32, slots: u64) -> Option<Self> {
        let body_len = bytes.len().checked_sub(32)?;
        let (body, sum) = bytes.split_at(body_len);
        if Sha256::digest(body)[..] != *sum || body.len() < 24 || (body.len() - 24) % 16 != 0 {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if &body[..8] != MAGIC || word(8) != block_size as u64 || word(16) != slots {
            return None;
        }
        let mut index = Index::new(block_size, slots);
        let mut used = vec![false; slots as usize];
        for at in (24..body.len()).step_by(16) {
            let (block, slot) = (word(at), word(at + 8));
            if slot >= slots || used[slot as usize] || index.by_block.contains_key(&block) {
                return None;
            }
            used[slot as usize] = true;
            index.tick += 1;
            index.by_block.insert(block, (slot, index.tick));
            index.by_use.insert(index.tick, block);
        }
        index.next_slot = slots;
        index.free = (0..slots).rev().filter(|s| !used[*s as usize]).collect();
        Some(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_eviction_and_round_trip() {
        let mut i = Index::new(4096, 3);
        assert_eq!(i.assign(10), (0, false));
        assert_eq!(i.assign(11), (1, false));
        assert_eq!(i.assign(12), (2, false));
        assert_eq!(i.touch(10), Some(0));
        // 11 is now the least recently used.
        assert_eq!(i.assign(13), (1, true));
        assert!(i.touch(11).is_none());
        assert!(i.remove(12));
        assert_eq!(i.assign(14), (2, false));
        let bytes = i.serialize();
        let j = Index::parse(&bytes, 4096, 3).unwrap();
        assert_eq!(j.entries(), i.entries());
        let mut bad = bytes.clone();
        bad[30] ^= 1;
        assert!(Index::parse(&bad, 4096, 3).is_none());
        assert!(Index::parse(&bytes, 512, 3).is_none());
        assert!(Index::parse(&bytes[..bytes.len() - 1], 4096, 3).is_none());
    }
}
