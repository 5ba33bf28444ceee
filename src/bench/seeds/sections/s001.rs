//! Seed 001: read-only root images. `bench image`'s scenario ([`image::run`]): one tree built
//! as each of the document's 14 configurations; two tables, the image size against #2 (ext4
//! read-only) and the cold-cache time to read the whole tree (the stand-in for the boot time)
//! against #2, measured in the same run; and the time to open each image, which the document
//! did not measure. `bench image` prints its result through [`rows`] too
//! ([`render_command`]).

use std::path::PathBuf;

use super::{Ctx, Output, Refs};
use crate::bench::harness::process::{write_random_file, Workspace};
use crate::bench::scenarios::image::{
    self, ImageBenchOptions, ImageBenchReport, BASELINE, SEED_001,
};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "001";
/// The size table.
pub const SIZE: &str = "image size";
/// The time table.
pub const TIME: &str = "boot / read time";
/// The open time table (dmkit's only).
pub const OPEN: &str = "open time";

/// Runs: one cold read per row and round.
pub fn expected_runs(runs: u64) -> u64 {
    runs * SEED_001.len() as u64
}

/// The tree for `--quick` when none is given: this machine's Python library (thousands of
/// small files, like a root), when it is there; else the scenario's default.
fn quick_tree() -> Option<(PathBuf, PathBuf)> {
    let p = PathBuf::from("/usr/lib/python3");
    p.is_dir()
        .then(|| (PathBuf::from("/usr"), PathBuf::from("lib/python3")))
}

/// A small tree for the tiny smoke run: 48 files of 0 to 47 KiB in three directories and a
/// symbolic link, made in `ws`.
fn tiny_tree(ws: &Workspace, ctx: &Ctx) -> Result<PathBuf, BenchError> {
    let root = ws.path("tree");
    for k in 0..48u64 {
        let dir = root.join(format!("d{}", k % 3));
        std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        write_random_file(&dir.join(format!("f{k}")), k * 1024, ctx.interrupt)?;
    }
    std::os::unix::fs::symlink("d0/f1", root.join("link")).map_err(|source| BenchError::Io {
        what: "create a symbolic link in the tiny tree".into(),
        source,
    })?;
    Ok(root)
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    // Kept until the end: the tiny tree lives in it.
    let ws = Workspace::create(&ctx.rw.dir)?;
    let mut o = ImageBenchOptions::defaults(ctx.quick || ctx.tiny);
    o.common.dir = PathBuf::from("/var/tmp");
    o.common.runs = ctx.rw.runs;
    o.common.progress = ctx.rw.progress;
    if ctx.tiny && ctx.image_tree.is_none() {
        o.common.tree = Some(tiny_tree(&ws, ctx)?);
        o.common.subdir = None;
    }
    match (&ctx.image_tree, ctx.quick && !ctx.tiny) {
        (Some(t), _) => {
            o.common.tree = Some(t.clone());
            o.common.subdir = None;
        }
        (None, true) => {
            if let Some((t, s)) = quick_tree() {
                o.common.tree = Some(t);
                o.common.subdir = Some(s);
            }
        }
        (None, false) => {}
    }
    let r = image::run(&o, ctx.interrupt)?;
    Ok((setup(&r), rows(&r, ctx.refs())))
}

/// How the scenario ran, one line each: the tree, the stack, each image's mkfs command.
pub fn setup(r: &ImageBenchReport) -> Vec<String> {
    let mut v = vec![
        format!(
            "tree {} ({}): {} files, {} dirs, {} bytes; images in {}, {} cold-cache run(s) per row, alternated; kernel {}",
            r.tree.display(),
            r.tree_source,
            r.tree_stats.files,
            r.tree_stats.dirs,
            r.tree_stats.bytes,
            r.dir.display(),
            r.runs,
            r.kernel
        ),
        "#1 = ext4 read-write through a loop device; #2..#14 = dmkit image open (dm-verity by dmkit, read-only file system, OverlayFS with a tmpfs upper); size = the file system (ext4: its blocks in use); read time = reading every file, link and inode with caches dropped first; open time = mounting, caches dropped first".into(),
    ];
    for x in &r.rows {
        if !x.mkfs.is_empty() {
            v.push(format!("setup: #{} {}: {}", x.n, x.label, x.mkfs.join(" ")));
        }
    }
    v
}

