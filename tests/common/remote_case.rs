//! A verity volume served as remote objects for the remote-layer tests (issue 28): data and
//! hash files made by veritysetup, opened through [`dmkit::remote::verity`] over any
//! [`RangeSource`] (a [`LocalRange`] here; an nginx URL where the transport is merged).

use dmkit::block::{Activated, BlockDevice};
use dmkit::remote::cache::CacheOptions;
use dmkit::remote::device::RemoteOptions;
use dmkit::remote::verity::{open, RemoteVerity};
use dmkit::remote::{LocalRange, RangeSource};
use dmkit::verity::volume::ParamsSource;
use dmkit::verity::VerityOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Data block size of the cases.
pub const BS: usize = 4096;

/// A formatted volume in a private directory.
pub struct Case {
    pub dir: PathBuf,
    pub data: PathBuf,
    pub hash: PathBuf,
    pub bytes: Vec<u8>,
    pub root_hex: String,
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `blocks` blocks of seeded data, formatted by `veritysetup format` (the real tool); `None`
/// (skipped, or a failure under CI=1) without veritysetup.
pub fn case(tag: &str, blocks: usize, seed: u64) -> Option<Case> {
    if super::env::tool_missing("veritysetup", "cryptsetup-bin") {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("dmkit-remote-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = super::rng::SplitMix64(seed).bytes(blocks * BS);
    let (data, hash) = (dir.join("data.img"), dir.join("hash.img"));
    std::fs::write(&data, &bytes).unwrap();
    let out = super::run::ok(
        "veritysetup",
        &["format", data.to_str().unwrap(), hash.to_str().unwrap()],
    );
    let root_hex = out
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .expect("veritysetup prints the root hash")
        .trim()
        .to_string();
    Some(Case {
        dir,
        data,
        hash,
        bytes,
        root_hex,
    })
}

impl Case {
    /// The cache directory of this case.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.join("cache")
    }

    /// The image's own cache directory (under the root hash).
    pub fn image_cache(&self) -> PathBuf {
        self.cache_dir().join(&self.root_hex)
    }

    /// Open the volume with `data` as the data object (a mirror, or a damaged copy), the
    /// case's hash file, and a cache of `cache_bytes` (none when 0).
    pub fn open_with(&self, data: &Path, cache_bytes: u64, prefetch: bool) -> Activated {
        let d: Arc<dyn RangeSource> = Arc::new(LocalRange::open(data).unwrap());
        let h: Arc<dyn RangeSource> = Arc::new(LocalRange::open(&self.hash).unwrap());
        self.open_sources(d, h, cache_bytes, prefetch)
    }

    /// Open the volume over the given objects.
    pub fn open_sources(
        &self,
        data: Arc<dyn RangeSource>,
        hash: Arc<dyn RangeSource>,
        cache_bytes: u64,
        prefetch: bool,
    ) -> Activated {
        let opened = open(RemoteVerity {
            data,
            hash,
            params: ParamsSource::Superblock { hash_offset: 0 },
            remote: RemoteOptions::default(),
            cache: (cache_bytes > 0).then(|| CacheOptions {
                dir: self.cache_dir(),
                max_bytes: cache_bytes,
            }),
            prefetch,
            fec: None,
        })
        .unwrap();
        let root = hex::decode(&self.root_hex).unwrap();
        opened
            .activate(
                &root,
                VerityOptions {
                    name: "remote".into(),
                    // No memory cache: every read goes to the persistent cache or the object,
                    // which is what these tests look at.
                    data_cache_bytes: 0,
                    ..VerityOptions::default()
                },
            )
            .unwrap()
    }

    /// Block `b` of the original data.
    pub fn block(&self, b: u64) -> &[u8] {
        &self.bytes[b as usize * BS..(b as usize + 1) * BS]
    }
}

/// One counter of an activated volume's `status`.
pub fn stat(a: &Activated, key: &str) -> u64 {
    let f = a.stats.as_ref().expect("remote volumes have counters");
    f()[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {key} in {}", f()))
}

/// Read block `b` of the device.
pub fn read_block(dev: &dyn BlockDevice, b: u64) -> dmkit::block::Result<Vec<u8>> {
    let mut buf = vec![0u8; BS];
    dev.read_at(&mut buf, b * BS as u64).map(|()| buf)
}

/// The cache's slots: block number → the bytes its slot holds, read from the files.
pub fn cached_blocks(image_cache: &Path) -> Vec<(u64, Vec<u8>)> {
    let index = std::fs::read(image_cache.join("index")).unwrap();
    let data = std::fs::read(image_cache.join("data")).unwrap();
    let body = &index[24..index.len() - 32];
    body.chunks_exact(16)
        .map(|e| {
            let block = u64::from_le_bytes(e[..8].try_into().unwrap());
            let slot = u64::from_le_bytes(e[8..].try_into().unwrap()) as usize;
            let bytes = data.get(slot * BS..(slot + 1) * BS).unwrap_or(&[]).to_vec();
            (block, bytes)
        })
        .collect()
}

/// The byte offset of block `b`'s slot in the cache's data file.
pub fn slot_offset(image_cache: &Path, b: u64) -> u64 {
    let index = std::fs::read(image_cache.join("index")).unwrap();
    let body = &index[24..index.len() - 32];
    body.chunks_exact(16)
        .find(|e| u64::from_le_bytes(e[..8].try_into().unwrap()) == b)
        .map(|e| u64::from_le_bytes(e[8..].try_into().unwrap()) * BS as u64)
        .unwrap_or_else(|| panic!("block {b} is not cached"))
}

/// An nginx serving a directory on 127.0.0.1 (byte ranges, ETags), stopped when dropped.
/// (r28's `tests/common/nginx.rs` is the shared helper with HTTPS once merged on main.)
pub struct Nginx {
    pub port: u16,
    child: std::process::Child,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serve `root` with nginx on a free port; `None` (skipped, or a failure under CI=1) without
/// nginx.
pub fn nginx(root: &Path, work: &Path) -> Option<Nginx> {
    let bin = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|b| Path::new(b).exists() || super::env::on_path(b));
    let Some(bin) = bin else {
        super::env::missing("nginx is not installed (apt-get install nginx)");
        return None;
    };
    std::fs::create_dir_all(work.join("tmp")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let w = work.display();
    let conf = format!(
        "daemon off; worker_processes 1; pid {w}/nginx.pid; error_log {w}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{ access_log off; client_body_temp_path {w}/tmp; proxy_temp_path {w}/tmp;\n\
         fastcgi_temp_path {w}/tmp; uwsgi_temp_path {w}/tmp; scgi_temp_path {w}/tmp;\n\
         server {{ listen 127.0.0.1:{port}; root {}; }} }}\n",
        root.display()
    );
    let conf_path = work.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    // nginx's workers run as nobody: the served tree must be readable by all.
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755));
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644));
            }
        }
    }
    let mut a = root.parent();
    while let Some(d) = a {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d).unwrap().permissions().mode();
        if mode & 0o001 == 0 {
            let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o001));
        }
        a = d.parent();
    }
    let child = std::process::Command::new(bin)
        .args([
            "-c",
            conf_path.to_str().unwrap(),
            "-p",
            work.to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start nginx");
    let server = Nginx { port, child };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "nginx did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(server)
}
