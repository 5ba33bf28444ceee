//! `dmkit close` and `dmkit status`, and the plumbing every `... open` command shares to
//! serve a device ([`open_export`]).
use super::{CliError, CliResult};
use crate::block::Activated;
use crate::export::{self, CloseMode, Closed, ExportError, ExportSpec, ServeOptions};
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
    /// Name of the open device, or its exported file, mount point or loop device.
    pub name: String,
    /// If the device is in use, close it when the last user goes instead of refusing.
    #[arg(long, conflicts_with = "cancel_deferred")]
    pub deferred: bool,
    /// Withdraw a pending `--deferred` close.
    #[arg(long)]
    pub cancel_deferred: bool,
}

/// Arguments of `dmkit status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Name of the open device, or its exported file, mount point or loop device (all if
    /// omitted).
    pub name: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// How every `... open` serves its device: the FUSE file, and on request a loop device and NBD.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Also attach a loop device (/dev/loopN) to the exported file and print it.
    #[arg(long = "loop")]
    pub loop_device: bool,
    #[command(flatten)]
    pub nbd: super::nbd::NbdArgs,
    /// Serving threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// Serve in this process until closed or interrupted, instead of in the background.
    #[arg(long)]
    pub foreground: bool,
}

impl ServeArgs {
    /// Check `name` and the serving options before anything is read or claimed (see
    /// [`prepare_open`]); the loop device uses direct I/O unless the caller says otherwise.
    pub fn prepare(&self, name: &str) -> Result<ServeOptions, CliError> {
        prepare_open(name, self.loop_device)?;
        Ok(ServeOptions {
            fuse: self.nbd.fuse(),
            nbd: self.nbd.config(self.loop_device)?,
            loop_device: self.loop_device,
            direct_io_loop: true,
            threads: usize::from(self.threads),
        })
    }

    /// Serve `activated` as `how` says (see [`open_export`]).
    pub fn serve(&self, activated: Activated, how: ServeOptions) -> CliResult {
        open_export(ExportSpec::new(activated, how), self.foreground)
    }
}

/// What every `open` checks before it reads a key or claims a device: the name is valid and
/// free (what a dead server of that name left is cleaned up), and `--loop` is allowed.
pub fn prepare_open(name: &str, loop_device: bool) -> CliResult {
    export::validate_name(name)?;
    export::ensure_not_open(name)?;
    export::check_loop_allowed(name, loop_device)?;
    Ok(())
}

