//! Arbitrary bytes as a sealed tree's manifest: the strict parser never panics, and whatever
//! it accepts writes back to the very same bytes (the format has one spelling per manifest, so
//! the SHA-256 a mount pins is the manifest's identity). Seeds in fuzz/seeds/fsverity_manifest/
//! hold real manifests.

#![no_main]

use dmkit::fsverity::sealed::Manifest;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse(data, Path::new("fuzz.manifest")) {
        assert_eq!(m.to_bytes(), data, "an accepted manifest is not canonical");
    }
});
