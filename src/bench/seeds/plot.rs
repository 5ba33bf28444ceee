//! The plots of `report.md`, drawn with plotters as SVG and PNG. What is drawn is a
//! [`PlotSpec`] made by [`specs`] from the report's rows, the same values the tables print;
//! the specs are public so a test can check the plotted values against `report.json`.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::model::SeedsReport;
use super::render::tables;

/// A plotted value: a bar's length and whisker (`lo..hi`), or a point (`x`, `y`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Value {
    /// The point's x (bars: unused, 0).
    pub x: f64,
    /// The bar's length, or the point's y.
    pub y: f64,
    /// The whisker's low end (= `y` when there is none).
    pub lo: f64,
    /// The whisker's high end.
    pub hi: f64,
}

/// One series (dmkit, the baseline, the document).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend.
    pub name: String,
    /// One value per label (`None`: nothing drawn there).
    pub values: Vec<Option<Value>>,
}

/// What kind of picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Throughput: horizontal bars per label (dmkit, the baseline), with min..max whiskers.
    Throughput,
    /// Ratios: horizontal bars per label (dmkit's, the document's), with a line at 1.
    Ratios,
    /// Points, one per label and series.
    Scatter,
}

/// One plot.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotSpec {
    /// File name without extension.
    pub stem: String,
    /// Title.
    pub title: String,
    /// The value axis (bars) or x axis (scatter).
    pub x_label: String,
    /// The y axis of a scatter.
    pub y_label: String,
    /// Kind.
    pub kind: Kind,
    /// One per bar group or point.
    pub labels: Vec<String>,
    /// For each label, the index in the report's `rows` its values come from (seed 001's
    /// scatter: the size row; its time row is the one with the same `row`).
    pub rows: Vec<usize>,
    /// The series.
    pub series: Vec<Series>,
}

fn slug(s: &str) -> String {
    let mut o = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            o.push(c.to_ascii_lowercase());
        } else if !o.ends_with('-') {
            o.push('-');
        }
    }
    o.trim_matches('-').to_string()
}

/// The file name of a throughput table's bars: `seedNNN-TABLE-throughput`, the table's name
/// once (seed 004's table is itself "throughput": `seed004-throughput`).
pub fn throughput_stem(seed: &str, table: &str) -> String {
    let t = slug(table);
    if t.split('-').any(|w| w == "throughput") {
        format!("seed{seed}-{t}")
    } else {
        format!("seed{seed}-{t}-throughput")
    }
}

fn bar(y: f64, lo: f64, hi: f64) -> Value {
    Value { x: 0.0, y, lo, hi }
}

/// The plots of `r`: throughput bars with min..max whiskers per throughput table, dmkit's
/// ratio beside the document's per document, and seed 001's size against read time.
pub fn specs(r: &SeedsReport) -> Vec<PlotSpec> {
    let mut out = Vec::new();
    for (seed, table) in tables(&r.rows) {
        let (index, rows): (Vec<usize>, Vec<_>) = r
            .rows
            .iter()
            .enumerate()
            .filter(|(_, x)| x.key.seed == seed && x.key.table == table && x.key.unit == "MB/s")
            .filter(|(_, x)| x.dmkit.is_some() || x.base.is_some())
            .unzip();
        if rows.is_empty() {
            continue;
        }
        let fig =
            |f: &Option<super::model::Figure>| f.as_ref().map(|f| bar(f.median, f.min, f.max));
        out.push(PlotSpec {
            stem: throughput_stem(&seed, &table),
            title: format!("seed {seed}: {table}, median with min..max"),
            x_label: "MB/s".into(),
            y_label: String::new(),
            kind: Kind::Throughput,
            labels: rows
                .iter()
                .map(|x| format!("{} {} / {}", x.key.row, x.key.config, x.key.baseline))
                .collect(),
            rows: index,
            series: vec![
                Series {
                    name: "dmkit".into(),
                    values: rows.iter().map(|x| fig(&x.dmkit)).collect(),
                },
                Series {
                    name: "baseline, same run".into(),
                    values: rows.iter().map(|x| fig(&x.base)).collect(),
                },
            ],
        });
    }
    let mut seeds: Vec<String> = r.rows.iter().map(|x| x.key.seed.clone()).collect();
    seeds.dedup();
    for seed in seeds {
        let (index, rows): (Vec<usize>, Vec<_>) = r
            .rows
            .iter()
            .enumerate()
            .filter(|(_, x)| {
                x.key.seed == seed
                    && (x.ratio.is_some() || x.doc.as_ref().is_some_and(|d| d.ratio.is_some()))
            })
            .unzip();
        if rows.is_empty() {
            continue;
        }
        out.push(PlotSpec {
            stem: format!("seed{seed}-ratios"),
            title: format!("seed {seed}: configuration / baseline, dmkit and the document"),
            x_label: "ratio (1 = as the baseline)".into(),
            y_label: String::new(),
            kind: Kind::Ratios,
            labels: rows
                .iter()
                .map(|x| {
                    format!(
                        "{}: {} {} / {}",
                        x.key.table, x.key.row, x.key.config, x.key.baseline
                    )
                })
                .collect(),
            rows: index,
            series: vec![
                Series {
                    name: "dmkit".into(),
                    values: rows.iter().map(|x| x.ratio.map(|q| bar(q, q, q))).collect(),
                },
                Series {
                    name: "document".into(),
                    values: rows
                        .iter()
                        .map(|x| x.doc.as_ref().and_then(|d| d.ratio).map(|q| bar(q, q, q)))
                        .collect(),
                },
            ],
        });
    }
    if let Some(s) = scatter(r) {
        out.push(s);
    }
    out
}

