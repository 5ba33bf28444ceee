//! Telling a wrong `--integrity` algorithm or key from corruption, the one way `open` and
//! `verify` share: read a few blocks spread over the device; when not one of them has a valid
//! tag, nothing written with this algorithm and key is there to read, and the cause is the
//! algorithm or key, not the data (corruption that hits every sampled block, spread over the
//! whole device, is not what a bit flip or a torn write looks like).

/// How many blocks are sampled at most.
pub const SAMPLES: u64 = 16;

/// The blocks to sample on a device of `blocks` blocks: up to [`SAMPLES`], evenly spread
/// from block 0.
pub fn sample_blocks(blocks: u64) -> impl Iterator<Item = u64> {
    let n = blocks.min(SAMPLES);
    let step = blocks.checked_div(n).unwrap_or(0);
    (0..n).map(move |k| k * step)
}

/// The reason given when no sampled block has a valid tag of `algorithm` (its kernel or
/// command-line name): the caller prefixes the device and may add what else can be done.
pub fn wrong_key_reason(algorithm: &str) -> String {
    format!(
        "no sampled sector has a valid {algorithm} tag: wrong --integrity algorithm or key \
         (or a device formatted with --no-wipe and never written)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_spread_and_in_range() {
        assert_eq!(sample_blocks(0).count(), 0);
        assert_eq!(sample_blocks(3).collect::<Vec<_>>(), [0, 1, 2]);
        let v: Vec<u64> = sample_blocks(16156).collect();
        assert_eq!(v.len(), 16);
        assert_eq!(v[1], 16156 / 16);
        assert!(v.iter().all(|&b| b < 16156));
    }
}
