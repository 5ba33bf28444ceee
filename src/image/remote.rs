//! Images whose files are remote objects (`https://`, `http://`, `s3://`, issue 28): the
//! image commands read the partition table and sidecar files through the same transport as
//! `verity open URL`, then serve the root partition through the remote verity layer (hash tree
//! pinned at open, every data block verified before it is used or cached, the cache keyed by
//! the root hash).
//!
//! Nothing the server sends is trusted: the layout read here (GPT, sidecar files, the root hash
//! and its signature) only says where to look. The root hash is checked against the signature
//! (with `--cert`) and the tree against the root hash exactly as for a local image
//! ([`crate::image::read::verified`]); a table that lies only points the verity layer at bytes
//! that then fail verification.

use super::layout::{Files, Region};
use super::{ImageError, Result};
use crate::block::{Activated, BlockDevice};
use crate::remote::cache::CacheOptions;
use crate::remote::device::RemoteOptions;
use crate::remote::direct::DirectDevice;
use crate::remote::objects::Objects;
use crate::remote::s3::S3Options;
use crate::remote::verity::RemoteVerity;
use crate::remote::RemoteStats;
use crate::remote::{HttpOptions, Location, ObjectIdentity, RangeSource, RemoteError};
use crate::verity::volume::{ParamsSource, VolumeError};
use crate::verity::{VerityOptions, VerityParams};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How a remote image's objects are fetched and cached.
#[derive(Debug, Clone, Default)]
pub struct RemoteImageOptions {
    /// The transport (timeouts, retries, TLS).
    pub http: HttpOptions,
    /// Where `s3://` objects are.
    pub s3: S3Options,
    /// Fetchers and read-ahead.
    pub device: RemoteOptions,
    /// The persistent cache of verified blocks; `None`: memory only.
    pub cache: Option<CacheOptions>,
    /// Record and prefetch the blocks read first (needs the cache).
    pub prefetch: bool,
}

