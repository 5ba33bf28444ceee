//! The Merkle–Damgård framing the HMAC states share (SHA-256 and SHA-512 differ only in the
//! block size and the width of the length field): a key's pad block, and a message fed as
//! whole blocks, then padded.

use zeroize::Zeroizing;

/// `key` in a `B`-byte block (hashed first with `digest` when longer than a block, as RFC 2104
/// and the kernel's `hmac()` do), every byte xored with `x` (0x36 inner, 0x5c outer).
pub(crate) fn key_pad<const B: usize>(
    key: &[u8],
    digest: impl Fn(&[u8]) -> Zeroizing<Vec<u8>>,
    x: u8,
) -> Zeroizing<[u8; B]> {
    let mut pad = Zeroizing::new([x; B]);
    let hashed;
    let k = if key.len() > B {
        hashed = digest(key);
        &hashed[..]
    } else {
        key
    };
    for (p, b) in pad.iter_mut().zip(k) {
        *p ^= b;
    }
    pad
}

/// Feed the concatenation of `parts` to `compress` in `B`-byte blocks, then the padding (0x80,
/// zeros, and the bit length of `absorbed` plus the parts, big-endian, in the last `len_bytes`
/// bytes of the last block).
pub(crate) fn feed<const B: usize>(
    parts: &[&[u8]],
    absorbed: u128,
    len_bytes: usize,
    mut compress: impl FnMut(&[u8]),
) {
    let mut buf = Zeroizing::new([0u8; B]);
    let mut fill = 0usize;
    let mut len = absorbed;
    for p in parts {
        let mut p = *p;
        len += p.len() as u128;
        while !p.is_empty() {
            let k = p.len().min(B - fill);
            buf[fill..fill + k].copy_from_slice(&p[..k]);
            fill += k;
            p = &p[k..];
            if fill == B {
                compress(&buf[..]);
                fill = 0;
            }
        }
    }
    buf[fill] = 0x80;
    buf[fill + 1..].fill(0);
    if fill + 1 + len_bytes > B {
        compress(&buf[..]);
        buf.fill(0);
    }
    let bits = (len * 8).to_be_bytes();
    buf[B - len_bytes..].copy_from_slice(&bits[16 - len_bytes..]);
    compress(&buf[..]);
}
