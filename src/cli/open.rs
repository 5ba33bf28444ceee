//! cryptsetup's generic `open --type luks|luks1|luks2|plain DEVICE NAME ...`: the type picks
//! the command (`dmkit luks open` or `dmkit plain open`), which then parses the rest of the
//! line as it would on its own, so every option means what it means there.

use super::{CliError, CliResult};
use std::ffi::OsString;

/// Arguments of `dmkit open`: everything after `open`, `--type` included wherever it stands.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// --type luks (default), luks1, luks2 or plain, then DEVICE NAME and that type's options.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

/// Take `--type T`, `--type=T`, `-M T` or `-MT` out of `args` (cryptsetup accepts it before or
/// after the positional arguments); `luks` when absent.
fn take_type(args: &mut Vec<OsString>) -> Result<String, CliError> {
    let mut kind = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        let value = if a == "--type" || a == "-M" {
            if i + 1 >= args.len() {
                return Err(CliError::invalid(format!("{a} needs a value")));
            }
            let v = args.remove(i + 1).to_string_lossy().into_owned();
            args.remove(i);
            Some(v)
        } else if let Some(v) = a
            .strip_prefix("--type=")
            .or_else(|| a.strip_prefix("-M").filter(|v| !v.is_empty()))
        {
            let v = v.to_string();
            args.remove(i);
            Some(v)
        } else {
            i += 1;
            None
        };
        if let Some(v) = value {
            kind = Some(v);
        }
    }
    Ok(kind.unwrap_or_else(|| "luks".into()))
}

/// The command line `dmkit open ARGS` stands for.
fn argv(mut args: Vec<OsString>) -> Result<Vec<OsString>, CliError> {
    let kind = take_type(&mut args)?;
    let mut argv: Vec<OsString> = vec!["dmkit".into()];
    match kind.as_str() {
        "luks" | "luks1" | "luks2" => {
            argv.extend(["luks".into(), "open".into(), "--type".into(), kind.into()]);
        }
        "plain" => argv.extend(["plain".into(), "open".into()]),
        other => {
            return Err(CliError::invalid(format!(
                "--type {other:?}: dmkit opens luks, luks1, luks2 and plain devices"
            )))
        }
    }
    argv.extend(args);
    Ok(argv)
}

/// Run `dmkit open`.
pub fn run(a: OpenArgs) -> CliResult {
    let argv = argv(a.args)?;
    super::run_argv(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Vec<String> {
        argv(args.iter().map(OsString::from).collect())
            .unwrap()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn type_anywhere_picks_the_command() {
        assert_eq!(
            line(&["d", "n"]),
            ["dmkit", "luks", "open", "--type", "luks", "d", "n"]
        );
        assert_eq!(
            line(&["d", "--type", "plain", "n", "--key-file", "k"]),
            ["dmkit", "plain", "open", "d", "n", "--key-file", "k"]
        );
        assert_eq!(line(&["--type=luks2", "d", "n"])[4], "luks2");
        assert_eq!(line(&["-Mluks1", "d", "n"])[4], "luks1");
        assert!(argv(vec!["--type".into(), "tcrypt".into()]).is_err());
        assert!(argv(vec!["--type".into()]).is_err());
    }
}
