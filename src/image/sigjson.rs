//! The root-verity-sig partition: one JSON object, NUL-padded to the partition's end, as
//! systemd-repart writes it and systemd's image dissection reads it:
//!
//! ```text
//! {"rootHash":"<hex>","certificateFingerprint":"<sha256 of the DER certificate, hex>","signature":"<base64 DER PKCS#7>"}
//! ```
//!
//! Reading follows systemd: at most 4 MiB; after the first NUL every byte must be NUL; then
//! `rootHash` (hex) and `signature` (base64) must be strings. The fingerprint is optional to
//! systemd; when present it must be 32 bytes of hex here.

use base64::Engine;

/// The largest signature partition accepted (systemd's limit).
pub const MAX_SIZE: u64 = 4 << 20;
/// The size systemd-repart gives the partition (16 KiB), unless the JSON needs more.
pub const DEFAULT_PARTITION_SIZE: u64 = 16 << 10;

/// The contents of a signature partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigJson {
    /// The root hash.
    pub root_hash: Vec<u8>,
    /// SHA-256 of the signer's DER certificate, if given.
    pub certificate_fingerprint: Option<[u8; 32]>,
    /// DER PKCS#7 signature over the lowercase hex root hash.
    pub signature: Vec<u8>,
}

/// Why a signature partition was refused; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigJsonError {
    /// Larger than 4 MiB.
    #[error("{0} bytes, more than the 4 MiB a signature partition may hold")]
    TooLarge(u64),
    /// Bytes after the first NUL.
    #[error("data after the NUL padding at byte {0}")]
    EmbeddedNul(usize),
    /// Not UTF-8 JSON.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// A field is missing or malformed.
    #[error("{field}: {what}")]
    Field {
        /// The field name.
        field: &'static str,
        /// What is wrong.
        what: String,
    },
}

impl SigJson {
    /// The JSON text systemd-repart writes: compact, in this key order.
    pub fn to_json(&self) -> String {
        let mut fields = vec![("rootHash", hex::encode(&self.root_hash))];
        if let Some(fp) = &self.certificate_fingerprint {
            fields.push(("certificateFingerprint", hex::encode(fp)));
        }
        fields.push((
            "signature",
            base64::engine::general_purpose::STANDARD.encode(&self.signature),
        ));
        // Hex and base64 need no escaping.
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("\"{k}\":\"{v}\""))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// The partition contents: the JSON, NUL-padded to the default partition size or to the
    /// next 4 KiB past it (there is always at least one NUL).
    pub fn to_partition(&self) -> Vec<u8> {
        let text = self.to_json();
        let size = DEFAULT_PARTITION_SIZE.max((text.len() as u64 + 1).div_ceil(4096) * 4096);
        let mut b = text.into_bytes();
        b.resize(size as usize, 0);
        b
    }

    /// Parse a signature partition's contents.
    pub fn parse(data: &[u8]) -> Result<SigJson, SigJsonError> {
        if data.len() as u64 > MAX_SIZE {
            return Err(SigJsonError::TooLarge(data.len() as u64));
        }
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        if let Some(p) = data[end..].iter().position(|&b| b != 0) {
            return Err(SigJsonError::EmbeddedNul(end + p));
        }
        let text =
            std::str::from_utf8(&data[..end]).map_err(|e| SigJsonError::Json(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| SigJsonError::Json(e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| SigJsonError::Json("the top level is not an object".into()))?;
        let string = |field: &'static str| -> Result<Option<&str>, SigJsonError> {
            match obj.get(field) {
                None => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(SigJsonError::Field {
                    field,
                    what: "not a string".into(),
                }),
            }
        };
        let required = |field: &'static str| -> Result<&str, SigJsonError> {
            string(field)?.ok_or(SigJsonError::Field {
                field,
                what: "missing".into(),
            })
        };
        let hexfield = |field: &'static str, s: &str| {
            hex::decode(s).map_err(|e| SigJsonError::Field {
                field,
                what: format!("not hex: {e}"),
            })
        };
        let root_hash = hexfield("rootHash", required("rootHash")?)?;
        if root_hash.is_empty() {
            return Err(SigJsonError::Field {
                field: "rootHash",
                what: "empty".into(),
            });
        }
        let certificate_fingerprint = match string("certificateFingerprint")? {
            None => None,
            Some(s) => Some(hexfield("certificateFingerprint", s)?.try_into().map_err(
                |v: Vec<u8>| SigJsonError::Field {
                    field: "certificateFingerprint",
                    what: format!("{} bytes, a SHA-256 fingerprint has 32", v.len()),
                },
            )?),
        };
        let signature = base64::engine::general_purpose::STANDARD
            .decode(required("signature")?)
            .map_err(|e| SigJsonError::Field {
                field: "signature",
                what: format!("not base64: {e}"),
            })?;
        if signature.is_empty() {
            return Err(SigJsonError::Field {
                field: "signature",
                what: "empty".into(),
            });
        }
        Ok(SigJson {
            root_hash,
            certificate_fingerprint,
            signature,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SigJson {
        SigJson {
            root_hash: vec![0xab; 32],
            certificate_fingerprint: Some([0xcd; 32]),
            signature: vec![0x30, 0x82, 1, 2, 3],
        }
    }

    #[test]
    fn written_as_systemd_writes_it() {
        let s = sample();
        let text = s.to_json();
        assert_eq!(
            text,
            format!(
                "{{\"rootHash\":\"{}\",\"certificateFingerprint\":\"{}\",\"signature\":\"MIIBAgM=\"}}",
                "ab".repeat(32),
                "cd".repeat(32)
            )
        );
        let p = s.to_partition();
        assert_eq!(p.len(), 16384);
        assert_eq!(&p[..text.len()], text.as_bytes());
        assert_eq!(SigJson::parse(&p).unwrap(), s);
    }

    #[test]
    fn refuses_bad_partitions() {
        let mut p = sample().to_partition();
        p[16000] = b'x';
        assert_eq!(SigJson::parse(&p), Err(SigJsonError::EmbeddedNul(16000)));
        let e = |s: &str| SigJson::parse(s.as_bytes()).unwrap_err().to_string();
        assert!(e("[]").contains("not an object"));
        assert!(e("{}").contains("rootHash: missing"));
        assert!(e(r#"{"rootHash":"zz","signature":"AA=="}"#).contains("rootHash: not hex"));
        assert!(e(r#"{"rootHash":"00","signature":3}"#).contains("signature: not a string"));
        assert!(e(r#"{"rootHash":"00","signature":"!!"}"#).contains("signature: not base64"));
        assert!(
            e(r#"{"rootHash":"00","certificateFingerprint":"00","signature":"AA=="}"#)
                .contains("certificateFingerprint: 1 bytes")
        );
        assert!(matches!(
            SigJson::parse(&vec![b' '; (MAX_SIZE + 1) as usize]),
            Err(SigJsonError::TooLarge(_))
        ));
        // Without a fingerprint is fine (systemd does not need it).
        let s = SigJson::parse(br#"{"rootHash":"00ff","signature":"AA=="}"#).unwrap();
        assert_eq!(s.certificate_fingerprint, None);
    }
}
