//! The server's protocol code run on a client's bytes held in memory, without sockets or
//! threads: what the fuzz targets and the unit tests drive. Whatever the bytes, each call
//! ends (the input runs out) and returns what the server sent.

use super::export::ExportInfo;
use super::handshake::{Handshake, Outcome, Tls};
use super::transmit::{CounterValues, Counters, Ending, Transmission};
use super::wire::{MemoryStream, Wire};
use crate::block::BlockDevice;
use crate::export::bytes::ByteDevice;
use std::io;
use std::sync::Arc;

/// The greeting and option negotiation with a client that sends `input` then hangs up: how
/// it ended, and every byte the server sent.
pub fn handshake(export: &ExportInfo, input: &[u8], tls: Tls) -> (io::Result<Outcome>, Vec<u8>) {
    let mut w = Wire::new(MemoryStream::new(input.to_vec()));
    let r = Handshake::greet(export, &mut w).and_then(|mut h| h.options(&mut w, tls));
    let _ = w.flush();
    let out = std::mem::take(w_output(&mut w));
    (r, out)
}

/// The transmission phase on `device` (as `export` describes it) with a client that sends
/// `input` then hangs up: how it ended, every byte the server sent, and the counters.
pub fn transmission(
    device: Arc<dyn BlockDevice>,
    export: &ExportInfo,
    input: &[u8],
    structured: bool,
) -> (io::Result<Ending>, Vec<u8>, CounterValues) {
    let bytes = ByteDevice::new(device);
    let (client, totals) = (Counters::default(), Counters::default());
    let mut w = Wire::new(MemoryStream::new(input.to_vec()));
    let r = Transmission::new(export, &bytes, structured, &client, &totals).run(&mut w);
    let _ = w.flush();
    (r, std::mem::take(w_output(&mut w)), client.values())
}

fn w_output(w: &mut Wire<MemoryStream>) -> &mut Vec<u8> {
    &mut w.stream_mut().output
}
