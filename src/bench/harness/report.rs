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

/// Implements [`Report`] for a report type with its render function (each scenario names its
/// own: the harness knows no scenario).
macro_rules! impl_report {
    ($t:ty => $render:path) => {
        impl $crate::bench::harness::report::Report for $t {
            fn render(&self) -> String {
                $render(self)
            }
        }
    };
}
pub(crate) use impl_report;
