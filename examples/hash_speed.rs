//! Single-thread throughput of `dmkit::hash::hash_blocks` against a plain per-block
//! `sha1`/`sha2` loop, on 64 MiB of 4 KiB blocks (the dm-verity data level).
//!
//! Run with `cargo run --release --example hash_speed`.

use std::time::{Duration, Instant};

use dmkit::hash::{hash_blocks, HashAlgorithm};
use sha2::Digest;

const TOTAL: usize = 64 << 20;

/// Best of a few runs of `f`, in GB/s over `bytes`.
fn gbps(bytes: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
    }
    bytes as f64 / best.as_secs_f64() / 1e9
}

fn scalar_loop(alg: HashAlgorithm, prefix: &[u8], blocks: &[u8], bs: usize, out: &mut [u8]) {
    let ds = alg.digest_size();
    for (b, o) in blocks.chunks_exact(bs).zip(out.chunks_exact_mut(ds)) {
        match alg {
            HashAlgorithm::Sha256 => {
                let mut h = sha2::Sha256::new();
                h.update(prefix);
                h.update(b);
                o.copy_from_slice(&h.finalize());
            }
            HashAlgorithm::Sha512 => {
                let mut h = sha2::Sha512::new();
                h.update(prefix);
                h.update(b);
                o.copy_from_slice(&h.finalize());
            }
            HashAlgorithm::Sha1 => {
                let mut h = sha1::Sha1::new();
                h.update(prefix);
                h.update(b);
                o.copy_from_slice(&h.finalize());
            }
        }
    }
}

fn main() {
    let bs = 4096;
    // Deterministic, non-trivial contents.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..TOTAL)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let salt = [0x5au8; 32];
    println!("sha256 backend: {}", dmkit::hash::sha256_backend());
    println!("64 MiB of {bs}-byte blocks, one thread, best of 5:");
    for alg in [
        HashAlgorithm::Sha256,
        HashAlgorithm::Sha512,
        HashAlgorithm::Sha1,
    ] {
        let mut out = vec![0u8; TOTAL / bs * alg.digest_size()];
        for prefix in [&[][..], &salt[..]] {
            let fast = gbps(TOTAL, || {
                hash_blocks(alg, prefix, &[], &data, bs, &mut out);
            });
            let check = out.clone();
            let scalar = gbps(TOTAL, || scalar_loop(alg, prefix, &data, bs, &mut out));
            assert_eq!(check, out, "hash_blocks disagrees with the per-block loop");
            println!(
                "  {:<6} prefix {:>2} B: hash_blocks {:6.3} GB/s, per-block sha1/sha2 {:6.3} GB/s ({:.2}x)",
                alg.name(),
                prefix.len(),
                fast,
                scalar,
                fast / scalar
            );
        }
        // Hash type 0: the salt is a suffix.
        let fast = gbps(TOTAL, || {
            hash_blocks(alg, &[], &salt, &data, bs, &mut out);
        });
        println!(
            "  {:<6} suffix {:>2} B: hash_blocks {:6.3} GB/s",
            alg.name(),
            salt.len(),
            fast
        );
    }
}