/// The rows: per image, its size, its read time and its open time against #2's.
pub fn rows(r: &ImageBenchReport, refs: Refs) -> Vec<SeedRow> {
    let base = r.rows.iter().find(|x| x.n == BASELINE);
    let size_of = |x: &image::RowResult| x.fs_used.or(x.fs_size).map(|b| b as f64 / 1e6);
    let base_size: Vec<f64> = base.and_then(size_of).into_iter().collect();
    let base_read: Vec<f64> = base.map(|b| b.read_s.clone()).unwrap_or_default();
    let base_open: Vec<f64> = base.map(|b| b.open_s.clone()).unwrap_or_default();
    let note = format!(
        "{} (the kernel's own squashfs/erofs mounts are what dmkit image open uses)",
        kernel_note(refs.kernel, "dm-verity")
    );
    let mut rows = Vec::new();
    for x in &r.rows {
        let key = format!("#{}", x.n);
        let row = |table: &str, unit: &str, v: Vec<f64>, b: Vec<f64>| {
            SeedRow::measured(SEED, table, &key, &x.label, "ext4 ro", unit, false, v, b)
        };
        let mut size = row(
            SIZE,
            "MB",
            size_of(x).into_iter().collect(),
            base_size.clone(),
        );
        let mut time = row(TIME, "s", x.read_s.clone(), base_read.clone());
        let mut open = row(OPEN, "s", x.open_s.clone(), base_open.clone());
        if let Some(why) = &x.skipped {
            size.empty = Some(format!("not built: {why}"));
            time.empty = Some(format!("not measured: {why}"));
            open.empty = Some(format!("not measured: {why}"));
        }
        size = size.with_doc(
            refs.seeds.figure(SEED, SIZE, &key, &x.label),
            "the document gives no size for this row",
        );
        time = time.with_doc(
            refs.seeds.figure(SEED, TIME, &key, &x.label),
            "not in the document",
        );
        open = open.with_doc(None, "the document measured boot time only");
        for mut sr in [size, time, open] {
            sr.kernel = note.clone();
            rows.push(sr);
        }
    }
    rows
}

/// What `bench image` prints: its section.
pub fn render_command(r: &ImageBenchReport) -> String {
    super::command_text(SEED, |refs| (setup(r), rows(r, refs)), |_| Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scenarios::image::{label, Mount, RowResult};
    use crate::image::tree::TreeStats;

    fn result(n: u32, fs_size: u64, read: f64) -> RowResult {
        RowResult {
            n,
            label: label(n),
            fs: "squashfs".into(),
            compress: "xz".into(),
            mount: Mount::ImageOpen,
            mkfs: vec!["mksquashfs".into(), "-comp".into(), "xz".into()],
            fs_size: Some(fs_size),
            image_size: Some(fs_size + 4096),
            fs_used: None,
            build_s: Some(1.0),
            open_s: vec![0.5],
            read_s: vec![read],
            files_read: 10,
            bytes_read: 100,
            skipped: None,
        }
    }

    #[test]
    fn bench_image_prints_its_section() {
        let mut skipped = result(11, 0, 0.0);
        skipped.skipped = Some("this mkfs.erofs has no lzma compressor".into());
        let r = ImageBenchReport {
            tree: "/t".into(),
            tree_source: "test".into(),
            tree_stats: TreeStats::default(),
            runs: 1,
            dir: "/var/tmp".into(),
            kernel: "6.x".into(),
            rows: vec![
                result(2, 1_000_000_000, 2.0),
                result(6, 330_000_000, 3.0),
                skipped,
            ],
        };
        let s = render_command(&r);
        assert!(
            s.contains("seed 001, image size (dmkit and baseline in MB)"),
            "{s}"
        );
        assert!(s.contains("| #6  | SquashFS xz / ext4 ro "), "{s}");
        // 330 MB of 1000, beside the document's 32.74% of its ext4 image.
        assert!(
            s.contains("0.33 (-67%) | 32.7 / 100 % of ext4 |    0.33 (-67%)"),
            "{s}"
        );
        // Read time 3 s against 2 s, the document's boot time 28.728 against 15.988 s.
        assert!(
            s.contains("1.50 (+50%) | 28.7 / 16.0 s |    1.80 (+80%)"),
            "{s}"
        );
        assert!(s.contains("seed 001, open time"), "{s}");
        assert!(
            s.contains("not built: this mkfs.erofs has no lzma compressor"),
            "{s}"
        );
        assert!(
            s.contains("- setup: #6 SquashFS xz: mksquashfs -comp xz"),
            "{s}"
        );
    }
}
