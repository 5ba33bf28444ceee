//! Passphrase input by cryptsetup's rules, checked against cryptsetup itself: for every way of
//! giving a passphrase (a line of stdin, `--key-file -`, key files with `--keyfile-offset` and
//! `--keyfile-size`, empty passphrases, 600-byte passphrases, a terminal with its 512-byte
//! limit), what one tool formats with an input the other opens with the same input and with a
//! key file holding exactly the expected bytes; inputs cryptsetup refuses we refuse with its exit
//! code; add-key reads the new passphrase from the next line of stdin or `--new-keyfile` with
//! `--new-keyfile-offset`/`--new-keyfile-size`, as cryptsetup does.

mod common;

use common::env::tool_missing;
use common::run::Workspace;
use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// `program args...` with `input` on stdin; (exit code, stderr).
fn with_stdin(
    program: &str,
    args: &[String],
    input: &[u8],
    run_dir: &std::path::Path,
) -> (i32, String) {
    let mut child = Command::new(program)
        .args(args)
        .env("DMKIT_RUN_DIR", run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    // A tool may stop reading early (a line, --keyfile-size): a broken pipe is fine.
    let _ = stdin.write_all(input);
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{program} {args:?} hangs");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "{program} {args:?}: {err}");
    (out.status.code().unwrap_or(-1), err)
}

/// The two tools: their format and test-passphrase command lines.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tool {
    Cryptsetup,
    Dmkit,
}

impl Tool {
    fn program(self) -> &'static str {
        match self {
            Tool::Cryptsetup => "cryptsetup",
            Tool::Dmkit => common::DMKIT,
        }
    }
    fn format(self, input: &[String], img: &str) -> Vec<String> {
        let head: &[&str] = match self {
            Tool::Cryptsetup => &["luksFormat", "-q"],
            Tool::Dmkit => &["luks", "format", "-q"],
        };
        strings(&[head, &FAST[..]])
            .into_iter()
            .chain(input.iter().cloned())
            .chain([img.to_string()])
            .collect()
    }
    fn test(self, input: &[String], img: &str) -> Vec<String> {
        let head: &[&str] = match self {
            Tool::Cryptsetup => &["open", "--test-passphrase"],
            Tool::Dmkit => &["luks", "test-passphrase"],
        };
        strings(&[head])
            .into_iter()
            .chain(input.iter().cloned())
            .chain([img.to_string()])
            .collect()
    }
    fn add_key(self, input: &[String], img: &str) -> Vec<String> {
        let head: &[&str] = match self {
            Tool::Cryptsetup => &["luksAddKey", "-q"],
            Tool::Dmkit => &["luks", "add-key"],
        };
        strings(&[head, &FAST[..]])
            .into_iter()
            .chain(input.iter().cloned())
            .chain([img.to_string()])
            .collect()
    }
}

fn strings(parts: &[&[&str]]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.iter().map(|s| s.to_string()))
        .collect()
}

/// One way of giving a passphrase: options, stdin, and the passphrase it means (`None`: both
/// tools refuse it, with the same exit code).
struct Input {
    what: &'static str,
    args: Vec<String>,
    stdin: Vec<u8>,
    means: Option<Vec<u8>>,
}

