//! Arbitrary bytes as a control frame to a device's server (a request) and to the command line
//! (a reply): parsed or refused without a panic, and whatever parses encodes back to the same
//! bytes' meaning (decode . encode is the identity on what decode accepts).

#![no_main]

use dmkit::export::daemon::control::{Reply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(Request::decode(&req.encode()).unwrap(), req);
    }
    if let Ok(rep) = Reply::decode(data) {
        assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
    }
});
