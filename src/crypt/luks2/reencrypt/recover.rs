//! Finishing a hotzone a crash left `in-reencryption` (`reencrypt_recover_segment`), with
//! cryptsetup's rules per resilience:
//! - checksum: a block whose on-disk bytes still hash to the stored checksum of its old
//!   ciphertext is still old, and is re-keyed; any other block was already written new;
//! - journal: the journal holds the hotzone's old ciphertext: all of it is re-keyed from
//!   there and written again;
//! - none: nothing tells old from new blocks, so the hotzone cannot be recovered.

use super::parallel::Keyed;
use super::state::Resilience;
use crate::block::BlockDevice;
use crate::crypt::luks::LuksError;
use crate::crypt::luks2::json::Segment;
use zeroize::Zeroize;

/// What recovering a hotzone needs.
pub struct Devices<'a> {
    /// The header device (the protection area).
    pub hdr_dev: &'a dyn BlockDevice,
    /// The data device.
    pub data_dev: &'a dyn BlockDevice,
    /// The hotzone protection.
    pub resilience: &'a Resilience,
    /// The protection area (offset, length) on the header device.
    pub area: (u64, u64),
    /// Byte offset of the data on the data device.
    pub data_offset: u64,
    /// Bytes of data.
    pub device_size: u64,
    /// The old key (`None`: plaintext).
    pub old: Option<&'a Keyed>,
    /// The new key (`None`: plaintext).
    pub new: Option<&'a Keyed>,
}

/// Recover the hotzone `seg` (the segment flagged `in-reencryption`) on the data device,
/// flush it, and give the hotzone (offset in the data, length), now new.
pub fn hotzone(run: &Devices<'_>, seg: &Segment) -> Result<(u64, u64), LuksError> {
    let bad = |what: &str| LuksError::Invalid(format!("reencryption metadata: {what}"));
    let offset = seg
        .offset
        .checked_sub(run.data_offset)
        .ok_or_else(|| bad("the hotzone lies before the data"))?;
    let length = seg.size.ok_or_else(|| bad("the hotzone has no size"))?;
    if length < 512 || offset + length > run.device_size {
        return Err(bad("the hotzone lies outside the data"));
    }
    let at = run.data_offset + offset;
    let (area, area_len) = run.area;
    match run.resilience.clone() {
        Resilience::Checksum { hash, sector_size } => {
            let md = crate::crypt::luks::af::message_digest(&hash)?;
            let block = sector_size as usize;
            let count = length as usize / block;
            let mut sums = vec![0u8; count * md.size()];
            if sums.len() as u64 > area_len {
                return Err(bad("the checksums do not fit in the reencryption area"));
            }
            run.hdr_dev.read_at(&mut sums, area)?;
            let mut buf = vec![0u8; length as usize];
            run.data_dev.read_at(&mut buf, at)?;
            let now = super::parallel::checksums(&mut buf, block, &hash)?;
            for (i, (was, is)) in sums
                .chunks_exact(md.size())
                .zip(now.chunks_exact(md.size()))
                .enumerate()
            {
                if was != is {
                    continue;
                }
                let b = &mut buf[i * block..(i + 1) * block];
                let o = offset + (i * block) as u64;
                super::parallel::rekey_piece(b, o, run.old, run.new);
                run.data_dev.write_at(b, at + (i * block) as u64)?;
            }
            buf.zeroize();
        }
        Resilience::Journal => {
            if length > area_len {
                return Err(bad("the hotzone is larger than the journal"));
            }
            let mut buf = vec![0u8; length as usize];
            run.hdr_dev.read_at(&mut buf, area)?;
            super::parallel::rekey(&mut buf, offset, run.old, run.new);
            let written = run.data_dev.write_at(&buf, at);
            buf.zeroize();
            written?;
        }
        Resilience::None => {
            return Err(LuksError::Invalid(
                "the interrupted hotzone has no resilience data and cannot be recovered".into(),
            ))
        }
        other => {
            return Err(LuksError::Unsupported(format!(
                "recovering a hotzone protected by {}",
                other.word()
            )))
        }
    }
    run.data_dev.flush()?;
    Ok((offset, length))
}
