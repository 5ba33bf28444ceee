//! The documentation works as shown: every code block of README.md and docs/*.md that has a
//! line starting with `$ dmkit` is run, in order, in a scratch directory of its own per file.
//!
//! Conventions (also in docs/README-test.md):
//! - A line starting with `$ ` is a command, run by `bash -c` in the scratch directory with
//!   this build's `dmkit` first on PATH and a private `DMKIT_RUN_DIR`; stdout and stderr are
//!   compared together. Every command of a block is run, setup lines (`$ truncate ...`) too.
//! - The lines after a command, up to the next command, are its expected output. A last line
//!   `(exit N)` is its exit status (without one it must succeed).
//! - `...` inside a line matches any text on that line (for UUIDs, salts, pids, timings); a line
//!   that is only `...` matches any number of lines. Everything else is compared exactly, after
//!   the private run directory is written back as `/run/dmkit` and the scratch directory as
//!   `/tmp/readme` (and the other way round in commands).
//! - `<!-- readme-test: skip REASON -->` on the line before a block leaves it out (a benchmark
//!   that takes minutes, a kernel feature, another machine); the reason is printed.
//! - `DMKIT_README_BLESS=1` writes the actual output into the files where it differs (keeping
//!   lines whose `...` still match), to re-paste after a behaviour change; review the diff.
//!
//! Blocks mount file systems and attach loop devices: the test needs root, /dev/fuse and loop
//! devices (a failure in CI, a skip otherwise).

mod common;

use common::env::{loop_missing, tools_missing};
use common::run::{output_within, Run};
use common::DMKIT;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SKIP: &str = "<!-- readme-test: skip";
const TMP_NAME: &str = "/tmp/readme";

/// One `$ command` and what the documentation says it prints.
struct Step {
    command: String,
    /// Line index in the file of the first expected-output line.
    first: usize,
    expected: Vec<String>,
    exit: i32,
}

/// A code block with `$ dmkit` lines.
struct Block {
    /// Line index of the opening fence.
    line: usize,
    steps: Vec<Step>,
}

fn parse(text: &str) -> (Vec<Block>, Vec<(usize, String)>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut blocks, mut skipped) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with("```") {
            i += 1;
            continue;
        }
        let start = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or(lines.len());
        let body = &lines[start + 1..end];
        i = end + 1;
        if !body.iter().any(|l| l.starts_with("$ dmkit")) {
            continue;
        }
        if start > 0 && lines[start - 1].starts_with(SKIP) {
            skipped.push((start + 1, lines[start - 1].to_string()));
            continue;
        }
        let mut steps: Vec<Step> = Vec::new();
        for (k, l) in body.iter().enumerate() {
            if let Some(c) = l.strip_prefix("$ ") {
                steps.push(Step {
                    command: c.to_string(),
                    first: start + 1 + k + 1,
                    expected: Vec::new(),
                    exit: 0,
                });
            } else if let Some(s) = steps.last_mut() {
                s.expected.push(l.to_string());
            }
        }
        for s in &mut steps {
            let code = s.expected.last().and_then(|l| {
                l.strip_prefix("(exit ")
                    .and_then(|r| r.strip_suffix(')'))
                    .and_then(|n| n.parse().ok())
            });
            if let Some(c) = code {
                s.exit = c;
                s.expected.pop();
            }
        }
        blocks.push(Block { line: start, steps });
    }
    (blocks, skipped)
}

/// Whether `got` matches the pattern line `want` (`...` matches any text).
fn line_matches(want: &str, got: &str) -> bool {
    let parts: Vec<&str> = want.split("...").collect();
    if parts.len() == 1 {
        return want == got;
    }
    let mut rest = match got.strip_prefix(parts[0]) {
        Some(r) => r,
        None => return false,
    };
    for (n, p) in parts.iter().enumerate().skip(1) {
        if n == parts.len() - 1 {
            return rest.ends_with(p);
        }
        match rest.find(p) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    true
}

/// Whether the lines `got` match the pattern `want` (a line `...` matches any lines).
fn lines_match(want: &[String], got: &[String]) -> bool {
    match want.first() {
        None => got.is_empty(),
        Some(w) if w == "..." => (0..=got.len()).any(|k| lines_match(&want[1..], &got[k..])),
        Some(w) => {
            !got.is_empty() && line_matches(w, &got[0]) && lines_match(&want[1..], &got[1..])
        }
    }
}

/// The bless output for one step: the actual lines, except that an expected line with `...`
/// at the same position that still matches is kept.
fn blessed(want: &[String], got: &[String]) -> Vec<String> {
    got.iter()
        .enumerate()
        .map(|(k, g)| match want.get(k) {
            Some(w) if w.contains("...") && w != "..." && line_matches(w, g) => w.clone(),
            _ => g.clone(),
        })
        .collect()
}

struct Scratch {
    dir: tempfile::TempDir,
    run: PathBuf,
    bin: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(DMKIT, bin.join("dmkit")).unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        Scratch { dir, run, bin }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Runs `command` as the documentation shows it: `/run/dmkit` and `/tmp/readme` in it
    /// stand for the private run directory and the scratch directory.
    fn sh(&self, command: &str) -> Run {
        let command = command
            .replace("/run/dmkit", &self.run.display().to_string())
            .replace(TMP_NAME, &self.work().display().to_string());
        let command = command.as_str();
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &format!("exec 2>&1; {command}")])
            .current_dir(self.work())
            .env("PATH", path)
            .env("DMKIT_RUN_DIR", &self.run)
            .env("LC_ALL", "C.UTF-8")
            .env_remove("CI");
        Run::new(
            command.into(),
            &output_within(&mut cmd, Duration::from_secs(120)),
        )
    }

    /// The output as the documentation shows it.
    fn shown(&self, out: &str) -> Vec<String> {
        let work = self.work();
        let run = self.run.display().to_string();
        out.replace(&run, "/run/dmkit")
            .replace(&work.display().to_string(), TMP_NAME)
            .lines()
            .map(|l| l.trim_end().to_string())
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Unmount what a failing block left mounted in the scratch directory, then close every
        // device of the private run directory.
        let work = self.work().display().to_string();
        if let Ok(m) = std::fs::read_to_string("/proc/self/mounts") {
            let mut points: Vec<&str> = m
                .lines()
                .filter_map(|l| l.split(' ').nth(1))
                .filter(|p| p.starts_with(&work))
                .collect();
            points.reverse();
            for p in points {
                let _ = Command::new("umount").args(["-l", p]).status();
            }
        }
        let _ = self.sh("for n in $(dmkit status --json 2>/dev/null | grep -o '\"name\": *\"[^\"]*\"' | cut -d'\"' -f4); do dmkit close \"$n\"; done");
    }
}

