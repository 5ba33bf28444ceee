//! Seed 002: fs-verity and dm-verity reads (fio 4 KiB buffered read and randread, without and
//! with verification). The fs-verity rows are `bench fsverity`'s scenario
//! ([`fsverity_read::run`]): a 1 MiB file and a large one (`--size`, where the document had
//! 10 GB) through `dmkit fsverity mount` with and without `--no-verify`, same run; the
//! dm-verity row is `dmkit bench`'s plain against verity-cold ([`super::verity_reads`]).
//! `bench fsverity` prints its result through [`rows`] too ([`render_command`]).

use super::{mb_s, Ctx, Output, Refs};
use crate::bench::harness::model::OverheadReport;
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::fsverity_read::{self, FsVerityReadReport};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "002";
const TABLE: &str = "fio 4 KiB buffered";

/// Runs: 2 files x 2 jobs x 2 sides, and 2 jobs x 2 configurations, per round.
pub fn expected_runs(runs: u64) -> u64 {
    runs * (2 * 2 * 2 + 2 * 2)
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    let r = fsverity_read::run(&ctx.rw, ctx.interrupt)?;
    let (line, v) = super::verity_reads(ctx)?;
    let mut s = setup(&r);
    s.push(line);
    Ok((s, rows(&r, Some(&v), ctx.refs())))
}

/// How the fs-verity scenario ran, one line each.
pub fn setup(r: &FsVerityReadReport) -> Vec<String> {
    let sizes: Vec<String> = r.rows.iter().map(|f| format_size(f.size)).collect();
    let mut setup = vec![format!(
        "fs-verity: files of {} sealed in {}, read through dmkit fsverity mount with and without --no-verify (the same server), {} run(s), sides alternated; fio 4 KiB buffered, libaio qd1; the tree's files in the host page cache, the mount's page cache dropped for every pass",
        sizes.join(" and "),
        r.dir.display(),
        r.runs
    )];
    setup.extend(r.commands.iter().map(|c| format!("setup: {c}")));
    setup
}

/// The rows of `r` (and of `verity`, `dmkit bench`'s plain against verity-cold, when given).
pub fn rows(r: &FsVerityReadReport, verity: Option<&OverheadReport>, refs: Refs) -> Vec<SeedRow> {
    let fsv_note = kernel_note(refs.kernel, "fs-verity");
    let files = refs.seeds.setup(SEED).files;
    let mut rows = Vec::new();
    // The document's files in its order: the small one, then the large one.
    for (file, doc) in r.rows.iter().zip(&files) {
        let config = if file.size == doc.bytes {
            doc.config.clone()
        } else {
            format!("fs-verity, {} file", format_size(file.size))
        };
        for (job, runs) in [("read", &file.read), ("randread", &file.randread)] {
            let mut sr = SeedRow::measured(
                SEED,
                TABLE,
                job,
                &config,
                "without",
                "MB/s",
                true,
                mb_s(&runs[1]),
                mb_s(&runs[0]),
            )
            .with_doc(
                refs.seeds.figure(SEED, TABLE, job, &doc.config),
                "not in the document",
            );
            sr.kernel = fsv_note.clone();
            rows.push(sr);
        }
    }
    let Some(v) = verity else { return rows };
    let case = "dm-verity, 1 MB file";
    let config = format!("dm-verity, {} device", format_size(v.params.size));
    for job in ["read", "randread"] {
        let fig = refs.seeds.figure(SEED, TABLE, job, case);
        let mut sr = match v.rows.iter().find(|x| x.workload.name == job) {
            Some(x) if x.results.len() == 2 => {
                let (verity, plain) = super::bandwidths(x);
                SeedRow::measured(
                    SEED, TABLE, job, &config, "without", "MB/s", true, verity, plain,
                )
            }
            _ => SeedRow::empty(SEED, TABLE, job, case, "without", "MB/s", "no run"),
        }
        .with_doc(fig, "not in the document");
        sr.kernel = kernel_note(refs.kernel, "dm-verity");
        rows.push(sr);
    }
    rows
}

/// What `bench fsverity` prints: its section.
pub fn render_command(r: &FsVerityReadReport) -> String {
    super::command_text(SEED, |refs| (setup(r), rows(r, None, refs)), |_| Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scenarios::fsverity_read::{small_file, FileRow};

    #[test]
    fn bench_fsverity_prints_its_section() {
        let m = 1e6;
        let row = |size| FileRow {
            size,
            read_bytes: size,
            randread_bytes: size,
            read: [vec![200.0 * m], vec![150.0 * m]],
            randread: [vec![10.0 * m], vec![9.0 * m]],
        };
        let r = FsVerityReadReport {
            runs: 1,
            dir: "/var/tmp".into(),
            commands: vec![],
            rows: vec![row(small_file()), row(1 << 30)],
        };
        let s = render_command(&r);
        assert!(
            s.contains("seed 002, fio 4 KiB buffered (dmkit and baseline in MB/s)"),
            "{s}"
        );
        // The small file is the document's; the large one is named by its size, beside the
        // document's 10 GB figures.
        assert!(s.contains("| fs-verity, 1 MB file / without "), "{s}");
        assert!(s.contains("| fs-verity, 1 GiB file / without "), "{s}");
        assert!(s.contains("0.75 (-25%) | 43.9 / 82.2 MiB/s |"), "{s}");
        assert!(s.contains("0.90 (-10%) | 3340 / 3792 KiB/s |"), "{s}");
        assert!(!s.contains("| dm-verity, "), "{s}");
    }
}
