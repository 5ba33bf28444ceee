//! nginx serving a directory on 127.0.0.1 for the remote-transport tests: plain HTTP, HTTPS
//! with a certificate from a CA made here with the openssl CLI, and HTTPS that requires a client
//! certificate from that CA. nginx serves byte ranges of static files (and honours `If-Match`)
//! by default.
//!
//! Everything lives in a temporary directory (configuration, logs, pid file, certificates, the
//! served `www/`); nginx runs in the foreground as one process (`daemon off`,
//! `master_process off`), killed when the [`Nginx`] is dropped.

use super::env;
use super::pki::{openssl_ok, EC_P256};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nginx and what a client needs to reach it.
pub struct Nginx {
    /// Its prefix directory (configuration, logs, certificates).
    pub dir: tempfile::TempDir,
    /// The served directory.
    pub www: PathBuf,
    /// Port of plain HTTP.
    pub http: u16,
    /// Port of HTTPS.
    pub https: u16,
    /// Port of HTTPS requiring a client certificate.
    pub mtls: u16,
    /// The CA that signed the server and client certificates (PEM).
    pub ca: PathBuf,
    /// A client certificate signed by the CA (PEM).
    pub client_cert: PathBuf,
    /// Its key (PEM).
    pub client_key: PathBuf,
    child: Child,
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A port free on 127.0.0.1 now (the kernel's pick; nginx binds it a moment later).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// `openssl req MODE... -nodes` with a new EC P-256 key for `subject` into `key`, the request
/// or certificate into `out`.
fn new_key(mode: &[&str], subject: &str, key: &Path, out: &Path) {
    let mut args = vec!["req"];
    args.extend_from_slice(mode);
    args.push("-nodes");
    args.extend_from_slice(EC_P256);
    args.extend_from_slice(&["-subj", subject, "-keyout", s(key), "-out", s(out)]);
    openssl_ok(&args);
}

/// A key and a certificate for `cn` signed by the CA in `dir`, for `usage` (serverAuth or
/// clientAuth).
fn issue(dir: &Path, name: &str, cn: &str, usage: &str) {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let crt = dir.join(format!("{name}.crt"));
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n\
             basicConstraints=CA:FALSE\n"
        ),
    )
    .unwrap();
    new_key(&["-new"], &format!("/CN={cn}"), &key, &csr);
    openssl_ok(&[
        "x509",
        "-req",
        "-in",
        s(&csr),
        "-CA",
        s(&dir.join("ca.crt")),
        "-CAkey",
        s(&dir.join("ca.key")),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        s(&ext),
        "-out",
        s(&crt),
    ]);
}

impl Nginx {
    /// Starts nginx, or returns `None` when nginx or openssl is missing (failing loudly when
    /// `CI` is set, see [`env::missing`]).
    pub fn start() -> Option<Nginx> {
        if env::tools_missing(&[("nginx", "nginx"), ("openssl", "openssl")]) {
            return None;
        }
        let mut dir = tempfile::Builder::new()
            .prefix("dmkit-nginx")
            .tempdir()
            .unwrap();
        let d = dir.path().to_path_buf();
        new_key(
            &["-x509", "-days", "2"],
            "/CN=dmkit test CA",
            &d.join("ca.key"),
            &d.join("ca.crt"),
        );
        issue(&d, "server", "127.0.0.1", "serverAuth");
        issue(&d, "client", "dmkit test client", "clientAuth");
        let www = d.join("www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        // Ports are picked free and bound by nginx a moment later: another process may take
        // one in between, so a start that fails is tried again with new ports.
        let mut last_log = String::new();
        for _ in 0..3 {
            let (http, https, mtls) = (free_port(), free_port(), free_port());
            if http == https || https == mtls || http == mtls {
                continue;
            }
            std::fs::write(d.join("nginx.conf"), config(&d, http, https, mtls)).unwrap();
            let log = d.join("error.log");
            let child = Command::new("nginx")
                .args(["-p", s(&d), "-c", s(&d.join("nginx.conf")), "-e", s(&log)])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn nginx");
            let mut nginx = Nginx {
                www: www.clone(),
                http,
                https,
                mtls,
                ca: d.join("ca.crt"),
                client_cert: d.join("client.crt"),
                client_key: d.join("client.key"),
                child,
                dir,
            };
            if nginx.wait_listening() {
                return Some(nginx);
            }
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = nginx.child.kill();
            let _ = nginx.child.wait();
            dir = std::mem::replace(&mut nginx.dir, tempfile::tempdir().unwrap());
        }
        panic!("nginx did not start; its error log:\n{last_log}");
    }

    /// Whether all three ports accept connections within 10 s (false: nginx exited).
    fn wait_listening(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            let up = [self.http, self.https, self.mtls]
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok());
            if up {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `http://127.0.0.1:PORT/NAME`.
    pub fn http_url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.http)
    }

    /// `https://127.0.0.1:PORT/NAME` (certificate from [`Nginx::ca`]).
    pub fn https_url(&self, name: &str) -> String {
        format!("https://127.0.0.1:{}/{name}", self.https)
    }

    /// The HTTPS URL of the server requiring a client certificate.
    pub fn mtls_url(&self, name: &str) -> String {
        format!("https://127.0.0.1:{}/{name}", self.mtls)
    }

    /// Puts `data` in the served directory as `name`.
    pub fn put(&self, name: &str, data: &[u8]) -> PathBuf {
        let path = self.www.join(name);
        std::fs::write(&path, data).unwrap();
        path
    }

    /// nginx's error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The configuration: one process in the foreground, everything under `d`.
fn config(d: &Path, http: u16, https: u16, mtls: u16) -> String {
    let p = |name: &str| d.join(name).display().to_string();
    let (crt, key, ca, www, tmp) = (
        p("server.crt"),
        p("server.key"),
        p("ca.crt"),
        p("www"),
        p("tmp"),
    );
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {pid};
error_log {log} info;
events {{ worker_connections 256; }}
http {{
    access_log {access};
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{http};
        root {www};
    }}
    server {{
        listen 127.0.0.1:{https} ssl;
        ssl_certificate {crt};
        ssl_certificate_key {key};
        root {www};
    }}
    server {{
        listen 127.0.0.1:{mtls} ssl;
        ssl_certificate {crt};
        ssl_certificate_key {key};
        ssl_client_certificate {ca};
        ssl_verify_client on;
        root {www};
    }}
}}
"#,
        pid = p("nginx.pid"),
        log = p("error.log"),
        access = p("access.log"),
    )
}
