//! Running `dmkit` and other tools from tests.
//!
//! Every run here has stdin from /dev/null, its stdout and stderr drained on threads, and a time
//! limit; a command that does not end in time, or whose background daemon keeps our
//! stdout/stderr open after the command returned, fails the test (instead of hanging it).

use super::DMKIT;
use std::cell::RefCell;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The time limit of [`output`], [`ok`] and the [`RunDir`] commands.
pub const LIMIT: Duration = Duration::from_secs(300);

/// The time limit of [`dmkit`] (and [`RunDir::run`]).
pub const DMKIT_LIMIT: Duration = Duration::from_secs(120);

/// How long a command's stdout and stderr may stay open after it exits.
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Reads a pipe to its end on a thread, keeping what arrived so far visible.
fn drain(mut pipe: impl Read + Send + 'static) -> (Arc<Mutex<Vec<u8>>>, JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    });
    (buf, h)
}

/// `program args...` on one line for messages, the program by its file name.
fn command_line(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program());
    let mut line = program
        .file_name()
        .unwrap_or(program.as_os_str())
        .to_string_lossy()
        .into_owned();
    for a in cmd.get_args() {
        line.push(' ');
        line.push_str(&a.to_string_lossy());
    }
    line
}

/// Like [`Command::output`] (stdin from /dev/null, stdout and stderr captured), and fails the
/// test when the command does not end within `limit` (it is killed then), or when its stdout
/// and stderr are still open 5 s after it exited: a daemon it started must detach from them.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let what = command_line(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let (out, out_h) = drain(child.stdout.take().unwrap());
    let (err, err_h) = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + limit;
    let (status, timed_out) = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break (s, false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break (child.wait().expect("wait for the killed child"), true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The pipes reach EOF once every holder is gone; a daemon must not keep them.
    let grace = Instant::now() + PIPE_GRACE;
    while !(out_h.is_finished() && err_h.is_finished()) && Instant::now() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pipes_closed = out_h.is_finished() && err_h.is_finished();
    let output = Output {
        status,
        stdout: out.lock().unwrap().clone(),
        stderr: err.lock().unwrap().clone(),
    };
    let run = || Run::new(what.clone(), &output).describe();
    assert!(
        !timed_out,
        "did not finish within {} s:\n{}",
        limit.as_secs(),
        run()
    );
    assert!(
        pipes_closed,
        "returned, but something it started still holds its stdout/stderr \
         (a background daemon must detach from them):\n{}",
        run()
    );
    output
}

/// A command for `program args...`, with `DMKIT_RUN_DIR=run_dir` when given and without
/// `RUST_BACKTRACE` (a panic message stays one line).
pub fn command<S: AsRef<OsStr>>(program: &str, args: &[S], run_dir: Option<&Path>) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args).env_remove("RUST_BACKTRACE");
    if let Some(dir) = run_dir {
        cmd.env("DMKIT_RUN_DIR", dir);
    }
    cmd
}

/// Runs a command within [`LIMIT`] ([`output_within`]); its stderr must not show a panic.
fn checked_output(mut cmd: Command) -> Output {
    let what = command_line(&cmd);
    let out = output_within(&mut cmd, LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what} panicked: {stderr}");
    out
}

/// Asserts that a command succeeded; returns its stdout.
fn success(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("{what}: stdout is not UTF-8: {e}"))
}

/// Runs `program args...` within [`LIMIT`]; its stderr must not show a panic. Success is up to
/// the caller.
pub fn output<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Output {
    checked_output(command(program, args, None))
}

/// Runs `program args...` like [`output`], which must succeed; returns its stdout.
pub fn ok<S: AsRef<OsStr>>(program: &str, args: &[S]) -> String {
    let cmd = command(program, args, None);
    let what = command_line(&cmd);
    success(&what, checked_output(cmd))
}

/// Runs `program args...` like [`output`]; returns what it produced as text.
pub fn text<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Run {
    let cmd = command(program, args, None);
    let what = command_line(&cmd);
    Run::new(what, &checked_output(cmd))
}

