//! Remote objects (issue 28): a read-only image whose data, hash tree, FEC or signature lives in
//! object storage (`https://`, `http://`, `s3://`) and is read lazily, block by block.
//!
//! The transport is below [`RangeSource`]: it fetches byte ranges of one object whose identity
//! (length, ETag or version) was pinned when it was opened, so a changed object fails closed.
//! Nothing at this level is trusted: every block is checked by the layer above (the verity tree)
//! before it is used or cached.

pub mod cache;
pub mod credentials;
pub mod device;
pub mod direct;
pub mod http;
pub mod location;
pub mod objects;
pub mod prefetch;
pub mod s3;
pub mod source;
pub mod target;
pub mod tls;
pub mod verity;

pub use source::{LocalRange, ObjectIdentity, RangeSource, RemoteError, RemoteStats};
pub use target::{FixedUrl, Method, PreparedRequest, RequestTarget};

pub use http::{HttpClient, HttpObject, HttpOptions, RetryPolicy};
pub use location::{Location, LocationError};
pub use tls::TlsOptions;
