//! Passphrases and key files for `dmkit luks` and `dmkit plain`, read by cryptsetup's rules (`tools_get_key` and
//! `crypt_keyfile_device_read` in cryptsetup 2.6):
//!
//! - `--key-file FILE`: the file's bytes after `--keyfile-offset`, all of them (at most 8 MiB)
//!   or exactly `--keyfile-size` (fewer is an error); newlines are data; an empty file is an
//!   empty passphrase; an offset past the end of a regular file is an error.
//! - no key file, or `--key-file -`, with stdin a terminal: typed without echo, at most 512
//!   bytes, the newline dropped, asked twice when a new passphrase is set; an offset is an
//!   error.
//! - `--key-file -` with stdin not a terminal: stdin as a key file (to its end, newlines kept).
//! - no key file with stdin not a terminal: one line of stdin (up to the newline, which is
//!   dropped, or the end; at most 8 MiB or exactly `--keyfile-size`), read one byte at a time so
//!   a second passphrase can follow on the next line; nothing at all on stdin is an error, a
//!   lone newline an empty passphrase.
//!
//! Standard input is read from descriptor 0 directly, not through std's `Stdin`, whose global
//! 8 KiB buffer would keep a copy of the passphrase for the life of the process. Everything
//! read lands in secret memory ([`crate::crypt::secret`]) and is never printed.

use super::CliError;
use crate::crypt::secret::SecretBytes;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

/// cryptsetup's bound on a key file read without `--keyfile-size` (8 MiB).
const MAX_KEYFILE: usize = 8 << 20;
/// Longest passphrase read from a terminal (cryptsetup's `DEFAULT_PASSPHRASE_SIZE_MAX`).
const MAX_TYPED: usize = 512;

/// A passphrase (or key file contents), in secret memory.
pub type Passphrase = SecretBytes;

/// Where a passphrase comes from.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KeyArgs {
    /// Read the passphrase from this file (`-` for stdin), all of it unless --keyfile-size.
    #[arg(long, short = 'd')]
    pub key_file: Option<PathBuf>,
    /// Read exactly this many bytes of the key file (0: all of it, at most 8 MiB).
    #[arg(long, short = 'l')]
    pub keyfile_size: Option<u32>,
    /// Skip this many bytes at the start of the key file.
    #[arg(long, default_value_t = 0)]
    pub keyfile_offset: u64,
}

impl KeyArgs {
    /// These options, with `positional` as the key file when `--key-file` is not given
    /// (cryptsetup's `luksFormat DEVICE [KEYFILE]`, `luksRemoveKey DEVICE [KEYFILE]`).
    pub(super) fn or_positional(&self, positional: &Option<PathBuf>) -> KeyArgs {
        KeyArgs {
            key_file: self.key_file.clone().or_else(|| positional.clone()),
            ..self.clone()
        }
    }
}

/// Whether `fd` is a terminal.
pub(super) fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// `read(2)` into `buf`, retried on EINTR.
pub(super) fn read_fd(fd: RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Skip `n` bytes of `fd`: seek when it can, else read and drop them.
fn skip(fd: RawFd, n: u64) -> std::io::Result<()> {
    let Ok(off) = libc::off_t::try_from(n) else {
        return Err(std::io::Error::from_raw_os_error(libc::EOVERFLOW));
    };
    // SAFETY: lseek on a descriptor we hold.
    if n == 0 || unsafe { libc::lseek(fd, off, libc::SEEK_CUR) } >= 0 {
        return Ok(());
    }
    let mut scratch = SecretBytes::zeroed(4096);
    let mut left = n;
    while left > 0 {
        let want = left.min(scratch.len() as u64) as usize;
        match read_fd(fd, &mut scratch[..want])? {
            0 => break,
            got => left -= got as u64,
        }
    }
    Ok(())
}

/// cryptsetup's `crypt_keyfile_device_read`: the passphrase in `fd` (`name` for messages),
/// after `offset` bytes, `size` bytes exactly (`None`: to the end, at most 8 MiB), stopping
/// at a newline when `stop_eol`.
fn read_key(
    fd: RawFd,
    name: &str,
    offset: u64,
    size: Option<usize>,
    stop_eol: bool,
) -> Result<Passphrase, CliError> {
    let err = |what: String| CliError::invalid(format!("{name}: {what}"));
    if is_tty(fd) {
        return Err(err("cannot read a key file from a terminal".into()));
    }
    // SAFETY: fstat fills a plain struct for a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let regular = unsafe { libc::fstat(fd, &mut st) } == 0
        && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
        && fd != 0;
    let limit = size.unwrap_or(MAX_KEYFILE + 1);
    let mut capacity = limit.min(4096);
    if regular {
        let file_size = st.st_size as u64;
        if offset > file_size {
            return Err(err(format!(
                "cannot seek to --keyfile-offset {offset}: the file has {file_size} bytes"
            )));
        }
        capacity = limit.min((file_size - offset) as usize).max(1);
    }
    skip(fd, offset).map_err(|e| err(format!("cannot skip --keyfile-offset {offset}: {e}")))?;
    let mut key = SecretBytes::with_capacity(capacity);
    let mut newline = false;
    while key.len() < limit {
        let at = key.len();
        let want = if stop_eol {
            1
        } else {
            (limit - at).min(64 << 10)
        };
        key.resize(at + want);
        let got = read_fd(fd, &mut key[at..]).map_err(|e| err(format!("cannot read: {e}")))?;
        key.truncate(at + got);
        if got == 0 {
            break;
        }
        if stop_eol && key[at] == b'\n' {
            key.truncate(at);
            newline = true;
            break;
        }
    }
    if key.is_empty() && !regular && !newline {
        return Err(err("nothing to read on input".into()));
    }
    match size {
        None if key.len() == limit => Err(err(format!(
            "maximum key file size exceeded (more than {MAX_KEYFILE} bytes; use --keyfile-size)"
        ))),
        // cryptsetup: "Cannot read requested amount of data."
        Some(n) if key.len() != n => Err(err(format!(
            "key file too short: need {n} bytes at offset {offset}, got {}",
            key.len()
        ))),
        _ => Ok(key),
    }
}

/// Terminal echo off for as long as this lives.
struct NoEcho {
    fd: RawFd,
    saved: libc::termios,
}

impl NoEcho {
    fn new(fd: RawFd) -> Option<NoEcho> {
        // SAFETY: termios is plain data; tcgetattr fills it for a valid fd.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        t.c_lflag &= !libc::ECHO;
        // SAFETY: valid fd and termios. TCSAFLUSH, as cryptsetup: type-ahead is dropped.
        (unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &t) } == 0).then_some(NoEcho { fd, saved })
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        // SAFETY: restores what tcgetattr returned for the same fd; TCSAFLUSH also drops what
        // was typed past the 512-byte limit, as cryptsetup does.
        unsafe { libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved) };
    }
}

