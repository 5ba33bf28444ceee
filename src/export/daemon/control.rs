//! The control protocol between the command line and a device's server, over the owner-only
//! unix socket `$RUN_DIR/.dmkit/NAME.sock`: one request per connection, answered by zero or
//! more [`Reply::Progress`] frames (a long-running request, such as an online reencryption,
//! reports as it goes) and one final [`Reply::Done`] or [`Reply::Failed`].
//!
//! Every message is a frame: the magic `DMKC`, the protocol version (u16, big-endian), a kind
//! byte, the body length (u32, big-endian) and the body. A server refuses a frame of another
//! version with a [`Reply::Failed`] in the requester's version, naming both versions
//! ([`mismatch`]); a command reading a frame of another (older) version sends its request
//! again in that version when its body is the same there ([`same_since`]), and otherwise
//! says the same line. So the header and the `failed` reply's body must never change; any
//! other change of a body is a new version (2: `reencrypt` gained the exported header path).
//! Bodies:
//!
//! ```text
//! request  1 status          (empty)
//!          2 close           u8 mode: 0 now, 1 deferred, 2 cancel deferred
//!          3 resize          u8 given, u64 sectors
//!          4 suspend         (empty)
//!          5 resume          u8 given, u32 key slot, u32 length, passphrase
//!          6 refresh         u8 given, u32 key slot, u8 allow_discards, u32 length, passphrase
//!          7 reencrypt       u8 given, u32 key slot, u32 length, passphrase,
//!                            u8 given, u64 largest hotzone (bytes),
//!                            u32 length, exported header path (UTF-8; empty: none)
//! reply    1 progress        u64 done, u64 total
//!          2 done            u32 length, JSON text
//!          3 failed          u8 exit code, u8 kind (0 failed, 1 busy, 2 invalid, 3 not open),
//!                            u32 length, message (UTF-8)
//! ```
//!
//! Passphrases cross the socket only to a server of the same user (or root), checked with
//! `SO_PEERCRED` on both sides, and are wiped once used.

use crate::codec::{Reader, Writer};
use serde_json::Value;
use std::io::{self, Read, Write};
use zeroize::Zeroizing;

/// The frame magic.
pub const MAGIC: [u8; 4] = *b"DMKC";
/// The protocol version this build speaks.
pub const VERSION: u16 = 2;
/// Bytes before a frame's body: magic, version, kind, length.
pub const HEADER_LEN: usize = 11;
/// The largest body accepted (a key file of cryptsetup's 8 MiB maximum, and room).
pub const MAX_BODY: usize = 9 << 20;

/// A malformed frame or body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A field could not be read.
    #[error("control message: {0}")]
    Codec(#[from] crate::codec::Error),
    /// Not a frame of this protocol.
    #[error("control message: bad magic {0:02x?}")]
    Magic([u8; 4]),
    /// A frame of another protocol version (see [`mismatch`] for what a user is told).
    #[error("control message: protocol version {got} (this dmkit speaks {VERSION}): the server and the command are different dmkit versions")]
    Version {
        /// The version in the frame.
        got: u16,
    },
    /// A body larger than [`MAX_BODY`].
    #[error("control message: body of {0} bytes is too large")]
    TooLarge(u32),
    /// An unknown kind or field value.
    #[error("control message: {what}: unknown value {value}")]
    Unknown {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u32,
    },
    /// Bytes after the last field.
    #[error("control message: {0} bytes after the last field")]
    Trailing(usize),
    /// Text that is not UTF-8 or JSON.
    #[error("control message: {0}")]
    Text(String),
}

/// How `close` goes about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseHow {
    /// Close now, refused while in use.
    Now,
    /// Close when the last user goes.
    Deferred,
    /// Withdraw a deferred close.
    CancelDeferred,
}

/// A passphrase and the keyslot to try, for a resume or a refresh. Wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    /// Only this keyslot.
    pub key_slot: Option<u32>,
    /// The passphrase (or key file contents).
    pub passphrase: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret {{ key_slot: {:?}, passphrase: <{} bytes> }}",
            self.key_slot,
            self.passphrase.len()
        )
    }
}

