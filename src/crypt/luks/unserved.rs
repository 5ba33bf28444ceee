//! The device a served volume becomes when its online decryption failed after its data moved
//! (the header exported, the first data segment copied to the device's start) but before the
//! decryption's own map was served: the map it was opened with no longer describes the data
//! and no other map can be built without what failed, so every request fails with an I/O
//! error saying why, instead of waiting for ever on a suspended device.

use crate::block::{BlockDevice, BlockError, Result};

/// Fails every request with `why` (see the module documentation).
pub(super) struct Unserved {
    name: String,
    size: u64,
    block: u32,
    why: String,
}

impl Unserved {
    /// The device `name` of `size` bytes in blocks of `block`, failing every request with
    /// `why`.
    pub fn new(name: &str, size: u64, block: u32, why: String) -> Unserved {
        Unserved {
            name: name.to_string(),
            size,
            block,
            why,
        }
    }

    fn fail(&self, offset: u64) -> BlockError {
        BlockError::Io {
            device: self.name.clone(),
            offset,
            source: std::io::Error::other(self.why.clone()),
        }
    }
}

impl BlockDevice for Unserved {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        self.block
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_at(&self, _: &mut [u8], offset: u64) -> Result<()> {
        Err(self.fail(offset))
    }
    fn write_at(&self, _: &[u8], offset: u64) -> Result<()> {
        Err(self.fail(offset))
    }
    fn flush(&self) -> Result<()> {
        Err(self.fail(0))
    }
    fn discard(&self, offset: u64, _: u64) -> Result<()> {
        Err(self.fail(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_fails_with_the_reason() {
        let d = Unserved::new("vol", 1 << 20, 512, "the decryption failed".into());
        let mut b = [0u8; 512];
        for e in [
            d.read_at(&mut b, 4096).unwrap_err(),
            d.write_at(&b, 0).unwrap_err(),
            d.flush().unwrap_err(),
            d.discard(0, 512).unwrap_err(),
        ] {
            assert!(matches!(e, BlockError::Io { .. }), "{e}");
            assert!(e.to_string().contains("vol"), "{e}");
            assert!(
                std::error::Error::source(&e)
                    .is_some_and(|s| s.to_string() == "the decryption failed"),
                "{e}"
            );
        }
        assert_eq!(d.size(), 1 << 20);
    }
}