fn inputs(e: &Workspace) -> Vec<Input> {
    let file = |name: &str, bytes: &[u8]| {
        fs::write(e.path(name), bytes).unwrap();
        e.s(name)
    };
    let a600 = vec![b'a'; 600];
    let big = vec![b'k'; (8 << 20) + 1];
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        Input {
            what: "a 600-byte line on stdin (no key file) is taken whole",
            args: vec![],
            stdin: [&a600[..], b"\n"].concat(),
            means: Some(a600.clone()),
        },
        Input {
            what: "stdin without a key file stops at the first newline",
            args: vec![],
            stdin: b"first\nsecond".to_vec(),
            means: Some(b"first".to_vec()),
        },
        Input {
            what: "a lone newline on stdin is an empty passphrase",
            args: vec![],
            stdin: b"\n".to_vec(),
            means: Some(vec![]),
        },
        Input {
            what: "an empty key file is an empty passphrase",
            args: s(&["--key-file", &file("empty", b"")]),
            stdin: vec![],
            means: Some(vec![]),
        },
        Input {
            what: "--key-file - reads stdin to its end, newlines included",
            args: s(&["--key-file", "-"]),
            stdin: b"two\nlines\n".to_vec(),
            means: Some(b"two\nlines\n".to_vec()),
        },
        Input {
            what: "--keyfile-offset and --keyfile-size cut a key file",
            args: s(&[
                "--key-file",
                &file("cut", b"xyabcdef"),
                "--keyfile-offset",
                "2",
                "--keyfile-size",
                "3",
            ]),
            stdin: vec![],
            means: Some(b"abc".to_vec()),
        },
        Input {
            what: "--keyfile-size on a stdin line reads that many bytes",
            args: s(&["--keyfile-size", "3"]),
            stdin: b"abcdef\n".to_vec(),
            means: Some(b"abc".to_vec()),
        },
        Input {
            what: "--keyfile-offset on a stdin line skips bytes",
            args: s(&["--keyfile-offset", "2"]),
            stdin: b"xyline\n".to_vec(),
            means: Some(b"line".to_vec()),
        },
        Input {
            what: "a key file of 600 bytes with a newline in it",
            args: s(&[
                "--key-file",
                &file("nl", &[&a600[..300], b"\n", &a600[..299]].concat()),
            ]),
            stdin: vec![],
            means: Some([&a600[..300], b"\n", &a600[..299]].concat()),
        },
        Input {
            what: "nothing on stdin",
            args: vec![],
            stdin: vec![],
            means: None,
        },
        Input {
            what: "--keyfile-size larger than the key file",
            args: s(&["--key-file", &file("short", b"abc"), "--keyfile-size", "10"]),
            stdin: vec![],
            means: None,
        },
        Input {
            what: "--keyfile-offset past the end of the key file",
            args: s(&[
                "--key-file",
                &file("short2", b"abc"),
                "--keyfile-offset",
                "4",
            ]),
            stdin: vec![],
            means: None,
        },
        Input {
            what: "--keyfile-size larger than the stdin line",
            args: s(&["--keyfile-size", "10"]),
            stdin: b"abc\n".to_vec(),
            means: None,
        },
        Input {
            what: "a key file over 8 MiB without --keyfile-size",
            args: s(&["--key-file", &file("big", &big)]),
            stdin: vec![],
            means: None,
        },
        Input {
            what: "a key file over 8 MiB with --keyfile-size",
            args: s(&[
                "--key-file",
                &file("big2", &big),
                "--keyfile-size",
                &big.len().to_string(),
            ]),
            stdin: vec![],
            means: Some(big.clone()),
        },
    ]
}

#[test]
fn each_tool_opens_with_the_input_the_other_formatted_with() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let e = Workspace::new();
    let run_dir = e.run.path().to_path_buf();
    let wrong = e.s("wrong");
    fs::write(&wrong, "not it").unwrap();
    for input in inputs(&e) {
        for (maker, opener) in [
            (Tool::Cryptsetup, Tool::Dmkit),
            (Tool::Dmkit, Tool::Cryptsetup),
        ] {
            let what = format!("{} ({maker:?} formats, {opener:?} opens)", input.what);
            let img = e.sparse("disk.img", 20 << 20);
            let (code, err) = with_stdin(
                maker.program(),
                &maker.format(&input.args, &img),
                &input.stdin,
                &run_dir,
            );
            let Some(means) = &input.means else {
                // Refused: by both tools, with the same exit code.
                let (theirs, terr) = with_stdin(
                    opener.program(),
                    &opener.format(&input.args, &img),
                    &input.stdin,
                    &run_dir,
                );
                assert_ne!(code, 0, "{what}: {maker:?} accepted it");
                assert_eq!(code, theirs, "{what}: exit codes differ: {err} / {terr}");
                break;
            };
            assert_eq!(code, 0, "{what}: format: {err}");
            let (code, err) = with_stdin(
                opener.program(),
                &opener.test(&input.args, &img),
                &input.stdin,
                &run_dir,
            );
            assert_eq!(code, 0, "{what}: the same input does not open: {err}");
            let exact = e.s("exact");
            fs::write(&exact, means).unwrap();
            let mut key_file: Vec<String> = vec!["--key-file".into(), exact.clone()];
            if means.len() > 8 << 20 {
                key_file.extend(["--keyfile-size".into(), means.len().to_string()]);
            }
            let (code, err) = with_stdin(
                opener.program(),
                &opener.test(&key_file, &img),
                b"",
                &run_dir,
            );
            assert_eq!(
                code, 0,
                "{what}: the expected passphrase does not open: {err}"
            );
            let key_file: Vec<String> = vec!["--key-file".into(), wrong.clone()];
            let (code, _) = with_stdin(
                opener.program(),
                &opener.test(&key_file, &img),
                b"",
                &run_dir,
            );
            assert_eq!(code, 2, "{what}: a wrong passphrase opens");
        }
    }
}

