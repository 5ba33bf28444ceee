//! fs-verity built-in signatures on the host, against fsverity-utils and the openssl CLI:
//!
//! - `dmkit fsverity sign` writes the bytes `fsverity sign` writes for RSA keys (2048 and 4096
//!   bits, SHA-256 and SHA-512 file digests, block sizes and salts), and for ECDSA keys (P-256,
//!   P-384) signatures of the same structure that `openssl smime -verify` accepts over the
//!   formatted digest;
//! - `dmkit fsverity verify-sig` accepts its own and fsverity-utils' signatures (RSA and ECDSA)
//!   and refuses the wrong certificate, another file's signature, another hash algorithm or
//!   salt, an unknown digest algorithm (exit 2), and garbled, truncated, PEM, attached or
//!   missing signatures and bad certificates (exit 1), each with one line naming the file;
//! - `dmkit fsverity enable`/`measure`/`dump-metadata` fail like fsverity-utils on a kernel or
//!   filesystem without fs-verity, with one line and exit 1, leaving the file as it was (the
//!   kernel's side is in tests/kernel.rs);
//! - the library's generic detached signatures (`dmkit::sig`) sign and check any message with
//!   a chosen digest, naming what was signed.
//!
//! Needs `fsverity` (package fsverity) and `openssl`; without them the tests fail when `CI` is
//! set and are skipped with a message otherwise.

mod common;

use common::env::tools_missing;
use common::pki::{self, make_ident, openssl_ok, Ident};
use common::rng::bytes;
use common::run::{ok, text, Run};
use common::DMKIT;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn prerequisites_missing() -> bool {
    tools_missing(&[("fsverity", "fsverity"), ("openssl", "openssl")])
}

fn p(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    rsa2048: Ident,
    rsa4096: Ident,
    p256: Ident,
    p384: Ident,
    /// Never given as trusted.
    stranger: Ident,
}

fn fx() -> &'static Fixture {
    static FX: OnceLock<Fixture> = OnceLock::new();
    FX.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let id = |name: &str, opts: &[&str]| {
            make_ident(&dir, name, &format!("/CN={name}/O=dmkit test"), opts)
        };
        Fixture {
            rsa2048: id("rsa2048", pki::RSA),
            rsa4096: id("rsa4096", pki::RSA_4096),
            p256: id("p256", pki::EC_P256),
            p384: id("p384", pki::EC_P384),
            stranger: id("stranger", pki::EC_P256),
            dir,
            _tmp: tmp,
        }
    })
}

/// A fresh path in the fixture directory.
fn tmp(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    fx().dir
        .join(format!("{tag}-{}", N.fetch_add(1, Ordering::Relaxed)))
}

/// A new file holding `data`.
fn file_with(data: &[u8]) -> PathBuf {
    let path = tmp("file");
    fs::write(&path, data).unwrap();
    path
}

/// `TOOL [fsverity] sign FILE SIG --key --cert OPTS`; returns (stdout, signature bytes).
fn sign_with(tool: &str, file: &Path, id: &Ident, opts: &[&str]) -> (String, Vec<u8>, PathBuf) {
    let sig = tmp("sig");
    let mut args = vec![];
    if tool == DMKIT {
        args.push("fsverity");
    }
    args.extend([
        "sign",
        p(file),
        p(&sig),
        "--key",
        p(&id.key),
        "--cert",
        p(&id.cert),
    ]);
    args.extend(opts);
    let out = ok(tool, &args);
    let bytes = fs::read(&sig).unwrap();
    (out, bytes, sig)
}

/// `dmkit fsverity ARGS...`.
fn fsverity(args: &[&str]) -> Run {
    let mut a = vec!["fsverity"];
    a.extend(args);
    text(DMKIT, &a)
}

/// `dmkit fsverity verify-sig ARGS...`.
fn verify_sig(args: &[&str]) -> Run {
    let mut a = vec!["verify-sig"];
    a.extend(args);
    fsverity(&a)
}

/// The formatted digest a built-in signature signs, in a file (as fsverity-utils computes it).
fn formatted_digest_file(file: &Path, opts: &[&str]) -> PathBuf {
    let mut args = vec!["digest", p(file), "--for-builtin-sig", "--compact"];
    args.extend(opts);
    let hexd = ok("fsverity", &args);
    let path = tmp("formatted");
    fs::write(&path, hex::decode(hexd.trim()).unwrap()).unwrap();
    path
}

