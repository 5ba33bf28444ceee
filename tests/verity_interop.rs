//! Interop with the real veritysetup, both ways, over random parameter combinations: the same
//! root hash and a byte-identical hash device; each tool accepts the other's tree; one flipped
//! bit anywhere in the covered data or the tree is reported at the right block.
//!
//! The seed is printed; `DMKIT_INTEROP_SEED=N` replays a run, `DMKIT_INTEROP_CASES=N` sets
//! how many combinations (default 50).

mod common;

use common::env::tool_missing;
use common::rng::{env_seed, time_seed, XorShift64Star as Rng};
use common::run::{ok, output as run};
use common::verity_case::VerityCase as Case;
use common::{xor_byte, DMKIT};
use std::path::{Path, PathBuf};

/// A random parameter combination (the generator is xorshift64*, so a seed replays a run).
fn random_case(rng: &mut Rng) -> Case {
    let sizes = [512u64, 1024, 2048, 4096, 8192, 16384, 32768, 65536];
    let hash = rng.pick(&["sha1", "sha256", "sha512"]);
    let data_block_size = rng.pick(&sizes);
    let hash_block_size = rng.pick(&sizes);
    // Up to ~1500 blocks but at most 3 MiB, plus a tail that is not a whole block.
    let max_blocks = (3 << 20) / data_block_size;
    // One block in eight cases: no tree at all, the root is that block's digest.
    let blocks = if rng.below(8) == 0 {
        1
    } else {
        1 + rng.below(max_blocks.min(1500))
    };
    let data_size = blocks * data_block_size + rng.below(data_block_size);
    let salt_len = match rng.below(4) {
        0 => 0,
        1 => 256,
        _ => rng.below(257) as usize,
    };
    let salt = if salt_len == 0 {
        "-".to_string()
    } else {
        hex::encode(rng.bytes(salt_len))
    };
    let superblock = rng.below(3) != 0;
    let hash_offset = if rng.below(3) == 0 {
        // After the data, aligned as veritysetup requires: 512 bytes with a superblock,
        // a whole hash block without one.
        let align = if superblock { 512 } else { hash_block_size };
        let end = data_size.div_ceil(align) * align;
        Some(end + align * rng.below(3))
    } else {
        None
    };
    Case {
        name: String::new(),
        hash,
        data_block_size,
        hash_block_size,
        data_size,
        salt,
        hash_type: rng.below(2) as u32,
        superblock,
        hash_offset,
    }
}

fn root_hash_of(output: &str) -> String {
    output
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no root hash in {output}"))
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

const UUID: &str = "a60c98d2-ae9b-4865-bfcb-b4e3ace11033";

/// Format with `tool`; returns (root hash, data path, hash path).
fn format_with(
    tool: &str,
    case: &Case,
    dir: &Path,
    tag: &str,
    data: &[u8],
) -> (String, PathBuf, PathBuf) {
    let data_path = dir.join(format!("{tag}.data"));
    std::fs::write(&data_path, data).unwrap();
    let hash_path = match case.hash_offset {
        Some(_) => data_path.clone(),
        None => dir.join(format!("{tag}.hash")),
    };
    let mut args = vec!["format".to_string()];
    args.extend(case.tree_options());
    args.push(format!("--uuid={UUID}"));
    args.push(s(&data_path));
    args.push(s(&hash_path));
    let out = ok(tool, &args);
    (root_hash_of(&out), data_path, hash_path)
}

/// The bytes of an in-file hash area that veritysetup fills from a stale buffer: past the
/// data file's old end (`old_len`), up to the hash block boundary where the tree begins.
fn stale_gap(case: &Case, old_len: u64, new_len: u64) -> Option<std::ops::Range<usize>> {
    let offset = case.hash_offset?;
    if !case.superblock {
        return None;
    }
    let tree_start = (offset + 512).next_multiple_of(case.hash_block_size);
    let (start, end) = (old_len.max(offset + 512), tree_start.min(new_len));
    (start < end).then_some(start as usize..end as usize)
}

fn verify_args(case: &Case, data: &Path, hash: &Path, root: &str) -> Vec<String> {
    let mut a = vec!["verify".to_string()];
    a.extend(case.open_options());
    a.extend([s(data), s(hash), root.to_string()]);
    a
}

fn dmkit_verify_json(
    case: &Case,
    data: &Path,
    hash: &Path,
    root: &str,
) -> (bool, serde_json::Value) {
    let mut args = vec!["verity".to_string()];
    args.extend(verify_args(case, data, hash, root));
    args.push("--json".into());
    let out = run(DMKIT, &args);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify --json gave no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), j)
}

fn flip_bit(path: &Path, byte: u64, bit: u8) {
    xor_byte(path, byte, 1 << bit);
}

/// First hash block of the tree and one past the last, as veritysetup lays it out.
fn tree_blocks(case: &Case) -> (u64, u64) {
    let hbs = case.hash_block_size;
    let per_block = 1u64 << (63 - (hbs / case.digest_size()).leading_zeros());
    let offset = case.hash_offset.unwrap_or(0);
    let start = if case.superblock {
        (offset + 512).div_ceil(hbs)
    } else {
        offset / hbs
    };
    let mut total = 0;
    let mut n = case.data_blocks();
    while n > 1 {
        n = n.div_ceil(per_block);
        total += n;
    }
    (start, start + total)
}

