//! The offline LUKS maintenance verbs against cryptsetup 2.6 on the same images: `convert`
//! (LUKS1 -> LUKS2 -> LUKS1 with cryptsetup's layout, the data area untouched, every refusal
//! with cryptsetup's exit code and no byte changed), `luksConvertKey`, `erase`, `config`, and
//! `token add|remove|import|export` in both directions, with the `luks2-keyring` token
//! unlocking from the kernel keyring.
//!
//! KDFs are kept cheap (PBKDF2 1000 iterations, Argon2 with 32 MiB). Without cryptsetup the
//! tests skip (and fail under CI=1).

mod common;

use common::env::tool_missing;
use common::rng::bytes;
use common::run::{ok as run, text, Run, Workspace};
use serde_json::Value;
use std::fs;

const PASS: &str = "correct horse battery";
const CHEAP: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// A cheap Argon2id keyslot (32 MiB, 4 passes).
fn argon() -> Vec<&'static str> {
    "--pbkdf argon2id --pbkdf-memory 32768 --pbkdf-force-iterations 4"
        .split(' ')
        .collect()
}

fn env() -> Option<Workspace> {
    if tool_missing("cryptsetup", "cryptsetup") {
        return None;
    }
    let e = Workspace::new();
    fs::write(e.path("pass"), PASS).unwrap();
    Some(e)
}

/// A cryptsetup-formatted image `name` of 20 MiB with `extra` format options and random data
/// in its last 4 MiB.
fn cs_format(e: &Workspace, name: &str, extra: &[&str]) -> String {
    let img = e.sparse(name, 20 << 20);
    let p = e.s("pass");
    let mut args = vec!["-q", "luksFormat", "--key-file", &p];
    args.extend(extra);
    args.push(&img);
    run("cryptsetup", &args);
    let mut b = fs::read(&img).unwrap();
    // The last 4 MiB: after the data offset of both versions' defaults.
    b[16 << 20..].copy_from_slice(&bytes(7, 4 << 20));
    fs::write(&img, b).unwrap();
    img
}

/// [`cs_format`] with a cheap LUKS2 keyslot and cryptsetup's other defaults.
fn cs_luks2(e: &Workspace, name: &str) -> String {
    cs_format(e, name, &[&["--type", "luks2"][..], &CHEAP].concat())
}

fn cs(args: &[&str]) -> Run {
    text("cryptsetup", args).assert_no_panic();
    text("cryptsetup", args)
}

fn copy(e: &Workspace, from: &str, to: &str) -> String {
    fs::copy(from, e.path(to)).unwrap();
    e.s(to)
}

fn json_dump(img: &str) -> Value {
    serde_json::from_str(&run(
        "cryptsetup",
        &["luksDump", "--dump-json-metadata", img],
    ))
    .unwrap()
}

fn cs_opens(e: &Workspace, img: &str) {
    let p = e.s("pass");
    run(
        "cryptsetup",
        &["open", "--test-passphrase", "--key-file", &p, img],
    );
}

