//! The options of a remote image (issue 28), shared by the commands that open one: the
//! transport's (timeouts, retries, TLS) and the cache's (directory, bound, prefetch).

use super::CliError;
use crate::remote::cache::{CacheOptions, DEFAULT_CACHE_BYTES};
use crate::remote::device::RemoteOptions;
use crate::remote::objects::Objects;
use crate::remote::{HttpOptions, Location, RemoteError, TlsOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How remote (`http://`, `https://`, `s3://`) files are read and cached.
#[derive(clap::Args, Clone, Debug)]
pub struct RemoteArgs {
    /// Cache verified blocks of remote images under this directory (default:
    /// $XDG_CACHE_HOME/dmkit/remote, or ~/.cache/dmkit/remote), one subdirectory per root hash.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Most bytes of one remote image's data kept in the cache (suffixes K, M, G).
    #[arg(long, value_name = "SIZE", value_parser = super::luks_reencrypt::parse_size)]
    cache_size: Option<u64>,
    /// Keep nothing on disk: verified blocks stay in memory only.
    #[arg(long, conflicts_with_all = ["cache_dir", "cache_size", "prefetch"])]
    no_cache: bool,
    /// Record the blocks this open reads first; when a previous open recorded them, fetch them
    /// in the background from the start.
    #[arg(long)]
    prefetch: bool,
    /// Ranges fetched at once (read-ahead and large reads).
    #[arg(long, default_value_t = crate::remote::device::DEFAULT_FETCHERS as u16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    fetchers: u16,
    /// Seconds to wait for a connection (TLS handshake included).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    connect_timeout: u64,
    /// Seconds to wait for any byte from the server before the attempt fails (and is retried).
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    read_timeout: u64,
    /// Retries of a request after a 5xx, a dropped connection or a timeout.
    #[arg(long, default_value_t = 4)]
    retries: u32,
    /// Trust only the CA certificates in this PEM file (instead of the system store).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// S3-compatible store for s3://BUCKET/KEY (e.g. http://127.0.0.1:9000), addressed
    /// path-style; default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS. Credentials come
    /// from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, $CREDENTIALS_DIRECTORY or ~/.aws/credentials,
    /// never from the command line.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// Region s3:// requests are signed for (default: $AWS_REGION, $AWS_DEFAULT_REGION, us-east-1).
    #[arg(long, value_name = "REGION")]
    s3_region: Option<String>,
    /// Client certificate (PEM) for servers that require one.
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,
}

/// A file argument as a location (a local path stays the path given).
pub fn location(arg: &Path) -> Result<Location, CliError> {
    match arg.to_str() {
        Some(s) => Location::parse(s).map_err(|e| CliError::invalid(e.to_string())),
        None => Ok(Location::Local(arg.to_path_buf())),
    }
}

/// A remote read that failed, in one line: 4 for an object that does not exist, 2 for
/// refused credentials, 1 otherwise.
pub fn remote_error(e: RemoteError) -> CliError {
    let code = match &e {
        RemoteError::Status { status: 404, .. } => 4,
        RemoteError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => 4,
        RemoteError::Denied { .. } => 2,
        _ => 1,
    };
    CliError {
        code,
        message: e.to_string(),
    }
}

impl RemoteArgs {
    /// The transport's options.
    pub fn http(&self) -> HttpOptions {
        let mut o = HttpOptions {
            connect_timeout: Duration::from_secs(self.connect_timeout),
            read_timeout: Duration::from_secs(self.read_timeout),
            tls: TlsOptions {
                ca_file: self.ca_file.clone(),
                client_cert: self.client_cert.clone(),
                client_key: self.client_key.clone(),
            },
            ..HttpOptions::default()
        };
        o.retry.max_retries = self.retries;
        // The read-ahead's fetchers, and beside them the reads of an NBD connection's
        // requests in flight (each fetches its own blocks).
        o.connections = o
            .connections
            .max(self.fetchers as usize + crate::export::nbd::inflight::WORKERS / 2);
        o
    }

    /// An opener of this command's objects.
    pub fn objects(&self) -> Objects {
        Objects::new(self.http()).with_s3(crate::remote::s3::S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
        })
    }

    /// How the remote device fetches.
    pub fn device(&self) -> RemoteOptions {
        RemoteOptions {
            fetchers: self.fetchers as usize,
            ..RemoteOptions::default()
        }
    }

    /// The cache, unless `--no-cache`.
    pub fn cache(&self) -> Option<CacheOptions> {
        (!self.no_cache).then(|| CacheOptions {
            dir: self
                .cache_dir
                .clone()
                .unwrap_or_else(CacheOptions::default_dir),
            max_bytes: self.cache_size.unwrap_or(DEFAULT_CACHE_BYTES),
        })
    }

    /// The options of a remote image (`image ls|cat|...|open URL`).
    pub fn image(&self) -> crate::image::remote::RemoteImageOptions {
        crate::image::remote::RemoteImageOptions {
            http: self.http(),
            s3: crate::remote::s3::S3Options {
                endpoint: self.s3_endpoint.clone(),
                region: self.s3_region.clone(),
            },
            device: self.device(),
            cache: self.cache(),
            prefetch: self.prefetch,
        }
    }

    /// Whether a cache option was given (refused where nothing can be verified).
    pub fn cache_requested(&self) -> bool {
        self.cache_dir.is_some() || self.cache_size.is_some() || self.prefetch
    }

    /// Whether `--prefetch` was given.
    pub fn prefetch(&self) -> bool {
        self.prefetch
    }
}
