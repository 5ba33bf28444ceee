//! `dmkit bench rootless`: issue 26's closing benchmarks, per file system `image build` makes
//! (SquashFS, EROFS, ext4), one image each of one tree, all in one run:
//!
//! - cold read of the whole tree (every file read to the end, every link and inode; the page
//!   cache dropped before each open) through the kernel as root — `dmkit image open` (dm-verity
//!   by dmkit, loop device, the kernel's file system, OverlayFS) and, for reference, the root
//!   partition loop-mounted without verity — against `dmkit image open` run as `nobody`
//!   (dmkit's FUSE server over the userspace reader) in each overlay mode the machine allows;
//! - `dmkit image mtree` as `nobody` on the image file against hashing the same files from the
//!   kernel mount: dmkit's own hashing walk (the `sha2` SHA-256 `image mtree` uses) and
//!   `find -type f -print0 | xargs -0 sha256sum`. The three lists of digests must agree.
//!
//! The reads run in a subprocess (`dmkit bench read-tree`, hidden), as root or as `nobody`, so
//! every side pays the same and a FUSE mount of `nobody` is read by its owner.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::image::{drop_caches, is_root, last_message, read_tree, read_tree_with};
use super::image_tree::TreeBenchOptions;
use crate::bench::harness::model::Stats;
use crate::bench::harness::process::{run_ok, say, Captured, Dmkit, Interrupt, Workspace};
use crate::bench::harness::table::{Align, TextTable};
use crate::bench::BenchError;
use crate::image::build::human;
use crate::image::mkfs::find_program;
use crate::image::tree::TreeStats;

/// The file systems `dmkit image build --fs` makes, each with its default compression.
pub const FILE_SYSTEMS: [&str; 3] = ["squashfs", "erofs", "ext4"];

/// The rootless overlay modes (`image open --overlay`).
pub const OVERLAYS: [&str; 2] = ["userns", "fuse-overlayfs"];

/// How long one read, hash or open may take before it counts as hung.
const STEP_TIMEOUT: Duration = Duration::from_secs(1800);

/// What to run.
#[derive(Debug, Clone)]
pub struct RootlessBenchOptions {
    /// The tree (`bench image`'s), scratch and cache directories, runs, progress.
    pub common: TreeBenchOptions,
    /// The file systems, of [`FILE_SYSTEMS`].
    pub fs: Vec<String>,
}

