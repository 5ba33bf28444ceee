//! The documented install step (`scripts/install-docs.sh PREFIX`) gives man pages that render
//! (`man dmkit-luks`, one page per command group) and a bash completion that completes
//! `dmkit luks ` to its subcommands. Installed under a temporary PREFIX, never /usr/local.
//!
//! Needs man (man-db, groff-base) and bash: a failure in CI, a skip otherwise.

mod common;

use common::env::tools_missing;
use common::run::{output_within, Run};
use common::DMKIT;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn run(cmd: &mut Command, what: &str) -> Run {
    Run::new(what.into(), &output_within(cmd, Duration::from_secs(120)))
}

fn install(prefix: &Path) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/install-docs.sh");
    run(
        Command::new("bash")
            .arg(script)
            .arg(prefix)
            .env("DMKIT", DMKIT),
        "scripts/install-docs.sh PREFIX",
    )
    .ok();
}

#[test]
fn man_pages_render_one_per_command_group() {
    if tools_missing(&[("man", "man-db"), ("groff", "groff-base")]) {
        return;
    }
    let prefix = tempfile::tempdir().unwrap();
    install(prefix.path());
    let manpath = prefix.path().join("share/man");
    for group in [
        "dmkit",
        "dmkit-verity",
        "dmkit-integrity",
        "dmkit-luks",
        "dmkit-plain",
        "dmkit-fsverity",
        "dmkit-image",
        "dmkit-linear",
        "dmkit-bench",
        "dmkit-open",
        "dmkit-close",
        "dmkit-status",
    ] {
        let r = run(
            Command::new("man")
                .args(["-P", "cat", group])
                .env("MANPATH", &manpath)
                .env("MANWIDTH", "100"),
            &format!("MANPATH=... man {group}"),
        )
        .ok();
        assert!(r.stdout.contains("NAME"), "{}", r.describe());
        // The NAME line (groff justifies it, so the spaces around the dash vary).
        let named = r.stdout.lines().any(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some(group) && w.next() == Some("-")
        });
        assert!(named, "no NAME line for {group}: {}", r.describe());
    }
    // The luks group page lists its commands, each with a page of its own.
    let r = run(
        Command::new("man")
            .args(["-P", "cat", "dmkit-luks"])
            .env("MANPATH", &manpath)
            .env("MANWIDTH", "100"),
        "man dmkit-luks",
    )
    .ok();
    for sub in [
        "dmkit-luks-format(1)",
        "dmkit-luks-open(1)",
        "dmkit-luks-header-backup(1)",
    ] {
        assert!(r.stdout.contains(sub), "no {sub}: {}", r.describe());
    }
    let r = run(
        Command::new("man")
            .args(["-P", "cat", "dmkit-luks-format"])
            .env("MANPATH", &manpath)
            .env("MANWIDTH", "100"),
        "man dmkit-luks-format",
    )
    .ok();
    assert!(
        r.stdout.contains("--batch-mode") || r.stdout.contains("-q"),
        "{}",
        r.describe()
    );
}

/// What bash completes after `line` (which ends where the cursor is), with the installed
/// completion sourced and its function called as bash's `complete -F` would.
fn complete(prefix: &Path, words: &[&str]) -> Vec<String> {
    let script = prefix.join("share/bash-completion/completions/dmkit");
    let words_q: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let line = words.join(" ");
    let cmd = format!(
        "source '{}'\n\
         COMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_LINE='{line}'\nCOMP_POINT=${{#COMP_LINE}}\n\
         _dmkit dmkit '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words_q.join(" "),
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let r = run(
        Command::new("bash").args(["--norc", "-c", &cmd]),
        "bash completion",
    )
    .ok();
    r.stdout.lines().map(str::to_string).collect()
}

#[test]
fn bash_completes_luks_to_its_subcommands() {
    if tools_missing(&[("bash", "bash")]) {
        return;
    }
    let prefix = tempfile::tempdir().unwrap();
    install(prefix.path());
    let got = complete(prefix.path(), &["dmkit", "luks", ""]);
    for want in [
        "format",
        "open",
        "dump",
        "add-key",
        "header-backup",
        "close",
    ] {
        assert!(got.iter().any(|w| w == want), "no {want} in {got:?}");
    }
    assert!(
        !got.iter().any(|w| w == "verity"),
        "top-level words in {got:?}"
    );
    // A prefix narrows it, and the top level offers the groups.
    let he = complete(prefix.path(), &["dmkit", "luks", "he"]);
    assert!(he.iter().all(|w| w.starts_with("he")), "{he:?}");
    for want in ["header-backup", "header-restore"] {
        assert!(he.iter().any(|w| w == want), "no {want} in {he:?}");
    }
    let top = complete(prefix.path(), &["dmkit", ""]);
    for want in [
        "verity",
        "integrity",
        "luks",
        "fsverity",
        "image",
        "close",
        "status",
        "generate",
    ] {
        assert!(top.iter().any(|w| w == want), "no {want} in {top:?}");
    }
}
