//! Opening the objects of one stack (data, hash tree, signature) from the locations given on
//! the command line, through one HTTP client so they share its kept-alive connections. A local
//! path among them is read as a [`LocalRange`], so a stack may mix a local hash file with
//! remote data.

use super::{HttpClient, HttpOptions, LocalRange, Location, RangeSource, RemoteError};
use std::sync::Arc;

/// The most bytes [`Objects::read_all`] reads (a signature or certificate, not an image).
pub const MAX_SMALL_OBJECT: u64 = 1 << 20;

/// Opens objects, with one HTTP client made at the first remote one.
pub struct Objects {
    options: HttpOptions,
    client: Option<HttpClient>,
}

impl Objects {
    /// Objects fetched with `options`.
    pub fn new(options: HttpOptions) -> Self {
        Objects {
            options,
            client: None,
        }
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
            Location::S3 { .. } => Err(RemoteError::Protocol {
                url: loc.display_name(),
                what: "s3:// objects need the S3 request signer, which this build does not have"
                    .into(),
            }),
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
