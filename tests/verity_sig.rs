//! dm-verity root hash signatures: dmkit against the `openssl` CLI.

mod common;

use common::pki::{self, make_ident, openssl_ok, smime_verifies as openssl_verifies, Ident};
use std::fs;
use std::path::{Path, PathBuf};
use std::slice::from_ref;
use std::sync::OnceLock;

use dmkit::verity::sig::{sign_root_hash, verify_root_hash_signature, SignatureError};

const ROOT: &str = "4392b3c9a6c1d5e0a54c2a1f0c3d6e7f8a9b0c1d2e3f405162738495a6b7c8d9";
const OTHER_ROOT: &str = "0000b3c9a6c1d5e0a54c2a1f0c3d6e7f8a9b0c1d2e3f405162738495a6b7c8d9";

struct Fixture {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    rsa: Ident,
    ec: Ident,
    /// A second RSA identity whose certificate is never given as trusted.
    stranger: Ident,
    /// root.txt: ROOT, no newline.
    root_txt: PathBuf,
}

fn openssl(args: &[&str]) -> std::process::Output {
    common::run::output("openssl", args)
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// A signing identity in `dir` with the subject `/CN=NAME/O=dmkit test`.
fn ident(dir: &Path, name: &str, newkey: &[&str]) -> Ident {
    make_ident(dir, name, &format!("/CN={name}/O=dmkit test"), newkey)
}

fn fx() -> &'static Fixture {
    static FX: OnceLock<Fixture> = OnceLock::new();
    FX.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let rsa = ident(&dir, "test-rsa", pki::RSA);
        let ec = ident(&dir, "test-ec", pki::EC_P256);
        let stranger = ident(&dir, "stranger", pki::RSA);
        let root_txt = dir.join("root.txt");
        fs::write(&root_txt, ROOT).expect("write root.txt");
        Fixture {
            _dir: tmp,
            dir,
            rsa,
            ec,
            stranger,
            root_txt,
        }
    })
}

/// A fresh file name in the fixture dir.
fn tmpfile(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    fx().dir
        .join(format!("{tag}-{}", N.fetch_add(1, Ordering::Relaxed)))
}

/// `openssl smime -sign` over `content` (a file) with extra flags; returns the signature path.
fn openssl_sign(id: &Ident, content: &Path, extra: &[&str]) -> PathBuf {
    let out = tmpfile("ossl.sig");
    let mut args = vec![
        "smime",
        "-sign",
        "-binary",
        "-outform",
        "der",
        "-in",
        p(content),
        "-inkey",
    ];
    args.push(p(&id.key));
    args.extend_from_slice(&["-signer", p(&id.cert), "-out", p(&out)]);
    args.extend_from_slice(extra);
    openssl_ok(&args);
    out
}

fn write_sig(bytes: &[u8]) -> PathBuf {
    let path = tmpfile("dmkit.sig");
    fs::write(&path, bytes).expect("write sig");
    path
}

fn serial_of(cert: &Path) -> String {
    let out = openssl(&["x509", "-noout", "-serial", "-in", p(cert)]);
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_string()
}

fn assert_one_line(e: &SignatureError) {
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "multi-line error: {msg:?}");
    assert!(!msg.is_empty());
}

/// `openssl asn1parse` of a DER file, reduced to structure: depth, type and value, without
/// offsets and lengths, and without the contents of OCTET STRINGs (the signature value).
fn asn1_structure(der: &Path) -> Vec<String> {
    let out = openssl(&["asn1parse", "-inform", "der", "-in", p(der)]);
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let depth = line
                .split_whitespace()
                .find(|w| w.starts_with("d="))
                .unwrap_or("")
                .to_string();
            let rest = line
                .split_once("prim:")
                .or_else(|| line.split_once("cons:"))
                .map(|(_, r)| r.trim().to_string())
                .unwrap_or_default();
            let rest = if rest.starts_with("OCTET STRING") {
                "OCTET STRING".to_string()
            } else {
                rest
            };
            format!("{depth} {rest}")
        })
        .collect()
}