#[test]
fn convert_round_trip_matches_cryptsetup() {
    let Some(e) = env() else { return };
    let mut luks1 = vec!["--type", "luks1"];
    luks1.extend(CHEAP);
    let ours = cs_format(&e, "ours.img", &luks1);
    let p = e.s("pass");
    // A second keyslot, so free and used LUKS1 keyslots are both translated.
    fs::write(e.path("pass2"), "second").unwrap();
    let mut add = vec!["luksAddKey", "-q", "--key-file", &p, "-S", "3"];
    add.extend(CHEAP);
    let p2 = e.s("pass2");
    add.extend([ours.as_str(), p2.as_str()]);
    run("cryptsetup", &add);
    let theirs = copy(&e, &ours, "theirs.img");
    let data = fs::read(&ours).unwrap()[2 << 20..].to_vec();

    e.run
        .ok(&["luks", "convert", &ours, "--type", "luks2", "-q"]);
    run("cryptsetup", &["convert", &theirs, "--type", "luks2", "-q"]);
    cs_opens(&e, &ours);
    // The same metadata (the LUKS1 salts carry over), the same keyslot areas and data.
    assert_eq!(json_dump(&ours), json_dump(&theirs));
    let (a, b) = (fs::read(&ours).unwrap(), fs::read(&theirs).unwrap());
    assert!(a[32768..] == b[32768..], "keyslot areas and data");
    let dump = run("cryptsetup", &["luksDump", &ours]);
    assert!(dump.contains("Epoch:         \t2"), "{dump}");

    e.run
        .ok(&["luks", "convert", &ours, "--type", "luks1", "-q"]);
    run("cryptsetup", &["convert", &theirs, "--type", "luks1", "-q"]);
    assert!(
        fs::read(&ours).unwrap() == fs::read(&theirs).unwrap(),
        "LUKS1 bytes"
    );
    cs_opens(&e, &ours);
    assert!(fs::read(&ours).unwrap()[2 << 20..] == data[..], "data area");
    e.run
        .ok(&["luks", "test-passphrase", "--key-file", &p2, &ours]);

    // A detached LUKS1 header file grows to LUKS2's layout, as cryptsetup's does.
    let data = e.sparse("d.img", 8 << 20);
    let (h, hc) = (e.s("h.img"), e.s("hc.img"));
    let mut f = vec!["-q", "luksFormat", "--type", "luks1", "--key-file", &p];
    f.extend(CHEAP);
    f.extend(["--header", &h, &data]);
    run("cryptsetup", &f);
    fs::copy(&h, &hc).unwrap();
    e.run.ok(&[
        "luks", "convert", "-q", "--header", &h, &data, "--type", "luks2",
    ]);
    run(
        "cryptsetup",
        &["convert", "-q", "--header", &hc, &data, "--type", "luks2"],
    );
    assert_eq!(
        fs::metadata(&h).unwrap().len(),
        fs::metadata(&hc).unwrap().len()
    );
    assert_eq!(json_dump(&h), json_dump(&hc));
    run(
        "cryptsetup",
        &[
            "open",
            "--test-passphrase",
            "--header",
            &h,
            &data,
            "--key-file",
            &p,
        ],
    );

    // The other direction starting from a cryptsetup LUKS2 header with 512-byte sectors.
    let mut l2 = vec!["--type", "luks2", "--sector-size", "512"];
    l2.extend(CHEAP);
    let ours = cs_format(&e, "l2.img", &l2);
    let theirs = copy(&e, &ours, "l2c.img");
    e.run
        .ok(&["luks", "convert", &ours, "--type", "luks1", "-q"]);
    run("cryptsetup", &["convert", &theirs, "--type", "luks1", "-q"]);
    assert!(fs::read(&ours).unwrap() == fs::read(&theirs).unwrap());
    cs_opens(&e, &ours);

    // Free LUKS1 keyslots take the free gaps, a hole left by a killed keyslot first.
    let ours = cs_format(&e, "gaps.img", &l2);
    for slot in ["1", "5"] {
        let mut add = vec!["luksAddKey", "-q", "--key-file", &p, "-S", slot];
        add.extend(CHEAP);
        add.extend([ours.as_str(), p2.as_str()]);
        run("cryptsetup", &add);
    }
    run("cryptsetup", &["luksKillSlot", "-q", &ours, "1"]);
    let theirs = copy(&e, &ours, "gapsc.img");
    e.run
        .ok(&["luks", "convert", "-q", &ours, "--type", "luks1"]);
    run("cryptsetup", &["convert", &theirs, "--type", "luks1", "-q"]);
    assert!(fs::read(&ours).unwrap() == fs::read(&theirs).unwrap());
    e.run.ok(&[
        "luks",
        "test-passphrase",
        "--key-file",
        &p2,
        "-S",
        "5",
        &ours,
    ]);
}

