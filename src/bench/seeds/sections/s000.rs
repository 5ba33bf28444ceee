//! Seed 000: dm-integrity's overhead (fio 4 KiB buffered write, randwrite, read, randread),
//! plain against integrity (J, the kernel's default, as the document measured; B and D
//! beside it), crypt+integrity and verity. The integrity and crypt+integrity columns are
//! `bench integrity`'s scenario ([`integrity::run_jobs`]) with the document's four jobs; the
//! verity column is `dmkit bench`'s ([`super::verity_reads`]) with plain and verity-cold (every
//! read hashed) on the read jobs, its own plain measured in the same run.
//!
//! `bench integrity` prints its result through [`rows`] too ([`render_command`]): the
//! document's jobs in the document's table, its direct and 1 MiB jobs in a table of their own,
//! each side against its arithmetic alone (the bound measured in the same run) in a third,
//! each direct row against plain's time plus that arithmetic's in a fourth (the most a side can
//! keep at queue depth 1, where nothing overlaps a request's hashing), and its acceptance
//! targets under them.

use super::{mb_s, Ctx, Output, Refs};
use crate::bench::harness::model::OverheadReport;
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::integrity::{self, IntegrityReport, Job, Mode};
use crate::bench::seeds::data::Seeds;
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "000";
const TABLE: &str = "fio 4 KiB buffered";
/// `bench integrity`'s jobs the document did not run (O_DIRECT, 1 MiB).
const OTHER: &str = "fio direct";
/// `bench integrity`'s sides against their arithmetic alone.
const BOUND: &str = "against the arithmetic alone";
/// `bench integrity`'s direct rows against plain's time plus the arithmetic's.
const SERIAL: &str = "against plain then the arithmetic";

/// Runs: the document's jobs x 5 sides, and its 2 read jobs x 2 configurations, per round.
pub fn expected_runs(runs: u64, seeds: &Seeds) -> u64 {
    runs * (seeds.setup(SEED).jobs.len() as u64 * 5 + 2 * 2)
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    let r = integrity::run_jobs(&ctx.rw, Job::document(), ctx.interrupt)?;
    let (line, v) = super::verity_reads(ctx)?;
    let mut s = setup(&r);
    s.push(line);
    Ok((s, rows(&r, Some(&v), ctx.refs())))
}

/// How the integrity scenario ran, one line each.
pub fn setup(r: &IntegrityReport) -> Vec<String> {
    let modes: Vec<&str> = r.modes.iter().map(|m| m.letter()).collect();
    let mut v = vec![
        format!(
            "integrity: {} per side in {}, {} run(s) of {} ms, sides alternated: plain = dmkit linear, integrity = crc32c 4-byte tags, 512-byte sectors, modes {}{}{}{}",
            format_size(r.size),
            r.dir.display(),
            r.runs,
            r.runtime_ms,
            modes.join(", "),
            if r.crypt_integrity {
                "; crypt+integrity = LUKS2 aes-xts-plain64 + hmac-sha256, 512-byte sectors, journal"
            } else {
                ""
            },
            if r.hmac_journal {
                "; integrity J hmac-sha256 = 32-byte HMAC-SHA-256 tags, 512-byte sectors, journal"
            } else {
                ""
            },
            if r.page_cache_dropped {
                "; on a disk: every backing file dropped from the page cache before each run"
            } else {
                ""
            }
        ),
        format!("fio: {}", r.fio_command),
    ];
    v.extend(r.commands.iter().map(|c| format!("setup: {c}")));
    if !r.bounds.is_empty() {
        let cells: Vec<String> = r
            .bounds
            .iter()
            .map(|b| {
                format!(
                    "{} {} {}: {}",
                    format_size(b.bs),
                    if b.writes { "writes" } else { "reads" },
                    bound_name(b.crypt, b.hmac, b.writes),
                    b.bound.cell()
                )
            })
            .collect();
        v.push(format!(
            "the arithmetic alone on in-memory buffers of one request, MB/s on one core / on all (same run; the last table's baseline is the all-core figure): {}",
            cells.join(", ")
        ));
    }
    v
}

