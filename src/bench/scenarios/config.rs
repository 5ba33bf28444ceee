//! The configurations a benchmark puts side by side. Each one knows how to prepare its
//! metadata over the shared data file, how to open its export, and its acceptance target.
//! New layers (integrity, crypt) are new variants here.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::verity::{self, VerityParams};
use crate::bench::harness::process::{Dmkit, Interrupt};
use crate::bench::BenchError;

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
    /// dm-crypt plain mode over the data file (`dmkit plain open`, aes-xts-plain64, 512-bit
    /// random key, 4096-byte sectors). The data file holds random bytes, so what it decrypts
    /// to is random too; reads measure the decryption cost, writes (read-write opens) the
    /// encryption cost.
    Crypt,
}

impl Config {
    /// Every configuration, in table order.
    pub const ALL: [Config; 4] = [
        Config::Plain,
        Config::Verity,
        Config::VerityCold,
        Config::Crypt,
    ];

    /// Its name in tables, `--config` and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Config::Plain => "plain",
            Config::Verity => "verity",
            Config::VerityCold => "verity-cold",
            Config::Crypt => "crypt",
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
            // crypt's target is against the cipher-bound (`dmkit bench crypt`), not plain.
            Config::Plain | Config::VerityCold | Config::Crypt => None,
            Config::Verity => Some(0.80),
        }
    }

    /// Whether this configuration can be opened read-write.
    pub fn writable(self) -> bool {
        matches!(self, Config::Plain | Config::Crypt)
    }

    /// Write this configuration's metadata next to `data` (in `scratch`) and return the
    /// `dmkit` arguments that open it read-only as the export `name`.
    pub fn prepare(
        self,
        dmkit: &Dmkit,
        data: &Path,
        name: &str,
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<Vec<String>, BenchError> {
        self.prepare_with(dmkit, data, name, scratch, interrupt, false)
    }

    /// [`prepare`](Self::prepare), read-write when `writable` (an error for read-only
    /// layers such as verity).
    pub fn prepare_with(
        self,
        dmkit: &Dmkit,
        data: &Path,
        name: &str,
        scratch: &Path,
        interrupt: &Interrupt,
        writable: bool,
    ) -> Result<Vec<String>, BenchError> {
        if writable && !self.writable() {
            return Err(BenchError::Invalid(format!(
                "configuration '{}' is read-only",
                self.name()
            )));
        }
        let ro = |mut v: Vec<String>| {
            if !writable {
                v.push("--read-only".into());
            }
            v
        };
        match self {
            Config::Plain => Ok(ro(vec![
                "linear".into(),
                "open".into(),
                data.to_string_lossy().into_owned(),
                name.into(),
            ])),
            Config::Crypt => {
                let key = scratch.join(format!("{name}.key"));
                write_random_key(&key, 64)?;
                Ok(ro(crypt_open_args(data, name, &key, 4096)))
            }
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

/// `dmkit plain open DATA NAME` arguments: aes-xts-plain64, 512-bit key from `key`,
/// `sector_size`-byte sectors with IVs in sector units (as LUKS2 does for large sectors).
pub fn crypt_open_args(data: &Path, name: &str, key: &Path, sector_size: u32) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "plain".into(),
        "open".into(),
        data.to_string_lossy().into_owned(),
        name.into(),
        "--cipher".into(),
        "aes-xts-plain64".into(),
        "--key-size".into(),
        "512".into(),
        "--key-file".into(),
        key.to_string_lossy().into_owned(),
        "--sector-size".into(),
        sector_size.to_string(),
    ];
    if sector_size > 512 {
        v.push("--iv-large-sectors".into());
    }
    v
}

/// Write `len` random bytes to a new file readable only by its owner (a benchmark key).
pub fn write_random_key(path: &Path, len: usize) -> Result<(), BenchError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = crate::crypt::cipher::random_key(len).map_err(|e| BenchError::Io {
        what: "random key".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(&key))
        .map_err(|source| BenchError::Io {
            what: format!("write {}", path.display()),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        let l = Config::parse_list(&["plain".into(), "verity".into()]).unwrap();
        assert_eq!(l, [Config::Plain, Config::Verity]);
        assert!(Config::parse_list(&["plain".into(), "plain".into()]).is_err());
        assert_eq!(
            Config::parse_list(&["crypt".into()]).unwrap(),
            [Config::Crypt]
        );
        assert!(Config::parse_list(&["luks".into()]).is_err());
        assert!(Config::Crypt.writable() && !Config::Verity.writable());
        assert!(Config::parse_list(&[]).is_err());
        assert_eq!(Config::Verity.acceptance_target(), Some(0.80));
    }
}
