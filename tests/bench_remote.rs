//! `dmkit bench remote`: a smoke run (8 MiB image, one 300 ms run per cell, 20 ms per
//! request) prints the table with every reader and job, and `--json` carries every run with
//! figures the table's ratios are recomputed from.

mod common;

use std::time::{Duration, Instant};

use common::env;
use dmkit::bench::scenarios::remote::clients::Reader;
use dmkit::bench::scenarios::remote::RemoteReport;

fn missing() -> bool {
    env::tools_missing(&[
        ("fio", "fio"),
        ("nbdkit", "nbdkit"),
        ("qemu-storage-daemon", "qemu-system-common"),
        ("qemu-io", "qemu-utils"),
    ]) || (!std::path::Path::new("/usr/lib/x86_64-linux-gnu/qemu/block-curl.so").exists()
        && env::missing("QEMU's curl driver is missing (apt-get install qemu-block-extra)"))
        || env::fuse_device_missing()
}

#[test]
fn smoke_run_prints_every_reader_and_json_matches() {
    if missing() {
        return;
    }
    let run = common::run::RunDir::new();
    let scratch = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let r = common::run::run_in(
        common::DMKIT,
        &[
            "bench",
            "remote",
            "--quick",
            "--size",
            "8M",
            "--runtime",
            "0.3",
            // Not 0 ms: QEMU 7.2's curl driver hangs under fio's queue depth 8 against a
            // server answering at once (nginx too), which costs fio's whole timeout.
            "--delays",
            "20",
            "--json",
            "--dir",
            scratch.path().to_str().unwrap(),
        ],
        run.path(),
        Duration::from_secs(300),
    );
    r.assert_ok();
    eprintln!("smoke run: {:.1} s", t.elapsed().as_secs_f64());
    let report: RemoteReport = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report.delays_ms, [20]);
    assert_eq!(report.readers, Reader::ALL);
    assert_eq!(report.cells.len(), report.jobs.len() * Reader::ALL.len());
    for c in &report.cells {
        assert_eq!(c.runs.len(), 1, "{c:?}");
        let run = c.runs[0];
        assert!(run.bw > 0.0 && run.requests > 0, "{c:?}");
        // Every reader went through the server (nothing served from a cache of an earlier run).
        assert!(run.http_requests > 0 && run.http_bytes > 0, "{c:?}");
        assert!(c.first_read_s[0] > 0.0 && c.first_read_s[0] < 60.0, "{c:?}");
    }
    // Each 20 ms request is held for 20 ms: one reader at 20 ms reads no faster than
    // its requests' count allows.
    for c in report.cells.iter().filter(|c| c.delay_ms == 20) {
        let secs = report.runtime_ms as f64 / 1000.0;
        assert!(
            c.runs[0].http_requests as f64 <= 1.0 + secs / 0.02 * 64.0,
            "{c:?}"
        );
    }
    let text = dmkit::bench::harness::report::output(&report, false).unwrap();
    for x in Reader::ALL {
        assert!(text.contains(x.title()), "{text}");
    }
    assert!(text.contains("| read-1m-qd4 "), "{text}");
    assert!(text.contains("start + first 4 KiB read"), "{text}");
    assert!(text.contains("20 ms read-1m-qd4"), "{text}");
}