/// What one run produced, as text.
#[derive(Debug)]
pub struct Run {
    /// The command line.
    pub what: String,
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// What `out`, the output of the command line `what`, says.
    pub fn new(what: String, out: &Output) -> Run {
        Run {
            what,
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The command, exit code, stdout and stderr, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "{}\n  exit: {:?}\n  stdout: {:?}\n  stderr: {:?}",
            self.what, self.code, self.stdout, self.stderr
        )
    }

    /// Asserts that neither stdout nor stderr shows a panic.
    pub fn assert_no_panic(&self) -> &Self {
        assert!(
            !self.stdout.contains("panicked") && !self.stderr.contains("panicked"),
            "panicked:\n{}",
            self.describe()
        );
        self
    }

    /// Asserts exit code 0 and no panic.
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "command failed:\n{}", self.describe());
        self.assert_no_panic()
    }

    /// [`Run::assert_ok`], passing the run on.
    pub fn ok(self) -> Run {
        self.assert_ok();
        self
    }
}

/// Assert the contract for a refused command: exit `code`, one stderr line `dmkit: ...` that
/// contains every group of `names` (each group: any one of its alternatives, case-insensitive).
pub fn assert_refused(r: &Run, code: i32, names: &[&[&str]]) {
    r.assert_no_panic();
    assert_eq!(
        r.code,
        Some(code),
        "expected exit code {code}:\n{}",
        r.describe()
    );
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one non-empty stderr line:\n{}",
        r.describe()
    );
    let line = lines[0];
    assert!(
        line.starts_with("dmkit: ") && line.len() > "dmkit: ".len(),
        "the error line must start with \"dmkit: \":\n{}",
        r.describe()
    );
    let lower = line.to_lowercase();
    for group in names {
        assert!(
            group.iter().any(|n| lower.contains(&n.to_lowercase())),
            "the error line should name one of {group:?}:\n{}",
            r.describe()
        );
    }
}

/// Runs `program args...` with `DMKIT_RUN_DIR=run_dir` within `limit` ([`output_within`]).
pub fn run_in(program: &str, args: &[&str], run_dir: &Path, limit: Duration) -> Run {
    let mut cmd = command(program, args, Some(run_dir));
    let what = command_line(&cmd);
    Run::new(what, &output_within(&mut cmd, limit))
}

/// Runs dmkit with `DMKIT_RUN_DIR=run_dir` within [`DMKIT_LIMIT`].
pub fn dmkit(run_dir: &Path, args: &[&str]) -> Run {
    run_in(DMKIT, args, run_dir, DMKIT_LIMIT)
}

/// A private `DMKIT_RUN_DIR` (`run` in a temporary directory of its own) for one test, so tests
/// run in parallel. Devices opened in it and registered with [`RunDir::track`] are closed when
/// it is dropped, whether the test passed or not, so a failing test leaves no mount behind.
pub struct RunDir {
    _tmp: tempfile::TempDir,
    path: PathBuf,
    open: RefCell<Vec<String>>,
}

impl Default for RunDir {
    fn default() -> Self {
        Self::new()
    }
}

impl RunDir {
    pub fn new() -> RunDir {
        let tmp = tempfile::tempdir().expect("temp run dir");
        let path = std::fs::canonicalize(tmp.path()).unwrap().join("run");
        RunDir {
            _tmp: tmp,
            path,
            open: Default::default(),
        }
    }

    /// The directory (dmkit creates it on first use).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `dmkit args...` in this run directory within [`LIMIT`]; stderr must not show a panic.
    /// Success is up to the caller.
    pub fn output<S: AsRef<OsStr>>(&self, args: &[S]) -> Output {
        checked_output(command(DMKIT, args, Some(&self.path)))
    }

