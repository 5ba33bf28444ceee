//! `dmkit bench seeds`: a tiny smoke run (8 MiB per side, one 300 ms run per fio job, a
//! 48-file tree for the images) produces every file of the report; every ratio in
//! report.json is recomputed from its own raw figures (and the document's outlier rule from
//! its runs); the plotted values are the table's, for every kind of plot. The smoke run is
//! made once and shared by the tests of this file. A per-document command (`bench crypt`)
//! prints its section of the report.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::env;
use dmkit::bench::seeds::data::Seeds;
use dmkit::bench::seeds::model::{SeedRow, SeedsReport};
use dmkit::bench::seeds::plot::{self, Kind};
use dmkit::bench::seeds::render;

/// What the smoke run needs; `true` (and a message, or a panic in CI) when something is
/// missing.
fn missing() -> bool {
    env::loop_missing()
        || env::tools_missing(&[
            ("fio", "fio"),
            ("mksquashfs", "squashfs-tools"),
            ("mkfs.erofs", "erofs-utils"),
            ("mkfs.ext4", "e2fsprogs"),
        ])
        || (!Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists()
            && std::env::var_os("DMKIT_PLOT_FONT").is_none()
            && env::missing("no font for the plots (apt-get install fonts-dejavu-core)"))
}

/// The smoke run's output directory (made once; `None` when the machine cannot run it).
fn smoke() -> Option<&'static Path> {
    static DIR: OnceLock<Option<(tempfile::TempDir, PathBuf)>> = OnceLock::new();
    DIR.get_or_init(|| {
        if missing() {
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("report");
        let run = common::run::RunDir::new();
        let t = Instant::now();
        let r = common::run::run_in(
            common::DMKIT,
            &["bench", "seeds", "--tiny", "--out", out.to_str().unwrap()],
            run.path(),
            Duration::from_secs(600),
        );
        r.assert_ok();
        eprintln!("smoke run: {:.1} s", t.elapsed().as_secs_f64());
        Some((tmp, out))
    })
    .as_ref()
    .map(|(_, p)| p.as_path())
}