/// The OBJECT identifiers of a DER structure in order, as `openssl asn1parse` names them.
fn object_ids(der: &Path) -> Vec<String> {
    ok("openssl", &["asn1parse", "-inform", "der", "-in", p(der)])
        .lines()
        .filter_map(|l| {
            l.split_once("prim: OBJECT")
                .map(|(_, r)| r.trim().trim_start_matches(':').to_string())
        })
        .collect()
}

/// The certificate's serial as `openssl x509 -serial` prints it.
fn serial(cert: &Path) -> String {
    ok("openssl", &["x509", "-noout", "-serial", "-in", p(cert)])
        .trim()
        .trim_start_matches("serial=")
        .to_string()
}

/// Asserts a failed `dmkit` run: exit `code`, exactly one line on stderr starting `dmkit: `
/// and naming every one of `names`, nothing on stdout.
fn assert_refused(r: &Run, code: i32, names: &[&str], what: &str) {
    let (out, err) = (&r.stdout, &r.stderr);
    assert_eq!(r.code, Some(code), "{what}: {}", r.describe());
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err:?}");
    assert!(err.starts_with("dmkit: "), "{what}: {err:?}");
    assert!(!err.contains("panicked"), "{what}: {err:?}");
    for n in names {
        assert!(err.contains(n), "{what}: {n:?} not named in {err:?}");
    }
    assert!(out.is_empty(), "{what}: stdout {out:?}");
}

#[test]
fn rsa_signatures_equal_fsverity_sign() {
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let tree_opts: [&[&str]; 4] = [
        &["--hash-alg=sha256"],
        &["--hash-alg=sha512"],
        &["--hash-alg=sha256", "--block-size=1024", "--salt=a5"],
        &["--hash-alg=sha512", "--block-size=65536", "--salt=00112233"],
    ];
    let mut checked = 0;
    for id in [&f.rsa2048, &f.rsa4096] {
        for (i, size) in [0usize, 1, 5000, 100_000].into_iter().enumerate() {
            let file = file_with(&bytes(i as u64 + 40, size));
            for opts in tree_opts {
                let (out_t, theirs, _) = sign_with("fsverity", &file, id, opts);
                let (out_o, ours, _) = sign_with(DMKIT, &file, id, opts);
                assert_eq!(out_o, out_t, "{} size {size} {opts:?}", id.name);
                assert_eq!(ours, theirs, "{} size {size} {opts:?}", id.name);
                checked += 1;
            }
        }
    }
    // DER key and certificate (fsverity-utils takes PEM only): the same bytes.
    let id = &f.rsa2048;
    let key_der = tmp("key.der");
    openssl_ok(&[
        "pkey",
        "-in",
        p(&id.key),
        "-outform",
        "der",
        "-out",
        p(&key_der),
    ]);
    let file = file_with(b"DER key and certificate");
    let der_ident = Ident {
        key: key_der,
        cert: id.cert_der.clone(),
        ..id.clone()
    };
    assert_eq!(
        sign_with(DMKIT, &file, &der_ident, &[]).1,
        sign_with("fsverity", &file, id, &[]).1
    );
    eprintln!("{checked} RSA signatures identical to fsverity-utils'");
}

