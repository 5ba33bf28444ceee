//! S3 credentials, never from the command line (where `ps` and shell history would show them).
//!
//! Looked for in this order, the first source that has any of them wins (like the AWS SDKs):
//!
//! 1. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, for temporary
//!    credentials, `AWS_SESSION_TOKEN`;
//! 2. systemd credentials: the files `aws_access_key_id`, `aws_secret_access_key` and
//!    (optional) `aws_session_token` in `$CREDENTIALS_DIRECTORY`, as a unit passes them with
//!    `LoadCredential=aws_secret_access_key:/etc/dmkit/s3-secret` (the names are the keys of
//!    the credentials file; systemd keeps that directory private to the service);
//! 3. the shared credentials file: `$AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`,
//!    profile `$AWS_PROFILE` (else `default`); the file must be private to its owner (no group
//!    or other permission bits, owned by us or root), or it is refused, as ssh refuses a private
//!    key others can read.
//!
//! A public object needs no credentials: give its `https://` URL (or a presigned URL) instead
//! of `s3://`. The secret key and the session token are held in [`SecretBytes`] (locked,
//! wiped on drop) and never appear in `Debug` output or messages; the access key id is an
//! identifier, not a secret, and may be named in messages.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use zeroize::Zeroize;

use crate::crypt::secret::SecretBytes;

/// The credentials of one S3 identity.
#[derive(Clone)]
pub struct S3Credentials {
    access_key_id: String,
    secret_access_key: SecretBytes,
    session_token: Option<SecretBytes>,
    /// Where they came from, for messages ("the environment", a file's path).
    origin: String,
}

impl S3Credentials {
    /// Credentials from their parts; `origin` says where they came from, for messages.
    /// Fails if a part is empty or not UTF-8 (the signature is computed over text).
    pub fn new(
        access_key_id: &str,
        secret_access_key: SecretBytes,
        session_token: Option<SecretBytes>,
        origin: &str,
    ) -> Result<Self, CredentialsError> {
        let bad = |what: &str| CredentialsError::Malformed {
            origin: origin.to_string(),
            what: what.to_string(),
        };
        if access_key_id.trim().is_empty() {
            return Err(bad("the access key id is empty"));
        }
        if secret_access_key.is_empty() || std::str::from_utf8(&secret_access_key).is_err() {
            return Err(bad("the secret access key is empty or not text"));
        }
        let session_token = session_token.filter(|t| !t.is_empty());
        if session_token
            .as_ref()
            .is_some_and(|t| std::str::from_utf8(t).is_err())
        {
            return Err(bad("the session token is not text"));
        }
        Ok(Self {
            access_key_id: access_key_id.trim().to_string(),
            secret_access_key,
            session_token,
            origin: origin.to_string(),
        })
    }

    /// The access key id (not secret).
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    /// The secret access key, for the signer only.
    pub fn secret_access_key(&self) -> &str {
        // Checked to be UTF-8 in `new`.
        std::str::from_utf8(&self.secret_access_key).unwrap_or_default()
    }

    /// The session token of temporary credentials, for the signer only.
    pub fn session_token(&self) -> Option<&str> {
        self.session_token
            .as_deref()
            .map(|t| std::str::from_utf8(t).unwrap_or_default())
    }

    /// Where the credentials came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

impl fmt::Debug for S3Credentials {
    /// The access key id and the origin; never the secret or the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("origin", &self.origin)
            .field("session_token", &self.session_token.is_some())
            .finish_non_exhaustive()
    }
}

