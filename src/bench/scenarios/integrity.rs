//! `dmkit bench integrity`: the dm-integrity overhead table of the first source document
//! (fio 4 KiB write, randwrite, read, randread; plain against integrity), on our layers, for
//! each of the kernel's crash-consistency modes: J (journal), B (bitmap) and D (direct).
//!
//! Every side gets its own backing file (each is open read-write, and a file has one
//! writer): `plain` is `dmkit linear open` of a random file, the integrity sides are files
//! formatted with `dmkit integrity format` (crc32c, 4-byte tags, 512-byte sectors, as the
//! document's defaults) and opened with the mode's flag. The jobs run buffered (through the
//! page cache, with an fsync at the end of every writing job so the data reaches the layer)
//! and with O_DIRECT, alternating the sides run by run. Writes run first, so reads read what
//! was written.
//!
//! The last side is the document's last column, crypt+integrity: LUKS2 with
//! `--integrity hmac-sha256` (aes-xts-plain64 + HMAC-SHA-256 tags, 512-byte sectors, mode J),
//! formatted with `dmkit luks format` and opened with `dmkit luks open`.
//!
//! `bench integrity` (not the seeds' table) adds one side after it: integrity alone in mode J
//! with HMAC-SHA-256 tags (32 bytes, 512-byte sectors), the tags crypt+integrity pays for,
//! without the cipher.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bench::harness::fio::fio_rw;
use crate::bench::harness::model::median;
use crate::bench::harness::process::say;
use crate::bench::harness::process::{
    self as harness, run_ok, Dmkit, Export, Interrupt, Workspace,
};
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::harness::table::format_size;
use crate::bench::BenchError;

use super::bound::{self, Bound};

/// The issue's acceptance: a mode's sequential-write bandwidth over plain's.
pub fn write_target(mode: Mode) -> f64 {
    match mode {
        Mode::Journal => 0.60,
        Mode::Bitmap => 0.85,
        Mode::Direct => 0.90,
    }
}

/// The issue's acceptance for reads, every mode.
pub const READ_TARGET: f64 = 0.85;

/// The LUKS2-with-integrity issue's acceptance: crypt+integrity's sequential write and read
/// over plain's, in the document's rows (4 KiB, where it kept 38% and 21%).
pub const CRYPT_WRITE_TARGET: f64 = 0.45;
/// See [`CRYPT_WRITE_TARGET`].
pub const CRYPT_READ_TARGET: f64 = 0.60;

/// A dm-integrity crash-consistency mode (the kernel's mode letter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// J: data and tags go through the journal.
    Journal,
    /// B: a bitmap of dirty regions, recalculated after a crash.
    Bitmap,
    /// D: direct, no crash consistency.
    Direct,
}

impl Mode {
    /// Every mode, in table order.
    pub const ALL: [Mode; 3] = [Mode::Journal, Mode::Bitmap, Mode::Direct];

    /// The kernel's letter.
    pub fn letter(self) -> &'static str {
        match self {
            Mode::Journal => "J",
            Mode::Bitmap => "B",
            Mode::Direct => "D",
        }
    }

    /// The `dmkit integrity format` / `open` flags selecting the mode.
    fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Journal => &[],
            Mode::Bitmap => &["--integrity-bitmap-mode"],
            Mode::Direct => &["--integrity-no-journal"],
        }
    }
}

/// What to run: the data size each side serves, runs, run length, the directory (/dev/shm is
/// RAM-backed, the acceptance case).
pub type IntegrityBenchOptions = RwBenchOptions;

/// One fio job of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// fio `--rw` and the row name.
    pub rw: String,
    /// O_DIRECT (else buffered, with an fsync at the end of a writing job).
    pub direct: bool,
    /// Block size, bytes.
    pub bs: u64,
}