#[test]
fn ecdsa_signatures_verify_with_openssl_and_dmkit() {
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let file = file_with(&bytes(5, 12345));
    for id in [&f.p256, &f.p384] {
        for alg in ["sha256", "sha512"] {
            let opts = [&*format!("--hash-alg={alg}")];
            let (out_o, ours, sig) = sign_with(DMKIT, &file, id, &opts);
            let (out_t, _, theirs) = sign_with("fsverity", &file, id, &opts);
            let ctx = format!("{} {alg}", id.name);
            assert_eq!(out_o, out_t, "{ctx}");
            // fsverity-utils' structure: the file's hash as the PKCS#7 digest algorithm,
            // ecdsa-with-<hash>, no certificates, no signed attributes.
            let oids = object_ids(&sig);
            assert_eq!(oids, object_ids(&theirs), "{ctx}");
            let ecdsa_alg = format!("ecdsa-with-{}", alg.to_uppercase());
            let expected = [
                "pkcs7-signedData",
                alg,
                "pkcs7-data",
                "commonName",
                "organizationName",
                alg,
                &ecdsa_alg,
            ];
            assert_eq!(oids, expected, "{ctx}");
            // ECDSA is randomized.
            assert_ne!(ours, fs::read(&theirs).unwrap(), "{ctx}");
            // openssl verifies it over the formatted digest, and only by its signer.
            let content = formatted_digest_file(&file, &opts);
            assert!(pki::smime_verifies(&sig, &content, &id.cert), "{ctx}");
            assert!(
                !pki::smime_verifies(&sig, &content, &f.stranger.cert),
                "{ctx}"
            );
            let other = formatted_digest_file(&file_with(b"other"), &opts);
            assert!(!pki::smime_verifies(&sig, &other, &id.cert), "{ctx}");
            // And dmkit.
            let out = verify_sig(&[p(&file), p(&sig), "--cert", p(&id.cert), opts[0]])
                .ok()
                .stdout;
            let digest_line = ok("fsverity", &["digest", p(&file), opts[0]]);
            assert!(out.starts_with(&digest_line), "{ctx}: {out}");
        }
    }
}

#[test]
fn fsverity_utils_signatures_verify_with_dmkit() {
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let file = file_with(&bytes(7, 70_000));
    let tree_opts: [&[&str]; 3] = [
        &[],
        &["--hash-alg=sha512"],
        &["--hash-alg=sha256", "--block-size=1024", "--salt=0102"],
    ];
    // A PEM bundle with the stranger first.
    let bundle = tmp("bundle.pem");
    let mut text = fs::read(&f.stranger.cert).unwrap();
    for id in [&f.rsa2048, &f.rsa4096, &f.p256, &f.p384] {
        text.extend(fs::read(&id.cert).unwrap());
    }
    fs::write(&bundle, text).unwrap();
    for id in [&f.rsa2048, &f.rsa4096, &f.p256, &f.p384] {
        for opts in tree_opts {
            let (_, _, sig) = sign_with("fsverity", &file, id, opts);
            let ctx = format!("{} {opts:?}", id.name);
            let mut digest_args = vec!["digest", p(&file)];
            digest_args.extend(opts);
            let digest_line = ok("fsverity", &digest_args);
            let signer_line = format!(
                "Signature '{}' verifies: signed by CN={}, O=dmkit test (serial {})\n",
                p(&sig),
                id.name,
                serial(&id.cert)
            );
            let stranger = p(&f.stranger.cert);
            let cert_choices: [Vec<&str>; 4] = [
                vec!["--cert", p(&id.cert)],
                vec!["--cert", p(&id.cert_der)],
                vec!["--cert", stranger, "--cert", p(&id.cert)],
                vec!["--cert", p(&bundle)],
            ];
            for certs in &cert_choices {
                let mut args = vec![p(&file), p(&sig)];
                args.extend(certs);
                args.extend(opts);
                let out = verify_sig(&args).ok().stdout;
                assert_eq!(
                    out,
                    format!("{digest_line}{signer_line}"),
                    "{ctx} {certs:?}"
                );
            }
            // Without the file, from the digest fsverity-utils printed.
            let digest = digest_line.split_whitespace().next().unwrap();
            let out = verify_sig(&[p(&sig), "--digest", digest, "--cert", p(&id.cert)])
                .ok()
                .stdout;
            assert_eq!(out, format!("{digest}\n{signer_line}"), "{ctx} --digest");
        }
    }
}

