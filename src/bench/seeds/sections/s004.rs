//! Seed 004: dm-verity against dm-integrity (sha256, hmac-sha256) as read paths, the
//! Mitsubishi Electric paper. `bench verity-integrity`'s scenario ([`verity_integrity::run`]):
//! the same random data behind verity (every read hashed), integrity sha256 and integrity
//! hmac-sha256 (journal mode), fio reads; throughput and the serving process's CPU seconds per
//! GB, integrity over verity, beside the paper's overall ratios. `bench verity-integrity`
//! prints its result through [`rows`] too ([`render_command`]).

use super::{mb_s, Ctx, Output, Refs};
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::verity_integrity::{self, VerityIntegrityReport, SIDES};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "004";
/// The paper's row (its iozone read tests together).
const DOC_ROW: &str = "iozone reads";

/// Runs: every job on every side per round.
pub fn expected_runs(runs: u64) -> u64 {
    runs * verity_integrity::read_jobs().len() as u64 * SIDES.len() as u64
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    let r = verity_integrity::run(&ctx.rw, ctx.interrupt)?;
    Ok((setup(&r), rows(&r, ctx.refs())))
}

/// How the scenario ran, one line each.
pub fn setup(r: &VerityIntegrityReport) -> Vec<String> {
    let mut setup = vec![format!(
        "{} of random data per side in {}, {} run(s) of {} ms, sides alternated: verity = sha256, 4 KiB blocks, --data-cache 0; integrity = journal mode, 512-byte sectors (integritysetup's default) or 4096-byte sectors (the paper gives none), sha256 or hmac-sha256; fio libaio, queue depth 1; CPU = user + system seconds of the serving process per 10^9 bytes read",
        format_size(r.size),
        r.dir.display(),
        r.runs,
        r.runtime_ms
    )];
    setup.push(hash_floor());
    setup.extend(r.commands.iter().map(|c| format!("setup: {c}")));
    setup
}

/// The arithmetic under the CPU table: SHA-256 compressions per 4 KiB checked on each side, and
/// integrity's over verity's, the ratio its CPU per GB tends to where hashing is the work.
fn hash_floor() -> String {
    let verity = verity_integrity::hash_blocks_per_4k(0);
    let sides: Vec<String> = SIDES
        .iter()
        .enumerate()
        .skip(1)
        .map(|(k, side)| {
            let b = verity_integrity::hash_blocks_per_4k(k);
            format!("{side} {b} ({:.2}x)", b as f64 / verity as f64)
        })
        .collect();
    format!(
        "hashing floor: SHA-256 compressions per 4 KiB checked: verity sha256 {verity} (its cached tree aside); {}",
        sides.join(", ")
    )
}

/// The rows: per read job and integrity side, throughput and CPU per GB over verity's.
pub fn rows(r: &VerityIntegrityReport, refs: Refs) -> Vec<SeedRow> {
    let note = format!(
        "{}; {}",
        kernel_note(refs.kernel, "dm-verity"),
        kernel_note(refs.kernel, "dm-integrity")
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
                .with_doc(
                    refs.seeds
                        .figure(SEED, table, DOC_ROW, verity_integrity::paper_config(side)),
                    "",
                );
                sr.kernel = note.clone();
                rows.push(sr);
            }
        }
    }
    rows
}

/// What `bench verity-integrity` prints: its section.
pub fn render_command(r: &VerityIntegrityReport) -> String {
    super::command_text(SEED, |refs| (setup(r), rows(r, refs)), |_| Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scenarios::verity_integrity::{read_jobs, Row, SideRuns};

    #[test]
    fn bench_verity_integrity_prints_its_section() {
        let side = |bw: f64, cpu: f64| SideRuns {
            bw: vec![bw],
            cpu_s_per_gb: vec![cpu],
        };
        let r = VerityIntegrityReport {
            size: 1 << 20,
            runs: 1,
            runtime_ms: 1000,
            dir: "/dev/shm".into(),
            commands: vec![],
            rows: vec![Row {
                job: read_jobs()[0].clone(),
                sides: vec![
                    side(200e6, 1.0),
                    side(100e6, 0.5),
                    side(50e6, 2.0),
                    side(200e6, 1.0),
                    side(200e6, 1.0),
                ],
            }],
        };
        let s = render_command(&r);
        assert!(
            s.contains("seed 004, throughput (dmkit and baseline in MB/s)"),
            "{s}"
        );
        assert!(
            s.contains("seed 004, CPU per MB (dmkit and baseline in CPU s/GB)"),
            "{s}"
        );
        // Integrity sha256: half of verity's throughput and half its CPU per GB; the paper's
        // 0.94 and 0.80 beside them.
        assert!(s.contains("integrity sha256 / verity sha256"), "{s}");
        assert!(s.contains("| 0.50 (-50%) | ratio only |"), "{s}");
        assert!(s.contains(" 0.94 (-6%) |"), "{s}");
        assert!(s.contains(" 0.80 (-20%) |"), "{s}");
        assert!(s.contains("0.25 (-75%)"), "{s}");
        assert!(s.contains("2.00 (+100%)"), "{s}");
        // The 4 KiB-sector sides beside the paper's figure for their tag.
        assert!(
            s.contains("integrity hmac-sha256, 4 KiB sectors / verity sha256"),
            "{s}"
        );
        assert!(
            s.contains("integrity sha256 72 (1.11x), integrity hmac-sha256 80 (1.23x)"),
            "{s}"
        );
    }
}
