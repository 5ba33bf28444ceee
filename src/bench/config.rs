//! The configurations a benchmark puts side by side. Each one knows how to prepare its
//! metadata over the shared data file, how to open its export, and its acceptance target.
//! New layers (integrity, crypt) are new variants here.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::harness::{Dmkit, Interrupt};
use super::verity::{self, VerityParams};
use super::BenchError;

/// A stack measured by the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Config {
    /// The data file through a read-only pass-through export (`dmkit linear open`): the
    /// baseline, same file and same export as the others, so the export's cost cancels out.
    Plain,
    /// dm-verity over the data file (`dmkit verity format` + `dmkit verity open`), with its
    /// default verified data cache (the page cache the kernel's dm-verity sits under).
    Verity,
    /// dm-verity hashing every read (`--data-cache 0`): the raw verification cost, as the
    /// kernel pays it for direct I/O. Shown for information, no target.
    #[serde(rename = "verity-cold")]
    VerityCold,
}

impl Config {
    /// Every configuration, in table order.
    pub const ALL: [Config; 3] = [Config::Plain, Config::Verity, Config::VerityCold];

    /// Its name in tables, `--config` and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Config::Plain => "plain",
            Config::Verity => "verity",
            Config::VerityCold => "verity-cold",
        }
    }

    /// Parse a name.
    pub fn from_name(name: &str) -> Result<Config, BenchError> {
        Config::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Config::ALL.iter().map(|c| c.name()).collect();
                BenchError::Invalid(format!(
                    "unknown configuration '{name}' (known: {})",
                    known.join(", ")
                ))
            })
    }

    /// Parse a list; duplicates are errors.
    pub fn parse_list(names: &[String]) -> Result<Vec<Config>, BenchError> {
        let mut out: Vec<Config> = Vec::new();
        for n in names {
            let c = Config::from_name(n.trim())?;
            if out.contains(&c) {
                return Err(BenchError::Invalid(format!(
                    "configuration '{n}' given twice"
                )));
            }
            out.push(c);
        }
        if out.is_empty() {
            return Err(BenchError::Invalid("no configuration given".into()));
        }
        Ok(out)
    }

    /// The project's minimum bandwidth ratio against `plain` on the acceptance workloads.
    pub fn acceptance_target(self) -> Option<f64> {
        match self {
            Config::Plain | Config::VerityCold => None,
            Config::Verity => Some(0.80),
        }
    }

    /// Write this configuration's metadata next to `data` (in `scratch`) and return the
    /// `dmkit` arguments that open it as the export `name`.
    pub fn prepare(
        self,
        dmkit: &Dmkit,
        data: &Path,
        name: &str,
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<Vec<String>, BenchError> {
        match self {
            Config::Plain => Ok(vec![
                "linear".into(),
                "open".into(),
                data.to_string_lossy().into_owned(),
                name.into(),
                "--read-only".into(),
            ]),
            Config::Verity | Config::VerityCold => {
                let hash = scratch.join(format!("{}.hash", self.name()));
                let root = verity::format(
                    dmkit,
                    &VerityParams::default(),
                    data,
                    &hash,
                    scratch,
                    interrupt,
                )?;
                let mut args = verity::open_args(data, name, &hash, &root);
                if self == Config::VerityCold {
                    args.extend(["--data-cache".into(), "0".into()]);
                }
                Ok(args)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        let l = Config::parse_list(&["plain".into(), "verity".into()]).unwrap();
        assert_eq!(l, [Config::Plain, Config::Verity]);
        assert!(Config::parse_list(&["plain".into(), "plain".into()]).is_err());
        assert!(Config::parse_list(&["crypt".into()]).is_err());
        assert!(Config::parse_list(&[]).is_err());
        assert_eq!(Config::Verity.acceptance_target(), Some(0.80));
    }
}
