//! How LUKS2 tokens were spelled when read from disk or imported, so that they are written
//! back as cryptsetup writes them. Depends only on the json-c model, so that the metadata
//! (json.rs) and the token verbs (token.rs) both use it without using each other.

use super::jsonc::{Style, Value as J};
use serde_json::Value;
use std::collections::BTreeMap;

/// How each token was spelled when it was read from disk or imported: json-c's plain text of
/// it, with the value it spells. cryptsetup writes a token back as json-c holds it, in its key
/// order and with its numbers' source spellings (`1e-07`, `2.50`); serde would sort the keys
/// and respell the numbers, so a token that went through a dmkit header write would come back
/// from `cryptsetup token export` as other text. A spelling is used only while it still spells
/// the token's value: a token dmkit changed without updating it is written as compact JSON.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Spellings(BTreeMap<u32, (String, Value)>);

/// json-c's view of a value as serde's (`json::to_serde`).
pub type ToSerde = fn(&J) -> Value;

impl Spellings {
    /// The spellings of the tokens of a metadata tree, by the ids `id` reads from the keys of
    /// its `tokens` section (cryptsetup's lookup: other keys are invisible to it).
    pub fn of_tree(tree: &J, id: impl Fn(&str) -> Option<u32>, to_serde: ToSerde) -> Spellings {
        let mut s = Spellings::default();
        if let J::Object(root) = tree {
            if let Some(J::Object(tokens)) = root.get("tokens") {
                for (k, v) in tokens.iter() {
                    if let Some(i) = std::str::from_utf8(k).ok().and_then(&id) {
                        s.set(i, v, to_serde);
                    }
                }
            }
        }
        s
    }

    /// The spelling of token `id` when it still spells `value`.
    pub fn text(&self, id: u32, value: &Value) -> Option<&str> {
        let (text, spelled) = self.0.get(&id)?;
        (spelled == value).then_some(text.as_str())
    }

    /// The `tokens` section's JSON text: each token in its spelling, or compact.
    pub fn section(&self, tokens: &BTreeMap<u32, Value>) -> String {
        let body: Vec<String> = tokens
            .iter()
            .map(|(id, v)| match self.text(*id, v) {
                Some(text) => format!("\"{id}\":{text}"),
                None => format!("\"{id}\":{v}"),
            })
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// Record the spelling of token `id` as `tree` (none when its text is not UTF-8: the
    /// metadata text is a `String`).
    pub fn set(&mut self, id: u32, tree: &J, to_serde: ToSerde) {
        match String::from_utf8(tree.to_json(Style::Plain)) {
            Ok(text) => {
                self.0.insert(id, (text, to_serde(tree)));
            }
            Err(_) => self.forget(id),
        }
    }

    /// Drop the spelling of token `id`.
    pub fn forget(&mut self, id: u32) {
        self.0.remove(&id);
    }
}