#[test]
fn rsa_signature_is_byte_for_byte_openssls() {
    let f = fx();
    let ours = sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert).unwrap();
    let theirs = openssl_sign(&f.rsa, &f.root_txt, &["-noattr", "-nocerts"]);
    assert_eq!(ours, fs::read(&theirs).unwrap());
    // DER certificate accepted for signing too.
    let ours_der = sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert_der).unwrap();
    assert_eq!(ours, ours_der);
}

#[test]
fn our_signatures_verify_with_openssl() {
    let f = fx();
    for id in [&f.rsa, &f.ec] {
        let sig = write_sig(&sign_root_hash(ROOT, &id.key, &id.cert).unwrap());
        assert!(openssl_verifies(&sig, &f.root_txt, &id.cert), "{}", id.name);
        // ... and only against the signer's certificate, and only over this root hash.
        assert!(!openssl_verifies(&sig, &f.root_txt, &f.stranger.cert));
        let other = tmpfile("other.txt");
        fs::write(&other, OTHER_ROOT).unwrap();
        assert!(!openssl_verifies(&sig, &other, &id.cert));
        // And with ourselves.
        let who = verify_root_hash_signature(ROOT, &sig, from_ref(&id.cert)).unwrap();
        assert_eq!(who.subject, format!("CN={}, O=dmkit test", id.name));
        assert_eq!(who.serial, serial_of(&id.cert));
    }
}

#[test]
fn ec_signature_structure_matches_openssls() {
    let f = fx();
    let ours = write_sig(&sign_root_hash(ROOT, &f.ec.key, &f.ec.cert).unwrap());
    let theirs = openssl_sign(&f.ec, &f.root_txt, &["-noattr", "-nocerts"]);
    assert_eq!(asn1_structure(&ours), asn1_structure(&theirs));
    let structure = asn1_structure(&ours).join("\n");
    assert!(structure.contains(":pkcs7-signedData"), "{structure}");
    assert!(structure.contains(":ecdsa-with-SHA256"), "{structure}");
    assert!(structure.contains(":sha256"), "{structure}");
    // Detached: the content info holds only the type pkcs7-data.
    assert!(
        !structure.contains("cont [ 1 ]"),
        "signed attributes: {structure}"
    );
}

#[test]
fn openssl_signatures_verify_with_ours() {
    let f = fx();
    let variants: [&[&str]; 4] = [&["-noattr", "-nocerts"], &["-noattr"], &["-nocerts"], &[]];
    for id in [&f.rsa, &f.ec] {
        for extra in variants {
            let sig = openssl_sign(id, &f.root_txt, extra);
            let who = verify_root_hash_signature(ROOT, &sig, from_ref(&id.cert))
                .unwrap_or_else(|e| panic!("{} {extra:?}: {e}", id.name));
            assert_eq!(who.subject, format!("CN={}, O=dmkit test", id.name));
            assert_eq!(who.serial, serial_of(&id.cert));
            // DER certificate, and the signer among others.
            verify_root_hash_signature(ROOT, &sig, from_ref(&id.cert_der)).unwrap();
            let who = verify_root_hash_signature(
                ROOT,
                &sig,
                &[f.stranger.cert.clone(), id.cert_der.clone()],
            )
            .unwrap();
            assert_eq!(who.subject, format!("CN={}, O=dmkit test", id.name));
        }
    }
}