    /// [`RunDir::output`], which must succeed; returns stdout.
    pub fn ok<S: AsRef<OsStr>>(&self, args: &[S]) -> String {
        let cmd = command(DMKIT, args, Some(&self.path));
        let what = command_line(&cmd);
        success(&what, checked_output(cmd))
    }

    /// `dmkit args...` in this run directory as a [`Run`], within [`DMKIT_LIMIT`].
    pub fn run(&self, args: &[&str]) -> Run {
        dmkit(&self.path, args)
    }

    /// Closes `name` when this is dropped, unless [`RunDir::close`] did first.
    pub fn track(&self, name: &str) {
        self.open.borrow_mut().push(name.to_string());
    }

    /// `dmkit close NAME`, which must succeed.
    pub fn close(&self, name: &str) {
        let out = self.output(&["close", name]);
        assert!(
            out.status.success(),
            "dmkit close {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.open.borrow_mut().retain(|n| n != name);
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // Best effort and no assertions: this may run while the test panics.
        for name in self.open.borrow().iter() {
            let _ = Command::new(DMKIT)
                .args(["close", name])
                .env("DMKIT_RUN_DIR", &self.path)
                .stdin(Stdio::null())
                .output();
        }
    }
}

/// Closes one device when dropped; a failing close fails the test, unless it is already
/// failing.
pub struct Opened<'a> {
    pub run_dir: &'a Path,
    pub name: String,
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        let r = dmkit(self.run_dir, &["close", &self.name]);
        if r.code != Some(0) && !std::thread::panicking() {
            panic!("close failed:\n{}", r.describe());
        }
    }
}

/// A test's work directory for its files and a private run directory ([`RunDir`]), both
/// temporary. Test files wrap it in their own `Env` (with `Deref` to this) to add fixtures.
pub struct Workspace {
    /// First, so devices are closed before the files under them go.
    pub run: RunDir,
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Default for Workspace {
    fn default() -> Self {
        Self::new()
    }
}

impl Workspace {
    pub fn new() -> Workspace {
        let tmp = tempfile::tempdir().expect("temp work dir");
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        Workspace {
            run: RunDir::new(),
            _tmp: tmp,
            dir,
        }
    }

    /// The work directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `name` in the work directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `name` in the work directory, as a string for command lines.
    pub fn s(&self, name: &str) -> String {
        self.path(name)
            .to_str()
            .expect("UTF-8 temp path")
            .to_string()
    }

    /// Creates `name` in the work directory as a sparse file of `size` bytes; returns its path.
    pub fn sparse(&self, name: &str, size: u64) -> String {
        let f = std::fs::File::create(self.path(name)).unwrap();
        f.set_len(size).unwrap();
        self.s(name)
    }

    /// A LUKS2 image `name` of `size` bytes with one cheap keyslot (PBKDF2, 1000 iterations:
    /// the tests that use it are about the data path, not the KDF) for `passphrase`, kept in
    /// the file `pass`; returns the image's and the passphrase file's paths.
    pub fn luks2_cheap(&self, name: &str, size: u64, passphrase: &str) -> (String, String) {
        let pass = self.s("pass");
        std::fs::write(&pass, passphrase).unwrap();
        let img = self.sparse(name, size);
        self.run.ok(&[
            "luks",
            "format",
            "-q",
            "--key-file",
            &pass,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            &img,
        ]);
        (img, pass)
    }

    /// [`RunDir::output`]: `dmkit args...` in the run directory.
    pub fn dmkit(&self, args: &[&str]) -> Output {
        self.run.output(args)
    }
}

/// `name` in `ws`, a directory anybody can read and write, its parents made searchable: for
/// the tests that run dmkit as `nobody`.
pub fn world_dir(ws: &Workspace, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = ws.path(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut p = d.clone();
    while let Some(q) = p.parent() {
        if q == Path::new("/") {
            break;
        }
        let m = std::fs::metadata(q).unwrap().permissions().mode();
        std::fs::set_permissions(q, std::fs::Permissions::from_mode(m | 0o011)).unwrap();
        p = q.to_path_buf();
    }
    d
}
