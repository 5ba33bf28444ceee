//! `dmkit image build --type root|usr|sysext|confext|portable [--architecture A]`: the image
//! types systemd tells apart, checked with Debian's systemd (252).
//!
//! - The partition type table is `systemd-id128 show`'s, name for name and GUID for GUID.
//! - `systemd-dissect --json` lists each type's partitions (root or usr, verity, signature)
//!   with the verity signed, sees a sysext's extension-release file (`useSystemExtension`) and
//!   a portable image's os-release (`usePortableService`); another architecture's types
//!   dissect as that architecture.
//! - A split `/usr` image carries `NAME.usrhash` and `NAME.usrhash.p7s`, and validates.
//! - Trees a type cannot hold are refused in one line, with nothing written.
//!
//! systemd 252 knows no configuration extensions (they came with 254): a confext is checked by
//! its partitions and by reading its extension-release file back through dmkit.

mod common;

use common::env::tool_missing;
use common::image_tree::{dissect_missing, dissect_ok};
use common::pki::{make_ident, Ident, RSA};
use common::run::{assert_refused, Workspace};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn write(root: &Path, files: &[(&str, &str)]) -> PathBuf {
    for (p, body) in files {
        let f = root.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, body).unwrap();
    }
    root.to_path_buf()
}

struct Env {
    ws: Workspace,
    signer: Ident,
}

impl Env {
    fn new() -> Env {
        let ws = Workspace::new();
        let signer = make_ident(ws.dir(), "signer", "/CN=dmkit image types", RSA);
        Env { ws, signer }
    }

    fn tree(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        write(&self.ws.path(name), files)
    }

    /// `image build TREE IMG --type T EXTRA... --json`, signed.
    fn build(&self, tree: &Path, img: &str, ty: &str, extra: &[&str]) -> (PathBuf, Value) {
        let img = self.ws.path(img);
        let mut args = vec![
            "image",
            "build",
            s(tree),
            s(&img),
            "--type",
            ty,
            "--timestamp",
            "1700000000",
            "--key",
            s(&self.signer.key),
            "--cert",
            s(&self.signer.cert),
            "--json",
        ];
        args.extend_from_slice(extra);
        let r = self.ws.run.run(&args).ok();
        (img, serde_json::from_str(&r.stdout).unwrap())
    }
}

/// designator -> "label architecture verity" of every mount systemd-dissect lists.
fn mounts(v: &Value) -> BTreeMap<String, String> {
    v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let f = |k: &str| m[k].as_str().unwrap_or("-").to_string();
            (
                f("designator"),
                [f("partition_label"), f("architecture"), f("verity")].join(" "),
            )
        })
        .collect()
}

fn want(family: &str, arch: &str) -> BTreeMap<String, String> {
    [
        (family.to_string(), format!("{family}-{arch} {arch} signed")),
        (
            format!("{family}-verity"),
            format!("{family}-{arch}-verity {arch} -"),
        ),
        (
            format!("{family}-verity-sig"),
            format!("{family}-{arch}-verity-sig {arch} -"),
        ),
    ]
    .into()
}

#[test]
fn the_partition_types_are_systemds() {
    if tool_missing("systemd-id128", "systemd") {
        return;
    }
    let out = common::run::ok("systemd-id128", &["show", "--uuid"]);
    let theirs: BTreeMap<&str, &str> = out
        .lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .map(|(n, g)| (n, g.trim()))
        .collect();
    for t in dmkit::image::dps::KNOWN {
        assert_eq!(
            theirs.get(t.name).copied(),
            Some(dmkit::verity::superblock::format_uuid(&t.guid).as_str()),
            "{}",
            t.name
        );
    }
}

