//! Format a dm-verity hash tree for a data file, verify it, then flip one byte of the data and
//! watch verification name the corrupt block — with the library's `VerityVolume` alone.
//!
//! ```text
//! cargo run --release --example verity_format_verify [DATA [HASH]]
//! ```
//!
//! Without DATA, a 1 MiB file of pseudo-random bytes is made in a temporary directory; without
//! HASH, the tree goes to a temporary file. The data file given is modified (one byte flipped
//! and flipped back), so give a copy.

use dmkit::verity::volume::{Backing, ParamsSource, VerityVolume, VolumeError};
use dmkit::verity::TreeSpec;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let tmp = tempfile::tempdir()?;
    let data = match args.first() {
        Some(p) => p.clone(),
        None => {
            let p = tmp.path().join("data.img");
            let mut bytes = vec![0u8; 1 << 20];
            getrandom::getrandom(&mut bytes).map_err(|e| e.to_string())?;
            std::fs::write(&p, bytes)?;
            p
        }
    };
    let hash = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| tmp.path().join("hash.img"));

    // veritysetup's defaults (sha256, 4 KiB blocks, a superblock), a random salt.
    let data_dev = dmkit::block::open_device(&data, true, false)?;
    let mut salt = vec![0u8; 32];
    getrandom::getrandom(&mut salt).map_err(|e| e.to_string())?;
    let params = TreeSpec::default().params(&data_dev, salt)?;
    drop(data_dev);
    let root = VerityVolume::format(&data, &hash, &params, || Ok::<(), VolumeError>(()))?;
    println!("root hash: {}", hex::encode(&root));

    let verify = || -> Result<bool, VolumeError> {
        let volume = VerityVolume::open(
            Backing::whole(&data),
            Backing::whole(&hash),
            ParamsSource::Superblock { hash_offset: 0 },
            false,
        )?;
        let report = volume.verify(&root)?;
        if !report.ok() {
            println!(
                "  corrupt data blocks: {:?}, corrupt hash blocks: {:?}",
                report.corrupt_data_blocks, report.corrupt_hash_blocks
            );
        }
        Ok(report.ok())
    };
    println!("verify: {}", if verify()? { "ok" } else { "FAILED" });

    // Flip one byte in the third data block; verification must fail, naming block 2.
    let offset = 2 * u64::from(params.data_block_size) + 100;
    flip(&data, offset)?;
    let ok = verify()?;
    println!(
        "after flipping byte {offset}: {}",
        if ok {
            "ok (unexpected!)"
        } else {
            "FAILED, as it must"
        }
    );
    flip(&data, offset)?;
    if ok {
        return Err("verification missed a flipped byte".into());
    }
    Ok(())
}

/// Invert the byte at `offset` of `path`.
fn flip(path: &Path, offset: u64) -> std::io::Result<()> {
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset)?;
    b[0] ^= 0xff;
    f.write_all_at(&b, offset)?;
    f.sync_data()
}
