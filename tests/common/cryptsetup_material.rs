//! cryptsetup 2.6.1's own test material (its `tests/` directory), the way rustls runs BoGo:
//! the pinned release tarball from Debian's archive, checked against its SHA-256, unpacked
//! once into `target/tmp/cryptsetup-suite/`, and the header generators of
//! `luks2-validation-test` run to produce the images that test judges.
//!
//! A tarball already on the machine is used when its checksum matches (the download cache,
//! or `/var/tmp/cs/`); otherwise it is fetched with curl. When that cannot be done the caller
//! gets `None` after [`super::env::missing`] has had its say (skip locally, fail in CI).

use super::env::{missing, on_path};
use super::run;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The upstream release, as Debian ships it.
pub const TARBALL: &str = "cryptsetup_2.6.1.orig.tar.gz";
/// Where it is fetched from.
pub const URL: &str =
    "http://deb.debian.org/debian/pool/main/c/cryptsetup/cryptsetup_2.6.1.orig.tar.gz";
/// Its SHA-256.
pub const SHA256: &str = "b8adeb071bb396a1a8515f1d54b4cc8901a536d0da3f5970971beb2ec8427c17";

/// The cache directory of this suite.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-suite")
}

fn sha256_of(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

/// A tarball with the right checksum: the cached one, one left by hand in /var/tmp/cs, or a
/// fresh download.
fn tarball() -> Option<PathBuf> {
    let cached = cache_dir().join(TARBALL);
    for candidate in [cached.clone(), Path::new("/var/tmp/cs").join(TARBALL)] {
        if sha256_of(&candidate).as_deref() == Some(SHA256) {
            return Some(candidate);
        }
    }
    if !on_path("curl") {
        missing("curl is not installed (apt-get install curl) to fetch cryptsetup's test material");
        return None;
    }
    std::fs::create_dir_all(cache_dir()).unwrap();
    let part = cache_dir().join(format!("{TARBALL}.part"));
    let out = run::output(
        "curl",
        &["-fsSL", "--retry", "3", "-o", part.to_str().unwrap(), URL],
    );
    if !out.status.success() {
        missing(&format!(
            "cannot download {URL}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return None;
    }
    let got = sha256_of(&part).unwrap_or_default();
    assert_eq!(got, SHA256, "{URL} has an unexpected SHA-256");
    std::fs::rename(&part, &cached).unwrap();
    Some(cached)
}

/// cryptsetup-2.6.1/tests, unpacked (once per test binary run, whichever test asks first).
pub fn tests_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Mutex<Option<PathBuf>>> = OnceLock::new();
    let lock = DIR.get_or_init(|| Mutex::new(None));
    let mut dir = lock.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = dir.as_ref() {
        return Some(d.clone());
    }
    let root = cache_dir().join("src");
    let tests = root.join("cryptsetup-2.6.1/tests");
    let done = root.join(".unpacked");
    if !done.exists() {
        let tar = tarball()?;
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        run::ok(
            "tar",
            &[
                "xzf",
                tar.to_str().unwrap(),
                "-C",
                root.to_str().unwrap(),
                "cryptsetup-2.6.1/tests",
            ],
        );
        std::fs::write(&done, SHA256).unwrap();
    }
    *dir = Some(tests.clone());
    Some(tests)
}

/// `name.xz` of the material decompressed to `dest`.
pub fn unxz(tests: &Path, name: &str, dest: &Path) {
    let out = run::output(
        "xz",
        &["-dc", tests.join(format!("{name}.xz")).to_str().unwrap()],
    );
    assert!(out.status.success(), "xz -dc {name}.xz failed");
    std::fs::write(dest, out.stdout).unwrap();
}

/// A `.tar.xz` of the material unpacked into `dest`.
pub fn untar(tests: &Path, name: &str, dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    run::ok(
        "tar",
        &[
            "xJf",
            tests.join(name).to_str().unwrap(),
            "-C",
            dest.to_str().unwrap(),
            "--no-same-owner",
        ],
    );
}

/// A `jq` that reads its input files without their NUL padding. Debian 12's jq 1.6 fails on a
/// JSON text followed by more than a few KiB of NUL bytes (the generators hand it whole JSON
/// areas), where the jq cryptsetup's authors ran stops at the NULs; the generators' own
/// checks then fail although the images are right. Stripping the NULs is what that jq did.
const JQ_SHIM: &str = r#"#!/bin/bash
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(); n=0
for a in "$@"; do
  if [ -f "$a" ]; then n=$((n+1)); tr -d '\000' < "$a" > "$tmp/$n"; args+=("$tmp/$n"); else args+=("$a"); fi
done
"$JQ_REAL" "${args[@]}"
"#;

/// Runs every `generators/generate-*.sh` of `luks2-validation-test` into `out` (as that test
/// does: `$TST_IMGS $TST_IMGS/luks2_valid_hdr.img`), each in a fresh copy of the generators
/// directory's state. Returns the images, the base image first.
pub fn generate_validation_headers(tests: &Path, out: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(out).unwrap();
    let base = out.join("luks2_valid_hdr.img");
    unxz(tests, "luks2_valid_hdr.img", &base);
    let gen = out.join("generators");
    let _ = std::fs::remove_dir_all(&gen);
    run::ok(
        "cp",
        &[
            "-r",
            tests.join("generators").to_str().unwrap(),
            gen.to_str().unwrap(),
        ],
    );
    let shim_dir = out.join("jq-shim");
    std::fs::create_dir_all(&shim_dir).unwrap();
    let shim = shim_dir.join("jq");
    std::fs::write(&shim, JQ_SHIM).unwrap();
    run::ok("chmod", &["+x", shim.to_str().unwrap()]);
    let real_jq = run::ok("sh", &["-c", "command -v jq"]).trim().to_string();
    let path = format!(
        "{}:{}",
        shim_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(&gen)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("generate-") && n.ends_with(".sh")
        })
        .collect();
    scripts.sort();
    let mut images = vec![base.clone()];
    for s in scripts {
        let mut cmd = run::command(
            "bash",
            &[
                s.to_str().unwrap(),
                out.to_str().unwrap(),
                base.to_str().unwrap(),
            ],
            None,
        );
        cmd.current_dir(&gen)
            .env("PATH", &path)
            .env("JQ_REAL", &real_jq);
        let o = run::output_within(&mut cmd, run::LIMIT);
        assert!(
            o.status.success(),
            "generator {} failed: {}",
            s.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let name = s
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("generate-")
            .trim_end_matches(".sh")
            .to_string();
        images.push(out.join(name));
    }
    images
}

/// The `RUN <image> "R"|"F"` lines of `luks2-validation-test`: image name and whether
/// `cryptsetup luksDump` must accept it.
pub fn validation_expectations(tests: &Path) -> Vec<(String, bool)> {
    let script = std::fs::read_to_string(tests.join("luks2-validation-test")).unwrap();
    script
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            if w.next() != Some("RUN") {
                return None;
            }
            let img = w.next()?.to_string();
            match w.next()? {
                "\"R\"" => Some((img, true)),
                "\"F\"" => Some((img, false)),
                _ => None,
            }
        })
        .collect()
}