/// A request to a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// What the server serves, and its counters.
    Status,
    /// Close the device.
    Close(CloseHow),
    /// Serve this many 512-byte sectors (`None`: up to the end of the backing device).
    Resize(Option<u64>),
    /// Wipe the volume key and hold I/O.
    Suspend,
    /// Unlock again and let I/O through.
    Resume(Secret),
    /// Unlock again and re-apply the activation flags.
    Refresh {
        /// The passphrase.
        secret: Secret,
        /// Pass discards down.
        allow_discards: bool,
        /// Store the flags in the header too (`--persistent`).
        persistent: bool,
    },
    /// Reencrypt in the background (the header is already in reencryption), answered by
    /// progress frames until done.
    Reencrypt {
        /// The passphrase that opens both keys.
        secret: Secret,
        /// Largest hotzone, bytes.
        max_hotzone: Option<u64>,
        /// The file the header of a device served with its header at its start was exported
        /// to (a decryption moving the data down, set up while the device was suspended).
        header: Option<std::path::PathBuf>,
    },
}

/// Why a request failed, for the exit code and the message's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    /// Anything else.
    Failed,
    /// The device is in use.
    Busy,
    /// The request is invalid for this device.
    Invalid,
    /// Nothing is open there.
    NotOpen,
}

/// A server's answer (one frame of it).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A long request's progress so far.
    Progress {
        /// Units done.
        done: u64,
        /// Units in all.
        total: u64,
    },
    /// The request succeeded; what it returns.
    Done(Value),
    /// The request failed.
    Failed {
        /// cryptsetup's exit code.
        code: u8,
        /// What kind of failure.
        kind: FailKind,
        /// One line saying why.
        message: String,
    },
}

/// The one line a user reads when the server of `name` speaks protocol `server` and the
/// command `command`: the server was started by another dmkit build.
pub fn mismatch(name: &str, server: u16, command: u16) -> String {
    format!(
        "dmkit server for {name} speaks control protocol {server}, this dmkit speaks {command}: close and reopen the device with this dmkit"
    )
}

/// The protocol version of a frame whose header (magic, version) is `err`'s reason for being
/// refused, when that is the only reason: another version.
pub fn other_version(err: &io::Error) -> Option<u16> {
    match err.get_ref()?.downcast_ref::<ProtocolError>()? {
        ProtocolError::Version { got } => Some(*got),
        _ => None,
    }
}

/// A server's answer to a request of protocol `version` (not this one) for the device
/// `name`: a `failed` reply in that version, whose layout every version shares, so that the
/// other command can read why.
pub fn refuse_version(name: &str, version: u16) -> Vec<u8> {
    let rep = Reply::Failed {
        code: 1,
        kind: FailKind::Invalid,
        message: mismatch(name, VERSION, version),
    };
    let mut f = rep.encode();
    f[4..6].copy_from_slice(&version.to_be_bytes());
    f
}

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut w = Writer::with_capacity(HEADER_LEN + body.len());
    w.bytes(&MAGIC)
        .u16_be(VERSION)
        .u8(kind)
        .u32_be(body.len() as u32)
        .bytes(body);
    w.into_inner()
}

/// Check a frame header; its kind and body length.
pub fn parse_header(h: &[u8]) -> Result<(u8, usize), ProtocolError> {
    let mut r = Reader::new(h);
    let magic: [u8; 4] = r.array("magic")?;
    if magic != MAGIC {
        return Err(ProtocolError::Magic(magic));
    }
    let version = r.u16_be("version")?;
    if version != VERSION {
        return Err(ProtocolError::Version { got: version });
    }
    let kind = r.u8("kind")?;
    let len = r.u32_be("length")?;
    if len as usize > MAX_BODY {
        return Err(ProtocolError::TooLarge(len));
    }
    Ok((kind, len as usize))
}