/// Serve `spec` and print where: the exported file on the first line (unless `--no-fuse`),
/// the loop device (if any) on the next (its logical block size on stderr), and the NBD URI
/// (if any) last. In the background (the default) this returns once the device is
/// served; with `foreground` it returns when the device is closed or the process is signalled.
/// Must run before the command has spawned any thread (see [`export::open`]).
pub fn open_export(spec: ExportSpec, foreground: bool) -> CliResult {
    let fuse = spec.fuse;
    let print = move |o: &export::Opened| {
        if fuse {
            println!("{}", o.path.display());
        }
        if let Some(l) = &o.loop_device {
            println!("{}", l.display());
            // On stderr: stdout stays one path per line for scripts.
            if let Some(note) = export::loopdev::block_size_note(l) {
                eprintln!("dmkit: {note}");
            }
        }
        if let Some(u) = &o.nbd {
            println!("{u}");
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
    let mode = if a.deferred {
        CloseMode::Deferred
    } else if a.cancel_deferred {
        CloseMode::CancelDeferred
    } else {
        CloseMode::Now
    };
    let name = export::resolve_target(&a.name)?;
    let closed = export::close(&name, mode).map_err(|e| as_typed(e, &a.name))?;
    if closed == Closed::CleanedUp {
        eprintln!(
            "dmkit: {}: its server had died; removed what it left behind",
            a.name
        );
    }
    Ok(())
}

/// `e` naming the device as the user typed it (a path, when they gave one) rather than by its
/// resolved name, which for a tree is an escaped path nobody would type.
fn as_typed(e: ExportError, typed: &str) -> ExportError {
    let typed = typed.to_string();
    match e {
        ExportError::NotOpen { .. } => ExportError::NotOpen { name: typed },
        ExportError::InUse { reason, .. } => ExportError::InUse {
            name: typed,
            reason,
        },
        ExportError::Busy { reason, .. } => ExportError::Busy {
            name: typed,
            reason,
        },
        e => e,
    }
}

/// Run `dmkit status`.
pub fn status(a: StatusArgs) -> CliResult {
    let name = match a.name.as_deref().map(export::resolve_target).transpose() {
        Ok(n) => n,
        Err(e @ ExportError::NotOpenAt { .. }) => {
            if !a.json {
                println!("{} is inactive.", a.name.as_deref().unwrap_or_default());
            }
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    let list = match export::status(name.as_deref()) {
        Ok(l) => l,
        Err(e @ ExportError::NotOpen { .. }) if a.name != name => {
            // A path that names no state of its own: what the user typed is inactive.
            if !a.json {
                println!("{} is inactive.", a.name.as_deref().unwrap_or_default());
            }
            return Err(as_typed(e, a.name.as_deref().unwrap_or_default()).into());
        }
        Err(e @ ExportError::NotOpen { .. }) => {
            // veritysetup's line on stdout (and its exit code 4), and the error line every
            // failure has on stderr.
            if !a.json {
                let name = name.as_deref().unwrap_or_default();
                println!("{} is inactive.", export::run_dir().join(name).display());
            }
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    // A named device whose server died is not active: exit 4 as for any inactive device (the
    // listing of everything stays a success).
    let inactive = match (&a.name, list.first()) {
        (Some(_), Some(v)) => v["state"].as_str() != Some("active"),
        _ => false,
    };
    if a.json {
        let v = match (&a.name, list) {
            (Some(_), mut l) if l.len() == 1 => l.remove(0),
            (_, l) => Value::Array(l),
        };
        let text = serde_json::to_string_pretty(&v)
            .map_err(|e| CliError::invalid(format!("cannot encode the status: {e}")))?;
        println!("{text}");
    } else {
        for v in &list {
            print!("{}", human(v));
        }
    }
    if let (true, Some(name)) = (inactive, &a.name) {
        return Err(CliError::no_device(format!("device {name} is not active")));
    }
    Ok(())
}

/// What to type after `dmkit close` for the device of status object `v`.
fn typeable(v: &Value) -> String {
    let path = std::path::PathBuf::from(scalar(&v["path"]));
    export::typeable(
        &scalar(&v["name"]),
        &path,
        v["tree"].as_bool() == Some(true),
    )
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

/// Status rows, printed with the values aligned after the longest key.
#[derive(Default)]
struct Rows(Vec<(String, String)>);

impl Rows {
    fn add(&mut self, key: &str, value: impl std::fmt::Display) {
        self.0.push((format!("{key}:"), value.to_string()));
    }

    /// One row per field of `obj`, but those in `except` (shown elsewhere).
    fn add_object(&mut self, obj: &Value, except: &[&str]) {
        if let Value::Object(m) = obj {
            for (k, x) in m.iter().filter(|(k, _)| !except.contains(&k.as_str())) {
                self.add(&k.replace('_', " "), scalar(x));
            }
        }
    }

    fn render(&self) -> String {
        let width = self.0.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
        self.0
            .iter()
            .map(|(k, v)| format!("  {k:<width$}{v}\n"))
            .collect()
    }
}

/// The NBD server and its clients, one row each.
fn nbd_rows(rows: &mut Rows, v: &Value) {
    let n = &v["nbd"];
    let Some(uri) = n["uri"].as_str().or(v["nbd_uri"].as_str()) else {
        return;
    };
    rows.add("nbd", uri);
    if !n.is_object() {
        return;
    }
    rows.add("nbd tls", scalar(&n["tls"]));
    let t = &n["totals"];
    rows.add(
        "nbd served",
        format!(
            "{} requests, {} bytes read, {} written, {} I/O errors ({} corruptions)",
            scalar(&t["requests"]),
            scalar(&t["bytes_read"]),
            scalar(&t["bytes_written"]),
            scalar(&t["io_errors"]),
            scalar(&t["corruptions"])
        ),
    );
    let clients = n["clients"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    // The cap counts connections in transmission; those still negotiating are shown apart.
    let negotiating = clients
        .iter()
        .filter(|c| c["phase"].as_str() == Some("handshake"))
        .count();
    let handshakes = match negotiating {
        0 => String::new(),
        k => format!("{k} in handshake, "),
    };
    rows.add(
        "nbd clients",
        format!(
            "{} of {} ({handshakes}{} connections so far, {} refused)",
            clients.len() - negotiating,
            scalar(&n["max_connections"]),
            scalar(&n["connections"]),
            scalar(&n["refused"])
        ),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for c in clients {
        let since = c["since"].as_u64().unwrap_or(now);
        rows.add(
            "nbd client",
            format!(
                "{}{}, {} for {} s, {} requests, {} bytes read, {} written",
                scalar(&c["peer"]),
                if c["tls"].as_bool() == Some(true) {
                    " (TLS)"
                } else {
                    ""
                },
                scalar(&c["phase"]),
                now.saturating_sub(since),
                scalar(&c["requests"]),
                scalar(&c["bytes_read"]),
                scalar(&c["bytes_written"])
            ),
        );
    }
}

/// veritysetup-style text for one status object.
fn human(v: &Value) -> String {
    // An NBD-only device has no file: its URI names it.
    let path = match (v["fuse"].as_bool(), v["nbd_uri"].as_str()) {
        (Some(false), Some(uri)) => uri.to_string(),
        _ => scalar(&v["path"]),
    };
    let mut out = match v["state"].as_str() {
        Some("active") => format!("{path} is active.\n"),
        Some("dead") => format!(
            "{path} is inactive: its server died; `dmkit close {}` cleans up.\n",
            typeable(v)
        ),
        Some(s) => format!("{path} is {s}.\n"),
        None => format!("{path}\n"),
    };
    let mut rows = Rows::default();
    if let Some(e) = v["error"].as_str() {
        rows.add("error", e);
    }
    // device-mapper's word for the layer; "type" is left to the layer's own details (LUKS2).
    rows.add("target", scalar(&v["kind"]));
    // The name only where the path does not end in it (a tree's mount point, an NBD-only
    // device's URI); quoted as it must be typed.
    let name = scalar(&v["name"]);
    if !path.ends_with(&format!("/{name}")) {
        rows.add("name", export::shell_word(&name));
    }
    rows.add("path", &path);
    if let Some(l) = v["loop_device"].as_str() {
        let dio = if v["loop_direct_io"].as_bool() == Some(true) {
            " (direct I/O)"
        } else {
            ""
        };
        rows.add("loop", format!("{l}{dio}"));
    }
    if let Some(size) = v["size"].as_u64() {
        rows.add("size", format!("{} sectors", size / 512));
    }
    let mode = if v["read_only"].as_bool() == Some(true) {
        "readonly"
    } else {
        "read/write"
    };
    // cryptsetup's words for a suspended device.
    let suspended = if v["suspended"].as_bool() == Some(true) {
        " (suspended)"
    } else {
        ""
    };
    rows.add("mode", format!("{mode}{suspended}"));
    if v["allow_discards"].as_bool() == Some(true) {
        rows.add("flags", "discards");
    }
    rows.add("pid", scalar(&v["pid"]));
    if let Some(n) = v["open_handles"].as_u64() {
        rows.add("open handles", n);
    }
    let r = &v["reencryption"];
    if let Some(why) = r["unserved"].as_str() {
        rows.add("reencryption", format!("failed, serving nothing: {why}"));
    } else if let (Some(done), Some(size)) = (r["done"].as_u64(), r["size"].as_u64()) {
        let state = match (r["running"].as_bool(), r["finished"].as_bool()) {
            (_, Some(true)) => "finished",
            (Some(true), _) => "in progress",
            _ => "stopped",
        };
        rows.add(
            "reencryption",
            format!(
                "{state}, {} of {} MiB ({:.1}%)",
                done >> 20,
                size >> 20,
                r["percent"].as_f64().unwrap_or(0.0)
            ),
        );
    }
    if v["deferred_close"].as_bool() == Some(true) {
        rows.add("deferred close", "pending (closes when the last user goes)");
    }
    match v["fuse_transport"]["description"].as_str() {
        Some(t) => rows.add("fuse transport", t),
        None => rows.add("threads", scalar(&v["threads"])),
    }
    if let Some(u) = v["uptime"].as_u64() {
        rows.add("uptime", format!("{u} s"));
    }
    rows.add_object(&v["details"], &[]);
    if let Value::Object(_) = &v["export"] {
        let e = &v["export"];
        rows.add("requests", scalar(&e["requests"]));
        rows.add("read", format!("{} bytes", scalar(&e["bytes_read"])));
        rows.add("written", format!("{} bytes", scalar(&e["bytes_written"])));
        rows.add("I/O errors", scalar(&e["io_errors"]));
        // Every corrupt block the layer found, whether the reader got EIO or (with
        // ignore_corruption) the data; layers that do not count them report the failed reads.
        let corruptions = match &v["stats"]["corruptions"] {
            Value::Null => &e["corruptions"],
            n => n,
        };
        rows.add("corruptions", scalar(corruptions));
    }
    rows.add_object(&v["stats"], &["corruptions"]);
    nbd_rows(&mut rows, v);
    rows.add("log", scalar(&v["log"]));
    out.push_str(&rows.render());
    out
}
