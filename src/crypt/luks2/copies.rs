//! Reading the pair of LUKS2 header copies with cryptsetup 2.6's rules
//! (`LUKS2_disk_hdr_read`): each copy is checked in full — binary header, checksum, the JSON
//! area's framing and every metadata rule ([`super::validate`]) — and a copy that fails any
//! check is as corrupt as one with a bad checksum. The newer valid copy wins.
//!
//! cryptsetup rewrites a damaged copy from the good one as it reads; dmkit never writes in a
//! read-only command, so it uses the good copy and says so instead. Like cryptsetup it refuses
//! when the device also carries another signature (an LVM label, a file system): then the
//! damaged header may be that other thing's data, and the choice is left to the user.

use super::header::{
    checksum, checksum_md, Binary, LoadedHeader, Luks2Header, RawCopy, BINARY_SIZE, HEADER_SIZES,
    MAGIC_PRIMARY, MAGIC_SECONDARY, OFF_CSUM, OFF_HDR_SIZE,
};
use super::json::Metadata;
use super::jsonc::{c_str, Value};
use super::{signatures, validate};
use crate::block::BlockDevice;
use crate::codec::{self, Reader};
use crate::crypt::luks::LuksError;

/// Largest header copy (and offset of the last place a secondary copy may sit): 4 MiB.
const MAX_HDR_SIZE: u64 = 4 << 20;

/// A copy whose checksum matched.
struct Disk {
    offset: u64,
    /// Boxed: the decoded text fields are large beside the other states.
    fields: Box<Binary>,
    area: Vec<u8>,
}

/// What became of one copy (cryptsetup's HDR_OK / HDR_OBSOLETE / HDR_FAIL / HDR_FAIL_IO).
enum State {
    Ok(Disk, Value),
    Obsolete(String),
    Fail(String),
    FailIo(String),
}

impl State {
    fn ok(&self) -> Option<(&Disk, &Value)> {
        match self {
            State::Ok(d, v) => Some((d, v)),
            _ => None,
        }
    }

    fn why(&self) -> &str {
        match self {
            State::Ok(..) => "valid",
            State::Obsolete(w) | State::Fail(w) | State::FailIo(w) => w,
        }
    }
}

/// `hdr_read_disk`: the binary header at `offset`, sanity checks, the JSON area and the
/// checksum. `Err((true, _))` is an I/O failure (the device ends too early).
fn read_disk(dev: &dyn BlockDevice, offset: u64, secondary: bool) -> Result<Disk, (bool, String)> {
    let size = dev.size();
    if offset + BINARY_SIZE as u64 > size {
        return Err((
            true,
            format!("the device ({size} bytes) ends before the header at {offset}"),
        ));
    }
    let mut bin = vec![0u8; BINARY_SIZE];
    dev.read_at(&mut bin, offset)
        .map_err(|e| (true, e.to_string()))?;
    let magic = if secondary {
        MAGIC_SECONDARY
    } else {
        MAGIC_PRIMARY
    };
    let bad = |e: codec::Error| (false, format!("header at {offset}: {e}"));
    let fields = Binary::decode(&bin).map_err(bad)?;
    if &fields.magic != magic {
        return Err((false, format!("no LUKS2 header magic at offset {offset}")));
    }
    let version = fields.version;
    if version != 2 {
        return Err((
            false,
            format!("header at {offset} has version {version}, not 2"),
        ));
    }
    let hdr_offset = fields.hdr_offset;
    if hdr_offset != offset {
        return Err((
            false,
            format!("header at {offset} says it is at offset {hdr_offset}"),
        ));
    }
    let hdr_size = fields.hdr_size;
    if !(HEADER_SIZES[0]..=MAX_HDR_SIZE).contains(&hdr_size) {
        return Err((
            false,
            format!("header at {offset}: header size {hdr_size} is outside 16 KiB..4 MiB"),
        ));
    }
    if secondary && offset != hdr_size {
        return Err((
            false,
            format!("secondary header at {offset} says its size is {hdr_size}"),
        ));
    }
    if offset + hdr_size > size {
        return Err((
            true,
            format!("the device ({size} bytes) ends inside the header at {offset}"),
        ));
    }
    // At most 4 MiB, checked above.
    let mut area = vec![0u8; (hdr_size - BINARY_SIZE as u64) as usize];
    dev.read_at(&mut area, offset + BINARY_SIZE as u64)
        .map_err(|e| (true, e.to_string()))?;
    let alg = String::from_utf8_lossy(c_str(&fields.checksum_alg)).into_owned();
    let md = checksum_md(&alg).map_err(|e| (false, format!("header at {offset}: {e}")))?;
    let want = checksum(md, &bin, &area).map_err(|e| (false, e.to_string()))?;
    let stored = Reader::at(&bin, OFF_CSUM, "csum")
        .and_then(|mut r| r.take(want.len(), "csum"))
        .map_err(bad)?;
    if !bool::from(subtle::ConstantTimeEq::ct_eq(stored, &want[..])) {
        return Err((
            false,
            format!("checksum mismatch in the header at offset {offset}"),
        ));
    }
    Ok(Disk {
        offset,
        fields: Box::new(fields),
        area,
    })
}

