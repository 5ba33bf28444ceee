//! The handshake: fixed newstyle negotiation, from the server's greeting to the transmission
//! phase. Options understood: `EXPORT_NAME`, `ABORT`, `LIST`, `STARTTLS`, `INFO`, `GO` (with
//! `NBD_INFO_EXPORT`, `NAME`, `DESCRIPTION` and `BLOCK_SIZE`) and `STRUCTURED_REPLY`; every
//! other option is answered `NBD_REP_ERR_UNSUP`. With TLS required, every option but
//! `STARTTLS` and `ABORT` is answered `NBD_REP_ERR_TLS_REQD` until TLS runs.
//!
//! Nothing the client sends is trusted: an option's length is read from the wire but its data
//! is only kept up to [`MAX_OPTION`] bytes (longer ones are skipped and refused, absurd ones
//! end the connection), and every field inside is checked against the option's length.

use super::export::ExportInfo;
use super::proto::*;
use super::wire::{Stream, Wire};
use crate::codec::{self, Reader, Writer};
use std::io;

/// Option data kept in memory: a name (4096 bytes at most) and its framing, with room to spare.
pub const MAX_OPTION: u32 = 64 << 10;
/// Option data skipped before the connection is given up as abusive.
pub const MAX_SKIP: u32 = 16 << 20;

/// How a negotiation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Enter the transmission phase.
    Go {
        /// Structured replies were negotiated.
        structured: bool,
    },
    /// `STARTTLS` was acknowledged: the caller runs the TLS handshake on the socket and then
    /// negotiates again over TLS ([`Handshake::options`]).
    StartTls,
    /// The client ended the negotiation (`NBD_OPT_ABORT`).
    Aborted,
}

/// Whether TLS is required, and whether it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// No TLS on this server: `STARTTLS` is refused by policy.
    Off,
    /// TLS is required and not running yet.
    Required,
    /// TLS runs.
    Active,
}

/// One connection's negotiation state.
#[derive(Debug)]
pub struct Handshake<'a> {
    export: &'a ExportInfo,
    /// The client asked for no zeroes after `EXPORT_NAME`.
    no_zeroes: bool,
    structured: bool,
}

