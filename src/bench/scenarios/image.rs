//! `dmkit bench image`: SEEDS.md seed 001 on our layers. The document made a Raspberry Pi's
//! root read-only (OverlayFS over a read-only lower, tmpfs upper), then swapped the lower for
//! SquashFS and EROFS images in 14 configurations, and reported each image's size as a share
//! of the ext4 image and the boot time.
//!
//! Here every configuration is a `dmkit image build` of one tree; row 1 (ext4 rw) is the ext4
//! file system mounted read-write through a plain loop device, every other row goes through
//! `dmkit image open` (dm-verity by dmkit, the file system read-only, an OverlayFS with a
//! tmpfs upper), as an immutable system boots. The stand-in for boot time is the time to read
//! the whole tree (every file's bytes, every link, every inode's attributes) with cold caches
//! (`drop_caches` before each open), beside the open itself. Ratios are against row 2 (ext4
//! read-only through the same stack) measured in the same run, as the document's are.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::image_tree::TreeBenchOptions;
use crate::bench::harness::process::say;
use crate::bench::harness::process::{run_ok, Dmkit, Interrupt, Workspace};
use crate::bench::BenchError;
use crate::image::build::human;
use crate::image::tree::TreeStats;

/// How a row is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mount {
    /// The bare file system, read-write through a loop device (`mount -o loop`).
    PlainRw,
    /// `dmkit image open`: verity, read-only file system, OverlayFS with a tmpfs upper.
    ImageOpen,
}

/// One row of the document's table and the build that stands for it (the document's name,
/// options and figures for it are in `data/seeds.json`).
#[derive(Debug, Clone, Copy)]
pub struct SeedRow {
    /// The document's row number.
    pub n: u32,
    /// `--fs`.
    pub fs: &'static str,
    /// `--compress`.
    pub compress: &'static str,
    /// How it is mounted.
    pub mount: Mount,
}

const fn row(n: u32, fs: &'static str, compress: &'static str) -> SeedRow {
    SeedRow {
        n,
        fs,
        compress,
        mount: if n == 1 {
            Mount::PlainRw
        } else {
            Mount::ImageOpen
        },
    }
}

/// The document's rows as `dmkit image build` makes them: #1 and #2 ext4, #3 to #8 SquashFS,
/// #9 to #14 EROFS, each with the compression of its row.
pub const SEED_001: [SeedRow; 14] = [
    row(1, "ext4", "none"),
    row(2, "ext4", "none"),
    row(3, "squashfs", "none"),
    row(4, "squashfs", "gzip"),
    row(5, "squashfs", "lz4hc"),
    row(6, "squashfs", "xz"),
    row(7, "squashfs", "lzo"),
    row(8, "squashfs", "zstd"),
    row(9, "erofs", "none"),
    row(10, "erofs", "lz4hc,12"),
    row(11, "erofs", "lzma"),
    row(12, "erofs", "big-pcluster"),
    row(13, "erofs", "hints"),
    row(14, "erofs", "well-compressed"),
];

/// The document's name for row `n` (`data/seeds.json`; "#n" if it has none).
pub fn label(n: u32) -> String {
    let key = format!("#{n}");
    crate::bench::seeds::data::Seeds::load()
        .figures
        .into_iter()
        .find(|f| f.key.seed == "001" && f.key.row == key)
        .map_or(key, |f| f.key.config)
}

/// The row whose time the others are compared with (ext4 read-only), as in the document.
pub const BASELINE: u32 = 2;

/// What to run.
#[derive(Debug, Clone)]
pub struct ImageBenchOptions {
    /// The tree, scratch and cache directories, runs, progress.
    pub common: TreeBenchOptions,
    /// The rows, by the document's numbers (the baseline is always measured).
    pub rows: Vec<u32>,
}

impl ImageBenchOptions {
    /// Defaults: the full table, 3 runs; `quick`: the default tree's `usr/bin` and one run.
    pub fn defaults(quick: bool) -> ImageBenchOptions {
        ImageBenchOptions {
            common: TreeBenchOptions::defaults(quick),
            rows: SEED_001.iter().map(|r| r.n).collect(),
        }
    }
}

