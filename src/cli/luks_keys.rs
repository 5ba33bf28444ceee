//! Passphrases for `dmkit luks`: from a key file (`--key-file`, `-` for stdin) with
//! cryptsetup's `--keyfile-offset`/`--keyfile-size`, or typed at the terminal without echo.
//! Everything read lands in zeroize-on-drop buffers and is never printed.

use super::CliError;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// cryptsetup's default upper bound on what a key file may hold (8 MiB).
const MAX_KEYFILE: u64 = 8 << 20;
/// Longest passphrase typed at a terminal or piped as a line (cryptsetup's limit).
const MAX_LINE: usize = 512;

/// A passphrase (or key file contents).
pub type Passphrase = Zeroizing<Vec<u8>>;

/// Where a passphrase comes from.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KeyArgs {
    /// Read the passphrase from this file (`-` for stdin), all of it unless --keyfile-size.
    #[arg(long, short = 'd')]
    pub key_file: Option<PathBuf>,
    /// Read at most this many bytes of the key file.
    #[arg(long, short = 'l')]
    pub keyfile_size: Option<u64>,
    /// Skip this many bytes at the start of the key file.
    #[arg(long, default_value_t = 0)]
    pub keyfile_offset: u64,
}

fn read_key_file(path: &Path, offset: u64, size: Option<u64>) -> Result<Passphrase, CliError> {
    let name = path.display();
    let mut reader: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let mut f = std::fs::File::open(path)
            .map_err(|e| CliError::invalid(format!("{name}: cannot open key file: {e}")))?;
        if offset > 0 {
            f.seek(SeekFrom::Start(offset))
                .map_err(|e| CliError::invalid(format!("{name}: cannot seek in key file: {e}")))?;
        }
        Box::new(f)
    };
    if path.as_os_str() == "-" && offset > 0 {
        // stdin cannot seek: read and drop the bytes instead.
        std::io::copy(&mut reader.by_ref().take(offset), &mut std::io::sink())
            .map_err(|e| CliError::invalid(format!("stdin: {e}")))?;
    }
    let limit = size.unwrap_or(MAX_KEYFILE).min(MAX_KEYFILE);
    let mut buf = Zeroizing::new(Vec::new());
    reader
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CliError::invalid(format!("{name}: cannot read key file: {e}")))?;
    if size.is_none() && buf.len() as u64 > MAX_KEYFILE {
        return Err(CliError::invalid(format!(
            "{name}: key file is larger than 8 MiB"
        )));
    }
    if let Some(n) = size {
        if (buf.len() as u64) < n {
            return Err(CliError::invalid(format!(
                "{name}: key file is too short: --keyfile-size {n} asks for {n} bytes after offset {offset}, it has {}",
                buf.len()
            )));
        }
        buf.truncate(n as usize);
    }
    if buf.is_empty() {
        return Err(CliError::invalid(format!(
            "{name}: key file holds no passphrase (empty after offset {offset})"
        )));
    }
    Ok(buf)
}

/// Terminal echo off for as long as this lives.
struct NoEcho {
    fd: i32,
    saved: libc::termios,
}

impl NoEcho {
    fn new(fd: i32) -> Option<NoEcho> {
        // SAFETY: termios is plain data; tcgetattr fills it for a valid fd.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        t.c_lflag |= libc::ICANON;
        // SAFETY: valid fd and termios.
        (unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &t) } == 0).then_some(NoEcho { fd, saved })
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        // SAFETY: restores what tcgetattr returned for the same fd.
        unsafe { libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved) };
    }
}

/// Read one line (without its newline) from `r`, byte by byte so nothing after it is consumed.
fn read_line(r: &mut dyn Read) -> std::io::Result<Passphrase> {
    let mut line = Zeroizing::new(Vec::new());
    let mut b = [0u8; 1];
    while line.len() <= MAX_LINE {
        if r.read(&mut b)? == 0 || b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    Ok(line)
}

fn prompt_tty(prompt: &str) -> Result<Option<Passphrase>, CliError> {
    use std::os::fd::AsRawFd;
    let Ok(mut tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return Ok(None);
    };
    let _ = write!(tty, "{prompt}");
    let _ = tty.flush();
    let guard = NoEcho::new(tty.as_raw_fd());
    let line = read_line(&mut tty).map_err(|e| CliError::invalid(format!("/dev/tty: {e}")))?;
    drop(guard);
    let _ = writeln!(tty);
    Ok(Some(line))
}

/// A passphrase: from the key file, else typed at the terminal (twice when `verify`), else a
/// line of stdin.
pub fn passphrase(k: &KeyArgs, prompt: &str, verify: bool) -> Result<Passphrase, CliError> {
    if let Some(f) = &k.key_file {
        return read_key_file(f, k.keyfile_offset, k.keyfile_size);
    }
    let typed = match prompt_tty(prompt)? {
        Some(p) => {
            if verify {
                let again = prompt_tty("Verify passphrase: ")?.unwrap_or_default();
                if !bool::from(subtle::ConstantTimeEq::ct_eq(&p[..], &again[..])) {
                    return Err(CliError::invalid("Passphrases do not match."));
                }
            }
            p
        }
        None => read_line(&mut std::io::stdin().lock())
            .map_err(|e| CliError::invalid(format!("stdin: {e}")))?,
    };
    if typed.is_empty() {
        return Err(CliError::invalid(
            "no passphrase given (use --key-file, or type one at the terminal)",
        ));
    }
    Ok(typed)
}