fn state(r: Result<Disk, (bool, String)>) -> State {
    match r {
        Ok(d) => match validate::parse_and_validate(&d.area) {
            Ok(v) => State::Ok(d, v),
            Err(e) => State::Obsolete(format!("header at offset {}: {e}", d.offset)),
        },
        Err((true, e)) => State::FailIo(e),
        Err((false, e)) => State::Fail(e),
    }
}

fn header_from(d: &Disk, json: Value) -> Luks2Header {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let f = &d.fields;
    let label = Binary::text(&f.label);
    let subsystem = Binary::text(&f.subsystem);
    let uuid = Binary::text(&f.uuid);
    Luks2Header {
        hdr_size: f.hdr_size,
        seqid: f.seqid,
        label: text(&label),
        subsystem: text(&subsystem),
        uuid: text(&uuid),
        checksum_alg: text(&Binary::text(&f.checksum_alg)),
        metadata: Metadata::from_tree(&json),
        raw: Some(RawCopy {
            json,
            label,
            subsystem,
            uuid,
        }),
    }
}

/// Read the header pair of `dev`.
pub fn read(dev: &dyn BlockDevice) -> Result<LoadedHeader, LuksError> {
    let device = dev.name().to_string();
    let mut s1 = state(read_disk(dev, 0, false));
    let mut s2 = match &s1 {
        State::Ok(d, _) => state(read_disk(dev, d.fields.hdr_size, true)),
        State::Obsolete(_) => {
            let h = read_disk_size(dev);
            state(read_disk(dev, h, true))
        }
        State::Fail(_) | State::FailIo(_) => {
            // No usable header size: try every place a secondary copy may sit.
            let mut last = Err((false, "no secondary LUKS2 header found".to_string()));
            // The reason worth reporting: a copy that has the magic but fails later.
            let mut telling = None;
            for &off in &HEADER_SIZES {
                last = read_disk(dev, off, true);
                match &last {
                    Ok(_) => break,
                    Err((_, e))
                        if telling.is_none()
                            && !e.starts_with("no LUKS2 header magic")
                            && !e.contains("ends before") =>
                    {
                        telling = Some(e.clone())
                    }
                    Err(_) => {}
                }
            }
            match (last, telling) {
                (Err((io, _)), Some(e)) => state(Err((io, e))),
                (last, _) => state(last),
            }
        }
    };
    if let (Some((d1, _)), Some((d2, _))) = (s1.ok(), s2.ok()) {
        let (q1, q2) = (d1.fields.seqid, d2.fields.seqid);
        if q1 > q2 {
            s2 = State::Obsolete(format!("the secondary copy is older (epoch {q2} < {q1})"));
        } else if q1 < q2 {
            s1 = State::Obsolete(format!("the primary copy is older (epoch {q1} < {q2})"));
        }
    }
    let (used, secondary) = match (s1.ok(), s2.ok()) {
        (Some((d, v)), _) => ((d, v), false),
        (None, Some((d, v))) => ((d, v), true),
        (None, None) => {
            let mut first = [0u8; 8];
            let looks_luks = dev.size() >= 8
                && dev.read_at(&mut first, 0).is_ok()
                && super::header::luks_version(&first).is_some();
            if !looks_luks && matches!(s2, State::Fail(_) | State::FailIo(_)) {
                return Err(LuksError::NotLuks { device });
            }
            return Err(LuksError::BothCorrupt {
                device,
                primary: s1.why().to_string(),
                secondary: s2.why().to_string(),
            });
        }
    };
    let need = super::validate::hdr_and_areas_size(used.1);
    if dev.size() < need {
        return Err(LuksError::Corrupt {
            device,
            what: format!(
                "the device ({} bytes) is smaller than the LUKS2 headers and keyslots ({need} bytes); truncated?",
                dev.size()
            ),
        });
    }
    let warning = match (secondary, s1.ok().is_some() && s2.ok().is_some()) {
        (_, true) => None,
        (false, false) => Some(format!(
            "{device}: the secondary LUKS2 header needs repair ({}); using the primary",
            s2.why()
        )),
        (true, false) => Some(format!(
            "{device}: the primary LUKS2 header needs repair ({}); using the secondary copy at offset {}",
            s1.why(),
            used.0.offset
        )),
    };
    if warning.is_some() {
        if let Some(sig) = signatures::other_signature(dev)? {
            return Err(LuksError::Corrupt {
                device,
                what: format!(
                    "one LUKS2 header copy is damaged and the device also carries a {sig} signature (ambiguous signatures); refusing to pick a header copy"
                ),
            });
        }
    }
    Ok(LoadedHeader {
        header: header_from(used.0, used.1.clone()),
        warning,
    })
}

