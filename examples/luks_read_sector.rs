//! Open a LUKS2 image with dmkit's public API, unlock it and print the first decrypted sector
//! in hex.
//!
//! `cargo run --release --example luks_read_sector -- IMAGE PASSPHRASE_FILE` reads an image
//! made by `cryptsetup luksFormat` or `dmkit luks format`; with no arguments a small LUKS2
//! image is formatted in a temporary directory first (with a cheap PBKDF, for the example's
//! sake only: real keyslots want the benchmarked default).

use dmkit::block::BlockDevice;
use dmkit::crypt::luks::{ActivateParams, FormatSpec, Formatter, LuksVolume};
use dmkit::crypt::luks2::{PbkdfKind, PbkdfParams};
use std::error::Error;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _dir;
    let (image, pass) = match args.as_slice() {
        [image, key_file] => (PathBuf::from(image), std::fs::read(key_file)?),
        [] => {
            let dir = tempfile::tempdir()?;
            let image = dir.path().join("luks2.img");
            let pass = b"example passphrase".to_vec();
            format_small_image(&image, &pass)?;
            _dir = dir;
            (image, pass)
        }
        _ => return Err("usage: luks_read_sector [IMAGE PASSPHRASE_FILE]".into()),
    };

    // The header, read with cryptsetup's rules; read-only, so nothing on disk changes.
    let volume = LuksVolume::open(&image, None, false, None)?;
    println!(
        "{}: LUKS{} {}",
        image.display(),
        volume.version(),
        volume.uuid()
    );
    let data = volume.data(true)?;
    let params = ActivateParams {
        name: "example".into(),
        read_only: true,
        ..ActivateParams::default()
    };
    let active = volume.activate(data, &pass, None, &params)?;

    // One encryption sector (4096 bytes for a LUKS2 default, 512 for LUKS1).
    let mut sector = vec![0u8; active.device.logical_block_size() as usize];
    active.device.read_at(&mut sector, 0)?;
    for (i, line) in sector.chunks(32).enumerate() {
        let hex: String = line.iter().map(|b| format!("{b:02x}")).collect();
        println!("{:04x}: {hex}", i * 32);
    }
    Ok(())
}

/// A 20 MiB LUKS2 image (16 MiB of it header and keyslots) with one PBKDF2 keyslot.
fn format_small_image(image: &Path, pass: &[u8]) -> Result<(), Box<dyn Error>> {
    std::fs::File::create(image)?.set_len(20 << 20)?;
    let spec = FormatSpec {
        device: image.to_path_buf(),
        cipher: "aes-xts-plain64".into(),
        pbkdf: PbkdfParams {
            kind: PbkdfKind::Pbkdf2,
            force_iterations: Some(1000),
            ..PbkdfParams::default()
        },
        ..FormatSpec::default()
    };
    Formatter::new(spec)?.format(pass, None, &mut |_, _| {})?;
    Ok(())
}
