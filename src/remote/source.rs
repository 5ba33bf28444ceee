//! The contract between a transport (HTTP, S3) and the layers that read through it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What was pinned when the object was opened: every later range must come from this object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectIdentity {
    /// Length of the object in bytes.
    pub len: u64,
    /// The ETag the server gave at open (sent as `If-Match` on every range), if any.
    pub etag: Option<String>,
    /// The object's version (S3 `x-amz-version-id`), if the store versions objects.
    pub version: Option<String>,
}

/// Counters a transport keeps for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Range requests sent (retries included).
    pub requests: u64,
    /// Body bytes received.
    pub bytes_fetched: u64,
    /// Requests sent again after a 5xx, a dropped connection or a timeout.
    pub retries: u64,
}

/// Why a remote read failed. Each names the object (its URL without credentials or query).
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The server answered against the protocol (a 200 to a range request, a short body, a 416).
    #[error("{url}: {what}")]
    Protocol {
        /// The object.
        url: String,
        /// What was wrong, in one line.
        what: String,
    },
    /// The object is no longer the one pinned at open.
    #[error("{url}: the object changed since it was opened ({what})")]
    Changed {
        /// The object.
        url: String,
        /// What changed (ETag, version or length).
        what: String,
    },
    /// The server refused the credentials or the signature.
    #[error("{url}: access denied: {what}")]
    Denied {
        /// The object.
        url: String,
        /// The server's reason, in one line.
        what: String,
    },
    /// The server answered with an error status after the retries.
    #[error("{url}: HTTP {status} {what}")]
    Status {
        /// The object.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The reason phrase or S3 error code.
        what: String,
    },
    /// Connecting or reading failed, after the retries (timeouts included).
    #[error("{url}: {source}")]
    Io {
        /// The object.
        url: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A read past the end of the object.
    #[error("{url}: range at byte {offset} of {len} bytes is beyond the object's {size} bytes")]
    OutOfRange {
        /// The object.
        url: String,
        /// Offset of the read.
        offset: u64,
        /// Length of the read.
        len: u64,
        /// Length pinned at open.
        size: u64,
    },
}

impl RemoteError {
    /// [`RemoteError::OutOfRange`] unless `len` bytes at `offset` lie within an object of
    /// `size` bytes (named `url`): the check every [`RangeSource::read_range`] starts with.
    pub fn check_within(url: &str, offset: u64, len: usize, size: u64) -> Result<(), RemoteError> {
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(RemoteError::OutOfRange {
                url: url.to_string(),
                offset,
                len: len as u64,
                size,
            });
        }
        Ok(())
    }
}

/// A read-only object read by byte ranges. Implemented by the transports (HTTP, S3) and by
/// [`LocalRange`], a file standing in for one in tests.
pub trait RangeSource: Send + Sync {
    /// The object's name for messages: its URL without credentials or query.
    fn name(&self) -> &str;
    /// What was pinned at open.
    fn identity(&self) -> &ObjectIdentity;
    /// Reads exactly `buf.len()` bytes at `offset` (within the pinned length).
    fn read_range(&self, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError>;
    /// The transport's counters so far.
    fn stats(&self) -> RemoteStats;
}

/// A local file as a [`RangeSource`]: for tests of the layers above the transport.
#[derive(Debug)]
pub struct LocalRange {
    name: String,
    file: File,
    identity: ObjectIdentity,
    stats: std::sync::Mutex<RemoteStats>,
}

impl LocalRange {
    /// Opens `path` read-only and pins its length.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Self {
            name: path.display().to_string(),
            file,
            identity: ObjectIdentity {
                len,
                ..ObjectIdentity::default()
            },
            stats: std::sync::Mutex::default(),
        })
    }
}

impl RangeSource for LocalRange {
    fn name(&self) -> &str {
        &self.name
    }

    fn identity(&self) -> &ObjectIdentity {
        &self.identity
    }

    fn read_range(&self, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        RemoteError::check_within(&self.name, offset, buf.len(), self.identity.len)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| RemoteError::Io {
                url: self.name.clone(),
                source,
            })?;
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.requests += 1;
        stats.bytes_fetched += buf.len() as u64;
        Ok(())
    }

    fn stats(&self) -> RemoteStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_range_reads_and_refuses_past_the_end() {
        let dir = std::env::temp_dir().join(format!("dmkit-localrange-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789").unwrap();
        let src = LocalRange::open(&dir).unwrap();
        let mut buf = [0u8; 4];
        src.read_range(3, &mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        assert!(matches!(
            src.read_range(8, &mut buf),
            Err(RemoteError::OutOfRange { size: 10, .. })
        ));
        assert_eq!(src.stats().requests, 1);
        std::fs::remove_file(&dir).unwrap();
    }
}