#[test]
fn add_key_reads_the_new_passphrase_like_cryptsetup() {
    if tool_missing("cryptsetup", "cryptsetup-bin") {
        return;
    }
    let e = Workspace::new();
    let run_dir = e.run.path().to_path_buf();
    fs::write(e.path("old"), "old").unwrap();
    fs::write(e.path("newfile"), "..new passphrase..").unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // (options, stdin, the new passphrase)
    let cases: Vec<(Vec<String>, &[u8], &[u8])> = vec![
        (vec![], b"old\nnew one\n", b"new one"),
        (
            s(&["--key-file", &e.s("old")]),
            b"from stdin\n",
            b"from stdin",
        ),
        (
            s(&[
                "--new-keyfile",
                &e.s("newfile"),
                "--new-keyfile-offset",
                "2",
                "--new-keyfile-size",
                "14",
            ]),
            b"old\n",
            b"new passphrase",
        ),
        (
            s(&["--key-file", &e.s("old"), "--new-keyfile", &e.s("empty")]),
            b"",
            b"",
        ),
    ];
    fs::write(e.path("empty"), "").unwrap();
    for tool in [Tool::Cryptsetup, Tool::Dmkit] {
        for (args, stdin, new) in &cases {
            let img = e.sparse("disk.img", 20 << 20);
            let old = vec!["--key-file".to_string(), e.s("old")];
            let (code, err) = with_stdin(tool.program(), &tool.format(&old, &img), b"", &run_dir);
            assert_eq!(code, 0, "{err}");
            let (code, err) =
                with_stdin(tool.program(), &tool.add_key(args, &img), stdin, &run_dir);
            assert_eq!(code, 0, "{tool:?} add-key {args:?}: {err}");
            fs::write(e.path("exact"), new).unwrap();
            let exact = vec!["--key-file".to_string(), e.s("exact")];
            for opener in [Tool::Cryptsetup, Tool::Dmkit] {
                let (code, err) =
                    with_stdin(opener.program(), &opener.test(&exact, &img), b"", &run_dir);
                assert_eq!(
                    code, 0,
                    "{tool:?} add-key {args:?}: {opener:?} cannot open with {new:?}: {err}"
                );
            }
        }
    }
}

/// Run `command` (a shell command line) on a new terminal (`script`), typing `line` once it
/// prompted; its exit code.
fn on_terminal(command: &str, line: &[u8], run_dir: &std::path::Path) -> i32 {
    common::tty::on_terminal(command, run_dir, &[("passphrase", line)]).code
}

#[test]
fn a_terminal_takes_512_bytes_of_a_longer_line() {
    if tool_missing("cryptsetup", "cryptsetup-bin") || tool_missing("script", "bsdutils") {
        return;
    }
    let e = Workspace::new();
    let img = e.sparse("disk.img", 20 << 20);
    fs::write(e.path("k512"), vec![b'a'; 512]).unwrap();
    let status = Command::new("cryptsetup")
        .args([
            "luksFormat",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ])
        .arg(&img)
        .arg(e.path("k512"))
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let typed = [vec![b'a'; 600], b"\n".to_vec()].concat();
    let cs = format!("cryptsetup open --test-passphrase --tries 1 {img}");
    let ours = format!("{} luks test-passphrase {img}", common::DMKIT);
    assert_eq!(on_terminal(&cs, &typed, e.run.path()), 0, "cryptsetup");
    assert_eq!(on_terminal(&ours, &typed, e.run.path()), 0, "dmkit");
    let short = [vec![b'a'; 511], b"\n".to_vec()].concat();
    assert_eq!(on_terminal(&cs, &short, e.run.path()), 2, "cryptsetup");
    assert_eq!(on_terminal(&ours, &short, e.run.path()), 2, "dmkit");
}