/// What a side's arithmetic alone is called: the integrity sides' crc32c tags of 512-byte
/// sectors (HMAC-SHA-256 ones for the HMAC side), crypt+integrity's seal (XTS + HMAC-SHA-256
/// per sector) for writes and open (copy, HMAC, XTS) for reads.
fn bound_name(crypt: bool, hmac: bool, writes: bool) -> &'static str {
    match (crypt, hmac, writes) {
        (false, false, _) => "crc32c tags alone",
        (false, true, _) => "hmac-sha256 tags alone",
        (true, _, true) => "seal alone",
        (true, _, false) => "open alone",
    }
}

/// Which arithmetic a side's bound is: (crypt+integrity's, the HMAC side's).
fn arithmetic(name: &str) -> (bool, bool) {
    (name == "crypt+integrity", name == integrity::HMAC_SIDE)
}

/// The most a side can do at queue depth 1 when its arithmetic does not overlap the
/// transport: every request takes plain's time and then the arithmetic's on all cores, bytes/s.
pub fn serial_bound(plain: f64, arithmetic_all_cores: f64) -> f64 {
    1.0 / (1.0 / plain + 1.0 / arithmetic_all_cores)
}

/// The sides after plain: (name, the document's configuration, kernel note).
fn sides(r: &IntegrityReport, refs: Refs) -> Vec<(String, Option<&'static str>, String)> {
    let integrity_note = kernel_note(refs.kernel, "dm-integrity");
    let mut v: Vec<_> = r
        .modes
        .iter()
        .map(|m| {
            (
                format!("integrity {}", m.letter()),
                (*m == Mode::Journal).then_some("integrity"),
                integrity_note.clone(),
            )
        })
        .collect();
    if r.crypt_integrity {
        v.push((
            "crypt+integrity".into(),
            Some("crypt+integrity"),
            format!(
                "{}; {}",
                kernel_note(refs.kernel, "dm-crypt"),
                integrity_note
            ),
        ));
    }
    if r.hmac_journal {
        v.push((integrity::HMAC_SIDE.into(), None, integrity_note));
    }
    v
}

/// Where a job's rows go: (table, row label).
fn place(job: &Job) -> (&'static str, String) {
    if Job::document().contains(job) {
        (TABLE, job.rw.clone())
    } else {
        (OTHER, job.label())
    }
}