/// dmkit refuses exactly when cryptsetup does, with its exit code, and changes no byte.
#[test]
fn convert_refusals_match_cryptsetup() {
    let Some(e) = env() else { return };
    let p = e.s("pass");
    // (what, luksFormat options, --type to convert to, cryptsetup steps before).
    type Case<'a> = (&'a str, Vec<&'a str>, &'a str, Vec<Vec<String>>);
    let mut cases: Vec<Case> = Vec::new();
    let mut v = vec!["--type", "luks2"];
    v.extend(CHEAP);
    cases.push(("sector 4096", v.clone(), "luks1", vec![]));
    let mut a2 = vec!["--type", "luks2", "--sector-size", "512"];
    a2.extend(argon());
    cases.push(("argon2 keyslot", a2, "luks1", vec![]));
    let mut s512 = vec!["--type", "luks2", "--sector-size", "512"];
    s512.extend(CHEAP);
    let token = vec![
        "token".to_string(),
        "add".into(),
        "--key-description".into(),
        "a:b".into(),
    ];
    cases.push(("token", s512.clone(), "luks1", vec![token]));
    let slot9: Vec<String> = ["luksAddKey", "-q", "--key-file", &p, "-S", "9"]
        .iter()
        .chain(CHEAP.iter())
        .map(|s| s.to_string())
        .collect();
    cases.push(("keyslot 9", s512.clone(), "luks1", vec![slot9]));
    cases.push(("already LUKS2", s512.clone(), "luks2", vec![]));
    // LUKS1 data too close to its keyslots for LUKS2's 32 KiB of headers.
    let mut tight = vec!["--type", "luks1", "-s", "256", "--offset", "2056"];
    tight.extend(CHEAP);
    cases.push(("no room to move keyslots", tight, "luks2", vec![]));
    cases.push(("bad type", s512.clone(), "luks3", vec![]));
    for (i, (what, format, to, prep)) in cases.into_iter().enumerate() {
        let img = cs_format(&e, &format!("r{i}.img"), &format);
        for step in prep {
            // Steps name the device last.
            let mut args: Vec<&str> = step.iter().map(String::as_str).collect();
            if args[0] == "token" {
                args.insert(2, &img);
            } else {
                args.push(&img);
                args.push(&p);
            }
            run("cryptsetup", &args);
        }
        let theirs = copy(&e, &img, &format!("r{i}c.img"));
        let before = fs::read(&img).unwrap();
        let ours_run = e.run.run(&["luks", "convert", &img, "--type", to, "-q"]);
        let cs_run = cs(&["convert", &theirs, "--type", to, "-q"]);
        assert_ne!(cs_run.code, Some(0), "{what}: cryptsetup converted");
        assert_eq!(
            ours_run.code,
            cs_run.code,
            "{what}:\n{}\n{}",
            ours_run.describe(),
            cs_run.describe()
        );
        assert!(fs::read(&img).unwrap() == before, "{what}: bytes changed");
        // The message is cryptsetup's.
        let theirs_msg = cs_run.stderr.trim();
        assert!(
            ours_run.stderr.contains(theirs_msg),
            "{what}: {:?} vs {theirs_msg:?}",
            ours_run.stderr
        );
    }
    // Integrity (formatted by dmkit: cryptsetup needs device-mapper to format it).
    let img = e.sparse("i.img", 20 << 20);
    let mut f = vec![
        "luks",
        "format",
        "-q",
        "--key-file",
        &p,
        "--sector-size",
        "512",
    ];
    f.extend(["--integrity", "hmac-sha256", "--integrity-no-wipe", &img]);
    f.extend(CHEAP);
    e.run.ok(&f);
    let theirs = copy(&e, &img, "ic.img");
    let before = fs::read(&img).unwrap();
    let ours_run = e
        .run
        .run(&["luks", "convert", &img, "--type", "luks1", "-q"]);
    let cs_run = cs(&["convert", &theirs, "--type", "luks1", "-q"]);
    assert_eq!(
        ours_run.code,
        cs_run.code,
        "{}\n{}",
        ours_run.describe(),
        cs_run.describe()
    );
    assert_ne!(cs_run.code, Some(0));
    assert!(
        ours_run.stderr.contains(cs_run.stderr.trim()),
        "{}",
        ours_run.describe()
    );
    assert!(fs::read(&img).unwrap() == before);
    // The question: no terminal and no -q is refused, nothing written.
    let img = cs_format(&e, "q.img", &s512);
    let before = fs::read(&img).unwrap();
    let r = e.run.run(&["luks", "convert", &img, "--type", "luks1"]);
    assert_ne!(r.code, Some(0));
    assert!(fs::read(&img).unwrap() == before);
    // cryptsetup's top-level name.
    e.run
        .ok(&["convert", &img, "--type", "luks1", "--batch-mode"]);
    cs_opens(&e, &img);
}