/// One passphrase typed at the terminal: cryptsetup's `interactive_pass` (on /dev/tty when it
/// opens, else stdin with the prompt on stderr): reads until a newline or 512 bytes.
fn typed(prompt: &str) -> Result<Passphrase, CliError> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok();
    let fd = tty.as_ref().map_or(0, |t| t.as_raw_fd());
    let fail = || CliError::invalid("error reading the passphrase from the terminal");
    match &tty {
        Some(t) => {
            let _ = (&*t).write_all(prompt.as_bytes());
        }
        None => eprint!("{prompt}"),
    }
    let guard = NoEcho::new(fd).ok_or_else(fail)?;
    let mut line = SecretBytes::zeroed(MAX_TYPED);
    let mut got = 0;
    while got < MAX_TYPED {
        let n = read_fd(fd, &mut line[got..]).map_err(|_| fail())?;
        got += n;
        if n == 0 || line[got - 1] == b'\n' {
            break;
        }
    }
    drop(guard);
    match &tty {
        Some(t) => {
            let _ = (&*t).write_all(b"\n");
        }
        None => eprintln!(),
    }
    if got == 0 {
        return Err(fail());
    }
    if line[got - 1] == b'\n' {
        got -= 1;
    }
    line.truncate(got);
    Ok(line)
}

/// A passphrase from `file` (`-`: stdin) with `offset`/`size`, or typed at the terminal
/// (twice when `verify`), or a line of stdin: the rules in the module docs.
pub fn read_passphrase(
    file: Option<&Path>,
    offset: u64,
    size: Option<u32>,
    prompt: &str,
    verify: bool,
) -> Result<Passphrase, CliError> {
    let size = size.filter(|&n| n > 0).map(|n| n as usize);
    let stdin = file.is_none_or(|f| f.as_os_str() == "-");
    if !stdin {
        let path = file.expect("a key file");
        let f = std::fs::File::open(path).map_err(|e| {
            CliError::invalid(format!("{}: cannot open the key file: {e}", path.display()))
        })?;
        return read_key(
            f.as_raw_fd(),
            &path.display().to_string(),
            offset,
            size,
            false,
        );
    }
    if !is_tty(0) {
        return read_key(0, "standard input", offset, size, file.is_none());
    }
    if offset > 0 {
        return Err(CliError::invalid(
            "--keyfile-offset cannot be used with terminal input",
        ));
    }
    let first = typed(prompt)?;
    if verify {
        let again = typed("Verify passphrase: ")?;
        if first != again {
            return Err(CliError::verification("Passphrases do not match."));
        }
    }
    Ok(first)
}

/// The passphrase `k` names (see [`read_passphrase`]).
pub fn passphrase(k: &KeyArgs, prompt: &str, verify: bool) -> Result<Passphrase, CliError> {
    read_passphrase(
        k.key_file.as_deref(),
        k.keyfile_offset,
        k.keyfile_size,
        prompt,
        verify,
    )
}