/// The rows of `r` (and of `verity`, `dmkit bench`'s plain against verity-cold, when given).
pub fn rows(r: &IntegrityReport, verity: Option<&OverheadReport>, refs: Refs) -> Vec<SeedRow> {
    let sides = sides(r, refs);
    let mut rows = Vec::new();
    for row in &r.rows {
        let (table, label) = place(&row.job);
        for (k, (name, doc, note)) in sides.iter().enumerate() {
            let mut sr = SeedRow::measured(
                SEED,
                table,
                &label,
                name,
                "plain",
                "MB/s",
                true,
                mb_s(&row.runs[k + 1]),
                mb_s(&row.runs[0]),
            );
            sr = if table == TABLE {
                let fig = doc.and_then(|d| refs.seeds.figure(SEED, TABLE, &label, d));
                sr.with_doc(
                    fig,
                    "the document measured the kernel's default mode (J, journal) only",
                )
            } else {
                sr.with_doc(None, "the document measured 4 KiB buffered I/O only")
            };
            sr.kernel = note.clone();
            rows.push(sr);
        }
    }
    // Each side against its arithmetic alone (`bench integrity` measures it after the runs);
    // then, in a table of their own, the direct rows (one request at a time, nothing between
    // it and the layer) against plain's time plus the arithmetic's, one bound per plain run.
    let mut serial = Vec::new();
    for row in &r.rows {
        for (k, (name, _, note)) in sides.iter().enumerate() {
            let (crypt, hmac) = arithmetic(name);
            let Some(b) = r.bound(crypt, hmac, &row.job) else {
                continue;
            };
            let what = bound_name(crypt, hmac, row.job.writes());
            let against = |table: &str, baseline: &str, base: Vec<f64>| {
                let mut sr = SeedRow::measured(
                    SEED,
                    table,
                    &row.job.label(),
                    name,
                    baseline,
                    "MB/s",
                    true,
                    mb_s(&row.runs[k + 1]),
                    base,
                )
                .with_doc(None, "the document measured no bound");
                sr.kernel = note.clone();
                sr
            };
            rows.push(against(
                BOUND,
                &format!("{what}, all cores"),
                vec![b.all_cores / 1e6],
            ));
            if row.job.direct {
                let bounds: Vec<f64> = row.runs[0]
                    .iter()
                    .map(|&plain| serial_bound(plain, b.all_cores))
                    .collect();
                serial.push(against(
                    SERIAL,
                    &format!("plain, then {what}"),
                    mb_s(&bounds),
                ));
            }
        }
    }
    rows.extend(serial);
    let Some(v) = verity else { return rows };
    // The verity column: dm-verity is read-only, so only the read rows.
    let verity_note = kernel_note(refs.kernel, "dm-verity");
    for job in Job::document() {
        let rw = job.rw.as_str();
        let fig = refs.seeds.figure(SEED, TABLE, rw, "verity");
        let row = v.rows.iter().find(|x| x.workload.name == rw);
        let mut sr = match row {
            Some(x) if x.results.len() == 2 => {
                let (verity, plain) = super::bandwidths(x);
                SeedRow::measured(
                    SEED, TABLE, rw, "verity", "plain", "MB/s", true, verity, plain,
                )
            }
            _ => SeedRow::empty(
                SEED,
                TABLE,
                rw,
                "verity",
                "plain",
                "MB/s",
                "dm-verity is read-only: no write rows (the document: (ro))",
            ),
        };
        sr = sr.with_doc(fig, "dm-verity is read-only (the document: (ro))");
        sr.kernel = verity_note.clone();
        rows.push(sr);
    }
    rows
}