/// A protocol violation: the connection is closed.
fn violation(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl<'a> Handshake<'a> {
    /// Send the greeting and read the client's flags. A client flag we do not know ends the
    /// connection, as the protocol says.
    pub fn greet<S: Stream>(export: &'a ExportInfo, wire: &mut Wire<S>) -> io::Result<Self> {
        let mut g = Writer::with_capacity(18);
        g.u64_be(NBDMAGIC)
            .u64_be(IHAVEOPT)
            .u16_be(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        wire.send(&[g.as_slice()])?;
        let mut f = [0u8; 4];
        wire.read_exact(&mut f)?;
        let flags = Reader::new(&f).u32_be("client flags").map_err(malformed)?;
        if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(violation(format!("unknown client flags {flags:#x}")));
        }
        if flags & FLAG_C_FIXED_NEWSTYLE == 0 {
            // Without fixed newstyle, no option but EXPORT_NAME could even be refused.
            return Err(violation(
                "the client does not speak fixed newstyle negotiation",
            ));
        }
        Ok(Handshake {
            export,
            no_zeroes: flags & FLAG_C_NO_ZEROES != 0,
            structured: false,
        })
    }

    /// Answer options until the client enters transmission, asks for TLS, or aborts.
    /// Errors are protocol violations or I/O errors: the connection is closed.
    pub fn options<S: Stream>(&mut self, wire: &mut Wire<S>, tls: Tls) -> io::Result<Outcome> {
        if tls == Tls::Active {
            // What was negotiated in the clear does not carry over into TLS.
            self.structured = false;
        }
        loop {
            let mut h = [0u8; 16];
            wire.read_exact(&mut h)?;
            let mut r = Reader::new(&h);
            if r.u64_be("option magic").map_err(malformed)? != IHAVEOPT {
                return Err(violation("an option without the IHAVEOPT magic"));
            }
            let option = r.u32_be("option").map_err(malformed)?;
            let len = r.u32_be("option length").map_err(malformed)?;
            if len > MAX_OPTION {
                if len > MAX_SKIP || option == OPT_EXPORT_NAME {
                    return Err(violation(format!(
                        "option {option} claims {len} bytes of data"
                    )));
                }
                wire.skip(u64::from(len))?;
                self.error(wire, option, REP_ERR_TOO_BIG, "option data too long")?;
                continue;
            }
            let mut data = vec![0u8; len as usize];
            wire.read_exact(&mut data)?;
            if tls == Tls::Required && option != OPT_STARTTLS && option != OPT_ABORT {
                if option == OPT_EXPORT_NAME {
                    // It cannot be refused: the protocol says to hang up.
                    return Err(violation("NBD_OPT_EXPORT_NAME before TLS"));
                }
                self.error(wire, option, REP_ERR_TLS_REQD, "TLS is required")?;
                continue;
            }
            if let Some(outcome) = self.option(wire, tls, option, &data)? {
                return Ok(outcome);
            }
        }
    }

    /// Answer one option; `Some` when the negotiation ends with it.
    fn option<S: Stream>(
        &mut self,
        wire: &mut Wire<S>,
        tls: Tls,
        option: u32,
        data: &[u8],
    ) -> io::Result<Option<Outcome>> {
        match option {
            OPT_EXPORT_NAME => {
                if !self.export.is_named(data) {
                    return Err(violation("NBD_OPT_EXPORT_NAME of an unknown export"));
                }
                let mut r = Writer::with_capacity(134);
                r.u64_be(self.export.size).u16_be(self.export.flags);
                if !self.no_zeroes {
                    r.zeros(124);
                }
                wire.send(&[r.as_slice()])?;
                return Ok(Some(Outcome::Go {
                    structured: self.structured,
                }));
            }
            OPT_ABORT => {
                self.ack(wire, option)?;
                return Ok(Some(Outcome::Aborted));
            }
            OPT_LIST if !data.is_empty() => {
                self.error(wire, option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?
            }
            OPT_LIST => {
                let name = self.export.name.as_bytes();
                let mut r = Writer::new();
                r.u32_be(name.len() as u32)
                    .bytes(name)
                    .bytes(self.export.description.as_bytes());
                self.reply(wire, option, REP_SERVER, r.as_slice())?;
                self.ack(wire, option)?;
            }
            OPT_STARTTLS => {
                let refusal = if !data.is_empty() {
                    Some((REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data"))
                } else {
                    match tls {
                        Tls::Off => Some((REP_ERR_POLICY, "this server does not offer TLS")),
                        Tls::Active => Some((REP_ERR_INVALID, "TLS is already running")),
                        Tls::Required => None,
                    }
                };
                match refusal {
                    Some((code, msg)) => self.error(wire, option, code, msg)?,
                    None => {
                        self.ack(wire, option)?;
                        return Ok(Some(Outcome::StartTls));
                    }
                }
            }
            OPT_INFO | OPT_GO => {
                if let Some(outcome) = self.info(wire, option, data)? {
                    return Ok(Some(outcome));
                }
            }
            OPT_STRUCTURED_REPLY if !data.is_empty() => self.error(
                wire,
                option,
                REP_ERR_INVALID,
                "NBD_OPT_STRUCTURED_REPLY takes no data",
            )?,
            OPT_STRUCTURED_REPLY => {
                self.structured = true;
                self.ack(wire, option)?;
            }
            _ => self.error(
                wire,
                option,
                REP_ERR_UNSUP,
                &format!("option {option} is not supported"),
            )?,
        }
        Ok(None)
    }

    /// `NBD_OPT_INFO` and `NBD_OPT_GO`: u32 name length, name, u16 request count, requests.
    fn info<S: Stream>(
        &mut self,
        wire: &mut Wire<S>,
        option: u32,
        data: &[u8],
    ) -> io::Result<Option<Outcome>> {
        let Some((name, requests)) = parse_info_name(data) else {
            self.error(
                wire,
                option,
                REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/GO data",
            )?;
            return Ok(None);
        };
        if !self.export.is_named(name) {
            let msg = format!(
                "no export named {:?} (this server has {:?})",
                String::from_utf8_lossy(name),
                self.export.name
            );
            self.error(wire, option, REP_ERR_UNKNOWN, &msg)?;
            return Ok(None);
        }
        let e = self.export;
        let mut x = Writer::with_capacity(12);
        x.u16_be(INFO_EXPORT).u64_be(e.size).u16_be(e.flags);
        self.reply(wire, option, REP_INFO, x.as_slice())?;
        if requests.contains(&INFO_NAME) {
            let mut r = Writer::new();
            r.u16_be(INFO_NAME).bytes(e.name.as_bytes());
            self.reply(wire, option, REP_INFO, r.as_slice())?;
        }
        if requests.contains(&INFO_DESCRIPTION) {
            let mut r = Writer::new();
            r.u16_be(INFO_DESCRIPTION).bytes(e.description.as_bytes());
            self.reply(wire, option, REP_INFO, r.as_slice())?;
        }
        // Sent whether asked for or not: a client that ignores it gets unaligned requests
        // served all the same (read-modify-write), only slower.
        let mut b = Writer::with_capacity(14);
        b.u16_be(INFO_BLOCK_SIZE);
        for v in [e.min_block, e.preferred_block, e.max_payload] {
            b.u32_be(v);
        }
        self.reply(wire, option, REP_INFO, b.as_slice())?;
        self.ack(wire, option)?;
        Ok((option == OPT_GO).then_some(Outcome::Go {
            structured: self.structured,
        }))
    }

    fn reply<S: Stream>(
        &self,
        wire: &mut Wire<S>,
        option: u32,
        reply: u32,
        data: &[u8],
    ) -> io::Result<()> {
        wire.send(&[&option_reply(option, reply, data.len() as u32), data])?;
        wire.flush()
    }

    fn ack<S: Stream>(&self, wire: &mut Wire<S>, option: u32) -> io::Result<()> {
        self.reply(wire, option, REP_ACK, &[])
    }

    fn error<S: Stream>(
        &self,
        wire: &mut Wire<S>,
        option: u32,
        code: u32,
        msg: &str,
    ) -> io::Result<()> {
        self.reply(wire, option, code, msg.as_bytes())
    }
}

/// The information requests of `NBD_OPT_INFO`/`GO` data, `None` when the framing is wrong:
/// the lengths inside must add up to exactly the option's length, the name at most 4096
/// bytes.
pub fn parse_info(data: &[u8]) -> Option<Vec<u16>> {
    parse_info_name(data).map(|(_, requests)| requests)
}

/// [`parse_info`] with the export name the data asks for.
fn parse_info_name(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let mut r = Reader::new(data);
    let name_len = r.u32_be("name length").ok()? as usize;
    if name_len > 4096 {
        return None;
    }
    let name = r.take(name_len, "name").ok()?;
    let count = usize::from(r.u16_be("request count").ok()?);
    if r.left() != 2 * count {
        return None;
    }
    let requests = (0..count)
        .map(|_| r.u16_be("request"))
        .collect::<Result<_, _>>()
        .ok()?;
    Some((name, requests))
}

/// A field the peer's bytes do not hold (the buffers are sized for them: a bug, reported as
/// a protocol violation rather than a panic).
fn malformed(e: codec::Error) -> io::Error {
    violation(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::nbd::export::MAX_PAYLOAD;

    fn export() -> ExportInfo {
        ExportInfo::new("dev", "a test", 1 << 20, 512, false, false)
    }

    fn opt(option: u32, data: &[u8]) -> Vec<u8> {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&option.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn go_data(name: &[u8], requests: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    /// The option replies in `out` after the 18-byte greeting: (option, type, data).
    fn replies(out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut at = 18;
        while at + 20 <= out.len() && be64(out, at) == REPLY_MAGIC {
            let len = be32(out, at + 16) as usize;
            v.push((
                be32(out, at + 8),
                be32(out, at + 12),
                out[at + 20..at + 20 + len].to_vec(),
            ));
            at += 20 + len;
        }
        v
    }

    fn run(input: Vec<u8>, tls: Tls) -> (io::Result<Outcome>, Vec<u8>) {
        crate::export::nbd::replay::handshake(&export(), &input, tls)
    }

    #[test]
    fn go_with_structured_replies() {
        let mut input = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        input.extend(opt(OPT_LIST, &[]));
        input.extend(opt(42, b"junk"));
        input.extend(opt(OPT_GO, &go_data(b"nope", &[])));
        input.extend(opt(
            OPT_GO,
            &go_data(b"", &[INFO_NAME, INFO_DESCRIPTION, 999]),
        ));
        let (r, out) = run(input, Tls::Off);
        assert_eq!(r.unwrap(), Outcome::Go { structured: true });
        assert_eq!(be64(&out, 0), NBDMAGIC);
        let reps = replies(&out);
        let types: Vec<u32> = reps.iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            [
                REP_ACK,
                REP_SERVER,
                REP_ACK,
                REP_ERR_UNSUP,
                REP_ERR_UNKNOWN,
                REP_INFO,
                REP_INFO,
                REP_INFO,
                REP_INFO,
                REP_ACK
            ]
        );
        assert_eq!(&reps[1].2[..], b"\0\0\0\x03deva test");
        let x = &reps[5].2;
        assert_eq!(be16(x, 0), INFO_EXPORT);
        assert_eq!(be64(x, 2), 1 << 20);
        assert_eq!(be16(x, 10), export().flags);
        assert_eq!(&reps[6].2[2..], b"dev");
        assert_eq!(&reps[7].2[2..], b"a test");
        let b = &reps[8].2;
        assert_eq!(
            (be32(b, 2), be32(b, 6), be32(b, 10)),
            (512, 4096, MAX_PAYLOAD)
        );
    }

    #[test]
    fn tls_required_refuses_everything_but_starttls() {
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(opt(OPT_GO, &go_data(b"", &[])));
        input.extend(opt(OPT_STARTTLS, &[]));
        let (r, out) = run(input.clone(), Tls::Required);
        assert_eq!(r.unwrap(), Outcome::StartTls);
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(types, [REP_ERR_TLS_REQD, REP_ACK]);
        // No TLS configured: STARTTLS is refused by policy, and the client may go on.
        input.extend(opt(OPT_ABORT, &[]));
        let (r, out) = run(input.clone(), Tls::Off);
        assert_eq!(r.unwrap(), Outcome::Go { structured: false });
        assert_eq!(replies(&out)[0].1, REP_INFO);
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(opt(OPT_STARTTLS, &[]));
        input.extend(opt(OPT_ABORT, &[]));
        let (r, out) = run(input, Tls::Off);
        assert_eq!(r.unwrap(), Outcome::Aborted);
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(types, [REP_ERR_POLICY, REP_ACK]);
        // EXPORT_NAME cannot be refused: the connection ends.
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(opt(OPT_EXPORT_NAME, b""));
        assert!(run(input, Tls::Required).0.is_err());
    }

    #[test]
    fn export_name_sends_size_and_flags() {
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(opt(OPT_EXPORT_NAME, b"dev"));
        let (r, out) = run(input, Tls::Off);
        assert_eq!(r.unwrap(), Outcome::Go { structured: false });
        assert_eq!(out.len(), 18 + 8 + 2 + 124);
        assert_eq!(be64(&out, 18), 1 << 20);
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(opt(OPT_EXPORT_NAME, b"other"));
        assert!(run(input, Tls::Off).0.is_err());
    }

    #[test]
    fn lying_lengths_are_refused_or_end_the_connection() {
        assert_eq!(parse_info(&go_data(b"ab", &[1, 2])), Some(vec![1, 2]));
        let mut d = go_data(b"ab", &[1, 2]);
        d.push(0);
        assert_eq!(parse_info(&d), None);
        assert_eq!(parse_info(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);
        assert_eq!(parse_info(&[0, 0, 0, 0, 0, 5]), None);
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(opt(OPT_GO, &d));
        input.extend(opt(OPT_LIST, b"x"));
        input.extend(opt(77, &vec![0u8; MAX_OPTION as usize + 1]));
        let (r, out) = run(input, Tls::Off);
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(types, [REP_ERR_INVALID, REP_ERR_INVALID, REP_ERR_TOO_BIG]);
        // A length beyond what is ever skipped ends the connection at once.
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&77u32.to_be_bytes());
        input.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            run(input, Tls::Off).0.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        // Unknown client flags, a bad option magic.
        assert!(run(8u32.to_be_bytes().to_vec(), Tls::Off).0.is_err());
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend_from_slice(&[0u8; 16]);
        assert_eq!(
            run(input, Tls::Off).0.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
