//! Arbitrary bytes as a LUKS2 JSON area: the json-c-compatible parser, cryptsetup's metadata
//! rules and the dump never panic; json-c's writer and reader agree (what is written reads
//! back to the same text); and whatever the rules accept dumps and builds a typed view.

#![no_main]

use dmkit::crypt::luks2::header::{Luks2Header, RawCopy};
use dmkit::crypt::luks2::jsonc::{parse_area, Style};
use dmkit::crypt::luks2::{copies, dump, validate, Metadata};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((v, end)) = parse_area(data) {
        assert!(end <= data.len(), "parsing stopped past the area");
        let mut plain = v.to_json(Style::Plain);
        let text = plain.clone();
        // A NUL ends the text as the padding of a JSON area does.
        plain.push(0);
        let (again, _) = parse_area(&plain).expect("json-c reads what it writes");
        assert_eq!(again.to_json(Style::Plain), text, "write/read changed the text");
        let _ = validate::validate(&v, data.len() as u64);
    }
    if let Ok(tree) = copies::parse_and_validate(data) {
        let h = Luks2Header {
            hdr_size: data.len() as u64 + 4096,
            seqid: 1,
            label: String::new(),
            subsystem: String::new(),
            uuid: String::new(),
            checksum_alg: "sha256".into(),
            metadata: Metadata::from_tree(&tree),
            raw: Some(RawCopy {
                json: tree,
                label: Vec::new(),
                subsystem: Vec::new(),
                uuid: Vec::new(),
            }),
        };
        let _ = dump::text(&h);
    }
});