impl RootlessBenchOptions {
    /// Defaults: `bench image`'s tree, every file system, 3 runs; `quick`: its `usr/bin`, one
    /// run.
    pub fn defaults(quick: bool) -> RootlessBenchOptions {
        RootlessBenchOptions {
            common: TreeBenchOptions::defaults(quick),
            fs: FILE_SYSTEMS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// One measured thing, over the runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Series {
    /// Short name: `kernel`, `kernel-loop`, `userns`, `fuse-overlayfs`, `mtree`, `walk`,
    /// `sha256sum`.
    pub key: String,
    /// Seconds to open (mount) before each run (reads only).
    pub open_s: Vec<f64>,
    /// Seconds of each run.
    pub seconds: Vec<f64>,
    /// Regular files read or hashed in the last run.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// Why it was not measured.
    pub skipped: Option<String>,
}

impl Series {
    fn new(key: &str, skipped: Option<String>) -> Series {
        Series {
            key: key.into(),
            open_s: Vec::new(),
            seconds: Vec::new(),
            files: 0,
            bytes: 0,
            skipped,
        }
    }

    /// Median and spread of the runs.
    pub fn stats(&self) -> Option<Stats> {
        Stats::of(&self.seconds)
    }
}

/// One file system's image and its measurements.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FsResult {
    /// `--fs`.
    pub fs: String,
    /// The compression `image build` chose (its default).
    pub compress: String,
    /// Bytes of the GPT image.
    pub image_size: Option<u64>,
    /// Seconds `dmkit image build` took.
    pub build_s: Option<f64>,
    /// Why the image could not be built.
    pub skipped: Option<String>,
    /// Cold reads of the whole tree: `kernel`, `kernel-loop`, then each rootless mode.
    pub reads: Vec<Series>,
    /// Hashing every file: `mtree`, `walk`, `sha256sum`.
    pub hashes: Vec<Series>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RootlessBenchReport {
    /// The tree.
    pub tree: PathBuf,
    /// What the tree is.
    pub tree_source: String,
    /// Its counts.
    pub tree_stats: TreeStats,
    /// Runs per measurement.
    pub runs: u32,
    /// The scratch directory's parent.
    pub dir: PathBuf,
    /// The running kernel.
    pub kernel: String,
    /// The dmkit build measured.
    pub build: String,
    /// Whether the images are signed (an openssl-made key; `--cert` given to every open).
    pub signed: bool,
    /// The 1, 5 and 15 minute load average before the first and after the last run.
    pub load_before: [f64; 3],
    /// See `load_before`.
    pub load_after: [f64; 3],
    /// One per file system.
    pub filesystems: Vec<FsResult>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Io { what, source }
}

/// What `dmkit bench read-tree` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TreeRead {
    /// Regular files read.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Seconds the walk took, in the walking process.
    pub seconds: f64,
    /// With `sha256`: the hex SHA-256 of every non-empty regular file, sorted.
    pub sha256: Vec<String>,
}

/// `dmkit bench read-tree ROOT [--sha256]`: [`read_tree`] (or, hashing, the same walk feeding
/// each file to SHA-256 as `image mtree` does), timed.
pub fn read_tree_timed(root: &Path, sha256: bool) -> Result<TreeRead, BenchError> {
    use sha2::{Digest, Sha256};
    let interrupt = Interrupt::none();
    let t = Instant::now();
    let mut sums = Vec::new();
    let (files, bytes) = if sha256 {
        let mut buf = vec![0u8; 1 << 20];
        read_tree_with(root, &interrupt, &mut |_, f| {
            let mut h = Sha256::new();
            let mut n = 0;
            loop {
                match std::io::Read::read(f, &mut buf)? {
                    0 => break,
                    k => {
                        h.update(&buf[..k]);
                        n += k as u64;
                    }
                }
            }
            if n > 0 {
                sums.push(hex::encode(h.finalize()));
            }
            Ok(n)
        })?
    } else {
        read_tree(root, &interrupt)?
    };
    let seconds = t.elapsed().as_secs_f64();
    sums.sort();
    Ok(TreeRead {
        files,
        bytes,
        seconds,
        sha256: sums,
    })
}

/// The unprivileged user the rootless side runs as.
#[derive(Debug, Clone, Copy)]
struct User {
    uid: u32,
    gid: u32,
}

fn nobody() -> Option<User> {
    // SAFETY: getpwnam with a NUL-terminated name; the fields are copied out before any other
    // passwd call could overwrite the static buffer.
    unsafe {
        let p = libc::getpwnam(c"nobody".as_ptr());
        if p.is_null() {
            return None;
        }
        Some(User {
            uid: (*p).pw_uid,
            gid: (*p).pw_gid,
        })
    }
}

/// Everything the run needs, checked before anything is built: one line naming what is missing.
fn check_machine() -> Result<(User, PathBuf), BenchError> {
    let miss = |m: &str| Err(BenchError::Missing(format!("bench rootless: {m}")));
    if !is_root() {
        return miss("needs root (it mounts images with the kernel, drops the page cache and runs the rootless side as nobody)");
    }
    if !Path::new("/dev/loop-control").exists() {
        return miss("no loop devices (/dev/loop-control is missing: modprobe loop)");
    }
    if !Path::new("/dev/fuse").exists() {
        return miss("no FUSE (/dev/fuse is missing: modprobe fuse)");
    }
    let Some(user) = nobody() else {
        return miss("there is no user `nobody` to run the rootless side as");
    };
    let Some(setpriv) = find_program("setpriv") else {
        return miss("setpriv is not installed (apt-get install util-linux)");
    };
    Ok((user, setpriv))
}

/// Why overlay mode `m` cannot run here (`None`: it can).
fn overlay_unavailable(m: &str, su: &Su) -> Option<String> {
    match m {
        "userns" => {
            let mut c = su.command("unshare");
            c.args(["--user", "true"]);
            let ok = c
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            (!ok).then(|| {
                "nobody may not create a user namespace here (unprivileged user namespaces are off)"
                    .to_string()
            })
        }
        _ => {
            for (p, pkg) in [
                ("fuse-overlayfs", "fuse-overlayfs"),
                ("fusermount3", "fuse3"),
            ] {
                if find_program(p).is_none() {
                    return Some(format!("{p} is not installed (apt-get install {pkg})"));
                }
            }
            None
        }
    }
}

/// Commands run as the unprivileged user (setpriv), with their own run directory.
struct Su {
    setpriv: PathBuf,
    user: User,
    run_dir: PathBuf,
}

impl Su {
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        let mut c = std::process::Command::new(&self.setpriv);
        c.arg(format!("--reuid={}", self.user.uid))
            .arg(format!("--regid={}", self.user.gid))
            .arg("--clear-groups")
            .arg(program)
            .env("DMKIT_RUN_DIR", &self.run_dir)
            .env_remove("XDG_RUNTIME_DIR");
        c
    }

