//! The NBD server end to end, with the real clients: qemu-img (info, compare, convert),
//! qemu-io (patterns, FUA, write-zeroes, discard), nbdinfo, nbdcopy and nbdfuse, over Unix
//! sockets and over TCP with TLS (X.509 with client certificates, and PSK); verity read-only
//! with a corrupt block reaching the client as an NBD error; LUKS2 and LUKS1 read-write, the
//! data written over NBD read back after a reopen and by QEMU's own LUKS driver; and clients
//! that send garbage, lie about lengths, hang up mid-request, hold connections or never finish
//! the handshake.
//!
//! `--no-fuse` exports need neither root nor FUSE; tests that also use the FUSE file, nbdfuse
//! or loop devices check for them. Tools come from libnbd-bin, nbdfuse and qemu-utils.

mod common;

use common::env::{fuse_missing, tool_missing};
use common::nbd::{self, Client};
use common::pki;
use common::rng::bytes;
use common::run::{self, Workspace};
use serde_json::Value;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Whether any of the clients (tool, package) is missing; reported through `tool_missing`.
fn clients_missing(tools: &[(&str, &str)]) -> bool {
    tools.iter().any(|(t, p)| tool_missing(t, p))
}

const NBDINFO: (&str, &str) = ("nbdinfo", "libnbd-bin");
const NBDCOPY: (&str, &str) = ("nbdcopy", "libnbd-bin");
const QEMU_IMG: (&str, &str) = ("qemu-img", "qemu-utils");
const QEMU_IO: (&str, &str) = ("qemu-io", "qemu-utils");

/// A workspace with helpers to open NBD exports.
struct Env(Workspace);

impl std::ops::Deref for Env {
    type Target = Workspace;
    fn deref(&self) -> &Workspace {
        &self.0
    }
}

impl Env {
    fn new() -> Env {
        Env(Workspace::new())
    }

    /// `unix:DIR/NAME.sock`, and the socket's path.
    fn unix(&self, name: &str) -> (String, PathBuf) {
        let p = self.path(&format!("{name}.sock"));
        (format!("unix:{}", p.display()), p)
    }

    /// `dmkit ARGS...` (an open of NAME), which must succeed; returns the URI it printed last.
    fn open(&self, name: &str, args: &[&str]) -> String {
        let out = self.run.ok(args);
        self.run.track(name);
        let uri = out.lines().last().unwrap_or_default().to_string();
        assert!(uri.starts_with("nbd"), "no NBD URI printed: {out:?}");
        uri
    }

    fn status(&self, name: &str) -> Value {
        serde_json::from_str(&self.run.ok(&["status", name, "--json"])).unwrap()
    }

    /// A file of `len` pseudo-random bytes, and a copy of it to compare against.
    fn random_file(&self, name: &str, len: usize, seed: u64) -> Vec<u8> {
        let data = bytes(seed, len);
        fs::write(self.path(name), &data).unwrap();
        fs::write(self.path(&format!("{name}.orig")), &data).unwrap();
        data
    }
}