#[test]
fn cms_keyid_signature_verifies() {
    // The kernel's sign-file -k names the signer by subject key identifier (CMS).
    let f = fx();
    for id in [&f.rsa, &f.ec] {
        let sig = tmpfile("cms.sig");
        openssl_ok(&[
            "cms",
            "-sign",
            "-binary",
            "-noattr",
            "-nocerts",
            "-keyid",
            "-outform",
            "der",
            "-in",
            p(&f.root_txt),
            "-inkey",
            p(&id.key),
            "-signer",
            p(&id.cert),
            "-out",
            p(&sig),
        ]);
        let who =
            verify_root_hash_signature(ROOT, &sig, &[f.stranger.cert.clone(), id.cert.clone()])
                .unwrap_or_else(|e| panic!("{}: {e}", id.name));
        assert_eq!(who.subject, format!("CN={}, O=dmkit test", id.name));
        let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.stranger.cert)).unwrap_err();
        assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
        let err = verify_root_hash_signature(OTHER_ROOT, &sig, from_ref(&id.cert)).unwrap_err();
        assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
    }
    // A key-id signature by the stranger, its certificate embedded: refused.
    let sig = tmpfile("cms.sig");
    openssl_ok(&[
        "cms",
        "-sign",
        "-binary",
        "-keyid",
        "-outform",
        "der",
        "-in",
        p(&f.root_txt),
        "-inkey",
        p(&f.stranger.key),
        "-signer",
        p(&f.stranger.cert),
        "-out",
        p(&sig),
    ]);
    let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.rsa.cert)).unwrap_err();
    assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
    verify_root_hash_signature(ROOT, &sig, from_ref(&f.stranger.cert)).unwrap();
    // Attached key-id signature: refused.
    let sig = tmpfile("cms.sig");
    openssl_ok(&[
        "cms",
        "-sign",
        "-binary",
        "-keyid",
        "-nodetach",
        "-outform",
        "der",
        "-in",
        p(&f.root_txt),
        "-inkey",
        p(&f.rsa.key),
        "-signer",
        p(&f.rsa.cert),
        "-out",
        p(&sig),
    ]);
    let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.rsa.cert)).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureNotDetached { .. }),
        "{err}"
    );
}

#[test]
fn pem_bundle_of_certificates() {
    let f = fx();
    let bundle = tmpfile("bundle.pem");
    let mut text = fs::read(&f.stranger.cert).unwrap();
    text.extend(fs::read(&f.ec.cert).unwrap());
    text.extend(fs::read(&f.rsa.cert).unwrap());
    fs::write(&bundle, text).unwrap();
    for id in [&f.rsa, &f.ec] {
        let sig = write_sig(&sign_root_hash(ROOT, &id.key, &id.cert).unwrap());
        let who = verify_root_hash_signature(ROOT, &sig, from_ref(&bundle)).unwrap();
        assert_eq!(who.subject, format!("CN={}, O=dmkit test", id.name));
    }
    // Signing picks the bundle's certificate that matches the key.
    let ours = sign_root_hash(ROOT, &f.rsa.key, &bundle).unwrap();
    assert_eq!(ours, sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert).unwrap());
}

#[test]
fn refuses_signature_over_another_root_hash() {
    let f = fx();
    for id in [&f.rsa, &f.ec] {
        for extra in [&["-noattr", "-nocerts"][..], &[]] {
            let sig = openssl_sign(id, &f.root_txt, extra);
            let err = verify_root_hash_signature(OTHER_ROOT, &sig, from_ref(&id.cert)).unwrap_err();
            assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
            assert_one_line(&err);
            assert!(err.to_string().contains(p(&sig)), "{err}");
        }
        // Ours, too.
        let sig = write_sig(&sign_root_hash(OTHER_ROOT, &id.key, &id.cert).unwrap());
        let err = verify_root_hash_signature(ROOT, &sig, from_ref(&id.cert)).unwrap_err();
        assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
    }
}

#[test]
fn refuses_signer_whose_certificate_is_not_given() {
    let f = fx();
    // Without and with the stranger's certificate embedded in the signature: the embedded
    // one must not be trusted.
    for extra in [&["-noattr", "-nocerts"][..], &["-noattr"], &[]] {
        let sig = openssl_sign(&f.stranger, &f.root_txt, extra);
        let err = verify_root_hash_signature(ROOT, &sig, &[f.rsa.cert.clone(), f.ec.cert.clone()])
            .unwrap_err();
        assert!(
            matches!(err, SignatureError::NotVerified { .. }),
            "{extra:?}: {err}"
        );
        assert_one_line(&err);
    }
    let ours = write_sig(&sign_root_hash(ROOT, &f.stranger.key, &f.stranger.cert).unwrap());
    let err = verify_root_hash_signature(ROOT, &ours, from_ref(&f.rsa.cert)).unwrap_err();
    assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
}

