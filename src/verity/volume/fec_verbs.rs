//! The FEC verbs of [`VerityVolume`]: verification that corrects what it can from the FEC
//! area (and checks the area itself), and repair, which writes the corrected blocks back.

use super::{same_file, Result, VerityVolume, VolumeError};
use crate::block::BlockDevice;
use crate::verity::fec::correct::Corrector;
use crate::verity::fec::repair::{self, FecOutcome};
use crate::verity::fec::{layout, FecOptions};
use crate::verity::{TreeLayout, VerifyReport};
use std::path::Path;

impl VerityVolume {
    /// [`verify`](Self::verify) with the FEC area at `opts.offset` of `fec`: corrupt blocks
    /// are corrected from it (see [`repair::correct`]) and, when the volume verifies, the
    /// area itself is checked. The report before correction, and what FEC made of it (`None`
    /// only when the root hash matches nothing, so no block can be blamed).
    pub fn verify_with_fec(
        &self,
        root: &[u8],
        fec: &Path,
        opts: &FecOptions,
    ) -> Result<(VerifyReport, Option<FecOutcome>)> {
        self.with_fec(root, fec, opts, false)
    }

    /// [`verify_with_fec`](Self::verify_with_fec), then the corrected blocks written back
    /// into the data and hash devices, and a damaged FEC area written anew (unless
    /// `dry_run`). The volume must have been opened with [`open_writable`](Self::open_writable).
    pub fn repair(
        &self,
        root: &[u8],
        fec: &Path,
        opts: &FecOptions,
        dry_run: bool,
    ) -> Result<(VerifyReport, Option<FecOutcome>)> {
        self.with_fec(root, fec, opts, !dry_run)
    }

    fn with_fec(
        &self,
        root: &[u8],
        fec: &Path,
        opts: &FecOptions,
        write: bool,
    ) -> Result<(VerifyReport, Option<FecOutcome>)> {
        let report = self.verify(root)?;
        if report.root_hash_mismatch {
            return Ok((report, None));
        }
        if write && (self.data.read_only() || self.hash.read_only()) {
            return Err(VolumeError::Invalid(
                "verity repair: the volume was opened read-only".into(),
            ));
        }
        let in_hash = same_file(&self.hash_path, fec);
        let fec_dev = crate::block::open_device(fec, !write || in_hash, false)?;
        // The geometry before the claim: a claim of an offset past the file's range would be
        // refused with a less useful message than the offset's own.
        let (geometry, inputs) = layout(
            &self.params,
            opts,
            &*self.data,
            &*self.hash,
            in_hash,
            same_file(&self.data_path, fec),
        )?;
        // A FEC file of its own that repair may rewrite has one writer: this one.
        let _claim = if write && !in_hash {
            Some(crate::block::Claim::take(
                fec_dev.file(),
                fec,
                opts.offset,
                0,
                true,
            )?)
        } else {
            None
        };
        let need = opts.offset + geometry.parity_bytes();
        if fec_dev.size() < need {
            return Err(crate::verity::fec::FecError::Truncated {
                device: fec.display().to_string(),
                have: fec_dev.size(),
                need,
            }
            .into());
        }
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
        if write {
            // The parity goes through the hash device when it shares its file (opened
            // read-write there), else through the FEC file opened for writing.
            let sink: &dyn BlockDevice = if in_hash { &*self.hash } else { &fec_dev };
            repair::write_back(&outcome, &volume, &corrector, sink)?;
        }
        Ok((report, Some(outcome)))
    }
}
