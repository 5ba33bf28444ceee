//! Arbitrary bytes as a LUKS2/LUKS1 device: the header reader never panics and never allocates
//! without bound, and whatever it accepts and can encode reads back the same.
//!
//! Mode byte 0 takes the input as a whole device; any other value wraps the input as the JSON
//! text of a header pair with valid checksums, so mutations reach the metadata parser instead
//! of dying at the checksum.

#![no_main]

use dmkit::block::{BlockDevice, MemoryDevice};
use dmkit::crypt::luks1::Luks1Header;
use dmkit::crypt::luks2::copies;
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const HDR: usize = 16384;

fn copy(json: &[u8], offset: usize) -> Vec<u8> {
    let mut b = vec![0u8; HDR];
    b[..6].copy_from_slice(if offset == 0 {
        b"LUKS\xba\xbe"
    } else {
        b"SKUL\xba\xbe"
    });
    b[6..8].copy_from_slice(&2u16.to_be_bytes());
    b[8..16].copy_from_slice(&(HDR as u64).to_be_bytes());
    b[72..78].copy_from_slice(b"sha256");
    b[256..264].copy_from_slice(&(offset as u64).to_be_bytes());
    let n = json.len().min(HDR - 4096 - 1);
    b[4096..4096 + n].copy_from_slice(&json[..n]);
    let sum = Sha256::digest(&b);
    b[448..480].copy_from_slice(&sum);
    b
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let device = if mode == 0 {
        let _ = Luks1Header::parse(rest);
        rest.to_vec()
    } else {
        let mut d = copy(rest, 0);
        d.extend(copy(rest, HDR));
        d.resize(2 * HDR + (1 << 20), 0);
        d
    };
    let dev = MemoryDevice::from_vec("fuzz", device);
    let Ok(loaded) = copies::read(&dev) else {
        return;
    };
    let h = loaded.header;
    // dmkit's typed view keeps what cryptsetup looks up (ids "0".."31"); metadata that only
    // makes sense with other keys is refused on writing rather than written differently.
    let Ok(encoded) = h.encode() else {
        return;
    };
    let mut again_dev = encoded.clone();
    again_dev.resize(dev.size().max(encoded.len() as u64) as usize, 0);
    let again = copies::read(&MemoryDevice::from_vec("again", again_dev))
        .expect("an encoded header reads back");
    // Compared as text: the parsed view normalises spellings such as "0010" for 10.
    assert_eq!(
        again.header.metadata.to_text(),
        h.metadata.to_text(),
        "metadata changed in a round trip"
    );
    assert_eq!(again.header.uuid, h.uuid);
});
