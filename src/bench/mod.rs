//! Benchmarks: drive real `fio` against our exports and print overhead tables shaped like the
//! published studies' tables (dm-verity/dm-integrity/dm-crypt
//! overhead measured with fio, Cloudflare's dm-crypt study).
//!
//! Two rooms:
//! - [`harness`]: how anything is measured — fio (workloads, command lines, its JSON), the
//!   result model (runs, median and min..max, comparisons), table rendering, the runs and the
//!   alternation of sides, subprocesses with their CPU time, scratch files, exports that always
//!   close, Ctrl-C;
//! - [`scenarios`]: what is measured, one file per `dmkit bench` command and the document it
//!   reproduces (`dmkit bench`, `format`, `integrity`, `verity-integrity`, `crypt` after
//!   Cloudflare's study, `cipher`, `nbd`, `export`, `fsverity-digest`, `fsverity-read`,
//!   `image`).
//!
//! Every dmkit operation runs the `dmkit` executable itself as a subprocess, exactly as a user
//! would, so the benchmark measures what users get.

pub mod harness;
pub mod scenarios;
pub mod seeds;

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad parameters.
    #[error("{0}")]
    Invalid(String),
    /// A required tool is not installed.
    #[error("{0}")]
    Missing(String),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// fio failed or printed something unexpected.
    #[error("fio: {0}")]
    Fio(String),
    /// A subprocess (dmkit, veritysetup) failed.
    #[error("{0}")]
    Tool(String),
    /// Two tools disagree (root hash mismatch).
    #[error("{0}")]
    Mismatch(String),
    /// Stopped by a signal; everything was cleaned up.
    #[error("interrupted")]
    Interrupted,
}

/// Parse a size as `dd`/fio users write it: bytes, or with a binary suffix
/// `K`, `M`, `G`, `T` (optionally followed by `iB` or `B`): `256M`, `2G`, `64MiB`, `4096`.
pub fn parse_size(s: &str) -> Result<u64, BenchError> {
    let bad = || BenchError::Invalid(format!("bad size '{s}' (examples: 4096, 64M, 2G)"));
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("256m").unwrap(), 256 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1k").unwrap(), 1024);
        for bad in ["", "M", "1.5G", "12X", "-1", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