    fn dmkit<I, S>(&self, dmkit: &Dmkit, args: I) -> std::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = self.command(&dmkit.exe);
        c.args(args);
        c
    }
}

/// How the tree is reached for one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `dmkit image open` as root.
    Kernel,
    /// `mount -o ro,loop,offset=...` of the root partition, no verity.
    KernelLoop,
    /// `dmkit image open --overlay MODE` as the user.
    Rootless(&'static str),
}

impl Via {
    fn key(self) -> &'static str {
        match self {
            Via::Kernel => "kernel",
            Via::KernelLoop => "kernel-loop",
            Via::Rootless(m) => m,
        }
    }
}

/// One built image.
struct Image {
    fs: &'static str,
    path: PathBuf,
    /// (offset, size) of the root partition.
    root_part: (u64, u64),
}

/// The run's fixed parts.
struct Ctx<'a> {
    dmkit: &'a Dmkit,
    su: &'a Su,
    ws: &'a Workspace,
    cert: Option<PathBuf>,
    /// Root's mount point.
    mnt: PathBuf,
    /// The user's mount point.
    user_mnt: PathBuf,
    interrupt: &'a Interrupt,
}

impl Ctx<'_> {
    fn run(&self, cmd: &mut std::process::Command) -> Result<Captured, BenchError> {
        run_ok(cmd, self.ws.dir(), self.interrupt, Some(STEP_TIMEOUT))
    }

    fn cert_args(&self) -> Vec<OsString> {
        match &self.cert {
            Some(c) => vec!["--cert".into(), c.into()],
            None => Vec::new(),
        }
    }

    /// Mount `img` as `via` says; the directory to read and what undoes the mount.
    fn mount(&self, img: &Image, via: Via) -> Result<(PathBuf, Unmount<'_>), BenchError> {
        match via {
            Via::Kernel => {
                let mut args: Vec<OsString> = vec!["image".into(), "open".into()];
                args.extend(self.cert_args());
                args.extend([img.path.clone().into(), self.mnt.clone().into()]);
                self.run(&mut self.dmkit.command(&args))?;
                Ok((self.mnt.clone(), Unmount::new(self, via)))
            }
            Via::KernelLoop => {
                let (off, size) = img.root_part;
                let mut opts = format!("ro,loop,offset={off},sizelimit={size}");
                if img.fs == "ext4" {
                    opts.push_str(",noload");
                }
                let mut c = std::process::Command::new("mount");
                c.args(["-t", img.fs, "-o", &opts])
                    .arg(&img.path)
                    .arg(&self.mnt);
                self.run(&mut c)?;
                Ok((self.mnt.clone(), Unmount::new(self, via)))
            }
            Via::Rootless(mode) => {
                let mut args: Vec<OsString> = vec![
                    "image".into(),
                    "open".into(),
                    "--json".into(),
                    "--overlay".into(),
                    mode.into(),
                ];
                args.extend(self.cert_args());
                args.extend([img.path.clone().into(), self.user_mnt.clone().into()]);
                let out = self.run(&mut self.su.dmkit(self.dmkit, &args))?;
                let un = Unmount::new(self, via);
                let v: serde_json::Value = serde_json::from_str(&out.stdout).map_err(|e| {
                    BenchError::Tool(format!("dmkit image open --json as nobody: {e}"))
                })?;
                let at = match (mode, v["server_pid"].as_u64()) {
                    ("userns", Some(pid)) => {
                        crate::image::rootless::userns_path(pid as u32, &self.user_mnt)
                    }
                    ("userns", None) => {
                        return Err(BenchError::Tool(format!(
                            "dmkit image open --json as nobody names no server_pid: {v}"
                        )))
                    }
                    _ => self.user_mnt.clone(),
                };
                Ok((at, un))
            }
        }
    }
}

/// Undoes a mount when dropped (or by [`Unmount::undo`], which reports a failure).
struct Unmount<'a> {
    ctx: &'a Ctx<'a>,
    via: Via,
    open: bool,
}

