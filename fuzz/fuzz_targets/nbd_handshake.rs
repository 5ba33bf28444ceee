//! Arbitrary client bytes in the NBD handshake: the negotiation never panics, always ends
//! (the input runs out), and everything the server sends is a well-formed greeting followed by
//! option replies whose lengths add up (or the export's size and flags after EXPORT_NAME).
//!
//! The first byte picks the TLS mode and whether the rest is raw bytes or a sequence of framed
//! options (`IHAVEOPT`, an option code, a length that may lie, data), so that mutations reach
//! every option's parser without guessing the 8-byte magic first.

#![no_main]

use dmkit::export::nbd::handshake::{Outcome, Tls};
use dmkit::export::nbd::proto::{be32, be64, IHAVEOPT, NBDMAGIC, REPLY_MAGIC};
use dmkit::export::nbd::{replay, ExportInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tls = match mode % 3 {
        0 => Tls::Off,
        1 => Tls::Required,
        _ => Tls::Active,
    };
    let input = if mode & 0x80 != 0 {
        rest.to_vec()
    } else {
        framed(rest)
    };
    let export = ExportInfo::new(
        "dev",
        "fuzz",
        1 << 20,
        512,
        mode & 0x40 != 0,
        mode & 0x20 != 0,
    );
    let (outcome, out) = replay::handshake(&export, &input, tls);
    assert!(out.len() >= 18 || input.len() < 4 || out.is_empty());
    if out.len() >= 18 {
        assert_eq!(be64(&out, 0), NBDMAGIC);
        assert_eq!(be64(&out, 8), IHAVEOPT);
    }
    // Option replies, back to back; after EXPORT_NAME, 10 or 134 bytes of export data.
    let mut at = 18;
    while at + 20 <= out.len() && be64(&out, at) == REPLY_MAGIC {
        at += 20 + be32(&out, at + 16) as usize;
    }
    let tail = out.len().saturating_sub(at);
    match outcome {
        Ok(Outcome::Go { .. }) if tail != 0 => assert!(tail == 10 || tail == 134, "tail {tail}"),
        _ => assert_eq!(tail, 0, "trailing bytes after the option replies"),
    }
});

/// Client flags, then options built from the bytes: code, declared length, data length.
fn framed(b: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 0, b.first().copied().unwrap_or(1) & 3];
    let mut i = 1;
    while i + 3 <= b.len() {
        let code = u32::from(b[i] % 12);
        let data_len = usize::from(b[i + 1] % 64);
        let lie = b[i + 2];
        i += 3;
        let data = &b[i..(i + data_len).min(b.len())];
        i += data.len();
        let declared = match lie % 8 {
            0 => data.len() as u32 + u32::from(lie >> 3),
            1 => (data.len() as u32).saturating_sub(u32::from(lie >> 3)),
            2 => u32::MAX - u32::from(lie),
            _ => data.len() as u32,
        };
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(&declared.to_be_bytes());
        v.extend_from_slice(data);
    }
    v
}
