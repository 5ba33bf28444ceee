//! Options shared by the read-write benchmarks (`bench crypt`, `bench integrity`): each side on
//! its own file in RAM, fio runs alternated between the sides.

use std::path::PathBuf;

use crate::bench::BenchError;

/// What a read-write benchmark runs.
#[derive(Debug, Clone)]
pub struct RwBenchOptions {
    /// Size of each side's data, bytes (a multiple of 1 MiB).
    pub size: u64,
    /// Runs per job and side (alternated).
    pub runs: u32,
    /// Length of one fio run, ms.
    pub runtime_ms: u64,
    /// Where the scratch directory goes (RAM: /dev/shm).
    pub dir: PathBuf,
    /// `--quick`: smaller and shorter (also shortens measurements beside fio).
    pub quick: bool,
    /// Print progress on stderr.
    pub progress: bool,
}

impl RwBenchOptions {
    /// Defaults (`--quick`: smaller and shorter).
    pub fn defaults(quick: bool) -> RwBenchOptions {
        RwBenchOptions {
            size: if quick { 256 << 20 } else { 1 << 30 },
            runs: if quick { 1 } else { 3 },
            runtime_ms: if quick { 2000 } else { 5000 },
            dir: PathBuf::from("/dev/shm"),
            quick,
            progress: false,
        }
    }

    /// Refuse what cannot run.
    pub fn check(&self) -> Result<(), BenchError> {
        if self.size == 0 || !self.size.is_multiple_of(1 << 20) {
            return Err(BenchError::Invalid(format!(
                "--size must be a non-zero multiple of 1 MiB, not {}",
                self.size
            )));
        }
        if self.runs == 0 {
            return Err(BenchError::Invalid("--runs must be at least 1".into()));
        }
        Ok(())
    }
}
