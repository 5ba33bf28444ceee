//! Serve a dm-integrity volume over NBD in the foreground until Ctrl-C, with the library's
//! `IntegrityVolume` and export alone.
//!
//! ```text
//! cargo run --release --example integrity_nbd [IMAGE [ADDRESS]]
//! nbdinfo nbd://127.0.0.1:10809        # or: nbd-client 127.0.0.1 10809 /dev/nbd0
//! ```
//!
//! Without IMAGE (or with `-`), a 64 MiB temporary file is formatted (crc32c tags, journal
//! mode J) first; an IMAGE given must already be formatted (`dmkit integrity format`) with
//! crc32c. ADDRESS is `tcp:[HOST:]PORT` or `unix:PATH` (default `tcp:127.0.0.1:10809`).
//! Every read is checked against its tag; a corrupt sector reads as an I/O error.

use dmkit::export::{self, nbd::NbdConfig, ExportSpec, ServeOptions};
use dmkit::integrity::format::FormatParams;
use dmkit::integrity::volume::{IntegrityVolume, VolumeError};
use dmkit::integrity::{IntegrityOptions, Mode, TagAlgorithm};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let image = args.next().filter(|a| a != "-");
    let address = args
        .next()
        .unwrap_or_else(|| "tcp:127.0.0.1:10809".to_string());
    let tmp = tempfile::tempdir()?;
    let path = match image {
        Some(p) => PathBuf::from(p),
        None => {
            let p = tmp.path().join("integrity.img");
            std::fs::File::create(&p)?.set_len(64 << 20)?;
            let plan = IntegrityVolume::format(
                &p,
                None,
                FormatParams::new(TagAlgorithm::Crc32c),
                |_| Ok::<(), VolumeError>(()),
                &mut |_, _| {},
            )?;
            println!(
                "formatted {}: {} data sectors with {}-byte crc32c tags",
                p.display(),
                plan.geometry.provided_data_sectors(),
                plan.superblock.integrity_tag_size
            );
            p
        }
    };

    let name = format!("integrity-nbd-example-{}", std::process::id());
    let opts = IntegrityOptions::new(&name, Mode::Journal, TagAlgorithm::Crc32c);
    let activated = IntegrityVolume::activate(&path, opts)?;
    let nbd = NbdConfig::new(&address, None, false, export::nbd::DEFAULT_MAX_CONNECTIONS)?;
    let how = ServeOptions {
        fuse: false,
        nbd: Some(nbd),
        loop_device: false,
        direct_io_loop: false,
        threads: 4,
    };
    // Blocks SIGINT/SIGTERM and serves until one arrives, then flushes and closes.
    export::serve_foreground_with(ExportSpec::new(activated, how), |opened| {
        if let Some(uri) = &opened.nbd {
            println!("serving {} at {uri} (Ctrl-C to stop)", path.display());
        }
    })?;
    Ok(())
}