impl Job {
    /// The document's jobs (write, randwrite, read, randread at 4 KiB, buffered), as
    /// `data/seeds.json` gives its method.
    pub fn document() -> Vec<Job> {
        let m = crate::bench::seeds::data::setup("000");
        m.jobs
            .iter()
            .map(|rw| Job {
                rw: rw.clone(),
                direct: m.direct.unwrap_or_default(),
                bs: m.bs.unwrap_or_default(),
            })
            .collect()
    }

    /// The table's rows: the document's jobs, then the same with O_DIRECT; then sequential
    /// write and read at 1 MiB direct, where the layer's own throughput shows rather than the
    /// round trip per request.
    pub fn all() -> Vec<Job> {
        let mut v = Job::document();
        let direct: Vec<Job> = v
            .iter()
            .map(|j| Job {
                direct: true,
                ..j.clone()
            })
            .collect();
        v.extend(direct);
        for rw in ["write", "read"] {
            v.push(Job {
                rw: rw.into(),
                direct: true,
                bs: 1 << 20,
            });
        }
        v
    }

    /// Whether the job writes.
    pub fn writes(&self) -> bool {
        self.rw.contains("write")
    }

    /// Its row label.
    pub fn label(&self) -> String {
        let mut l = self.rw.clone();
        if self.bs != 4096 {
            l.push_str(&format!(" {}", format_size(self.bs)));
        }
        if self.direct {
            l.push_str(" direct");
        }
        l
    }

    /// fio arguments on `file`.
    pub fn args(&self, file: &Path, size: u64, runtime_ms: u64) -> Vec<String> {
        let filename = file.to_string_lossy().replace(':', "\\:");
        let mut v = vec![
            format!("--name={}", self.rw),
            format!("--filename={filename}"),
            format!("--readwrite={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--direct={}", u8::from(self.direct)),
            "--ioengine=libaio".to_string(),
            "--iodepth=1".to_string(),
            format!("--size={size}"),
            "--time_based".to_string(),
            format!("--runtime={runtime_ms}ms"),
            "--numjobs=1".to_string(),
            "--thread".to_string(),
            "--output-format=json".to_string(),
        ];
        if self.writes() && !self.direct {
            v.push("--end_fsync=1".into());
        }
        if !self.writes() && !self.direct {
            // Drop what the write jobs left in the page cache, so reads reach the layer.
            v.push("--invalidate=1".into());
        }
        v
    }
}

/// One row: the median bandwidth of each side, bytes/s, in `IntegrityReport::sides` order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// The job.
    pub job: Job,
    /// Every run's bandwidth per side, bytes/s.
    pub runs: Vec<Vec<f64>>,
}

impl Row {
    /// Median of one side.
    pub fn median(&self, side: usize) -> f64 {
        median(&self.runs[side]).unwrap_or(0.0)
    }
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IntegrityReport {
    /// fio's size, bytes.
    pub size: u64,
    /// Runs per job and side.
    pub runs: u32,
    /// Length of one run, ms.
    pub runtime_ms: u64,
    /// Where the files were.
    pub dir: PathBuf,
    /// Whether each side's backing file was dropped from the page cache before every run (a
    /// disk directory; tmpfs cannot).
    pub page_cache_dropped: bool,
    /// The modes measured, after `plain`.
    pub modes: Vec<Mode>,
    /// Whether a crypt+integrity side follows the modes.
    #[serde(default)]
    pub crypt_integrity: bool,
    /// Whether an integrity side with HMAC-SHA-256 tags (mode J) comes last.
    #[serde(default)]
    pub hmac_journal: bool,
    /// The commands that prepared and opened each side.
    pub commands: Vec<String>,
    /// An example fio command line.
    pub fio_command: String,
    /// One row per job.
    pub rows: Vec<Row>,
    /// Each side's primitive alone, measured after the runs (`bench integrity`; empty when
    /// the rows were run for another table).
    #[serde(default)]
    pub bounds: Vec<PrimitiveBound>,
}

/// The arithmetic of a side alone on in-memory buffers of one request: the integrity sides'
/// tags (crc32c, 4 bytes, 512-byte sectors; HMAC-SHA-256, 32 bytes, for the HMAC side),
/// crypt+integrity's seal (writes: XTS then HMAC-SHA-256 of every sector) or open (reads: a
/// copy of the sealed request, HMAC, XTS).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PrimitiveBound {
    /// The crypt+integrity side (else the integrity sides).
    pub crypt: bool,
    /// The HMAC-SHA-256 integrity side's tags (else crc32c's, or crypt+integrity's).
    #[serde(default)]
    pub hmac: bool,
    /// Request size, bytes.
    pub bs: u64,
    /// Sealing (else opening; the same for the integrity sides' tags).
    pub writes: bool,
    /// One core and all.
    pub bound: Bound,
}

