//! The digests section (`hdr_validate_digests`): numbered ids, each digest with a type and
//! the keyslots and segments it covers, all of which must exist. The digest's own parameters
//! are read only when a key is checked.

use super::tokens::references;
use super::{contains, contains_string, numbered, section, show, Type, R};
use crate::crypt::luks2::jsonc::Value;

pub(super) fn validate(root: &Value) -> R {
    let digests = section(root, "digests")?;
    section(root, "keyslots")?;
    section(root, "segments")?;
    for (key, d) in digests.iter() {
        let what = format!("digest {}", show(key));
        if !numbered(key) {
            return Err(format!("digests: key \"{}\" is not a number", show(key)));
        }
        contains_string(d, &what, "type")?;
        let ks = contains(d, &what, "keyslots", Type::Array)?;
        let segs = contains(d, &what, "segments", Type::Array)?;
        references(
            ks.as_array().unwrap_or_default(),
            root.get("keyslots"),
            &format!("{what}.keyslots"),
            "keyslot",
        )?;
        references(
            segs.as_array().unwrap_or_default(),
            root.get("segments"),
            &format!("{what}.segments"),
            "segment",
        )?;
    }
    Ok(())
}

/// How many digests list keyslot `id` (`LUKS2_get_keyslot_digests_count`).
pub(super) fn count_for_keyslot(root: &Value, id: &[u8]) -> usize {
    let Some(digests) = root.get("digests").and_then(Value::as_object) else {
        return 0;
    };
    digests
        .iter()
        .filter(|(_, d)| {
            d.get("keyslots")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v.get_string().as_deref() == Some(id)))
        })
        .count()
}
