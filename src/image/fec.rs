//! Which FEC parity an image is opened with: the parity its verity partition's fec_header
//! describes ([`super::fecheader`]), parity named on the command line (in the partition or in
//! a file of its own, as `verity open --fec-device` takes it), or none (`--no-fec`).

use super::fecheader::{self, Found};
use super::inspect::describe_region;
use super::layout::{self, Layout, Region};
use super::{ImageError, Result};
use crate::block::{BlockDevice, Window};
use crate::verity::fec::FecOptions;
use crate::verity::VerityParams;
use serde_json::{json, Value};
use std::path::PathBuf;

/// Where `image open` takes FEC parity from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FecChoice {
    /// From the verity partition, where its fec_header says (no header: no FEC).
    #[default]
    Stored,
    /// No FEC (`--no-fec`): a damaged fec_header is not even read.
    Off,
    /// In the verity partition, at `offset` of it (default: where the tree ends) with `roots`,
    /// whatever the fec_header says (`--fec-offset`/`--fec-roots` without `--fec-device`).
    InPartition {
        /// Parity bytes per codeword.
        roots: u8,
        /// Offset from the partition's start.
        offset: Option<u64>,
    },
    /// In a file of its own, as `verity open --fec-device` takes it.
    Device(PathBuf, FecOptions),
}

/// The FEC an image is opened with.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The FEC device and its options as the verity volume takes them (the offset counted
    /// from the start of that file).
    pub device: (PathBuf, FecOptions),
    /// What `status` shows: where the parity came from and where it is.
    pub details: Value,
    /// The fec_header it was read from, if it was.
    pub stored: Option<fecheader::StoredFec>,
}

/// "partition 2 (root-x86-64-verity)" or the file's name.
fn name(r: &Region) -> String {
    match r.partition {
        Some(_) => format!("{} (root-x86-64-verity)", describe_region(r)),
        None => describe_region(r),
    }
}

/// What the fec_header of `l`'s verity partition says (`Found::None` without one). An invalid
/// header is an error naming the image, the partition and the field.
pub fn stored(l: &Layout, hash: &Region, p: &VerityParams) -> Result<Found> {
    let dev = layout::open_file(&hash.file)?;
    let w = Window::new(&dev as &dyn BlockDevice, hash.offset, hash.size).ok_or_else(|| {
        ImageError::Invalid(format!("{}: hash region out of range", l.image.display()))
    })?;
    fecheader::find(&w, p).map_err(|e| {
        ImageError::Invalid(format!(
            "{}: {}: {e} (give --no-fec to open without FEC, or --fec-offset and --fec-roots \
             to say where the parity is)",
            l.image.display(),
            name(hash)
        ))
    })
}

/// The FEC to open `l` with by `choice`, and the warnings to show (a backup header used,
/// damaged parity, bytes after the tree without a header).
pub fn resolve(
    l: &Layout,
    hash: &Region,
    p: &VerityParams,
    choice: &FecChoice,
) -> Result<(Option<Resolved>, Vec<String>)> {
    let image = l.image.display();
    let mut warnings = Vec::new();
    let in_partition = |opts: FecOptions, from: &str, extra: Value| {
        let file = std::fs::canonicalize(&hash.file).unwrap_or_else(|_| hash.file.clone());
        let mut details = json!({
            "from": from,
            "device": file,
            "partition": hash.partition,
            "roots": opts.roots,
            "offset": opts.offset,
        });
        if let (Some(d), Value::Object(e)) = (details.as_object_mut(), extra) {
            d.extend(e);
        }
        Resolved {
            stored: None,
            device: (
                hash.file.clone(),
                FecOptions {
                    offset: hash.offset + opts.offset,
                    ..opts
                },
            ),
            details,
        }
    };
    let r = match choice {
        FecChoice::Off => None,
        FecChoice::Device(path, opts) => Some(Resolved {
            stored: None,
            device: (path.clone(), *opts),
            details: json!({
                "from": "fec-device",
                "device": path,
                "roots": opts.roots,
                "offset": opts.offset,
            }),
        }),
        FecChoice::InPartition { roots, offset } => {
            let offset = match offset {
                Some(o) => *o,
                None => fecheader::tree_end(p)
                    .map_err(|e| ImageError::Invalid(format!("{image}: {e}")))?,
            };
            let opts = FecOptions {
                roots: *roots,
                offset,
            };
            Some(in_partition(opts, "options", json!({})))
        }
        FecChoice::Stored => match stored(l, hash, p)? {
            Found::None { trailing } => {
                if trailing >= 2 * fecheader::BLOCK {
                    warnings.push(format!(
                        "{image}: {}: {trailing} bytes follow the hash tree but hold no \
                         fec_header: opened without FEC (give --fec-offset and --fec-roots if \
                         they are parity)",
                        name(hash)
                    ));
                }
                None
            }
            Found::Fec(s) => {
                if let Some(why) = &s.primary_damaged {
                    warnings.push(format!(
                        "{image}: {}: {why}; the backup copy at the end of the block was used",
                        name(hash)
                    ));
                }
                if !s.parity_intact {
                    warnings.push(format!(
                        "{image}: {}: the FEC parity does not match the SHA-256 in its \
                         fec_header (damaged parity): it is used all the same, every correction \
                         is checked against the hash tree",
                        name(hash)
                    ));
                }
                let extra = json!({
                    "fec_size": s.header.fec_size,
                    "inp_size": s.header.inp_size,
                    "parity_intact": s.parity_intact,
                    "backup_header": s.primary_damaged.is_some(),
                });
                let options = s.options;
                Some(Resolved {
                    stored: Some(s),
                    ..in_partition(options, "fec_header", extra)
                })
            }
        },
    };
    Ok((r, warnings))
}
