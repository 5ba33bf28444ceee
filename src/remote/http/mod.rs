//! The HTTP(S) transport: an object read by `Range` requests over kept-alive connections.
//!
//! One [`HttpClient`] (a ureq agent: a pool of kept-alive connections with `TCP_NODELAY`, TLS
//! through OpenSSL, timeouts) serves every object of a stack (data, hash tree, FEC,
//! signature); [`HttpObject`] is one object whose length and ETag were pinned at open. Each
//! range is one `GET` with `Range: bytes=a-b` and `If-Match` with the pinned ETag: a changed
//! object fails closed ([`RemoteError::Changed`](super::RemoteError::Changed)); a server that
//! answers against the protocol (a 200 to a range request, a short body, a Content-Range not
//! asked for) is refused, never taken as data. 5xx answers, dropped connections and timeouts
//! are retried with exponential backoff, bounded in count and time.
//!
//! The transport does not verify the bytes: the layer above checks every block against the
//! verity tree.

mod client;
mod fetch;
mod gate;
mod object;
mod options;
mod reply;
mod retry;

pub use client::HttpClient;
pub use object::HttpObject;
pub use options::{HttpOptions, RetryPolicy};