/// One row's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowResult {
    /// The document's row number.
    pub n: u32,
    /// The document's name for it.
    pub label: String,
    /// `--fs`.
    pub fs: String,
    /// `--compress`.
    pub compress: String,
    /// How it was mounted.
    pub mount: Mount,
    /// The mkfs command line dmkit ran (program name first).
    pub mkfs: Vec<String>,
    /// Bytes of the file system image.
    pub fs_size: Option<u64>,
    /// Bytes of the whole GPT disk image (file system, hash tree, signature).
    pub image_size: Option<u64>,
    /// ext4: the bytes its blocks in use take (the file has mkfs's margin on top).
    pub fs_used: Option<u64>,
    /// Seconds `dmkit image build` took.
    pub build_s: Option<f64>,
    /// Seconds to open (mount) it, one per run, caches dropped first.
    pub open_s: Vec<f64>,
    /// Seconds to read the whole tree through it, one per run.
    pub read_s: Vec<f64>,
    /// Regular files and bytes read in the last run.
    pub files_read: u64,
    /// Bytes read in the last run.
    pub bytes_read: u64,
    /// Why the row could not run (the build's or open's one-line error).
    pub skipped: Option<String>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageBenchReport {
    /// The tree.
    pub tree: PathBuf,
    /// What the tree is.
    pub tree_source: String,
    /// Its counts.
    pub tree_stats: TreeStats,
    /// Runs per row.
    pub runs: u32,
    /// The scratch directory's parent.
    pub dir: PathBuf,
    /// The running kernel.
    pub kernel: String,
    /// One per row, in the document's order.
    pub rows: Vec<RowResult>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Io { what, source }
}

/// Write back dirty pages and drop the page, dentry and inode caches.
pub fn drop_caches() -> Result<(), BenchError> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(io(
        "writing 3 to /proc/sys/vm/drop_caches (needs root)".into(),
    ))
}

/// Read everything under `root` as a booting system would meet it: every inode's attributes,
/// every link's target, every regular file's bytes. Returns (files, bytes).
pub fn read_tree(root: &Path, interrupt: &Interrupt) -> Result<(u64, u64), BenchError> {
    let mut buf = vec![0u8; 1 << 20];
    read_tree_with(root, interrupt, &mut |_, f| {
        let mut n = 0;
        loop {
            match std::io::Read::read(f, &mut buf)? {
                0 => return Ok(n),
                k => n += k as u64,
            }
        }
    })
}

/// [`read_tree`], handing each regular file (path, open file) to `per_file`, which reads it
/// and returns the bytes it read (`bench rootless` hashes them).
pub fn read_tree_with(
    root: &Path,
    interrupt: &Interrupt,
    per_file: &mut dyn FnMut(&Path, &mut std::fs::File) -> std::io::Result<u64>,
) -> Result<(u64, u64), BenchError> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        interrupt.check()?;
        let rd = std::fs::read_dir(&d).map_err(io(format!("reading {}", d.display())))?;
        for e in rd {
            let p = e.map_err(io(format!("reading {}", d.display())))?.path();
            let m = std::fs::symlink_metadata(&p).map_err(io(format!("stat {}", p.display())))?;
            if m.is_dir() {
                stack.push(p);
            } else if m.is_symlink() {
                std::fs::read_link(&p).map_err(io(format!("readlink {}", p.display())))?;
            } else if m.is_file() {
                let mut f = std::fs::File::open(&p).map_err(io(format!("open {}", p.display())))?;
                bytes += per_file(&p, &mut f).map_err(io(format!("read {}", p.display())))?;
                files += 1;
            }
        }
    }
    Ok((files, bytes))
}

/// A mounted row, unmounted (or `image close`d) when dropped.
struct Mounted<'a> {
    dmkit: &'a Dmkit,
    mount: Mount,
    at: PathBuf,
    scratch: PathBuf,
    open: bool,
}

impl Mounted<'_> {
    fn undo(&mut self) -> Result<(), BenchError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let mut cmd = match self.mount {
            Mount::ImageOpen => {
                self.dmkit
                    .command(["image".as_ref(), "close".as_ref(), self.at.as_os_str()])
            }
            Mount::PlainRw => {
                let mut c = std::process::Command::new("umount");
                c.arg(&self.at);
                c
            }
        };
        run_ok(&mut cmd, &self.scratch, &Interrupt::none(), None).map(|_| ())
    }
}

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            eprintln!(
                "dmkit: warning: could not unmount {}: {e}",
                self.at.display()
            );
        }
    }
}

/// What a build gave.
struct Built {
    image: PathBuf,
    report: serde_json::Value,
}

fn build_row(
    dmkit: &Dmkit,
    r: &SeedRow,
    tree: &Path,
    ws: &Workspace,
    interrupt: &Interrupt,
) -> Result<Built, BenchError> {
    // Row 1 mounts the bare file system: a --split build gives it as a file of its own.
    let split = r.mount == Mount::PlainRw;
    let image = ws.path(&format!(
        "{:02}-{}-{}.{}",
        r.n,
        r.fs,
        r.compress.replace(',', "-"),
        if split { "raw" } else { "img" }
    ));
    let mut args: Vec<std::ffi::OsString> = vec![
        "image".into(),
        "build".into(),
        tree.into(),
        image.clone().into(),
        "--fs".into(),
        r.fs.into(),
        "--compress".into(),
        r.compress.into(),
        "--json".into(),
    ];
    if split {
        args.push("--split".into());
    }
    let out = run_ok(&mut dmkit.command(&args), ws.dir(), interrupt, None)?;
    let report = serde_json::from_str(&out.stdout)
        .map_err(|e| BenchError::Tool(format!("dmkit image build --json: {e}")))?;
    Ok(Built { image, report })
}