impl IntegrityReport {
    /// The bound of a cell, if measured: crypt+integrity's, the HMAC side's or the crc32c
    /// sides'.
    pub fn bound(&self, crypt: bool, hmac: bool, job: &Job) -> Option<&Bound> {
        self.bounds
            .iter()
            .find(|b| {
                b.crypt == crypt && b.hmac == hmac && b.bs == job.bs && b.writes == job.writes()
            })
            .map(|b| &b.bound)
    }
}

/// Measure [`PrimitiveBound`]s for the request sizes of `jobs`, `dur` per measurement (the
/// HMAC side's tags too when `hmac`).
pub fn measure_bounds(jobs: &[Job], hmac: bool, dur: std::time::Duration) -> Vec<PrimitiveBound> {
    use crate::crypt::cipher::{AeadKind, SectorAead};
    use crate::integrity::tags::{TagAlgorithm, TagHasher};
    let mut sizes: Vec<u64> = jobs.iter().map(|j| j.bs).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut v = Vec::new();
    for bs in sizes {
        let len = bs as usize;
        let n = len / 512;
        // A side's tags alone, the same bound for its writes and its reads.
        let mut tags = |alg: TagAlgorithm, key: Option<&[u8]>, ts: usize, hmac: bool| {
            let tags = bound::measure(dur, len, || {
                let h = TagHasher::new(alg, key, None, ts, 512).expect("tags of 512-byte sectors");
                let (buf, mut out) = (vec![0x5au8; len], vec![0u8; n * ts]);
                move || h.tag_blocks(8, &buf, &mut out)
            });
            for writes in [true, false] {
                v.push(PrimitiveBound {
                    crypt: false,
                    hmac,
                    bs,
                    writes,
                    bound: tags,
                });
            }
        };
        tags(TagAlgorithm::Crc32c, None, 4, false);
        if hmac {
            tags(TagAlgorithm::HmacSha256, Some(&[0x42u8; 32]), 32, true);
        }
        let aead = || {
            let kind = AeadKind::AuthencXts {
                sha512: false,
                random_iv: false,
            };
            SectorAead::new(kind, &[0x42u8; 96], 512).expect("authenc over 512-byte sectors")
        };
        let seal = bound::measure(dur, len, || {
            let a = aead();
            let (mut buf, mut meta) = (vec![0x5au8; len], vec![0u8; n * 32]);
            move || {
                let _ = a.seal_sectors(8, &mut buf, &mut meta, 32);
            }
        });
        let open = bound::measure(dur, len, || {
            let a = aead();
            let (mut sealed, mut meta) = (vec![0x5au8; len], vec![0u8; n * 32]);
            let _ = a.seal_sectors(8, &mut sealed, &mut meta, 32);
            let mut buf = sealed.clone();
            move || {
                buf.copy_from_slice(&sealed);
                let _ = a.open_sectors(8, &mut buf, &meta, 32);
            }
        });
        for (writes, bound) in [(true, seal), (false, open)] {
            v.push(PrimitiveBound {
                crypt: true,
                hmac: false,
                bs,
                writes,
                bound,
            });
        }
    }
    v
}

