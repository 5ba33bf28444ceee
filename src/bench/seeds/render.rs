//! The one table renderer of `dmkit bench seeds`: every (document, table) of the model as one
//! Markdown table (printed as is on a terminal too), and `report.md` around them.

use super::data::Document;
use super::model::{Figure, SeedRow, SeedsReport};
use crate::bench::harness::table::{format_size, Align, TextTable};

/// A number with as many decimals as its size needs.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// "median (min..max)" (the range only when there were several runs), then how many runs the
/// document's outlier rule dropped, if any.
pub fn figure(f: &Figure) -> String {
    let mut s = if f.runs.len() > 1 {
        format!("{} ({}..{})", num(f.median), num(f.min), num(f.max))
    } else {
        num(f.median)
    };
    if !f.outliers.is_empty() {
        s.push_str(&format!(" [{} dropped]", f.outliers.len()));
    }
    s
}

/// A ratio with its change in percent: "0.83 (-17%)".
pub fn ratio(r: f64) -> String {
    format!("{r:.2} ({:+.0}%)", (r - 1.0) * 100.0)
}

/// The (seed, table) pairs of `rows`, in first-seen order.
pub fn tables(rows: &[SeedRow]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (r.key.seed.clone(), r.key.table.clone());
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// One table: the rows of (`seed`, `table`).
pub fn table(rows: &[SeedRow], seed: &str, table: &str) -> String {
    let mut t = TextTable::new(
        [
            ("row", Align::Left),
            ("configuration", Align::Left),
            ("dmkit", Align::Right),
            ("baseline (same run)", Align::Right),
            ("dmkit ratio", Align::Right),
            ("document", Align::Right),
            ("document ratio", Align::Right),
            ("kernel", Align::Left),
        ]
        .into_iter()
        .map(|(h, a)| (h.to_string(), a))
        .collect(),
    );
    let mut notes: Vec<String> = Vec::new();
    let mut note = |s: &str| -> String {
        let k = match notes.iter().position(|n| n == s) {
            Some(k) => k,
            None => {
                notes.push(s.to_string());
                notes.len() - 1
            }
        };
        format!("[{}]", k + 1)
    };
    let mut unit = String::new();
    for r in rows
        .iter()
        .filter(|r| r.key.seed == seed && r.key.table == table)
    {
        unit = r.key.unit.clone();
        let (d, b, q) = match (&r.dmkit, &r.base, r.ratio, &r.empty) {
            (Some(d), Some(b), Some(q), None) => (figure(d), figure(b), ratio(q)),
            (Some(d), Some(b), None, Some(why)) => (figure(d), figure(b), note(why)),
            (_, _, _, Some(why)) => ("-".into(), "-".into(), note(why)),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        let (dv, dr) = match (&r.doc, &r.doc_missing) {
            (Some(doc), _) => {
                let v = match (doc.value, doc.baseline) {
                    (Some(v), Some(b)) => format!("{} / {} {}", num(v), num(b), doc.unit),
                    _ => "ratio only".into(),
                };
                (v, doc.ratio.map_or("-".into(), ratio))
            }
            (None, Some(why)) => (note(why), "-".into()),
            (None, None) => ("-".into(), "-".into()),
        };
        let kernel = if r.kernel.is_empty() {
            "-".to_string()
        } else {
            format!("not run {}", note(&r.kernel))
        };
        t.push(vec![
            r.key.row.clone(),
            format!("{} / {}", r.key.config, r.key.baseline),
            d,
            b,
            q,
            dv,
            dr,
            kernel,
        ]);
    }
    let mut out = format!("seed {seed}, {table} (dmkit and baseline in {unit})\n\n");
    out.push_str(&t.render());
    if !notes.is_empty() {
        out.push('\n');
        for (k, n) in notes.iter().enumerate() {
            out.push_str(&format!("[{}] {n}\n", k + 1));
        }
    }
    out
}

/// The document's source in one sentence.
pub fn source(d: &Document) -> String {
    format!(
        "Source: \"{}\" ({}), {}, {}; {}{}. Measured on: {}. Method: {}.",
        d.title,
        d.title_en,
        d.author,
        d.date,
        if d.url.is_empty() {
            "no address"
        } else {
            &d.url
        },
        if d.url_note.is_empty() {
            String::new()
        } else {
            format!(" ({})", d.url_note)
        },
        d.machine,
        d.method
    )
}

/// What the document's outlier rule is and how it is applied here, when it has one.
pub fn outlier_rule(d: &Document) -> Option<String> {
    let rule = d.setup.outliers?;
    Some(format!(
        "Outliers, as the document states its rule ({}): of each row's runs, those {:.0}% or more off the mean of all its runs are dropped before the median and range are taken, on both sides (a run that moved no data is 100% off); the count dropped follows a figure as [n dropped]. Its latency criterion gives no number and is not applied.",
        d.setup.outliers_text,
        rule.max_off_mean * 100.0
    ))
}

/// One document's section as text: its source, how it was set up (one line each), the
/// outlier rule, then each of its tables. What `bench seeds` prints per section and what
/// each per-document command (`bench integrity`, `bench image`, ...) prints.
pub fn section_text(doc: Option<&Document>, setup: &[String], rows: &[SeedRow]) -> String {
    let mut o = String::new();
    if let Some(d) = doc {
        o.push_str(&format!("seed {}: {}\n", d.seed, source(d)));
    }
    for l in setup {
        o.push_str(&format!("- {l}\n"));
    }
    if let Some(l) = doc.and_then(outlier_rule) {
        o.push_str(&format!("- {l}\n"));
    }
    for (seed, t) in tables(rows) {
        o.push('\n');
        o.push_str(&table(rows, &seed, &t));
    }
    o
}

/// Every section, for the terminal.
pub fn tables_text(r: &SeedsReport) -> String {
    let mut out = String::new();
    for s in &r.sections {
        let rows: Vec<SeedRow> = r
            .rows
            .iter()
            .filter(|x| x.key.seed == s.seed)
            .cloned()
            .collect();
        let doc = r.documents.iter().find(|d| d.seed == s.seed);
        out.push_str(&section_text(doc, &s.setup, &rows));
        if let Some(e) = &s.error {
            out.push_str(&format!("the section stopped: {e}\n"));
        }
        out.push('\n');
    }
    out
}

fn load(l: &[f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
}

/// `report.md`: the machine, the sources, every section's setup and table, the plots, the
/// kernel's column, every command run.
pub fn report_md(r: &SeedsReport, plots: &[String]) -> String {
    let m = &r.machine;
    let mut o = String::from("# dmkit bench seeds\n\n");
    o.push_str(&format!(
        "Every table of the source documents on this machine, dmkit's layers beside a baseline measured in the same run, and the document's own figures. Ratios are dmkit's median over the baseline's median (a row's figures are median (min..max) over runs); the document's ratio is its figure over its baseline. {} run(s) per row{}; {} seconds in all.\n\n",
        r.params.runs,
        if r.params.quick { ", --quick" } else if r.params.tiny { ", tiny smoke sizes" } else { "" },
        r.seconds.round()
    ));
    o.push_str("## Machine\n\n");
    o.push_str(&format!("- uname: {}\n", m.uname));
    o.push_str(&format!("- kernel: {}\n", m.kernel));
    o.push_str(&format!("- CPU: {} ({} logical CPUs)\n", m.cpu, m.cpus));
    o.push_str(&format!("- CPU flags: {}\n", m.cpu_flags.join(" ")));
    o.push_str(&format!(
        "- memory: {:.1} GiB\n",
        m.memory as f64 / (1u64 << 30) as f64
    ));
    o.push_str(&format!("- dmkit: {}\n", m.dmkit_build));
    for (t, v) in &m.tools {
        o.push_str(&format!("- {t}: {v}\n"));
    }
    o.push_str(&format!(
        "- load average before: {}; after: {} (the machine may be shared: compare ratios from the same run)\n",
        load(&r.load_before),
        load(&r.load_after)
    ));
    o.push_str(&format!(
        "- parameters: {} per side, {} run(s) of {} ms per fio job, scratch in {}\n\n",
        format_size(r.params.size),
        r.params.runs,
        r.params.runtime_ms,
        r.params.dir
    ));
    o.push_str("## The kernel's column\n\n");
    for k in &r.kernel {
        o.push_str(&format!("- {}: {}\n", k.target, k.note));
    }
    o.push('\n');
    for s in &r.sections {
        o.push_str(&format!("## Seed {}\n\n", s.seed));
        if let Some(d) = r.documents.iter().find(|d| d.seed == s.seed) {
            o.push_str(&format!("{}\n\n", source(d)));
            if let Some(l) = outlier_rule(d) {
                o.push_str(&format!("{l}\n\n"));
            }
        }
        o.push_str(&format!("Section time: {:.0} s.\n\n", s.seconds));
        for l in &s.setup {
            o.push_str(&format!("- {l}\n"));
        }
        if let Some(e) = &s.error {
            o.push_str(&format!("- the section stopped: {e}\n"));
        }
        o.push('\n');
        for (seed, t) in tables(&r.rows) {
            if seed == s.seed {
                o.push_str(&format!(
                    "### {t}\n\n```\n{}```\n\n",
                    table(&r.rows, &seed, &t)
                ));
            }
        }
        for p in plots
            .iter()
            .filter(|p| p.starts_with(&format!("seed{}-", s.seed)))
        {
            if p.ends_with(".png") {
                o.push_str(&format!("![{p}]({p})\n\n"));
            }
        }
    }
    o.push_str("## Every command run\n\n```\n");
    for c in &r.commands {
        o.push_str(c);
        o.push('\n');
    }
    o.push_str("```\n");
    o
}
