//! Arbitrary bytes as a FUSE request the kernel wrote (in-header, arguments, payload): the
//! one decoder either refuses a short in-header or yields a typed request, never panics; a
//! WRITE's data is exactly the payload its arguments announce, and a LOOKUP's name holds no
//! NUL.

#![no_main]

use dmkit::export::fuse::request::{InHeader, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((h, req)) = Request::decode_message(data) else {
        assert!(data.len() < 40, "a whole in-header was refused");
        return;
    };
    assert_eq!(InHeader::decode(data).ok(), Some(h));
    match req {
        Request::Write { data: payload, .. } => {
            assert_eq!(payload.len(), data.len() - 80, "WRITE data is the payload");
        }
        Request::Lookup { name } => assert!(!name.contains(&0)),
        Request::Read { .. }
        | Request::Setattr { .. }
        | Request::Init(_)
        | Request::Readdir { .. }
        | Request::Fallocate { .. }
        | Request::Lseek { .. } => assert!(data.len() >= 40 + 16),
        _ => {}
    }
    // Splitting the same bytes as the transports do gives the same request.
    let args = &data[40..];
    // (16 is FUSE_WRITE, whose arguments and payload the transports split themselves.)
    if h.opcode != 16 {
        assert_eq!(Request::decode(h.opcode, args, &[]), req);
    }
});