impl<'a> Unmount<'a> {
    fn new(ctx: &'a Ctx<'a>, via: Via) -> Unmount<'a> {
        Unmount {
            ctx,
            via,
            open: true,
        }
    }

    fn undo(&mut self) -> Result<(), BenchError> {
        if !std::mem::replace(&mut self.open, false) {
            return Ok(());
        }
        let c = self.ctx;
        let mut cmd = match self.via {
            Via::Kernel => c
                .dmkit
                .command(["image".as_ref(), "close".as_ref(), c.mnt.as_os_str()]),
            Via::KernelLoop => {
                let mut u = std::process::Command::new("umount");
                u.arg("-d").arg(&c.mnt);
                u
            }
            Via::Rootless(_) => c.su.dmkit(
                c.dmkit,
                ["image".as_ref(), "close".as_ref(), c.user_mnt.as_os_str()],
            ),
        };
        run_ok(&mut cmd, c.ws.dir(), &Interrupt::none(), Some(STEP_TIMEOUT)).map(|_| ())
    }
}

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            eprintln!(
                "dmkit: warning: could not unmount ({}): {e}",
                self.via.key()
            );
        }
    }
}

fn parse_tree_read(out: &Captured, what: &str) -> Result<TreeRead, BenchError> {
    serde_json::from_str(&out.stdout)
        .map_err(|e| BenchError::Tool(format!("dmkit bench read-tree ({what}): {e}")))
}

/// Drop caches, mount, read the whole tree (the reader as root, or as the user for a rootless
/// mount), unmount: (open s, the read).
fn measure_read(c: &Ctx, img: &Image, via: Via) -> Result<(f64, TreeRead), BenchError> {
    drop_caches()?;
    let t = Instant::now();
    let (at, mut un) = c.mount(img, via)?;
    let open_s = t.elapsed().as_secs_f64();
    let args: [&std::ffi::OsStr; 3] = ["bench".as_ref(), "read-tree".as_ref(), at.as_os_str()];
    let mut cmd = match via {
        Via::Rootless(_) => c.su.dmkit(c.dmkit, args),
        _ => c.dmkit.command(args),
    };
    let r = parse_tree_read(&c.run(&mut cmd)?, via.key())?;
    un.undo()?;
    Ok((open_s, r))
}

/// The sorted SHA-256 of every non-empty file in `sha256sum` output.
fn sums_of_sha256sum(out: &str) -> Vec<String> {
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| l.trim_start_matches('\\').get(..64))
        .filter(|h| *h != EMPTY)
        .map(String::from)
        .collect();
    v.sort();
    v
}

/// The sorted `sha256sum=` values of `image mtree` output.
fn sums_of_mtree(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("sha256sum="))
                .map(String::from)
        })
        .collect();
    v.sort();
    v
}

/// One way of hashing the tree: (key, seconds, files, bytes, sorted digests).
type Hashed = (&'static str, f64, u64, u64, Vec<String>);

/// Hash every file three ways, caches dropped before each: `image mtree` as the user on the
/// image file, then dmkit's walk and sha256sum over the kernel mount (`image open` as root,
/// fresh for each). Each gives (seconds, files, bytes, sorted digests).
fn measure_hashes(c: &Ctx, img: &Image) -> Result<Vec<Hashed>, BenchError> {
    let mut out = Vec::new();
    drop_caches()?;
    let mut args: Vec<OsString> = vec!["image".into(), "mtree".into()];
    args.extend(c.cert_args());
    args.push(img.path.clone().into());
    let m = c.run(&mut c.su.dmkit(c.dmkit, &args))?;
    let sums = sums_of_mtree(&m.stdout);
    let files = m
        .stdout
        .lines()
        .filter(|l| l.contains(" type=file "))
        .count() as u64;
    let bytes = m
        .stdout
        .lines()
        .filter(|l| l.contains(" type=file "))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("size=")))
        .filter_map(|s| s.parse::<u64>().ok())
        .sum();
    out.push(("mtree", m.elapsed.as_secs_f64(), files, bytes, sums));

    drop_caches()?;
    let (at, mut un) = c.mount(img, Via::Kernel)?;
    let w = c.run(&mut c.dmkit.command([
        "bench".as_ref(),
        "read-tree".as_ref(),
        "--sha256".as_ref(),
        at.as_os_str(),
    ]))?;
    let r = parse_tree_read(&w, "--sha256")?;
    un.undo()?;
    out.push(("walk", w.elapsed.as_secs_f64(), r.files, r.bytes, r.sha256));

    drop_caches()?;
    let (at, mut un) = c.mount(img, Via::Kernel)?;
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg("cd \"$1\" && find . -type f -print0 | xargs -0 -r sha256sum")
        .arg("sh")
        .arg(&at);
    let s = c.run(&mut sh)?;
    un.undo()?;
    let sums = sums_of_sha256sum(&s.stdout);
    out.push(("sha256sum", s.elapsed.as_secs_f64(), r.files, r.bytes, sums));
    Ok(out)
}

