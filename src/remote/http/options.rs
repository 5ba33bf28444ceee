//! What an [`HttpClient`](super::HttpClient) is configured with.

use std::time::Duration;

use crate::remote::tls::TlsOptions;

/// Retries of a request after a 5xx (or 408, 429), a dropped connection or a timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0: none).
    pub max_retries: u32,
    /// The wait before the first retry; doubled for each next one.
    pub first_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// No retry starts once this long has passed since the first attempt.
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            max_total: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first).
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u32 << retry.saturating_sub(1).min(16);
        self.first_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// Timeouts, retries, connections and TLS of a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpOptions {
    /// Connecting, TLS handshake included.
    pub connect_timeout: Duration,
    /// The longest wait for any byte from the server (or for it to take ours): a stalled
    /// server fails the attempt after this long.
    pub read_timeout: Duration,
    /// The longest one request may take from start to the last byte of its body.
    pub request_timeout: Duration,
    /// Retries after transient failures.
    pub retry: RetryPolicy,
    /// Requests in flight at once, and kept-alive connections per host.
    pub connections: usize,
    /// Trust and client identity.
    pub tls: TlsOptions,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(120),
            retry: RetryPolicy::default(),
            connections: 8,
            tls: TlsOptions::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(5), Duration::from_millis(1600));
        assert_eq!(p.backoff(6), Duration::from_secs(2));
        assert_eq!(p.backoff(400), Duration::from_secs(2));
    }
}
