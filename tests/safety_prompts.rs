//! cryptsetup's safety prompts on every destructive command, typed at on a pseudo-terminal
//! (`script(1)`): `integrity format`, `luks format` (LUKS2, LUKS1, `--integrity`), `verity
//! format` onto a hash device that holds a superblock, `luks header-restore`, and `luks
//! kill-slot`/`remove-key` of the last keyslot. Each is tried four ways:
//!
//! - on a terminal, answered `no`: refused with cryptsetup's words and exit code, and every
//!   byte of the target is unchanged;
//! - without a terminal and without `-q`: refused with one `dmkit: ...` line, unchanged;
//! - on a terminal, answered `YES`: done;
//! - with `-q` (and `--batch-mode`), without a terminal: done, without a word of the dialog.
//!
//! What the terminal shows is compared with cryptsetup 2.6's own dialog for the same answer.

mod common;

use common::env::tools_missing;
use common::run::{assert_refused, command, ok, output_within, Run, Workspace, DMKIT_LIMIT};
use common::tty::on_terminal;
use dmkit::block::signature::probe_file;
use std::fs;
use std::path::Path;

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const QUESTION: &str = "Are you sure? (Type 'yes' in capital letters): ";

fn tools() -> bool {
    !tools_missing(&[
        ("script", "bsdutils"),
        ("mkfs.ext4", "e2fsprogs"),
        ("cryptsetup", "cryptsetup-bin"),
    ])
}

/// A work directory with a key file `pass` (passphrase "pw") and a second one `pass2`.
fn workspace() -> Workspace {
    let w = Workspace::new();
    fs::write(w.path("pass"), b"pw").unwrap();
    fs::write(w.path("pass2"), b"pw2").unwrap();
    w
}

/// A fresh `name` of 32 MiB holding an ext4 filesystem.
fn ext4(w: &Workspace, name: &str) -> String {
    let img = w.sparse(name, 32 << 20);
    ok("mkfs.ext4", &["-q", "-F", &img]);
    img
}

/// A fresh LUKS2 `name` of 32 MiB with keyslot 0 for `pass`.
fn luks(w: &Workspace, name: &str) -> String {
    let img = w.sparse(name, 32 << 20);
    let pass = w.s("pass");
    w.run
        .ok(&[&["luks", "format", "-q"][..], &FAST, &[&img, &pass]].concat());
    img
}

/// blkid-style names of what `path` holds.
fn signatures(path: &str) -> Vec<&'static str> {
    probe_file(&fs::File::open(path).unwrap(), 0)
        .unwrap()
        .iter()
        .map(|s| s.name)
        .collect()
}

/// `args` as one shell command line run in `dir` (paths are temporary directories without
/// quotes in them).
fn shell(dir: &Path, program: &str, args: &[&str]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    format!("cd '{}' && {program} {}", dir.display(), quoted.join(" "))
}

/// `dmkit args...` without a terminal (stdin from /dev/null), run in the work directory.
fn in_dir(w: &Workspace, args: &[&str]) -> Run {
    let mut cmd = command(common::DMKIT, args, Some(w.run.path()));
    cmd.current_dir(w.dir());
    let out = output_within(&mut cmd, DMKIT_LIMIT);
    Run::new(format!("dmkit {}", args.join(" ")), &out)
}

/// One destructive command, tried the four ways.
struct Case<'a> {
    /// Makes the target afresh; returns the file that must not change when refused.
    setup: &'a dyn Fn() -> String,
    /// `dmkit` arguments (relative paths, run in the work directory), without `-q`.
    args: Vec<&'a str>,
    /// The question's text, then lines the terminal must show before it.
    shows: Vec<String>,
    /// Words after `no` (cryptsetup's), and the exit code.
    aborted: &'a str,
    code: i32,
    /// Whether the command did its work on the target.
    done: &'a dyn Fn(&str) -> bool,
}

fn four_ways(w: &Workspace, c: &Case) {
    let dir = w.dir();
    let what = c.args.join(" ");

    // A terminal, answered "no".
    let target = (c.setup)();
    let before = fs::read(&target).unwrap();
    let t = on_terminal(
        &shell(dir, common::DMKIT, &c.args),
        w.run.path(),
        &[(QUESTION, b"no\n")],
    );
    assert_eq!(t.code, c.code, "{what}, answered no:\n{}", t.text);
    let dialog = format!("\nWARNING!\n========\n{}\n\n{QUESTION}no\n", c.shows[0]);
    assert!(t.text.contains(&dialog), "{what}:\n{}", t.text);
    for line in &c.shows[1..] {
        assert!(
            t.text.contains(line.as_str()),
            "{what}: {line}:\n{}",
            t.text
        );
    }
    assert!(t.text.contains(c.aborted), "{what}:\n{}", t.text);
    assert!(
        fs::read(&target).unwrap() == before,
        "{what}: answered no, but {target} changed"
    );

    // No terminal, no -q.
    let r = in_dir(w, &c.args);
    assert_refused(&r, 1, &[&["without confirmation"], &["-q/--batch-mode"]]);
    assert!(
        fs::read(&target).unwrap() == before,
        "{what}: refused, but {target} changed"
    );
    assert!(!(c.done)(&target), "{what}: refused, yet done");

    // A terminal, answered YES.
    let target = (c.setup)();
    let t = on_terminal(
        &shell(dir, common::DMKIT, &c.args),
        w.run.path(),
        &[(QUESTION, b"YES\n")],
    );
    assert_eq!(t.code, 0, "{what}, answered YES:\n{}", t.text);
    assert!(
        (c.done)(&target),
        "{what}: answered YES, not done:\n{}",
        t.text
    );

    // -q and --batch-mode, no terminal.
    for flag in ["-q", "--batch-mode"] {
        let target = (c.setup)();
        let args = [&c.args[..], &[flag]].concat();
        let r = in_dir(w, &args);
        r.assert_ok();
        assert!(
            !r.stderr.contains("WARNING"),
            "{what} {flag}:\n{}",
            r.describe()
        );
        assert!((c.done)(&target), "{what} {flag}: not done");
    }
}