#[test]
fn systemd_dissect_tells_every_type_apart() {
    if tool_missing("mkfs.erofs", "erofs-utils") || dissect_missing() {
        return;
    }
    let env = Env::new();
    let os_release = "ID=debian\nVERSION_ID=12\n";

    let usr = env.tree(
        "usr-tree",
        &[("bin/hello", "hello\n"), ("lib/os-release", os_release)],
    );
    let (img, report) = env.build(&usr, "usr.raw", "usr", &[]);
    assert_eq!(report["image_type"], "usr");
    // systemd 252 applies a GPT image's verity signature to its root partition unless told
    // the image is a /usr one: by a NAME.usrhash beside it (verity_settings_data_covers()).
    let v = dissect_ok(&img, None);
    let mut unsigned = want("usr", "x86-64");
    unsigned.insert("usr".into(), "usr-x86-64 x86-64 no".into());
    assert_eq!(mounts(&v), unsigned, "{v}");
    let root_hash = report["root_hash"].as_str().unwrap();
    let usrhash = env.ws.path("usr.usrhash");
    std::fs::write(&usrhash, format!("{root_hash}\n")).unwrap();
    let v = dissect_ok(&img, None);
    assert_eq!(mounts(&v), want("usr", "x86-64"), "{v}");
    let mut other = root_hash.to_string();
    other.replace_range(0..1, if root_hash.starts_with('0') { "1" } else { "0" });
    std::fs::write(&usrhash, format!("{other}\n")).unwrap();
    let out = common::image_tree::dissect(&img, None);
    assert!(
        !out.status.success(),
        "systemd-dissect took a wrong usr hash"
    );
    std::fs::remove_file(&usrhash).unwrap();
    let uuid = |d: &str| {
        v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["designator"] == d)
            .unwrap()["partition_uuid"]
            .as_str()
            .unwrap()
            .replace('-', "")
    };
    assert_eq!(format!("{}{}", uuid("usr"), uuid("usr-verity")), root_hash);
    // dmkit reads a /usr image as it reads a root image.
    let r = env.ws.run.run(&["image", "cat", s(&img), "bin/hello"]).ok();
    assert_eq!(r.stdout, "hello\n");

    let sysext = env.tree("sysext-tree", &[("usr/bin/tool", "tool\n")]);
    let (img, report) = env.build(
        &sysext,
        "tool.raw",
        "sysext",
        &[
            "--extension-release",
            "ID=_any",
            "--extension-release",
            "SYSEXT_LEVEL=1.0",
        ],
    );
    assert_eq!(
        report["extension_release"],
        "usr/lib/extension-release.d/extension-release.tool"
    );
    let v = dissect_ok(&img, None);
    assert_eq!(mounts(&v), want("root", "x86-64"), "{v}");
    assert_eq!(v["useSystemExtension"], true, "{v}");
    assert_eq!(
        v["extensionRelease"],
        serde_json::json!(["ID=_any", "ARCHITECTURE=x86-64", "SYSEXT_LEVEL=1.0"]),
        "{v}"
    );
    // The tree itself was not touched.
    assert!(!sysext.join("usr/lib").exists());

    let confext = env.tree("confext-tree", &[("etc/tool.conf", "on\n")]);
    let (img, _) = env.build(
        &confext,
        "conf.raw",
        "confext",
        &["--extension-release", "ID=_any"],
    );
    let v = dissect_ok(&img, None);
    assert_eq!(mounts(&v), want("root", "x86-64"), "{v}");
    let r = env
        .ws
        .run
        .run(&[
            "image",
            "cat",
            s(&img),
            "etc/extension-release.d/extension-release.conf",
        ])
        .ok();
    assert_eq!(r.stdout, "ID=_any\nARCHITECTURE=x86-64\n");

    let portable = env.tree(
        "portable-tree",
        &[
            // systemd-dissect calls an image portable by one of these fields (252 by
            // PORTABLE_MATCHES, later versions by PORTABLE_PREFIXES).
            (
                "usr/lib/os-release",
                "ID=debian\nVERSION_ID=12\nPORTABLE_PREFIXES=svc\nPORTABLE_MATCHES=svc\n",
            ),
            ("usr/bin/svc", "svc\n"),
            (
                "usr/lib/systemd/system/svc.service",
                "[Service]\nExecStart=/usr/bin/svc\n",
            ),
        ],
    );
    let (img, _) = env.build(&portable, "svc.raw", "portable", &[]);
    let v = dissect_ok(&img, None);
    assert_eq!(mounts(&v), want("root", "x86-64"), "{v}");
    assert_eq!(v["usePortableService"], true, "{v}");

    // Another architecture's partition types.
    let (img, report) = env.build(&usr, "usr-arm64.raw", "usr", &["--architecture", "arm64"]);
    assert_eq!(report["architecture"], "arm64");
    std::fs::write(
        env.ws.path("usr-arm64.usrhash"),
        report["root_hash"].as_str().unwrap(),
    )
    .unwrap();
    let v = dissect_ok(&img, None);
    assert_eq!(mounts(&v), want("usr", "arm64"), "{v}");
}