fn check_case(i: usize, case: &Case, rng: &mut Rng, dir: &Path) {
    // Neither tool truncates an existing hash file: start every case from nothing.
    for f in ["vs.data", "vs.hash", "dm.data", "dm.hash"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let mut data = rng.bytes(case.data_size as usize);
    if let Some(off) = case.hash_offset {
        // veritysetup writes the superblock in place and refuses to do so past the end of
        // the file, so the image must already reach it (as a real device would).
        data.resize(data.len().max(off as usize + 512), 0);
    }
    let (root_a, data_a, hash_a) = format_with("veritysetup", case, dir, "vs", &data);
    let mut dm_args = vec!["verity".to_string()];
    let (root_b, data_b, hash_b) = {
        let data_path = dir.join("dm.data");
        std::fs::write(&data_path, &data).unwrap();
        let hash_path = if case.hash_offset.is_some() {
            data_path.clone()
        } else {
            dir.join("dm.hash")
        };
        dm_args.push("format".into());
        dm_args.extend(case.tree_options());
        dm_args.push(format!("--uuid={UUID}"));
        dm_args.push(s(&data_path));
        dm_args.push(s(&hash_path));
        (root_hash_of(&ok(DMKIT, &dm_args)), data_path, hash_path)
    };
    assert_eq!(root_a, root_b, "case {i} {case:?}: root hash differs");
    let (mut ha, hb) = (
        std::fs::read(&hash_a).unwrap(),
        std::fs::read(&hash_b).unwrap(),
    );
    if let Some(gap) = stale_gap(case, data.len() as u64, ha.len() as u64) {
        // veritysetup writes its superblock as a read-modify-write of a whole hash block.
        // Past the old end of file the read is short, and the rest of the block goes out
        // as whatever its buffer held before (bytes of earlier data blocks). Those bytes
        // are neither superblock nor tree; dmkit leaves them zero, as a grown file reads.
        assert!(
            hb[gap.clone()].iter().all(|&b| b == 0),
            "case {i} {case:?}: dmkit wrote into the gap {gap:?} past the end of file"
        );
        ha[gap].fill(0);
    }
    assert!(
        ha == hb,
        "case {i} {case:?}: hash device differs ({} vs {} bytes)",
        ha.len(),
        hb.len()
    );

    // Each tool accepts the other's tree.
    ok("veritysetup", &verify_args(case, &data_b, &hash_b, &root_b));
    let (good, j) = dmkit_verify_json(case, &data_a, &hash_a, &root_a);
    assert!(
        good && j["ok"] == true,
        "case {i} {case:?}: dmkit rejects veritysetup's tree: {j}"
    );

    // One flipped bit in the covered data, then in the tree: reported at its block.
    let block = rng.below(case.data_blocks());
    let byte = block * case.data_block_size + rng.below(case.data_block_size);
    flip_bit(&data_b, byte, rng.below(8) as u8);
    let (good, j) = dmkit_verify_json(case, &data_b, &hash_b, &root_b);
    assert!(
        !good,
        "case {i} {case:?}: corrupt data block {block} accepted"
    );
    assert_eq!(
        j["corrupt_data_blocks"],
        serde_json::json!([block]),
        "case {i} {case:?}: {j}"
    );
    assert_eq!(
        j["corrupt_hash_blocks"],
        serde_json::json!([]),
        "case {i} {case:?}: {j}"
    );
    let vs = run("veritysetup", &verify_args(case, &data_b, &hash_b, &root_b));
    assert!(
        !vs.status.success(),
        "case {i}: veritysetup accepted corrupt data"
    );

    let (first, end) = tree_blocks(case);
    if end > first {
        // Restore the data (veritysetup's copy is byte-identical), then corrupt one tree block.
        std::fs::write(&data_b, std::fs::read(&data_a).unwrap()).unwrap();
        let hblock = first + rng.below(end - first);
        let hbyte = hblock * case.hash_block_size + rng.below(case.hash_block_size);
        flip_bit(&hash_b, hbyte, rng.below(8) as u8);
        let (good, j) = dmkit_verify_json(case, &data_b, &hash_b, &root_b);
        assert!(
            !good,
            "case {i} {case:?}: corrupt hash block {hblock} accepted"
        );
        assert_eq!(
            j["corrupt_hash_blocks"],
            serde_json::json!([hblock]),
            "case {i} {case:?}: {j}"
        );
        assert_eq!(
            j["corrupt_data_blocks"],
            serde_json::json!([]),
            "case {i} {case:?}: {j}"
        );
        let vs = run("veritysetup", &verify_args(case, &data_b, &hash_b, &root_b));
        assert!(
            !vs.status.success(),
            "case {i}: veritysetup accepted a corrupt tree"
        );
    }
}

#[test]
fn random_parameter_combinations_match_veritysetup() {
    if tool_missing("veritysetup", "cryptsetup-bin") {
        return;
    }
    let seed = env_seed("DMKIT_INTEROP_SEED").unwrap_or_else(|| time_seed() | 1);
    let cases: usize = std::env::var("DMKIT_INTEROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    eprintln!("interop seed {seed} ({cases} cases); replay with DMKIT_INTEROP_SEED={seed}");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..cases {
        let case = random_case(&mut rng);
        seen.insert((
            case.hash,
            case.hash_type,
            case.superblock,
            case.hash_offset.is_some(),
        ));
        check_case(i, &case, &mut rng, dir.path());
    }
    eprintln!(
        "{} distinct (hash, type, superblock, offset) classes covered",
        seen.len()
    );
}