fn fio(
    job: &Job,
    file: &Path,
    o: &IntegrityBenchOptions,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<f64, BenchError> {
    let args = job.args(file, o.size, o.runtime_ms);
    let r = fio_rw(&job.label(), &args, file, o.runtime_ms, scratch, interrupt)?;
    Ok(if job.writes() { r.write } else { r.read })
}

/// Size of an integrity image whose data area holds at least `size` bytes: the tags (4 per
/// 512-byte sector: under 1%), the journal and padding fit in the margin.
fn image_size(size: u64) -> u64 {
    size + size / 32 + (80 << 20)
}

/// Refuse an export that serves fewer than `size` bytes.
fn check_size(e: &Export, size: u64) -> Result<(), BenchError> {
    let have = std::fs::metadata(e.path())
        .map_err(|source| BenchError::Io {
            what: format!("reading the size of {}", e.path().display()),
            source,
        })?
        .len();
    if have < size {
        return Err(BenchError::Tool(format!(
            "{} provides {have} bytes, fewer than --size {size}",
            e.path().display(),
        )));
    }
    Ok(())
}

/// Prepare, open and return one integrity side: crc32c tags, or HMAC-SHA-256 ones when
/// `hmac`.
fn open_integrity(
    dmkit: &Dmkit,
    mode: Mode,
    hmac: bool,
    o: &IntegrityBenchOptions,
    ws: &Workspace,
    interrupt: &Interrupt,
    commands: &mut Vec<String>,
) -> Result<Export, BenchError> {
    let stem = format!(
        "integrity-{}{}",
        mode.letter(),
        if hmac { "-hmac" } else { "" }
    );
    let img = ws.path(&format!("{stem}.img"));
    let key = ws.path(&format!("{stem}.key"));
    let io = |source| BenchError::Io {
        what: format!("creating {}", img.display()),
        source,
    };
    // HMAC tags take 32 bytes per 512-byte sector (1/16) beside the margin.
    let tags = if hmac { o.size / 16 } else { 0 };
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(image_size(o.size) + tags))
        .map_err(io)?;
    let img_s = img.to_string_lossy().into_owned();
    let mut alg: Vec<String> = Vec::new();
    if hmac {
        std::fs::write(&key, [0x42u8; 32]).map_err(|source| BenchError::Io {
            what: format!("writing {}", key.display()),
            source,
        })?;
        alg = ["-I", "hmac-sha256", "--integrity-key-size", "32"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        alg.push("--integrity-key-file".into());
        alg.push(key.to_string_lossy().into_owned());
    }
    let mut format: Vec<String> = vec!["integrity".into(), "format".into(), "-q".into()];
    format.extend(mode.flags().iter().map(|s| s.to_string()));
    format.extend(alg.iter().cloned());
    format.push(img_s.clone());
    let mut cmd = dmkit.command(&format);
    commands.push(format!("dmkit {}", format.join(" ")));
    run_ok(&mut cmd, ws.dir(), interrupt, None)?;
    let name = format!("bench{}-{stem}", std::process::id());
    let mut open: Vec<String> = vec!["integrity".into(), "open".into()];
    open.extend(mode.flags().iter().map(|s| s.to_string()));
    open.extend(alg);
    open.push(img_s);
    open.push(name.clone());
    commands.push(format!("dmkit {}", open.join(" ")));
    say(o.progress, format!("opening {stem} as {name}"));
    let e = dmkit.open(&name, &open, ws.dir(), interrupt)?;
    check_size(&e, o.size)?;
    Ok(e)
}

/// Prepare, open and return the crypt+integrity side: LUKS2, aes-xts-plain64 with
/// hmac-sha256, 512-byte sectors, journal. Not wiped: the data is written through it before
/// the runs, so every sector read has a real tag.
fn open_crypt_integrity(
    dmkit: &Dmkit,
    o: &IntegrityBenchOptions,
    ws: &Workspace,
    interrupt: &Interrupt,
    commands: &mut Vec<String>,
) -> Result<Export, BenchError> {
    let img = ws.path("crypt-integrity.img");
    let key = ws.path("crypt-integrity.pass");
    let io = |source| BenchError::Io {
        what: format!("creating {}", img.display()),
        source,
    };
    // Tags of 32 bytes per 512-byte sector (1/16), the 16 MiB header, the journal: all in
    // the margin.
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(image_size(o.size) + o.size / 16 + (16 << 20)))
        .map_err(io)?;
    std::fs::write(&key, "bench passphrase").map_err(|source| BenchError::Io {
        what: format!("writing {}", key.display()),
        source,
    })?;
    let img_s = img.to_string_lossy().into_owned();
    let key_s = key.to_string_lossy().into_owned();
    let format: Vec<String> = [
        "luks",
        "format",
        "-q",
        "--integrity",
        "hmac-sha256",
        "--sector-size",
        "512",
        "--integrity-no-wipe",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &key_s,
        &img_s,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    commands.push(format!("dmkit {}", format.join(" ")));
    run_ok(&mut dmkit.command(&format), ws.dir(), interrupt, None)?;
    let name = format!("bench{}-crypt-integrity", std::process::id());
    let open: Vec<String> = ["luks", "open", &img_s, &name, "--key-file", &key_s]
        .iter()
        .map(|s| s.to_string())
        .collect();
    commands.push(format!("dmkit {}", open.join(" ")));
    say(o.progress, format!("opening crypt+integrity as {name}"));
    let e = dmkit.open(&name, &open, ws.dir(), interrupt)?;
    check_size(&e, o.size)?;
    Ok(e)
}

/// Run the table.
pub fn run(
    o: &IntegrityBenchOptions,
    interrupt: &Interrupt,
) -> Result<IntegrityReport, BenchError> {
    let mut r = run_sides(o, Job::all(), true, interrupt)?;
    interrupt.check()?;
    say(o.progress, "measuring the primitives alone".to_string());
    let jobs: Vec<Job> = r.rows.iter().map(|row| row.job.clone()).collect();
    r.bounds = measure_bounds(&jobs, true, std::time::Duration::from_millis(500));
    Ok(r)
}

/// Run the table's rows for `jobs` only (`bench seeds` runs the document's four), on the
/// document's sides.
pub fn run_jobs(
    o: &IntegrityBenchOptions,
    jobs: Vec<Job>,
    interrupt: &Interrupt,
) -> Result<IntegrityReport, BenchError> {
    run_sides(o, jobs, false, interrupt)
}

/// Run `jobs` on the document's sides, and on the HMAC-SHA-256 integrity side when `hmac`.
fn run_sides(
    o: &IntegrityBenchOptions,
    jobs: Vec<Job>,
    hmac: bool,
    interrupt: &Interrupt,
) -> Result<IntegrityReport, BenchError> {
    o.check()?;
    crate::bench::harness::fio::check_installed()?;
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.dir)?;
    let modes = Mode::ALL.to_vec();
    let mut commands = Vec::new();
    let mut exports: Vec<Export> = Vec::new();
    // On a disk, every side's backing file leaves the page cache before each run: the plain
    // image was written through the cache and the integrity images with O_DIRECT, and reads
    // would otherwise compare RAM with the disk.
    let evict = !harness::on_tmpfs(&o.dir);
    let mut images: Vec<PathBuf> = Vec::new();

    let data = ws.path("plain.img");
    harness::write_random_data(o.progress, &data, o.size, interrupt)?;
    let name = format!("bench{}-integrity-plain", std::process::id());
    let args: Vec<String> = vec![
        "linear".into(),
        "open".into(),
        data.to_string_lossy().into_owned(),
        name.clone(),
    ];
    commands.push(format!("dmkit {}", args.join(" ")));
    exports.push(dmkit.open(&name, &args, ws.dir(), interrupt)?);
    images.push(data.clone());
    for &m in &modes {
        say(o.progress, format!("formatting integrity ({})", m.letter()));
        exports.push(open_integrity(
            &dmkit,
            m,
            false,
            o,
            &ws,
            interrupt,
            &mut commands,
        )?);
        images.push(ws.path(&format!("integrity-{}.img", m.letter())));
    }
    say(o.progress, "formatting crypt+integrity".to_string());
    exports.push(open_crypt_integrity(
        &dmkit,
        o,
        &ws,
        interrupt,
        &mut commands,
    )?);
    images.push(ws.path("crypt-integrity.img"));
    if hmac {
        say(
            o.progress,
            "formatting integrity (J, hmac-sha256)".to_string(),
        );
        let j = Mode::Journal;
        exports.push(open_integrity(
            &dmkit,
            j,
            true,
            o,
            &ws,
            interrupt,
            &mut commands,
        )?);
        images.push(ws.path(&format!("integrity-{}-hmac.img", j.letter())));
    }

    // Every side serves the same data, written through it: reads then check real tags over
    // real data, and on a disk no side reads never-written (unwritten, free) extents.
    for (k, e) in exports.iter().enumerate().skip(1) {
        say(
            o.progress,
            format!(
                "writing the plain image's data through {}",
                side_name(&modes, k)
            ),
        );
        harness::fill_from(&data, e.path(), o.size, interrupt)?;
    }

    let fio_command = format!(
        "fio {}",
        jobs[0]
            .args(exports[0].path(), o.size, o.runtime_ms)
            .join(" ")
    );
    let n = exports.len();
    let mut rows: Vec<Row> = jobs
        .iter()
        .map(|j| Row {
            job: j.clone(),
            runs: vec![Vec::new(); n],
        })
        .collect();
    for run in 0..o.runs as usize {
        for row in rows.iter_mut() {
            for k in 0..n {
                let side = (k + run) % n;
                interrupt.check()?;
                if evict {
                    harness::evict_from_page_cache(&images[side])?;
                }
                let bw = fio(&row.job, exports[side].path(), o, ws.dir(), interrupt)?;
                say(
                    o.progress,
                    format!(
                        "run {}/{} {:<16} {:<12} {:.1} MB/s",
                        run + 1,
                        o.runs,
                        row.job.label(),
                        side_name(&modes, side),
                        bw / 1e6
                    ),
                );
                row.runs[side].push(bw);
            }
        }
    }
    for e in exports.drain(..).rev() {
        e.close()?;
    }
    Ok(IntegrityReport {
        size: o.size,
        runs: o.runs,
        page_cache_dropped: evict,
        runtime_ms: o.runtime_ms,
        dir: o.dir.clone(),
        modes,
        crypt_integrity: true,
        hmac_journal: hmac,
        commands,
        fio_command,
        rows,
        bounds: Vec::new(),
    })
}