/// Drop caches, mount `b` at `mp` (timed), read the tree (timed).
fn measure(
    dmkit: &Dmkit,
    r: &SeedRow,
    b: &Built,
    mp: &Path,
    ws: &Workspace,
    interrupt: &Interrupt,
) -> Result<(f64, f64, u64, u64), BenchError> {
    drop_caches()?;
    let t = Instant::now();
    let mut cmd = match r.mount {
        Mount::ImageOpen => dmkit.command([
            "image".as_ref(),
            "open".as_ref(),
            b.image.as_os_str(),
            mp.as_os_str(),
        ]),
        Mount::PlainRw => {
            let mut c = std::process::Command::new("mount");
            c.args(["-t", r.fs, "-o", "loop"]).arg(&b.image).arg(mp);
            c
        }
    };
    let res = run_ok(&mut cmd, ws.dir(), interrupt, None);
    let mut m = Mounted {
        dmkit,
        mount: r.mount,
        at: mp.to_path_buf(),
        scratch: ws.dir().to_path_buf(),
        open: res.is_ok(),
    };
    res?;
    let open_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (files, bytes) = read_tree(mp, interrupt)?;
    let read_s = t.elapsed().as_secs_f64();
    m.undo()?;
    Ok((open_s, read_s, files, bytes))
}

/// What a failed dmkit command said last (its own "dmkit: " line), for a row not built.
pub fn last_message(e: &BenchError) -> String {
    let why = e.to_string();
    why.rsplit("dmkit: ")
        .next()
        .unwrap_or(&why)
        .trim()
        .to_string()
}

/// The bytes of the blocks in use in the ext4 file system at `offset` of `image`, from its
/// superblock (`None` if it is not one).
pub fn ext4_used_bytes(image: &Path, offset: u64) -> Result<Option<u64>, BenchError> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(image).map_err(io(format!("open {}", image.display())))?;
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, offset + 1024)
        .map_err(io(format!("read the superblock of {}", image.display())))?;
    Ok(used_from_superblock(&sb))
}

