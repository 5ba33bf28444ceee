//! Seed 003: Cloudflare's dm-crypt study. `bench crypt`'s scenario ([`cloudflare::run_seed`]):
//! `fio --readwrite=readwrite --bs=4k --direct=1` on plain and on crypt (aes-xts-plain64,
//! 512-bit key, 4 KiB sectors) over RAM-backed files, and the serial bound
//! `plain x cipher / (plain + cipher)` from the plain speed and our cipher speed measured in
//! the same run. Two rows per direction: crypt against plain, and crypt against its bound.
//! `bench crypt` prints its result through [`rows`] too ([`render_command`]), with the
//! study's target for the bound under them.

use super::{mb_s, Ctx, Output, Refs};
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::cloudflare::{self, SeedReport, BOUND_TARGET};
use crate::bench::seeds::machine::kernel_note;
use crate::bench::seeds::model::SeedRow;
use crate::bench::BenchError;

const SEED: &str = "003";
const TABLE: &str = "readwrite 4k direct";

/// Runs: 2 sides per round.
pub fn expected_runs(runs: u64) -> u64 {
    runs * 2
}

/// The section.
pub fn run(ctx: &Ctx) -> Result<Output, BenchError> {
    let r = cloudflare::run_seed(&ctx.rw, ctx.interrupt)?;
    Ok((setup(&r), rows(&r, ctx.refs())))
}

/// How the scenario ran, one line each.
pub fn setup(r: &SeedReport) -> Vec<String> {
    let (read_bound, write_bound) = r.bounds();
    vec![
        format!(
            "{} random file each for plain (dmkit linear open) and crypt (dmkit plain open, aes-xts-plain64 512-bit, 4 KiB sectors) in {}, {} run(s) of {} ms, alternated",
            format_size(r.size),
            r.dir.display(),
            r.runs,
            r.runtime_ms
        ),
        format!(
            "cipher: {} {}-bit ({}), one call per {}-byte sector, one thread: decrypt {:.0} MB/s, encrypt {:.0} MB/s; bound = plain x cipher / (plain + cipher): read {:.0} MB/s, write {:.0} MB/s",
            r.cipher.spec,
            r.cipher.key_bits,
            r.cipher.implementation,
            r.cipher.sector_size,
            r.cipher.decrypt_bytes_per_s / 1e6,
            r.cipher.encrypt_bytes_per_s / 1e6,
            read_bound / 1e6,
            write_bound / 1e6
        ),
        format!("fio: {}", r.fio_command),
    ]
}

/// The rows: per direction, crypt against plain and crypt against its bound.
pub fn rows(r: &SeedReport, refs: Refs) -> Vec<SeedRow> {
    let (read_bound, write_bound) = r.bounds();
    let note = kernel_note(refs.kernel, "dm-crypt");
    let mut rows = Vec::new();
    for (dir, bound) in [("read", read_bound), ("write", write_bound)] {
        let pick = |v: &[crate::bench::harness::fio::RwResult]| -> Vec<f64> {
            mb_s(
                &v.iter()
                    .map(|x| if dir == "read" { x.read } else { x.write })
                    .collect::<Vec<_>>(),
            )
        };
        let crypt = pick(&r.crypt);
        let mut a = SeedRow::measured(
            SEED,
            TABLE,
            dir,
            "crypt",
            "plain",
            "MB/s",
            true,
            crypt.clone(),
            pick(&r.plain),
        )
        .with_doc(refs.seeds.figure(SEED, TABLE, dir, "dm-crypt"), "");
        a.kernel = note.clone();
        let mut b = SeedRow::measured(
            SEED,
            TABLE,
            dir,
            "crypt over its bound",
            "bound",
            "MB/s",
            true,
            crypt,
            vec![bound / 1e6],
        )
        .with_doc(
            refs.seeds
                .figure(SEED, TABLE, dir, "dm-crypt over its bound"),
            "",
        );
        b.kernel = note.clone();
        rows.push(a);
        rows.push(b);
    }
    rows
}

/// The study's target for crypt against its bound, judged on the finished rows.
pub fn verdicts(rows: &[SeedRow]) -> Vec<String> {
    let cells: Vec<String> = rows
        .iter()
        .filter(|x| x.key.baseline == "bound")
        .map(|x| match x.ratio {
            Some(q) if q >= BOUND_TARGET => format!("{} {q:.2} met", x.key.row),
            Some(q) => format!("{} {q:.2} NOT MET", x.key.row),
            None => format!("{} not measured", x.key.row),
        })
        .collect();
    vec![format!(
        "target: crypt >= {BOUND_TARGET:.2} of its bound: {}",
        cells.join(", ")
    )]
}

/// What `bench crypt` prints: its section and the target.
pub fn render_command(r: &SeedReport) -> String {
    super::command_text(SEED, |refs| (setup(r), rows(r, refs)), verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::fio::RwResult;
    use crate::bench::scenarios::cipher::CipherSpeed;

    #[test]
    fn bench_crypt_prints_its_section_and_target() {
        let rw = |read: f64, write: f64| RwResult { read, write };
        let r = SeedReport {
            size: 1 << 20,
            runs: 1,
            runtime_ms: 1000,
            dir: "/dev/shm".into(),
            fio_command: "fio --readwrite=readwrite".into(),
            plain: vec![rw(1000e6, 1000e6)],
            crypt: vec![rw(400e6, 100e6)],
            cipher: CipherSpeed {
                spec: "aes-xts-plain64".into(),
                key_bits: 512,
                implementation: "test".into(),
                sector_size: 4096,
                encrypt_bytes_per_s: 1000e6,
                decrypt_bytes_per_s: 1000e6,
                encrypt_all_cores_bytes_per_s: 2000e6,
                threads: 2,
            },
        };
        let s = render_command(&r);
        assert!(
            s.contains("seed 003, readwrite 4k direct (dmkit and baseline in MB/s)"),
            "{s}"
        );
        // Bounds: 1000 x 1000 / 2000 = 500 each way.
        assert!(s.contains("| read  | crypt / plain "), "{s}");
        assert!(s.contains("| crypt over its bound / bound |"), "{s}");
        assert!(s.contains("0.80 (-20%) |  640 / 696 MB/s |"), "{s}");
        assert!(s.contains("147 / 1126 MB/s"), "{s}");
        assert!(
            s.ends_with("target: crypt >= 0.80 of its bound: read 0.80 met, write 0.20 NOT MET\n"),
            "{s}"
        );
    }
}
