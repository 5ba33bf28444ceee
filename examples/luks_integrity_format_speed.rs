//! `dmkit luks format --integrity hmac-sha256` (with its initialisation of every sector)
//! against its bound, measured in the same run:
//!
//! - the disk: `dd if=/dev/zero bs=1M oflag=direct` writing the same size to the same
//!   filesystem;
//! - the crypto: sealing zero 512-byte sectors (XTS + HMAC-SHA-256, the tags dm-integrity
//!   stores) on all cores, without I/O;
//! - the bound: both at once, disk × crypto / (disk + crypto), and the documents' 3.8 MiB/s
//!   (cryptsetup wiping through the kernel's stack, SEEDS.md seed 000).
//!
//! Run with `cargo run --release --example luks_integrity_format_speed -- DIR [SIZE_MIB]`
//! (default 2048 MiB); it creates and deletes `DIR/dd.img` and `DIR/luks.img`.

use dmkit::crypt::cipher::{AeadKind, SectorAead};
mod common;

use common::mib_s;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// cryptsetup's LUKS2 `--integrity hmac-sha256` wipe in the documents, MiB/s.
const DOCUMENTS_MIB_S: f64 = 3.8;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(args.get(1).map(String::as_str).unwrap_or("."));
    let mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let bytes = mib << 20;
    let img = dir.join("luks.img");
    let dmkit = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/dmkit");

    let disk = common::dd_direct(dir, mib);
    println!("disk: dd bs=1M oflag=direct            {disk:8.0} MiB/s");

    // Sealing on all cores: what the initialisation computes.
    let kind = AeadKind::from_luks2("aes-xts-plain64", "hmac(sha256)").expect("pair");
    let key: Vec<u8> = (0..96u8).collect();
    let aead = SectorAead::new(kind, &key, 512).expect("sealer");
    let threads = dmkit::integrity::tags::hashing_threads();
    let chunk = 4usize << 20;
    let per_thread = bytes / threads as u64;
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let aead = &aead;
            s.spawn(move || {
                let mut data = vec![0u8; chunk];
                let mut tags = vec![0u8; chunk / 512 * 32];
                let mut done = 0u64;
                while done < per_thread {
                    data.fill(0);
                    aead.seal_sectors(done / 512, &mut data, &mut tags, 32)
                        .expect("seal");
                    done += chunk as u64;
                }
            });
        }
    });
    let crypto = mib_s(bytes, t.elapsed().as_secs_f64());
    println!("crypto: xts + hmac-sha256, {threads} threads  {crypto:8.0} MiB/s");
    let bound = disk * crypto / (disk + crypto);
    println!("bound: disk x crypto / (disk + crypto) {bound:8.0} MiB/s");

    let _ = std::fs::remove_file(&img);
    let f = std::fs::File::create(&img).expect("create image");
    f.set_len(bytes + (16 << 20)).expect("size image");
    drop(f);
    let pass = dir.join("luks.pass");
    std::fs::write(&pass, "speed").expect("passphrase file");
    let t = Instant::now();
    let st = Command::new(&dmkit)
        .args([
            "luks",
            "format",
            "-q",
            "--integrity",
            "hmac-sha256",
            "--sector-size",
            "512",
        ])
        .args([
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
        ])
        .arg(&pass)
        .arg(&img)
        .status()
        .expect("dmkit");
    assert!(st.success());
    // Flushed by format itself; the data area is what was initialised.
    let v = mib_s(bytes, t.elapsed().as_secs_f64());
    println!(
        "dmkit luks format --integrity hmac-sha256 {v:8.0} MiB/s  {:5.1}% of the bound, {:6.0}x the documents' {DOCUMENTS_MIB_S} MiB/s",
        100.0 * v / bound,
        v / DOCUMENTS_MIB_S
    );
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&pass);
}
