//! `dmkit bench fsverity`: SEEDS.md seed 002's fs-verity rows on a sealed tree — fio 4 KiB
//! buffered read and randread of a 1 MiB file and of a large file, through `dmkit fsverity
//! mount` with every read verified and through the same server with `--no-verify`, both
//! mounted in the same run over the same tree and measured in alternation.
//!
//! Each fio job reads its file's bytes from the server, never from the mount's page cache:
//! `--invalidate=1` drops the file's cached pages whenever fio opens it, and fio reopens it
//! for every `--loops` pass. The 1 MiB file is read in passes over and over; the large file
//! once, in order for `read` and in a random order without repeats (fio's random map) for
//! `randread`. The files under the tree stay in the host's page cache, so what the table
//! shows is the cost of the checking itself (the kernel's figures include an SD card).
//! The verifying mount keeps its verified Merkle tree blocks between runs, as the kernel
//! keeps them in the page cache.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bench::harness::fio::fio_rw;
use crate::bench::harness::process::say;
use crate::bench::harness::process::{
    self as harness, run_ok, Dmkit, Export, Interrupt, Workspace,
};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::format_size;
use crate::bench::BenchError;

/// The small file: the document's "1 MB file", as `data/seeds.json` gives its size.
pub fn small_file() -> u64 {
    crate::bench::seeds::data::setup("002")
        .files
        .first()
        .expect("data/seeds.json gives seed 002's files (checked by its unit test)")
        .bytes
}

/// The two sides, in table order.
pub const SIDES: [&str; 2] = ["without", "with"];

/// One file's measurements: per job (`read`, `randread`), per side, one bandwidth per run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRow {
    /// The file's size, bytes.
    pub size: u64,
    /// Bytes each `read` run reads.
    pub read_bytes: u64,
    /// Bytes each `randread` run reads.
    pub randread_bytes: u64,
    /// `read` bandwidth per side, bytes/s, one per run.
    pub read: [Vec<f64>; 2],
    /// `randread` bandwidth per side, bytes/s, one per run.
    pub randread: [Vec<f64>; 2],
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FsVerityReadReport {
    /// Runs per job and side.
    pub runs: u32,
    /// Where the tree was.
    pub dir: PathBuf,
    /// The commands that sealed and mounted the tree.
    pub commands: Vec<String>,
    /// The 1 MiB file, then the large one.
    pub rows: Vec<FileRow>,
}

/// fio's arguments: `rw` with the document's block size and I/O (4 KiB buffered) on `file` of
/// `size` bytes, `bytes` in all, libaio at queue depth 1; whole passes (`--loops`) for a file
/// smaller than `bytes`, else one partial pass (`--io_size`).
pub fn fio_args(rw: &str, file: &Path, size: u64, bytes: u64) -> Vec<String> {
    let m = crate::bench::seeds::data::setup("002");
    let filename = file.to_string_lossy().replace(':', "\\:");
    let mut v = vec![
        format!("--name={rw}"),
        format!("--filename={filename}"),
        format!("--readwrite={rw}"),
        format!("--bs={}", m.bs.unwrap_or_default()),
        format!("--direct={}", u8::from(m.direct.unwrap_or_default())),
        "--ioengine=libaio".to_string(),
        "--iodepth=1".to_string(),
        format!("--size={size}"),
        "--invalidate=1".to_string(),
        "--readonly".to_string(),
        "--numjobs=1".to_string(),
        "--thread".to_string(),
        "--output-format=json".to_string(),
    ];
    if bytes > size {
        v.push(format!("--loops={}", bytes.div_ceil(size)));
    } else {
        v.push(format!("--io_size={bytes}"));
    }
    v
}

