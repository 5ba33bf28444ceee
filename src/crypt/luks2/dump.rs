//! `luksDump` text, field for field as cryptsetup 2.6 prints it, so scripts that read
//! cryptsetup's output read ours.

use super::header::Luks2Header;
use super::kdf::Kdf;
use std::fmt::Write;

/// Bytes as cryptsetup's `crypt_log_hex` prints them: "xx " each, `indent` after every 16.
pub fn hex_lines(bytes: &[u8], indent: &str) -> String {
    let mut s = String::new();
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i % 16 == 0 {
            s.push('\n');
            s.push_str(indent);
        }
        let _ = write!(s, "{b:02x} ");
    }
    s
}

fn or_none(s: &str, none: &str) -> String {
    if s.is_empty() {
        none.to_string()
    } else {
        s.to_string()
    }
}

/// The text of `cryptsetup luksDump` for a LUKS2 header.
pub fn text(h: &Luks2Header) -> String {
    let m = &h.metadata;
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(w, "LUKS header information");
    let _ = writeln!(w, "Version:       \t2");
    let _ = writeln!(w, "Epoch:         \t{}", h.seqid);
    let _ = writeln!(w, "Metadata area: \t{} [bytes]", h.hdr_size);
    let _ = writeln!(w, "Keyslots area: \t{} [bytes]", m.config.keyslots_size);
    let _ = writeln!(w, "UUID:          \t{}", h.uuid);
    let _ = writeln!(w, "Label:         \t{}", or_none(&h.label, "(no label)"));
    let _ = writeln!(
        w,
        "Subsystem:     \t{}",
        or_none(&h.subsystem, "(no subsystem)")
    );
    let flags: String = m.config.flags.iter().map(|f| format!("{f} ")).collect();
    let _ = writeln!(w, "Flags:       \t{}", or_none(&flags, "(no flags)"));
    if !m.config.requirements.is_empty() {
        let r: String = m
            .config
            .requirements
            .iter()
            .map(|f| format!("{f} "))
            .collect();
        let _ = writeln!(w, "Requirements:\t{r}");
    }
    let _ = writeln!(w, "\nData segments:");
    for (id, s) in &m.segments {
        let _ = writeln!(w, "  {id}: {}", s.kind);
        let _ = writeln!(w, "\toffset: {} [bytes]", s.offset);
        match s.size {
            Some(n) => {
                let _ = writeln!(w, "\tlength: {n} [bytes]");
            }
            None => {
                let _ = writeln!(w, "\tlength: (whole device)");
            }
        }
        if s.kind == "crypt" {
            let _ = writeln!(w, "\tcipher: {}", s.encryption);
            let _ = writeln!(w, "\tsector: {} [bytes]", s.sector_size);
            if s.iv_tweak != 0 {
                let _ = writeln!(w, "\tIV tweak: {}", s.iv_tweak);
            }
        }
        if !s.flags.is_empty() {
            let _ = writeln!(w, "\tflags : {}", s.flags.join(" "));
        }
    }
    let _ = writeln!(w, "\nKeyslots:");
    for (id, k) in &m.keyslots {
        let digest = m.keyslot_digest(*id);
        let unbound = if digest.is_none() { " (unbound)" } else { "" };
        let _ = writeln!(w, "  {id}: {}{unbound}", k.kind);
        let _ = writeln!(w, "\tKey:        {} bits", k.key_size * 8);
        let prio = match k.priority {
            Some(0) => "ignored",
            Some(2) => "preferred",
            _ => "normal",
        };
        let _ = writeln!(w, "\tPriority:   {prio}");
        if k.kind == "luks2" {
            let _ = writeln!(w, "\tCipher:     {}", k.area.encryption);
            let _ = writeln!(w, "\tCipher key: {} bits", k.area.key_size * 8);
        }
        let salt_indent = "\t            ";
        match &k.kdf {
            Some(Kdf::Pbkdf2 {
                hash,
                iterations,
                salt,
            }) => {
                let _ = writeln!(w, "\tPBKDF:      pbkdf2");
                let _ = writeln!(w, "\tHash:       {hash}");
                let _ = writeln!(w, "\tIterations: {iterations}");
                let _ = writeln!(w, "\tSalt:       {}", hex_lines(salt, salt_indent));
            }
            Some(Kdf::Argon2 {
                variant,
                time,
                memory,
                cpus,
                salt,
            }) => {
                let _ = writeln!(w, "\tPBKDF:      {}", variant.name());
                let _ = writeln!(w, "\tTime cost:  {time}");
                let _ = writeln!(w, "\tMemory:     {memory}");
                let _ = writeln!(w, "\tThreads:    {cpus}");
                let _ = writeln!(w, "\tSalt:       {}", hex_lines(salt, salt_indent));
            }
            None => {}
        }
        if let Some(af) = &k.af {
            let _ = writeln!(w, "\tAF stripes: {}", af.stripes);
            let _ = writeln!(w, "\tAF hash:    {}", af.hash);
        }
        let _ = writeln!(w, "\tArea offset:{} [bytes]", k.area.offset);
        let _ = writeln!(w, "\tArea length:{} [bytes]", k.area.size);
        if let Some((d, _)) = digest {
            let _ = writeln!(w, "\tDigest ID:  {d}");
        }
    }
    let _ = writeln!(w, "Tokens:");
    for (id, t) in &m.tokens {
        let _ = writeln!(w, "  {id}: {}", t["type"].as_str().unwrap_or("?"));
        if let Some(d) = t.get("key_description").and_then(|v| v.as_str()) {
            let _ = writeln!(w, "\tKeyring:    {d}");
        }
        for s in t["keyslots"].as_array().into_iter().flatten() {
            let _ = writeln!(w, "\tKeyslot:    {}", s.as_str().unwrap_or("?"));
        }
    }
    let _ = writeln!(w, "Digests:");
    for (id, d) in &m.digests {
        let ind = "\t            ";
        let _ = writeln!(w, "  {id}: {}", d.kind);
        let _ = writeln!(w, "\tHash:       {}", d.hash);
        let _ = writeln!(w, "\tIterations: {}", d.iterations);
        let _ = writeln!(w, "\tSalt:       {}", hex_lines(&d.salt, ind));
        let _ = writeln!(w, "\tDigest:     {}", hex_lines(&d.digest, ind));
    }
    o
}

/// The text of `cryptsetup luksDump --dump-volume-key` (LUKS1 and LUKS2 alike).
pub fn volume_key_text(
    device: &str,
    cipher: &str,
    payload_sectors: u64,
    uuid: &str,
    vk: &[u8],
) -> String {
    let (name, mode) = cipher.split_once('-').unwrap_or((cipher, ""));
    let mut o = String::new();
    let _ = writeln!(o, "LUKS header information for {device}");
    let _ = writeln!(o, "Cipher name:   \t{name}");
    let _ = writeln!(o, "Cipher mode:   \t{mode}");
    let _ = writeln!(o, "Payload offset:\t{payload_sectors}");
    let _ = writeln!(o, "UUID:          \t{uuid}");
    let _ = writeln!(o, "MK bits:       \t{}", vk.len() * 8);
    let _ = writeln!(o, "MK dump:\t{}", hex_lines(vk, "\t\t"));
    o
}
