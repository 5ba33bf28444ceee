//! The source documents' published figures and where they come from: `data/seeds.json`,
//! compiled into the binary (the one copy; `docs/seeds.md` is its human page).

use serde::{Deserialize, Serialize};

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_parses_and_matches_the_scenarios_constants() {
        let s = Seeds::load();
        assert_eq!(s.documents.len(), 5);
        let f = s
            .figure("000", "fio 4 KiB buffered", "write", "integrity")
            .unwrap();
        // The document's -43.3%.
        assert_eq!(((f.doc_ratio().unwrap() - 1.0) * 1000.0).round(), -433.0);
        for (rw, r) in crate::bench::scenarios::integrity::DOCUMENT_CRYPT_RATIOS {
            let f = s
                .figure("000", "fio 4 KiB buffered", rw, "crypt+integrity")
                .unwrap();
            assert!((f.doc_ratio().unwrap() - r).abs() < 1e-12, "{rw}");
        }
        for (cfg, t, _, c) in crate::bench::scenarios::verity_integrity::PAPER {
            let f = s.figure("004", "throughput", "iozone reads", cfg).unwrap();
            assert_eq!(f.doc_ratio(), Some(t));
            let f = s.figure("004", "CPU per MB", "iozone reads", cfg).unwrap();
            assert_eq!(f.doc_ratio(), Some(c));
        }
        for r in crate::bench::scenarios::image::SEED_001 {
            let f = s
                .figure("001", "boot / read time", &format!("#{}", r.n), r.label)
                .unwrap();
            assert_eq!(f.value, Some(r.boot_s));
            let size = s.figure("001", "image size", &format!("#{}", r.n), r.label);
            assert_eq!(size.and_then(|f| f.value), r.size_pct, "#{}", r.n);
        }
        for (case, _, with, _, rwith) in crate::bench::scenarios::fsverity_read::SEED {
            let f = s.figure("002", "fio 4 KiB buffered", "read", case).unwrap();
            assert!((f.value.unwrap() * 1048576.0 - with).abs() < 1e-6);
            let f = s
                .figure("002", "fio 4 KiB buffered", "randread", case)
                .unwrap();
            assert!((f.value.unwrap() * 1024.0 - rwith).abs() < 1e-6);
        }
    }
}