#[test]
fn integrity_format_asks() {
    if !tools() {
        return;
    }
    let w = workspace();
    four_ways(
        &w,
        &Case {
            setup: &|| ext4(&w, "disk.img"),
            args: vec!["integrity", "format", "disk.img"],
            shows: vec![
                "This will overwrite data on disk.img irrevocably.".into(),
                "WARNING: Device disk.img already contains a 'ext4' superblock signature.".into(),
            ],
            aborted: "Operation aborted.",
            code: 1,
            done: &|p| signatures(p) == ["DM_integrity"],
        },
    );
}

#[test]
fn luks_format_asks_for_luks2_luks1_and_integrity() {
    if !tools() {
        return;
    }
    let w = workspace();
    let kinds: [&[&str]; 3] = [&[], &["--type", "luks1"], &["--integrity", "hmac-sha256"]];
    for extra in kinds {
        let args = [&["luks", "format"][..], extra, &FAST, &["disk.img", "pass"]].concat();
        four_ways(
            &w,
            &Case {
                setup: &|| ext4(&w, "disk.img"),
                args,
                shows: vec![
                    "This will overwrite data on disk.img irrevocably.".into(),
                    "WARNING: Device disk.img already contains a 'ext4' superblock signature."
                        .into(),
                ],
                aborted: "Operation aborted.",
                code: 1,
                done: &|p| signatures(p) == ["crypto_LUKS"],
            },
        );
    }
    // Over an existing LUKS header, that is what it names.
    luks(&w, "old.img");
    let t = on_terminal(
        &shell(
            w.dir(),
            common::DMKIT,
            &[&["luks", "format"][..], &FAST, &["old.img", "pass"]].concat(),
        ),
        w.run.path(),
        &[(QUESTION, b"no\n")],
    );
    assert!(
        t.text.contains(
            "WARNING: Device old.img already contains a 'crypto_LUKS' superblock signature."
        ),
        "{}",
        t.text
    );
}

#[test]
fn verity_format_asks_only_over_a_superblock() {
    if !tools() {
        return;
    }
    let w = workspace();
    let data = w.sparse("data.img", 4 << 20);
    let uuid = "11111111-2222-3333-4444-555555555555";
    // A new hash file, or one of zeros: nothing to ask about, even without a terminal.
    w.run.ok(&["verity", "format", &data, &w.s("new.img")]);
    w.sparse("zeros.img", 1 << 20);
    w.run.ok(&["verity", "format", &data, &w.s("zeros.img")]);
    let dump_uuid = |p: &str| {
        let out = w.run.ok(&["verity", "dump", p]);
        common::status_field(&out, "UUID")
    };
    four_ways(
        &w,
        &Case {
            setup: &|| {
                let h = w.s("hash.img");
                let _ = fs::remove_file(&h);
                w.run.ok(&["verity", "format", &data, &h]);
                h
            },
            args: vec!["verity", "format", "--uuid", uuid, "data.img", "hash.img"],
            shows: vec![
                "This will overwrite data on hash.img irrevocably.".into(),
                "WARNING: Device hash.img already contains a 'DM_verity_hash' superblock signature."
                    .into(),
            ],
            aborted: "Operation aborted.",
            code: 1,
            done: &|p| dump_uuid(p).as_deref() == Some(uuid),
        },
    );
}

