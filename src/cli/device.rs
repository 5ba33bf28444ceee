//! `dmkit close` and `dmkit status`, and the plumbing every `... open` command shares to
//! serve a device ([`open_export`]).
use super::{CliError, CliResult};
use crate::export::{self, ExportError, ExportSpec};
use serde_json::Value;

impl From<ExportError> for CliError {
    fn from(e: ExportError) -> Self {
        CliError {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

/// Arguments of `dmkit close`.
#[derive(clap::Args)]
pub struct CloseArgs {
    /// Name of the open device.
    pub name: String,
}

/// Arguments of `dmkit status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Name of the open device (all if omitted).
    pub name: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Serve `spec` and print where: the exported file on the first line, the loop device (if
/// any) on the second. In the background (the default) this returns once the device is
/// served; with `foreground` it returns when the device is closed or the process is signalled.
/// Must run before the command has spawned any thread (see [`export::open`]).
pub fn open_export(spec: ExportSpec, foreground: bool) -> CliResult {
    let print = |o: &export::Opened| {
        println!("{}", o.path.display());
        if let Some(l) = &o.loop_device {
            println!("{}", l.display());
        }
    };
    if foreground {
        use std::io::Write;
        export::serve_foreground_with(spec, |o| {
            print(o);
            let _ = std::io::stdout().flush();
        })?;
    } else {
        print(&export::open(spec)?);
    }
    Ok(())
}

/// Run `dmkit close`.
pub fn close(a: CloseArgs) -> CliResult {
    export::close(&a.name)?;
    Ok(())
}

/// Run `dmkit status`.
pub fn status(a: StatusArgs) -> CliResult {
    let list = match export::status(a.name.as_deref()) {
        Ok(l) => l,
        Err(e @ ExportError::NotOpen { .. }) => {
            // veritysetup's wording, and its exit code 4.
            if !a.json {
                let name = a.name.as_deref().unwrap_or_default();
                println!("{} is inactive.", export::run_dir().join(name).display());
            }
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if a.json {
        let v = match (&a.name, list.into_iter().collect::<Vec<_>>()) {
            (Some(_), mut l) if l.len() == 1 => l.remove(0),
            (_, l) => Value::Array(l),
        };
        let text = serde_json::to_string_pretty(&v)
            .map_err(|e| CliError::invalid(format!("cannot encode the status: {e}")))?;
        println!("{text}");
        return Ok(());
    }
    for v in &list {
        print!("{}", human(v));
    }
    Ok(())
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

fn line(out: &mut String, key: &str, value: impl std::fmt::Display) {
    out.push_str(&format!("  {:<13}{value}\n", format!("{key}:")));
}

/// veritysetup-style text for one status object.
fn human(v: &Value) -> String {
    let mut out = String::new();
    let path = scalar(&v["path"]);
    match v["state"].as_str() {
        Some("active") => out.push_str(&format!("{path} is active.\n")),
        Some("dead") => out.push_str(&format!(
            "{path} is inactive: its server died; `dmkit close {}` cleans up.\n",
            scalar(&v["name"])
        )),
        Some(s) => out.push_str(&format!("{path} is {s}.\n")),
        None => out.push_str(&format!("{path}\n")),
    }
    if let Some(e) = v["error"].as_str() {
        line(&mut out, "error", e);
    }
    line(&mut out, "type", scalar(&v["kind"]));
    line(&mut out, "path", &path);
    if let Some(l) = v["loop_device"].as_str() {
        let dio = if v["loop_direct_io"].as_bool() == Some(true) {
            " (direct I/O)"
        } else {
            ""
        };
        line(&mut out, "loop", format!("{l}{dio}"));
    }
    if let Some(size) = v["size"].as_u64() {
        line(&mut out, "size", format!("{} sectors", size / 512));
    }
    let mode = if v["read_only"].as_bool() == Some(true) {
        "readonly"
    } else {
        "read/write"
    };
    line(&mut out, "mode", mode);
    if v["allow_discards"].as_bool() == Some(true) {
        line(&mut out, "flags", "discards");
    }
    line(&mut out, "pid", scalar(&v["pid"]));
    line(&mut out, "threads", scalar(&v["threads"]));
    if let Some(u) = v["uptime"].as_u64() {
        line(&mut out, "uptime", format!("{u} s"));
    }
    let section = |out: &mut String, obj: &Value| {
        if let Value::Object(m) = obj {
            for (k, x) in m {
                line(out, &k.replace('_', " "), scalar(x));
            }
        }
    };
    section(&mut out, &v["details"]);
    if let Value::Object(_) = &v["export"] {
        let e = &v["export"];
        line(&mut out, "requests", scalar(&e["requests"]));
        line(
            &mut out,
            "read",
            format!("{} bytes", scalar(&e["bytes_read"])),
        );
        line(
            &mut out,
            "written",
            format!("{} bytes", scalar(&e["bytes_written"])),
        );
        line(&mut out, "I/O errors", scalar(&e["io_errors"]));
        line(&mut out, "corruptions", scalar(&e["corruptions"]));
    }
    section(&mut out, &v["stats"]);
    line(&mut out, "log", scalar(&v["log"]));
    out
}
