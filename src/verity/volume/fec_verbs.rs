//! The FEC verbs of [`VerityVolume`]: verification that corrects what it can from the FEC
//! area, and repair, which writes the corrected blocks back.

use super::{same_file, Result, VerityVolume, VolumeError};
use crate::verity::fec::correct::Corrector;
use crate::verity::fec::repair::{self, FecOutcome};
use crate::verity::fec::{layout, FecOptions};
use crate::verity::{TreeLayout, VerifyReport};
use std::path::Path;

impl VerityVolume {
    /// [`verify`](Self::verify), and when blocks are corrupt, their correction from the FEC
    /// area at `opts.offset` of `fec` (see [`repair::correct`]): the report before correction
    /// and, when there was something to correct, what FEC made of it.
    pub fn verify_with_fec(
        &self,
        root: &[u8],
        fec: &Path,
        opts: &FecOptions,
    ) -> Result<(VerifyReport, Option<FecOutcome>)> {
        let report = self.verify(root)?;
        if report.ok() || report.root_hash_mismatch {
            return Ok((report, None));
        }
        let fec_dev = crate::block::open_device(fec, true, false)?;
        let (geometry, inputs) = layout(
            &self.params,
            opts,
            &*self.data,
            &*self.hash,
            same_file(&self.hash_path, fec),
            same_file(&self.data_path, fec),
        )?;
        let corrector = Corrector::new(geometry, inputs, &fec_dev, opts.offset)?;
        let tree =
            TreeLayout::new(&self.params).map_err(|e| VolumeError::Invalid(e.to_string()))?;
        let volume = repair::Volume {
            data: &*self.data,
            hash: &*self.hash,
            params: &self.params,
            layout: &tree,
            root,
        };
        let outcome = repair::correct(&volume, &report, &corrector)?;
        Ok((report, Some(outcome)))
    }

    /// [`verify_with_fec`](Self::verify_with_fec), then the corrected blocks written back
    /// into the data and hash devices (unless `dry_run`). The volume must have been opened
    /// with [`open_writable`](Self::open_writable).
    pub fn repair(
        &self,
        root: &[u8],
        fec: &Path,
        opts: &FecOptions,
        dry_run: bool,
    ) -> Result<(VerifyReport, Option<FecOutcome>)> {
        let (report, outcome) = self.verify_with_fec(root, fec, opts)?;
        if let Some(o) = outcome.as_ref().filter(|_| !dry_run) {
            if self.data.read_only() || self.hash.read_only() {
                return Err(VolumeError::Invalid(
                    "verity repair: the volume was opened read-only".into(),
                ));
            }
            let block = u64::from(self.params.data_block_size);
            repair::write_back(o, &*self.data, &*self.hash, block)?;
        }
        Ok((report, outcome))
    }
}