#[test]
fn refuses_forged_certificate_with_same_issuer_and_serial() {
    // A certificate with the trusted one's name and serial but another key: the signature
    // names the trusted certificate by issuer and serial but was made with the other key.
    let f = fx();
    let serial = format!("0x{}", serial_of(&f.rsa.cert));
    let forged_key = tmpfile("forged.key");
    let forged_crt = tmpfile("forged.crt");
    pki::self_signed(
        &forged_key,
        &forged_crt,
        "/CN=test-rsa/O=dmkit test",
        &[pki::RSA, &["-set_serial", &serial]].concat(),
    );
    let forged = Ident {
        name: "forged".into(),
        key: forged_key,
        cert: forged_crt,
        cert_der: PathBuf::new(),
    };
    for extra in [&["-noattr", "-nocerts"][..], &[]] {
        let sig = openssl_sign(&forged, &f.root_txt, extra);
        let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.rsa.cert)).unwrap_err();
        assert!(
            matches!(err, SignatureError::NotVerified { .. }),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn refuses_garbage_truncated_and_empty_signatures() {
    let f = fx();
    let certs = [f.rsa.cert.clone()];
    let good = sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert).unwrap();

    let empty = write_sig(b"");
    let err = verify_root_hash_signature(ROOT, &empty, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureGarbled { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(p(&empty)), "{err}");
    assert_one_line(&err);

    let garbage = write_sig(b"this is not a signature\n\x00\x01\x02");
    let err = verify_root_hash_signature(ROOT, &garbage, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureGarbled { .. }),
        "{err}"
    );
    assert_one_line(&err);

    let der_garbage = write_sig(&[0x30, 0x03, 0x02, 0x01, 0x05]);
    let err = verify_root_hash_signature(ROOT, &der_garbage, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureGarbled { .. }),
        "{err}"
    );

    for cut in [1, 2, 10, good.len() / 2, good.len() - 1] {
        let sig = write_sig(&good[..cut]);
        let err = verify_root_hash_signature(ROOT, &sig, &certs).unwrap_err();
        assert!(
            matches!(err, SignatureError::SignatureGarbled { .. }),
            "cut {cut}: {err}"
        );
        assert_one_line(&err);
    }

    let mut trailing = good.clone();
    trailing.extend_from_slice(b"junk");
    let sig = write_sig(&trailing);
    let err = verify_root_hash_signature(ROOT, &sig, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureGarbled { .. }),
        "{err}"
    );

    let missing = f.dir.join("no-such.sig");
    let err = verify_root_hash_signature(ROOT, &missing, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureUnreadable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("no-such.sig"), "{err}");

    // A directory is unreadable as a signature.
    let err = verify_root_hash_signature(ROOT, &f.dir, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureUnreadable { .. }),
        "{err}"
    );

    // PEM instead of DER.
    let pem = tmpfile("sig.pem");
    let der = write_sig(&good);
    openssl_ok(&["pkcs7", "-inform", "der", "-in", p(&der), "-out", p(&pem)]);
    let err = verify_root_hash_signature(ROOT, &pem, &certs).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureGarbled { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("DER"), "{err}");
}

#[test]
fn refuses_attached_signature() {
    let f = fx();
    let sig = openssl_sign(&f.rsa, &f.root_txt, &["-nodetach", "-noattr", "-nocerts"]);
    let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.rsa.cert)).unwrap_err();
    assert!(
        matches!(err, SignatureError::SignatureNotDetached { .. }),
        "{err}"
    );
    assert_one_line(&err);
}