/// Runs the blocks of one file; returns the failures and, when blessing, the new text.
fn run_file(path: &Path, bless: bool) -> (Vec<String>, Option<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let (blocks, skipped) = parse(&text);
    let name = path
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string();
    for (line, why) in skipped {
        eprintln!("{name}:{line}: skipped: {why}");
    }
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // (first line, count, replacement), applied from the end.
    let mut edits: Vec<(usize, usize, Vec<String>)> = Vec::new();
    let mut failures = Vec::new();
    let scratch = Scratch::new();
    for b in &blocks {
        let t = Instant::now();
        for s in &b.steps {
            let r = scratch.sh(&s.command);
            let got = scratch.shown(&r.stdout);
            let code = r.code.unwrap_or(-1);
            if code != s.exit || !lines_match(&s.expected, &got) {
                failures.push(format!(
                    "{name}:{}: $ {}\n  exit {code} (documented {})\n  documented:\n    {}\n  got:\n    {}",
                    s.first,
                    s.command,
                    s.exit,
                    s.expected.join("\n    "),
                    got.join("\n    ")
                ));
                let mut new = blessed(&s.expected, &got);
                if code != 0 {
                    new.push(format!("(exit {code})"));
                }
                let old = s.expected.len() + usize::from(s.exit != 0);
                edits.push((s.first, old, new));
            }
        }
        eprintln!("{name}:{}: {:.1} s", b.line + 1, t.elapsed().as_secs_f64());
    }
    drop(scratch);
    if !bless || edits.is_empty() {
        return (failures, None);
    }
    for (first, old, new) in edits.into_iter().rev() {
        lines.splice(first..first + old, new);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    (failures, Some(out))
}

fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

#[test]
fn every_documented_command_works_as_shown() {
    if loop_missing()
        || tools_missing(&[
            ("mkfs.ext4", "e2fsprogs"),
            ("cryptsetup", "cryptsetup-bin"),
            ("openssl", "openssl"),
            ("jq", "jq"),
            ("fsverity", "fsverity"),
        ])
    {
        return;
    }
    let bless = std::env::var_os("DMKIT_README_BLESS").is_some();
    let mut failures = Vec::new();
    for doc in documents() {
        let (f, new) = run_file(&doc, bless);
        failures.extend(f);
        if let Some(new) = new {
            std::fs::write(&doc, new).unwrap();
            eprintln!("{}: blessed", doc.display());
        }
    }
    assert!(
        failures.is_empty(),
        "{} documented command(s) do not work as shown{}:\n\n{}",
        failures.len(),
        if bless {
            " (blessed: review the diff)"
        } else {
            ""
        },
        failures.join("\n\n")
    );
}

#[test]
fn the_conventions_match_as_documented() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(line_matches("UUID: ...", "UUID: 1234"));
    assert!(line_matches("a ... c ... e", "a b c d e"));
    assert!(!line_matches("a ... c", "a b d"));
    assert!(!line_matches("exact", "exact "));
    assert!(lines_match(
        &v(&["a", "...", "z"]),
        &v(&["a", "b", "c", "z"])
    ));
    assert!(lines_match(&v(&["a", "...", "z"]), &v(&["a", "z"])));
    assert!(!lines_match(&v(&["a", "z"]), &v(&["a", "b", "z"])));
    let (blocks, skipped) = parse(
        "```\n$ truncate -s 1M x\n$ dmkit verity dump x\nout\n(exit 4)\n```\n\
         <!-- readme-test: skip why -->\n```\n$ dmkit bench\n```\n```\n$ ls\n```\n",
    );
    assert_eq!((blocks.len(), skipped.len()), (1, 1));
    let s = &blocks[0].steps;
    assert_eq!(
        (s.len(), s[1].exit, s[1].expected.clone()),
        (2, 4, v(&["out"]))
    );
}
