//! Signing fixtures made with the openssl CLI: keys, self-signed certificates, CMS checks.

use super::run;
use std::path::{Path, PathBuf};

/// `openssl req` options for a new RSA-2048 key.
pub const RSA: &[&str] = &["-newkey", "rsa:2048"];
/// `openssl req` options for a new RSA-4096 key.
pub const RSA_4096: &[&str] = &["-newkey", "rsa:4096"];
/// `openssl req` options for a new EC P-256 key.
pub const EC_P256: &[&str] = &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
/// `openssl req` options for a new EC P-384 key.
pub const EC_P384: &[&str] = &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"];

/// A key and its self-signed certificate, made by [`make_ident`].
#[derive(Debug, Clone)]
pub struct Ident {
    /// The name the files are named after.
    pub name: String,
    /// `NAME.key`: the private key (PEM, PKCS#8).
    pub key: PathBuf,
    /// `NAME.crt`: the certificate (PEM).
    pub cert: PathBuf,
    /// `NAME.der`: the certificate (DER).
    pub cert_der: PathBuf,
}

/// `path` as UTF-8.
fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// `openssl args...`, which must succeed.
pub fn openssl_ok(args: &[&str]) {
    run::ok("openssl", args);
}

/// A new key in `key` and a self-signed certificate for it in `cert` (both PEM), for 30 days:
/// `openssl req -x509 -nodes -subj SUBJECT KEY_OPTIONS...`, e.g. [`RSA`] or [`EC_P256`] (more
/// `req` options may follow them).
pub fn self_signed(key: &Path, cert: &Path, subject: &str, key_options: &[&str]) {
    let mut args = vec!["req", "-x509", "-nodes", "-days", "30", "-subj", subject];
    args.extend_from_slice(key_options);
    args.extend_from_slice(&["-keyout", s(key), "-out", s(cert)]);
    openssl_ok(&args);
}

/// [`self_signed`] into `dir/NAME.key` and `dir/NAME.crt`, plus the certificate in DER.
pub fn make_ident(dir: &Path, name: &str, subject: &str, key_options: &[&str]) -> Ident {
    let key = dir.join(format!("{name}.key"));
    let cert = dir.join(format!("{name}.crt"));
    let cert_der = dir.join(format!("{name}.der"));
    self_signed(&key, &cert, subject, key_options);
    openssl_ok(&[
        "x509",
        "-in",
        s(&cert),
        "-outform",
        "der",
        "-out",
        s(&cert_der),
    ]);
    Ident {
        name: name.to_string(),
        key,
        cert,
        cert_der,
    }
}

/// Whether `openssl smime -verify` accepts the detached DER signature `sig` over the file
/// `content` by the certificate `cert` alone (no chain check).
pub fn smime_verifies(sig: &Path, content: &Path, cert: &Path) -> bool {
    run::output(
        "openssl",
        &[
            "smime",
            "-verify",
            "-binary",
            "-inform",
            "der",
            "-in",
            s(sig),
            "-content",
            s(content),
            "-certfile",
            s(cert),
            "-nointern",
            "-noverify",
            "-out",
            "/dev/null",
        ],
    )
    .status
    .success()
}

/// A new EC P-256 key `dir/NAME.key` and its certificate `dir/NAME.crt` signed by `ca` for
/// 30 days, with the X.509v3 extensions `extensions` (config lines such as
/// `subjectAltName=IP:127.0.0.1`).
pub fn ca_signed(dir: &Path, ca: &Ident, name: &str, subject: &str, extensions: &str) -> Ident {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let cert = dir.join(format!("{name}.crt"));
    let cert_der = dir.join(format!("{name}.der"));
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(&ext, extensions).unwrap();
    let mut args = vec!["req", "-new", "-nodes", "-subj", subject];
    args.extend_from_slice(EC_P256);
    args.extend_from_slice(&["-keyout", s(&key), "-out", s(&csr)]);
    openssl_ok(&args);
    openssl_ok(&[
        "x509",
        "-req",
        "-days",
        "30",
        "-in",
        s(&csr),
        "-CA",
        s(&ca.cert),
        "-CAkey",
        s(&ca.key),
        "-CAcreateserial",
        "-extfile",
        s(&ext),
        "-out",
        s(&cert),
    ]);
    openssl_ok(&[
        "x509",
        "-in",
        s(&cert),
        "-outform",
        "der",
        "-out",
        s(&cert_der),
    ]);
    Ident {
        name: name.to_string(),
        key,
        cert,
        cert_der,
    }
}