/// `nbdinfo --json URI`'s export.
fn nbdinfo(uri: &str) -> Value {
    // --no-content: nbdinfo would describe the first sector with file(1), and prints raw bytes
    // where file(1) is not installed.
    let out = run::ok("nbdinfo", &["--json", "--no-content", uri]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["exports"][0].clone()
}

/// `qemu-io -f raw [extra...] -c CMD... URI`, which must succeed (a failed pattern check
/// fails the run).
fn qemu_io(uri: &str, extra: &[&str], cmds: &[&str]) -> String {
    let mut args: Vec<&str> = vec!["-f", "raw"];
    args.extend_from_slice(extra);
    for c in cmds {
        args.extend_from_slice(&["-c", c]);
    }
    args.push(uri);
    let out = run::ok("qemu-io", &args);
    assert!(!out.contains("failed"), "qemu-io: {out}");
    out
}

/// `qemu-io` that must fail; returns stdout and stderr together.
fn qemu_io_fails(uri: &str, extra: &[&str], cmds: &[&str]) -> String {
    let mut args: Vec<&str> = vec!["-f", "raw"];
    args.extend_from_slice(extra);
    for c in cmds {
        args.extend_from_slice(&["-c", c]);
    }
    args.push(uri);
    let out = run::output("qemu-io", &args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "qemu-io succeeded: {text}");
    text
}

fn assert_same(a: &Path, b: &Path) {
    let (x, y) = (fs::read(a).unwrap(), fs::read(b).unwrap());
    assert!(x == y, "{} and {} differ", a.display(), b.display());
}

#[test]
fn linear_serves_real_clients_over_a_unix_socket() {
    if clients_missing(&[NBDINFO, NBDCOPY, QEMU_IMG, QEMU_IO]) {
        return;
    }
    let e = Env::new();
    let size = 8 << 20;
    let mut want = e.random_file("disk.img", size, 1);
    let (addr, sock) = e.unix("lin");
    let disk = e.s("disk.img");
    let uri = e.open(
        "lin",
        &["linear", "open", &disk, "lin", "--no-fuse", "--nbd", &addr],
    );
    assert_eq!(uri, format!("nbd+unix:///lin?socket={}", sock.display()));
    assert!(!e.run.path().join("lin").exists(), "--no-fuse made a file");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let x = nbdinfo(&uri);
    assert_eq!(x["export-size"], size);
    assert_eq!(x["export-name"], "lin");
    assert_eq!(x["description"], "dmkit linear device lin");
    for (k, v) in [
        ("is_read_only", false),
        ("can_flush", true),
        ("can_fua", true),
        ("can_multi_conn", true),
        ("can_zero", true),
        ("can_fast_zero", true),
        ("can_trim", false),
    ] {
        assert_eq!(x[k], v, "{k}: {x}");
    }
    assert_eq!(x["block_size_minimum"], 512);
    assert_eq!(x["block_size_preferred"], 4096);
    assert_eq!(x["block_size_maximum"], 32 << 20);
    let list = run::ok("nbdinfo", &["--list", "--no-content", &uri]);
    assert!(list.contains("export=\"lin\""), "{list}");

    let info = run::ok("qemu-img", &["info", "--output=json", &uri]);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["virtual-size"], size);
    let orig = e.s("disk.img.orig");
    run::ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &orig, &uri],
    );

    // Patterns, FUA, write-zeroes (with and without fallback), flush: read back over NBD.
    qemu_io(
        &uri,
        &[],
        &[
            "write -P 0xab 1M 64k",
            "write -f -P 0xcd 2M 4k",
            "write -P 0xef 3000 1000",
            "write -z 3M 1M",
            "write -z -n 5M 64k",
            "flush",
            "read -P 0xab 1M 64k",
            "read -P 0xcd 2M 4k",
            "read -P 0xef 3000 1000",
            "read -P 0 3M 1M",
            "read -P 0 5M 64k",
        ],
    );
    want[1 << 20..(1 << 20) + (64 << 10)].fill(0xab);
    want[2 << 20..(2 << 20) + 4096].fill(0xcd);
    want[3000..4000].fill(0xef);
    want[3 << 20..4 << 20].fill(0);
    want[5 << 20..(5 << 20) + (64 << 10)].fill(0);
    assert!(
        fs::read(&disk).unwrap() == want,
        "the backing file does not hold the writes"
    );

    // Copies by libnbd (several connections) and by qemu.
    let copy = e.s("copy.img");
    run::ok("nbdcopy", &[&uri, &copy]);
    assert_same(Path::new(&copy), Path::new(&disk));
    let conv = e.s("conv.img");
    run::ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, &conv],
    );
    assert_same(Path::new(&conv), Path::new(&disk));
    // And back in: a new image written over several connections at once.
    let src = e.path("src.img");
    fs::write(&src, bytes(9, size)).unwrap();
    run::ok("nbdcopy", &["--connections=4", src.to_str().unwrap(), &uri]);
    assert_same(&src, Path::new(&disk));

    let st = e.status("lin");
    let n = &st["nbd"];
    assert_eq!(n["uri"], uri.as_str());
    assert_eq!(n["tls"], "none");
    assert!(n["clients"].as_array().unwrap().is_empty(), "{n}");
    assert!(n["connections"].as_u64().unwrap() >= 8, "{n}");
    assert!(
        n["totals"]["bytes_written"].as_u64().unwrap() >= (size as u64),
        "{n}"
    );
    assert_eq!(n["totals"]["io_errors"], 0);
    let text = e.run.ok(&["status", "lin"]);
    assert!(text.starts_with(&format!("{uri} is active.")), "{text}");
    assert!(
        text.contains("nbd clients:") && text.contains("0 of 16"),
        "{text}"
    );
    e.run.close("lin");
    assert!(!sock.exists(), "the socket outlived the device");
}