/// Seal a tree holding the two files and mount it twice: checked and unchecked.
fn prepare(
    dmkit: &Dmkit,
    o: &RwBenchOptions,
    ws: &Workspace,
    interrupt: &Interrupt,
    commands: &mut Vec<String>,
) -> Result<Vec<Export>, BenchError> {
    let tree = ws.path("tree");
    let io = |what: String| move |source| BenchError::Io { what, source };
    std::fs::create_dir(&tree).map_err(io(format!("creating {}", tree.display())))?;
    for (name, size) in [("small", small_file()), ("large", o.size)] {
        say(
            o.progress,
            format!("writing {} of random data", format_size(size)),
        );
        harness::write_random_file(&tree.join(name), size, interrupt)?;
    }
    let tree_s = tree.to_string_lossy().into_owned();
    let seal = vec!["fsverity".to_string(), "seal".into(), tree_s.clone()];
    commands.push(format!("dmkit {}", seal.join(" ")));
    run_ok(&mut dmkit.command(&seal), ws.dir(), interrupt, None)?;
    let mut exports = Vec::new();
    for side in SIDES {
        let mp = ws.path(&format!("mnt-{side}"));
        std::fs::create_dir(&mp).map_err(io(format!("creating {}", mp.display())))?;
        let name = format!("bench{}-fsverity-{side}", std::process::id());
        let mut args = vec![
            "fsverity".to_string(),
            "mount".into(),
            tree_s.clone(),
            mp.to_string_lossy().into_owned(),
            "--name".into(),
            name.clone(),
        ];
        if side == "without" {
            args.push("--no-verify".into());
        }
        commands.push(format!("dmkit {}", args.join(" ")));
        say(o.progress, format!("mounting the tree {side} verification"));
        exports.push(dmkit.open_at(&name, &args, &mp, ws.dir(), interrupt)?);
    }
    // Both sides read the files from the host's page cache, never from the disk.
    for name in ["small", "large"] {
        harness::read_through(&tree.join(name))?;
    }
    Ok(exports)
}

/// Run the comparison: `o.size` is the large file's size.
pub fn run(o: &RwBenchOptions, interrupt: &Interrupt) -> Result<FsVerityReadReport, BenchError> {
    o.check()?;
    crate::bench::harness::fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.dir)?;
    let mut commands = Vec::new();
    let exports = prepare(&dmkit, o, &ws, interrupt, &mut commands)?;
    // Enough bytes per run to time well, few enough to keep a quick run quick.
    let read_bytes = if o.quick { 128 << 20 } else { 2 << 30 };
    let randread_bytes = if o.quick { 16 << 20 } else { 64 << 20 };
    let mut rows: Vec<FileRow> = [("small", small_file()), ("large", o.size)]
        .iter()
        .map(|&(_, size)| FileRow {
            size,
            read_bytes: if size < read_bytes { read_bytes } else { size },
            randread_bytes,
            read: Default::default(),
            randread: Default::default(),
        })
        .collect();
    for run in 0..o.runs as usize {
        for (row, file) in rows.iter_mut().zip(["small", "large"]) {
            for rw in ["read", "randread"] {
                for k in 0..SIDES.len() {
                    let side = (k + run) % SIDES.len();
                    interrupt.check()?;
                    let path = exports[side].path().join(file);
                    let bytes = if rw == "read" {
                        row.read_bytes
                    } else {
                        row.randread_bytes
                    };
                    let args = fio_args(rw, &path, row.size, bytes);
                    let r = fio_rw(rw, &args, &path, 60_000, ws.dir(), interrupt)?;
                    let runs = if rw == "read" {
                        &mut row.read
                    } else {
                        &mut row.randread
                    };
                    runs[side].push(r.read);
                    say(
                        o.progress,
                        format!(
                            "run {}/{} {} file {rw:<8} {:<7} {:.1} MB/s",
                            run + 1,
                            o.runs,
                            format_size(row.size),
                            SIDES[side],
                            r.read / 1e6
                        ),
                    );
                }
            }
        }
    }
    for e in exports.into_iter().rev() {
        e.close()?;
    }
    Ok(FsVerityReadReport {
        runs: o.runs,
        dir: o.dir.clone(),
        commands,
        rows,
    })
}

// The text of `bench fsverity` is seed 002's section of `bench seeds`.
crate::bench::harness::report::impl_report!(FsVerityReadReport => crate::bench::seeds::sections::s002::render_command);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_loop_and_large_files_read_part() {
        let a = fio_args("read", Path::new("/m/small"), 1 << 20, 128 << 20);
        assert!(a.contains(&"--loops=128".to_string()), "{a:?}");
        assert!(a.contains(&"--invalidate=1".to_string()));
        assert!(a.contains(&"--direct=0".to_string()));
        let a = fio_args("randread", Path::new("/m/large"), 1 << 30, 64 << 20);
        assert!(a.contains(&format!("--io_size={}", 64 << 20)), "{a:?}");
        assert!(!a.iter().any(|x| x.starts_with("--loops")));
    }
}