#[test]
fn refuses_unreadable_and_garbage_certificates() {
    let f = fx();
    let sig = write_sig(&sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert).unwrap());

    let missing = f.dir.join("no-such.crt");
    let err = verify_root_hash_signature(ROOT, &sig, &[f.rsa.cert.clone(), missing]).unwrap_err();
    assert!(
        matches!(err, SignatureError::CertificateUnreadable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("no-such.crt"), "{err}");
    assert_one_line(&err);

    for (tag, bytes) in [
        ("empty", &b""[..]),
        ("garbage", &b"garbage garbage garbage"[..]),
        ("der-garbage", &[0x30, 0x03, 0x02, 0x01, 0x05][..]),
        (
            "pem-garbage",
            &b"-----BEGIN CERTIFICATE-----\nnot base64!!\n-----END CERTIFICATE-----\n"[..],
        ),
        (
            "pem-no-cert",
            &b"-----BEGIN FOO-----\nAAAA\n-----END FOO-----\n"[..],
        ),
    ] {
        let path = tmpfile(tag);
        fs::write(&path, bytes).unwrap();
        let err = verify_root_hash_signature(ROOT, &sig, from_ref(&path)).unwrap_err();
        assert!(
            matches!(err, SignatureError::CertificateGarbled { .. }),
            "{tag}: {err}"
        );
        assert!(err.to_string().contains(p(&path)), "{err}");
        assert_one_line(&err);
        let err = sign_root_hash(ROOT, &f.rsa.key, &path).unwrap_err();
        assert!(
            matches!(err, SignatureError::CertificateGarbled { .. }),
            "{tag}: {err}"
        );
    }

    // Truncated DER certificate.
    let der = fs::read(&f.rsa.cert_der).unwrap();
    let path = tmpfile("trunc.der");
    fs::write(&path, &der[..der.len() - 7]).unwrap();
    let err = verify_root_hash_signature(ROOT, &sig, &[path]).unwrap_err();
    assert!(
        matches!(err, SignatureError::CertificateGarbled { .. }),
        "{err}"
    );

    let err = verify_root_hash_signature(ROOT, &sig, &[]).unwrap_err();
    assert!(matches!(err, SignatureError::NoCertificates), "{err}");
}

