//! The source documents' published figures and where they come from: `data/seeds.json`,
//! compiled into the binary (the one copy; `docs/seeds.md` is its human page).

use serde::{Deserialize, Serialize};

use crate::bench::harness::model::OutlierRule;

/// The data file's text.
pub const SEEDS_JSON: &str = include_str!("../../../data/seeds.json");

/// One source document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// Its number ("000" to "004").
    pub seed: String,
    /// Its title as published.
    pub title: String,
    /// The title in English.
    pub title_en: String,
    /// Who wrote it.
    pub author: String,
    /// When it was published.
    pub date: String,
    /// Where it is (empty when the copy gives none).
    pub url: String,
    /// What the address is (the copy's own, a blog's, none).
    pub url_note: String,
    /// The machine it measured.
    pub machine: String,
    /// How it measured.
    pub method: String,
    /// The settings of its method that dmkit's scenarios take as they are (the one copy).
    #[serde(default, skip_serializing_if = "Setup::is_empty")]
    pub setup: Setup,
}

/// What a document's method fixes and dmkit's scenario repeats: its fio jobs, block size,
/// buffered or direct I/O, runs, outlier rule and files.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    /// fio `--readwrite` of each job, in the document's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<String>,
    /// Block size, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bs: Option<u64>,
    /// O_DIRECT (else buffered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
    /// Runs per case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// Which runs it dropped before taking a figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outliers: Option<OutlierRule>,
    /// The outlier rule in the document's words (and what of it is not a number).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub outliers_text: String,
    /// The files it read: the configuration named after each and its size (seed 002).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<DocFile>,
}

impl Setup {
    fn is_empty(&self) -> bool {
        *self == Setup::default()
    }
}

/// A file a document read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DocFile {
    /// The configuration named after it ("fs-verity, 1 MB file").
    pub config: String,
    /// Its size, bytes (the document's "1 MB" read as 1 MiB).
    pub bytes: u64,
}

/// Which row of which table a figure belongs to: the key of a published figure and of a row
/// of the report alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowKey {
    /// The document ("000" to "004").
    pub seed: String,
    /// Its table.
    pub table: String,
    /// The row (a fio job, an image number).
    pub row: String,
    /// The configuration.
    pub config: String,
    /// What it is compared with.
    pub baseline: String,
    /// The unit of the figures.
    pub unit: String,
}

/// One published figure: a configuration against its baseline in one row of one table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedFigure {
    /// Where it belongs, in the document's words and unit.
    #[serde(flatten)]
    pub key: RowKey,
    /// The configuration's figure, when the document gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// The baseline's figure, when the document gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_value: Option<f64>,
    /// The ratio as published, when the document gives only a ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// What the figure is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl PublishedFigure {
    /// The document's ratio: `value / baseline_value`, or the published ratio.
    pub fn doc_ratio(&self) -> Option<f64> {
        match (self.value, self.baseline_value) {
            (Some(v), Some(b)) if b != 0.0 => Some(v / b),
            _ => self.ratio,
        }
    }
}

/// The whole data file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seeds {
    /// The documents, in order.
    pub documents: Vec<Document>,
    /// Every figure of their tables.
    pub figures: Vec<PublishedFigure>,
}

impl Seeds {
    /// The compiled-in data (checked by a unit test, so this cannot fail in a built binary).
    pub fn load() -> Seeds {
        serde_json::from_str(SEEDS_JSON).expect("data/seeds.json is checked by the unit tests")
    }

    /// The figure of `config` in `row` of `table` of `seed`.
    pub fn figure(
        &self,
        seed: &str,
        table: &str,
        row: &str,
        config: &str,
    ) -> Option<&PublishedFigure> {
        self.figures.iter().find(|f| {
            f.key.seed == seed && f.key.table == table && f.key.row == row && f.key.config == config
        })
    }

    /// The document numbered `seed`.
    pub fn document(&self, seed: &str) -> Option<&Document> {
        self.documents.iter().find(|d| d.seed == seed)
    }

    /// The method settings of document `seed` (empty for an unknown one).
    pub fn setup(&self, seed: &str) -> Setup {
        self.document(seed)
            .map(|d| d.setup.clone())
            .unwrap_or_default()
    }
}

/// The method settings of document `seed` from the compiled-in data (scenarios read their
/// document's jobs, block size and files here).
pub fn setup(seed: &str) -> Setup {
    Seeds::load().setup(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_parses_and_gives_the_methods() {
        let s = Seeds::load();
        assert_eq!(s.documents.len(), 5);
        let f = s
            .figure("000", "fio 4 KiB buffered", "write", "integrity")
            .unwrap();
        // The document's -43.3%.
        assert_eq!(((f.doc_ratio().unwrap() - 1.0) * 1000.0).round(), -433.0);
        let m = s.setup("000");
        assert_eq!(m.jobs, ["write", "randwrite", "read", "randread"]);
        assert_eq!(
            (m.bs, m.direct, m.runs),
            (Some(4096), Some(false), Some(10))
        );
        assert_eq!(m.outliers, Some(OutlierRule { max_off_mean: 1.0 }));
        // Every job of the document has its figures, and nothing else has.
        for f in s.figures.iter().filter(|f| f.key.seed == "000") {
            assert!(m.jobs.contains(&f.key.row), "{f:?}");
        }
        let m = s.setup("002");
        assert_eq!(m.files[0].bytes, 1 << 20);
        for file in &m.files {
            for job in &m.jobs {
                assert!(
                    s.figure("002", "fio 4 KiB buffered", job, &file.config)
                        .is_some(),
                    "{job} {file:?}"
                );
            }
        }
        assert_eq!(s.setup("003").jobs, ["readwrite"]);
        assert_eq!(s.setup("001"), Setup::default());
        // Seed 001's rows, #1 to #14, each with its time.
        for n in 1..=14 {
            assert!(s
                .figures
                .iter()
                .any(|f| f.key.seed == "001" && f.key.row == format!("#{n}")));
        }
    }
}