/// `bench integrity`'s acceptance targets, judged on the finished rows' ratios: one line, and
/// one per target missed.
pub fn verdicts(r: &IntegrityReport, rows: &[SeedRow]) -> Vec<String> {
    let ratio = |job: &Job, config: &str| {
        let (table, label) = place(job);
        rows.iter()
            .find(|x| x.key.table == table && x.key.row == label && x.key.config == config)
            .and_then(|x| x.ratio)
    };
    let mut missed = Vec::new();
    // The HMAC sides' 1 MiB lines, met or not, each printed.
    let mut hmac_lines = Vec::new();
    let mut hmac_missed = 0usize;
    for row in &r.rows {
        let mut cells: Vec<(String, Option<f64>)> = r
            .modes
            .iter()
            .map(|&m| {
                (
                    format!("integrity {}", m.letter()),
                    integrity::target(&row.job, m),
                )
            })
            .collect();
        if r.crypt_integrity {
            cells.push(("crypt+integrity".into(), integrity::crypt_target(&row.job)));
        }
        for (config, target) in cells {
            if let (Some(t), Some(q)) = (target, ratio(&row.job, &config)) {
                if q < t {
                    missed.push(format!(
                        "  {config} {}: {q:.2} of plain, target {t:.2}: NOT MET",
                        row.job.label()
                    ));
                }
            }
        }
        // The HMAC sides at 1 MiB: the target, or the queue-depth-1 bound where it is lower.
        let Some(t) = integrity::hmac_target(&row.job) else {
            continue;
        };
        for (config, on) in [
            ("crypt+integrity", r.crypt_integrity),
            (integrity::HMAC_SIDE, r.hmac_journal),
        ] {
            let (crypt, hmac) = arithmetic(config);
            let plain = row.median(0);
            let (Some(q), Some(b), true) =
                (ratio(&row.job, config), r.bound(crypt, hmac, &row.job), on)
            else {
                continue;
            };
            let bound = serial_bound(plain, b.all_cores) / plain;
            let line = format!(
                "{config} {}: {q:.2} of plain, target {t:.2} or the queue-depth-1 bound {bound:.2} where lower",
                row.job.label()
            );
            let met = q >= t.min(bound);
            hmac_missed += usize::from(!met);
            hmac_lines.push(format!("  {line}: {}", if met { "met" } else { "NOT MET" }));
        }
    }
    let mut v = vec![format!(
        "targets (RAM-backed): sequential write J >= {:.2}, B >= {:.2}, D >= {:.2} of plain; reads >= {:.2}{}: {}",
        integrity::write_target(Mode::Journal),
        integrity::write_target(Mode::Bitmap),
        integrity::write_target(Mode::Direct),
        integrity::READ_TARGET,
        if r.crypt_integrity {
            format!(
                "; crypt+integrity 4 KiB write >= {:.2}, read >= {:.2}; HMAC sides 1 MiB direct write >= {:.2}, read >= {:.2}, or their queue-depth-1 bound where lower",
                integrity::CRYPT_WRITE_TARGET,
                integrity::CRYPT_READ_TARGET,
                integrity::HMAC_WRITE_TARGET,
                integrity::HMAC_READ_TARGET
            )
        } else {
            String::new()
        },
        match missed.len() + hmac_missed {
            0 => "all met".to_string(),
            n => format!("{n} NOT MET"),
        }
    )];
    v.extend(missed);
    v.extend(hmac_lines);
    v
}

