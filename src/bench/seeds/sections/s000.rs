//! Seed 000: dm-integrity's overhead (fio 4 KiB buffered write, randwrite, read, randread),
//! plain against integrity (J, the kernel's default, as the document measured; B and D
//! beside it), crypt+integrity and verity. The integrity and crypt+integrity columns are
//! `bench integrity`'s scenario ([`integrity::run_jobs`]) with the document's four jobs; the
//! verity column is `dmkit bench`'s ([`super::verity_reads`]) with plain and verity-cold (every
//! read hashed) on the read jobs, its own plain measured in the same run.

use super::{mb_s, Ctx, Output};
use crate::bench::scenarios::integrity::{self, Job};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "000";
const TABLE: &str = "fio 4 KiB buffered";
const JOBS: [&str; 4] = ["write", "randwrite", "read", "randread"];

/// Runs: 4 jobs x 5 sides, and 2 read jobs x 2 configurations, per round.
pub fn expected_runs(runs: u64) -> u64 {
    runs * (4 * 5 + 2 * 2)
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    let jobs: Vec<Job> = JOBS
        .iter()
        .map(|rw| Job {
            rw: rw.to_string(),
            direct: false,
            bs: 4096,
        })
        .collect();
    let r = integrity::run_jobs(&ctx.rw, jobs, ctx.interrupt)?;
    let mut setup = vec![
        format!(
            "integrity: {} per side in {}, {} run(s) of {} ms, sides alternated: plain = dmkit linear, integrity = crc32c 4-byte tags, 512-byte sectors, modes J, B, D; crypt+integrity = LUKS2 aes-xts-plain64 + hmac-sha256",
            crate::bench::harness::table::format_size(r.size),
            r.dir.display(),
            r.runs,
            r.runtime_ms
        ),
        format!("fio: {}", r.fio_command),
    ];
    setup.extend(r.commands.iter().map(|c| format!("setup: {c}")));
    let integrity_note = kernel_note(ctx.kernel, "dm-integrity");
    let crypt_note = format!(
        "{}; {}",
        kernel_note(ctx.kernel, "dm-crypt"),
        integrity_note
    );
    let sides: Vec<(String, Option<&str>, String)> = vec![
        (
            "integrity J".into(),
            Some("integrity"),
            integrity_note.clone(),
        ),
        ("integrity B".into(), None, integrity_note.clone()),
        ("integrity D".into(), None, integrity_note.clone()),
        (
            "crypt+integrity".into(),
            Some("crypt+integrity"),
            crypt_note,
        ),
    ];
    let mut rows = Vec::new();
    for row in &r.rows {
        for (k, (name, doc, note)) in sides.iter().enumerate() {
            let mut sr = SeedRow::measured(
                SEED,
                TABLE,
                &row.job.rw,
                name,
                "plain",
                "MB/s",
                true,
                mb_s(&row.runs[k + 1]),
                mb_s(&row.runs[0]),
            );
            let fig = doc.and_then(|d| ctx.seeds.figure(SEED, TABLE, &row.job.rw, d));
            sr = sr.with_doc(
                fig,
                "the document measured the kernel's default mode (J, journal) only",
            );
            sr.kernel = note.clone();
            rows.push(sr);
        }
    }

    // The verity column: dm-verity is read-only, so only the read rows.
    let (line, v) = super::verity_reads(ctx)?;
    setup.push(line);
    let verity_note = kernel_note(ctx.kernel, "dm-verity");
    for rw in JOBS {
        let fig = ctx.seeds.figure(SEED, TABLE, rw, "verity");
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
    Ok((setup, rows))
}