#[test]
fn convert_key_then_both_unlock() {
    let Some(e) = env() else { return };
    let p = e.s("pass");
    let img = cs_format(
        &e,
        "k.img",
        &[&["--type", "luks2", "--sector-size", "512"][..], &argon()].concat(),
    );
    let theirs = copy(&e, &img, "kc.img");
    let args = [
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &p,
        "-S",
        "0",
    ];
    let mut ours_args = vec!["luks", "convert-key", &img];
    ours_args.extend(args);
    e.run.ok(&ours_args);
    let mut cs_args = vec!["luksConvertKey", theirs.as_str()];
    cs_args.extend(args);
    run("cryptsetup", &cs_args);
    let (a, b) = (json_dump(&img), json_dump(&theirs));
    for j in [&a, &b] {
        assert_eq!(j["keyslots"]["0"]["kdf"]["type"], "pbkdf2", "{j}");
        assert_eq!(j["keyslots"]["0"]["kdf"]["iterations"], 1000, "{j}");
    }
    cs_opens(&e, &img);
    e.run
        .ok(&["luks", "test-passphrase", "--key-file", &p, &img]);
    let dump = run("cryptsetup", &["luksDump", &img]);
    assert!(dump.contains("PBKDF:      pbkdf2"), "{dump}");
    // Now LUKS1 compatible, as cryptsetup's.
    e.run
        .ok(&["luks", "convert", "-q", &img, "--type", "luks1"]);
    cs_opens(&e, &img);

    // Refusals with cryptsetup's codes: wrong passphrase, inactive keyslot, LUKS1.
    let img = cs_luks2(&e, "k2.img");
    fs::write(e.path("bad"), "bad").unwrap();
    let bad = e.s("bad");
    for (key, slot, dev) in [(&bad, "0", &img), (&p, "3", &img)] {
        let opts = [
            dev,
            "--key-file",
            key,
            "-S",
            slot,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ];
        let ours = e.run.run(&[&["luks", "convert-key"][..], &opts].concat());
        let theirs = cs(&[&["luksConvertKey"][..], &opts].concat());
        assert_eq!(
            ours.code,
            theirs.code,
            "{}\n{}",
            ours.describe(),
            theirs.describe()
        );
        assert!(
            ours.stderr.contains(theirs.stderr.trim()),
            "{}\n{}",
            ours.describe(),
            theirs.describe()
        );
    }
    // Without -S, the keyslot the passphrase opens; cryptsetup's top-level name.
    let mut argon2i = argon();
    argon2i[1] = "argon2i";
    e.run
        .ok(&[&["luksConvertKey", &img, "--key-file", &p][..], &argon2i].concat());
    assert_eq!(json_dump(&img)["keyslots"]["0"]["kdf"]["type"], "argon2i");
    cs_opens(&e, &img);
}