/// Seed 001: per image, its size over ext4's (x) against its read time over ext4's (y), for
/// dmkit and for the document (size against boot time).
fn scatter(r: &SeedsReport) -> Option<PlotSpec> {
    use super::sections::s001::{SIZE, TIME};
    let (index, size): (Vec<usize>, Vec<_>) = r
        .rows
        .iter()
        .enumerate()
        .filter(|(_, x)| x.key.seed == "001" && x.key.table == SIZE)
        .unzip();
    if size.is_empty() {
        return None;
    }
    let time = |row: &str| {
        r.rows
            .iter()
            .find(|x| x.key.seed == "001" && x.key.table == TIME && x.key.row == row)
    };
    let point = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => Some(Value { x, y, lo: y, hi: y }),
        _ => None,
    };
    Some(PlotSpec {
        stem: "seed001-size-vs-read-time".into(),
        title: "seed 001: image size and read time, both over ext4 read-only (#2)".into(),
        x_label: "size / ext4's".into(),
        y_label: "read time (document: boot time) / ext4's".into(),
        kind: Kind::Scatter,
        labels: size.iter().map(|x| x.key.row.clone()).collect(),
        rows: index,
        series: vec![
            Series {
                name: "dmkit (cold read of the tree)".into(),
                values: size
                    .iter()
                    .map(|s| point(s.ratio, time(&s.key.row).and_then(|t| t.ratio)))
                    .collect(),
            },
            Series {
                name: "document (boot time)".into(),
                values: size
                    .iter()
                    .map(|s| {
                        point(
                            s.doc.as_ref().and_then(|d| d.ratio),
                            time(&s.key.row)
                                .and_then(|t| t.doc.as_ref())
                                .and_then(|d| d.ratio),
                        )
                    })
                    .collect(),
            },
        ],
    })
}

/// Font files tried for the text of the plots (plotters' ab_glyph renderer needs one; no
/// fontconfig): `DMKIT_PLOT_FONT`, then Debian's fonts-dejavu-core and fonts-liberation.
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Register the font once; the file it came from, or why there is none.
pub fn font() -> Result<PathBuf, String> {
    static FONT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FONT.get_or_init(|| {
        let mut tried: Vec<PathBuf> = std::env::var_os("DMKIT_PLOT_FONT")
            .map(PathBuf::from)
            .into_iter()
            .collect();
        tried.extend(FONTS.iter().map(PathBuf::from));
        for p in &tried {
            if let Ok(bytes) = std::fs::read(p) {
                // Registered once for the process: the font lives as long as it.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(p.clone());
                }
            }
        }
        Err(format!(
            "no font for the plots' text (tried DMKIT_PLOT_FONT and {}; Debian: apt-get install fonts-dejavu-core)",
            FONTS.join(", ")
        ))
    })
    .clone()
}

const BLUE: RGBColor = RGBColor(31, 119, 180);
const GREY: RGBColor = RGBColor(150, 150, 150);
const ORANGE: RGBColor = RGBColor(255, 127, 14);

