//! Deterministic pseudo-random test data, so that a failing run can be replayed from its seed.

/// The 64-bit golden ratio, used to spread small seeds.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64: a fast generator whose every seed (0 included) gives a good stream.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `len` bytes: each output in little-endian order, the last one cut short.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

/// xorshift64*: a small generator; its state must not be 0.
#[derive(Debug, Clone)]
pub struct XorShift64Star(pub u64);

impl XorShift64Star {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// `n` bytes, the low byte of each output.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `len` fixed pseudo-random bytes for `seed` (any seed, 0 included): test data that is the
/// same on every run. xorshift64*, the high byte of each output.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = XorShift64Star(seed.wrapping_mul(GOLDEN) | 1);
    (0..len).map(|_| (r.next() >> 56) as u8).collect()
}

/// A seed from the clock (nanoseconds since the epoch), different on every run.
pub fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The seed given in the environment variable `var`, to replay a run, if it is set and a number.
pub fn env_seed(var: &str) -> Option<u64> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}