#[test]
fn trim_only_where_discards_are_allowed() {
    if clients_missing(&[NBDINFO, QEMU_IO]) {
        return;
    }
    let e = Env::new();
    let mut want = e.random_file("disk.img", 4 << 20, 2);
    let (addr, _) = e.unix("d");
    let disk = e.s("disk.img");
    let uri = e.open(
        "d",
        &[
            "linear",
            "open",
            &disk,
            "d",
            "--no-fuse",
            "--nbd",
            &addr,
            "--allow-discards",
        ],
    );
    assert_eq!(nbdinfo(&uri)["can_trim"], true);
    qemu_io(&uri, &[], &["discard 1M 1M", "read -P 0 1M 1M"]);
    want[1 << 20..2 << 20].fill(0);
    assert!(fs::read(&disk).unwrap() == want);
    let st = e.status("d");
    assert!(st["nbd"]["totals"]["requests"].as_u64().unwrap() >= 2);
}

/// A 4 MiB verity data file, its hash tree, and the root hash.
fn verity_image(e: &Env) -> (String, String, String) {
    e.random_file("data.img", 4 << 20, 3);
    let (data, hash) = (e.s("data.img"), e.s("hash.img"));
    let j: Value =
        serde_json::from_str(&e.run.ok(&["verity", "format", "--json", &data, &hash])).unwrap();
    (data, hash, j["root_hash"].as_str().unwrap().to_string())
}

