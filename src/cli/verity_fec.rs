//! The FEC options of `dmkit verity`, as veritysetup spells them (`--fec-device`,
//! `--fec-offset`, `--fec-roots`), and the lines veritysetup prints about FEC.

use super::ranges::ranges;
use crate::verity::fec::repair::FecOutcome;
use crate::verity::fec::{FecGeometry, FecOptions, DEFAULT_ROOTS};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Forward error correction options. The verity superblock has no FEC fields, so they are
/// given on every command, as with veritysetup.
#[derive(clap::Args, Clone, Default)]
pub struct FecArgs {
    /// FEC device or file: Reed-Solomon parity of the data and the hash tree (created 0600 if
    /// missing; may be the hash device with --fec-offset past the tree).
    #[arg(long)]
    pub fec_device: Option<PathBuf>,
    /// Byte offset of the FEC area in the FEC device.
    #[arg(long, default_value_t = 0, requires = "fec_device")]
    pub fec_offset: u64,
    /// Parity bytes per Reed-Solomon codeword (2 to 24): more corrects more, costs more space.
    #[arg(long, default_value_t = DEFAULT_ROOTS, requires = "fec_device",
          value_parser = clap::value_parser!(u8).range(2..=24))]
    pub fec_roots: u8,
}

impl FecArgs {
    /// The library's options.
    pub fn options(&self) -> FecOptions {
        FecOptions {
            roots: self.fec_roots,
            offset: self.fec_offset,
        }
    }
}

/// What veritysetup prints about a FEC area after "Hash algorithm:".
pub fn header_lines(g: &FecGeometry) -> [String; 2] {
    [
        format!("FEC RS roots:   \t{}", g.roots),
        format!("FEC blocks:     \t{}", g.rounds * u64::from(g.roots)),
    ]
}

/// veritysetup's last line, shown for a FEC area at offset 0 of a file of its own.
pub fn size_line(g: &FecGeometry) -> String {
    format!("FEC device size: \t{} [bytes]", g.parity_bytes())
}

/// The FEC part of `verity format --json`.
pub fn json(g: &FecGeometry, device: &Path, offset: u64) -> Value {
    serde_json::json!({
        "device": device.display().to_string(),
        "offset": offset,
        "roots": g.roots,
        "blocks_covered": g.blocks,
        "rs_blocks": g.rounds * u64::from(g.roots),
        "size": g.parity_bytes(),
    })
}

/// One line on stderr naming the blocks FEC rebuilt ("corrected", "repaired", "would
/// repair"), when there are any.
pub fn report_corrected(o: &FecOutcome, files: [&Path; 3], verb: &str) {
    let [data, hash, fec] = files;
    let mut parts = Vec::new();
    if !o.corrected_data_blocks.is_empty() {
        parts.push(format!(
            "{} data block(s) in {}: {}",
            o.corrected_data_blocks.len(),
            data.display(),
            ranges(&o.corrected_data_blocks, 1)
        ));
    }
    if !o.corrected_hash_blocks.is_empty() {
        parts.push(format!(
            "{} hash block(s) in {}: {}",
            o.corrected_hash_blocks.len(),
            hash.display(),
            ranges(&o.corrected_hash_blocks, 1)
        ));
    }
    if !parts.is_empty() {
        eprintln!("dmkit: {verb} from the FEC device: {}", parts.join("; "));
    }
    if !o.damaged_parity_blocks.is_empty() {
        let fixed = match verb {
            "repaired" => " (written anew from the verified volume)",
            "would repair" => " (repair writes it anew)",
            _ => "",
        };
        eprintln!(
            "dmkit: {}: {} block(s) of the FEC area do not match the verified volume: {}{fixed}",
            fec.display(),
            o.damaged_parity_blocks.len(),
            ranges(&o.damaged_parity_blocks, 1)
        );
    }
}