fn report(dir: &Path) -> SeedsReport {
    let text = std::fs::read_to_string(dir.join("report.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn the_smoke_run_writes_every_file() {
    let Some(dir) = smoke() else { return };
    let r = report(dir);
    for f in ["report.md", "report.json"] {
        assert!(dir.join(f).metadata().unwrap().len() > 0, "{f}");
    }
    let specs = plot::specs(&r);
    let stems: Vec<&str> = specs.iter().map(|s| s.stem.as_str()).collect();
    // Throughput bars of 000, 002, 003, 004; ratios of every document; 001's scatter; nothing
    // else.
    let mut want = vec![
        "seed000-fio-4-kib-buffered-throughput".to_string(),
        "seed002-fio-4-kib-buffered-throughput".into(),
        "seed003-readwrite-4k-direct-throughput".into(),
        "seed004-throughput".into(),
    ];
    want.extend(["000", "001", "002", "003", "004"].map(|s| format!("seed{s}-ratios")));
    want.push("seed001-size-vs-read-time".into());
    let mut got: Vec<String> = stems.iter().map(|s| s.to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    for s in &specs {
        // No word twice in a row ("seed004-throughput-throughput").
        let words: Vec<&str> = s.stem.split('-').collect();
        assert!(words.windows(2).all(|w| w[0] != w[1]), "{}", s.stem);
        let kind = match s.kind {
            Kind::Throughput => s.stem.ends_with("throughput"),
            Kind::Ratios => s.stem.ends_with("-ratios"),
            Kind::Scatter => s.stem == "seed001-size-vs-read-time",
        };
        assert!(kind, "{} {:?}", s.stem, s.kind);
    }
    for s in &specs {
        for ext in ["svg", "png"] {
            let p = dir.join(format!("{}.{ext}", s.stem));
            assert!(p.metadata().unwrap().len() > 1000, "{}", p.display());
        }
    }
    let png = std::fs::read(dir.join("seed001-size-vs-read-time.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for want in [
        "## Machine",
        "- kernel: ",
        "- CPU flags: ",
        "- fio: fio-",
        "- load average before: ",
        "## The kernel's column",
        "## Seed 000",
        "## Seed 004",
        "## Every command run",
        "fio --name=",
        "![seed001-size-vs-read-time.png](seed001-size-vs-read-time.png)",
        "https://blog.cloudflare.com/speeding-up-linux-disk-encryption/",
        // Seed 000's outlier rule, named where it applies.
        "Outliers, as the document states its rule (each case measured 10 times",
    ] {
        assert!(md.contains(want), "report.md lacks {want:?}");
    }
    assert_eq!(r.sections.len(), 5);
    for s in &r.sections {
        assert_eq!(s.error, None, "seed {}", s.seed);
    }
    // Every row is filled or says why not, on both sides.
    for row in &r.rows {
        assert!(
            (row.dmkit.is_some() && row.base.is_some()) || row.empty.is_some(),
            "{row:?}"
        );
        assert!(row.doc.is_some() || row.doc_missing.is_some(), "{row:?}");
        assert!(!row.kernel.is_empty(), "{row:?}");
    }
    // Every figure of the documents has its row.
    let seeds = Seeds::load();
    for f in &seeds.figures {
        assert!(
            r.rows.iter().any(|x| x.key.seed == f.key.seed
                && x.key.table == f.key.table
                && x.doc
                    .as_ref()
                    .is_some_and(|d| d.value == f.value && d.ratio == f.doc_ratio())),
            "no row carries {f:?}"
        );
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn every_ratio_is_recomputed_from_its_raw_figures() {
    let Some(dir) = smoke() else { return };
    let r = report(dir);
    let seeds = Seeds::load();
    let mut checked = 0;
    for row in &r.rows {
        let rule = seeds.setup(&row.key.seed).outliers;
        for f in [&row.dmkit, &row.base].into_iter().flatten() {
            // The runs kept and dropped are the document's rule applied to all of them (seed
            // 000: 100% or more off the mean of all runs), and nothing is dropped elsewhere.
            let all: Vec<f64> = f.runs.iter().chain(&f.outliers).copied().collect();
            let mean = all.iter().sum::<f64>() / all.len() as f64;
            match rule {
                Some(rule) => {
                    for x in &f.runs {
                        assert!((x - mean).abs() < rule.max_off_mean * mean, "{row:?}");
                    }
                    for x in &f.outliers {
                        assert!((x - mean).abs() >= rule.max_off_mean * mean, "{row:?}");
                    }
                }
                None => assert!(f.outliers.is_empty(), "{row:?}"),
            }
            assert!(close(f.median, median(&f.runs)), "{row:?}");
            let min = f.runs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = f.runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(close(f.min, min) && close(f.max, max), "{row:?}");
        }
        match (&row.dmkit, &row.base) {
            // The one row without a ratio although both sides ran: a baseline of 0, which
            // the row says.
            (Some(_), Some(b)) if median(&b.runs) == 0.0 => {
                assert!(row.ratio.is_none() && row.empty.is_some(), "{row:?}");
            }
            (Some(d), Some(b)) => {
                let q = median(&d.runs) / median(&b.runs);
                assert!(close(row.ratio.unwrap(), q), "{row:?}");
                checked += 1;
            }
            _ => assert_eq!(row.ratio, None, "{row:?}"),
        }
        if let Some(doc) = &row.doc {
            let want = match (doc.value, doc.baseline) {
                (Some(v), Some(b)) => Some(v / b),
                // Published as a ratio only (seed 004: one per configuration, for all its
                // rows; "integrity sha256, 4 KiB sectors" stands beside the paper's "integrity
                // sha256", whose sector size the paper does not give).
                _ => seeds
                    .figures
                    .iter()
                    .find(|f| {
                        f.key.seed == row.key.seed
                            && f.key.table == row.key.table
                            && f.key.config == row.key.config.split(',').next().unwrap()
                    })
                    .and_then(|f| f.ratio),
            };
            assert_eq!(doc.ratio, want, "{row:?}");
        }
    }
    assert!(checked >= 40, "only {checked} measured rows");
}

/// The values the bars of `row` should show, per series: throughput (dmkit, baseline) as
/// (median, min, max), or ratios (dmkit, document).
fn bar_values(row: &SeedRow, throughput: bool) -> Vec<Option<(f64, f64, f64)>> {
    let fig = |f: &Option<dmkit::bench::seeds::model::Figure>| {
        f.as_ref().map(|f| (f.median, f.min, f.max))
    };
    if throughput {
        vec![fig(&row.dmkit), fig(&row.base)]
    } else {
        vec![
            row.ratio.map(|q| (q, q, q)),
            row.doc.as_ref().and_then(|d| d.ratio).map(|q| (q, q, q)),
        ]
    }
}

#[test]
fn the_plots_show_the_tables_values() {
    let Some(dir) = smoke() else { return };
    let r = report(dir);
    let specs = plot::specs(&r);
    let mut points = 0;
    for s in &specs {
        assert_eq!(s.labels.len(), s.rows.len(), "{}", s.stem);
        for (i, &k) in s.rows.iter().enumerate() {
            let row = &r.rows[k];
            match s.kind {
                Kind::Throughput | Kind::Ratios => {
                    let want = bar_values(row, s.kind == Kind::Throughput);
                    for (series, w) in s.series.iter().zip(want) {
                        let got = series.values[i].map(|v| (v.y, v.lo, v.hi));
                        assert_eq!(got, w, "{} {} {}", s.stem, s.labels[i], series.name);
                        points += usize::from(got.is_some());
                    }
                }
                Kind::Scatter => {
                    let time = r
                        .rows
                        .iter()
                        .find(|x| {
                            x.key.seed == "001"
                                && x.key.table != row.key.table
                                && x.key.row == row.key.row
                        })
                        .unwrap();
                    let dm = s.series[0].values[i].map(|v| (v.x, v.y));
                    assert_eq!(dm, row.ratio.zip(time.ratio), "{}", row.key.row);
                    let doc = s.series[1].values[i].map(|v| (v.x, v.y));
                    let ratio = |x: &SeedRow| x.doc.as_ref().and_then(|d| d.ratio);
                    assert_eq!(doc, ratio(row).zip(ratio(time)), "{}", row.key.row);
                    points += 1;
                }
            }
        }
    }
    assert!(points > 100, "{points} plotted values");
    // And the tables print the same figures.
    for (seed, table) in render::tables(&r.rows) {
        let text = render::table(&r.rows, &seed, &table);
        for row in r
            .rows
            .iter()
            .filter(|x| x.key.seed == seed && x.key.table == table)
        {
            if let (Some(d), Some(q)) = (&row.dmkit, row.ratio) {
                assert!(text.contains(&render::figure(d)), "{text}\n{row:?}");
                assert!(text.contains(&render::ratio(q)), "{text}\n{row:?}");
            }
        }
    }
}

/// `bench crypt` (seed 003's scenario, tiny) prints its section of the report: the document's
/// source, the setup, the table in the report's columns, the study's target.
#[test]
fn a_per_document_command_prints_its_section() {
    if env::tools_missing(&[("fio", "fio")]) {
        return;
    }
    let run = common::run::RunDir::new();
    let t = Instant::now();
    let r = common::run::run_in(
        common::DMKIT,
        &[
            "bench",
            "crypt",
            "--quick",
            "--size",
            "8M",
            "--runtime",
            "0.3",
            "--runs",
            "1",
        ],
        run.path(),
        Duration::from_secs(120),
    );
    r.assert_ok();
    eprintln!("bench crypt: {:.1} s", t.elapsed().as_secs_f64());
    let out = &r.stdout;
    assert!(
        out.starts_with("seed 003: Source: \"Speeding up Linux disk encryption"),
        "{out}"
    );
    for want in [
        "- fio: fio --name=readwrite ",
        "--readwrite=readwrite --bs=4096 --direct=1",
        "seed 003, readwrite 4k direct (dmkit and baseline in MB/s)",
        "| crypt / plain ",
        "| crypt over its bound / bound |",
        "147 / 1126 MB/s",
        "target: crypt >= 0.80 of its bound: read ",
    ] {
        assert!(out.contains(want), "lacks {want:?}:\n{out}");
    }
    // The header's cells (their padding follows the measured figures' widths).
    let cells = |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).collect() };
    let header = out
        .lines()
        .find(|l| l.starts_with("| row "))
        .unwrap_or_else(|| panic!("no table header:\n{out}"));
    assert_eq!(
        cells(header),
        [
            "",
            "row",
            "configuration",
            "dmkit",
            "baseline (same run)",
            "dmkit ratio",
            "document",
            "document ratio",
            "kernel",
            ""
        ],
        "{out}"
    );
}