#[test]
fn verity_is_read_only_and_a_corrupt_block_is_an_nbd_error() {
    if clients_missing(&[NBDINFO, NBDCOPY, QEMU_IMG, QEMU_IO]) {
        return;
    }
    let e = Env::new();
    let (data, hash, root) = verity_image(&e);
    let (addr, sock) = e.unix("v");
    let open = [
        "verity",
        "open",
        &data,
        "v",
        &hash,
        &root,
        "--no-fuse",
        "--nbd",
        &addr,
    ];
    let uri = e.open("v", &open);
    let x = nbdinfo(&uri);
    assert_eq!(x["is_read_only"], true);
    assert_eq!(x["can_zero"], false);
    assert_eq!(x["can_trim"], false);
    assert_eq!(x["block_size_minimum"], 4096);
    run::ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &e.s("data.img.orig"),
            &uri,
        ],
    );
    // qemu refuses to open a read-only export for writing; a client that writes anyway gets
    // EPERM and keeps its connection.
    qemu_io_fails(&uri, &[], &["write -P 1 0 4k"]);
    let mut c = Client::connect(&sock).unwrap();
    assert_eq!(c.write(0, &[1; 4096], false), Err(nbd::EPERM));
    assert_eq!(c.read(0, 4096).unwrap(), fs::read(&data).unwrap()[..4096]);
    c.disconnect();
    e.run.close("v");

    // One flipped byte in data block 5: its reads fail, the others do not.
    common::xor_byte(Path::new(&data), 5 * 4096 + 17, 0x40);
    let uri = e.open("v", &open);
    qemu_io(&uri, &["-r"], &["read 0 20k", "read 24k 64k"]);
    let err = qemu_io_fails(&uri, &["-r"], &["read 20k 4k"]);
    assert!(err.contains("Input/output error"), "{err}");
    let out = run::output("nbdcopy", &[&uri, &e.s("copy.img")]);
    assert!(!out.status.success(), "nbdcopy copied a corrupt image");
    let mut c = Client::connect(&sock).unwrap();
    let (errno, msg) = c.read(5 * 4096, 4096).unwrap_err();
    assert_eq!(errno, nbd::EIO);
    assert_eq!(msg, "data block 5 is corrupted");
    assert!(
        c.read(6 * 4096, 4096).is_ok(),
        "the connection survives the error"
    );
    c.disconnect();
    let st = e.status("v");
    assert!(
        st["nbd"]["totals"]["corruptions"].as_u64().unwrap() >= 3,
        "{}",
        st["nbd"]
    );
    let log = fs::read_to_string(st["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("data block 5 is corrupted"), "{log}");
}

/// A 32 MiB LUKS2 image (16 MiB of data) with a cheap keyslot, and its passphrase file.
fn luks2(e: &Env) -> (String, String) {
    e.luks2_cheap("luks.img", 32 << 20, "nbd passphrase")
}

#[test]
fn luks2_written_over_nbd_reads_back_after_reopening() {
    if clients_missing(&[NBDINFO, QEMU_IO]) {
        return;
    }
    let e = Env::new();
    let (img, pass) = luks2(&e);
    let (addr, sock) = e.unix("sec");
    let open = [
        "luks",
        "open",
        &img,
        "sec",
        "--key-file",
        &pass,
        "--no-fuse",
        "--nbd",
        &addr,
    ];
    let uri = e.open("sec", &open);
    let x = nbdinfo(&uri);
    assert_eq!(x["is_read_only"], false);
    assert_eq!(x["can_trim"], false, "no discards without --allow-discards");
    let size = x["export-size"].as_u64().unwrap();
    qemu_io(
        &uri,
        &[],
        &[
            "write -f -P 0x5a 0 64k",
            "write -P 0xa5 1M 1M",
            "write -P 0x3c 123456 789",
            "write -z 2M 64k",
            "flush",
        ],
    );
    // A second connection sees the first one's writes (one device behind every connection).
    let mut c = Client::connect(&sock).unwrap();
    assert_eq!(c.read(0, 4096).unwrap(), vec![0x5a; 4096]);
    c.write(size - 4096, &[0x77; 4096], true).unwrap();
    c.disconnect();
    e.run.close("sec");
    // The ciphertext does not hold the plaintext.
    let raw = fs::read(&img).unwrap();
    assert!(
        !raw.windows(64).any(|w| w == [0xa5; 64]),
        "plaintext on disk"
    );

    // Reopened (NBD only again): everything reads back.
    let uri = e.open("sec", &open);
    qemu_io(
        &uri,
        &["-r"],
        &[
            "read -P 0x5a 0 64k",
            "read -P 0xa5 1M 1M",
            "read -P 0x3c 123456 789",
            "read -P 0 2M 64k",
            &format!("read -P 0x77 {} 4k", size - 4096),
        ],
    );
    e.run.close("sec");
    if fuse_missing() {
        return;
    }
    // And through the FUSE file of a plain reopen.
    let out = e
        .run
        .ok(&["luks", "open", &img, "sec", "--key-file", &pass]);
    e.run.track("sec");
    let file = PathBuf::from(out.lines().next().unwrap());
    let got = fs::read(&file).unwrap();
    assert!(got[..64 << 10].iter().all(|&b| b == 0x5a));
    assert!(got[1 << 20..2 << 20].iter().all(|&b| b == 0xa5));
    assert!(got[2 << 20..(2 << 20) + (64 << 10)].iter().all(|&b| b == 0));
    e.run.close("sec");
}

#[test]
fn luks1_written_over_nbd_is_what_qemus_luks_driver_reads() {
    if clients_missing(&[QEMU_IO]) {
        return;
    }
    let e = Env::new();
    // qemu's driver reads LUKS1 (its 7.2 has no LUKS2); the passphrase file is its secret.
    let secret = e.s("secret");
    fs::write(&secret, "qemu luks secret").unwrap();
    let img = e.sparse("q.img", 8 << 20);
    e.run.ok(&[
        "luks",
        "format",
        "-q",
        "--type",
        "luks1",
        "--key-file",
        &secret,
        "--pbkdf-force-iterations",
        "1000",
        &img,
    ]);
    let obj = format!("secret,id=s0,file={secret}");
    let qemu_luks = format!("driver=luks,key-secret=s0,file.filename={img}");
    let qemu = |cmds: &[&str]| {
        let mut args = vec!["--object", obj.as_str(), "--image-opts"];
        for c in cmds {
            args.extend_from_slice(&["-c", c]);
        }
        args.push(&qemu_luks);
        let out = run::ok("qemu-io", &args);
        assert!(!out.contains("failed"), "{out}");
    };
    qemu(&["write -P 0x11 4M 64k"]);
    let (addr, _) = e.unix("q");
    let uri = e.open(
        "q",
        &[
            "open",
            "--type",
            "luks1",
            &img,
            "q",
            "--key-file",
            &secret,
            "--no-fuse",
            "--nbd",
            &addr,
        ],
    );
    qemu_io(
        &uri,
        &[],
        &[
            "read -P 0x11 4M 64k",
            "write -f -P 0x22 1M 128k",
            "write -P 0x33 5M 4k",
            "flush",
        ],
    );
    e.run.close("q");
    qemu(&[
        "read -P 0x22 1M 128k",
        "read -P 0x33 5M 4k",
        "read -P 0x11 4M 64k",
    ]);
}

/// A CA, a server certificate for 127.0.0.1 it signed, and a client certificate it signed, in
/// the directories qemu (`tls-creds-x509 dir=`) and libnbd (`tls-certificates=`) read.
struct Pki {
    server: pki::Ident,
    ca: pki::Ident,
    /// ca-cert.pem, client-cert.pem, client-key.pem.
    client_dir: PathBuf,
    /// ca-cert.pem only.
    anonymous_dir: PathBuf,
}

fn make_pki(e: &Env) -> Pki {
    let d = e.path("pki");
    fs::create_dir(&d).unwrap();
    let ca = pki::make_ident(&d, "ca", "/CN=dmkit test CA", pki::EC_P256);
    let server = pki::ca_signed(
        &d,
        &ca,
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    let client = pki::ca_signed(
        &d,
        &ca,
        "client",
        "/CN=client",
        "extendedKeyUsage=clientAuth\n",
    );
    let client_dir = e.path("client-creds");
    let anonymous_dir = e.path("anon-creds");
    for dir in [&client_dir, &anonymous_dir] {
        fs::create_dir(dir).unwrap();
        fs::copy(&ca.cert, dir.join("ca-cert.pem")).unwrap();
    }
    fs::copy(&client.cert, client_dir.join("client-cert.pem")).unwrap();
    fs::copy(&client.key, client_dir.join("client-key.pem")).unwrap();
    Pki {
        server,
        ca,
        client_dir,
        anonymous_dir,
    }
}

/// The port of an `nbds://127.0.0.1:PORT/NAME` URI.
fn port(uri: &str) -> String {
    uri.rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn tls_with_x509_client_certificates_over_tcp() {
    if clients_missing(&[NBDINFO, QEMU_IMG, QEMU_IO]) {
        return;
    }
    let e = Env::new();
    e.random_file("disk.img", 4 << 20, 4);
    let p = make_pki(&e);
    let (cert, key, ca) = (
        p.server.cert.to_str().unwrap(),
        p.server.key.to_str().unwrap(),
        p.ca.cert.to_str().unwrap(),
    );
    let disk = e.s("disk.img");
    let uri = e.open(
        "t",
        &[
            "linear",
            "open",
            &disk,
            "t",
            "--no-fuse",
            "--nbd",
            "tcp:127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-ca",
            ca,
        ],
    );
    assert!(uri.starts_with("nbds://127.0.0.1:"), "{uri}");
    let creds = format!("tls-certificates={}", p.client_dir.display());
    let x = nbdinfo(&format!("{uri}?{creds}"));
    assert_eq!(x["export-size"], 4 << 20);
    // qemu with its x509 credentials: info, writes with FUA, reads back.
    let obj = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        p.client_dir.display()
    );
    let opts = format!(
        "driver=nbd,host=127.0.0.1,port={},export=t,tls-creds=tls0",
        port(&uri)
    );
    let mut args = vec!["--object", obj.as_str(), "--image-opts"];
    for c in ["write -f -P 0x42 64k 64k", "read -P 0x42 64k 64k", "flush"] {
        args.extend_from_slice(&["-c", c]);
    }
    args.push(&opts);
    let out = run::ok("qemu-io", &args);
    assert!(!out.contains("failed"), "{out}");
    assert!(fs::read(&disk).unwrap()[64 << 10..128 << 10]
        .iter()
        .all(|&b| b == 0x42));
    let info = run::ok(
        "qemu-img",
        &["info", "--object", &obj, "--image-opts", &opts],
    );
    assert!(info.contains("4 MiB"), "{info}");
    // A client in clear, or without a client certificate, is refused.
    let plain = uri.replacen("nbds://", "nbd://", 1);
    assert!(!run::output("nbdinfo", &[&plain]).status.success());
    let anon = format!("{uri}?tls-certificates={}", p.anonymous_dir.display());
    assert!(!run::output("nbdinfo", &[&anon]).status.success());
    let st = e.status("t");
    assert_eq!(st["nbd"]["tls"], "x509, client certificates required");
    let log = fs::read_to_string(st["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("TLS handshake failed"), "{log}");
}

#[test]
fn tls_with_a_pre_shared_key_over_tcp() {
    if clients_missing(&[NBDINFO, QEMU_IMG]) {
        return;
    }
    let e = Env::new();
    e.random_file("disk.img", 4 << 20, 5);
    let psk_dir = e.path("psk");
    fs::create_dir(&psk_dir).unwrap();
    let keys = psk_dir.join("keys.psk");
    fs::write(&keys, format!("alice:{}\n", hex(&bytes(6, 32)))).unwrap();
    let wrong = e.path("wrong.psk");
    fs::write(&wrong, format!("alice:{}\n", hex(&bytes(7, 32)))).unwrap();
    let disk = e.s("disk.img");
    let uri = e.open(
        "p",
        &[
            "linear",
            "open",
            &disk,
            "p",
            "--no-fuse",
            "--nbd",
            "tcp:127.0.0.1:0",
            "--tls-psk",
            keys.to_str().unwrap(),
        ],
    );
    let with_user = uri.replacen("nbds://", "nbds://alice@", 1);
    let x = nbdinfo(&format!("{with_user}?tls-psk-file={}", keys.display()));
    assert_eq!(x["export-size"], 4 << 20);
    let obj = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        psk_dir.display()
    );
    let opts = format!(
        "driver=nbd,host=127.0.0.1,port={},export=p,tls-creds=tls0",
        port(&uri)
    );
    let info = run::ok(
        "qemu-img",
        &["info", "--object", &obj, "--image-opts", &opts],
    );
    assert!(info.contains("4 MiB"), "{info}");
    let bad = format!("{with_user}?tls-psk-file={}", wrong.display());
    assert!(
        !run::output("nbdinfo", &[&bad]).status.success(),
        "a wrong key was accepted"
    );
    let bob = uri.replacen("nbds://", "nbds://bob@", 1);
    fs::write(&wrong, format!("bob:{}\n", hex(&bytes(6, 32)))).unwrap();
    let bad = format!("{bob}?tls-psk-file={}", wrong.display());
    assert!(
        !run::output("nbdinfo", &[&bad]).status.success(),
        "an unknown identity was accepted"
    );
    assert_eq!(e.status("p")["nbd"]["tls"], "psk");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn bad_nbd_options_are_refused_before_anything_is_served() {
    let e = Env::new();
    e.random_file("disk.img", 1 << 20, 8);
    let disk = e.s("disk.img");
    let missing = e.s("missing.pem");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--nbd", "tcp:0.0.0.0:0"], "needs TLS"),
        (vec!["--nbd", "udp:1"], "--nbd udp:1"),
        (
            vec![
                "--nbd",
                "tcp:127.0.0.1:0",
                "--tls-cert",
                &missing,
                "--tls-key",
                &missing,
            ],
            "missing.pem (--tls-cert)",
        ),
        (
            vec!["--nbd", "tcp:127.0.0.1:0", "--tls-psk", &disk],
            "disk.img (--tls-psk)",
        ),
        (
            vec!["--nbd", "tcp:127.0.0.1:0", "--nbd-max-connections", "0"],
            "--nbd-max-connections",
        ),
        (vec!["--no-fuse"], "--nbd"),
        (vec!["--nbd", "unix:/x", "--no-fuse", "--loop"], "--loop"),
        (vec!["--tls-psk", &disk], "--nbd"),
    ];
    for (extra, why) in cases {
        let mut args = vec!["linear", "open", &disk, "bad"];
        args.extend_from_slice(&extra);
        let r = e.run.run(&args);
        assert_eq!(r.code, Some(1), "{}", r.describe());
        assert!(r.stderr.contains(why), "{extra:?}: {}", r.describe());
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.describe());
        assert_eq!(e.run.run(&["status", "bad"]).code, Some(4));
    }
    // A socket path that is a regular file is never replaced.
    let file = e.path("taken");
    fs::write(&file, b"keep").unwrap();
    let r = e.run.run(&[
        "linear",
        "open",
        &disk,
        "bad",
        "--no-fuse",
        "--nbd",
        &format!("unix:{}", file.display()),
    ]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(r.stderr.contains("not a socket"), "{}", r.describe());
    assert_eq!(fs::read(&file).unwrap(), b"keep");
}

#[test]
fn garbage_lies_and_hangups_cannot_hurt_the_server() {
    if clients_missing(&[NBDINFO]) {
        return;
    }
    let e = Env::new();
    let data = e.random_file("disk.img", 4 << 20, 10);
    let (addr, sock) = e.unix("g");
    let disk = e.s("disk.img");
    let uri = e.open(
        "g",
        &[
            "linear",
            "open",
            &disk,
            "g",
            "--no-fuse",
            "--nbd",
            &addr,
            "--nbd-max-connections",
            "3",
        ],
    );

    // Garbage instead of the handshake.
    let mut s = nbd::raw(&sock);
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&bytes(11, 4096)).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.len() < 4096, "the server kept answering garbage");

    // Out-of-range and over-long requests are refused; the connection goes on.
    let mut c = Client::connect(&sock).unwrap();
    assert_eq!(c.read((4 << 20) - 10, 20).unwrap_err().0, nbd::EINVAL);
    assert_eq!(c.read(u64::MAX - 5, 10).unwrap_err().0, nbd::EINVAL);
    assert_eq!(c.read(0, 64 << 20).unwrap_err().0, nbd::EOVERFLOW);
    assert_eq!(c.read(0, 0).unwrap_err().0, nbd::EINVAL);
    assert_eq!(c.write((4 << 20) - 100, &[1; 200], false), Err(nbd::EINVAL));
    let cookie = c.send(9, 0, 0, 512, &[]);
    let r = c.reply().unwrap();
    assert_eq!((r.cookie, r.error), (cookie, nbd::EINVAL));
    assert_eq!(c.read(4096, 4096).unwrap(), data[4096..8192]);
    c.flush().unwrap();

    // A write that promises 1 MiB and delivers 100 bytes, then hangs up: nothing written.
    let mut liar = Client::connect(&sock).unwrap();
    liar.send(nbd::WRITE, 0, 0, 1 << 20, &[0xee; 100]);
    drop(liar);
    // A read whose reply is never read.
    let mut quitter = Client::connect(&sock).unwrap();
    quitter.send(nbd::READ, 0, 0, 16 << 20, &[]);
    drop(quitter);
    // A bad request magic ends only that connection.
    let mut bad = Client::connect(&sock).unwrap();
    bad.s.write_all(&[0xff; 28]).unwrap();
    let mut end = Vec::new();
    let _ = bad.s.read_to_end(&mut end);
    assert!(end.is_empty());

    // The cap counts connections in transmission: `c` plus two negotiated connections fill
    // it; a fourth is closed at once.
    let clients = || e.status("g")["nbd"]["clients"].as_array().unwrap().len();
    common::sys::wait_until("the misbehaving connections to end", || clients() == 1);
    let idle1 = Client::connect(&sock).unwrap();
    let idle2 = Client::connect(&sock).unwrap();
    common::sys::wait_until("the idle connections", || clients() == 3);
    let mut over = nbd::raw(&sock);
    let mut got = Vec::new();
    let _ = over.read_to_end(&mut got);
    assert!(got.is_empty(), "a connection over the cap was served");
    let st = e.status("g");
    assert!(st["nbd"]["refused"].as_u64().unwrap() >= 1, "{}", st["nbd"]);
    let peers: Vec<&str> = st["nbd"]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["peer"].as_str().unwrap())
        .collect();
    assert_eq!(peers.len(), 3, "{peers:?}");
    assert!(
        peers
            .iter()
            .all(|p| p.starts_with(&format!("pid {} ", std::process::id()))),
        "{peers:?}"
    );
    // A device with NBD clients is in use.
    let r = e.run.run(&["close", "g"]);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    assert!(
        r.stderr.contains("NBD clients are connected"),
        "{}",
        r.describe()
    );
    drop((idle1, idle2));
    c.disconnect();

    // Still serving, the file untouched.
    run::ok("nbdinfo", &["--no-content", &uri]);
    assert!(
        fs::read(&disk).unwrap() == data,
        "a refused or cut write changed the file"
    );
    let log = fs::read_to_string(e.status("g")["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("refused, 3 connections already"), "{log}");
    e.run.close("g");
}

#[test]
fn nbd_and_fuse_serve_one_device_and_nbdfuse_mounts_it() {
    if fuse_missing() || clients_missing(&[("nbdfuse", "nbdfuse"), QEMU_IO]) {
        return;
    }
    let e = Env::new();
    let data = e.random_file("disk.img", 4 << 20, 12);
    let (addr, _) = e.unix("f");
    let disk = e.s("disk.img");
    let out = e.run.ok(&["linear", "open", &disk, "f", "--nbd", &addr]);
    e.run.track("f");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let (file, uri) = (PathBuf::from(lines[0]), lines[1].to_string());
    // Written over NBD, read from the FUSE file; written to the file, read over NBD.
    qemu_io(&uri, &[], &["write -P 0x61 8k 8k"]);
    let got = fs::read(&file).unwrap();
    assert!(got[8192..16384].iter().all(|&b| b == 0x61));
    assert_eq!(got[..8192], data[..8192]);
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x62; 4096], 1 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    qemu_io(&uri, &["-r"], &["read -P 0x62 1M 4k"]);

    // nbdfuse: the export as a file of its own.
    let mnt = e.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut child = std::process::Command::new("nbdfuse")
        .args([mnt.to_str().unwrap(), &uri])
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("run nbdfuse");
    let exported = mnt.join("nbd");
    common::sys::wait_until("nbdfuse's file", || {
        fs::metadata(&exported)
            .map(|m| m.len() == 4 << 20)
            .unwrap_or(false)
    });
    let through = fs::read(&exported);
    let via_fuse = fs::read(&file).unwrap();
    run::output("fusermount3", &["-u", mnt.to_str().unwrap()]);
    let _ = child.wait();
    assert!(
        through.unwrap() == via_fuse,
        "nbdfuse reads other bytes than the FUSE file"
    );
    e.run.close("f");
}

#[test]
fn idle_handshakes_neither_lock_clients_out_nor_stay() {
    // Connections that never negotiate (a port scanner, a hostile client) take no slot of the
    // cap, so real clients get in at once however many there are; they are closed when the
    // handshake deadline (10 s) passes. Over TCP and a Unix socket.
    if clients_missing(&[NBDINFO]) {
        return;
    }
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let e = Env::new();
    e.random_file("disk.img", 1 << 20, 12);
    e.random_file("disk2.img", 1 << 20, 13);
    let disk = e.s("disk.img");
    let disk2 = e.s("disk2.img");
    let (addr, sock) = e.unix("i");
    let unix_uri = e.open(
        "i",
        &["linear", "open", &disk, "i", "--no-fuse", "--nbd", &addr],
    );
    let tcp_uri = e.open(
        "t",
        &[
            "linear",
            "open",
            &disk2,
            "t",
            "--no-fuse",
            "--nbd",
            "tcp:127.0.0.1:0",
            "--nbd-max-connections",
            "4",
        ],
    );
    let tcp_addr = format!("127.0.0.1:{}", port(&tcp_uri));
    let opened = Instant::now();
    // 40 idle connections each (the default cap is 16, the test's TCP cap 4).
    let idle_unix: Vec<_> = (0..40)
        .map(|_| {
            let s = nbd::raw(&sock);
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        })
        .collect();
    let idle_tcp: Vec<TcpStream> = (0..40)
        .map(|_| {
            let s = TcpStream::connect(&tcp_addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        })
        .collect();
    for uri in [&unix_uri, &tcp_uri] {
        let t = Instant::now();
        let info = nbdinfo(uri);
        assert_eq!(info["export-size"], 1 << 20, "{info}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{uri}: a real client waited {:?} behind idle connections",
            t.elapsed()
        );
    }
    // While they wait, `status` counts them apart from the cap.
    let text = e.run.ok(&["status", "t"]);
    let row = common::status_field(&text, "nbd clients").unwrap_or_default();
    assert!(
        row.starts_with("0 of 4 (") && row.contains(" in handshake, "),
        "{text}"
    );
    // The idle ones end: each sees its greeting, then the end of the stream, within the
    // deadline (plus slack for a loaded machine).
    let ends = |s: &mut dyn Read| {
        let mut got = Vec::new();
        let r = s.read_to_end(&mut got);
        assert!(r.is_ok(), "an idle connection was not closed: {r:?}");
        assert!(
            got.len() <= 18,
            "an idle connection got more than a greeting"
        );
    };
    for mut s in idle_unix {
        ends(&mut s);
    }
    for mut s in idle_tcp {
        ends(&mut s);
    }
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_secs(9) && waited < Duration::from_secs(20),
        "the idle connections ended after {waited:?}, not at the 10 s deadline"
    );
    for name in ["i", "t"] {
        common::sys::wait_until("the idle connections to be forgotten", || {
            e.status(name)["nbd"]["clients"].as_array().map(Vec::len) == Some(0)
        });
    }
    let log = fs::read_to_string(e.status("t")["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("did not finish the handshake in time"),
        "{log}"
    );
    e.run.close("i");
    e.run.close("t");
}
