//! The tree `dmkit bench image` builds its images from, when none is given: a minimal Debian
//! root made once with debootstrap (the kind of tree seed 001 measured: an operating system's
//! root) and kept under the cache directory, else `/usr` of this machine.
//!
//! debootstrap writes into `NAME.partial-PID` and the directory is renamed to `NAME` only
//! when it finished, so an interrupted or failed run is never taken for a tree.

use crate::bench::harness::process::{run_ok, say, Interrupt};
use crate::bench::BenchError;
use crate::image::build::human;
use crate::image::mkfs::find_program;
use crate::image::tree::TreeStats;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the benchmarks that build images from a tree share (`bench image`, `bench rootless`):
/// the tree, where the scratch and the cached default tree go, runs, progress.
#[derive(Debug, Clone)]
pub struct TreeBenchOptions {
    /// The tree (`None`: [`default_tree`]).
    pub tree: Option<PathBuf>,
    /// Under `tree` (or the default tree): only this subdirectory (`--quick` uses `usr/bin`).
    pub subdir: Option<PathBuf>,
    /// Where the scratch directory (images, mount points) is made.
    pub dir: PathBuf,
    /// Where the default tree is cached.
    pub cache: PathBuf,
    /// Cold-cache runs per measurement.
    pub runs: u32,
    /// Progress lines on stderr.
    pub progress: bool,
}

impl TreeBenchOptions {
    /// Defaults: the default tree in /var/tmp, 3 runs; `quick`: its `usr/bin`, one run.
    pub fn defaults(quick: bool) -> TreeBenchOptions {
        TreeBenchOptions {
            tree: None,
            subdir: quick.then(|| PathBuf::from("usr/bin")),
            dir: PathBuf::from("/var/tmp"),
            cache: PathBuf::from("/var/tmp"),
            runs: if quick { 1 } else { 3 },
            progress: false,
        }
    }

    /// The tree these options name, made or found ([`pick`]), with scratch space in `scratch`.
    pub fn pick(
        &self,
        scratch: &Path,
        interrupt: &Interrupt,
    ) -> Result<(Tree, TreeStats), BenchError> {
        pick(
            self.tree.as_deref(),
            self.subdir.as_deref(),
            &self.cache,
            scratch,
            self.progress,
            interrupt,
        )
    }
}

/// Where the Debian packages come from.
pub const MIRROR: &str = "http://deb.debian.org/debian";

/// The tree to use and how it was chosen (for the report).
#[derive(Debug, Clone)]
pub struct Tree {
    /// The directory.
    pub path: PathBuf,
    /// One line saying what it is.
    pub source: String,
}

/// The Debian release of this machine (`VERSION_CODENAME` of os-release), else bookworm.
pub fn host_suite(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "bookworm".to_string())
}

/// The cached debootstrap tree for `suite` under `cache`.
pub fn cache_path(cache: &Path, suite: &str) -> PathBuf {
    cache
        .join("dmkit-bench-tree")
        .join(format!("debian-{suite}-minbase"))
}

/// The default tree: the cached minimal Debian root, made now with debootstrap if it is
/// missing (`debootstrap --variant=minbase SUITE DIR MIRROR`), else `/usr` (with the reason).
pub fn default_tree(
    cache: &Path,
    scratch: &Path,
    progress: bool,
    interrupt: &Interrupt,
) -> Result<Tree, BenchError> {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let suite = host_suite(&os);
    let dir = cache_path(cache, &suite);
    let made = |how: &str| Tree {
        path: dir.clone(),
        source: format!("a minimal Debian {suite} root (debootstrap --variant=minbase, {how})"),
    };
    if dir.is_dir() {
        return Ok(made(&format!("cached in {}", dir.display())));
    }
    let usr = |why: String| Tree {
        path: PathBuf::from("/usr"),
        source: format!("/usr of this machine ({why})"),
    };
    let Some(debootstrap) = find_program("debootstrap") else {
        return Ok(usr(
            "debootstrap is not installed: apt-get install debootstrap".into(),
        ));
    };
    let parent = dir.parent().expect("a cache path has a parent");
    std::fs::create_dir_all(parent).map_err(|source| BenchError::Io {
        what: format!("create {}", parent.display()),
        source,
    })?;
    let partial = PathBuf::from(format!("{}.partial-{}", dir.display(), std::process::id()));
    if progress {
        eprintln!(
            "making the default tree: debootstrap --variant=minbase {suite} {} (once; minutes)",
            dir.display()
        );
    }
    let mut cmd = Command::new(debootstrap);
    cmd.args(["--variant=minbase", &suite])
        .arg(&partial)
        .arg(MIRROR);
    let r = run_ok(&mut cmd, scratch, interrupt, None);
    match r {
        Ok(_) => {
            std::fs::rename(&partial, &dir).map_err(|source| BenchError::Io {
                what: format!("rename {} to {}", partial.display(), dir.display()),
                source,
            })?;
            Ok(made(&format!("made now in {}", dir.display())))
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            if let BenchError::Interrupted = e {
                return Err(e);
            }
            let msg = e.to_string();
            let last = msg.lines().last().unwrap_or("").trim().to_string();
            Ok(usr(format!("debootstrap failed: {last}")))
        }
    }
}

/// The tree a benchmark builds its images from: `tree` (`--tree`), else the default tree
/// ([`default_tree`]), narrowed to `subdir` when given; with its counts, said on stderr with
/// `progress`.
pub fn pick(
    tree: Option<&Path>,
    subdir: Option<&Path>,
    cache: &Path,
    scratch: &Path,
    progress: bool,
    interrupt: &Interrupt,
) -> Result<(Tree, TreeStats), BenchError> {
    let base = match tree {
        Some(t) => Tree {
            path: t.to_path_buf(),
            source: format!("{} (--tree)", t.display()),
        },
        None => default_tree(cache, scratch, progress, interrupt)?,
    };
    let tree = match subdir {
        Some(s) => Tree {
            path: base.path.join(s),
            source: format!("{} of {}", s.display(), base.source),
        },
        None => base,
    };
    let stats = TreeStats::scan(&tree.path).map_err(|e| BenchError::Invalid(e.to_string()))?;
    say(
        progress,
        format!(
            "tree: {} ({}): {} files, {}",
            tree.path.display(),
            tree.source,
            stats.files,
            human(stats.bytes)
        ),
    );
    Ok((tree, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_from_os_release() {
        assert_eq!(
            host_suite("NAME=\"Debian GNU/Linux\"\nVERSION_CODENAME=bookworm\n"),
            "bookworm"
        );
        assert_eq!(host_suite("VERSION_CODENAME=\"trixie\"\n"), "trixie");
        assert_eq!(host_suite("ID=debian\n"), "bookworm");
        assert_eq!(host_suite("VERSION_CODENAME=../x\n"), "bookworm");
        assert_eq!(
            cache_path(Path::new("/var/tmp"), "bookworm"),
            Path::new("/var/tmp/dmkit-bench-tree/debian-bookworm-minbase")
        );
    }
}