/// `image` as a remote location, or `None` for a local path. A URL with a query or a
/// `user:password@` is refused: the sidecar files' URLs are derived from the image's, which a
/// presigned query would not sign, and messages name the image.
pub fn location(image: &Path) -> Result<Option<Location>> {
    let Some(s) = image.to_str() else {
        return Ok(None);
    };
    let loc = Location::parse(s).map_err(|e| ImageError::Invalid(e.to_string()))?;
    if let Location::Http(url) = &loc {
        let rest = url.split_once("://").map_or("", |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if url.contains(['?', '#']) || authority.contains('@') {
            return Err(ImageError::Invalid(format!(
                "{}: an image URL may not carry a query or user:password (its sidecar files' \
                 URLs are derived from it): use s3:// with credentials from the environment, \
                 or give the data with `verity open`",
                loc.display_name()
            )));
        }
    }
    Ok(loc.is_remote().then_some(loc))
}

/// A remote failure as an image error: refused credentials are a verification failure (exit
/// 2, as `verity open` gives), the rest I/O.
pub fn image_error(e: RemoteError) -> ImageError {
    match e {
        RemoteError::Denied { .. } => ImageError::Verification(e.to_string()),
        e => ImageError::Io(e.to_string()),
    }
}

/// The objects of one remote image, each opened (its length and ETag pinned) once and shared
/// by the layout reader and the verity volume.
pub struct RemoteFiles {
    objects: Mutex<Objects>,
    opened: Mutex<HashMap<PathBuf, Arc<dyn RangeSource>>>,
}

impl RemoteFiles {
    /// Objects fetched as `o` says.
    pub fn new(o: &RemoteImageOptions) -> RemoteFiles {
        RemoteFiles {
            objects: Mutex::new(Objects::new(o.http.clone()).with_s3(o.s3.clone())),
            opened: Mutex::new(HashMap::new()),
        }
    }

    /// The object at `path` (a URL), opened now or before.
    pub fn object(&self, path: &Path) -> std::result::Result<Arc<dyn RangeSource>, RemoteError> {
        if let Some(o) = self.lock_opened().get(path) {
            return Ok(o.clone());
        }
        let text = path.to_string_lossy();
        let loc = Location::parse(&text).map_err(|e| RemoteError::Protocol {
            url: e.arg.clone(),
            what: e.what,
        })?;
        let obj = self
            .objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open(&loc)?;
        self.lock_opened().insert(path.to_path_buf(), obj.clone());
        Ok(obj)
    }

    fn lock_opened(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<dyn RangeSource>>> {
        self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `region` of its object as an object of its own (a partition of a disk image), showing
    /// the object's retries when `retries`.
    pub fn window(&self, region: &Region, retries: bool) -> Result<Arc<dyn RangeSource>> {
        let obj = self.object(&region.file).map_err(image_error)?;
        if region.offset == 0 && region.size == obj.identity().len {
            return Ok(obj);
        }
        Ok(Arc::new(Window::new(
            obj,
            region.offset,
            region.size,
            retries,
        )?))
    }
}

impl Files for RemoteFiles {
    fn open(&self, path: &Path) -> Result<Arc<dyn BlockDevice>> {
        // The layout's few reads: no read-ahead threads before the export forks.
        let obj = self.object(path).map_err(image_error)?;
        Ok(Arc::new(DirectDevice::new(obj)))
    }

    fn size(&self, path: &Path) -> Result<Option<u64>> {
        match self.object(path) {
            Ok(o) => Ok(Some(o.identity().len)),
            // A sidecar that is not there; S3 answers 403 instead of 404 to a client that may
            // not list the bucket, which is a refusal all the same (and says so).
            Err(RemoteError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(image_error(e)),
        }
    }
}

/// A byte range of an object, read as an object of its own: a partition of a remote disk
/// image. Its counters are the requests made through it (so the data and hash partitions of
/// one object are not counted twice); retries are the whole object's, shown by the window
/// given `retries` (one per object).
pub struct Window {
    inner: Arc<dyn RangeSource>,
    start: u64,
    identity: ObjectIdentity,
    stats: Mutex<RemoteStats>,
    retries: bool,
}

impl Window {
    /// `[start, start + len)` of `inner`, refused when it lies outside the object; its
    /// counters show the object's retries when `retries`.
    pub fn new(inner: Arc<dyn RangeSource>, start: u64, len: u64, retries: bool) -> Result<Window> {
        RemoteError::check_within(
            inner.name(),
            start,
            usize::try_from(len).unwrap_or(usize::MAX),
            inner.identity().len,
        )
        .map_err(|e| ImageError::Invalid(e.to_string()))?;
        let identity = ObjectIdentity {
            len,
            ..inner.identity().clone()
        };
        Ok(Window {
            inner,
            start,
            identity,
            stats: Mutex::default(),
            retries,
        })
    }
}

impl RangeSource for Window {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn identity(&self) -> &ObjectIdentity {
        &self.identity
    }

    fn read_range(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), RemoteError> {
        RemoteError::check_within(self.inner.name(), offset, buf.len(), self.identity.len)?;
        self.inner.read_range(self.start + offset, buf)?;
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.requests += 1;
        s.bytes_fetched += buf.len() as u64;
        Ok(())
    }

    fn stats(&self) -> RemoteStats {
        let mut s = *self.stats.lock().unwrap_or_else(|e| e.into_inner());
        if self.retries {
            s.retries = self.inner.stats().retries;
        }
        s
    }
}

/// Activate the remote image's root partition `data` with its tree in `hash` as `name`,
/// against `root` (already checked against the signature by the caller).
pub fn activate(
    files: &RemoteFiles,
    data: &Region,
    hash: &Region,
    params: VerityParams,
    root: &[u8],
    name: &str,
    o: &RemoteImageOptions,
) -> std::result::Result<Activated, VolumeError> {
    let err = |e: ImageError| VolumeError::Invalid(e.to_string());
    let data_obj = files.window(data, true).map_err(err)?;
    // The hash partition of the data's object: its retries are counted once, by the data.
    let same = data.file == hash.file;
    let hash_obj = files.window(hash, !same).map_err(err)?;
    let opened = crate::remote::verity::open(RemoteVerity {
        data: data_obj,
        hash: hash_obj,
        params: ParamsSource::Given(params),
        remote: o.device,
        cache: o.cache.clone(),
        prefetch: o.prefetch,
        // An image's FEC (where one is stored) is not read remotely: image URLs refuse
        // --fec-device.
        fec: None,
    })?;
    opened.activate(
        root,
        VerityOptions {
            name: name.to_string(),
            ..VerityOptions::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_locations() {
        assert!(location(Path::new("root.raw")).unwrap().is_none());
        assert!(location(Path::new("https://h/root.raw")).unwrap().is_some());
        assert!(location(Path::new("s3://bucket/os/root.raw"))
            .unwrap()
            .is_some());
        for bad in [
            "https://h/root.raw?X-Amz-Signature=s",
            "https://u:pw@h/root.raw",
        ] {
            let e = location(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains("query or user:password"), "{e}");
            assert!(!e.contains("pw") && !e.contains("Signature"), "{e}");
        }
    }

    #[test]
    fn a_window_reads_its_range_and_refuses_past_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("obj");
        std::fs::write(&f, b"0123456789").unwrap();
        let obj: Arc<dyn RangeSource> = Arc::new(crate::remote::LocalRange::open(&f).unwrap());
        assert!(Window::new(obj.clone(), 8, 3, true).is_err());
        let w = Window::new(obj, 2, 5, false).unwrap();
        let mut b = [0u8; 3];
        w.read_range(1, &mut b).unwrap();
        assert_eq!(&b, b"345");
        assert!(w.read_range(3, &mut b).is_err());
        assert_eq!(w.identity().len, 5);
        assert_eq!(w.stats().requests, 1);
    }
}
