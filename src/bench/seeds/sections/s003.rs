//! Seed 003: Cloudflare's dm-crypt study. `bench crypt`'s scenario ([`cloudflare::run_seed`]):
//! `fio --readwrite=readwrite --bs=4k --direct=1` on plain and on crypt (aes-xts-plain64,
//! 512-bit key, 4 KiB sectors) over RAM-backed files, and the serial bound
//! `plain x cipher / (plain + cipher)` from the plain speed and our cipher speed measured in
//! the same run. Two rows per direction: crypt against plain, and crypt against its bound.

use super::{mb_s, Ctx, Output};
use crate::bench::harness::table::format_size;
use crate::bench::scenarios::cloudflare;
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
    let (read_bound, write_bound) = r.bounds();
    let setup = vec![
        format!(
            "{} random file each for plain (dmkit linear open) and crypt (dmkit plain open, aes-xts-plain64 512-bit, 4 KiB sectors) in {}, {} run(s) of {} ms, alternated",
            format_size(r.size),
            r.dir.display(),
            r.runs,
            r.runtime_ms
        ),
        format!(
            "cipher: {} {}-bit ({}), one call per {}-byte sector: decrypt {:.0} MB/s, encrypt {:.0} MB/s; bound = plain x cipher / (plain + cipher): read {:.0} MB/s, write {:.0} MB/s",
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
    ];
    let note = kernel_note(ctx.kernel, "dm-crypt");
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
            "dm-crypt",
            "plain",
            "MB/s",
            true,
            crypt.clone(),
            pick(&r.plain),
        )
        .with_doc(ctx.seeds.figure(SEED, TABLE, dir, "dm-crypt"), "");
        a.key.config = "crypt".into();
        a.kernel = note.clone();
        let mut b = SeedRow::measured(
            SEED,
            TABLE,
            dir,
            "dm-crypt over its bound",
            "bound",
            "MB/s",
            true,
            crypt,
            vec![bound / 1e6],
        )
        .with_doc(
            ctx.seeds
                .figure(SEED, TABLE, dir, "dm-crypt over its bound"),
            "",
        );
        b.key.config = "crypt over its bound".into();
        b.kernel = note.clone();
        rows.push(a);
        rows.push(b);
    }
    Ok((setup, rows))
}
