//! dm-verity FEC against the real veritysetup: `dmkit verity format --fec-device` writes the
//! same parity bytes, the same hash device and the same text as `veritysetup format
//! --fec-device`, over random parameter combinations (roots 2..24, block sizes, hash types,
//! superblock or not, hash area in the data file, FEC area in its own file or after the tree
//! in the hash file), and refuses what veritysetup refuses with its exit code.
//!
//! The seed is printed; `DMKIT_INTEROP_SEED=N` replays a run.

mod common;

use common::env::tool_missing;
use common::rng::{env_seed, time_seed, XorShift64Star as Rng};
use common::run::{output as run, Workspace};
use common::DMKIT;
use std::fs;

/// Where the FEC area goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FecPlace {
    /// A file of its own, at this offset.
    OwnFile(u64),
    /// The hash file, at this offset past the tree (the file is made that long first).
    HashFile(u64),
}

#[derive(Debug)]
struct Case {
    hash: &'static str,
    block_size: u64,
    data_size: u64,
    salt: String,
    hash_type: u32,
    superblock: bool,
    /// The hash area inside the data file, at this offset.
    hash_offset: Option<u64>,
    roots: u64,
    fec: FecPlace,
}

fn random_case(rng: &mut Rng) -> Case {
    let block_size = rng.pick(&[512u64, 1024, 4096]);
    let blocks = 1 + rng.below(((2 << 20) / block_size).min(1200));
    let data_size = blocks * block_size + rng.below(block_size);
    let superblock = rng.below(3) != 0;
    let hash_offset = (rng.below(3) == 0).then(|| data_size.div_ceil(block_size) * block_size);
    // Past any tree of these sizes: at most blocks/2 hash blocks, plus the superblock.
    let hash_start = hash_offset.unwrap_or(0);
    let past_tree = hash_start + (blocks / 2 + 8) * block_size;
    let fec = match rng.below(3) {
        0 => FecPlace::HashFile(past_tree),
        1 => FecPlace::OwnFile(512 * rng.below(9)),
        _ => FecPlace::OwnFile(0),
    };
    Case {
        hash: rng.pick(&["sha1", "sha256", "sha512"]),
        block_size,
        data_size,
        salt: match rng.below(3) {
            0 => "-".into(),
            _ => {
                let n = 1 + rng.below(64) as usize;
                hex::encode(rng.bytes(n))
            }
        },
        hash_type: rng.below(2) as u32,
        superblock,
        hash_offset,
        roots: 2 + rng.below(23),
        fec,
    }
}

impl Case {
    fn options(&self, hash_file: &str, fec_file: &str) -> Vec<String> {
        let mut o = vec![
            format!("--hash={}", self.hash),
            format!("--data-block-size={}", self.block_size),
            format!("--hash-block-size={}", self.block_size),
            format!("--salt={}", self.salt),
            format!("--format={}", self.hash_type),
            "--uuid=01234567-89ab-cdef-0123-456789abcdef".into(),
            format!("--fec-roots={}", self.roots),
        ];
        if !self.superblock {
            o.push("--no-superblock".into());
        }
        if let Some(off) = self.hash_offset {
            o.push(format!("--hash-offset={off}"));
            o.push(format!(
                "--data-blocks={}",
                self.data_size / self.block_size
            ));
        }
        match self.fec {
            FecPlace::OwnFile(off) => {
                o.push(format!("--fec-device={fec_file}"));
                o.push(format!("--fec-offset={off}"));
            }
            FecPlace::HashFile(off) => {
                o.push(format!("--fec-device={hash_file}"));
                o.push(format!("--fec-offset={off}"));
            }
        }
        o
    }
}

/// Format `case` with `tool` into files prefixed `tag`; returns (stdout, hash bytes, FEC
/// bytes) with the file names replaced by placeholders.
fn format_with(
    e: &Workspace,
    case: &Case,
    tool: &str,
    tag: &str,
    data: &[u8],
) -> (String, Vec<u8>, Vec<u8>) {
    let data_file = e.s(&format!("{tag}.data"));
    fs::write(&data_file, data).unwrap();
    let hash_file = match case.hash_offset {
        Some(_) => data_file.clone(),
        None => e.s(&format!("{tag}.hash")),
    };
    let fec_file = e.s(&format!("{tag}.fec"));
    if let FecPlace::HashFile(off) = case.fec {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&hash_file)
            .unwrap();
        if f.metadata().unwrap().len() < off {
            f.set_len(off).unwrap();
        }
    }
    let mut args: Vec<String> = vec![];
    if tool == DMKIT {
        args.extend(["verity".into(), "format".into(), "-q".into()]);
    } else {
        args.push("format".into());
    }
    args.push(data_file.clone());
    args.push(hash_file.clone());
    args.extend(case.options(&hash_file, &fec_file));
    let out = run(tool, &args);
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout)
        .replace(&hash_file, "HASH")
        .replace(&fec_file, "FEC");
    let hash = fs::read(&hash_file).unwrap();
    let fec = match case.fec {
        FecPlace::OwnFile(_) => fs::read(&fec_file).unwrap(),
        FecPlace::HashFile(_) => Vec::new(),
    };
    (text, hash, fec)
}