/// Why no credentials could be had. Messages name files and variables, never values.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// No source had any.
    #[error(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, pass \
         aws_access_key_id and aws_secret_access_key with systemd's LoadCredential=, or write \
         profile [{profile}] in {file} (mode 0600); for a public object give its https:// URL"
    )]
    NotFound {
        /// The profile looked for.
        profile: String,
        /// The credentials file looked at.
        file: String,
    },
    /// A source has some of the parts but not all.
    #[error("{origin}: {what}")]
    Incomplete {
        /// The source.
        origin: String,
        /// What is missing.
        what: String,
    },
    /// A part is unusable (empty, not text) or a file does not parse.
    #[error("{origin}: {what}")]
    Malformed {
        /// The source.
        origin: String,
        /// What is wrong.
        what: String,
    },
    /// The credentials file can be read by others: refused, as ssh refuses such a key.
    #[error(
        "{}: permissions {mode:04o} are too open: the credentials file must not be accessible \
         by group or others (chmod 600 {})",
        path.display(),
        path.display()
    )]
    NotPrivate {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The credentials file belongs to another user.
    #[error(
        "{}: owned by uid {uid}, not by us or root: refusing credentials others can change",
        path.display()
    )]
    NotOwned {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// The profile is not in the file.
    #[error("{}: no profile [{profile}] (AWS_PROFILE)", path.display())]
    NoProfile {
        /// The file.
        path: PathBuf,
        /// The profile.
        profile: String,
    },
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Where [`load`] looks: the process's environment, or a given one (tests).
pub trait Env {
    /// The variable's value, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process's environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }
}

impl Env for &[(&str, &str)] {
    fn var(&self, name: &str) -> Option<String> {
        self.iter()
            .find(|(k, v)| *k == name && !v.trim().is_empty())
            .map(|(_, v)| v.to_string())
    }
}

/// The credentials from the first source that has any (see the module documentation).
pub fn load(env: &dyn Env) -> Result<S3Credentials, CredentialsError> {
    if let Some(c) = from_environment(env)? {
        return Ok(c);
    }
    if let Some(dir) = env.var("CREDENTIALS_DIRECTORY") {
        if let Some(c) = from_credentials_directory(Path::new(&dir))? {
            return Ok(c);
        }
    }
    let profile = env.var("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let file = shared_file_path(env);
    match &file {
        Some(path) if path.exists() => from_shared_file(path, &profile),
        _ => Err(CredentialsError::NotFound {
            profile,
            file: file.map_or("~/.aws/credentials".into(), |p| p.display().to_string()),
        }),
    }
}

/// `AWS_SHARED_CREDENTIALS_FILE`, else `$HOME/.aws/credentials`.
fn shared_file_path(env: &dyn Env) -> Option<PathBuf> {
    env.var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| {
            env.var("HOME")
                .map(|h| Path::new(&h).join(".aws/credentials"))
        })
}

/// A string taken into secret memory; the string is wiped.
fn secret_from(mut s: String) -> SecretBytes {
    let b = SecretBytes::from_slice(s.trim().as_bytes());
    s.zeroize();
    b
}

/// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`); none if neither key
/// is set.
fn from_environment(env: &dyn Env) -> Result<Option<S3Credentials>, CredentialsError> {
    let origin = "the environment";
    match (
        env.var("AWS_ACCESS_KEY_ID"),
        env.var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(CredentialsError::Incomplete {
            origin: origin.into(),
            what: "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into(),
        }),
        (None, Some(s)) => {
            secret_from(s);
            Err(CredentialsError::Incomplete {
                origin: origin.into(),
                what: "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into(),
            })
        }
        (Some(id), Some(secret)) => {
            let token = env.var("AWS_SESSION_TOKEN").map(secret_from);
            S3Credentials::new(&id, secret_from(secret), token, origin).map(Some)
        }
    }
}

/// Reads a whole file into secret memory, trailing newline and whitespace removed.
fn read_secret_file(path: &Path) -> Result<SecretBytes, CredentialsError> {
    let io = |source| CredentialsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    if len > 64 << 10 {
        return Err(CredentialsError::Malformed {
            origin: path.display().to_string(),
            what: format!("{len} bytes is too large for credentials"),
        });
    }
    let mut buf = SecretBytes::zeroed(len as usize + 1);
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(n * 2);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    while n > 0 && buf[n - 1].is_ascii_whitespace() {
        n -= 1;
    }
    buf.truncate(n);
    Ok(buf)
}

/// The systemd credentials `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`
/// in `dir`; none if neither key file is there.
fn from_credentials_directory(dir: &Path) -> Result<Option<S3Credentials>, CredentialsError> {
    let id_path = dir.join("aws_access_key_id");
    let secret_path = dir.join("aws_secret_access_key");
    let token_path = dir.join("aws_session_token");
    let origin = format!("$CREDENTIALS_DIRECTORY ({})", dir.display());
    match (id_path.exists(), secret_path.exists()) {
        (false, false) => Ok(None),
        (true, false) | (false, true) => Err(CredentialsError::Incomplete {
            origin,
            what: "needs both aws_access_key_id and aws_secret_access_key".into(),
        }),
        (true, true) => {
            let id = read_secret_file(&id_path)?;
            let id = std::str::from_utf8(&id).map_err(|_| CredentialsError::Malformed {
                origin: id_path.display().to_string(),
                what: "the access key id is not text".into(),
            })?;
            let token = if token_path.exists() {
                Some(read_secret_file(&token_path)?)
            } else {
                None
            };
            S3Credentials::new(id, read_secret_file(&secret_path)?, token, &origin).map(Some)
        }
    }
}

/// Refuses a file others may read or change (ssh's rule for private keys).
fn check_private(path: &Path, file: &File) -> Result<(), CredentialsError> {
    let meta = file.metadata().map_err(|source| CredentialsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(CredentialsError::NotPrivate {
            path: path.to_path_buf(),
            mode,
        });
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(CredentialsError::NotOwned {
            path: path.to_path_buf(),
            uid: meta.uid(),
        });
    }
    Ok(())
}

/// Profile `profile` of the shared credentials file at `path` (INI: `[name]` sections,
/// `key = value` lines, `#` and `;` comments), refused unless the file is private.
pub fn from_shared_file(path: &Path, profile: &str) -> Result<S3Credentials, CredentialsError> {
    let file = File::open(path).map_err(|source| CredentialsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // Checked on the open file, so the file read is the file checked.
    check_private(path, &file)?;
    drop(file);
    let text = read_secret_file(path)?;
    let malformed = |what: String| CredentialsError::Malformed {
        origin: path.display().to_string(),
        what,
    };
    let mut in_profile = false;
    let mut found = false;
    let mut id: Option<String> = None;
    let mut secret: Option<SecretBytes> = None;
    let mut token: Option<SecretBytes> = None;
    for (no, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = std::str::from_utf8(line)
            .map_err(|_| malformed(format!("line {}: not text", no + 1)))?
            .trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .ok_or_else(|| malformed(format!("line {}: a section without ']'", no + 1)))?;
            // `[profile x]` is the config file's spelling; accepted here too.
            let name = name.trim();
            let name = name.strip_prefix("profile ").map_or(name, str::trim);
            in_profile = name == profile;
            found |= in_profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| malformed(format!("line {}: expected key = value", no + 1)))?;
        match key.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => id = Some(value.trim().to_string()),
            "aws_secret_access_key" => {
                secret = Some(SecretBytes::from_slice(value.trim().as_bytes()))
            }
            "aws_session_token" => token = Some(SecretBytes::from_slice(value.trim().as_bytes())),
            _ => {}
        }
    }
    if !found {
        return Err(CredentialsError::NoProfile {
            path: path.to_path_buf(),
            profile: profile.to_string(),
        });
    }
    let origin = format!("{} [{profile}]", path.display());
    match (id, secret) {
        (Some(id), Some(secret)) => S3Credentials::new(&id, secret, token, &origin),
        _ => Err(CredentialsError::Incomplete {
            origin,
            what: "needs both aws_access_key_id and aws_secret_access_key".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dmkit-creds-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn environment_first_with_a_session_token() {
        let env: &[(&str, &str)] = &[
            ("AWS_ACCESS_KEY_ID", "AKIDENV"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t-env"),
            ("AWS_SESSION_TOKEN", "tok"),
            ("CREDENTIALS_DIRECTORY", "/nonexistent"),
        ];
        let c = load(&env).unwrap();
        assert_eq!(c.access_key_id(), "AKIDENV");
        assert_eq!(c.secret_access_key(), "s3cr3t-env");
        assert_eq!(c.session_token(), Some("tok"));
        assert_eq!(c.origin(), "the environment");
        let dbg = format!("{c:?}");
        assert!(dbg.contains("AKIDENV") && !dbg.contains("s3cr3t") && !dbg.contains("tok\""));
    }

    #[test]
    fn half_set_environment_is_refused_without_values() {
        let env: &[(&str, &str)] = &[("AWS_SECRET_ACCESS_KEY", "s3cr3t")];
        let e = load(&env).unwrap_err().to_string();
        assert!(e.contains("AWS_ACCESS_KEY_ID is not"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn systemd_credentials_directory() {
        let d = scratch("systemd");
        write(&d.join("aws_access_key_id"), "AKIDSYS\n", 0o400);
        write(&d.join("aws_secret_access_key"), "sys-secret\n", 0o400);
        let dir = d.to_str().unwrap();
        let env: &[(&str, &str)] = &[("CREDENTIALS_DIRECTORY", dir), ("HOME", "/nonexistent")];
        let c = load(&env).unwrap();
        assert_eq!(c.access_key_id(), "AKIDSYS");
        assert_eq!(c.secret_access_key(), "sys-secret");
        assert_eq!(c.session_token(), None);
        std::fs::remove_file(d.join("aws_secret_access_key")).unwrap();
        let e = load(&env).unwrap_err().to_string();
        assert!(e.contains("needs both"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shared_file_with_profiles() {
        let d = scratch("file");
        let f = d.join("credentials");
        write(
            &f,
            "# comment\n[default]\naws_access_key_id = AKIDDEF\naws_secret_access_key = def\n\n\
             [ci]\n; other\naws_access_key_id=AKIDCI\naws_secret_access_key=ci-secret\n\
             aws_session_token = ci-token\n",
            0o600,
        );
        let file = f.to_str().unwrap();
        let env: &[(&str, &str)] = &[("AWS_SHARED_CREDENTIALS_FILE", file)];
        assert_eq!(load(&env).unwrap().access_key_id(), "AKIDDEF");
        let env: &[(&str, &str)] = &[("AWS_SHARED_CREDENTIALS_FILE", file), ("AWS_PROFILE", "ci")];
        let c = load(&env).unwrap();
        assert_eq!(
            (c.access_key_id(), c.secret_access_key(), c.session_token()),
            ("AKIDCI", "ci-secret", Some("ci-token"))
        );
        let env: &[(&str, &str)] = &[("AWS_SHARED_CREDENTIALS_FILE", file), ("AWS_PROFILE", "x")];
        let e = load(&env).unwrap_err().to_string();
        assert_eq!(e, format!("{file}: no profile [x] (AWS_PROFILE)"));
        // HOME's ~/.aws/credentials when the variable is not set.
        std::fs::create_dir(d.join(".aws")).unwrap();
        std::fs::rename(&f, d.join(".aws/credentials")).unwrap();
        let env: &[(&str, &str)] = &[("HOME", d.to_str().unwrap())];
        assert_eq!(load(&env).unwrap().access_key_id(), "AKIDDEF");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shared_file_readable_by_others_is_refused_naming_it_and_its_mode() {
        let d = scratch("open");
        let f = d.join("credentials");
        for mode in [0o644, 0o640, 0o604] {
            write(
                &f,
                "[default]\naws_access_key_id = A\naws_secret_access_key = leak\n",
                mode,
            );
            let file = f.to_str().unwrap();
            let env: &[(&str, &str)] = &[("AWS_SHARED_CREDENTIALS_FILE", file)];
            let e = load(&env).unwrap_err();
            assert!(matches!(e, CredentialsError::NotPrivate { .. }), "{e}");
            let e = e.to_string();
            assert!(
                e.starts_with(&format!("{file}: permissions {mode:04o} are too open")),
                "{e}"
            );
            assert!(!e.contains("leak") && !e.contains('\n'), "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn nothing_anywhere_says_where_to_put_them() {
        let env: &[(&str, &str)] = &[("HOME", "/nonexistent")];
        let e = load(&env).unwrap_err().to_string();
        assert!(
            e.starts_with("no S3 credentials: set AWS_ACCESS_KEY_ID"),
            "{e}"
        );
        assert!(e.contains("/nonexistent/.aws/credentials"), "{e}");
    }
}