fn build_image(
    c: &Ctx,
    fs: &'static str,
    tree: &Path,
    key: Option<&Path>,
) -> Result<(Image, serde_json::Value), BenchError> {
    let path = c.ws.path(&format!("{fs}.img"));
    let mut args: Vec<OsString> = vec![
        "image".into(),
        "build".into(),
        tree.into(),
        path.clone().into(),
        "--fs".into(),
        fs.into(),
        "--json".into(),
    ];
    if let (Some(k), Some(cert)) = (key, &c.cert) {
        args.extend(["--key".into(), k.into(), "--cert".into(), cert.into()]);
    }
    let out = c.run(&mut c.dmkit.command(&args))?;
    let report: serde_json::Value = serde_json::from_str(&out.stdout)
        .map_err(|e| BenchError::Tool(format!("dmkit image build --json: {e}")))?;
    set_mode(&path, 0o644)?;
    let inspect = c.run(&mut c.dmkit.command([
        "image".as_ref(),
        "inspect".as_ref(),
        "--json".as_ref(),
        path.as_os_str(),
    ]))?;
    let inspect: serde_json::Value = serde_json::from_str(&inspect.stdout)
        .map_err(|e| BenchError::Tool(format!("dmkit image inspect --json: {e}")))?;
    let root_part = inspect["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            p["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("root-") && !t.contains("verity"))
        })
        .and_then(|p| Some((p["offset"].as_u64()?, p["size"].as_u64()?)))
        .ok_or_else(|| {
            BenchError::Tool(format!("{}: no root partition in inspect", path.display()))
        })?;
    Ok((
        Image {
            fs,
            path,
            root_part,
        },
        report,
    ))
}

fn set_mode(p: &Path, mode: u32) -> Result<(), BenchError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", p.display())))
}

/// A directory owned by the user.
fn user_dir(p: &Path, u: User) -> Result<(), BenchError> {
    std::fs::create_dir(p).map_err(io(format!("create {}", p.display())))?;
    std::os::unix::fs::chown(p, Some(u.uid), Some(u.gid))
        .map_err(io(format!("chown {}", p.display())))?;
    set_mode(p, 0o755)
}

/// A signing key and certificate made with openssl in the workspace, when openssl is there.
fn make_key(
    ws: &Workspace,
    interrupt: &Interrupt,
) -> Result<Option<(PathBuf, PathBuf)>, BenchError> {
    if find_program("openssl").is_none() {
        return Ok(None);
    }
    let (key, cert) = (ws.path("signing.key"), ws.path("signing.crt"));
    let mut c = std::process::Command::new("openssl");
    c.args([
        "req",
        "-x509",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-subj",
        "/CN=dmkit bench rootless",
        "-days",
        "2",
        "-keyout",
    ])
    .arg(&key)
    .arg("-out")
    .arg(&cert);
    run_ok(&mut c, ws.dir(), interrupt, Some(STEP_TIMEOUT))?;
    set_mode(&cert, 0o644)?;
    Ok(Some((key, cert)))
}

/// The file systems asked for, checked against [`FILE_SYSTEMS`].
fn chosen(fs: &[String]) -> Result<Vec<&'static str>, BenchError> {
    let mut v = Vec::new();
    for f in fs {
        let Some(k) = FILE_SYSTEMS.iter().find(|k| **k == f.as_str()) else {
            return Err(BenchError::Invalid(format!(
                "--fs {f}: not a file system image build makes (squashfs, erofs, ext4)"
            )));
        };
        if !v.contains(k) {
            v.push(*k);
        }
    }
    if v.is_empty() {
        return Err(BenchError::Invalid(
            "--fs: give at least one file system".into(),
        ));
    }
    Ok(v)
}

