//! Text rendering: Markdown-style tables shaped like the published studies' tables (so they can
//! be pasted next to them), and the acceptance lines. Pure functions from the model to text.

use super::model::{
    Comparison, FecFormatRow, FormatReport, Measurement, OverheadReport, Row, Stats,
};

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Left-aligned (names).
    Left,
    /// Right-aligned (numbers).
    Right,
}

/// A table of text cells rendered with padded columns as a Markdown table.
#[derive(Debug, Clone, Default)]
pub struct TextTable {
    header: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl TextTable {
    /// A table with these columns.
    pub fn new(header: Vec<(String, Align)>) -> TextTable {
        TextTable {
            header,
            rows: Vec::new(),
        }
    }

    /// Append a row (missing cells are blank, extra cells are dropped).
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    /// Render: header, separator (with alignment colons), rows; each line ends with '\n'.
    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.header[i].0.chars().count(), 3])
                .max()
                .unwrap_or(3)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let line = |cells: Vec<String>| {
            let mut s = String::from("|");
            for (i, c) in cells.iter().enumerate() {
                let w = widths[i];
                match self.header[i].1 {
                    Align::Left => s.push_str(&format!(" {c:<w$} |")),
                    Align::Right => s.push_str(&format!(" {c:>w$} |")),
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(self.header.iter().map(|h| h.0.clone()).collect());
        out.push_str(&line(
            self.header
                .iter()
                .zip(&widths)
                .map(|((_, a), &w)| match a {
                    Align::Left => "-".repeat(w),
                    Align::Right => format!("{}:", "-".repeat(w - 1)),
                })
                .collect(),
        ));
        for r in &self.rows {
            out.push_str(&line(r.clone()));
        }
        out
    }
}

/// A throughput unit chosen per row, as the seed tables do (MiB/s for fast rows, KiB/s for
/// slow ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwUnit {
    /// KiB/s, no decimals.
    KiB,
    /// MiB/s, one decimal.
    MiB,
}

impl BwUnit {
    /// MiB/s from 10 MiB/s up, KiB/s below.
    pub fn for_bytes_per_s(b: f64) -> BwUnit {
        if b >= 10.0 * 1048576.0 {
            BwUnit::MiB
        } else {
            BwUnit::KiB
        }
    }

    fn divisor(self) -> f64 {
        match self {
            BwUnit::KiB => 1024.0,
            BwUnit::MiB => 1048576.0,
        }
    }