#[test]
fn verify_sig_refuses_what_the_kernel_would() {
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let id = &f.p256;
    let file = file_with(&bytes(11, 20_000));
    let other_file = file_with(&bytes(12, 20_000));
    let (fp, cert) = (p(&file), p(&id.cert));
    let (_, good, sig) = sign_with("fsverity", &file, id, &[]);
    let sp = p(&sig);

    // Well formed but not verifying: exit 2.
    let r = verify_sig(&[fp, sp, "--cert", p(&f.stranger.cert)]);
    assert_refused(&r, 2, &[sp, fp, "does not verify"], "wrong certificate");
    let (_, _, other_sig) = sign_with("fsverity", &other_file, id, &[]);
    let r = verify_sig(&[fp, p(&other_sig), "--cert", cert]);
    assert_refused(
        &r,
        2,
        &[p(&other_sig), fp, "does not verify"],
        "other file's signature",
    );
    let (_, _, sig512) = sign_with("fsverity", &file, id, &["--hash-alg=sha512"]);
    let r = verify_sig(&[fp, p(&sig512), "--cert", cert]);
    assert_refused(
        &r,
        2,
        &[
            p(&sig512),
            fp,
            "over the sha512 fs-verity digest",
            "--hash-alg=sha512",
        ],
        "signature over the SHA-512 digest",
    );
    let (_, _, salted) = sign_with("fsverity", &file, id, &["--salt=01"]);
    let r = verify_sig(&[fp, p(&salted), "--cert", cert]);
    assert_refused(
        &r,
        2,
        &[p(&salted), "does not verify"],
        "signature with a salt",
    );
    let other_digest = ok("fsverity", &["digest", p(&other_file), "--compact"]);
    let r = verify_sig(&[sp, "--digest", other_digest.trim(), "--cert", cert]);
    assert_refused(
        &r,
        2,
        &[sp, other_digest.trim()],
        "--digest of another file",
    );
    // The signature's list of digest algorithms names one OpenSSL does not know (the first
    // SHA-256 OID, 2.16.840.1.101.3.4.2.1, made 2.16.840.1.101.3.3.2.1).
    let sha256_oid = [0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
    let at = good
        .windows(sha256_oid.len())
        .position(|w| w == sha256_oid)
        .expect("the signature names SHA-256");
    let mut unknown = good.clone();
    unknown[at + 6] = 0x03;
    let unknown_sig = tmp("unknown-digest");
    fs::write(&unknown_sig, &unknown).unwrap();
    let r = verify_sig(&[fp, p(&unknown_sig), "--cert", cert]);
    assert_refused(
        &r,
        2,
        &[p(&unknown_sig), "2.16.840.1.101.3.3.2.1", "does not check"],
        "unknown digest algorithm",
    );

    // Unusable signatures: exit 1.
    let write = |tag: &str, data: &[u8]| {
        let path = tmp(tag);
        fs::write(&path, data).unwrap();
        path
    };
    let mut cases: Vec<(PathBuf, &str)> = vec![
        (write("empty", b""), "empty"),
        (write("garbage", b"not a signature at all\n\x00\x01"), "DER"),
        (
            write("der-garbage", &[0x30, 0x03, 0x02, 0x01, 0x05]),
            "PKCS#7",
        ),
        (
            write("trailing", &[&good[..], b"junk"].concat()),
            "trailing",
        ),
    ];
    for cut in [1, 2, 10, good.len() / 2, good.len() - 1] {
        cases.push((write("cut", &good[..cut]), "DER"));
    }
    let pem = tmp("sig.pem");
    openssl_ok(&["pkcs7", "-inform", "der", "-in", sp, "-out", p(&pem)]);
    cases.push((pem, "PEM"));
    let attached = tmp("attached");
    let content = formatted_digest_file(&file, &[]);
    openssl_ok(&[
        "smime",
        "-sign",
        "-binary",
        "-nodetach",
        "-noattr",
        "-outform",
        "der",
        "-in",
        p(&content),
        "-inkey",
        p(&id.key),
        "-signer",
        cert,
        "-out",
        p(&attached),
    ]);
    cases.push((attached, "embeds its content"));
    cases.push((f.dir.join("no-such.sig"), "cannot read signature"));
    for (bad, words) in &cases {
        let r = verify_sig(&[fp, p(bad), "--cert", cert]);
        assert_refused(&r, 1, &[p(bad), words], words);
    }

    // Unusable files, certificates and options: exit 1.
    let r = verify_sig(&[p(&f.dir.join("no-such-file")), sp, "--cert", cert]);
    assert_refused(&r, 1, &["no-such-file"], "missing file");
    let garbage_cert = write(
        "garbage.crt",
        b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n",
    );
    let r = verify_sig(&[fp, sp, "--cert", p(&garbage_cert)]);
    assert_refused(
        &r,
        1,
        &[p(&garbage_cert), "certificate"],
        "garbage certificate",
    );
    let r = verify_sig(&[fp, sp, "--cert", p(&f.dir.join("no-such.crt"))]);
    assert_refused(&r, 1, &["no-such.crt"], "missing certificate");
    for (digest, words) in [
        ("sha256:zz", "hex"),
        ("sha1:00", "sha1"),
        ("sha512:00", "64 bytes"),
    ] {
        let r = verify_sig(&[sp, "--digest", digest, "--cert", cert]);
        assert_refused(&r, 1, &[digest, words], digest);
    }
    let r = verify_sig(&[fp, sp, "--digest", other_digest.trim(), "--cert", cert]);
    assert_refused(&r, 1, &["--digest"], "--digest with FILE");
    let r = verify_sig(&[fp, sp]);
    assert_refused(&r, 1, &["--cert"], "no certificate");
}

#[test]
fn sign_refuses_bad_keys_and_writes_nothing() {
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let file = file_with(b"to be signed");
    let enc = tmp("enc.key");
    openssl_ok(&[
        "pkey",
        "-in",
        p(&f.p256.key),
        "-aes256",
        "-passout",
        "pass:x",
        "-out",
        p(&enc),
    ]);
    let garbage = tmp("garbage");
    fs::write(&garbage, b"garbage").unwrap();
    for (key, cert, words) in [
        (&f.p256.key, &f.rsa2048.cert, "no certificate matches"),
        (&enc, &f.p256.cert, "passphrase"),
        (&garbage, &f.p256.cert, "not a usable private key"),
        (&f.p256.key, &garbage, "not a PEM or DER X.509 certificate"),
    ] {
        let sig = tmp("sig");
        let r = fsverity(&[
            "sign",
            p(&file),
            p(&sig),
            "--key",
            p(key),
            "--cert",
            p(cert),
        ]);
        assert_refused(&r, 1, &[words], words);
        assert!(!sig.exists(), "{words}: a signature file was written");
    }
}

/// errno names and fsverity-utils' strerror text for "no fs-verity here".
const UNSUPPORTED: [(&str, &str); 2] = [
    ("EOPNOTSUPP", "Operation not supported"),
    ("ENOTTY", "Inappropriate ioctl for device"),
];

#[test]
fn enable_and_measure_where_the_kernel_has_no_fs_verity() {
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let data = bytes(21, 10_000);
    let (ours, theirs) = (file_with(&data), file_with(&data));
    let t = text("fsverity", &["enable", p(&theirs)]);
    if t.code == Some(0) {
        // This kernel and filesystem have fs-verity: dmkit enables and measures as fsverity
        // does (the guest test checks this in depth).
        ok(DMKIT, &["fsverity", "enable", p(&ours)]);
        let m = ok(DMKIT, &["fsverity", "measure", p(&ours)]);
        let want = ok("fsverity", &["measure", p(&ours)]);
        assert_eq!(m, want);
        return;
    }
    let (errno, _) = UNSUPPORTED
        .iter()
        .find(|(_, strerror)| t.stderr.contains(strerror))
        .unwrap_or_else(|| panic!("fsverity enable failed otherwise: {}", t.describe()));
    let (_, _, sig) = sign_with(DMKIT, &ours, &f.rsa2048, &[]);
    let cmds: [&[&str]; 5] = [
        &["enable", p(&ours)],
        &[
            "enable",
            p(&ours),
            "--hash-alg=sha512",
            "--block-size=1024",
            "--salt=aa",
        ],
        &["measure", p(&ours)],
        &["dump-metadata", "descriptor", p(&ours)],
        &[
            "dump_metadata",
            "merkle_tree",
            p(&ours),
            "--offset=0",
            "--length=10",
        ],
    ];
    for cmd in cmds {
        let r = fsverity(cmd);
        let want = format!(
            "dmkit: {}: this kernel or filesystem does not support fs-verity ({errno})\n",
            p(&ours)
        );
        assert_refused(&r, 1, &[], &format!("{cmd:?}"));
        assert_eq!(r.stderr, want, "{cmd:?}");
    }
    // With a signature: the same, and the kernel may also lack built-in signatures.
    let r = fsverity(&["enable", p(&ours), "--signature", p(&sig)]);
    assert_refused(&r, 1, &[], "enable --signature");
    assert!(
        r.stderr.starts_with(&format!(
            "dmkit: {}: this kernel or filesystem does not support fs-verity",
            p(&ours)
        )),
        "{}",
        r.describe()
    );
    assert_eq!(fs::read(&ours).unwrap(), data, "the file changed");

    // Bad input before any ioctl.
    let empty = file_with(b"");
    let missing = f.dir.join("no-such-file");
    for (cmd, names) in [
        (
            vec!["enable", p(&ours), "--signature", p(&empty)],
            vec![p(&empty), "empty"],
        ),
        (
            vec!["enable", p(&ours), "--signature", p(&missing)],
            vec![p(&missing)],
        ),
        (vec!["enable", p(&missing)], vec![p(&missing)]),
        (
            vec!["enable", p(&f.dir)],
            vec![p(&f.dir), "not a regular file"],
        ),
        (
            vec!["enable", p(&ours), "--block-size=512"],
            vec!["block size 512"],
        ),
        (vec!["measure", p(&missing)], vec![p(&missing)]),
        (
            vec!["dump-metadata", "tree", p(&ours)],
            vec!["tree", "merkle_tree"],
        ),
        (
            vec!["dump-metadata", "descriptor", p(&ours), "--offset=5"],
            vec!["--length"],
        ),
    ] {
        let r = fsverity(&cmd);
        assert_refused(&r, 1, &names, &format!("{cmd:?}"));
    }
}

#[test]
fn generic_detached_signatures_for_any_message() {
    use dmkit::hash::HashAlgorithm;
    use dmkit::sig::{
        sign_detached, verify_detached, verify_detached_der, Message, SignatureError,
    };
    if prerequisites_missing() {
        return;
    }
    let f = fx();
    let text = b"path=a/b size=3 mode=0644 digest=sha256:00\n";
    let message = Message::new(text, "manifest m.txt");
    let content = file_with(text);
    for (digest, md) in [
        (HashAlgorithm::Sha256, "sha256"),
        (HashAlgorithm::Sha512, "sha512"),
    ] {
        // RSA: the bytes of `openssl smime -sign -md`.
        let ours = sign_detached(&message, &f.rsa2048.key, &f.rsa2048.cert, digest).unwrap();
        let theirs = tmp("smime.sig");
        openssl_ok(&[
            "smime",
            "-sign",
            "-binary",
            "-noattr",
            "-nocerts",
            "-outform",
            "der",
            "-md",
            md,
            "-in",
            p(&content),
            "-inkey",
            p(&f.rsa2048.key),
            "-signer",
            p(&f.rsa2048.cert),
            "-out",
            p(&theirs),
        ]);
        assert_eq!(ours, fs::read(&theirs).unwrap(), "{md}");
        // ECDSA: verifies with openssl and with ourselves, from a file or from memory.
        let ec = sign_detached(&message, &f.p384.key, &f.p384.cert, digest).unwrap();
        let ec_sig = file_with(&ec);
        assert!(pki::smime_verifies(&ec_sig, &content, &f.p384.cert), "{md}");
        let certs = [f.p384.cert.clone()];
        let who = verify_detached(&message, &ec_sig, &certs).unwrap();
        assert_eq!(who.subject, "CN=p384, O=dmkit test");
        let name = Path::new("m.txt.sig");
        verify_detached_der(&message, &ec, name, &certs).unwrap();
        // Another message: refused, naming the caller's description, never a root hash.
        let other = Message::new(b"path=a/b size=4", "manifest m.txt");
        let err = verify_detached_der(&other, &ec, name, &certs).unwrap_err();
        assert!(matches!(err, SignatureError::NotVerified { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("m.txt.sig: signature does not verify over manifest m.txt"),
            "{msg}"
        );
        assert!(!msg.contains("root hash"), "{msg}");
        let err = verify_detached_der(&message, &ec[..ec.len() - 3], name, &certs).unwrap_err();
        assert!(
            matches!(err, SignatureError::SignatureGarbled { .. }),
            "{err}"
        );
        assert!(err.to_string().starts_with("m.txt.sig: "), "{err}");
    }
    let err =
        sign_detached(&message, &f.p384.key, &f.p256.cert, HashAlgorithm::Sha256).unwrap_err();
    assert!(
        matches!(err, SignatureError::KeyCertificateMismatch { .. }),
        "{err}"
    );
}