fn side_name(modes: &[Mode], side: usize) -> String {
    match side {
        0 => "plain".into(),
        s if s <= modes.len() => format!("integrity {}", modes[s - 1].letter()),
        s if s == modes.len() + 1 => "crypt+integrity".into(),
        _ => HMAC_SIDE.into(),
    }
}

/// The name of the HMAC-SHA-256 integrity side.
pub const HMAC_SIDE: &str = "integrity J hmac-sha256";

/// The target a cell is judged by, if any: sequential writes per mode, every read.
pub fn target(job: &Job, mode: Mode) -> Option<f64> {
    match job.rw.as_str() {
        "write" => Some(write_target(mode)),
        "read" | "randread" => Some(READ_TARGET),
        _ => None,
    }
}

/// The target of crypt+integrity's cell, if any: sequential write and read at the
/// document's 4 KiB (the 1 MiB rows show the layer's own throughput, bound by HMAC-SHA-256
/// over every 512-byte sector, and are reported without a target).
pub fn crypt_target(job: &Job) -> Option<f64> {
    match job.rw.as_str() {
        _ if job.bs != 4096 => None,
        "write" => Some(CRYPT_WRITE_TARGET),
        "read" => Some(CRYPT_READ_TARGET),
        _ => None,
    }
}

/// The acceptance of the sides with HMAC-SHA-256 tags (crypt+integrity and integrity J
/// hmac-sha256) at 1 MiB direct, write and read over plain's: each is judged by the lower of
/// this and its queue-depth-1 bound (plain's time plus the arithmetic's, measured in the
/// same run).
pub fn hmac_target(job: &Job) -> Option<f64> {
    match job.rw.as_str() {
        _ if job.bs != 1 << 20 || !job.direct => None,
        "write" => Some(HMAC_WRITE_TARGET),
        "read" => Some(HMAC_READ_TARGET),
        _ => None,
    }
}