    fn num(self, bytes_per_s: f64) -> String {
        let v = bytes_per_s / self.divisor();
        match self {
            BwUnit::KiB => format!("{v:.0}"),
            BwUnit::MiB => format!("{v:.1}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            BwUnit::KiB => "KiB/s",
            BwUnit::MiB => "MiB/s",
        }
    }

    /// "64.9 MiB/s".
    pub fn format(self, bytes_per_s: f64) -> String {
        format!("{} {}", self.num(bytes_per_s), self.name())
    }

    /// "64.9 MiB/s (63.0..66.1)": median, then min..max (only with more than one run).
    pub fn format_stats(self, s: &Stats) -> String {
        if s.n > 1 {
            format!(
                "{} ({}..{})",
                self.format(s.median),
                self.num(s.min),
                self.num(s.max)
            )
        } else {
            self.format(s.median)
        }
    }
}

/// "-33.0% (-35.1..-30.2)": the median run-paired change, then its min..max.
pub fn format_change(c: &Comparison) -> String {
    if c.ratio.n > 1 {
        let (lo, hi) = c.change_range();
        format!("{:+.1}% ({lo:+.1}..{hi:+.1})", c.change_pct)
    } else {
        format!("{:+.1}%", c.change_pct)
    }
}

fn row_unit(row: &Row) -> BwUnit {
    let top = row
        .results
        .iter()
        .map(|m: &Measurement| m.bw_bytes.median)
        .fold(0.0, f64::max);
    BwUnit::for_bytes_per_s(top)
}

/// Human size: "256 MiB", "2 GiB", "1000 KiB", "4097 B".
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.trailing_zeros() >= shift {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// The overhead table (rows = workloads; columns = the baseline, then each configuration and
/// its change against the baseline), a legend, and one line per acceptance check.
pub fn render_overhead(r: &OverheadReport) -> String {
    let p = &r.params;
    let mut out = format!(
        "fio read bandwidth through dmkit exports: {} random data, {} run{} x {:.1} s per \
         workload and configuration, runs alternated; {}, kernel {}{}\n\n",
        format_size(p.size),
        p.runs,
        if p.runs == 1 { "" } else { "s" },
        p.runtime_ms as f64 / 1000.0,
        p.fio_version,
        p.kernel,
        if p.build == "release" {
            String::new()
        } else {
            format!("; dmkit build: {}", p.build)
        },
    );
    let mut header = vec![
        ("workload".to_string(), Align::Left),
        ("fio".to_string(), Align::Left),
    ];
    for (i, c) in r.configs.iter().enumerate() {
        header.push((c.clone(), Align::Right));
        if i > 0 {
            header.push(("change".to_string(), Align::Right));
        }
    }
    let mut t = TextTable::new(header);
    for row in &r.rows {
        let unit = row_unit(row);
        let mut cells = vec![row.workload.name.clone(), row.workload.describe()];
        for (i, c) in r.configs.iter().enumerate() {
            let m = row.results.iter().find(|m| &m.config == c);
            cells.push(m.map_or("-".into(), |m| unit.format_stats(&m.bw_bytes)));
            if i > 0 {
                let cmp = row.comparisons.iter().find(|x| &x.config == c);
                cells.push(cmp.map_or("-".into(), format_change));
            }
        }
        t.push(cells);
    }
    out.push_str(&t.render());
    out.push_str(if p.runs > 1 {
        "\nmedian (min..max) over runs; change = median of run-paired ratios - 1 \
         (min..max), negative = slower\n"
    } else {
        "\nchange: negative = slower\n"
    });
    if !r.acceptance.is_empty() {
        out.push('\n');
        let w = r
            .acceptance
            .iter()
            .map(|a| a.workload.len())
            .max()
            .unwrap_or(0);
        for a in &r.acceptance {
            out.push_str(&format!(
                "{:<w$}  {}/{} = {:.2} (target >= {:.2}){}\n",
                a.workload,
                a.config,
                a.baseline,
                a.ratio,
                a.target,
                if a.pass { "" } else { "  BELOW TARGET" },
            ));
        }
    }
    out
}

/// The format timing table and the ratio line.
pub fn render_format(r: &FormatReport) -> String {
    let mut out = format!(
        "verity format of {} random data (page cache warm), {} run{} per tool, alternated: \
         {}, data/hash blocks {}/{}, salt {}; {}{}\n\n",
        format_size(r.size),
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        r.hash,
        r.data_block_size,
        r.hash_block_size,
        r.salt,
        r.veritysetup_version,
        if r.dmkit_build == "release" {
            String::new()
        } else {
            format!("; dmkit build: {}", r.dmkit_build)
        },
    );
    out.push_str(&tool_table(&r.tools, r.runs).render());
    if r.runs > 1 {
        out.push_str("\nmedian (min..max) over runs\n");
    }
    out.push_str(&format!(
        "\nroot hash {} (identical from both tools in every run)\n\
         dmkit/veritysetup = {:.2}x (target >= {:.0}x){}\n",
        r.root_hash,
        r.ratio,
        r.target,
        if r.pass { "" } else { "  BELOW TARGET" },
    ));
    for f in &r.fec {
        out.push_str(&render_fec_format(f, r.runs));
    }
    out
}

/// One row per tool: time and throughput, median (min..max) when there are several runs.
fn tool_table(tools: &[super::model::ToolTiming], runs: u32) -> TextTable {
    let mut t = TextTable::new(vec![
        ("tool".into(), Align::Left),
        ("time".into(), Align::Right),
        ("throughput".into(), Align::Right),
    ]);
    for tool in tools {
        let (s, m) = (&tool.seconds, &tool.mib_s);
        let spread = runs > 1;
        t.push(vec![
            tool.tool.clone(),
            if spread {
                format!("{:.3} s ({:.3}..{:.3})", s.median, s.min, s.max)
            } else {
                format!("{:.3} s", s.median)
            },
            if spread {
                format!("{:.1} MiB/s ({:.1}..{:.1})", m.median, m.min, m.max)
            } else {
                format!("{:.1} MiB/s", m.median)
            },
        ]);
    }
    t
}

/// The verity+FEC rows of the format benchmark, for one roots count.
fn render_fec_format(f: &FecFormatRow, runs: u32) -> String {
    format!(
        "\nverity format --fec-device --fec-roots {} (same data, same salt, alternated):\n\n{}\n\
         FEC area of {} bytes identical from both tools in every run, root hash too\n\
         dmkit/veritysetup = {:.2}x (target >= {:.0}x){}\n",
        f.roots,
        tool_table(&f.tools, runs).render(),
        f.fec_bytes,
        f.ratio,
        f.target,
        if f.pass { "" } else { "  BELOW TARGET" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::fio::{FioResult, Latency, Workload};
    use crate::bench::harness::model::{Params, ToolTiming};

    fn fio(mib_s: f64) -> FioResult {
        FioResult {
            bw_bytes: mib_s * 1048576.0,
            iops: 1.0,
            lat: Latency {
                mean_ns: 1.0,
                p50_ns: None,
                p99_ns: None,
            },
            io_bytes: 1,
            runtime_ms: 1000,
            usr_cpu: 0.0,
            sys_cpu: 0.0,
        }
    }

    #[test]
    fn renders_a_padded_markdown_table() {
        let mut t = TextTable::new(vec![("a".into(), Align::Left), ("bb".into(), Align::Right)]);
        t.push(vec!["xyz".into(), "1".into()]);
        t.push(vec!["q".into()]);
        assert_eq!(
            t.render(),
            "| a   |  bb |\n\
             | --- | --: |\n\
             | xyz |   1 |\n\
             | q   |     |\n"
        );
    }

    #[test]
    fn units_and_sizes() {
        assert_eq!(BwUnit::for_bytes_per_s(64.9 * 1048576.0), BwUnit::MiB);
        assert_eq!(BwUnit::MiB.format(64.9 * 1048576.0), "64.9 MiB/s");
        assert_eq!(BwUnit::for_bytes_per_s(6906.0 * 1024.0), BwUnit::KiB);
        assert_eq!(BwUnit::KiB.format(6906.0 * 1024.0), "6906 KiB/s");
        let s = Stats::of(&[63.0 * 1048576.0, 64.9 * 1048576.0, 66.1 * 1048576.0]).unwrap();
        assert_eq!(BwUnit::MiB.format_stats(&s), "64.9 MiB/s (63.0..66.1)");
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(2 << 30), "2 GiB");
        assert_eq!(format_size(1536 << 10), "1536 KiB");
        assert_eq!(format_size(4097), "4097 B");
    }

    fn report(runs: Vec<Vec<Vec<FioResult>>>, n: u32) -> OverheadReport {
        let w = Workload::select(&["read".into(), "seq-1m".into()]).unwrap();
        let params = Params {
            size: 64 << 20,
            runs: n,
            runtime_ms: 1500,
            quick: true,
            fio_version: "fio-3.33".into(),
            kernel: "6.1.0".into(),
            started_unix: 0,
            build: "release".into(),
        };
        let configs = ["plain".to_string(), "verity".to_string()];
        OverheadReport::build(params, &configs, &w, runs, |c| {
            (c == "verity").then_some(0.8)
        })
    }

    #[test]
    fn renders_the_seed_002_shape() {
        let r = report(
            vec![
                vec![vec![fio(64.9)], vec![fio(43.8)]],
                vec![vec![fio(1000.0)], vec![fio(700.0)]],
            ],
            1,
        );
        let text = render_overhead(&r);
        let expected = "\
fio read bandwidth through dmkit exports: 64 MiB random data, 1 run x 1.5 s per workload and \
configuration, runs alternated; fio-3.33, kernel 6.1.0

| workload | fio                           |        plain |      verity | change |
| -------- | ----------------------------- | -----------: | ----------: | -----: |
| read     | 4k read, buffered, libaio qd1 |   64.9 MiB/s |  43.8 MiB/s | -32.5% |
| seq-1m   | 1m read, direct, libaio qd4   | 1000.0 MiB/s | 700.0 MiB/s | -30.0% |

change: negative = slower

seq-1m  verity/plain = 0.70 (target >= 0.80)  BELOW TARGET
";
        assert_eq!(text, expected, "\n{text}");
        // Every table line has the same width.
        let widths: Vec<usize> = text
            .lines()
            .filter(|l| l.starts_with('|'))
            .map(|l| l.chars().count())
            .collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{widths:?}");
    }

    #[test]
    fn renders_spread_with_several_runs() {
        let r = report(
            vec![
                vec![
                    vec![fio(60.0), fio(70.0), fio(65.0)],
                    vec![fio(30.0), fio(42.0), fio(39.0)],
                ],
                vec![
                    vec![fio(100.0), fio(100.0), fio(100.0)],
                    vec![fio(95.0), fio(90.0), fio(93.0)],
                ],
            ],
            3,
        );
        let text = render_overhead(&r);
        assert!(text.contains("65.0 MiB/s (60.0..70.0)"), "{text}");
        // Pairs: 30/60, 42/70, 39/65 -> -50%, -40%, -40%.
        assert!(text.contains("-40.0% (-50.0..-40.0)"), "{text}");
        assert!(
            text.contains("seq-1m  verity/plain = 0.93 (target >= 0.80)\n"),
            "{text}"
        );
        assert!(text.contains("median (min..max)"), "{text}");
    }

    #[test]
    fn renders_the_format_report() {
        let r = FormatReport {
            size: 2 << 30,
            runs: 3,
            hash: "sha256".into(),
            data_block_size: 4096,
            hash_block_size: 4096,
            salt: "00ff".into(),
            root_hash: "ab".repeat(32),
            tools: vec![
                ToolTiming::new("veritysetup format", 2 << 30, &[4.0, 4.1, 3.9]).unwrap(),
                ToolTiming::new("dmkit verity format", 2 << 30, &[0.5, 0.6, 0.4]).unwrap(),
            ],
            ratio: 8.0,
            target: 5.0,
            pass: true,
            veritysetup_version: "veritysetup 2.6.1".into(),
            dmkit_build: "release".into(),
            fec: vec![FecFormatRow {
                roots: 2,
                fec_bytes: 16 << 20,
                tools: vec![
                    ToolTiming::new("veritysetup format", 2 << 30, &[40.0, 41.0, 39.0]).unwrap(),
                    ToolTiming::new("dmkit verity format", 2 << 30, &[2.0, 2.1, 1.9]).unwrap(),
                ],
                ratio: 20.0,
                target: 10.0,
                pass: true,
            }],
        };
        let text = render_format(&r);
        assert!(
            text.contains("verity format --fec-device --fec-roots 2 (same data"),
            "{text}"
        );
        assert!(
            text.contains("| dmkit verity format |    2.000 s (1.900..2.100) |"),
            "{text}"
        );
        assert!(
            text.contains("dmkit/veritysetup = 20.00x (target >= 10x)\n"),
            "{text}"
        );
        assert!(
            text.contains("| veritysetup format  | 4.000 s (3.900..4.100) |"),
            "{text}"
        );
        assert!(text.contains("512.0 MiB/s (499.5..525.1)"), "{text}");
        assert!(
            text.contains("dmkit/veritysetup = 8.00x (target >= 5x)\n"),
            "{text}"
        );
    }
}