/// A whole frame: its kind and body (nothing may follow).
fn split(frame: &[u8]) -> Result<(u8, &[u8]), ProtocolError> {
    let mut r = Reader::new(frame);
    let (kind, len) = parse_header(r.take(HEADER_LEN, "header")?)?;
    let body = r.take(len, "body")?;
    if !r.is_empty() {
        return Err(ProtocolError::Trailing(r.left()));
    }
    Ok((kind, body))
}

fn optional_u64(r: &mut Reader<'_>, what: &'static str) -> Result<Option<u64>, ProtocolError> {
    let given = flag(r, what)?;
    let v = r.u64_be(what)?;
    Ok(given.then_some(v))
}

fn flag(r: &mut Reader<'_>, what: &'static str) -> Result<bool, ProtocolError> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(ProtocolError::Unknown {
            what,
            value: v.into(),
        }),
    }
}

fn blob<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<&'a [u8], ProtocolError> {
    let n = r.u32_be(what)? as usize;
    Ok(r.take(n, what)?)
}

fn read_secret(r: &mut Reader<'_>) -> Result<Secret, ProtocolError> {
    let given = flag(r, "key slot given")?;
    let slot = r.u32_be("key slot")?;
    let pass = blob(r, "passphrase")?;
    Ok(Secret {
        key_slot: given.then_some(slot),
        passphrase: Zeroizing::new(pass.to_vec()),
    })
}

fn write_secret(w: &mut Writer, s: &Secret) {
    w.u8(u8::from(s.key_slot.is_some()))
        .u32_be(s.key_slot.unwrap_or(0))
        .u32_be(s.passphrase.len() as u32)
        .bytes(&s.passphrase);
}

impl Request {
    /// The request as one frame. The buffer holds the passphrase, if any: wiped when dropped.
    pub fn encode(&self) -> Zeroizing<Vec<u8>> {
        let mut w = Writer::new();
        let kind = match self {
            Request::Status => 1,
            Request::Close(how) => {
                w.u8(match how {
                    CloseHow::Now => 0,
                    CloseHow::Deferred => 1,
                    CloseHow::CancelDeferred => 2,
                });
                2
            }
            Request::Resize(s) => {
                w.u8(u8::from(s.is_some())).u64_be(s.unwrap_or(0));
                3
            }
            Request::Suspend => 4,
            Request::Resume(s) => {
                write_secret(&mut w, s);
                5
            }
            Request::Refresh {
                secret,
                allow_discards,
                persistent,
            } => {
                w.u8(u8::from(secret.key_slot.is_some()))
                    .u32_be(secret.key_slot.unwrap_or(0))
                    .u8(u8::from(*allow_discards))
                    .u8(u8::from(*persistent))
                    .u32_be(secret.passphrase.len() as u32)
                    .bytes(&secret.passphrase);
                6
            }
            Request::Reencrypt {
                secret,
                max_hotzone,
                header,
            } => {
                write_secret(&mut w, secret);
                let path = header
                    .as_deref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                w.u8(u8::from(max_hotzone.is_some()))
                    .u64_be(max_hotzone.unwrap_or(0))
                    .u32_be(path.len() as u32)
                    .bytes(path.as_bytes());
                7
            }
        };
        let body = Zeroizing::new(w.into_inner());
        Zeroizing::new(frame(kind, &body))
    }