/// The header size the primary copy states, for a primary that passed its checksum but not
/// validation (cryptsetup then looks for the secondary copy right after it).
fn read_disk_size(dev: &dyn BlockDevice) -> u64 {
    let mut bin = [0u8; 16];
    if dev.read_at(&mut bin, 0).is_err() {
        return 0;
    }
    // No usable size either way: 0 is no place a secondary copy sits.
    Reader::at(&bin, OFF_HDR_SIZE, "hdr_size")
        .and_then(|mut r| r.u64_be("hdr_size"))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryDevice;

    const META: &str = r#"{"keyslots":{},"tokens":{},"segments":{"0":{"type":"linear","offset":"32768","size":"dynamic"}},"digests":{},"config":{"json_size":"12288","keyslots_size":"0"}}"#;

    fn area(text: &[u8]) -> Vec<u8> {
        let mut a = text.to_vec();
        a.resize(12288, 0);
        a
    }

    #[test]
    fn the_json_area_is_framed_as_cryptsetup_wants() {
        validate::parse_and_validate(&area(META.as_bytes())).unwrap();
        // Whitespace after the object is fine; before it, or other bytes after it, are not.
        validate::parse_and_validate(&area(format!("{META} \n").as_bytes())).unwrap();
        let e = validate::parse_and_validate(&area(format!(" {META}").as_bytes())).unwrap_err();
        assert!(e.contains("does not start with '{'"), "{e}");
        let mut a = area(META.as_bytes());
        a[12000] = b'x';
        let e = validate::parse_and_validate(&a).unwrap_err();
        assert!(e.contains("byte 12000"), "{e}");
        let full = vec![b' '; 12288];
        assert!(validate::parse_and_validate(&full).is_err());
    }

    #[test]
    fn an_lvm_label_blocks_picking_a_copy() {
        let mut d = vec![0u8; 1 << 20];
        d[512..520].copy_from_slice(b"LABELONE");
        d[512 + 24..512 + 32].copy_from_slice(b"LVM2 001");
        let dev = MemoryDevice::from_vec("pv", d);
        assert_eq!(
            signatures::other_signature(&dev).unwrap(),
            Some("LVM2_member")
        );
        let dev = MemoryDevice::from_vec("plain", vec![0u8; 1 << 20]);
        assert_eq!(signatures::other_signature(&dev).unwrap(), None);
    }
}
