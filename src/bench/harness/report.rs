//! What every benchmark hands back: a [`Report`], printed the one way — its JSON (`--json`,
//! every run kept) or its text table.

use serde::Serialize;

use crate::bench::BenchError;

/// A benchmark's whole result: serialisable for `--json`, rendered as a text table otherwise.
pub trait Report: Serialize {
    /// The text table (and acceptance lines) of this result.
    fn render(&self) -> String;
}

/// The text to print for `report`: pretty JSON when `json`, else its table.
pub fn output<R: Report>(report: &R, json: bool) -> Result<String, BenchError> {
    if json {
        let s = serde_json::to_string_pretty(report)
            .map_err(|e| BenchError::Invalid(format!("JSON: {e}")))?;
        Ok(format!("{s}\n"))
    } else {
        Ok(report.render())
    }
}

/// Implements [`Report`] for a report type with its render function.
macro_rules! impl_report {
    ($($t:ty => $render:path),* $(,)?) => {
        $(impl Report for $t {
            fn render(&self) -> String {
                $render(self)
            }
        })*
    };
}

use crate::bench::harness::model::{FormatReport, OverheadReport};
use crate::bench::harness::table::{render_format, render_overhead};
use crate::bench::scenarios::{
    cipher, cloudflare, export, fsverity_digest, fsverity_read, image, integrity, nbd,
    verity_integrity,
};

impl_report! {
    OverheadReport => render_overhead,
    FormatReport => render_format,
    cipher::CipherReport => cipher::render,
    cloudflare::SeedReport => cloudflare::render_seed,
    cloudflare::PeerReport => cloudflare::render_peer,
    integrity::IntegrityReport => integrity::render,
    verity_integrity::VerityIntegrityReport => verity_integrity::render,
    fsverity_read::FsVerityReadReport => fsverity_read::render,
    fsverity_digest::FsvDigestReport => fsverity_digest::render,
    image::ImageBenchReport => image::render,
    nbd::NbdReport => nbd::render,
    export::ExportReport => export::render,
}
