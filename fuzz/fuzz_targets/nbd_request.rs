//! Arbitrary client bytes in the NBD transmission phase, served from a 64 KiB in-memory device:
//! requests are checked and run or refused without a panic, nothing is written to a read-only
//! export, and with structured replies the server's output is a sequence of well-formed simple
//! replies and structured chunks whose lengths add up.
//!
//! The first byte picks the export's options and whether the rest is raw bytes or a sequence
//! of framed requests (request magic, a command, flags, an offset and a length that may lie,
//! a payload that may be cut short), so that mutations reach every check.

#![no_main]

use dmkit::block::{BlockDevice, MemoryDevice};
use dmkit::export::nbd::proto::*;
use dmkit::export::nbd::{replay, ExportInfo};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

const SIZE: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let read_only = mode & 1 != 0;
    let structured = mode & 2 != 0;
    let input = if mode & 0x80 != 0 {
        rest.to_vec()
    } else {
        framed(rest)
    };
    let initial: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let mem = MemoryDevice::from_vec("fuzz", initial.clone());
    let dev: Arc<dyn BlockDevice> = if read_only {
        Arc::new(mem.into_read_only())
    } else {
        Arc::new(mem)
    };
    let export = ExportInfo::new("dev", "", SIZE as u64, 512, read_only, mode & 4 != 0);
    let (_, out, counters) = replay::transmission(dev.clone(), &export, &input, structured);
    let mut after = vec![0u8; SIZE];
    dev.read_at(&mut after, 0).unwrap();
    if read_only {
        assert_eq!(after, initial, "a read-only export changed");
        assert_eq!(counters.bytes_written, 0);
    }
    // With structured replies every reply can be walked: a successful READ is a structured
    // chunk, everything else a chunk or a 16-byte simple reply. Without, a simple reply to a
    // READ carries data the walk cannot size: only the first header is checked.
    if structured {
        let mut at = 0;
        while at < out.len() {
            assert!(at + 16 <= out.len(), "a reply cut short at {at}");
            match be32(&out, at) {
                STRUCTURED_REPLY_MAGIC => {
                    assert!(at + 20 <= out.len());
                    at += 20 + be32(&out, at + 16) as usize;
                }
                SIMPLE_REPLY_MAGIC => at += 16,
                other => panic!("reply magic {other:#x} at {at}"),
            }
        }
        assert_eq!(
            at,
            out.len(),
            "the last chunk's length runs past the output"
        );
    } else if out.len() >= 4 {
        assert_eq!(be32(&out, 0), SIMPLE_REPLY_MAGIC);
    }
});

/// Requests built from the bytes: command, flags, offset, length, payload.
fn framed(b: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    let mut i = 0;
    while i + 6 <= b.len() {
        let kind = u16::from(b[i] % 10);
        let flags = u16::from(b[i + 1]);
        let offset = u64::from(u16::from_le_bytes([b[i + 2], b[i + 3]])) * 8;
        let len_sel = b[i + 4];
        let cut = b[i + 5];
        i += 6;
        let len: u32 = match len_sel % 8 {
            0 => 0,
            1 => u32::MAX - u32::from(len_sel),
            2 => MAX_PAYLOAD_GUESS + u32::from(len_sel),
            _ => u32::from(len_sel) * 64,
        };
        v.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
        v.extend_from_slice(&kind.to_be_bytes());
        v.extend_from_slice(&u64::from(cut).to_be_bytes());
        v.extend_from_slice(&offset.to_be_bytes());
        v.extend_from_slice(&len.to_be_bytes());
        if kind == CMD_WRITE && len <= 1 << 14 {
            // The payload, cut short when `cut` says so (a client hanging up mid-request).
            let n = if cut % 16 == 0 {
                len as usize / 2
            } else {
                len as usize
            };
            v.extend((0..n).map(|k| (k as u8) ^ cut));
        }
    }
    v
}

/// Just over the server's maximum payload, to probe the bound.
const MAX_PAYLOAD_GUESS: u32 = dmkit::export::nbd::MAX_PAYLOAD;