fn color(k: usize, name: &str) -> RGBColor {
    if name.starts_with("document") {
        ORANGE
    } else if k == 0 {
        BLUE
    } else {
        GREY
    }
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// Image size for `spec`.
fn size(spec: &PlotSpec) -> (u32, u32) {
    match spec.kind {
        Kind::Throughput | Kind::Ratios => (
            1100,
            110 + 16 * (spec.series.len() as u32 + 1) * spec.labels.len() as u32,
        ),
        Kind::Scatter => (900, 650),
    }
}

fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &PlotSpec,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let n = spec.labels.len().max(1);
    let s = spec.series.len().max(1);
    let max = spec
        .series
        .iter()
        .flat_map(|x| x.values.iter().flatten())
        .map(|v| v.hi.max(v.y))
        .fold(0.0f64, f64::max)
        .max(if spec.kind == Kind::Ratios { 1.0 } else { 1e-9 })
        * 1.08;
    let label_w = spec.labels.iter().map(|l| l.len()).max().unwrap_or(10) as u32 * 7 + 10;
    let mut chart = ChartBuilder::on(root)
        .caption(&spec.title, ("sans-serif", 18))
        .margin(10)
        .margin_right(40)
        .x_label_area_size(40)
        .y_label_area_size(label_w.min(600))
        .build_cartesian_2d(0f64..max, 0f64..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(spec.x_label.as_str())
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let h = 0.8 / s as f64;
    for (k, series) in spec.series.iter().enumerate() {
        let c = color(k, &series.name);
        // Label i's group runs from the top: i = 0 at y = n - 1.
        let y0 = |i: usize| (n - 1 - i) as f64 + 0.9 - (k as f64 + 1.0) * h;
        let bars = series.values.iter().enumerate().filter_map(|(i, v)| {
            v.map(|v| Rectangle::new([(0.0, y0(i)), (v.y, y0(i) + h)], c.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(series.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        let whiskers = series.values.iter().enumerate().filter_map(|(i, v)| {
            v.filter(|v| v.hi > v.lo).map(|v| {
                let y = y0(i) + h / 2.0;
                PathElement::new(vec![(v.lo, y), (v.hi, y)], BLACK.stroke_width(2))
            })
        });
        chart.draw_series(whiskers).map_err(err)?;
    }
    if spec.kind == Kind::Ratios {
        // Where a configuration costs nothing.
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0.0), (1.0, n as f64)],
                BLACK.stroke_width(1),
            )))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    let style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, l) in spec.labels.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(0.0, (n - 1 - i) as f64 + 0.5));
        root.draw_text(l, &style, (px - 6, py)).map_err(err)?;
    }
    root.present().map_err(err)
}

fn draw_scatter<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &PlotSpec,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let pts: Vec<Value> = spec
        .series
        .iter()
        .flat_map(|x| x.values.iter().flatten().copied())
        .collect();
    let xmax = pts.iter().map(|v| v.x).fold(1.0f64, f64::max) * 1.1;
    let ymax = pts.iter().map(|v| v.y).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption(&spec.title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(spec.x_label.as_str())
        .y_desc(spec.y_label.as_str())
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (k, series) in spec.series.iter().enumerate() {
        let c = color(k, &series.name);
        let points = series.values.iter().zip(&spec.labels).filter_map(|(v, l)| {
            v.map(|v| {
                EmptyElement::at((v.x, v.y))
                    + Circle::new((0, 0), 5, c.filled())
                    + Text::new(l.clone(), (7, -7), ("sans-serif", 12).into_font())
            })
        });
        chart
            .draw_series(points)
            .map_err(err)?
            .label(series.name.as_str())
            .legend(move |(x, y)| Circle::new((x + 6, y), 5, c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, spec: &PlotSpec) -> Result<(), String> {
    match spec.kind {
        Kind::Throughput | Kind::Ratios => draw_bars(&root, spec),
        Kind::Scatter => draw_scatter(&root, spec),
    }
}

/// Draw every spec into `dir` as STEM.svg and STEM.png; the file names written.
pub fn write_all(dir: &Path, specs: &[PlotSpec]) -> Result<Vec<String>, String> {
    font()?;
    let mut files = Vec::new();
    for spec in specs {
        let dim = size(spec);
        let svg = format!("{}.svg", spec.stem);
        draw(
            SVGBackend::new(&dir.join(&svg), dim).into_drawing_area(),
            spec,
        )
        .map_err(|e| format!("{svg}: {e}"))?;
        let png = format!("{}.png", spec.stem);
        draw(
            BitMapBackend::new(&dir.join(&png), dim).into_drawing_area(),
            spec,
        )
        .map_err(|e| format!("{png}: {e}"))?;
        files.push(svg);
        files.push(png);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_say_each_word_once() {
        assert_eq!(throughput_stem("004", "throughput"), "seed004-throughput");
        assert_eq!(
            throughput_stem("000", "fio 4 KiB buffered"),
            "seed000-fio-4-kib-buffered-throughput"
        );
        assert_eq!(
            throughput_stem("003", "readwrite 4k direct"),
            "seed003-readwrite-4k-direct-throughput"
        );
    }
}