    /// Parse one whole request frame.
    pub fn decode(frame: &[u8]) -> Result<Request, ProtocolError> {
        let (kind, body) = split(frame)?;
        let mut r = Reader::new(body);
        let req = match kind {
            1 => Request::Status,
            2 => Request::Close(match r.u8("close mode")? {
                0 => CloseHow::Now,
                1 => CloseHow::Deferred,
                2 => CloseHow::CancelDeferred,
                v => {
                    return Err(ProtocolError::Unknown {
                        what: "close mode",
                        value: v.into(),
                    })
                }
            }),
            3 => Request::Resize(optional_u64(&mut r, "sectors")?),
            4 => Request::Suspend,
            5 => Request::Resume(read_secret(&mut r)?),
            6 => {
                let given = flag(&mut r, "key slot given")?;
                let slot = r.u32_be("key slot")?;
                let allow_discards = flag(&mut r, "allow_discards")?;
                let persistent = flag(&mut r, "persistent")?;
                let pass = blob(&mut r, "passphrase")?;
                Request::Refresh {
                    secret: Secret {
                        key_slot: given.then_some(slot),
                        passphrase: Zeroizing::new(pass.to_vec()),
                    },
                    allow_discards,
                    persistent,
                }
            }
            7 => Request::Reencrypt {
                secret: read_secret(&mut r)?,
                max_hotzone: optional_u64(&mut r, "hotzone")?,
                header: {
                    let p = blob(&mut r, "header path")?;
                    let p = std::str::from_utf8(p).map_err(|_| ProtocolError::Unknown {
                        what: "header path",
                        value: 0,
                    })?;
                    (!p.is_empty()).then(|| std::path::PathBuf::from(p))
                },
            },
            v => {
                return Err(ProtocolError::Unknown {
                    what: "request",
                    value: v.into(),
                })
            }
        };
        if !r.is_empty() {
            return Err(ProtocolError::Trailing(r.left()));
        }
        Ok(req)
    }

    /// Whether the request carries a passphrase.
    pub fn has_secret(&self) -> bool {
        matches!(
            self,
            Request::Resume(_) | Request::Refresh { .. } | Request::Reencrypt { .. }
        )
    }
}

impl Reply {
    /// The reply as one frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        let kind = match self {
            Reply::Progress { done, total } => {
                w.u64_be(*done).u64_be(*total);
                1
            }
            Reply::Done(v) => {
                let t = v.to_string();
                w.u32_be(t.len() as u32).bytes(t.as_bytes());
                2
            }
            Reply::Failed {
                code,
                kind,
                message,
            } => {
                w.u8(*code)
                    .u8(match kind {
                        FailKind::Failed => 0,
                        FailKind::Busy => 1,
                        FailKind::Invalid => 2,
                        FailKind::NotOpen => 3,
                    })
                    .u32_be(message.len() as u32)
                    .bytes(message.as_bytes());
                3
            }
        };
        frame(kind, &w.into_inner())
    }

    /// Parse one whole reply frame.
    pub fn decode(frame: &[u8]) -> Result<Reply, ProtocolError> {
        let (kind, body) = split(frame)?;
        let mut r = Reader::new(body);
        let text = |b: &[u8]| {
            std::str::from_utf8(b)
                .map(str::to_string)
                .map_err(|e| ProtocolError::Text(e.to_string()))
        };
        let reply = match kind {
            1 => Reply::Progress {
                done: r.u64_be("done")?,
                total: r.u64_be("total")?,
            },
            2 => {
                let t = text(blob(&mut r, "answer")?)?;
                Reply::Done(
                    serde_json::from_str(&t).map_err(|e| ProtocolError::Text(e.to_string()))?,
                )
            }
            3 => {
                let code = r.u8("exit code")?;
                let kind = match r.u8("failure kind")? {
                    0 => FailKind::Failed,
                    1 => FailKind::Busy,
                    2 => FailKind::Invalid,
                    3 => FailKind::NotOpen,
                    v => {
                        return Err(ProtocolError::Unknown {
                            what: "failure kind",
                            value: v.into(),
                        })
                    }
                };
                let message = text(blob(&mut r, "message")?)?;
                Reply::Failed {
                    code,
                    kind,
                    message,
                }
            }
            v => {
                return Err(ProtocolError::Unknown {
                    what: "reply",
                    value: v.into(),
                })
            }
        };
        if !r.is_empty() {
            return Err(ProtocolError::Trailing(r.left()));
        }
        Ok(reply)
    }
}

/// Read one frame from `s` (its header checked before the body is read). The buffer is wiped
/// when dropped: a request may hold a passphrase.
pub fn read_frame(s: &mut impl Read) -> io::Result<Zeroizing<Vec<u8>>> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h)?;
    let (_, len) = parse_header(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut buf = Zeroizing::new(vec![0u8; HEADER_LEN + len]);
    buf[..HEADER_LEN].copy_from_slice(&h);
    s.read_exact(&mut buf[HEADER_LEN..])?;
    Ok(buf)
}

