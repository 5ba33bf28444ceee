//! Seed 002: fs-verity and dm-verity reads (fio 4 KiB buffered read and randread, without and
//! with verification). The fs-verity rows are `bench fsverity`'s scenario
//! ([`fsverity_read::run`]): a 1 MiB file and a large one (`--size`, where the document had
//! 10 GB) through `dmkit fsverity mount` with and without `--no-verify`, same run; the
//! dm-verity row is `dmkit bench`'s plain against verity-cold ([`super::verity_reads`]).

use super::{mb_s, Ctx, Output};
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::fsverity_read;
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
    let mut setup = vec![format!(
        "fs-verity: a 1 MiB file and a {} file sealed in {}, read through dmkit fsverity mount with and without --no-verify, {} run(s), sides alternated",
        format_size(ctx.rw.size),
        r.dir.display(),
        r.runs
    )];
    setup.extend(r.commands.iter().map(|c| format!("setup: {c}")));
    let fsv_note = kernel_note(ctx.kernel, "fs-verity");
    let mut rows = Vec::new();
    let cases = ["fs-verity, 1 MB file", "fs-verity, 10 GB file"];
    for (file, case) in r.rows.iter().zip(cases) {
        let config = if file.size == fsverity_read::SMALL {
            case.to_string()
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
                ctx.seeds.figure(SEED, TABLE, job, case),
                "not in the document",
            );
            sr.kernel = fsv_note.clone();
            rows.push(sr);
        }
    }
    let (line, v) = super::verity_reads(ctx)?;
    setup.push(line);
    let case = "dm-verity, 1 MB file";
    for job in ["read", "randread"] {
        let fig = ctx.seeds.figure(SEED, TABLE, job, case);
        let mut sr = match v.rows.iter().find(|x| x.workload.name == job) {
            Some(x) if x.results.len() == 2 => {
                let (verity, plain) = super::bandwidths(x);
                SeedRow::measured(
                    SEED,
                    TABLE,
                    job,
                    &format!("dm-verity, {} device", format_size(ctx.rw.size)),
                    "without",
                    "MB/s",
                    true,
                    verity,
                    plain,
                )
            }
            _ => SeedRow::empty(SEED, TABLE, job, case, "without", "MB/s", "no run"),
        }
        .with_doc(fig, "not in the document");
        sr.kernel = kernel_note(ctx.kernel, "dm-verity");
        rows.push(sr);
    }
    Ok((setup, rows))
}