/// What `bench integrity` prints: its section, then its targets.
pub fn render_command(r: &IntegrityReport) -> String {
    super::command_text(
        SEED,
        |refs| (setup(r), rows(r, None, refs)),
        |rows| verdicts(r, rows),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scenarios::bound::Bound;
    use crate::bench::scenarios::integrity::{PrimitiveBound, Row};

    fn report(runs: Vec<Vec<f64>>) -> IntegrityReport {
        IntegrityReport {
            size: 1 << 20,
            runs: runs[0].len() as u32,
            runtime_ms: 1000,
            dir: "/dev/shm".into(),
            page_cache_dropped: false,
            modes: vec![Mode::Journal],
            crypt_integrity: true,
            hmac_journal: false,
            commands: vec![],
            fio_command: "fio".into(),
            bounds: vec![PrimitiveBound {
                crypt: true,
                hmac: false,
                bs: 4096,
                writes: true,
                bound: Bound {
                    one_core: 800e6,
                    all_cores: 1500e6,
                    threads: 2,
                },
            }],
            rows: vec![
                Row {
                    job: Job::document()[0].clone(),
                    runs: runs.clone(),
                },
                Row {
                    job: Job {
                        rw: "write".into(),
                        direct: true,
                        bs: 1 << 20,
                    },
                    runs,
                },
            ],
        }
    }

    #[test]
    fn bench_integrity_prints_its_section_and_targets() {
        let r = report(vec![vec![100e6], vec![50e6], vec![40e6]]);
        let s = render_command(&r);
        // The document's row, its figure and ratio beside ours.
        assert!(
            s.contains("seed 000, fio 4 KiB buffered (dmkit and baseline in MB/s)"),
            "{s}"
        );
        assert!(
            s.contains("| write | integrity J / plain     |  50.0 |"),
            "{s}"
        );
        assert!(
            s.contains("| 0.50 (-50%) | 8.90 / 15.7 MB/s |    0.57 (-43%) |"),
            "{s}"
        );
        assert!(s.contains("5.90 / 15.7 MB/s"), "{s}");
        // The other jobs in their own table, without a document figure.
        assert!(s.contains("seed 000, fio direct"), "{s}");
        assert!(s.contains("write 1 MiB direct"), "{s}");
        assert!(
            s.contains("the document measured 4 KiB buffered I/O only"),
            "{s}"
        );
        assert!(
            s.contains("  crypt+integrity write: 0.40 of plain, target 0.45: NOT MET"),
            "{s}"
        );
        assert!(
            s.contains("  integrity J write: 0.50 of plain, target 0.60: NOT MET"),
            "{s}"
        );
        // J misses at 4 KiB and at 1 MiB, crypt+integrity at 4 KiB (no target at 1 MiB).
        assert!(s.contains(": 3 NOT MET\n"), "{s}");
        // crypt+integrity's 4 KiB write against its seal alone on all cores: 40 of 1500 MB/s.
        assert!(
            s.contains("4 KiB writes seal alone: 800 / 1500 (2c)"),
            "{s}"
        );
        assert!(s.contains("seed 000, against the arithmetic alone"), "{s}");
        assert!(
            s.contains("| write | crypt+integrity / seal alone, all cores |  40.0 |"),
            "{s}"
        );
        assert!(s.contains("0.03 (-97%)"), "{s}");
        // The document's source and its outlier rule.
        assert!(s.contains("seed 000: Source: "), "{s}");
        assert!(
            s.contains("- Outliers, as the document states its rule"),
            "{s}"
        );
    }

    #[test]
    fn the_hmac_sides_are_judged_by_the_target_or_their_queue_depth_1_bound() {
        let bound = |crypt, hmac, all_cores| PrimitiveBound {
            crypt,
            hmac,
            bs: 1 << 20,
            writes: true,
            bound: Bound {
                one_core: all_cores / 2.0,
                all_cores,
                threads: 2,
            },
        };
        let mut r = report(vec![vec![3000e6], vec![2000e6], vec![1300e6], vec![1200e6]]);
        r.hmac_journal = true;
        r.rows.remove(0);
        r.bounds = vec![bound(true, false, 1500e6), bound(false, true, 3000e6)];
        let s = render_command(&r);
        assert!(
            s.contains("integrity J hmac-sha256 = 32-byte HMAC-SHA-256 tags"),
            "{s}"
        );
        // Plain's 1 MiB request then the seal on all cores: 1 / (1/3000 + 1/1500) = 1000 MB/s,
        // a bound of 0.33 of plain, under the target: 0.43 meets it.
        assert!(
            s.contains("seed 000, against plain then the arithmetic"),
            "{s}"
        );
        assert!(s.contains("plain, then seal alone"), "{s}");
        assert!(s.contains("1.30 (+30%)"), "{s}");
        assert!(
            s.contains("  crypt+integrity write 1 MiB direct: 0.43 of plain, target 0.45 or the queue-depth-1 bound 0.33 where lower: met"),
            "{s}"
        );
        // The HMAC tags alone at 3000 MB/s: a bound of 1500 MB/s, 0.50 of plain, above the
        // target: 0.40 misses it.
        assert!(s.contains("0.80 (-20%)"), "{s}");
        assert!(
            s.contains("  integrity J hmac-sha256 write 1 MiB direct: 0.40 of plain, target 0.45 or the queue-depth-1 bound 0.50 where lower: NOT MET"),
            "{s}"
        );
        assert!(s.contains(": 1 NOT MET\n"), "{s}");
    }

    #[test]
    fn the_documents_outlier_rule_drops_runs_before_the_ratio() {
        // plain: 10, 10, 100 (mean 40, 100 is 150% off: dropped); integrity: 5, 5, 5.
        let r = report(vec![
            vec![10e6, 10e6, 100e6],
            vec![5e6, 5e6, 5e6],
            vec![5e6, 5e6, 5e6],
        ]);
        let s = render_command(&r);
        assert!(s.contains("10.0 (10.0..10.0) [1 dropped]"), "{s}");
        assert!(s.contains("0.50 (-50%)"), "{s}");
    }
}
