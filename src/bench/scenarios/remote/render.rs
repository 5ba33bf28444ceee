//! The text of `dmkit bench remote`: throughput per job, delay and reader with dmkit's ratio to
//! each unverified reader, the time to a first read, what each reader asked the server for, and
//! the targets.

use super::clients::Reader;
use super::{RemoteReport, RAND_TARGET, SEQ_TARGET};
use crate::bench::harness::model::median;
use crate::bench::harness::table::{format_size, Align, TextTable};

fn mbs(bw: f64) -> String {
    format!("{:.2} MB/s", bw / 1e6)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

/// The tables and target lines.
pub fn render(r: &RemoteReport) -> String {
    let others: Vec<Reader> = r
        .readers
        .iter()
        .copied()
        .filter(|&x| x != Reader::Dmkit)
        .collect();
    let mut cols = vec![
        ("job (fio nbd engine)".to_string(), Align::Left),
        ("delay".into(), Align::Right),
    ];
    cols.extend(
        r.readers
            .iter()
            .map(|x| (x.title().to_string(), Align::Right)),
    );
    cols.extend(
        others
            .iter()
            .map(|x| (format!("dmkit/{}", x.title()), Align::Right)),
    );
    let mut t = TextTable::new(cols.clone());
    let bw = |d, j, x| r.cell(d, j, x).and_then(|c| c.bw()).map(|s| s.median);
    for (ji, job) in r.jobs.iter().enumerate() {
        for &d in &r.delays_ms {
            let mut row = vec![job.name.clone(), format!("{d} ms")];
            row.extend(
                r.readers
                    .iter()
                    .map(|&x| bw(d, ji, x).map_or("-".into(), mbs)),
            );
            row.extend(
                others
                    .iter()
                    .map(|&x| fmt_ratio(ratio(bw(d, ji, Reader::Dmkit), bw(d, ji, x)))),
            );
            t.push(row);
        }
    }
    // Start to first read: every run of every job started its reader afresh.
    let first = |d, x| {
        let v: Vec<f64> = r
            .cells
            .iter()
            .filter(|c| c.delay_ms == d && c.reader == x)
            .flat_map(|c| c.first_read_s.iter().copied())
            .collect();
        median(&v)
    };
    for &d in &r.delays_ms {
        let mut row = vec!["start + first 4 KiB read".to_string(), format!("{d} ms")];
        row.extend(
            r.readers
                .iter()
                .map(|&x| first(d, x).map_or("-".into(), |s| format!("{:.3} s", s))),
        );
        // Times: the other's time over dmkit's, so above 1 means dmkit is faster here too.
        row.extend(
            others
                .iter()
                .map(|&x| fmt_ratio(ratio(first(d, x), first(d, Reader::Dmkit)))),
        );
        t.push(row);
    }

    let mut out = format!(
        "remote reads of one {} verity image ({} of hash tree) from an HTTP server on \
         127.0.0.1 adding {} ms to each request\n\
         each reader serves it as an NBD export on a Unix socket, read by fio's nbd engine \
         (one connection); started afresh (cold) for every run; median of {} run(s) of {:.1} s, \
         readers alternated; MB = 10^6 bytes\n\
         dmkit verity verifies every block against the tree; dmkit raw (the same remote \
         device without the verity layer), nbdkit's curl plugin and QEMU's curl driver verify \
         nothing\n\n",
        format_size(r.size),
        format_size(r.hash_size),
        r.delays_ms
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" or "),
        r.runs,
        r.runtime_ms as f64 / 1000.0,
    );
    out.push_str(&t.render());
    out.push_str(
        "\nstart + first 4 KiB read: from starting the reader to qemu-io's first read through \
         its export; the ratio columns are the other's time / dmkit's there\n",
    );

    // What each reader asked the server for.
    let mut cols = vec![
        ("HTTP requests per MB read".to_string(), Align::Left),
        ("delay".into(), Align::Right),
    ];
    cols.extend(
        r.readers
            .iter()
            .map(|x| (x.title().to_string(), Align::Right)),
    );
    let mut h = TextTable::new(cols);
    for (ji, job) in r.jobs.iter().enumerate() {
        for &d in &r.delays_ms {
            let mut row = vec![job.name.clone(), format!("{d} ms")];
            for &x in &r.readers {
                let v: Vec<f64> = r
                    .cell(d, ji, x)
                    .map(|c| {
                        c.runs
                            .iter()
                            .filter(|run| run.bw > 0.0)
                            .map(|run| {
                                run.http_requests as f64
                                    / (run.bw * r.runtime_ms as f64 / 1000.0 / 1e6)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                row.push(median(&v).map_or("-".into(), |m| format!("{m:.1}")));
            }
            h.push(row);
        }
    }
    out.push('\n');
    out.push_str(&h.render());

    // The targets, at 20 ms.
    if r.delays_ms.contains(&20) {
        out.push('\n');
        for (ji, job) in r.jobs.iter().enumerate() {
            let target = match job.name.as_str() {
                n if n.starts_with("read-") => SEQ_TARGET,
                "randread-4k-qd8" => RAND_TARGET,
                _ => continue,
            };
            if let Some(x) = ratio(bw(20, ji, Reader::Dmkit), bw(20, ji, Reader::NbdkitCurl)) {
                out.push_str(&format!(
                    "20 ms {:<17} dmkit/nbdkit curl = {x:.2} (target >= {target:.2}){}\n",
                    job.name,
                    if x >= target { "" } else { "  BELOW TARGET" }
                ));
            }
        }
    }
    // What verification costs: dmkit's two sides differ by the verity layer alone.
    for &d in &r.delays_ms {
        for (ji, job) in r.jobs.iter().enumerate() {
            if let Some(x) = ratio(bw(d, ji, Reader::Dmkit), bw(d, ji, Reader::DmkitRaw)) {
                out.push_str(&format!(
                    "{d} ms {:<17} verified / unverified (dmkit raw) = {x:.2}\n",
                    job.name
                ));
            }
        }
    }
    for &d in &r.delays_ms {
        for x in &r.readers {
            if let Some(why) = x.skip_reason(d) {
                out.push_str(&format!("{} at {d} ms: not run: {why}\n", x.title()));
            }
        }
    }
    out.push('\n');
    for v in &r.versions {
        out.push_str(&format!("{v}\n"));
    }
    for c in &r.commands {
        out.push_str(&format!("  {c}\n"));
    }
    if r.dmkit_build != "release" {
        out.push_str(&format!("dmkit build: {}\n", r.dmkit_build));
    }
    out.push_str(&super::first_file::render(&r.first_file));
    out
}

#[cfg(test)]
mod tests {
    use super::super::{jobs, RemoteCell, RemoteRun};
    use super::*;

    #[test]
    fn renders_ratios_and_targets() {
        let jobs = jobs();
        let mut cells = Vec::new();
        for d in [0, 20] {
            for ji in 0..jobs.len() {
                for (x, bw) in [
                    (Reader::Dmkit, 40e6),
                    (Reader::DmkitRaw, 50e6),
                    (Reader::NbdkitCurl, 10e6),
                    (Reader::QemuCurl, 20e6),
                ] {
                    cells.push(RemoteCell {
                        delay_ms: d,
                        job: ji,
                        reader: x,
                        runs: vec![RemoteRun {
                            bw,
                            requests: 1,
                            http_requests: 100,
                            http_bytes: 1,
                        }],
                        first_read_s: vec![0.5],
                    });
                }
            }
        }
        let r = RemoteReport {
            size: 32 << 20,
            hash_size: 1 << 20,
            runs: 1,
            runtime_ms: 1000,
            quick: true,
            delays_ms: vec![0, 20],
            jobs,
            readers: Reader::ALL.to_vec(),
            cells,
            commands: vec!["dmkit verity open ...".into()],
            versions: vec!["fio-3.33".into()],
            dmkit_build: "release".into(),
            first_file: Vec::new(),
        };
        let t = render(&r);
        assert!(t.contains("| randread-4k-qd8          | 20 ms |"), "{t}");
        assert!(t.contains("4.00x") && t.contains("2.00x"), "{t}");
        assert!(
            t.contains("20 ms read-1m-qd4       dmkit/nbdkit curl = 4.00 (target >= 3.00)\n"),
            "{t}"
        );
        assert!(t.contains("| start + first 4 KiB read |"), "{t}");
        assert!(
            t.contains("0 ms randread-4k-qd8   verified / unverified (dmkit raw) = 0.80\n"),
            "{t}"
        );
        assert!(t.contains("qemu curl at 0 ms: not run: QEMU 7.2"), "{t}");
        // 100 requests over 40 MB read.
        assert!(t.contains("2.5"), "{t}");
        let widths: Vec<usize> = t
            .lines()
            .filter(|l| l.starts_with('|'))
            .map(|l| l.chars().count())
            .collect();
        assert!(widths.len() > 10);
    }
}
