//! Seed 001: read-only root images. `bench image`'s scenario ([`image::run`]): one tree built
//! as each of the document's 14 configurations; two tables, the image size against #2 (ext4
//! read-only) and the cold-cache time to read the whole tree (the stand-in for the boot time)
//! against #2, measured in the same run.

use std::path::PathBuf;

use super::{Ctx, Output};
use crate::bench::harness::process::{write_random_file, Workspace};
use crate::bench::scenarios::image::{self, ImageBenchOptions, BASELINE, SEED_001};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "001";
/// The size table.
pub const SIZE: &str = "image size";
/// The time table.
pub const TIME: &str = "boot / read time";

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
    o.dir = PathBuf::from("/var/tmp");
    o.runs = ctx.rw.runs;
    o.progress = ctx.rw.progress;
    if ctx.tiny && ctx.image_tree.is_none() {
        o.tree = Some(tiny_tree(&ws, ctx)?);
        o.subdir = None;
    }
    match (&ctx.image_tree, ctx.quick && !ctx.tiny) {
        (Some(t), _) => {
            o.tree = Some(t.clone());
            o.subdir = None;
        }
        (None, true) => {
            if let Some((t, s)) = quick_tree() {
                o.tree = Some(t);
                o.subdir = Some(s);
            }
        }
        (None, false) => {}
    }
    let r = image::run(&o, ctx.interrupt)?;
    let setup = vec![
        format!(
            "tree {} ({}): {} files, {} dirs, {} bytes; images in {}, {} cold-cache run(s) per row",
            r.tree.display(),
            r.tree_source,
            r.tree_stats.files,
            r.tree_stats.dirs,
            r.tree_stats.bytes,
            r.dir.display(),
            r.runs
        ),
        "#1 = ext4 read-write through a loop device; #2..#14 = dmkit image open (dm-verity by dmkit, read-only file system, OverlayFS with a tmpfs upper); read time = reading every file, link and inode with caches dropped first".into(),
    ];
    let base = r.rows.iter().find(|x| x.n == BASELINE);
    let size_of = |x: &image::RowResult| x.fs_used.or(x.fs_size).map(|b| b as f64 / 1e6);
    let base_size: Vec<f64> = base.and_then(size_of).into_iter().collect();
    let base_read: Vec<f64> = base.map(|b| b.read_s.clone()).unwrap_or_default();
    let note = format!(
        "{} (the kernel's own squashfs/erofs mounts are what dmkit image open uses)",
        kernel_note(ctx.kernel, "dm-verity")
    );
    let mut rows = Vec::new();
    for x in &r.rows {
        let key = format!("#{}", x.n);
        let mut size = SeedRow::measured(
            SEED,
            SIZE,
            &key,
            &x.label,
            "ext4 ro",
            "MB",
            false,
            size_of(x).into_iter().collect(),
            base_size.clone(),
        );
        let mut time = SeedRow::measured(
            SEED,
            TIME,
            &key,
            &x.label,
            "ext4 ro",
            "s",
            false,
            x.read_s.clone(),
            base_read.clone(),
        );
        if let Some(why) = &x.skipped {
            size.empty = Some(format!("not built: {why}"));
            time.empty = Some(format!("not measured: {why}"));
        }
        size = size.with_doc(
            ctx.seeds.figure(SEED, SIZE, &key, &x.label),
            "the document gives no size for this row",
        );
        time = time.with_doc(
            ctx.seeds.figure(SEED, TIME, &key, &x.label),
            "not in the document",
        );
        size.kernel = note.clone();
        time.kernel = note.clone();
        rows.push(size);
        rows.push(time);
    }
    Ok((setup, rows))
}
