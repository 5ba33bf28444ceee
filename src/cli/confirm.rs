//! cryptsetup's safety prompt (`yesDialog` in cryptsetup 2.6), for every command that destroys
//! data or keys: the signatures found on the target are named, then, on a terminal, the
//! question is asked and only `YES` proceeds. `-q`/`--batch-mode` skips all of it.
//!
//! One difference, on purpose: without a terminal cryptsetup takes silence for consent (it
//! prints the warnings and goes on); dmkit refuses with a one-line error unless
//! `-q`/`--batch-mode` was given, so a script cannot wipe a filesystem by accident.
//! The dialog goes to stderr (cryptsetup writes it to stdout), so `--json` output stays clean.

use super::passphrase::{is_tty, read_fd};
use super::{CliError, CliResult};
use crate::block::signature::{probe_file, Signature, SignatureKind};
use std::path::Path;

/// The longest answer read: "YES\n" and some room; a longer line is not YES either.
const MAX_ANSWER: usize = 64;

/// A destructive step to confirm.
pub(super) struct Confirm<'a> {
    /// `-q`/`--batch-mode`: proceed without a word.
    pub batch: bool,
    /// cryptsetup's warning lines for what the target holds (see [`signature_warnings`]).
    pub warnings: Vec<String>,
    /// cryptsetup's question text, e.g. "This will overwrite data on x.img irrevocably.".
    pub question: String,
    /// What is refused without a terminal, for the one-line error: "format x.img".
    pub action: &'a str,
    /// cryptsetup's words when the answer is not YES, e.g. "Operation aborted." (empty: none,
    /// as luksHeaderRestore says nothing).
    pub aborted: &'a str,
    /// Exit code of an answer other than YES (cryptsetup's: 1, or 2 for keyslot removal).
    pub code: i32,
}

impl Confirm<'_> {
    /// Ask; `Ok` to go ahead. Without a terminal (and without `-q`) the error names what was
    /// found and the way out.
    pub(super) fn ask(&self) -> CliResult {
        if self.batch {
            return Ok(());
        }
        if !is_tty(0) {
            let found = self
                .warnings
                .iter()
                .map(|w| w.trim_start_matches("WARNING: ").trim_end_matches('.'))
                .collect::<Vec<_>>()
                .join("; ");
            let found = if found.is_empty() {
                String::new()
            } else {
                format!("{found}; ")
            };
            return Err(CliError::invalid(format!(
                "{found}refusing to {} without confirmation: standard input is not a terminal (add -q/--batch-mode to proceed)",
                self.action
            )));
        }
        for w in &self.warnings {
            eprintln!("{w}");
        }
        eprint!(
            "\nWARNING!\n========\n{}\n\nAre you sure? (Type 'yes' in capital letters): ",
            self.question
        );
        match read_answer() {
            Some(answer) if answer == b"YES\n" => Ok(()),
            Some(_) => {
                if !self.aborted.is_empty() {
                    eprintln!("{}", self.aborted);
                }
                Err(CliError {
                    code: self.code,
                    message: String::new(),
                })
            }
            None => {
                eprintln!("Error reading response from terminal.");
                Err(CliError {
                    code: self.code,
                    message: String::new(),
                })
            }
        }
    }
}

/// One line of stdin, read a byte at a time (std's buffered `Stdin` could swallow what is
/// typed next, a passphrase); `None` at end of input or on an error.
fn read_answer() -> Option<Vec<u8>> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < MAX_ANSWER {
        match read_fd(0, &mut b) {
            Ok(1) => {
                line.push(b[0]);
                if b[0] == b'\n' {
                    return Some(line);
                }
            }
            _ => return (!line.is_empty()).then_some(line),
        }
    }
    Some(line)
}

/// cryptsetup's warning for each signature, e.g. "WARNING: Device x.img already contains a
/// 'ext4' superblock signature.".
pub(super) fn warnings_for(path: &Path, found: &[Signature]) -> Vec<String> {
    found
        .iter()
        .map(|s| {
            let what = match s.kind {
                SignatureKind::Superblock => "superblock",
                SignatureKind::PartitionTable => "partition",
            };
            format!(
                "WARNING: Device {} already contains a '{}' {what} signature.",
                path.display(),
                s.name
            )
        })
        .collect()
}

/// The signatures on `path` from byte `offset` on, as warnings. A file that does not exist
/// holds none; one that cannot be read is an error naming it.
pub(super) fn signature_warnings(path: &Path, offset: u64) -> Result<Vec<String>, CliError> {
    let found = match std::fs::File::open(path) {
        Ok(f) => probe_file(&f, offset)
            .map_err(|e| CliError::invalid(format!("{}: cannot read: {e}", path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(CliError::invalid(format!(
                "{}: cannot open: {e}",
                path.display()
            )))
        }
    };
    Ok(warnings_for(path, &found))
}

/// The question every format asks (luksFormat, integritysetup format).
pub(super) fn overwrite_question(path: &Path) -> String {
    format!(
        "This will overwrite data on {} irrevocably.",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_use_cryptsetups_words() {
        let found = [
            Signature {
                name: "ext4",
                kind: SignatureKind::Superblock,
            },
            Signature {
                name: "gpt",
                kind: SignatureKind::PartitionTable,
            },
        ];
        assert_eq!(
            warnings_for(Path::new("x.img"), &found),
            [
                "WARNING: Device x.img already contains a 'ext4' superblock signature.",
                "WARNING: Device x.img already contains a 'gpt' partition signature.",
            ]
        );
    }
}