#[test]
fn root_hash_hex_is_normalized_or_refused() {
    let f = fx();
    let upper = ROOT.to_ascii_uppercase();
    // Uppercase input signs and verifies the lowercase string.
    let ours = sign_root_hash(&upper, &f.rsa.key, &f.rsa.cert).unwrap();
    assert_eq!(ours, sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert).unwrap());
    let theirs = openssl_sign(&f.rsa, &f.root_txt, &[]);
    verify_root_hash_signature(&upper, &theirs, from_ref(&f.rsa.cert)).unwrap();
    let mixed: String = ROOT
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 2 == 0 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect();
    verify_root_hash_signature(&mixed, &theirs, from_ref(&f.rsa.cert)).unwrap();

    // A signature over the uppercase text is not what the kernel checks: refused.
    let upper_txt = tmpfile("upper.txt");
    fs::write(&upper_txt, &upper).unwrap();
    let sig = openssl_sign(&f.rsa, &upper_txt, &["-noattr", "-nocerts"]);
    let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.rsa.cert)).unwrap_err();
    assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");

    // A signature over the text with a newline is refused too.
    let nl_txt = tmpfile("nl.txt");
    fs::write(&nl_txt, format!("{ROOT}\n")).unwrap();
    let sig = openssl_sign(&f.rsa, &nl_txt, &["-noattr", "-nocerts"]);
    let err = verify_root_hash_signature(ROOT, &sig, from_ref(&f.rsa.cert)).unwrap_err();
    assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");

    let sig = write_sig(&ours);
    for bad in [
        "",
        "abc",
        "xyz0",
        "0x4392",
        " 4392",
        "4392\n",
        "43 92",
        "ééff",
        &ROOT[..ROOT.len() - 1],
    ] {
        let err = sign_root_hash(bad, &f.rsa.key, &f.rsa.cert).unwrap_err();
        assert!(
            matches!(err, SignatureError::RootHashNotHex(_)),
            "{bad:?}: {err}"
        );
        assert_one_line(&err);
        let err = verify_root_hash_signature(bad, &sig, from_ref(&f.rsa.cert)).unwrap_err();
        assert!(
            matches!(err, SignatureError::RootHashNotHex(_)),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn signing_refuses_bad_keys() {
    let f = fx();
    // Key and certificate that do not belong together.
    let err = sign_root_hash(ROOT, &f.rsa.key, &f.ec.cert).unwrap_err();
    assert!(
        matches!(err, SignatureError::KeyCertificateMismatch { .. }),
        "{err}"
    );
    assert_one_line(&err);

    let missing = f.dir.join("no-such.key");
    let err = sign_root_hash(ROOT, &missing, &f.rsa.cert).unwrap_err();
    assert!(matches!(err, SignatureError::KeyUnreadable { .. }), "{err}");
    assert!(err.to_string().contains("no-such.key"), "{err}");

    let garbage = tmpfile("garbage.key");
    fs::write(&garbage, b"not a key").unwrap();
    let err = sign_root_hash(ROOT, &garbage, &f.rsa.cert).unwrap_err();
    assert!(matches!(err, SignatureError::KeyGarbled { .. }), "{err}");
    assert_one_line(&err);

    // A certificate is not a key.
    let err = sign_root_hash(ROOT, &f.rsa.cert, &f.rsa.cert).unwrap_err();
    assert!(matches!(err, SignatureError::KeyGarbled { .. }), "{err}");

    // Passphrase-protected: refused, never prompting.
    let enc = tmpfile("enc.key");
    openssl_ok(&[
        "pkey",
        "-in",
        p(&f.rsa.key),
        "-aes256",
        "-passout",
        "pass:secret",
        "-out",
        p(&enc),
    ]);
    let err = sign_root_hash(ROOT, &enc, &f.rsa.cert).unwrap_err();
    assert!(matches!(err, SignatureError::KeyGarbled { .. }), "{err}");
    assert!(err.to_string().contains("passphrase"), "{err}");

    // DER key accepted.
    let der_key = tmpfile("key.der");
    openssl_ok(&[
        "pkey",
        "-in",
        p(&f.ec.key),
        "-outform",
        "der",
        "-out",
        p(&der_key),
    ]);
    let sig = write_sig(&sign_root_hash(ROOT, &der_key, &f.ec.cert).unwrap());
    verify_root_hash_signature(ROOT, &sig, from_ref(&f.ec.cert)).unwrap();
}

#[test]
fn corrupted_signatures_never_panic_nor_verify() {
    let f = fx();
    let certs = [f.rsa.cert.clone()];
    for with_attrs in [false, true] {
        let good = if with_attrs {
            fs::read(openssl_sign(&f.rsa, &f.root_txt, &[])).unwrap()
        } else {
            sign_root_hash(ROOT, &f.rsa.key, &f.rsa.cert).unwrap()
        };
        let path = tmpfile("fuzz.sig");
        // Every truncation.
        for cut in 0..good.len() {
            fs::write(&path, &good[..cut]).unwrap();
            assert!(
                verify_root_hash_signature(ROOT, &path, &certs).is_err(),
                "cut {cut}"
            );
        }
        // Every single-byte corruption: may be refused for any reason, but never panics,
        // and never verifies when it hits the signature value (the last 256 bytes).
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            fs::write(&path, &bad).unwrap();
            let r = verify_root_hash_signature(ROOT, &path, &certs);
            if i >= good.len() - 256 {
                assert!(r.is_err(), "flip at {i} verified");
            }
            if let Err(e) = r {
                assert_one_line(&e);
            }
        }
    }
}
