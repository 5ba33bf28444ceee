//! Arbitrary bytes as a LUKS2 JSON area: the json-c-compatible parser, cryptsetup's metadata
//! rules and the dump never panic; json-c's writer and reader agree (what is written reads
//! back, and its text is stable); and whatever the rules accept dumps and builds a typed view
//! whose data segment (with its `integrity` object) is checked as activation checks it.
//! Seeds in fuzz/seeds/luks2_json/ hold real headers, one with integrity.

#![no_main]

use dmkit::crypt::luks2::header::{Luks2Header, RawCopy};
use dmkit::crypt::luks2::jsonc::{parse_area, Style};
use dmkit::crypt::aead::AeadKind;
use dmkit::crypt::luks2::{activate, dump, integrity, validate, Metadata};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((v, end)) = parse_area(data) {
        assert!(end <= data.len(), "parsing stopped past the area");
        // Written, read back (a NUL ends the text as a JSON area's padding does) and written
        // again, the text is stable from the second writing on: the first may only respell
        // numbers (json-c keeps a fraction's source text, "000e" -> "000", which then reads
        // as the integer 0).
        let reread = |text: &[u8]| {
            let mut area = text.to_vec();
            area.push(0);
            parse_area(&area).expect("json-c reads what it writes").0
        };
        let second = reread(&v.to_json(Style::Plain)).to_json(Style::Plain);
        let third = reread(&second).to_json(Style::Plain);
        assert_eq!(second, third, "write/read changed the text");
        let _ = validate::validate(&v, data.len() as u64);
    }
    if let Ok(tree) = validate::parse_and_validate(data) {
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
        // The data segment as activation sees it, integrity fields included: checked against
        // device sizes around its offset, never trusted.
        for size in [0u64, 1 << 20, 16 << 20, (16 << 20) + 4096, 1 << 40] {
            if let Ok(seg) = activate::data_segment(&h, "fuzz", size, false) {
                if let Some(itype) = &seg.integrity {
                    let _ = AeadKind::from_luks2(&seg.cipher, itype);
                    let _ = integrity::key_layout(&seg.cipher, itype, None, None);
                }
            }
        }
    }
});
