//! Opening the objects of one stack (data, hash tree, signature) from the locations given on
//! the command line, through one HTTP client so they share its kept-alive connections. A local
//! path among them is read as a [`LocalRange`], so a stack may mix a local hash file with
//! remote data.

use super::s3::{S3Error, S3Options, S3Target};
use super::{HttpClient, HttpOptions, LocalRange, Location, RangeSource, RemoteError};
use std::sync::Arc;

/// The most bytes [`Objects::read_all`] reads (a signature or certificate, not an image).
pub const MAX_SMALL_OBJECT: u64 = 1 << 20;

/// Opens objects, with one HTTP client made at the first remote one.
pub struct Objects {
    options: HttpOptions,
    client: Option<HttpClient>,
    s3: S3Options,
}

impl Objects {
    /// Objects fetched with `options`.
    pub fn new(options: HttpOptions) -> Self {
        Objects {
            options,
            client: None,
            s3: S3Options::default(),
        }
    }

    /// Where `s3://` objects are (`--s3-endpoint`, `--s3-region`); their credentials come from
    /// the environment or files ([`crate::remote::credentials`]).
    pub fn with_s3(mut self, s3: S3Options) -> Self {
        self.s3 = s3;
        self
    }

    fn client(&mut self) -> Result<&HttpClient, RemoteError> {
        if self.client.is_none() {
            let c = HttpClient::new(&self.options).map_err(|e| RemoteError::Io {
                url: e.path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.what),
            })?;
            self.client = Some(c);
        }
        Ok(self.client.as_ref().expect("just made"))
    }

    /// Open the object at `loc` (its length and ETag pinned now).
    pub fn open(&mut self, loc: &Location) -> Result<Arc<dyn RangeSource>, RemoteError> {
        match loc {
            Location::Local(path) => LocalRange::open(path)
                .map(|r| Arc::new(r) as Arc<dyn RangeSource>)
                .map_err(|source| RemoteError::Io {
                    url: path.display().to_string(),
                    source,
                }),
            Location::Http(url) => Ok(Arc::new(self.client()?.open_url(url)?)),
            Location::S3 { bucket, key } => {
                // Signed afresh for every request: the target keeps the credentials.
                let url = loc.display_name();
                let target = S3Target::from_env(bucket, key, &self.s3).map_err(|e| match e {
                    S3Error::Credentials { source, .. } => RemoteError::Denied {
                        url,
                        what: source.to_string(),
                    },
                    S3Error::Invalid { what, .. } => RemoteError::Protocol { url, what },
                })?;
                Ok(Arc::new(self.client()?.open(Box::new(target))?))
            }
        }
    }

    /// Read the whole (small) object at `loc`: a signature.
    pub fn read_all(&mut self, loc: &Location) -> Result<Vec<u8>, RemoteError> {
        let obj = self.open(loc)?;
        let len = obj.identity().len;
        if len > MAX_SMALL_OBJECT {
            return Err(RemoteError::Protocol {
                url: obj.name().to_string(),
                what: format!("{len} bytes is too large for a signature"),
            });
        }
        let mut bytes = vec![0u8; len as usize];
        obj.read_range(0, &mut bytes)?;
        Ok(bytes)
    }
}