#[test]
fn a_split_usr_image_carries_usrhash_and_validates() {
    if tool_missing("mkfs.erofs", "erofs-utils") {
        return;
    }
    let env = Env::new();
    let usr = env.tree("usr-tree", &[("bin/hello", "hello\n")]);
    let (img, report) = env.build(&usr, "usr.raw", "usr", &["--split"]);
    let beside = |suffix: &str| env.ws.path(&format!("usr{suffix}"));
    assert_eq!(
        std::fs::read_to_string(beside(".usrhash")).unwrap().trim(),
        report["root_hash"].as_str().unwrap()
    );
    assert!(beside(".usrhash.p7s").exists());
    assert!(beside(".verity").exists());
    assert!(!beside(".roothash").exists());
    let r = env
        .ws
        .run
        .run(&[
            "image",
            "validate",
            s(&img),
            "--cert",
            s(&env.signer.cert),
            "--json",
        ])
        .ok();
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["root_hash_source"], "root-hash-file", "{v}");
}

#[test]
fn trees_a_type_cannot_hold_are_refused_and_nothing_is_written() {
    if tool_missing("mkfs.erofs", "erofs-utils") {
        return;
    }
    let env = Env::new();
    let mixed = env.tree("mixed", &[("usr/bin/a", "a\n"), ("etc/b", "b\n")]);
    let bare = env.tree("bare", &[("usr/bin/a", "a\n")]);
    let img = env.ws.path("out.raw");
    // (tree, options, what the error line names)
    type Case<'a> = (&'a Path, &'a [&'a str], &'a [&'a [&'a str]]);
    let cases: [Case; 5] = [
        (&mixed, &["--type", "sysext"], &[&["mixed"], &["etc"]]),
        (&mixed, &["--type", "confext"], &[&["mixed"], &["usr"]]),
        (
            &bare,
            &["--type", "portable"],
            &[&["bare"], &["os-release"]],
        ),
        (
            &bare,
            &["--architecture", "vax"],
            &[&["--architecture"], &["vax"]],
        ),
        (
            &bare,
            &["--extension-release", "ID=debian"],
            &[&["--extension-release"], &["root"]],
        ),
    ];
    for (tree, extra, names) in cases {
        let mut args = vec!["image", "build", s(tree), s(&img)];
        args.extend_from_slice(extra);
        let r = env.ws.run.run(&args);
        assert_refused(&r, 1, names);
        let left: Vec<_> = std::fs::read_dir(env.ws.dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("out.raw") || n.starts_with(".out.raw"))
            .collect();
        assert!(left.is_empty(), "{extra:?} left {left:?}");
    }
    let r = env.ws.run.run(&[
        "image",
        "build",
        s(&bare),
        s(&img),
        "--type",
        "sysext",
        "--extension-release",
        "id=x",
    ]);
    assert_refused(&r, 1, &[&["--extension-release"], &["key"]]);
}