/// The oldest version whose body of `req` is this version's: a request may be sent in any
/// version from it on (to a server of an older dmkit), only `reencrypt` changed in 2.
pub fn same_since(req: &Request) -> u16 {
    match req {
        Request::Reencrypt { .. } => 2,
        _ => 1,
    }
}

/// `frame` (of this version) as a frame of protocol `version`, whose body is the same (see
/// [`same_since`]).
pub fn in_version(frame: &[u8], version: u16) -> Zeroizing<Vec<u8>> {
    let mut f = Zeroizing::new(frame.to_vec());
    f[4..6].copy_from_slice(&version.to_be_bytes());
    f
}

/// [`read_frame`] of a frame of protocol `version` (an older server's, whose replies have
/// this version's bodies), returned as a frame of this version.
pub fn read_frame_in(s: &mut impl Read, version: u16) -> io::Result<Zeroizing<Vec<u8>>> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h)?;
    let got = u16::from_be_bytes([h[4], h[5]]);
    if &h[..4] == MAGIC.as_slice() && got == version {
        h[4..6].copy_from_slice(&VERSION.to_be_bytes());
    }
    let (_, len) = parse_header(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut buf = Zeroizing::new(vec![0u8; HEADER_LEN + len]);
    buf[..HEADER_LEN].copy_from_slice(&h);
    s.read_exact(&mut buf[HEADER_LEN..])?;
    Ok(buf)
}

/// Write one frame to `s`.
pub fn write_frame(s: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    s.write_all(frame)?;
    s.flush()
}

