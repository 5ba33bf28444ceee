//! The client every object of a stack shares: one agent (its pool of kept-alive connections,
//! TLS setup and timeouts) and one gate on the requests in flight.

use std::fmt;
use std::sync::Arc;

use ureq::Agent;

use super::gate::Gate;
use super::object::HttpObject;
use super::options::HttpOptions;
use crate::remote::tls::{tls_config, TlsFileError};
use crate::remote::{FixedUrl, RemoteError, RequestTarget};

/// An HTTP(S) client: cheap to clone (clones share the pool).
#[derive(Clone)]
pub struct HttpClient {
    inner: Arc<Inner>,
}

struct Inner {
    agent: Agent,
    options: HttpOptions,
    gate: Gate,
}

impl HttpClient {
    /// A client for `options`; fails on a TLS file (CA, client certificate or key) that cannot
    /// be read or used, naming it.
    pub fn new(options: &HttpOptions) -> Result<Self, TlsFileError> {
        let per_host = options.connections.max(1);
        let config = Agent::config_builder()
            // Every status is an answer to look at (a 206, a 412, an S3 error's XML).
            .http_status_as_error(false)
            // Each range is a small request answered at once: Nagle's delay would add a
            // round trip to many of them. (ureq's default too; set so it stays.)
            .no_delay(true)
            .tls_config(tls_config(&options.tls)?)
            .timeout_connect(Some(options.connect_timeout))
            .timeout_per_read(Some(options.read_timeout))
            .timeout_per_write(Some(options.read_timeout))
            .timeout_global(Some(options.request_timeout))
            .max_idle_connections(per_host * 4)
            .max_idle_connections_per_host(per_host)
            .max_redirects(5)
            .user_agent(concat!("dmkit/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Self {
            inner: Arc::new(Inner {
                agent: Agent::new_with_config(config),
                options: options.clone(),
                gate: Gate::new(per_host),
            }),
        })
    }

    /// Opens the object `target` names: pins its length and ETag (a `HEAD`, or a one-byte
    /// ranged `GET` when `HEAD` is refused, as by a presigned URL signed for `GET`).
    pub fn open(&self, target: Box<dyn RequestTarget>) -> Result<HttpObject, RemoteError> {
        HttpObject::open_with(self.clone(), target)
    }

    /// Opens a plain `http://` or `https://` URL (a presigned one too).
    pub fn open_url(&self, url: &str) -> Result<HttpObject, RemoteError> {
        self.open(Box::new(FixedUrl::new(url)))
    }

    /// The options the client was made with.
    pub fn options(&self) -> &HttpOptions {
        &self.inner.options
    }

    pub(super) fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    pub(super) fn gate(&self) -> &Gate {
        &self.inner.gate
    }
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}