#[test]
fn header_restore_asks() {
    if !tools() {
        return;
    }
    let w = workspace();
    let backup = w.s("backup.hdr");
    luks(&w, "disk.img");
    w.run.ok(&[
        "luks",
        "header-backup",
        &w.s("disk.img"),
        "--header-backup-file",
        &backup,
    ]);
    let saved_uuid = w.run.ok(&["luks", "uuid", &w.s("disk.img")]);
    let uuid = |p: &str| w.run.ok(&["luks", "uuid", p]);
    four_ways(
        &w,
        &Case {
            // Formatted again: another UUID, which the restore puts back.
            setup: &|| luks(&w, "disk.img"),
            args: vec!["luks", "header-restore", "disk.img", "--header-backup-file", "backup.hdr"],
            shows: vec![
                "Device disk.img already contains LUKS2 header. Replacing header will destroy existing keyslots.\nWARNING: real device header has different UUID than backup!".into(),
            ],
            aborted: "",
            code: 1,
            done: &|p| uuid(p) == saved_uuid,
        },
    );
    // Onto a filesystem: cryptsetup's other question, and what is there named.
    ext4(&w, "fs.img");
    let t = on_terminal(
        &shell(
            w.dir(),
            common::DMKIT,
            &[
                "luks",
                "header-restore",
                "fs.img",
                "--header-backup-file",
                "backup.hdr",
            ],
        ),
        w.run.path(),
        &[(QUESTION, b"no\n")],
    );
    assert_eq!(t.code, 1, "{}", t.text);
    assert!(t.text.contains("Device fs.img does not contain LUKS2 header. Replacing header can destroy data on that device."), "{}", t.text);
    assert!(t.text.contains("'ext4' superblock signature"), "{}", t.text);
}

#[test]
fn the_last_keyslot_asks_before_it_goes() {
    if !tools() {
        return;
    }
    let w = workspace();
    let opens = |p: &str| {
        w.run
            .run(&["luks", "test-passphrase", p, "--key-file", &w.s("pass")])
            .code
            == Some(0)
    };
    for args in [
        vec!["luks", "kill-slot", "disk.img", "0", "--key-file", "pass"],
        vec!["luks", "remove-key", "disk.img", "--key-file", "pass"],
    ] {
        four_ways(
            &w,
            &Case {
                setup: &|| luks(&w, "disk.img"),
                args,
                shows: vec![
                    "This is the last keyslot. Device will become unusable after purging this key."
                        .into(),
                ],
                aborted: "Operation aborted, the keyslot was NOT wiped.",
                code: 2,
                done: &|p| !opens(p),
            },
        );
    }
    // Not the last one: no question, with or without a terminal.
    let img = luks(&w, "two.img");
    w.run.ok(&[
        &["luks", "add-key"][..],
        &FAST,
        &[&img, &w.s("pass2"), "--key-file", &w.s("pass")],
    ]
    .concat());
    w.run
        .ok(&["luks", "kill-slot", &img, "1", "--key-file", &w.s("pass")]);
    assert!(opens(&img));
}

/// What a terminal shows of cryptsetup's dialog for `cs_args` and of dmkit's for `dm_args`,
/// both answered `no` and run in the same directory: the same, line for line (cryptsetup ends
/// with a blank line of its own).
fn same_dialog_as_cryptsetup(w: &Workspace, setup: &dyn Fn(), cs_args: &[&str], dm_args: &[&str]) {
    setup();
    let cs = on_terminal(
        &shell(w.dir(), "cryptsetup", cs_args),
        w.run.path(),
        &[(QUESTION, b"no\n")],
    );
    setup();
    let dm = on_terminal(
        &shell(w.dir(), common::DMKIT, dm_args),
        w.run.path(),
        &[(QUESTION, b"no\n")],
    );
    assert_eq!(
        dm.text.trim_end(),
        cs.text.trim_end(),
        "{dm_args:?} against cryptsetup"
    );
    assert_eq!(
        dm.code, cs.code,
        "{dm_args:?}: exit code against cryptsetup's"
    );
}

#[test]
fn the_dialogs_are_cryptsetups() {
    if !tools() {
        return;
    }
    let w = workspace();
    let fmt = [&FAST[..], &["disk.img", "pass"]].concat();
    same_dialog_as_cryptsetup(
        &w,
        &|| {
            ext4(&w, "disk.img");
        },
        &[&["luksFormat"][..], &fmt].concat(),
        &[&["luks", "format"][..], &fmt].concat(),
    );
    same_dialog_as_cryptsetup(
        &w,
        &|| {
            luks(&w, "disk.img");
        },
        // (With --key-file, cryptsetup wipes the last keyslot without asking; dmkit asks.)
        &["luksKillSlot", "disk.img", "0"],
        &["luks", "kill-slot", "disk.img", "0"],
    );
    same_dialog_as_cryptsetup(
        &w,
        &|| {
            luks(&w, "disk.img");
        },
        &["luksRemoveKey", "disk.img", "--key-file", "pass"],
        &["luks", "remove-key", "disk.img", "--key-file", "pass"],
    );
    luks(&w, "disk.img");
    w.run.ok(&[
        "luks",
        "header-backup",
        &w.s("disk.img"),
        "--header-backup-file",
        &w.s("b.hdr"),
    ]);
    same_dialog_as_cryptsetup(
        &w,
        &|| {
            luks(&w, "disk.img");
        },
        &[
            "luksHeaderRestore",
            "disk.img",
            "--header-backup-file",
            "b.hdr",
        ],
        &[
            "luks",
            "header-restore",
            "disk.img",
            "--header-backup-file",
            "b.hdr",
        ],
    );
}
