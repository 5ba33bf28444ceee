//! The tokens section (`hdr_validate_tokens`): numbered ids, each token with a type and a
//! list of keyslots that exist. What a token type means is checked only when a token is
//! imported, never when a header is read.

use super::{contains, contains_string, numbered, section, show, Type, R};
use crate::crypt::luks2::jsonc::Value;

/// Every element of `list` is a string naming an object member of `targets`
/// (`validate_keyslots_array` / `validate_segments_array`).
pub(super) fn references(list: &[Value], targets: Option<&Value>, what: &str, kind: &str) -> R {
    for (i, v) in list.iter().enumerate() {
        let Some(name) = v.as_bytes() else {
            return Err(format!("{what}: element {i} is not a string"));
        };
        let name = super::c_str(name);
        let found = targets
            .and_then(Value::as_object)
            .and_then(|o| o.iter().find(|(k, _)| *k == name).map(|(_, x)| x));
        if !matches!(found, Some(Value::Object(_))) {
            return Err(format!("{what}: {kind} {} does not exist", show(name)));
        }
    }
    Ok(())
}

pub(super) fn validate(root: &Value) -> R {
    let tokens = section(root, "tokens")?;
    for (key, token) in tokens.iter() {
        let what = format!("token {}", show(key));
        if !numbered(key) {
            return Err(format!("tokens: key \"{}\" is not a number", show(key)));
        }
        // cryptsetup needs the keyslots section to exist before it looks at any token.
        let Some(keyslots) = root.get("keyslots") else {
            return Err("metadata: \"keyslots\" is missing".into());
        };
        contains_string(token, &what, "type")?;
        let list = contains(token, &what, "keyslots", Type::Array)?;
        references(
            list.as_array().unwrap_or_default(),
            Some(keyslots),
            &format!("{what}.keyslots"),
            "keyslot",
        )?;
    }
    Ok(())
}