#[test]
fn fec_areas_are_byte_identical_to_veritysetup() {
    if tool_missing("veritysetup", "cryptsetup-bin") {
        return;
    }
    let seed = env_seed("DMKIT_INTEROP_SEED").unwrap_or_else(time_seed);
    println!("seed {seed} (DMKIT_INTEROP_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let e = Workspace::new();
    for i in 0..24 {
        let mut case = random_case(&mut rng);
        // The matrix of roots in every run; the other cases draw theirs.
        if let Some(&r) = [2, 3, 11, 24].get(i) {
            case.roots = r;
        }
        let data = rng.bytes(case.data_size as usize);
        let theirs = format_with(&e, &case, "veritysetup", &format!("v{i}"), &data);
        let ours = format_with(&e, &case, DMKIT, &format!("d{i}"), &data);
        assert_eq!(ours.0, theirs.0, "case {i} {case:?}: the printed header");
        assert!(
            ours.1 == theirs.1,
            "case {i} {case:?}: hash device (with FEC if there) differs"
        );
        assert!(ours.2 == theirs.2, "case {i} {case:?}: FEC file differs");
        if let FecPlace::OwnFile(off) = case.fec {
            assert!(
                theirs.2.len() as u64 > off,
                "case {i}: some parity was written"
            );
        }
    }
}

#[test]
fn fec_json_reports_the_area() {
    let e = Workspace::new();
    let data = e.s("data");
    fs::write(&data, common::rng::bytes(7, 1 << 20)).unwrap();
    let out = run(
        DMKIT,
        &[
            "verity",
            "format",
            "-q",
            &data,
            &e.s("hash"),
            "--fec-device",
            &e.s("fec"),
            "--fec-roots",
            "4",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let fec = &j["fec"];
    assert_eq!(fec["roots"], 4);
    // 256 data blocks and the 3 tree blocks after the superblock's block: 259 over 251 per
    // round is 2 rounds of 4 parity blocks.
    assert_eq!(fec["blocks_covered"], 259, "{j:#}");
    assert_eq!(fec["rs_blocks"], 8);
    assert_eq!(fec["size"], 8 * 4096);
    assert_eq!(fs::metadata(e.path("fec")).unwrap().len(), 8 * 4096);
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(e.path("fec")).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "a new FEC file is owner-only, as veritysetup makes it"
    );
}

#[test]
fn fec_refusals_match_veritysetup() {
    if tool_missing("veritysetup", "cryptsetup-bin") {
        return;
    }
    let e = Workspace::new();
    let data = e.s("d1");
    fs::write(&data, common::rng::bytes(3, 1 << 20)).unwrap();
    let (hash, fec) = (e.s("h"), e.s("f"));
    let cases: [(&[&str], &str, &str); 4] = [
        (
            &["--fec-device", &fec, "--hash-block-size", "1024"],
            "Block sizes must match",
            "block size",
        ),
        (
            &["--fec-device", &fec, "--fec-offset", "100"],
            "Unsupported VERITY FEC offset",
            "--fec-offset",
        ),
        (
            &["--fec-device", &data, "--fec-offset", "4096"],
            "Data area overlaps with FEC area",
            "data area",
        ),
        (
            &["--fec-device", &fec, "--fec-roots", "25"],
            "Invalid number of parity bytes",
            "--fec-roots",
        ),
    ];
    for (opts, theirs, ours) in cases {
        let _ = fs::remove_file(&hash);
        let _ = fs::remove_file(&fec);
        let mut a = vec!["format", &data, &hash];
        a.extend_from_slice(opts);
        let v = run("veritysetup", &a);
        assert_eq!(v.status.code(), Some(1), "veritysetup {opts:?}");
        assert!(String::from_utf8_lossy(&v.stderr).contains(theirs));
        let before = fs::read(&data).unwrap();
        let mut a = vec!["verity", "format", "-q", &data, &hash];
        a.extend_from_slice(opts);
        let d = run(DMKIT, &a);
        let err = String::from_utf8_lossy(&d.stderr);
        assert_eq!(d.status.code(), Some(1), "dmkit {opts:?}: {err}");
        assert!(err.contains(ours), "dmkit {opts:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert_eq!(
            fs::read(&data).unwrap(),
            before,
            "the data file is untouched"
        );
    }
    // veritysetup 2.6.1 writes a FEC area at 4096 of the hash file over its own tree (the
    // result then fails to verify); dmkit refuses it.
    let d = run(
        DMKIT,
        &[
            "verity",
            "format",
            "-q",
            &data,
            &hash,
            "--fec-device",
            &hash,
            "--fec-offset",
            "4096",
        ],
    );
    assert_eq!(d.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&d.stderr).contains("overlaps the hash area"));
}

#[test]
fn fec_options_never_trust_sizes() {
    // The FEC options come from the command line and the FEC device from disk: a device too
    // short for the area, roots out of range and offsets that run off the address space are
    // one clear line and exit 1, never a panic, a wrapped offset or a changed byte.
    let e = Workspace::new();
    let (root, _) = format_fec(&e, 4);
    let files = |e: &Workspace| ["data", "hash", "fec"].map(|f| fs::read(e.path(f)).unwrap());
    let before = files(&e);
    let refused = |r: &common::run::Run, needle: &str| {
        assert_eq!(r.code, Some(1), "{}: {}", r.what, r.stderr);
        assert!(r.stderr.contains(needle), "{}: {}", r.what, r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    };
    let (data, hash, fec) = (e.s("data"), e.s("hash"), e.s("fec"));
    // An offset whose area would end past 2^64 (a multiple of 512, so only its size is wrong).
    let huge = (u64::MAX - 511).to_string();
    let with = |verb: &str, more: &[&str]| {
        let mut a = vec!["verity", verb, &data, &hash, &root, "--fec-device", &fec];
        a.extend_from_slice(more);
        common::run::text(DMKIT, &a)
    };
    for verb in ["verify", "repair"] {
        refused(
            &with(verb, &["--fec-roots", "4", "--fec-offset", &huge]),
            "--fec-offset",
        );
        for roots in ["0", "1", "25", "255"] {
            let r = with(verb, &["--fec-roots", roots]);
            assert_eq!(r.code, Some(1), "{}: {}", r.what, r.stderr);
            assert!(r.stderr.contains("--fec-roots"), "{}", r.stderr);
        }
    }
    assert_eq!(files(&e), before, "nothing written by a refusal");
    let (hash2, fec2) = (e.s("hash2"), e.s("fec2"));
    let format = ["verity", "format", "-q", &data, &hash2];
    let fec_at = ["--fec-device", &fec2, "--fec-offset", &huge];
    let r = common::run::text(DMKIT, &[&format[..], &fec_at[..]].concat());
    refused(&r, "--fec-offset");
    let grown = fs::metadata(e.path("fec2")).map_or(0, |m| m.len());
    assert_eq!(grown, 0, "no FEC file grown for a refused offset");
    // A FEC device cut short: verify and repair name it and its size.
    let short = &before[2][..before[2].len() - 4096];
    fs::write(e.path("fec"), short).unwrap();
    for verb in ["verify", "repair"] {
        let r = dmkit_with_fec(&e, &[verb], &root, 4);
        refused(&r, "FEC device is truncated");
    }
    assert_eq!(fs::read(e.path("fec")).unwrap(), short);
    assert_eq!(fs::read(e.path("data")).unwrap(), before[0]);
}

/// Format `data` (4 MiB of noise) with dmkit and FEC of `roots`; returns (root hash, rounds).
fn format_fec(e: &Workspace, roots: u32) -> (String, u64) {
    fs::write(e.path("data"), common::rng::bytes(11, 4 << 20)).unwrap();
    let out = run(
        DMKIT,
        &[
            "verity",
            "format",
            "-q",
            &e.s("data"),
            &e.s("hash"),
            "--fec-device",
            &e.s("fec"),
            "--fec-roots",
            &roots.to_string(),
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rounds = j["fec"]["rs_blocks"].as_u64().unwrap() / u64::from(roots);
    (j["root_hash"].as_str().unwrap().to_string(), rounds)
}

fn dmkit_with_fec(e: &Workspace, verb: &[&str], root: &str, roots: u32) -> common::run::Run {
    let mut a = vec!["verity"];
    a.extend_from_slice(verb);
    let (data, hash, fec, r) = (e.s("data"), e.s("hash"), e.s("fec"), roots.to_string());
    a.extend_from_slice(&[&data, &hash, root, "--fec-device", &fec, "--fec-roots", &r]);
    common::run::text(DMKIT, &a)
}

#[test]
fn verify_corrects_and_repair_writes_back_what_verifies() {
    let e = Workspace::new();
    let (root, _) = format_fec(&e, 4);
    let (data0, hash0) = (
        fs::read(e.path("data")).unwrap(),
        fs::read(e.path("hash")).unwrap(),
    );
    // Three data blocks and a tree block (four roots correct two unknown errors per
    // codeword; data block 24 hides under the corrupt tree block until that is rebuilt).
    for (file, block) in [("data", 24u64), ("data", 488), ("hash", 2), ("data", 1000)] {
        common::xor_byte(&e.path(file), block * 4096 + 77, 0xa5);
    }
    let plain = common::run::text(
        DMKIT,
        &["verity", "verify", &e.s("data"), &e.s("hash"), &root],
    );
    assert_eq!(plain.code, Some(2), "{}", plain.describe());

    let v = dmkit_with_fec(&e, &["verify"], &root, 4);
    assert_eq!(v.code, Some(0), "{}", v.describe());
    assert!(
        v.stderr.contains("corrected from the FEC device"),
        "{}",
        v.describe()
    );
    assert!(v.stderr.contains("data: 24, 488, 1000"), "{}", v.describe());
    assert!(v.stderr.contains("1 hash block(s)"), "{}", v.describe());
    assert_ne!(
        fs::read(e.path("data")).unwrap(),
        data0,
        "verify writes nothing"
    );

    let dry = dmkit_with_fec(&e, &["repair", "--dry-run"], &root, 4);
    assert_eq!(dry.code, Some(0), "{}", dry.describe());
    assert!(dry.stderr.contains("would repair"), "{}", dry.describe());
    assert_ne!(
        fs::read(e.path("data")).unwrap(),
        data0,
        "a dry run writes nothing"
    );

    let fix = dmkit_with_fec(&e, &["repair"], &root, 4);
    assert_eq!(fix.code, Some(0), "{}", fix.describe());
    assert!(
        fix.stderr.contains("repaired from the FEC device"),
        "{}",
        fix.describe()
    );
    assert!(
        fs::read(e.path("data")).unwrap() == data0,
        "data restored byte for byte"
    );
    assert!(
        fs::read(e.path("hash")).unwrap() == hash0,
        "hash restored byte for byte"
    );
    if !tool_missing("veritysetup", "cryptsetup-bin") {
        let r = run(
            "veritysetup",
            &[
                "verify",
                &e.s("data"),
                &e.s("hash"),
                &root,
                "--fec-device",
                &e.s("fec"),
                "--fec-roots",
                "4",
            ],
        );
        assert!(
            r.status.success(),
            "veritysetup verify --fec-device accepts the repaired volume: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
    let again = dmkit_with_fec(&e, &["repair"], &root, 4);
    assert_eq!(again.code, Some(0), "{}", again.describe());
    assert!(
        again.stderr.is_empty(),
        "nothing left to repair: {}",
        again.describe()
    );
}

#[test]
fn damage_beyond_the_parity_fails_and_changes_nothing() {
    let e = Workspace::new();
    let (root, rounds) = format_fec(&e, 2);
    // Three blocks of one round, the same byte of each: three errors in codewords that
    // correct one (and three erasures where two are the most).
    for i in 0..3 {
        common::xor_byte(&e.path("data"), (5 + i * rounds) * 4096 + 9, 0x3c);
    }
    let (data1, hash1) = (
        fs::read(e.path("data")).unwrap(),
        fs::read(e.path("hash")).unwrap(),
    );
    let v = dmkit_with_fec(&e, &["verify"], &root, 2);
    assert_eq!(v.code, Some(2), "{}", v.describe());
    assert!(
        v.stderr.contains("beyond what the FEC area corrects"),
        "{}",
        v.describe()
    );
    let r = dmkit_with_fec(&e, &["repair"], &root, 2);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        fs::read(e.path("data")).unwrap() == data1,
        "no block written"
    );
    assert!(fs::read(e.path("hash")).unwrap() == hash1);
}

#[test]
fn a_veritysetup_fec_area_repairs_in_dmkit() {
    if tool_missing("veritysetup", "cryptsetup-bin") {
        return;
    }
    let e = Workspace::new();
    fs::write(e.path("data"), common::rng::bytes(12, 3 << 20)).unwrap();
    let out = common::run::ok(
        "veritysetup",
        &[
            "format",
            &e.s("data"),
            &e.s("hash"),
            "--fec-device",
            &e.s("fec"),
            "--fec-roots",
            "6",
        ],
    );
    let root = out
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap()
        .trim()
        .to_string();
    let data0 = fs::read(e.path("data")).unwrap();
    for b in [0u64, 100, 700] {
        common::xor_byte(&e.path("data"), b * 4096 + 4095, 0xff);
    }
    let fix = dmkit_with_fec(&e, &["repair"], &root, 6);
    assert_eq!(fix.code, Some(0), "{}", fix.describe());
    assert!(fs::read(e.path("data")).unwrap() == data0);
}

#[test]
fn an_open_device_serves_corrected_blocks_and_counts_them() {
    if common::env::fuse_missing() {
        return;
    }
    let e = Workspace::new();
    let (root, rounds) = format_fec(&e, 4);
    let data0 = fs::read(e.path("data")).unwrap();
    for b in [24u64, 488, 1000] {
        common::xor_byte(&e.path("data"), b * 4096 + 77, 0xa5);
    }
    common::xor_byte(&e.path("hash"), 2 * 4096 + 5, 0x5a);
    // Without FEC the corrupt blocks give EIO.
    let (data, hash) = (e.s("data"), e.s("hash"));
    let dev = e.run.ok(&["verity", "open", &data, "plain", &hash, &root]);
    e.run.track("plain");
    assert!(
        fs::read(dev.trim()).is_err(),
        "a corrupt block fails without FEC"
    );
    e.run.close("plain");

    let fec = e.s("fec");
    let dev = e.run.ok(&[
        "verity",
        "open",
        &data,
        "fixed",
        &hash,
        &root,
        "--fec-device",
        &fec,
        "--fec-roots",
        "4",
    ]);
    e.run.track("fixed");
    assert!(
        fs::read(dev.trim()).unwrap() == data0,
        "every block served as written"
    );
    let st: serde_json::Value =
        serde_json::from_str(&e.run.ok(&["status", "fixed", "--json"])).unwrap();
    let stats = &st["stats"];
    assert_eq!(stats["fec_corrected"], 4, "{st:#}");
    assert_eq!(stats["fec_uncorrectable"], 0, "{st:#}");
    assert_eq!(st["details"]["fec_roots"], 4, "{st:#}");
    e.run.close("fixed");

    // Five blocks of one round, the same byte of each: five errors in those codewords, beyond
    // four roots even with all five blocks marked as erasures (5 > 4): EIO for those blocks.
    for i in 0..5 {
        common::xor_byte(&e.path("data"), (7 + i * rounds) * 4096 + 9, 0x3c);
    }
    let dev = e.run.ok(&[
        "verity",
        "open",
        &data,
        "broken",
        &hash,
        &root,
        "--fec-device",
        &fec,
        "--fec-roots",
        "4",
    ]);
    e.run.track("broken");
    let mut f = fs::File::open(dev.trim()).unwrap();
    use std::io::{Read, Seek, SeekFrom};
    let mut block = vec![0u8; 4096];
    f.seek(SeekFrom::Start(7 * 4096)).unwrap();
    assert!(f.read_exact(&mut block).is_err(), "beyond the parity: EIO");
    f.seek(SeekFrom::Start(24 * 4096)).unwrap();
    f.read_exact(&mut block).unwrap();
    assert!(
        block[..] == data0[24 * 4096..25 * 4096],
        "other blocks still corrected"
    );
    let st: serde_json::Value =
        serde_json::from_str(&e.run.ok(&["status", "broken", "--json"])).unwrap();
    assert!(
        st["stats"]["fec_uncorrectable"].as_u64().unwrap() >= 1,
        "{st:#}"
    );
    drop(f);
    e.run.close("broken");
}

#[test]
fn damage_to_the_fec_area_is_reported_and_repair_writes_it_anew() {
    let e = Workspace::new();
    let (root, _) = format_fec(&e, 2);
    let fec0 = fs::read(e.path("fec")).unwrap();
    common::xor_byte(&e.path("fec"), 4096 + 17, 0x81);
    let v = dmkit_with_fec(&e, &["verify"], &root, 2);
    assert_eq!(v.code, Some(0), "the data verifies: {}", v.describe());
    assert!(
        v.stderr
            .contains("1 block(s) of the FEC area do not match the verified volume: 1"),
        "{}",
        v.describe()
    );
    let r = dmkit_with_fec(&e, &["repair"], &root, 2);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stderr.contains("written anew"), "{}", r.describe());
    assert!(
        fs::read(e.path("fec")).unwrap() == fec0,
        "the FEC area is as formatted"
    );
    let again = dmkit_with_fec(&e, &["verify"], &root, 2);
    assert!(again.stderr.is_empty(), "{}", again.describe());
}
