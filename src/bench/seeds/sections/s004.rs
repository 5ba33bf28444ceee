//! Seed 004: dm-verity against dm-integrity (sha256, hmac-sha256) as read paths, the
//! Mitsubishi Electric paper. `bench verity-integrity`'s scenario ([`verity_integrity::run`]):
//! the same random data behind verity (every read hashed), integrity sha256 and integrity
//! hmac-sha256 (journal mode), fio reads; throughput and the serving process's CPU seconds per
//! GB, integrity over verity, beside the paper's overall ratios.

use super::{mb_s, Ctx, Output};
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::verity_integrity::{self, SIDES};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "004";
/// The paper's row (its iozone read tests together).
const DOC_ROW: &str = "iozone reads";

/// Runs: 4 jobs x 3 sides per round.
pub fn expected_runs(runs: u64) -> u64 {
    runs * 4 * 3
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    let r = verity_integrity::run(&ctx.rw, ctx.interrupt)?;
    let mut setup = vec![format!(
        "{} of random data per side in {}, {} run(s) of {} ms, sides alternated: verity = sha256, 4 KiB blocks, --data-cache 0; integrity = journal mode, 512-byte sectors, sha256 or hmac-sha256; CPU = user + system seconds of the serving process per 10^9 bytes read",
        format_size(r.size),
        r.dir.display(),
        r.runs,
        r.runtime_ms
    )];
    setup.extend(r.commands.iter().map(|c| format!("setup: {c}")));
    let note = format!(
        "{}; {}",
        kernel_note(ctx.kernel, "dm-verity"),
        kernel_note(ctx.kernel, "dm-integrity")
    );
    let mut rows = Vec::new();
    for row in &r.rows {
        let job = row.job.label();
        for (k, side) in SIDES.iter().enumerate().skip(1) {
            for (table, unit, higher, pick) in [
                ("throughput", "MB/s", true, 0),
                ("CPU per MB", "CPU s/GB", false, 1),
            ] {
                let vals = |s: usize| -> Vec<f64> {
                    if pick == 0 {
                        mb_s(&row.sides[s].bw)
                    } else {
                        row.sides[s].cpu_s_per_gb.clone()
                    }
                };
                let mut sr = SeedRow::measured(
                    SEED,
                    table,
                    &job,
                    side,
                    SIDES[0],
                    unit,
                    higher,
                    vals(k),
                    vals(0),
                )
                .with_doc(ctx.seeds.figure(SEED, table, DOC_ROW, side), "");
                sr.kernel = note.clone();
                rows.push(sr);
            }
        }
    }
    Ok((setup, rows))
}
