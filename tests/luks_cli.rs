//! cryptsetup's spellings of the LUKS commands work in dmkit: `dmkit open --type
//! luks|luks1|luks2|plain DEVICE NAME`, `dmkit luks close NAME` / `luksClose NAME` (the same
//! path as `dmkit close`), `dmkit luks status NAME` (exit 4 when inactive) and `isLuks DEVICE`
//! (exit 0 / 1 / 4, quiet, and with `-v` cryptsetup's lines).

mod common;

use common::env::fuse_missing;
use common::run::Workspace;
use std::fs;

/// A 20 MiB LUKS2 image with a cheap PBKDF2 keyslot 0, and its passphrase file.
fn luks2(e: &Workspace) -> (String, String) {
    e.luks2_cheap("disk.img", 20 << 20, "spelling passphrase")
}

#[test]
fn is_luks_exits_like_cryptsetup() {
    let e = Workspace::new();
    let (img, _) = luks2(&e);
    let zeros = e.sparse("zeros.img", 1 << 20);
    let missing = e.s("missing.img");

    let r = e.run.run(&["isLuks", &img]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("", ""));
    let r = e.run.run(&["isLuks", "-v", &img]);
    assert_eq!(r.stdout, "Command successful.\n", "{}", r.describe());
    let r = e.run.run(&["luks", "is-luks", "--type", "luks1", &img]);
    assert_eq!(r.code, Some(1), "{}", r.describe());

    let r = e.run.run(&["isLuks", &zeros]);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(1), "", "")
    );
    let r = e.run.run(&["isLuks", "-v", &zeros]);
    assert_eq!(
        r.stdout,
        "Command failed with code -1 (wrong or missing parameters).\n"
    );

    let r = e.run.run(&["isLuks", "-v", &missing]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    assert_eq!(
        r.stdout,
        "Command failed with code -4 (wrong device or file specified).\n"
    );
    assert_eq!(
        r.stderr,
        format!("Device {missing} does not exist or access denied.\n")
    );
}

#[test]
fn generic_open_close_and_status_spellings() {
    if fuse_missing() {
        return;
    }
    let e = Workspace::new();
    let (img, pass) = luks2(&e);

    // `open --type luks2 DEVICE NAME`, closed with `luks close`.
    e.run.track("sp1");
    let out = e
        .run
        .ok(&["open", "--type", "luks2", &img, "sp1", "--key-file", &pass]);
    assert!(out.trim_end().ends_with("sp1"), "{out}");
    let r = e.run.run(&["luks", "status", "sp1"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stdout.contains("is active"), "{}", r.describe());
    e.run.ok(&["luks", "close", "sp1"]);
    let r = e.run.run(&["luks", "status", "sp1"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());
    assert!(r.stdout.contains("is inactive"), "{}", r.describe());

    // `open DEVICE NAME --type luks` (the type after the names), closed with `luksClose`.
    e.run.track("sp2");
    e.run
        .ok(&["open", &img, "sp2", "--key-file", &pass, "--type", "luks"]);
    e.run.ok(&["luksClose", "sp2"]);
    let r = e.run.run(&["luksClose", "sp2"]);
    assert_eq!(r.code, Some(4), "{}", r.describe());

    // The wrong version is refused, as `luks open --type` does.
    let r = e
        .run
        .run(&["open", "--type", "luks1", &img, "sp3", "--key-file", &pass]);
    assert_eq!(r.code, Some(1), "{}", r.describe());

    // `open --type plain` is `dmkit plain open`.
    let key = e.s("plain.key");
    fs::write(&key, [7u8; 32]).unwrap();
    e.run.track("sp4");
    e.run
        .ok(&["open", "--type", "plain", &img, "sp4", "--key-file", &key]);
    let r = e.run.run(&["status", "sp4"]);
    assert!(
        r.stdout.contains("plain") || r.stdout.contains("crypt"),
        "{}",
        r.describe()
    );
    e.run.ok(&["luks", "close", "sp4"]);

    let r = e.run.run(&["open", "--type", "tcrypt", &img, "sp5"]);
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.describe());
}
