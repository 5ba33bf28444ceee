//! Arbitrary bytes as a root-verity-sig partition: parsing never panics, and whatever parses
//! writes back (as systemd-repart writes it) to a partition that parses to the same contents.

#![no_main]

use dmkit::image::sigjson::SigJson;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = SigJson::parse(data) else {
        return;
    };
    let again = SigJson::parse(&s.to_partition()).expect("a written partition parses");
    assert_eq!(again, s);
});
