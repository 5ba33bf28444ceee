//! Files that hold key material or headers get owner-only modes whatever the umask: a header
//! backup is `-r--------` (0400) and never written over an existing file, as cryptsetup makes
//! it; a new detached header is 0600; the run directory's private files (state, log, lock,
//! socket) are 0600 in a 0700 directory. dmkit runs here under umask 000 (everything the
//! process asks for is granted) and 0277 (even the owner's write bit is taken).

mod common;

use common::run::{self, Workspace};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Output;

/// The umasks the tests run dmkit under.
const UMASKS: [libc::mode_t; 2] = [0o000, 0o277];

/// `dmkit args...` in `e`'s run directory under `umask`.
fn dmkit_under(e: &Workspace, umask: libc::mode_t, args: &[&str]) -> Output {
    let mut cmd = run::command(common::DMKIT, args, Some(e.run.path()));
    // SAFETY: umask(2) is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(umask);
            Ok(())
        });
    }
    let out = run::output_within(&mut cmd, run::DMKIT_LIMIT);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(e: &Workspace, umask: libc::mode_t, args: &[&str]) {
    let o = dmkit_under(e, umask, args);
    assert!(
        o.status.success(),
        "umask {umask:o}: dmkit {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// A LUKS2 (or LUKS1) image with a cheap keyslot for passphrase file `pass`.
fn luks(e: &Workspace, name: &str, luks_type: &str) -> String {
    let img = e.sparse(name, 20 << 20);
    let o = e.dmkit(&[
        "luks",
        "format",
        "-q",
        "--type",
        luks_type,
        "--key-file",
        &e.s("pass"),
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        &img,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    img
}

#[test]
fn header_backups_are_owner_read_only_and_never_overwrite() {
    let e = Workspace::new();
    fs::write(e.path("pass"), "right passphrase").unwrap();
    let cs = !common::env::tool_missing("cryptsetup", "cryptsetup-bin");
    for luks_type in ["luks2", "luks1"] {
        let img = luks(&e, &format!("{luks_type}.img"), luks_type);
        for umask in UMASKS {
            let backup = e.s(&format!("{luks_type}-{umask:o}.backup"));
            let args = [
                "luks",
                "header-backup",
                "--header-backup-file",
                &backup,
                &img,
            ];
            ok(&e, umask, &args);
            assert_eq!(
                mode(Path::new(&backup)),
                0o400,
                "{luks_type}, umask {umask:o}"
            );
            // The backup restores: it is the header.
            let bytes = fs::read(&backup).unwrap();
            assert!(bytes.len() >= 4096 && fs::read(&img).unwrap().starts_with(&bytes));
            // Again onto the same file: refused in cryptsetup's words, the backup untouched.
            let o = dmkit_under(&e, umask, &args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert_eq!(
                err.trim_end(),
                format!("dmkit: Requested header backup file {backup} already exists.")
            );
            assert!(fs::read(&backup).unwrap() == bytes);
            assert_eq!(mode(Path::new(&backup)), 0o400);
        }
        // Not through a symlink to a file that does not exist yet either.
        let link = e.path(&format!("{luks_type}.link"));
        std::os::unix::fs::symlink(e.path("elsewhere"), &link).unwrap();
        let o = dmkit_under(
            &e,
            0,
            &[
                "luks",
                "header-backup",
                "--header-backup-file",
                link.to_str().unwrap(),
                &img,
            ],
        );
        assert_eq!(o.status.code(), Some(1));
        assert!(!e.path("elsewhere").exists(), "the symlink was followed");
        fs::remove_file(&link).unwrap();
        if cs {
            // What dmkit does is what cryptsetup does.
            let backup = e.s(&format!("{luks_type}-cryptsetup.backup"));
            let sh = format!("umask 000 && exec cryptsetup luksHeaderBackup --header-backup-file '{backup}' '{img}'");
            run::ok("sh", &["-c", &sh]);
            assert_eq!(mode(Path::new(&backup)), 0o400, "cryptsetup's backup");
            let o = run::output("sh", &["-c", &sh]);
            assert!(!o.status.success());
            assert!(
                String::from_utf8_lossy(&o.stderr).contains(&format!(
                    "Requested header backup file {backup} already exists."
                )),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

#[test]
fn new_detached_headers_are_owner_only() {
    let e = Workspace::new();
    fs::write(e.path("pass"), "right passphrase").unwrap();
    for umask in UMASKS {
        let data = e.sparse(&format!("data-{umask:o}.img"), 8 << 20);
        let hdr = e.s(&format!("hdr-{umask:o}.img"));
        ok(
            &e,
            umask,
            &[
                "luks",
                "format",
                "-q",
                "--header",
                &hdr,
                "--key-file",
                &e.s("pass"),
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                &data,
            ],
        );
        assert_eq!(mode(Path::new(&hdr)), 0o600, "umask {umask:o}");
        let o = e.dmkit(&[
            "luks",
            "test-passphrase",
            "--header",
            &hdr,
            "--key-file",
            &e.s("pass"),
            &data,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // An existing header file is used as it is, its mode left to its owner.
    let data = e.sparse("data.img", 8 << 20);
    let hdr = e.sparse("hdr.img", 0);
    fs::set_permissions(&hdr, fs::Permissions::from_mode(0o640)).unwrap();
    ok(
        &e,
        0,
        &[
            "luks",
            "format",
            "-q",
            "--header",
            &hdr,
            "--key-file",
            &e.s("pass"),
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            &data,
        ],
    );
    assert_eq!(mode(Path::new(&hdr)), 0o640);
}

#[test]
fn run_directory_files_are_private() {
    for umask in UMASKS {
        let e = Workspace::new();
        let disk = e.sparse("disk.img", 1 << 20);
        let sock = e.path("d.sock");
        let addr = format!("unix:{}", sock.display());
        ok(
            &e,
            umask,
            &["linear", "open", &disk, "d", "--no-fuse", "--nbd", &addr],
        );
        e.run.track("d");
        let private = e.run.path().join(".dmkit");
        // Others may look names up in root's run directory (as in /dev/mapper).
        let run_mode = if common::env::is_root() { 0o755 } else { 0o700 };
        assert_eq!(mode(e.run.path()), run_mode, "umask {umask:o}: run dir");
        assert_eq!(mode(&private), 0o700, "umask {umask:o}: private dir");
        let mut seen = Vec::new();
        for entry in fs::read_dir(&private).unwrap() {
            let p = entry.unwrap().path();
            assert_eq!(mode(&p), 0o600, "umask {umask:o}: {}", p.display());
            seen.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
        seen.sort();
        assert!(
            ["d.json", "d.lock", "d.log"]
                .iter()
                .all(|f| seen.iter().any(|s| s == f)),
            "umask {umask:o}: {seen:?}"
        );
        assert_eq!(mode(&sock), 0o600, "umask {umask:o}: NBD socket");
        e.run.close("d");
    }
}