fn used_from_superblock(sb: &[u8; 1024]) -> Option<u64> {
    let le32 = |o: usize| u32::from_le_bytes(sb[o..o + 4].try_into().expect("4 bytes")) as u64;
    if sb[0x38..0x3a] != [0x53, 0xef] || le32(24) > 6 {
        return None;
    }
    let wide = le32(0x60) & 0x80 != 0;
    let hi = |o: usize| if wide { le32(o) << 32 } else { 0 };
    let blocks = le32(4) | hi(0x150);
    let free = le32(12) | hi(0x158);
    Some(blocks.checked_sub(free)? << (10 + le32(24)))
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Run the table.
pub fn run(o: &ImageBenchOptions, interrupt: &Interrupt) -> Result<ImageBenchReport, BenchError> {
    if o.common.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    for n in &o.rows {
        if !SEED_001.iter().any(|r| r.n == *n) {
            return Err(BenchError::Invalid(format!(
                "--rows: there is no row {n} in seed 001's table (1 to 14)"
            )));
        }
    }
    if !is_root() {
        return Err(BenchError::Missing(
            "bench image needs root: it mounts, uses loop devices and drops the page cache".into(),
        ));
    }
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.common.dir)?;
    let (tree, tree_stats) = o.common.pick(ws.dir(), interrupt)?;
    let mut wanted: Vec<u32> = o.rows.clone();
    if !wanted.contains(&BASELINE) {
        wanted.push(BASELINE);
    }
    let rows: Vec<&SeedRow> = SEED_001.iter().filter(|r| wanted.contains(&r.n)).collect();
    let mp = ws.path("mnt");
    std::fs::create_dir(&mp).map_err(io(format!("create {}", mp.display())))?;

    let mut results = Vec::new();
    let mut built = Vec::new();
    for r in &rows {
        let mut res = RowResult {
            n: r.n,
            label: label(r.n),
            fs: r.fs.into(),
            compress: r.compress.into(),
            mount: r.mount,
            mkfs: Vec::new(),
            fs_size: None,
            image_size: None,
            fs_used: None,
            build_s: None,
            open_s: Vec::new(),
            read_s: Vec::new(),
            files_read: 0,
            bytes_read: 0,
            skipped: None,
        };
        let t = Instant::now();
        match build_row(&dmkit, r, &tree.path, &ws, interrupt) {
            Ok(b) => {
                res.build_s = Some(t.elapsed().as_secs_f64());
                res.fs_size = b.report["fs_size"].as_u64();
                res.image_size = b.report["image_size"].as_u64();
                if r.fs == "ext4" {
                    let at = b.report["parts"][0]["offset"].as_u64().unwrap_or(0);
                    res.fs_used = ext4_used_bytes(&b.image, at)?;
                }
                res.mkfs = b.report["mkfs"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                say(
                    o.common.progress,
                    format!(
                        "built #{} {}: {} in {:.1} s",
                        r.n,
                        res.label,
                        human(res.fs_size.unwrap_or(0)),
                        t.elapsed().as_secs_f64()
                    ),
                );
                built.push(Some(b));
            }
            Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
            Err(e) => {
                let why = last_message(&e);
                say(
                    o.common.progress,
                    format!("#{} {}: not built: {why}", r.n, res.label),
                );
                res.skipped = Some(why);
                built.push(None);
            }
        }
        results.push(res);
    }

    for run in 0..o.common.runs {
        for (k, r) in rows.iter().enumerate() {
            let Some(b) = &built[k] else { continue };
            if results[k].skipped.is_some() {
                continue;
            }
            let m = measure(&dmkit, r, b, &mp, &ws, interrupt);
            crate::bench::harness::process::notify(crate::bench::harness::process::Event::RunDone);
            match m {
                Ok((open_s, read_s, files, bytes)) => {
                    let res = &mut results[k];
                    res.open_s.push(open_s);
                    res.read_s.push(read_s);
                    res.files_read = files;
                    res.bytes_read = bytes;
                    say(
                        o.common.progress,
                        format!(
                            "run {}/{} #{:<2} {:<22} open {:.2} s, read {} files {} in {:.2} s",
                            run + 1,
                            o.common.runs,
                            r.n,
                            res.label,
                            open_s,
                            files,
                            human(bytes),
                            read_s
                        ),
                    );
                }
                Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                Err(e) if r.n == BASELINE => return Err(e),
                Err(e) => results[k].skipped = Some(e.to_string()),
            }
        }
    }
    if dmkit.replaced() {
        return Err(BenchError::Tool(format!(
            "{} was rebuilt during the benchmark: the runs mix two builds",
            dmkit.exe.display()
        )));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok(ImageBenchReport {
        tree: tree.path,
        tree_source: tree.source,
        tree_stats,
        runs: o.common.runs,
        dir: o.common.dir.clone(),
        kernel,
        rows: results,
    })
}

// The text of `bench image` is seed 001's section of `bench seeds`.
crate::bench::harness::report::impl_report!(ImageBenchReport => crate::bench::seeds::sections::s001::render_command);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documents_table() {
        assert_eq!(SEED_001.len(), 14);
        for (i, r) in SEED_001.iter().enumerate() {
            assert_eq!(r.n as usize, i + 1);
            // Every row's settings are ones `image build` takes.
            let fs = crate::image::mkfs::FsKind::parse(r.fs).unwrap();
            crate::image::mkfs::Compression::parse(fs, Some(r.compress)).unwrap();
        }
        assert_eq!(SEED_001[0].mount, Mount::PlainRw);
        assert!(SEED_001[1..].iter().all(|r| r.mount == Mount::ImageOpen));
    }

    #[test]
    fn ext4_used_size_from_the_superblock() {
        let mut sb = [0u8; 1024];
        sb[0x38..0x3a].copy_from_slice(&[0x53, 0xef]);
        sb[4..8].copy_from_slice(&1000u32.to_le_bytes());
        sb[12..16].copy_from_slice(&250u32.to_le_bytes());
        sb[24..28].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(used_from_superblock(&sb), Some(750 * 4096));
        sb[0x60] = 0x80;
        sb[0x150] = 1;
        assert_eq!(used_from_superblock(&sb), Some(((1 << 32) + 750) * 4096));
        sb[12..16].copy_from_slice(&2000u32.to_le_bytes());
        sb[0x150] = 0;
        assert_eq!(used_from_superblock(&sb), None);
        sb[0x38] = 0;
        assert_eq!(used_from_superblock(&sb), None);
    }

    #[test]
    fn reads_a_tree() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/x"), vec![1u8; 3 << 20]).unwrap();
        std::fs::write(d.path().join("y"), b"abc").unwrap();
        std::os::unix::fs::symlink("a/x", d.path().join("l")).unwrap();
        let (files, bytes) = read_tree(d.path(), &Interrupt::none()).unwrap();
        assert_eq!((files, bytes), (2, (3 << 20) + 3));
    }
}