/// Run the benchmark.
pub fn run(
    o: &RootlessBenchOptions,
    interrupt: &Interrupt,
) -> Result<RootlessBenchReport, BenchError> {
    if o.common.runs == 0 {
        return Err(BenchError::Invalid("--runs must be at least 1".into()));
    }
    let fss = chosen(&o.fs)?;
    let (user, setpriv) = check_machine()?;
    let dmkit = Dmkit::from_env()?;
    let ws = Workspace::create(&o.common.dir)?;
    set_mode(ws.dir(), 0o755)?;
    let (tree, tree_stats) = o.common.pick(ws.dir(), interrupt)?;
    let home = ws.path("user");
    user_dir(&home, user)?;
    let su = Su {
        setpriv,
        user,
        run_dir: home.join("run"),
    };
    // The user reads the images and mounts under the workspace: every parent must let them.
    let reach = su
        .command("test")
        .args(["-x".as_ref(), home.as_os_str()])
        .status()
        .is_ok_and(|s| s.success());
    if !reach {
        return Err(BenchError::Invalid(format!(
            "--dir {}: nobody cannot reach {} (a parent directory is not searchable by others)",
            o.common.dir.display(),
            home.display()
        )));
    }
    let modes: Vec<(&'static str, Option<String>)> = OVERLAYS
        .iter()
        .map(|m| (*m, overlay_unavailable(m, &su)))
        .collect();
    if modes.iter().all(|(_, why)| why.is_some()) {
        let why: Vec<String> = modes
            .iter()
            .map(|(m, w)| format!("{m}: {}", w.as_deref().unwrap_or("")))
            .collect();
        return Err(BenchError::Missing(format!(
            "bench rootless: no rootless overlay mode can run here ({})",
            why.join("; ")
        )));
    }
    let user_mnt = home.join("mnt");
    user_dir(&user_mnt, user)?;
    let mnt = ws.path("mnt");
    std::fs::create_dir(&mnt).map_err(io(format!("create {}", mnt.display())))?;
    let key = make_key(&ws, interrupt)?;
    let ctx = Ctx {
        dmkit: &dmkit,
        su: &su,
        ws: &ws,
        cert: key.as_ref().map(|(_, c)| c.clone()),
        mnt,
        user_mnt,
        interrupt,
    };

    // Build every image first.
    let mut results = Vec::new();
    let mut images = Vec::new();
    for fs in &fss {
        let t = Instant::now();
        let mut r = FsResult {
            fs: fs.to_string(),
            compress: String::new(),
            image_size: None,
            build_s: None,
            skipped: None,
            reads: Vec::new(),
            hashes: Vec::new(),
        };
        match build_image(&ctx, fs, &tree.path, key.as_ref().map(|(k, _)| k.as_path())) {
            Ok((img, rep)) => {
                r.build_s = Some(t.elapsed().as_secs_f64());
                r.image_size = rep["image_size"].as_u64();
                r.compress = rep["compress"].as_str().unwrap_or("").to_string();
                say(
                    o.common.progress,
                    format!(
                        "built {fs} ({}): {} in {:.1} s",
                        r.compress,
                        human(r.image_size.unwrap_or(0)),
                        t.elapsed().as_secs_f64()
                    ),
                );
                images.push(Some(img));
            }
            Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
            Err(e) => {
                let why = last_message(&e);
                say(o.common.progress, format!("{fs}: not built: {why}"));
                r.skipped = Some(why);
                images.push(None);
            }
        }
        let mut vias = vec![(Via::Kernel, None), (Via::KernelLoop, None)];
        vias.extend(modes.iter().map(|(m, w)| (Via::Rootless(m), w.clone())));
        r.reads = vias
            .iter()
            .map(|(v, w)| Series::new(v.key(), w.clone()))
            .collect();
        r.hashes = ["mtree", "walk", "sha256sum"]
            .iter()
            .map(|k| Series::new(k, None))
            .collect();
        results.push(r);
    }

    let load_before = crate::bench::seeds::machine::load_average();
    for run in 0..o.common.runs {
        for (k, img) in images.iter().enumerate() {
            let Some(img) = img else { continue };
            let res = &mut results[k];
            for s in res.reads.iter_mut().filter(|s| s.skipped.is_none()) {
                let via = match s.key.as_str() {
                    "kernel" => Via::Kernel,
                    "kernel-loop" => Via::KernelLoop,
                    m => Via::Rootless(OVERLAYS.into_iter().find(|x| *x == m).expect("a mode")),
                };
                let (open_s, r) = match measure_read(&ctx, img, via) {
                    Ok(m) => m,
                    // The kernel side is the baseline: without it the row means nothing.
                    Err(e) if matches!(e, BenchError::Interrupted) || via == Via::Kernel => {
                        return Err(e)
                    }
                    Err(e) => {
                        say(o.common.progress, format!("{} {}: {e}", img.fs, s.key));
                        s.skipped = Some(e.to_string());
                        continue;
                    }
                };
                crate::bench::harness::process::notify(
                    crate::bench::harness::process::Event::RunDone,
                );
                say(
                    o.common.progress,
                    format!(
                        "run {}/{} {:<8} {:<14} open {:.2} s, read {} files {} in {:.2} s",
                        run + 1,
                        o.common.runs,
                        img.fs,
                        s.key,
                        open_s,
                        r.files,
                        human(r.bytes),
                        r.seconds
                    ),
                );
                s.open_s.push(open_s);
                s.seconds.push(r.seconds);
                s.files = r.files;
                s.bytes = r.bytes;
            }
            let hashed = measure_hashes(&ctx, img)?;
            let base = &hashed[1].4;
            for (key, secs, files, bytes, sums) in &hashed {
                if sums != base {
                    return Err(BenchError::Mismatch(format!(
                        "{}: {key} gives {} digests that differ from dmkit's walk over the kernel mount ({} digests)",
                        img.fs,
                        sums.len(),
                        base.len()
                    )));
                }
                let s = res
                    .hashes
                    .iter_mut()
                    .find(|s| s.key == *key)
                    .expect("every hash side");
                s.seconds.push(*secs);
                s.files = *files;
                s.bytes = *bytes;
                say(
                    o.common.progress,
                    format!(
                        "run {}/{} {:<8} hash {:<10} {} files {} in {:.2} s",
                        run + 1,
                        o.common.runs,
                        img.fs,
                        key,
                        files,
                        human(*bytes),
                        secs
                    ),
                );
            }
        }
    }
    let load_after = crate::bench::seeds::machine::load_average();
    let build = dmkit.build_label();
    if dmkit.replaced() {
        return Err(BenchError::Tool(format!(
            "{} was rebuilt during the benchmark: the runs mix two builds",
            dmkit.exe.display()
        )));
    }
    drop(ctx);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok(RootlessBenchReport {
        tree: tree.path,
        tree_source: tree.source,
        tree_stats,
        runs: o.common.runs,
        dir: o.common.dir.clone(),
        kernel,
        build,
        signed: key.is_some(),
        load_before,
        load_after,
        filesystems: results,
    })
}

/// "1.23 (1.10..1.40)": the median, then min..max with more than one run.
fn secs(s: &Stats) -> String {
    if s.n > 1 {
        format!("{:.2} ({:.2}..{:.2})", s.median, s.min, s.max)
    } else {
        format!("{:.2}", s.median)
    }
}

fn mb_s(bytes: u64, s: &Stats) -> String {
    if s.median > 0.0 {
        format!("{:.1}", bytes as f64 / 1e6 / s.median)
    } else {
        "-".into()
    }
}

fn ratio(s: &Stats, base: Option<Stats>) -> String {
    match base {
        Some(b) if b.median > 0.0 => format!("{:.2}x", s.median / b.median),
        _ => "-".into(),
    }
}

fn read_label(key: &str) -> &str {
    match key {
        "kernel" => "kernel: image open as root",
        "kernel-loop" => "kernel: loop mount, no verity",
        "userns" => "rootless: userns overlay",
        "fuse-overlayfs" => "rootless: fuse-overlayfs",
        other => other,
    }
}

fn hash_label(key: &str) -> &str {
    match key {
        "mtree" => "image mtree as nobody (image file)",
        "walk" => "dmkit hashing walk (kernel mount)",
        "sha256sum" => "find -print0, xargs -0 sha256sum (kernel mount)",
        other => other,
    }
}

fn fmt_load(l: &[f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
}

/// The text of the report: the setup, the read table, the hashing table.
pub fn render(r: &RootlessBenchReport) -> String {
    let mut out = format!(
        "Rootless image reads and hashing (issue 26), dmkit {} on kernel {}: median of {} cold-cache run(s) (min..max), images in {}\n",
        r.build,
        r.kernel,
        r.runs,
        r.dir.display()
    );
    out += &format!(
        "tree: {} ({}): {} files, {}\n",
        r.tree.display(),
        r.tree_source,
        r.tree_stats.files,
        human(r.tree_stats.bytes)
    );
    out += &format!(
        "load average before {}, after {} (the machine may be shared: compare within a run)\n",
        fmt_load(&r.load_before),
        fmt_load(&r.load_after)
    );
    out += &format!(
        "images: `dmkit image build --fs FS` (its default compression), dm-verity{}; the page cache dropped before every open and every hashing\n\n",
        if r.signed { ", signed root hash (--cert given to every open and to mtree)" } else { ", unsigned (no openssl)" }
    );
    out += "read s = every file read to the end, every link and inode, in one process (as root for the kernel mounts, as nobody for the rootless ones); open s = mounting; vs kernel = read s / the kernel `image open` read s of the same image\n\n";
    let mut t = TextTable::new(vec![
        ("fs".into(), Align::Left),
        ("image".into(), Align::Right),
        ("read through".into(), Align::Left),
        ("open s".into(), Align::Right),
        ("read s (min..max)".into(), Align::Right),
        ("MB/s".into(), Align::Right),
        ("vs kernel".into(), Align::Right),
    ]);
    let mut notes = Vec::new();
    for f in &r.filesystems {
        let fs = format!("{} ({})", f.fs, f.compress);
        if let Some(why) = &f.skipped {
            t.push(vec![f.fs.clone(), "n/a".into(), "not built".into()]);
            notes.push(format!("{}: not built: {why}", f.fs));
            continue;
        }
        let size = f.image_size.map(human).unwrap_or_default();
        let base = f
            .reads
            .iter()
            .find(|s| s.key == "kernel")
            .and_then(Series::stats);
        for s in &f.reads {
            let Some(st) = s.stats() else {
                if let Some(why) = &s.skipped {
                    notes.push(format!(
                        "{} {}: not measured: {why}",
                        f.fs,
                        read_label(&s.key)
                    ));
                }
                continue;
            };
            let open = Stats::of(&s.open_s).map(|o| format!("{:.2}", o.median));
            t.push(vec![
                fs.clone(),
                size.clone(),
                read_label(&s.key).into(),
                open.unwrap_or_default(),
                secs(&st),
                mb_s(s.bytes, &st),
                ratio(&st, base),
            ]);
        }
    }
    out += &t.render();
    out += "\nSHA-256 of every regular file: `image mtree` as nobody reads the image file (no mount: every block verified by dmkit); the other two read the kernel mount (`image open` as root); s = wall time of the command; the three lists of digests agreed in every run\n\n";
    let mut h = TextTable::new(vec![
        ("fs".into(), Align::Left),
        ("hashing".into(), Align::Left),
        ("s (min..max)".into(), Align::Right),
        ("MB/s".into(), Align::Right),
        ("vs dmkit walk".into(), Align::Right),
        ("vs sha256sum".into(), Align::Right),
    ]);
    for f in r.filesystems.iter().filter(|f| f.skipped.is_none()) {
        let of = |k: &str| f.hashes.iter().find(|s| s.key == k).and_then(Series::stats);
        let (walk, sum) = (of("walk"), of("sha256sum"));
        for s in &f.hashes {
            let Some(st) = s.stats() else { continue };
            h.push(vec![
                format!("{} ({})", f.fs, f.compress),
                hash_label(&s.key).into(),
                secs(&st),
                mb_s(s.bytes, &st),
                ratio(&st, walk),
                ratio(&st, sum),
            ]);
        }
    }
    out += &h.render();
    for n in notes {
        out += &format!("{n}\n");
    }
    out
}

crate::bench::harness::report::impl_report!(RootlessBenchReport => render);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_of_both_formats() {
        let s = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  ./empty\n\
                 \\bbbb000000000000000000000000000000000000000000000000000000000000  ./a\\nb\n\
                 aaaa000000000000000000000000000000000000000000000000000000000000  ./c\n";
        assert_eq!(
            sums_of_sha256sum(s),
            vec![
                "aaaa000000000000000000000000000000000000000000000000000000000000",
                "bbbb000000000000000000000000000000000000000000000000000000000000"
            ]
        );
        let m = "./ type=dir mode=0755 uid=0 gid=0\n\
                 ./c type=file mode=0644 uid=0 gid=0 size=3 sha256sum=aaaa000000000000000000000000000000000000000000000000000000000000\n\
                 ./e type=file mode=0644 uid=0 gid=0 size=0\n\
                 ./l type=link uid=0 gid=0 link=c\n";
        assert_eq!(
            sums_of_mtree(m),
            vec!["aaaa000000000000000000000000000000000000000000000000000000000000"]
        );
    }

    #[test]
    fn hashing_walk_matches_sha256() {
        use sha2::Digest;
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let big = vec![7u8; (1 << 20) + 5];
        std::fs::write(d.path().join("a/x"), &big).unwrap();
        std::fs::write(d.path().join("e"), b"").unwrap();
        std::os::unix::fs::symlink("a/x", d.path().join("l")).unwrap();
        let r = read_tree_timed(d.path(), true).unwrap();
        assert_eq!((r.files, r.bytes), (2, big.len() as u64));
        assert_eq!(r.sha256, vec![hex::encode(sha2::Sha256::digest(&big))]);
        let plain = read_tree_timed(d.path(), false).unwrap();
        assert_eq!((plain.files, plain.bytes), (2, big.len() as u64));
        assert!(plain.sha256.is_empty());
    }

    #[test]
    fn file_systems_are_checked() {
        assert_eq!(
            chosen(&["ext4".into(), "erofs".into(), "ext4".into()]).unwrap(),
            vec!["ext4", "erofs"]
        );
        assert!(chosen(&["btrfs".into()]).is_err());
        assert!(chosen(&[]).is_err());
        for fs in FILE_SYSTEMS {
            crate::image::mkfs::FsKind::parse(fs).unwrap();
        }
    }
}
