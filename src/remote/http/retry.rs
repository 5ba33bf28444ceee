//! Retrying a request after a transient failure, with exponential backoff bounded in count and
//! total time.

use std::io;
use std::time::{Duration, Instant};

use super::options::RetryPolicy;
use crate::remote::RemoteError;

/// How one attempt failed.
pub(super) enum Attempt {
    /// Transient (5xx, 408, 429, a dropped connection, a timeout): worth another attempt, after
    /// at least the server's `Retry-After` when it gave one.
    Retry(RemoteError, Option<Duration>),
    /// Final: retrying cannot help (or must not: a changed object, a protocol violation).
    Fail(RemoteError),
}

/// Runs `attempt` until it succeeds, fails finally, or the policy's retries or time are spent;
/// `on_retry` is called before each retry (the counters). The error of the last attempt is
/// returned, saying how many retries were made.
pub(super) fn with_retries<T>(
    policy: &RetryPolicy,
    on_retry: impl Fn(),
    mut attempt: impl FnMut() -> Result<T, Attempt>,
) -> Result<T, RemoteError> {
    let start = Instant::now();
    let mut retries = 0u32;
    loop {
        let (error, hint) = match attempt() {
            Ok(v) => return Ok(v),
            Err(Attempt::Fail(e)) => return Err(after_retries(e, retries)),
            Err(Attempt::Retry(e, hint)) => (e, hint),
        };
        let wait = policy
            .backoff(retries + 1)
            .max(hint.unwrap_or_default().min(policy.max_backoff));
        if retries >= policy.max_retries || start.elapsed() + wait > policy.max_total {
            return Err(after_retries(error, retries));
        }
        std::thread::sleep(wait);
        retries += 1;
        on_retry();
    }
}

/// `e`, saying it came after `retries` retries (when there were any).
fn after_retries(e: RemoteError, retries: u32) -> RemoteError {
    if retries == 0 {
        return e;
    }
    let note = format!(
        " (after {retries} {})",
        if retries == 1 { "retry" } else { "retries" }
    );
    match e {
        RemoteError::Io { url, source } => RemoteError::Io {
            url,
            source: io::Error::new(source.kind(), format!("{source}{note}")),
        },
        RemoteError::Status { url, status, what } => RemoteError::Status {
            url,
            status,
            what: what + &note,
        },
        RemoteError::Protocol { url, what } => RemoteError::Protocol {
            url,
            what: what + &note,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            max_total: Duration::from_secs(5),
        }
    }

    fn transient() -> Attempt {
        Attempt::Retry(
            RemoteError::Status {
                url: "u".into(),
                status: 503,
                what: "Service Unavailable".into(),
            },
            None,
        )
    }

    #[test]
    fn retries_then_succeeds_or_gives_up_saying_so() {
        let calls = Cell::new(0);
        let retried = Cell::new(0);
        let r = with_retries(
            &policy(),
            || retried.set(retried.get() + 1),
            || {
                calls.set(calls.get() + 1);
                if calls.get() < 3 {
                    Err(transient())
                } else {
                    Ok(7)
                }
            },
        );
        assert_eq!(r.unwrap(), 7);
        assert_eq!(retried.get(), 2);
        let e = with_retries(&policy(), || (), || Err::<(), _>(transient())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "u: HTTP 503 Service Unavailable (after 3 retries)"
        );
    }

    #[test]
    fn a_final_failure_is_not_retried() {
        let calls = Cell::new(0);
        let e = with_retries(
            &policy(),
            || (),
            || {
                calls.set(calls.get() + 1);
                Err::<(), _>(Attempt::Fail(RemoteError::Changed {
                    url: "u".into(),
                    what: "ETag".into(),
                }))
            },
        );
        assert!(matches!(e, Err(RemoteError::Changed { .. })));
        assert_eq!(calls.get(), 1);
    }
}
