//! The dm-verity configuration: format a hash tree over the data file with `dmkit verity
//! format` and open it with `dmkit verity open`; plus the matching `veritysetup format` command
//! line for the format benchmark, and the root-hash line both tools print.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::harness::process::{self as harness, Dmkit, Interrupt};
use crate::bench::BenchError;

/// Parameters of `verity format`, spelt as veritysetup spells them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerityParams {
    /// Hash algorithm (`--hash`).
    pub hash: String,
    /// `--data-block-size`.
    pub data_block_size: u32,
    /// `--hash-block-size`.
    pub hash_block_size: u32,
    /// `--salt` in hex; `None` lets the tool pick a random one.
    pub salt: Option<String>,
}

impl Default for VerityParams {
    /// veritysetup's defaults: sha256, 4096-byte blocks, random salt.
    fn default() -> Self {
        VerityParams {
            hash: "sha256".into(),
            data_block_size: 4096,
            hash_block_size: 4096,
            salt: None,
        }
    }
}

impl VerityParams {
    fn common_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--hash={}", self.hash),
            format!("--data-block-size={}", self.data_block_size),
            format!("--hash-block-size={}", self.hash_block_size),
        ];
        if let Some(s) = &self.salt {
            a.push(format!("--salt={s}"));
        }
        a
    }

    /// `dmkit` arguments: `verity format [options] DATA HASH`.
    pub fn dmkit_format_args(&self, data: &Path, hash: &Path) -> Vec<String> {
        let mut a = vec!["verity".to_string(), "format".to_string()];
        a.extend(self.common_args());
        a.push(data.to_string_lossy().into_owned());
        a.push(hash.to_string_lossy().into_owned());
        a
    }

    /// `veritysetup` arguments: `format [options] --uuid UUID DATA HASH`.
    pub fn veritysetup_format_args(&self, data: &Path, hash: &Path, uuid: &str) -> Vec<String> {
        let mut a = vec!["format".to_string()];
        a.extend(self.common_args());
        a.push(format!("--uuid={uuid}"));
        a.push(data.to_string_lossy().into_owned());
        a.push(hash.to_string_lossy().into_owned());
        a
    }
}

/// The hex root hash from veritysetup-style output (`Root hash:      \t<hex>`).
pub fn parse_root_hash(text: &str) -> Result<String, BenchError> {
    let hex = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Root hash:"))
        .map(str::trim)
        .ok_or_else(|| BenchError::Tool(format!("no 'Root hash:' line in: {}", text.trim())))?;
    if hex.is_empty() || hex.len() & 1 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BenchError::Tool(format!("bad root hash '{hex}'")));
    }
    Ok(hex.to_ascii_lowercase())
}

/// How long a format of the benchmark data may take before it counts as hung.
const FORMAT_TIMEOUT: Duration = Duration::from_secs(1800);

/// One timed format run: the root hash it printed and its wall time.
#[derive(Debug, Clone)]
pub struct Formatted {
    /// Root hash (lowercase hex).
    pub root_hash: String,
    /// Wall time of the command.
    pub elapsed: Duration,
}

/// Run a format command that prints a root hash (any previous hash file is removed first so
/// every run does the same work).
pub fn run_format(
    cmd: &mut Command,
    hash: &Path,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<Formatted, BenchError> {
    harness::remove_file(hash)?;
    let line = harness::command_line(cmd);
    let out = harness::run_ok(cmd, scratch, interrupt, Some(FORMAT_TIMEOUT))?;
    let root_hash =
        parse_root_hash(&out.stdout).map_err(|e| BenchError::Tool(format!("`{line}`: {e}")))?;
    Ok(Formatted {
        root_hash,
        elapsed: out.elapsed,
    })
}

/// `dmkit verity format` over `data` into `hash`; returns the root hash.
pub fn format(
    dmkit: &Dmkit,
    params: &VerityParams,
    data: &Path,
    hash: &Path,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<String, BenchError> {
    let mut cmd = dmkit.command(params.dmkit_format_args(data, hash));
    Ok(run_format(&mut cmd, hash, scratch, interrupt)?.root_hash)
}

/// `dmkit` arguments: `verity open DATA NAME HASH ROOT_HASH`.
pub fn open_args(data: &Path, name: &str, hash: &Path, root_hash: &str) -> Vec<String> {
    vec![
        "verity".into(),
        "open".into(),
        data.to_string_lossy().into_owned(),
        name.into(),
        hash.to_string_lossy().into_owned(),
        root_hash.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_veritysetup_output() {
        // Real veritysetup 2.6.1 output.
        let out = "VERITY header information for h\n\
UUID:            \t11111111-2222-3333-4444-555555555555\n\
Hash type:       \t1\n\
Data blocks:     \t16384\n\
Data block size: \t4096\n\
Hash blocks:     \t129\n\
Hash block size: \t4096\n\
Hash algorithm:  \tsha256\n\
Salt:            \t00112233\n\
Root hash:      \tc6e33c2cb6c0736c04790cc0767d03ed646a01f6cddc2cf52b91c49049590a62\n\
Hash device size: \t532480 [bytes]\n";
        assert_eq!(
            parse_root_hash(out).unwrap(),
            "c6e33c2cb6c0736c04790cc0767d03ed646a01f6cddc2cf52b91c49049590a62"
        );
        assert!(parse_root_hash("Salt: 00\n").is_err());
        assert!(parse_root_hash("Root hash: xyz\n").is_err());
        assert!(parse_root_hash("Root hash:\n").is_err());
    }

    #[test]
    fn command_lines_match() {
        let p = VerityParams {
            salt: Some("00ff".into()),
            ..VerityParams::default()
        };
        let (d, h) = (Path::new("/d"), Path::new("/h"));
        assert_eq!(
            p.dmkit_format_args(d, h),
            [
                "verity",
                "format",
                "--hash=sha256",
                "--data-block-size=4096",
                "--hash-block-size=4096",
                "--salt=00ff",
                "/d",
                "/h"
            ]
        );
        let v = p.veritysetup_format_args(d, h, "u");
        assert_eq!(v[0], "format");
        assert_eq!(v[1..5], p.dmkit_format_args(d, h)[2..6]);
        assert!(v.contains(&"--uuid=u".to_string()));
        assert_eq!(
            open_args(d, "n", h, "ab"),
            ["verity", "open", "/d", "n", "/h", "ab"]
        );
    }
}
