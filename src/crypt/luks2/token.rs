//! LUKS2 tokens (`cryptsetup token add|remove|import|export`): JSON objects in the metadata's
//! `tokens` section, by id 0..31. Every token has a `type` string and a `keyslots` array of
//! keyslot ids; tokens of types dmkit does not know are kept exactly as they are. The one
//! built-in type, `luks2-keyring`, names a passphrase in the kernel keyring by its
//! `key_description` (see [`crate::crypt::luks::keyring`]).
//!
//! Changes are made in memory and checked with cryptsetup's header rules; the caller writes
//! the header.

use super::header::Luks2Header;
use crate::crypt::luks::{LuksError, MAX_KEYSLOTS};
use serde_json::{Map, Value};

/// The built-in token type that reads a passphrase from the kernel keyring.
pub const KEYRING: &str = "luks2-keyring";

/// Whether token `id` is in use.
pub fn in_use(h: &Luks2Header, id: u32) -> bool {
    h.metadata.tokens.contains_key(&id)
}

/// The first free token id (`LUKS2_token_find_free`).
pub fn free_id(h: &Luks2Header) -> Option<u32> {
    (0..MAX_KEYSLOTS).find(|i| !in_use(h, *i))
}

/// A `luks2-keyring` token for `description`, bound to no keyslot yet, with cryptsetup's
/// fields in its order.
pub fn keyring_json(description: &str) -> String {
    format!(
        "{{\"type\":{},\"keyslots\":[],\"key_description\":{}}}",
        Value::String(KEYRING.into()),
        Value::String(description.into())
    )
}

/// Put the token in `json` at `id` (`None`: the first free id), replacing what is there
/// (the caller refuses an id in use unless told to replace). Refused (`Invalid`, as cryptsetup
/// refuses with -EINVAL) when it is not a JSON object with a `type` string and a `keyslots`
/// array naming existing keyslots, when its type starts with `luks2-` but is not a built-in
/// type, when a `luks2-keyring` token is malformed, or when the metadata would not fit.
pub fn set(h: &mut Luks2Header, id: Option<u32>, json: &str) -> Result<u32, LuksError> {
    let bad = |why: &str| LuksError::Invalid(format!("token JSON: {why}"));
    let id = match id {
        Some(i) if i < MAX_KEYSLOTS => i,
        Some(i) => return Err(bad(&format!("token id {i} is not in 0..31"))),
        None => free_id(h).ok_or_else(|| bad("all 32 tokens are in use"))?,
    };
    let value: Value = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
    let o = value.as_object().ok_or_else(|| bad("not a JSON object"))?;
    let kind = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing \"type\" string"))?;
    if kind.starts_with("luks2-") {
        if kind != KEYRING {
            return Err(bad(&format!(
                "{kind:?} is a reserved built-in type dmkit does not know"
            )));
        }
        check_keyring(o).map_err(|e| bad(&e))?;
    }
    // json-c's tree of the text: the key order `token export` gives back.
    let (tree, _) = super::jsonc::parse_area(json.as_bytes()).map_err(|e| bad(&e.to_string()))?;
    let mut m = h.metadata.clone();
    m.tokens.insert(id, value);
    m.token_json.insert(id, tree);
    m.validate(h.hdr_size).map_err(|e| bad(&e))?;
    h.metadata = m;
    Ok(id)
}

/// `keyring_validate`: exactly `type`, `keyslots` and a non-empty `key_description` string.
fn check_keyring(o: &Map<String, Value>) -> Result<(), String> {
    if o.len() != 3 {
        return Err("a luks2-keyring token has exactly 3 fields".into());
    }
    match o.get("key_description").and_then(Value::as_str) {
        Some(d) if !d.is_empty() => Ok(()),
        _ => Err("a luks2-keyring token needs a non-empty \"key_description\" string".into()),
    }
}

/// Remove token `id`.
pub fn remove(h: &mut Luks2Header, id: u32) -> Result<(), LuksError> {
    h.metadata.token_json.remove(&id);
    h.metadata
        .tokens
        .remove(&id)
        .map(|_| ())
        .ok_or_else(|| LuksError::Invalid(format!("Token {id} is not in use.")))
}

/// Bind token `id` to keyslot `slot` (`crypt_token_assign_keyslot`).
pub fn assign(h: &mut Luks2Header, id: u32, slot: u32) -> Result<(), LuksError> {
    if !h.metadata.keyslots.contains_key(&slot) {
        return Err(LuksError::Invalid(format!("Keyslot {slot} is not active.")));
    }
    let t = h
        .metadata
        .tokens
        .get_mut(&id)
        .ok_or_else(|| LuksError::Invalid(format!("Token {id} is not in use.")))?;
    let name = Value::String(slot.to_string());
    if let Some(list) = t.get_mut("keyslots").and_then(Value::as_array_mut) {
        if !list.contains(&name) {
            list.push(name);
        }
    }
    Ok(())
}

/// Unbind token `id` from keyslot `slot` (`crypt_token_unassign_keyslot`); the token stays.
pub fn unassign(h: &mut Luks2Header, id: u32, slot: u32) -> Result<(), LuksError> {
    let not_assigned =
        || LuksError::Invalid(format!("Token {id} is not assigned to keyslot {slot}."));
    let list = h
        .metadata
        .tokens
        .get_mut(&id)
        .and_then(|t| t.get_mut("keyslots"))
        .and_then(Value::as_array_mut)
        .ok_or_else(not_assigned)?;
    let name = Value::String(slot.to_string());
    let before = list.len();
    list.retain(|s| *s != name);
    if list.len() == before {
        return Err(not_assigned());
    }
    Ok(())
}

/// The text of token `id` as cryptsetup exports it (json-c's plain layout): its keys in the
/// order they were read or imported in, keys added since after them.
pub fn export(h: &Luks2Header, id: u32) -> Result<String, LuksError> {
    let t = h
        .metadata
        .tokens
        .get(&id)
        .ok_or_else(|| LuksError::Invalid(format!("Failed to get token {id} for export.")))?;
    let text = super::token_order::text(t, h.metadata.token_json.get(&id));
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Key descriptions of the `luks2-keyring` tokens that may open keyslot `slot` (any keyslot
/// when `None`), with the keyslots each is bound to, in token id order.
pub fn keyring_tokens(h: &Luks2Header, id: Option<u32>) -> Vec<(u32, String, Vec<u32>)> {
    h.metadata
        .tokens
        .iter()
        .filter(|(i, _)| id.is_none_or(|w| w == **i))
        .filter(|(_, t)| t.get("type").and_then(Value::as_str) == Some(KEYRING))
        .filter_map(|(&i, t)| {
            let desc = t.get("key_description")?.as_str()?.to_string();
            let slots = t
                .get("keyslots")?
                .as_array()?
                .iter()
                .filter_map(|s| s.as_str()?.parse().ok())
                .collect();
            Some((i, desc, slots))
        })
        .collect()
}