/// See [`hmac_target`].
pub const HMAC_WRITE_TARGET: f64 = 0.45;
/// See [`hmac_target`].
pub const HMAC_READ_TARGET: f64 = 0.55;

// The text of `bench integrity` is its section of `bench seeds`: the same rows, the same
// renderer, its targets under them.
crate::bench::harness::report::impl_report!(IntegrityReport => crate::bench::seeds::sections::s000::render_command);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_cover_the_documents_rows_buffered_and_direct() {
        let jobs = Job::all();
        assert_eq!(jobs.len(), 10);
        assert_eq!(jobs[0].label(), "write");
        assert_eq!(jobs[7].label(), "randread direct");
        assert_eq!(jobs[8].label(), "write 1 MiB direct");
        let a = jobs[0].args(Path::new("/x"), 1 << 20, 1000);
        assert!(a.contains(&"--end_fsync=1".to_string()));
        assert!(a.contains(&"--direct=0".to_string()));
        let a = jobs[6].args(Path::new("/x"), 1 << 20, 1000);
        assert!(a.contains(&"--direct=1".to_string()));
        assert!(!a.iter().any(|s| s.starts_with("--end_fsync")));
    }

    #[test]
    fn bounds_cover_every_side_and_direction() {
        let job = Job {
            rw: "read".into(),
            direct: true,
            bs: 4096,
        };
        for hmac in [false, true] {
            let v = measure_bounds(
                std::slice::from_ref(&job),
                hmac,
                std::time::Duration::from_millis(5),
            );
            assert_eq!(v.len(), if hmac { 6 } else { 4 });
            let r = IntegrityReport {
                size: 0,
                runs: 0,
                runtime_ms: 0,
                dir: "/".into(),
                page_cache_dropped: false,
                modes: vec![],
                crypt_integrity: true,
                hmac_journal: hmac,
                commands: vec![],
                fio_command: String::new(),
                rows: vec![],
                bounds: v,
            };
            for (crypt, side_hmac) in [(false, false), (true, false), (false, true)] {
                let b = r.bound(crypt, side_hmac, &job);
                assert_eq!(b.is_some(), !side_hmac || hmac, "{crypt} {side_hmac}");
                assert!(b.is_none_or(|b| b.one_core > 0.0 && b.all_cores > 0.0));
            }
        }
    }

    #[test]
    fn targets_follow_the_issue() {
        let w = Job {
            rw: "write".into(),
            direct: false,
            bs: 4096,
        };
        let rw = Job {
            rw: "randwrite".into(),
            direct: true,
            bs: 4096,
        };
        let r = Job {
            rw: "randread".into(),
            direct: true,
            bs: 4096,
        };
        assert_eq!(target(&w, Mode::Journal), Some(0.60));
        assert_eq!(target(&w, Mode::Bitmap), Some(0.85));
        assert_eq!(target(&w, Mode::Direct), Some(0.90));
        assert_eq!(target(&rw, Mode::Direct), None);
        assert_eq!(target(&r, Mode::Journal), Some(READ_TARGET));
    }
}
