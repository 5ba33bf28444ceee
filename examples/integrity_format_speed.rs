//! `dmkit integrity format` against its baselines, in one run:
//!
//! - the raw device: `dd if=/dev/zero bs=1M oflag=direct` writing the same size to the same
//!   filesystem (the crc32c target: format at >= 50% of it);
//! - SHA-256 multi-buffer hashing of the same number of 512-byte sectors (each behind a
//!   24-byte prefix, as the tags hash them) on all cores, without I/O (the sha256 target:
//!   format at >= 50% of it).
//!
//! Run with `cargo run --release --example integrity_format_speed -- DIR [SIZE_MIB]`
//! (default 2048 MiB); it creates and deletes `DIR/dd.img` and `DIR/format.img`.

mod common;

use common::mib_s;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(args.get(1).map(String::as_str).unwrap_or("."));
    let mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let bytes = mib << 20;
    let fmt_img = dir.join("format.img");
    let dmkit = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/dmkit");

    let dd = common::dd_direct(dir, mib);
    println!("dd bs=1M oflag=direct          {dd:8.0} MiB/s");

    // Multi-buffer SHA-256 of `bytes` worth of 512-byte sectors on all cores.
    let threads = dmkit::integrity::tags::hashing_threads();
    let chunk = vec![0u8; 16 << 20];
    let prefix = [0x5au8; 24];
    let t = Instant::now();
    let per_thread = bytes / threads as u64;
    std::thread::scope(|s| {
        for _ in 0..threads {
            let chunk = &chunk;
            s.spawn(move || {
                let mut out = vec![0u8; chunk.len() / 512 * 32];
                let mut done = 0;
                while done < per_thread {
                    dmkit::hash::hash_blocks(
                        dmkit::hash::HashAlgorithm::Sha256,
                        &prefix,
                        &[],
                        chunk,
                        512,
                        &mut out,
                    );
                    done += chunk.len() as u64;
                }
            });
        }
    });
    let mb = mib_s(bytes, t.elapsed().as_secs_f64());
    println!(
        "sha256 multi-buffer, {threads} threads {mb:8.0} MiB/s ({})",
        dmkit::hash::sha256_backend()
    );

    // The tags alone (no I/O): what format has to hash.
    let h = dmkit::integrity::TagHasher::new(
        dmkit::integrity::TagAlgorithm::Sha256,
        None,
        Some([1; 16]),
        32,
        512,
    )
    .expect("tagger");
    let mut tags = vec![0u8; chunk.len() / 512 * 32];
    let t = Instant::now();
    let mut done = 0u64;
    let mut sector = 0u64;
    while done < bytes {
        h.tag_blocks_parallel(sector, &chunk, &mut tags, threads);
        done += chunk.len() as u64;
        sector += chunk.len() as u64 / 512;
    }
    let tg = mib_s(bytes, t.elapsed().as_secs_f64());
    println!(
        "sha256 tags, {threads} threads        {tg:8.0} MiB/s  {:5.1}% of hashing",
        100.0 * tg / mb
    );

    for alg in ["crc32c", "sha256"] {
        let _ = std::fs::remove_file(&fmt_img);
        let f = std::fs::File::create(&fmt_img).expect("create image");
        f.set_len(bytes).expect("size image");
        drop(f);
        let t = Instant::now();
        let st = Command::new(&dmkit)
            .args(["integrity", "format", "-q", "--integrity", alg])
            .arg(&fmt_img)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("dmkit");
        assert!(st.success());
        let v = mib_s(bytes, t.elapsed().as_secs_f64());
        let base = if alg == "crc32c" { dd } else { mb };
        let what = if alg == "crc32c" { "dd" } else { "hashing" };
        println!(
            "dmkit integrity format {alg:7} {v:8.0} MiB/s  {:5.1}% of {what}",
            100.0 * v / base
        );
    }
    let _ = std::fs::remove_file(&fmt_img);
}
