//! Tokens written back in the key order they came in. cryptsetup keeps a token's JSON object
//! in json-c, which iterates keys in insertion order, so `token import` then `token export`
//! gives back the text imported. The typed metadata holds tokens as `serde_json` values, whose
//! objects sort their keys; turning on serde_json's `preserve_order` would change the key
//! order of every other JSON dmkit writes or prints (and `Map::remove` would then reorder), so
//! instead each token keeps the json-c tree it was read or imported as (its *model*), and the
//! writer lays the current value out along it: the model's keys first in the model's order,
//! keys it lacks after them, and values the model already holds in the model's own bytes.

use super::jsonc::{Object, Style, Value as J};
use serde_json::Value;

/// `value` as cryptsetup writes it to disk (json-c's plain style), in the order of `model`.
pub fn text(value: &Value, model: Option<&J>) -> Vec<u8> {
    merge(value, model).to_json(Style::Plain)
}

/// `value` as a json-c tree, reusing `model` where it agrees.
fn merge(v: &Value, model: Option<&J>) -> J {
    if let Some(m) = model.filter(|m| same(m, v)) {
        return m.clone();
    }
    match v {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => J::Int(i),
            (None, Some(u)) => J::UInt(u),
            _ => J::Double(n.as_f64().unwrap_or(0.0), n.to_string().into_bytes()),
        },
        Value::String(s) => J::Str(s.clone().into_bytes()),
        Value::Array(a) => {
            let old = model.and_then(J::as_array).unwrap_or(&[]);
            J::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, e)| merge(e, old.get(i)))
                    .collect(),
            )
        }
        Value::Object(o) => {
            let mut out = Object::default();
            if let Some(old) = model.and_then(J::as_object) {
                for (k, mv) in old.iter() {
                    let key = String::from_utf8_lossy(k);
                    if let Some(nv) = o.get(key.as_ref()) {
                        out.insert(k.to_vec(), merge(nv, Some(mv)));
                    }
                }
            }
            for (k, nv) in o {
                if out.get(k).is_none() {
                    out.insert(k.clone().into_bytes(), merge(nv, None));
                }
            }
            J::Object(out)
        }
    }
}

/// Whether the json-c value `m` reads as `v` (strings compared as dmkit reads them: bytes that
/// are not UTF-8 as U+FFFD, objects regardless of order).
fn same(m: &J, v: &Value) -> bool {
    match (m, v) {
        (J::Null, Value::Null) => true,
        (J::Bool(a), Value::Bool(b)) => a == b,
        (J::Int(a), Value::Number(n)) => n.as_i64() == Some(*a),
        (J::UInt(a), Value::Number(n)) => n.as_u64() == Some(*a),
        (J::Double(a, _), Value::Number(n)) => n.as_f64() == Some(*a),
        (J::Double(a, _), Value::Null) => !a.is_finite(),
        (J::Str(a), Value::String(b)) => String::from_utf8_lossy(a) == b.as_str(),
        (J::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (J::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter().all(|(k, x)| {
                    b.get(String::from_utf8_lossy(k).as_ref())
                        .is_some_and(|y| same(x, y))
                })
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(s: &str) -> J {
        super::super::jsonc::parse_area(s.as_bytes()).unwrap().0
    }

    #[test]
    fn unchanged_tokens_keep_their_text() {
        let s = r#"{"type":"x-z","keyslots":["1"],"zeta":{"b":1,"a":[2.50,"\/"]},"alpha":null}"#;
        let m = model(s);
        let v: Value = serde_json::from_str(s).unwrap();
        assert_eq!(
            String::from_utf8(text(&v, Some(&m))).unwrap(),
            r#"{"type":"x-z","keyslots":["1"],"zeta":{"b":1,"a":[2.50,"/"]},"alpha":null}"#
        );
    }

    #[test]
    fn changes_keep_the_order_and_append_new_keys() {
        let m = model(r#"{"type":"x-z","keyslots":[],"zeta":1,"alpha":2}"#);
        let mut v: Value =
            serde_json::from_str(r#"{"type":"x-z","keyslots":[],"zeta":1,"alpha":2}"#).unwrap();
        v["keyslots"] = serde_json::json!(["0"]);
        v["beta"] = serde_json::json!(true);
        v.as_object_mut().unwrap().remove("zeta");
        assert_eq!(
            String::from_utf8(text(&v, Some(&m))).unwrap(),
            r#"{"type":"x-z","keyslots":["0"],"alpha":2,"beta":true}"#
        );
    }
}
