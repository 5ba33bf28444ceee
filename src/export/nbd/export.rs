//! What the server says about the one export it serves: its name, size, transmission flags
//! and block size constraints, derived from the device and the export's options.

use super::proto::*;

/// The largest READ or WRITE payload accepted: qemu's own limit, so its requests are never
/// split further; every connection may grow two buffers to this size.
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// The export as the handshake and the request checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export's name (the device name); the empty name, the default export, names it too.
    pub name: String,
    /// One line for humans (`NBD_INFO_DESCRIPTION`, `NBD_OPT_LIST`).
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// Smallest request granularity: the device's logical block size.
    pub min_block: u32,
    /// Preferred request granularity.
    pub preferred_block: u32,
    /// Largest READ or WRITE payload.
    pub max_payload: u32,
}

impl ExportInfo {
    /// The export of a device of `size` bytes and `logical_block` bytes per block. Writable
    /// exports take WRITE_ZEROES (zeros are written where the layer cannot do better) and,
    /// with `discards`, TRIM. Every export may be used over several connections: they share
    /// one device, and a FLUSH flushes all of it (see [`FLAG_CAN_MULTI_CONN`]).
    pub fn new(
        name: &str,
        description: &str,
        size: u64,
        logical_block: u32,
        read_only: bool,
        discards: bool,
    ) -> ExportInfo {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_CAN_MULTI_CONN;
        if read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
            if discards {
                flags |= FLAG_SEND_TRIM;
            }
        }
        // The protocol wants powers of two, the minimum at most 64 KiB.
        let min_block = logical_block.clamp(1, 64 << 10).next_power_of_two();
        ExportInfo {
            name: name.to_string(),
            description: description.to_string(),
            size,
            flags,
            min_block,
            preferred_block: min_block.max(4096),
            max_payload: MAX_PAYLOAD,
        }
    }

    /// Whether `flag` (`NBD_FLAG_*`) is advertised.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Whether a client asking for `name` means this export.
    pub fn is_named(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_device() {
        let ro = ExportInfo::new("v", "", 8192, 4096, true, true);
        assert!(ro.has(FLAG_READ_ONLY) && ro.has(FLAG_CAN_MULTI_CONN));
        assert!(!ro.has(FLAG_SEND_TRIM) && !ro.has(FLAG_SEND_WRITE_ZEROES));
        assert_eq!((ro.min_block, ro.preferred_block), (4096, 4096));
        let rw = ExportInfo::new("c", "", 8192, 512, false, false);
        assert!(rw.has(FLAG_SEND_WRITE_ZEROES) && !rw.has(FLAG_SEND_TRIM));
        assert_eq!((rw.min_block, rw.preferred_block), (512, 4096));
        assert!(ExportInfo::new("c", "", 8192, 512, false, true).has(FLAG_SEND_TRIM));
        assert!(rw.is_named(b"") && rw.is_named(b"c") && !rw.is_named(b"d"));
    }
}