#[test]
fn erase_wipes_every_keyslot() {
    let Some(e) = env() else { return };
    let p = e.s("pass");
    for luks in ["luks2", "luks1"] {
        let img = cs_format(
            &e,
            &format!("{luks}.img"),
            &[
                "--type",
                luks,
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
            ],
        );
        if luks == "luks2" {
            // An unbound token stays, as with cryptsetup.
            let f = e.s("t.json");
            fs::write(&f, r#"{"type":"x-other","keyslots":[]}"#).unwrap();
            run("cryptsetup", &["token", "import", &img, "--json-file", &f]);
        }
        let theirs = copy(&e, &img, &format!("{luks}c.img"));
        let r = e.run.run(&["luks", "erase", &img]);
        assert_ne!(r.code, Some(0), "no terminal, no -q: {}", r.describe());
        e.run.ok(&["erase", "-q", &img]);
        run("cryptsetup", &["erase", "-q", &theirs]);
        let r = cs(&["open", "--test-passphrase", "--key-file", &p, &img]);
        assert_eq!(r.code, Some(1), "{}", r.describe());
        let (a, b) = (
            run("cryptsetup", &["luksDump", &img]),
            run("cryptsetup", &["luksDump", &theirs]),
        );
        let strip = |s: &str| {
            s.lines()
                .filter(|l| !l.contains("Epoch"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        if luks == "luks1" {
            // The header alike (key material is wiped with different patterns).
            let (x, y) = (fs::read(&img).unwrap(), fs::read(&theirs).unwrap());
            assert!(x[..592] == y[..592], "LUKS1 headers differ");
        } else {
            assert_eq!(strip(&a), strip(&b));
        }
    }
}

#[test]
fn config_matches_cryptsetup() {
    let Some(e) = env() else { return };
    let img = cs_luks2(&e, "c.img");
    let theirs = copy(&e, &img, "cc.img");
    let steps: &[&[&str]] = &[
        &["--label", "lab", "--subsystem", "sub"],
        &["--priority", "prefer", "-S", "0"],
        &["--label", "only"],
        &["--priority", "ignore", "-S", "0"],
        &["--priority", "normal", "-S", "0"],
        &["--subsystem", "s2"],
    ];
    for s in steps {
        let mut a = vec!["luks", "config", &img];
        a.extend(*s);
        e.run.ok(&a);
        let mut c = vec!["config", theirs.as_str()];
        c.extend(*s);
        run("cryptsetup", &c);
        assert_eq!(json_dump(&img), json_dump(&theirs), "{s:?}");
        let (x, y) = (
            run("cryptsetup", &["luksDump", &img]),
            run("cryptsetup", &["luksDump", &theirs]),
        );
        assert_eq!(x.replace(&img, ""), y.replace(&theirs, ""), "{s:?}");
    }
    // Refusals with cryptsetup's codes.
    let mut l1 = vec!["--type", "luks1"];
    l1.extend(CHEAP);
    let v1 = cs_format(&e, "v1.img", &l1);
    let bad: &[(&[&str], &str)] = &[
        (&[], &img),
        (&["--priority", "prefer"], &img),
        (&["--priority", "bogus", "-S", "0"], &img),
        (&["--priority", "prefer", "-S", "5"], &img),
        (&["--label", "x"], &v1),
    ];
    for (args, dev) in bad {
        let mut a = vec!["luks", "config", dev];
        a.extend(*args);
        let ours = e.run.run(&a);
        let mut c = vec!["config", dev];
        c.extend(*args);
        let theirs = cs(&c);
        assert_eq!(
            ours.code,
            theirs.code,
            "{args:?}\n{}\n{}",
            ours.describe(),
            theirs.describe()
        );
    }
}

#[test]
fn tokens_round_trip_with_cryptsetup() {
    let Some(e) = env() else { return };
    let img = cs_luks2(&e, "t.img");
    let f = e.s("in.json");
    // dmkit import -> cryptsetup export: the same JSON (keys in sorted order come back byte
    // for byte; an unknown type with nested values is kept).
    let t1 = r#"{"keyslots":["0"],"type":"systemd-tpm2","x":{"a":[1,2.5,"s"],"b":null}}"#;
    fs::write(&f, t1).unwrap();
    let import = |id: &'static str| ["token", "import", &img, "--json-file", &f, "--token-id", id];
    e.run.ok(&[&["luks"][..], &import("4")].concat());
    let out = run("cryptsetup", &["token", "export", &img, "--token-id", "4"]);
    assert_eq!(out, t1);
    let t2 = r#"{"type":"foo","keyslots":[],"z":"last","a":"first"}"#;
    fs::write(&f, t2).unwrap();
    e.run.ok(&["token", "import", &img, "--json-file", &f]);
    let out = run("cryptsetup", &["token", "export", &img, "--token-id", "0"]);
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(parse(&out), parse(t2));
    // cryptsetup import -> dmkit export: byte for byte, key order kept.
    let t3 = r#"{"type":"zzz","keyslots":["0"],"k":{"y":1,"b":[true]}}"#;
    fs::write(&f, t3).unwrap();
    run("cryptsetup", &import("9"));
    assert_eq!(
        e.run
            .ok(&["luks", "token", "export", &img, "--token-id", "9"]),
        t3
    );
    run(
        "cryptsetup",
        &[
            "token",
            "add",
            &img,
            "--key-description",
            "k:1",
            "--token-id",
            "2",
        ],
    );
    assert_eq!(
        e.run
            .ok(&["luks", "token", "export", &img, "--token-id", "2"]),
        r#"{"type":"luks2-keyring","keyslots":["0"],"key_description":"k:1"}"#
    );
    // dmkit's keyring token reads back in cryptsetup as its own (dmkit writes an object's
    // keys in sorted order, so the same JSON comes back with them sorted).
    e.run.ok(&[
        "luks",
        "token",
        "add",
        &img,
        "--key-description",
        "k:2",
        "--token-id",
        "3",
        "-S",
        "0",
    ]);
    assert_eq!(
        parse(&run(
            "cryptsetup",
            &["token", "export", &img, "--token-id", "3"]
        )),
        parse(r#"{"type":"luks2-keyring","keyslots":["0"],"key_description":"k:2"}"#)
    );
    e.run
        .ok(&["luks", "token", "remove", &img, "--token-id", "9"]);
    let dump = run("cryptsetup", &["luksDump", &img]);
    assert!(
        !dump.contains("zzz") && dump.contains("systemd-tpm2"),
        "{dump}"
    );

    // Refusals: each with cryptsetup's exit code and no byte changed.
    let theirs = copy(&e, &img, "tc.img");
    let before = fs::read(&img).unwrap();
    let cases: &[(&[&str], Option<&str>)] = &[
        (
            &["add", "--key-description", "a:b", "--token-id", "2"],
            None,
        ),
        (&["add", "--key-description", "a:b", "-S", "4"], None),
        (&["import"], Some(r#"{"type":"luks2-foo","keyslots":[]}"#)),
        (&["import"], Some(r#"{"type":"foo","keyslots":["3"]}"#)),
        (&["import"], Some(r#"{"type":"foo","keyslots":[]"#)),
        (&["import"], Some(r#"{"keyslots":[]}"#)),
        (
            &["import", "--token-id", "4"],
            Some(r#"{"type":"foo","keyslots":[]}"#),
        ),
        (&["export", "--token-id", "5"], None),
        (&["remove", "--token-id", "5"], None),
    ];
    for (args, json) in cases {
        let mut a = vec!["luks", "token", args[0], &img];
        a.extend(&args[1..]);
        let mut c = vec!["token", args[0], theirs.as_str()];
        c.extend(&args[1..]);
        if let Some(j) = json {
            fs::write(&f, j).unwrap();
            a.extend(["--json-file", &f]);
            c.extend(["--json-file", &f]);
        }
        same_refusal(&e, &a, &c, &img, &before);
    }
}

/// dmkit's `ours` and cryptsetup's `theirs` command lines both fail with the same exit code,
/// and `img` still holds `before`.
fn same_refusal(e: &Workspace, ours: &[&str], theirs: &[&str], img: &str, before: &[u8]) {
    let (o, c) = (e.run.run(ours), cs(theirs));
    assert_eq!(
        o.code,
        c.code,
        "{ours:?}\n{}\n{}",
        o.describe(),
        c.describe()
    );
    assert_ne!(o.code, Some(0), "{ours:?}");
    assert!(fs::read(img).unwrap() == before, "{ours:?}: bytes changed");
}

/// The `luks2-keyring` token opens with the passphrase from the kernel keyring, in a session
/// keyring of its own (`keyctl session`), for both tools.
#[test]
fn keyring_token_unlocks() {
    let Some(e) = env() else { return };
    if tool_missing("keyctl", "keyutils") {
        return;
    }
    let img = cs_luks2(&e, "k.img");
    let desc = format!("dmkit-test:{}", std::process::id());
    e.run
        .ok(&["luks", "token", "add", &img, "--key-description", &desc]);
    let dmkit = env!("CARGO_BIN_EXE_dmkit");
    let p = e.s("pass");
    let script = format!(
        "keyctl padd user '{desc}' @s < '{p}' >/dev/null && \
         {dmkit} luks open --test-passphrase --token-only '{img}' && \
         cryptsetup open --test-passphrase --token-only '{img}' && echo both"
    );
    let out = run("keyctl", &["session", "-", "sh", "-c", &script]);
    assert!(
        out.contains("Key slot 0 unlocked.") && out.contains("both"),
        "{out}"
    );
    // Without the key: cryptsetup's exit code 2 for both.
    let r = cs(&["open", "--test-passphrase", "--token-only", &img]);
    let ours = e
        .run
        .run(&["luks", "open", "--test-passphrase", "--token-only", &img]);
    assert_eq!(ours.code, r.code, "{}\n{}", ours.describe(), r.describe());
    // A wrong passphrase in the keyring: 2 as well.
    let script = format!(
        "echo -n wrong | keyctl padd user '{desc}' @s >/dev/null; \
         {dmkit} luks open --test-passphrase --token-only '{img}'; echo \"ours=$?\"; \
         cryptsetup open --test-passphrase --token-only '{img}'; echo \"theirs=$?\""
    );
    let out = run("keyctl", &["session", "-", "sh", "-c", &script]);
    assert!(out.contains("ours=2") && out.contains("theirs=2"), "{out}");
}

/// A served volume is not converted (cryptsetup: "Cannot convert device ... which is still in
/// use.", exit 5); keyslot changes stay allowed, as with cryptsetup.
#[test]
fn convert_refuses_an_open_volume() {
    let Some(e) = env() else { return };
    if common::env::fuse_missing() {
        return;
    }
    let mut s512 = vec!["--type", "luks2", "--sector-size", "512"];
    s512.extend(CHEAP);
    let img = cs_format(&e, "o.img", &s512);
    let p = e.s("pass");
    e.run
        .ok(&["luks", "open", &img, "r3conv", "--key-file", &p]);
    e.run.track("r3conv");
    let before = fs::read(&img).unwrap();
    let r = e
        .run
        .run(&["luks", "convert", "-q", &img, "--type", "luks1"]);
    assert_eq!(r.code, Some(5), "{}", r.describe());
    assert!(
        r.stderr.contains("which is still in use"),
        "{}",
        r.describe()
    );
    assert!(fs::read(&img).unwrap() == before);
    e.run.ok(&[
        "luks",
        "convert-key",
        &img,
        "--key-file",
        &p,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "2000",
    ]);
    e.run.close("r3conv");
    e.run
        .ok(&["luks", "convert", "-q", &img, "--type", "luks1"]);
    cs_opens(&e, &img);
}

/// Tokens survive round trips through both tools' `token export` and `token import`: dmkit
/// imports, cryptsetup exports, cryptsetup imports that text into another image, dmkit exports
/// it, and the other way round. Every token comes back byte for byte at every hop, as json-c
/// keeps it: keys in their order, numbers in their source spelling (`1e-07`, `2.50`),
/// whatever the strings hold (escapes, control characters, non-ASCII, an empty key) and the
/// integers (beyond i64, i64::MIN). A dmkit header write (a label) keeps them too. Each image
/// still opens with cryptsetup, and both tools see the same tokens section.
#[test]
fn tokens_survive_export_import_round_trips() {
    let Some(e) = env() else { return };
    let all = [
        r#"{"a":"slash/ quote\" back\\ nl\n tab\t \u0001 é ✓","b":[18446744073709551615,-9223372036854775808,0,1.5,-0.0,true,false,null,{},[]],"keyslots":["0"],"type":"x-test","z":{"":"empty key"}}"#,
        r#"{"keyslots":[],"type":"x-vendor","vendor-blob":"AAAA","vendor-pcrs":[7,11]}"#,
        r#"{"type":"luks2-keyring","keyslots":["0"],"key_description":"dmkit:round trip"}"#,
        r#"{"type":"zz","keyslots":["0"],"n":1e-07,"m":{"y":2.50,"b":[1E3,-0.0]}}"#,
    ];
    let f = e.s("token.json");
    let dmkit_import = |img: &str, id: &str, json: &str| {
        fs::write(&f, json).unwrap();
        e.run.ok(&[
            "luks",
            "token",
            "import",
            img,
            "--json-file",
            &f,
            "--token-id",
            id,
        ]);
    };
    let cs_import = |img: &str, id: &str, json: &str| {
        fs::write(&f, json).unwrap();
        run(
            "cryptsetup",
            &["token", "import", img, "--json-file", &f, "--token-id", id],
        );
    };
    let dmkit_export = |img: &str, id: &str| {
        e.run
            .ok(&["luks", "token", "export", img, "--token-id", id])
    };
    let cs_export =
        |img: &str, id: &str| run("cryptsetup", &["token", "export", img, "--token-id", id]);

    let ours_first = cs_luks2(&e, "r1.img");
    let theirs_second = copy(&e, &ours_first, "r2.img");
    let theirs_first = copy(&e, &ours_first, "r3.img");
    let ours_second = copy(&e, &ours_first, "r4.img");
    for (i, token) in all.iter().enumerate() {
        let id = (i + 1).to_string();
        let same = |what: &str, got: &str| assert_eq!(got, *token, "token {id}, {what}");
        // dmkit -> cryptsetup -> cryptsetup -> dmkit.
        dmkit_import(&ours_first, &id, token);
        let hop1 = cs_export(&ours_first, &id);
        same("dmkit import, cryptsetup export", &hop1);
        cs_import(&theirs_second, &id, &hop1);
        same(
            "... cryptsetup import, dmkit export",
            &dmkit_export(&theirs_second, &id),
        );
        // cryptsetup -> dmkit -> dmkit -> cryptsetup.
        cs_import(&theirs_first, &id, token);
        let hop1 = dmkit_export(&theirs_first, &id);
        same("cryptsetup import, dmkit export", &hop1);
        dmkit_import(&ours_second, &id, &hop1);
        same(
            "... dmkit import, cryptsetup export",
            &cs_export(&ours_second, &id),
        );
    }
    // A dmkit header write keeps every token's spelling.
    e.run
        .ok(&["luks", "config", "--label", "kept", &ours_first]);
    for (i, token) in all.iter().enumerate() {
        let id = (i + 1).to_string();
        assert_eq!(
            cs_export(&ours_first, &id),
            *token,
            "token {id} after a label change"
        );
    }
    let tokens = |img: &str| json_dump(img)["tokens"].clone();
    for img in [&ours_first, &theirs_second, &theirs_first, &ours_second] {
        cs_opens(&e, img);
        assert_eq!(tokens(img), tokens(&ours_first), "{img}");
        let ours: Value =
            serde_json::from_str(&e.run.ok(&["luks", "dump", "--json", img])).unwrap();
        assert_eq!(ours["tokens"], tokens(img), "{img}: dmkit's dump");
    }
}

/// `token unassign` unbinds one keyslot as cryptsetup does, and refuses what it refuses with
/// its exit codes and no byte changed; `open --token-type` of a type with no token fails as
/// cryptsetup's does.
#[test]
fn token_unassign_matches_cryptsetup() {
    let Some(e) = env() else { return };
    let img = cs_luks2(&e, "u.img");
    let p = e.s("pass");
    let mut add = vec!["-q", "luksAddKey", "--key-file", &p];
    add.extend(CHEAP);
    add.extend([img.as_str(), p.as_str()]);
    run("cryptsetup", &add);
    run(
        "cryptsetup",
        &["token", "add", &img, "--key-description", "u:1"],
    );
    let theirs = copy(&e, &img, "uc.img");
    let unassign = |dev: &str| {
        [
            "token",
            "unassign",
            dev,
            "--token-id",
            "0",
            "--key-slot",
            "1",
        ]
        .map(String::from)
    };
    let ours_args = unassign(&img);
    let ours_args: Vec<&str> = ["luks"]
        .into_iter()
        .chain(ours_args.iter().map(String::as_str))
        .collect();
    e.run.ok(&ours_args);
    let c = unassign(&theirs);
    run(
        "cryptsetup",
        &c.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_eq!(json_dump(&img)["tokens"], json_dump(&theirs)["tokens"]);
    assert_eq!(
        json_dump(&img)["tokens"]["0"]["keyslots"],
        serde_json::json!(["0"])
    );

    let before = fs::read(&img).unwrap();
    let cases: &[&[&str]] = &[
        &["--token-id", "0", "--key-slot", "1"],
        &["--token-id", "0"],
        &["--key-slot", "0"],
        &["--token-id", "3", "--key-slot", "0"],
        &["--token-id", "0", "--key-slot", "5"],
    ];
    for args in cases {
        let mut a = vec!["luks", "token", "unassign", &img];
        a.extend(*args);
        let mut c = vec!["token", "unassign", theirs.as_str()];
        c.extend(*args);
        same_refusal(&e, &a, &c, &img, &before);
    }

    let typed = ["--test-passphrase", "--token-only", "--token-type", "foo"];
    let ours = e.run.run(&[&["luks", "open", &img][..], &typed].concat());
    let cs_run = cs(&[&["open", &theirs][..], &typed].concat());
    assert_eq!(
        ours.code,
        cs_run.code,
        "{}\n{}",
        ours.describe(),
        cs_run.describe()
    );
    assert!(
        ours.stderr
            .contains("No usable token (type foo) is available."),
        "{}",
        ours.describe()
    );
}
