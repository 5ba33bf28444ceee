//! An S3-compatible server that checks request signatures, on 127.0.0.1, for the S3 tests:
//! s3s-fs (the `s3s` crate's file-system store), installed by scripts/s3s-fs.sh into
//! `target/tools/bin` (or found as `$DMKIT_S3S_FS` or on PATH).
//!
//! Its buckets are directories under a private root and its objects files in them, so a test
//! puts an object by writing a file; every request must carry a SigV4 signature made with the
//! server's one access key and secret key.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The access key id the server accepts.
pub const ACCESS_KEY: &str = "AKIDDMKITTEST";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "dmkit/test+SecretKey0123456789abcdefghij";

/// A running s3s-fs, killed on drop.
pub struct S3Server {
    child: Child,
    addr: SocketAddr,
    root: tempfile::TempDir,
}

/// The s3s-fs binary, or `None` after [`super::env::missing`] had its say (skip locally, fail
/// in CI).
pub fn s3s_fs() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DMKIT_S3S_FS") {
        return Some(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let installed = target.join("tools/bin/s3s-fs");
    if installed.exists() {
        return Some(installed);
    }
    if super::env::on_path("s3s-fs") {
        return Some("s3s-fs".into());
    }
    super::env::missing(
        "s3s-fs is not installed (scripts/s3s-fs.sh installs it into target/tools)",
    );
    None
}

impl S3Server {
    /// Starts s3s-fs on a free port of 127.0.0.1 with an empty store and waits until it
    /// accepts connections. `None` when s3s-fs is missing (see [`s3s_fs`]).
    pub fn start() -> Option<S3Server> {
        let bin = s3s_fs()?;
        let root = tempfile::tempdir().unwrap();
        // A free port, given back just before the server binds it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let mut server = S3Server { child, addr, root };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(st)) = server.child.try_wait() {
                panic!("s3s-fs exited at start: {st}");
            }
            assert!(
                Instant::now() < deadline,
                "s3s-fs did not listen on {addr} in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    /// The endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Puts `bytes` as `bucket/key` (creating the bucket).
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let path = self.root.path().join(bucket).join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// Puts a copy of the file `from` as `bucket/key`.
    pub fn put_file(&self, bucket: &str, key: &str, from: &Path) {
        let path = self.root.path().join(bucket).join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(from, path).unwrap();
    }

    /// The file holding `bucket/key` (to change an object behind the reader's back).
    pub fn object_path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.path().join(bucket).join(key)
    }

    /// Environment for a dmkit command reading from this server with the right keys (and
    /// nothing from the caller's own AWS configuration).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_SHARED_CREDENTIALS_FILE".into(), "/nonexistent".into()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