/// The uid of the process at the other end of a unix socket (`SO_PEERCRED`).
pub fn peer_uid(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data, filled by getsockopt(2) with its exact size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writing at most `len` bytes into `cred`, which outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Whether a peer of uid `peer` may talk to us: the same user, or root.
pub fn peer_allowed(peer: u32) -> bool {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    peer == me || peer == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status answer holding a float survives encode and decode (the fuzz target's crash
    /// `DMKC 0 1 2 ... "6E88 "`, here in version 2: without serde_json's `float_roundtrip`, parsing rounds
    /// `6E88` one way and the shortest text of that float back another).
    #[test]
    fn float_answers_round_trip() {
        let f = b"DMKC\x00\x02\x02\x00\x00\x00\x09\x00\x00\x00\x056E88 ";
        let rep = Reply::decode(f).unwrap();
        assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
        for text in [
            "1.7976931348623157e308",
            "5e-324",
            "0.1",
            "2.5e-10",
            "123456789.123456789",
        ] {
            let rep = Reply::Done(serde_json::from_str(text).unwrap());
            assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep, "{text}");
        }
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let secret = Secret {
            key_slot: Some(3),
            passphrase: Zeroizing::new(b"pass\0word".to_vec()),
        };
        for req in [
            Request::Status,
            Request::Close(CloseHow::Deferred),
            Request::Resize(None),
            Request::Resize(Some(2048)),
            Request::Suspend,
            Request::Resume(secret.clone()),
            Request::Refresh {
                secret: secret.clone(),
                allow_discards: true,
                persistent: true,
            },
            Request::Reencrypt {
                secret: secret.clone(),
                max_hotzone: Some(1 << 20),
                header: None,
            },
            Request::Reencrypt {
                secret,
                max_hotzone: None,
                header: Some("/tmp/exported header".into()),
            },
        ] {
            assert_eq!(Request::decode(&req.encode()).unwrap(), req);
        }
        for rep in [
            Reply::Progress { done: 5, total: 9 },
            Reply::Done(serde_json::json!({"ok": true})),
            Reply::Failed {
                code: 2,
                kind: FailKind::Invalid,
                message: "No key available with this passphrase.".into(),
            },
        ] {
            assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
        }
    }

    /// A frame header of protocol `version`, as another build sends it.
    fn header_of(version: u16) -> Vec<u8> {
        let mut f = Request::Status.encode().to_vec();
        f[4..6].copy_from_slice(&version.to_be_bytes());
        f
    }

    #[test]
    fn another_version_is_one_clear_line_both_ways() {
        let want_old = "dmkit server for vol speaks control protocol 1, this dmkit speaks 2: close and reopen the device with this dmkit";
        // A server of version 1 answers in its version: this command reads the frame's
        // version, not a decode error of its body.
        let e = read_frame(&mut &header_of(1)[..]).unwrap_err();
        assert_eq!(other_version(&e), Some(1));
        assert_eq!(mismatch("vol", 1, VERSION), want_old);
        // A request of version 7 is answered in version 7, the reply readable with version
        // 7's header and the shared `failed` body.
        let e = read_frame(&mut &header_of(7)[..]).unwrap_err();
        let v = other_version(&e).unwrap();
        let mut f = refuse_version("vol", v);
        assert_eq!(&f[4..6], &7u16.to_be_bytes());
        f[4..6].copy_from_slice(&VERSION.to_be_bytes());
        match Reply::decode(&f).unwrap() {
            Reply::Failed { code, message, .. } => {
                assert_eq!(code, 1);
                assert_eq!(
                    message,
                    "dmkit server for vol speaks control protocol 2, this dmkit speaks 7: close and reopen the device with this dmkit"
                );
                assert_eq!(message.lines().count(), 1);
            }
            r => panic!("{r:?}"),
        }
        // Other refusals are not taken for a version.
        let mut bad = header_of(VERSION);
        bad[0] = b'X';
        assert_eq!(other_version(&read_frame(&mut &bad[..]).unwrap_err()), None);
        let io = io::Error::other("reset");
        assert_eq!(other_version(&io), None);
    }

    /// A `close` goes to a server of version 1 in its version, and its answer is read.
    #[test]
    fn requests_of_an_unchanged_body_go_in_an_older_version() {
        let close = Request::Close(CloseHow::Now);
        assert_eq!(same_since(&close), 1);
        let reenc = Request::Reencrypt {
            secret: Secret {
                key_slot: None,
                passphrase: Zeroizing::new(b"p".to_vec()),
            },
            max_hotzone: None,
            header: None,
        };
        assert_eq!(same_since(&reenc), 2);
        let f = in_version(&close.encode(), 1);
        assert_eq!(&f[4..6], &1u16.to_be_bytes());
        let answer = in_version(&Reply::Done(serde_json::json!({"ok": true})).encode(), 1);
        let back = read_frame_in(&mut &answer[..], 1).unwrap();
        assert_eq!(
            Reply::decode(&back).unwrap(),
            Reply::Done(serde_json::json!({"ok": true}))
        );
        // A frame of yet another version is still refused by its version.
        let other = in_version(&Reply::Done(serde_json::json!(1)).encode(), 3);
        let e = read_frame_in(&mut &other[..], 1).unwrap_err();
        assert_eq!(other_version(&e), Some(3));
    }

    /// Version 1's `reencrypt` body (without the header path) is refused by its version,
    /// never decoded as this version's body.
    #[test]
    fn a_version_1_reencrypt_is_refused_by_its_version() {
        let mut w = Writer::new();
        w.u8(0).u32_be(0).u32_be(4).bytes(b"pass").u8(0).u64_be(0);
        let body = w.into_inner();
        let mut f = frame(7, &body);
        f[4..6].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(Request::decode(&f), Err(ProtocolError::Version { got: 1 }));
    }

    #[test]
    fn bad_frames_are_refused() {
        let mut f = Request::Status.encode().to_vec();
        f[5] = 9;
        assert!(matches!(
            Request::decode(&f),
            Err(ProtocolError::Version { got: 9 })
        ));
        let mut f = Request::Resize(Some(1)).encode().to_vec();
        f.push(0);
        assert!(Request::decode(&f).is_err());
        let f = Request::Resize(Some(1)).encode();
        assert!(Request::decode(&f[..f.len() - 1]).is_err());
        let mut big = frame(1, &[]);
        big[7..11].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Request::decode(&big),
            Err(ProtocolError::TooLarge(_))
        ));
    }
}
