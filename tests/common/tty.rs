//! Typing at a command on a terminal: `script(1)` (bsdutils) runs it on a new pseudo-terminal,
//! the test waits for each prompt in what the terminal shows and types its answer.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a run on a terminal showed, and how it ended.
#[derive(Debug)]
pub struct Transcript {
    /// Exit code (`script -e` passes the command's on).
    pub code: i32,
    /// Everything the terminal showed (stdout and stderr, typed input echoed), `\r` removed.
    pub text: String,
}

/// Run `command` (a shell command line) on a new terminal with `DMKIT_RUN_DIR=run_dir`; for
/// each `(prompt, line)` in turn, wait until the terminal has shown `prompt`, then type `line`.
/// Fails the test when a prompt does not come within 30 s
/// or the command does not end within 60 s after it.
pub fn on_terminal(command: &str, run_dir: &Path, answers: &[(&str, &[u8])]) -> Transcript {
    let mut child = Command::new("script")
        .args(["-qec", command, "/dev/null"])
        .env("DMKIT_RUN_DIR", run_dir)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut out = child.stdout.take().unwrap();
    let s = seen.clone();
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 256];
        while let Ok(n) = out.read(&mut b) {
            if n == 0 {
                break;
            }
            s.lock().unwrap().extend_from_slice(&b[..n]);
        }
    });
    let shown = || String::from_utf8_lossy(&seen.lock().unwrap()).replace('\r', "");
    let mut stdin = child.stdin.take().unwrap();
    let mut from = 0;
    for (prompt, line) in answers {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = shown();
            if let Some(at) = text[from.min(text.len())..].find(prompt) {
                from += at + prompt.len();
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{command}: no {prompt:?} within 30 s; the terminal showed:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // A passphrase prompt is shown before echo is turned off, which drops type-ahead: let
        // that happen first.
        std::thread::sleep(Duration::from_millis(500));
        stdin.write_all(line).unwrap();
        stdin.flush().unwrap();
    }
    // Stdin stays open until the command ends: an end of input would reach it as an answer.
    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code().unwrap_or(-1);
        }
        assert!(
            Instant::now() < deadline,
            "{command}: hangs; the terminal showed:\n{}",
            shown()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let _ = reader.join();
    Transcript {
        code,
        text: shown(),
    }
}
